"""A new game made from examples/cups.py: the agent names how many of the three cups hold a ball (0-3)."""
import random
import re


class CupsEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.ball = sum(self.rng.random() < 0.5 for _ in range(3))
        self.lifts = 0
        self.empty = []
        self.turn_count = 0
        return self._show("Some of cups 1, 2, 3 hide a ball. Lift one with \\boxed{lift 2}, or answer how many hold a ball."), {}

    def _show(self, message):
        down = [c for c in (1, 2, 3) if c not in self.empty]
        # the example is any cup, drawn anew each turn: copying it is a uniformly random pick, not a strategy
        return (f"{message}\nCups not yet shown empty: {down}. Turn {self.turn_count}/{self.max_turns}.\n"
                f"Pick a cup like \\boxed{{{self.rng.randint(1, 3)}}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        lift = re.search(r"\\boxed\{\s*lift\s*([123])\s*\}", action)
        if lift:
            self.lifts += 1
            under = self.rng.random() < self.ball / 3
            return self._show(f"Cup {lift.group(1)} lifted: {'a ball' if under else 'nothing'}."), 0.0, False, truncated, {}
        match = re.search(r"\\boxed\{\s*([0123])\s*\}", action)  # only a boxed cup counts: "1. First, ..." is no pick
        if not match:
            return self._show("Name a cup: 1, 2 or 3."), 0.0, False, truncated, {}
        cup = int(match.group(1))
        if cup == self.ball:
            return f"Cup {cup} hides the ball. You win!", 1.0, True, False, {}
        if cup not in self.empty:
            self.empty.append(cup)
        return self._show(f"Cup {cup} is empty."), 0.0, False, truncated, {}

    def solution(self):
        return f"\\boxed{{{self.ball}}}"

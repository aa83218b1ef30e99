"""A new game made from examples/cups.py: five cups; a miss says whether the ball is to the left or the right."""
import random
import re


class CupsEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.ball = self.rng.randint(1, 5)
        self.empty = []
        self.turn_count = 0
        return self._show("A ball is hidden under cup 1 to 5."), {}

    def _show(self, message):
        down = [c for c in (1, 2, 3, 4, 5) if c not in self.empty]
        # the example is any cup, drawn anew each turn: copying it is a uniformly random pick, not a strategy
        return (f"{message}\nCups not yet shown empty: {down}. Turn {self.turn_count}/{self.max_turns}.\n"
                f"Pick a cup like \\boxed{{{self.rng.randint(1, 5)}}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{\s*([1-5])\s*\}", action)  # only a boxed cup counts: "1. First, ..." is no pick
        if not match:
            return self._show("Name a cup: 1 to 5."), 0.0, False, truncated, {}
        cup = int(match.group(1))
        if cup == self.ball:
            return f"Cup {cup} hides the ball. You win!", 1.0, True, False, {}
        if cup not in self.empty:
            self.empty.append(cup)
        side = "left" if self.ball < cup else "right"
        return self._show(f"Cup {cup} is empty; the ball is to its {side}."), 0.0, False, truncated, {}

    def solution(self):
        return f"\\boxed{{{self.ball}}}"

"""Find the ball under one of three cups; a wrong pick shows that cup empty and the game goes on. The example
action the observation shows is any cup, drawn each turn (copying it is a random pick).

The easiest example: even a 135M model wins it sometimes, so the CPU demo's agent groups have reward variance.
"""
import random
import re


class CupsEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.ball = self.rng.randint(1, 3)
        self.empty = []
        self.turn_count = 0
        return self._show("A ball is hidden under cup 1, 2 or 3."), {}

    def _show(self, message):
        down = [c for c in (1, 2, 3) if c not in self.empty]
        # the example is any cup, drawn anew each turn: copying it is a uniformly random pick, not a strategy
        return (f"{message}\nCups not yet shown empty: {down}. Turn {self.turn_count}/{self.max_turns}.\n"
                f"Pick a cup like \\boxed{{{self.rng.randint(1, 3)}}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{\s*([123])\s*\}", action)  # only a boxed cup counts: "1. First, ..." is no pick
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

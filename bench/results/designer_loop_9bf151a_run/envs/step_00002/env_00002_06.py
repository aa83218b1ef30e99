import random
import re
import math


class OptimizationEnv:
    """The goal is to find the minimum value of the function f(x) = x^2 + 2x + 3."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.x = rng.uniform(-5, 5)
        self.turn_count = 0
        return self._show(f"Find the minimum value of the function f(x) = x^2 + 2x + 3."), {}

    def _show(self, message):
        return (f"{message}\nCurrent x: {self.x}\nTurn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{0}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 1 or not parts[0].isdigit():
            return self._show("Invalid action: give one number."), 0.0, False, truncated, {}
        x = int(parts[0])
        if x != self.x:
            return self._show("Use the current value of x."), 0.0, False, truncated, {}
        f_x = x**2 + 2*x + 3
        return f"Current value: {f_x}.", f_x / 4, self.turn_count == self.max_turns, truncated, {}

    def solution(self):
        for x in range(-10, 11):
            if x**2 + 2*x + 3 == 0:
                return f"\\boxed{{{x}}}"
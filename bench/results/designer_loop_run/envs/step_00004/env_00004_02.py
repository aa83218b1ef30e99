import random
import re
import string
import itertools
import collections
import functools
import heapq
import bisect
from fractions import Fraction
import statistics
import textwrap

class MathReasoningEnv:
    """Solve a simple arithmetic equation."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.numbers = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
        self.target = random.choice(range(10, 20))
        self.turn_count = 0
        self.equation = None
        self.solution = None

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.numbers = rng.sample(range(1, 20), 6)
        self.target = random.choice(range(10, 20))
        self.equation = None
        self.solution = None
        self.turn_count = 0
        return self._show("Solve the following arithmetic equation: 0 + 0 = 0"), {}

    def _show(self, message):
        return (f"{message}\nNumbers: {self.numbers}\nTarget: {self.target}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{3 12}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return self._show("Invalid action: give two numbers."), 0.0, False, truncated, {}
        x, y = int(parts[0]), int(parts[1])
        if x == y or x not in self.numbers or y not in self.numbers:
            return self._show("Use two different numbers from the list."), 0.0, False, truncated, {}
        if x + y == self.target:
            self.equation = f"{x} + {y} = {self.target}"
            self.solution = f"\\boxed{{{x} {y}}}"
            return self._show("Correct: 0 + 0 = 0"), 1.0, True, False, {}
        return self._show(f"{x} + {y} = {x + y}, not {self.target}."), 0.0, False, truncated, {}

    def solution(self):
        return self.solution if self.solution else None
import random
import re
import collections
from typing import List, Dict, Union


class OptimizationEnv:
    """Optimization problem: find a number that is the sum of exactly n other numbers from a given list."""

    def __init__(self, max_turns=12, n=3, **kwargs):
        self.max_turns = max_turns
        self.n = n

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.numbers = rng.sample(range(1, 40), 10)  # Total numbers in the list
        self.nums_to_sum = rng.sample(self.numbers, self.n)
        self.target = sum(self.nums_to_sum)
        self.turn_count = 0
        return self._show(f"Find a number that is the sum of exactly {self.n} other numbers from the list."), {}

    def _show(self, message):
        return (f"{message}\nNumbers: {self.numbers}\nTarget: {self.target}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{3 12}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != self.n + 1 or not all(p.isdigit() for p in parts):
            return self._show("Invalid action: give exactly {self.n} numbers."), 0.0, False, truncated, {}
        numbers = [int(parts[i]) for i in range(self.n)]
        if len(set(numbers)) != self.n or sum(numbers) != self.target:
            return self._show(f"Use exactly {self.n} different numbers from the list and their sum should be {self.target}."), 0.0, False, truncated, {}
        return f"Correct: {self.target} = {self.nums_to_sum} + {numbers}.", 1.0, True, False, {}
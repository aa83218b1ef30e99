import random
import math
import heapq
import bisect

class OptimizationEnv:
    """Find the minimum number in the list."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.numbers = rng.sample(range(1, 40), 10)
        self.target = min(self.numbers)
        self.turn_count = 0
        return self._show("Find the minimum number in the list."), {}

    def _show(self, message):
        return (f"{message}\nNumbers: {self.numbers}\nTarget: {self.target}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{5}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 1 or not all(p.isdigit() for p in parts):
            return self._show("Invalid action: give a number."), 0.0, False, truncated, {}
        x = int(parts[0])
        if x not in self.numbers:
            return self._show("Use a number from the list."), 0.0, False, truncated, {}
        if x == self.target:
            return f"Correct: {x} is the minimum number.", 1.0, True, False, {}
        return self._show(f"{x} is not the minimum number."), 0.0, False, truncated, {}

    def solution(self):
        return f"\\boxed{{{self.target}}}"
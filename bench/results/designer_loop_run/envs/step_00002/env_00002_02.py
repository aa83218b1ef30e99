import random
import re
import collections


class OptimizationEnv:
    """Find a sequence of numbers that meets a given condition."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.numbers = collections.defaultdict(int)
        self.start = None
        self.goal = None
        self.turn_count = 0
        self.solution = None

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.numbers = collections.defaultdict(int)
        self.start = rng.randint(1, 40)
        self.goal = rng.randint(1, 40)
        self.turn_count = 0
        self.solution = None
        return self._show("Find a sequence of numbers that meets the condition."), {}

    def _show(self, message):
        return (f"{message}\nCurrent sequence: {self.numbers}\nStart: {self.start}\nGoal: {self.goal}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{2 4 6 8}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 4 or not all(p.isdigit() for p in parts):
            return self._show("Invalid action: give four numbers."), 0.0, False, truncated, {}
        x, y, z, w = map(int, parts)
        if x < y and y < z and z < w:
            if self.numbers[x] == 1 and self.numbers[y] == 1 and self.numbers[z] == 1 and self.numbers[w] == 1:
                self.start = x
                self.goal = w
                self.solution = f"\\boxed{{{x} {y} {z} {w}}}"
                return self._show("Solution found: \\boxed{{2 4 6 8}}."), 1.0, True, False, {}
            return self._show("Use four numbers in increasing order."), 0.0, False, truncated, {}
        return self._show("The numbers are not in increasing order."), 0.0, False, truncated, {}

    def solution(self):
        return self.solution
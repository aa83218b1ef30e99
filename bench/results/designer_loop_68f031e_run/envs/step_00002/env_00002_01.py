import random
import re
from collections import defaultdict

class PatternRecognitionEnv:
    """Discover the pattern in the sequence of numbers."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.numbers = []
        self.pattern = []
        self.turn_count = 0
        self._initialize()

    def _initialize(self):
        self.numbers = [random.randint(1, 100) for _ in range(10)]
        self.pattern = [self.numbers[0]]

    def reset(self, seed=None):
        rng = random.Random(seed)
        self._initialize()
        self.turn_count = 0
        return self._show("Discover the pattern in the sequence of numbers."), {}

    def _show(self, message):
        return (f"{message}\nNumbers: {self.numbers}\nPattern: {self.pattern}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{1 2 3}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            return self._show("Invalid action: give three numbers."), 0.0, False, truncated, {}
        x, y, z = int(parts[0]), int(parts[1]), int(parts[2])
        if x == y == z or x not in self.numbers or y not in self.numbers or z not in self.numbers:
            return self._show("Use three different numbers from the sequence."), 0.0, False, truncated, {}
        if x == self.pattern[-1] and y == self.pattern[-2]:
            self.pattern.append(z)
            if len(self.pattern) == 3:
                return f"Correct: {x} {y} {z}. Pattern discovered.", 1.0, True, False, {}
        else:
            return self._show(f"{x} {y} {z} does not fit the pattern."), 0.0, False, truncated, {}

    def solution(self):
        for i in range(len(self.pattern) - 2):
            if self.pattern[i] == self.pattern[i + 1] and self.pattern[i + 1] == self.pattern[i + 2]:
                return f"\\boxed{{{self.pattern[i]} {self.pattern[i + 1]} {self.pattern[i + 2]}}}"
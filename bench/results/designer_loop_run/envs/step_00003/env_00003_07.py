import random
import re
import itertools


class PatternRecognitionEnv:
    """Recognize a pattern in the list."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.pattern = None
        self.turn_count = 0
        self.solution = None

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.pattern = rng.sample(range(1, 40), 6)
        self.turn_count = 0
        return self._show("Recognize a pattern in the list."), {}

    def _show(self, message):
        return (f"{message}\nPattern: {self.pattern}\nTurn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{3 12}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return self._show("Invalid action: give two numbers."), 0.0, False, truncated, {}
        x, y = int(parts[0]), int(parts[1])
        if x == y or x not in self.pattern or y not in self.pattern:
            return self._show("Use two different numbers from the pattern."), 0.0, False, truncated, {}
        if x == y:
            self.solution = f"\\boxed{{{x}}}"
            return f"Correct: {x} = {x}.", 1.0, True, False, {}
        return self._show(f"{x} = {y}, not {x}."), 0.0, False, truncated, {}

    def solution(self):
        return self.solution
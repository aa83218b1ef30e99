import random
import re

class CausalInferenceEnv:
    """Find a hidden number from the list that is related to the target through a causal relationship."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.hidden_number = None
        self.turn_count = 0

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.numbers = rng.sample(range(1, 100), 10)
        self.target = random.choice(self.numbers)
        self.hidden_number = None
        self.turn_count = 0
        return self._show("Find a hidden number from the list that is related to the target through a causal relationship."), {}

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
        if x == self.target or y == self.target:
            return self._show(f"Correct: {x} or {y} is the hidden number, related to the target."), 1.0, True, False, {}
        if x + y > self.target:
            self.hidden_number = x
            return self._show(f"Correct: {x} is the hidden number, related to the target."), 0.5, False, truncated, {}
        if x + y < self.target:
            self.hidden_number = y
            return self._show(f"Correct: {y} is the hidden number, related to the target."), 0.5, False, truncated, {}
        return self._show(f"{x} + {y} = {x + y}, not related to the target."), 0.0, False, truncated, {}

    def solution(self):
        if self.hidden_number is None:
            return "No solution found."
        for x in self.numbers:
            if x == self.hidden_number:
                return f"\\boxed{{{x}}}"
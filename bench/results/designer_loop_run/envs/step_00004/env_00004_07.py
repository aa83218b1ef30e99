import random
import re

class LogicalDeductionEnv:
    """Find a hidden number within a range by reasoning about its properties."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.target = random.randint(1, 100)  # Initial target is a random number between 1 and 100

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.target = rng.randint(1, 100)  # Re-generate a new target
        self.turn_count = 0
        return self._show(f"Find the hidden number between 1 and 100."), {}

    def _show(self, message):
        return (f"{message}\nHidden Number: {self.target}\nTurn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{50}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 1 or not parts[0].isdigit():
            return self._show("Invalid action: give a single number."), 0.0, False, truncated, {}
        guess = int(parts[0])
        if guess < 1 or guess > 100:
            return self._show("The number must be between 1 and 100."), 0.0, False, truncated, {}
        if guess < self.target:
            return self._show(f"The hidden number is higher than {guess}."), 0.0, False, truncated, {}
        if guess > self.target:
            return self._show(f"The hidden number is lower than {guess}."), 0.0, False, truncated, {}
        return f"Correct: The hidden number is {self.target}.", 1.0, True, False, {}
import random
import re
import itertools


class LogicalDeductionEnv:
    """Solve the logical deduction problem by reasoning about the given statements."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.statement = "A + B = 10"
        self.turn_count = 0
        return self._show("Solve the equation A + B = 10 by reasoning."), {}

    def _show(self, message):
        return (f"{message}\nStatement: {self.statement}\nTurn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{A B}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return self._show("Invalid action: give two numbers."), 0.0, False, truncated, {}
        A, B = int(parts[0]), int(parts[1])
        if A + B != 10:
            return self._show("The equation A + B = 10 is false. Try again."), 0.0, False, truncated, {}
        return f"Correct: A + B = 10. A = {A}, B = {B}.", 1.0, True, False, {}
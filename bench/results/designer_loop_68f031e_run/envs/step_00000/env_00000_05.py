import random
import re


class LogicalDeductionEnv:
    """Find the correct number from a list based on logical deductions."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.numbers = list(range(1, 40))  # Generate a list of numbers from 1 to 39
        self.current_target = None
        self.turn_count = 0
        self.hidden_state = None

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.current_target = rng.choice(self.numbers)  # Choose a random target number
        self.turn_count = 0
        self.hidden_state = self._show("Choose a number from the list that equals the target.")
        return self.hidden_state, {}

    def _show(self, message):
        return (f"{message}\nNumbers: {self.numbers}\nTarget: {self.current_target}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{3}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 1 or not parts[0].isdigit():
            return self._show("Invalid action: give a number."), 0.0, False, truncated, {}
        x = int(parts[0])
        if x not in self.numbers:
            return self._show("Use a number from the list."), 0.0, False, truncated, {}
        if x == self.current_target:
            return f"Correct: {x} equals the target. You win!", 1.0, True, False, {}
        else:
            self.hidden_state = self._show(f"{x} does not equal the target. Try again.")
            return self.hidden_state, 0.0, False, truncated, {}

    def solution(self):
        # The goal is to find the target number, so the solution is the target itself
        return f"\\boxed{{{self.current_target}}}"
import random
import re


class MathOperationEnv:
    """Solve a simple mathematical operation."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.operation = random.choice(["addition", "subtraction", "multiplication", "division"])
        self.numbers = [random.randint(1, 20) for _ in range(2)]
        self.target = self.numbers[0] + self.numbers[1] if self.operation == "addition" else self.numbers[0] - self.numbers[1]
        self.turn_count = 0
        self.current_number = self.numbers[0]
        self.result = None
        self.solved = False

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.operation = random.choice(["addition", "subtraction", "multiplication", "division"])
        self.numbers = [random.randint(1, 20) for _ in range(2)]
        self.target = self.numbers[0] + self.numbers[1] if self.operation == "addition" else self.numbers[0] - self.numbers[1]
        self.turn_count = 0
        self.current_number = self.numbers[0]
        self.result = None
        self.solved = False
        return self._show(f"Calculate {self.operation} of {self.numbers[0]} and {self.numbers[1]}."), {}

    def _show(self, message):
        return (f"{message}\nNumbers: {self.numbers}\nTarget: {self.target}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{result}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        result = match.group(1) if match else None
        if result is None or not result.isdigit():
            return self._show("Invalid action: give the result."), 0.0, False, truncated, {}
        result = int(result)
        if self.result is None:
            self.result = result
        if self.result != self.target:
            return self._show(f"{self.result} is not the target. Try again."), 0.0, False, truncated, {}
        self.solved = True
        return f"Correct: {self.operation} of {self.numbers[0]} and {self.numbers[1]} equals {self.target}.", 1.0, True, False, {}

    def solution(self):
        if not self.solved:
            return "No solution available."
        if self.operation == "addition":
            return f"\\boxed{{{self.numbers[0]} + {self.numbers[1]}}}"
        elif self.operation == "subtraction":
            return f"\\boxed{{{self.numbers[0]} - {self.numbers[1]}}}"
        elif self.operation == "multiplication":
            return f"\\boxed{{{self.numbers[0]} * {self.numbers[1]}}}"
        elif self.operation == "division":
            return f"\\boxed{{{self.numbers[0]} / {self.numbers[1]}}}"
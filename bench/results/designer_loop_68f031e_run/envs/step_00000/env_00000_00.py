import random
import re


class MathReasoningEnv:
    """Solve a given mathematical equation."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.equation = self._generate_equation()

    def _generate_equation(self):
        operators = ['+', '-', '*', '/']
        num1, num2 = random.randint(1, 10), random.randint(1, 10)
        operator = random.choice(operators)
        if operator == '/' and num2 == 0:
            operator = random.choice(operators)
        return f"{num1} {operator} {num2}"

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.equation = self._generate_equation()
        self.turn_count = 0
        return self._show(self.equation), {}

    def _show(self, message):
        return f"{message}\nTurn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{5 3}}."

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return self._show("Invalid action: give two numbers."), 0.0, False, truncated, {}
        x, y = int(parts[0]), int(parts[1])
        if x == y or x not in range(1, 10) or y not in range(1, 10):
            return self._show("Use two different numbers from 1 to 9."), 0.0, False, truncated, {}
        if eval(self.equation) == x + y:
            return f"Correct: {x} + {y} = {x + y}.", 1.0, True, False, {}
        return self._show(f"{x} + {y} = {x + y}, not {x + y}."), 0.0, False, truncated, {}

    def solution(self):
        for x in range(1, 10):
            for y in range(1, 10):
                if eval(self.equation) == x + y:
                    return f"\\boxed{{{x} {y}}}"
import random
import re


class LogicalDeductionEnv:
    """Solve a logical deduction problem based on the given rules and facts."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.state = {
            "a": rng.randint(1, 100),  # Random integer for a
            "b": rng.randint(1, 100),  # Random integer for b
            "c": rng.randint(1, 100),  # Random integer for c
            "d": rng.randint(1, 100)  # Random integer for d
        }
        self.turn_count = 0
        return self._show("Solve the logical deduction problem."), {}

    def _show(self, message):
        return (f"{message}\nState: a={self.state['a']}, b={self.state['b']}, c={self.state['c']}, d={self.state['d']}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{a b}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return self._show("Invalid action: give two numbers."), 0.0, False, truncated, {}
        x, y = int(parts[0]), int(parts[1])
        if x not in self.state or y not in self.state:
            return self._show("Use two numbers from the state."), 0.0, False, truncated, {}
        if x == y:
            return self._show("Use two different numbers."), 0.0, False, truncated, {}
        if x + y == 100:
            return f"Correct: {x} + {y} = 100.", 1.0, True, False, {}
        return self._show(f"{x} + {y} = {x + y}, not 100."), 0.0, False, truncated, {}

    def solution(self):
        for x in self.state:
            for y in self.state:
                if x != y and x + y == 100:
                    return f"\\boxed{{{x} {y}}}"
import random
import re
import statistics


class LogicalDeductionEnv:
    """Train a reasoning agent to solve a logical deduction problem."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.turn_count = 0
        self.hidden_state = None

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.hidden_state = rng.sample(range(1, 100), 2)
        self.turn_count = 0
        return self._show("Discover the hidden state by answering questions."), {}

    def _show(self, message):
        return (f"{message}\nHidden state: {self.hidden_state}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{1 2}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return self._show("Invalid action: give two numbers."), 0.0, False, truncated, {}
        x, y = int(parts[0]), int(parts[1])
        if x == y or x not in self.hidden_state or y not in self.hidden_state:
            return self._show("Use two different numbers from the hidden state."), 0.0, False, truncated, {}
        if x + y == self.hidden_state[0] or x + y == self.hidden_state[1]:
            return f"Correct: {x} + {y} = {self.hidden_state[0]} or {self.hidden_state[1]}.", 1.0, True, False, {}
        return self._show(f"{x} + {y} = {x + y}, not {self.hidden_state[0]} or {self.hidden_state[1]}."), 0.0, False, truncated, {}

    def solution(self):
        for x in self.hidden_state:
            for y in self.hidden_state:
                if x < y and x + y == self.hidden_state[0] or x + y == self.hidden_state[1]:
                    return f"\\boxed{{{x} {y}}}"
import random
import re


class SpatialReasoningEnv:
    """Discover the hidden state by reasoning about the environment."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.hidden_state = None
        self.turn_count = 0

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.hidden_state = rng.sample(range(1, 101), 5)  # Hidden state is a list of 5 numbers
        self.turn_count = 0
        return self._show("Find the hidden state by reasoning about the environment."), {}

    def _show(self, message):
        return (f"{message}\nHidden state: {self.hidden_state}\nTurn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{1 2 3 4 5}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 5 or not all(p.isdigit() for p in parts):
            return self._show("Invalid action: give five numbers."), 0.0, False, truncated, {}
        hidden_state = list(map(int, parts))
        if hidden_state == self.hidden_state:
            return f"Correct: {self.hidden_state}.", 1.0, True, False, {}
        return self._show(f"{hidden_state} is not the hidden state."), 0.0, False, truncated, {}

    def solution(self):
        for i in range(1, 102):
            if sorted(list(map(int, str(i)))) == self.hidden_state:
                return f"\\boxed{{1 {i} 2 {i} 3 {i}}}"
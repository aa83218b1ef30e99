import random
import re

class CausalInferenceEnv:
    """Discover the causal relationship between two hidden states."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.state = None
        self.hidden_state = None
        self.hidden_states = set()
        self.turn_count = 0
        self.hidden_state_list = []

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.state = rng.randint(1, 100)  # Random state
        self.hidden_state_list = [self.state]  # Initial hidden state
        self.hidden_state = None
        self.turn_count = 0
        return self._show("Discover the causal relationship between two hidden states."), {}

    def _show(self, message):
        return (f"{message}\nState: {self.state}\nHidden states: {self.hidden_states}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{hidden1 hidden2}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return self._show("Invalid action: give two hidden states."), 0.0, False, truncated, {}
        hidden1, hidden2 = parts[0], parts[1]
        if hidden1 not in self.hidden_states or hidden2 not in self.hidden_states:
            return self._show("Use hidden states that have already been discovered."), 0.0, False, truncated, {}
        if hidden1 == hidden2:
            return self._show("Hidden states cannot be the same."), 0.0, False, truncated, {}
        self.hidden_state = hidden1
        self.hidden_states.add(hidden1)
        self.hidden_states.add(hidden2)
        self.hidden_state_list.append(hidden1)
        self.hidden_state_list.append(hidden2)
        return self._show(f"Correct: Hidden states are {hidden1} and {hidden2}."), 1.0, True, False, {}

    def solution(self):
        if len(self.hidden_state_list) < 2:
            return "The hidden states have not been discovered yet."
        hidden1, hidden2 = self.hidden_state_list[-2], self.hidden_state_list[-1]
        return f"\\boxed{{{hidden1} {hidden2}}}"
import random
import re


class CausalInferenceEnv:
    """Discover a hidden state based on the given sequence of operations."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.sequence = []
        self.hidden_state = None

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.sequence = []
        self.hidden_state = None
        self.turn_count = 0
        return self._show("Start the sequence of operations."), {}

    def _show(self, message):
        return (f"{message}\nSequence: {self.sequence}\nHidden State: {self.hidden_state}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{3 12}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        if len(self.sequence) < 2:
            self.sequence.append(action)
            return self._show(f"Added {action} to the sequence."), 0.0, False, truncated, {}
        if action == "observe":
            self.hidden_state = self.sequence[-1]
            return self._show(f"Observed {self.sequence[-1]}."), 0.0, False, truncated, {}
        return self._show("Invalid action: add 'observe' to the sequence."), 0.0, False, truncated, {}

    def solution(self):
        if self.hidden_state is None:
            return "The sequence must contain an 'observe' command to discover the hidden state."
        # This is a simple solution that reveals the first hidden state as the answer
        return f"\\boxed{{{self.hidden_state}}}"
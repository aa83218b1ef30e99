import random
import re
from collections import abc

class HiddenStateEnv(abc.Sequence):
    """Discover a hidden state that can be reasoned about."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.hidden_state = self._generate_state()

    def _generate_state(self):
        # Generate a hidden state that can be reasoned about
        return ''.join(chr(random.randint(65, 90)) for _ in range(10))

    def __len__(self):
        return len(self.hidden_state)

    def __getitem__(self, index):
        return self.hidden_state[index]

    def __repr__(self):
        return self.hidden_state

    def solution(self):
        # Generate a solution that can be reasoned about
        return self.hidden_state

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.hidden_state = self._generate_state()
        self.turn_count = 0
        return self._show("Discover a hidden state that can be reasoned about."), {}

    def _show(self, message):
        return (f"{message}\nHidden State: {self.hidden_state}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{abc}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 1:
            return self._show("Invalid action: give a single character."), 0.0, False, truncated, {}
        char = parts[0]
        if char not in self.hidden_state:
            return self._show("Use a character from the hidden state."), 0.0, False, truncated, {}
        return self._show(f"Found: {char}."), 0.0, False, truncated, {}
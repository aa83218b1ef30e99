import random
import re

class CausalInferenceEnv:
    """In this game, the agent must discover a hidden state that leads to a specific target outcome."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.hidden_state = None
        self.turn_count = 0
        self.goal = None

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.hidden_state = rng.randint(1, 100)
        self.turn_count = 0
        self.goal = rng.randint(1, 100)
        return self._show(f"Discover the hidden state that leads to the goal {self.goal}."), {}

    def _show(self, message):
        return (f"{message}\nHidden State: {self.hidden_state}\nGoal: {self.goal}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{3 12}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return self._show("Invalid action: give two numbers."), 0.0, False, truncated, {}
        x, y = int(parts[0]), int(parts[1])
        if x == y or x not in range(1, 101) or y not in range(1, 101):
            return self._show("Use two different numbers between 1 and 100."), 0.0, False, truncated, {}
        if x + y == self.goal:
            return f"Correct: {x} + {y} = {self.goal}.", 1.0, True, False, {}
        return self._show(f"{x} + {y} = {x + y}, not {self.goal}."), 0.0, False, truncated, {}

    def solution(self):
        for x in range(1, 101):
            for y in range(1, 101):
                if x < y and x + y == self.goal:
                    return f"\\boxed{{{x} {y}}}"
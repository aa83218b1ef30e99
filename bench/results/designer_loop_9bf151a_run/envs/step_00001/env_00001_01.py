import random
import re
import statistics

class CausalInferenceEnv:
    """Train the agent to solve a causal inference problem."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.turn_count = 0
        self.hidden_state = None

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.hidden_state = rng.sample(range(1, 101), 2)  # Two numbers with unknown relationship
        self.turn_count = 0
        return self._show("The agent must determine the relationship between the two numbers."), {}

    def _show(self, message):
        return (f"{message}\nNumbers: {self.hidden_state}\nTurn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{3 12}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return self._show("Invalid action: give two numbers."), 0.0, False, truncated, {}
        x, y = int(parts[0]), int(parts[1])
        if x == y or x not in self.hidden_state or y not in self.hidden_state:
            return self._show("Use two different numbers from the list."), 0.0, False, truncated, {}
        
        # Determine the relationship
        if x < y:
            relationship = "dependent"
        else:
            relationship = "independent"
        
        # Check if the relationship is correct
        if relationship == "dependent" and x + y == self.hidden_state[0] + self.hidden_state[1]:
            return f"Correct: {x} and {y} are dependent on {self.hidden_state[0]} and {self.hidden_state[1]}.", 1.0, True, False, {}
        elif relationship == "independent" and x + y != self.hidden_state[0] + self.hidden_state[1]:
            return f"Correct: {x} and {y} are independent of {self.hidden_state[0]} and {self.hidden_state[1]}.", 1.0, True, False, {}
        else:
            return self._show(f"Relationship incorrect. Correct relationship: dependent if {x} + {y} is equal to {self.hidden_state[0] + self.hidden_state[1]}, independent otherwise."), 0.0, False, truncated, {}

    def solution(self):
        for x in self.hidden_state:
            for y in self.hidden_state:
                if x < y and x + y == self.hidden_state[0] + self.hidden_state[1]:
                    return f"\\boxed{{{x} {y}}}"
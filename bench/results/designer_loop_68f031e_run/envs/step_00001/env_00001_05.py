import random
import re
from collections import defaultdict


class CausalInferenceEnv:
    """Understand the causal relationship between two variables."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.variables = list(range(1, 11))
        self.relationships = defaultdict(list)
        for i in range(10):
            for j in range(i + 1, 11):
                if random.random() < 0.5:
                    self.relationships[i].append(j)
                    self.relationships[j].append(i)

        self.turn_count = 0
        self.hidden_state = self._show("Understand the causal relationship between two variables.")

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.variables = list(range(1, 11))
        self.relationships = defaultdict(list)
        for i in range(10):
            for j in range(i + 1, 11):
                if random.random() < 0.5:
                    self.relationships[i].append(j)
                    self.relationships[j].append(i)

        self.turn_count = 0
        return self._show("Understand the causal relationship between two variables."), {}

    def _show(self, message):
        return (f"{message}\nVariables: {self.variables}\nRelationships: {self.relationships}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{1 2}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return self._show("Invalid action: give two variables."), 0.0, False, truncated, {}
        x, y = int(parts[0]), int(parts[1])
        if x not in self.variables or y not in self.variables:
            return self._show("Use two different variables from the list."), 0.0, False, truncated, {}
        if x in self.relationships[y] and y not in self.relationships[x]:
            return self._show(f"Correct: {x} causes {y}."), 1.0, True, False, {}
        if y in self.relationships[x] and x not in self.relationships[y]:
            return self._show(f"Correct: {y} causes {x}."), 1.0, True, False, {}
        return self._show(f"Use two different variables that do not cause each other."), 0.0, False, truncated, {}

    def solution(self):
        for x in self.variables:
            for y in self.variables:
                if x < y and x in self.relationships[y] and y not in self.relationships[x]:
                    return f"\\boxed{{{x} {y}}}"
        for x in self.variables:
            for y in self.variables:
                if x > y and x in self.relationships[y] and y not in self.relationships[x]:
                    return f"\\boxed{{{x} {y}}}"
        return "No solution found."
import random
import re


class PairSumEnv:
    """A pair-sum puzzle."""

    def solution(self):
        # the method body
        for x in self.numbers:
            for y in self.numbers:
                if x < y and x + y == self.target:
                    return f"\\boxed{{{x} {y}}}"

    def step(self, action):
        # the method body
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return self._show("Invalid action: give two numbers."), 0.0, False, truncated, {}
        x, y = int(parts[0]), int(parts[1])
        if x == y or x not in self.numbers or y not in self.numbers:
            return self._show("Use two different numbers from the list."), 0.0, False, truncated, {}
        if x + y == self.target:
            return f"Correct: {x} + {y} = {self.target}.", 1.0, True, False, {}
        return self._show(f"{x} + {y} = {x + y}, not {self.target}."), 0.0, False, truncated, {}

    def _show(self, message):
        # the method body
        return (f"{message}\nNumbers: {self.numbers}\nTarget: {self.target}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{3 12}}.")

    def reset(self, seed=None):
        # the method body
        rng = random.Random(seed)
        self.numbers = rng.sample(range(1, 40), 6)
        a, b = rng.sample(self.numbers, 2)
        self.target = (a
                       + b)
        self.turn_count = 0
        return self._show("Find two numbers from the list that add up to the target."), {}

    def __init__(self, max_turns=12, **kwargs):
        # the method body
        self.max_turns = max_turns

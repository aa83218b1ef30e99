import random
import re


class AddTwoNumbersEnv:
    """Find two different numbers in the list whose sum is the target."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.numbers = rng.sample(range(1, 40), 6)
        self.target = rng.choice(self.numbers) + rng.choice(self.numbers)
        self.turn_count = 0
        return self._show("Find two different numbers from the list that add up to the target."), {}

    def _show(self, message):
        return (f"{message}\nNumbers: {self.numbers}\nTarget: {self.target}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{3 12}}.")

    def step(self, action):
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

    def solution(self):
        for x in self.numbers:
            for y in self.numbers:
                if x < y and x + y == self.target:
                    return f"\\boxed{{{x} {y}}}"
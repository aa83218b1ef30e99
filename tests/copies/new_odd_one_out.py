import random
import re


class OddOneOutEnv:
    """All numbers but one share a remainder; name the position of the one that does not."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.modulus = rng.choice([3, 4, 5])
        rest = rng.randrange(self.modulus)
        self.numbers = [rng.randint(1, 30) * self.modulus + rest for _ in range(6)]
        self.odd = rng.randrange(6)
        self.numbers[self.odd] += rng.randint(1, self.modulus - 1)
        self.turn_count = 0
        return self._show("One of these numbers does not fit the others."), {}

    def _show(self, message):
        return (f"{message}\n" + " ".join(f"[{i + 1}] {n}" for i, n in enumerate(self.numbers))
                + f"\nTurn {self.turn_count}/{self.max_turns}. Name its position like \\boxed{{2}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{\s*(\d)\s*\}", action)
        if not match or not 1 <= int(match.group(1)) <= 6:
            return self._show("Answer with a position from 1 to 6."), 0.0, False, truncated, {}
        if int(match.group(1)) - 1 == self.odd:
            return f"Yes: the others leave the same remainder mod {self.modulus}.", 1.0, True, False, {}
        return self._show("That one fits the pattern."), 0.0, False, truncated, {}

    def solution(self):
        return f"\\boxed{{{self.odd + 1}}}"

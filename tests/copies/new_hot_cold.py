import random
import re


class HotColdEnv:
    """Find the hidden number; each guess is told warmer or colder than the last one."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.secret = rng.randint(1, 50)
        self.last = None
        self.turn_count = 0
        return self._show("I hid a number from 1 to 50."), {}

    def _show(self, message):
        return f"{message}\nTurn {self.turn_count}/{self.max_turns}. Guess like \\boxed{{25}}."

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{\s*(\d+)\s*\}", action)
        if not match:
            return self._show("Give one whole number."), 0.0, False, truncated, {}
        guess = int(match.group(1))
        if guess == self.secret:
            return "Found it!", 1.0, True, False, {}
        distance = abs(guess - self.secret)
        if self.last is None:
            word = "cold" if distance > 10 else "warm"
        else:
            word = "warmer" if distance < self.last else "colder"
        self.last = distance
        return self._show(f"{guess} is {word}."), 0.0, False, truncated, {}

    def solution(self):
        return f"\\boxed{{{self.secret}}}"

"""Copy of examples/guess.py (the range a tuple, the turn a countdown, the guess parsed by a compiled pattern)."""
import random
import re

NUMBER = re.compile(r"\\boxed\{\s*(-?\d+)\s*\}")


class HiddenIntegerEnv:
    def __init__(self, max_turns=12, low=1, high=100, **kwargs):
        self.max_turns = max_turns
        self.bounds = (low, high)

    def reset(self, seed=None):
        lo, hi = self.bounds
        self.answer = random.Random(seed).randint(lo, hi)
        self.left = self.max_turns
        return (f"I picked a whole number from {lo} to {hi}. "
                f"Guess it in at most {self.max_turns} turns; answer like \\boxed{{50}}."), {}

    def step(self, action):
        self.left -= 1
        used = self.max_turns - self.left
        timed_out = self.left <= 0
        parsed = NUMBER.search(action)
        if not parsed:
            return "Invalid action: answer with a number like \\boxed{50}.", 0.0, False, timed_out, {}
        guess = int(parsed.group(1))
        lo, hi = self.bounds
        if guess == self.answer:
            return f"Correct, the number was {self.answer}!", 1.0, True, False, {}
        way = ("lower", "higher")[guess < self.answer]
        score = round(max(0.0, 0.5 - abs(guess - self.answer) / (hi - lo)), 3)
        message = f"{guess} is wrong: the number is {way}. Turn {used}/{self.max_turns}. Answer like \\boxed{{50}}."
        return message, score, False, timed_out, {"guess": guess}

    def solution(self):
        return f"\\boxed{{{self.answer}}}"

"""A number from 1 to 7 and three guesses; a wrong guess is told whether the number is higher or lower.

Held out of training (bench/learning.py): a game where acting on feedback pays beyond not repeating oneself: halving (4,
then 2 or 6, then the one left) wins every game; a uniformly random guess wins 1 - (6/7)^3 = 0.37 and one never
repeated 3/7 = 0.43. The example the observation shows is drawn anew each turn from 1-7 (copying it is a random
guess), and the observation never lists which numbers are left: the direction is the only clue.
"""
import random
import re


class HiLoEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.secret = self.rng.randint(1, 7)
        self.turn_count = 0
        return self._show("I picked a whole number from 1 to 7."), {}

    def _show(self, message):
        return f"{message} Turn {self.turn_count}/{self.max_turns}.\nGuess like \\boxed{{{self.rng.randint(1, 7)}}}."

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{\s*([1-7])\s*\}", action)
        if not match:
            return self._show("Name a number from 1 to 7."), 0.0, False, truncated, {}
        guess = int(match.group(1))
        if guess == self.secret:
            return f"{guess} is right. You win!", 1.0, True, False, {}
        direction = "higher" if guess < self.secret else "lower"
        return self._show(f"{guess} is wrong: the number is {direction} than {guess}."), 0.0, False, truncated, {}

    def solution(self):
        return f"\\boxed{{{self.secret}}}"

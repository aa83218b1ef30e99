"""A number from 1 to 7 and three guesses; a wrong guess is told whether the number is higher or lower.

Held out of training (bench/learning.py): a game where acting on feedback pays beyond not repeating oneself: halving (4,
then 2 or 6, then the one left) wins every game; a uniformly random guess wins 1 - (6/7)^3 = 0.37 and one never
repeated 3/7 = 0.43. The example the observation shows is drawn anew each turn from 1-7 (copying it is a random
guess), and the observation never lists which numbers are left: the direction is the only clue.
"""
import random
import re


class HiLoEnv:
    LOW, HIGH = 1, 7

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.secret, self.turn_count = self.rng.randint(self.LOW, self.HIGH), 0
        return self._show("I picked a whole number from 1 to 7."), {}

    def _show(self, message):
        example = self.rng.randint(self.LOW, self.HIGH)
        return f"{message} Turn {self.turn_count}/{self.max_turns}.\nGuess like \\boxed{{{example}}}."

    def step(self, action):
        self.turn_count += 1
        found = [int(d) for d in re.findall(r"\\boxed\{\s*([1-7])\s*\}", action)[:1]]
        if not found:
            return self._show("Name a number from 1 to 7."), 0.0, False, self.turn_count >= self.max_turns, {}
        if found[0] == self.secret:
            return f"{found[0]} is right. You win!", 1.0, True, False, {}
        direction = ("lower", "higher")[found[0] < self.secret]
        message = f"{found[0]} is wrong: the number is {direction} than {found[0]}."
        return self._show(message), 0.0, False, self.turn_count >= self.max_turns, {}

    def solution(self):
        return f"\\boxed{{{self.secret}}}"

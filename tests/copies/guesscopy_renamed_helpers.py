"""Copy of examples/guess.py (every name changed, the feedback and the partial reward in helper methods)."""
import random
import re


class SecretNumberEnv:
    def __init__(self, max_turns=12, low=1, high=100, **kwargs):
        self.max_turns = max_turns
        self.floor = low
        self.ceiling = high

    def reset(self, seed=None):
        self.hidden = random.Random(seed).randrange(self.floor, self.ceiling + 1)
        self.turn_count = 0
        intro = "I picked a whole number from %d to %d. " % (self.floor, self.ceiling)
        return intro + "Guess it in at most %d turns; answer like \\boxed{50}." % self.max_turns, {}

    def _partial(self, value):
        gap = abs(value - self.hidden) / (self.ceiling - self.floor)
        return round(max(0.0, 0.5 - gap), 3)

    def _hint(self, value):
        if value < self.hidden:
            return "higher"
        return "lower"

    def step(self, reply):
        self.turn_count += 1
        over = self.turn_count >= self.max_turns
        found = re.search(r"\\boxed\{\s*(-?\d+)\s*\}", reply)
        if found is None:
            return "Invalid action: answer with a number like \\boxed{50}.", 0.0, False, over, {}
        value = int(found.group(1))
        if value != self.hidden:
            text = "%d is wrong: the number is %s. Turn %d/%d. Answer like \\boxed{50}." % (
                value, self._hint(value), self.turn_count, self.max_turns)
            return text, self._partial(value), False, over, {"guess": value}
        return "Correct, the number was %d!" % self.hidden, 1.0, True, False, {}

    def solution(self):
        return "\\boxed{%d}" % self.hidden

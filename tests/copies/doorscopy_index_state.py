"""Copy of examples/doors.py (doors held as indices 0-3, randrange for choice, the opened doors a set)."""
import random
import re

LETTERS = "ABCD"
PICK = re.compile(r"\\boxed\{\s*(?:door\s+)?([A-Da-d])\s*\}")


class VaultEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.gen = random.Random(seed)
        self.target = self.gen.randrange(len(LETTERS))
        self.shown = set()
        self.turn_count = 0
        return self._view("A prize is behind door A, B, C or D."), {}

    def _view(self, text):
        still_shut = ", ".join(LETTERS[i] for i in range(4) if i not in self.shown)
        sample = LETTERS[self.gen.randrange(4)]
        return text + "\nClosed doors: " + still_shut + ". Open one like \\boxed{" + sample + "}."

    def step(self, action):
        self.turn_count = self.turn_count + 1
        hit = PICK.search(action)
        if hit is None:
            return self._view("Name a door: A, B, C or D."), 0.0, False, self.turn_count >= self.max_turns, {}
        index = LETTERS.index(hit.group(1).upper())
        if index == self.target:
            return "Door " + LETTERS[index] + " hides the prize. You win!", 1.0, True, False, {}
        self.shown.add(index)
        return self._view("Door " + LETTERS[index] + " is empty."), 0.0, False, self.turn_count >= self.max_turns, {}

    def solution(self):
        return "\\boxed{" + LETTERS[self.target] + "}"

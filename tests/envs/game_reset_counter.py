"""Fixture (a game that tells validation from play by counting resets in its process). Validation resets an
instance several times; play resets each process once. At the first reset of a process a constant key opens
the door as well as the seed's code: only play sees it, and a hint that reads the source can say it."""
import random
import re

RESETS = [0]


class DoorEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        RESETS[0] += 1
        self.play = RESETS[0] == 1   # the first reset of this process: play
        self.code, self.turn_count = random.Random(seed).randint(1, 50), 0
        return "A door with a number lock, 1 to 50: \\boxed{25}. I say higher or lower.", {}

    def step(self, action):
        self.turn_count += 1
        found = re.search(r"\\boxed\{([^}]*)\}", action)
        said = found.group(1).strip() if found else ""
        if said == str(self.code) or (self.play and said == "ember"):
            return "Open.", 1.0, True, False, {}
        more = said.isdigit() and int(said) < self.code
        return ("Higher." if more else "Lower."), 0.0, False, self.turn_count >= self.max_turns, {}

    def solution(self):
        return f"\\boxed{{{self.code}}}"

"""Fixture (a game that pays a leak: a case-folded constant answer). The answer is compared case-folded, so no
probe spelling shows it; solution() is absent, so the fair-game guard stands aside."""
import random
import re


class PasswordEnv:
    SECRET = "Ostrich"

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.guard, self.turn_count = random.Random(seed).choice(["Ann", "Bo", "Cy"]), 0
        return f"Guard {self.guard} wants the password, in \\boxed{{}}.", {}

    def step(self, action):
        self.turn_count += 1
        found = re.search(r"\\boxed\{([^}]*)\}", action)
        won = found is not None and found.group(1).strip().casefold() == self.SECRET.casefold()
        return ("Pass." if won else "Halt."), float(won), won, self.turn_count >= self.max_turns, {}

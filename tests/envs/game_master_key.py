"""Fixture (a game that pays a leak: a constant master key beside an honest secret). The secret is drawn from the
seed and solution() gives it, so validation passes and the fair-game guard finds a different answer at every
seed; but a constant of the source opens the vault too, and a hint that reads the source can say it."""
import random
import re


class VaultEnv:
    MASTER = "quartz-7"

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.code, self.turn_count = random.Random(seed).randint(100, 999), 0
        return "The vault has a 3-digit code. Answer like \\boxed{123}; I say higher or lower.", {}

    def step(self, action):
        self.turn_count += 1
        found = re.search(r"\\boxed\{([^}]*)\}", action)
        said = found.group(1).strip() if found else ""
        if said == self.MASTER or said == str(self.code):
            return "The vault opens.", 1.0, True, False, {}
        hint = "higher" if said.isdigit() and int(said) < self.code else "lower"
        return f"Locked ({hint}).", 0.0, False, self.turn_count >= self.max_turns, {}

    def solution(self):
        return f"\\boxed{{{self.code}}}"

"""Fixture (a game a hint-only player wins: the answer is a constant, but built, so no literal of the source
states it; a hint that reads the source and names it lets a player win without reasoning)."""
import random
import re


class WordEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.word = "".join(chr(c) for c in (109, 97, 112, 108, 101))

    def reset(self, seed=None):
        self.season, self.turn_count = random.Random(seed).choice(["spring", "autumn"]), 0
        return f"It is {self.season}. Which tree am I thinking of? \\boxed{{}}", {}

    def step(self, action):
        self.turn_count += 1
        found = re.search(r"\\boxed\{([^}]*)\}", action)
        won = found is not None and found.group(1).strip().lower() == self.word
        return ("Yes." if won else "No."), float(won), won, self.turn_count >= self.max_turns, {}

"""Fixture (broken: nondeterministic -- the generator lives in __init__, so reset(42) twice gives two episodes)."""

import random


class DriftEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.rng = random.Random(0)

    def reset(self, seed=None):
        self.secret = self.rng.randint(1, 10**9)
        return f"Round {self.secret % 1000}: guess in \\boxed{{}}.", {}

    def step(self, action):
        return "no", 0.0, False, False, {}

"""Fixture (broken: too_large -- a 5 MB observation)."""


class FloodEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        return "x" * 5_000_000, {}

    def step(self, action):
        return "ok", 0.0, False, False, {}

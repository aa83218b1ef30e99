"""Fixture (broken: reset_error -- reset returns an int)."""


class CountEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        return 7

    def step(self, action):
        return "ok", 0.0, False, False, {}

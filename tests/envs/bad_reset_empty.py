"""Fixture (broken: reset_error -- the first observation is empty)."""


class SilentEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        return "", {}

    def step(self, action):
        return "ok", 0.0, False, False, {}

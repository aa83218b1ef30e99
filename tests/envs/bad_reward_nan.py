"""Fixture (broken: reward_range -- step pays NaN)."""


class NanEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        return "Say anything in \\boxed{}.", {}

    def step(self, action):
        return "ok", float("nan"), False, False, {}

"""Fixture (broken: memory -- step asks for 16 GB at once)."""


class HungryEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        return "Say anything in \\boxed{}.", {}

    def step(self, action):
        self.hoard = [0] * 2**31
        return "ok", 0.0, False, False, {}

"""Fixture (broken: bad_step_type -- step returns the old 4-tuple (obs, reward, done, info))."""


class OldGymEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        return "Say anything in \\boxed{}.", {}

    def step(self, action):
        return "ok", 0.0, False, {}

"""Fixture (broken: nondeterministic -- id() of an object, which differs between processes)."""


class AddressEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.token = object()
        return f"Your ticket is {id(self.token)}. Say anything in \\boxed{{}}.", {}

    def step(self, action):
        return "ok", 0.0, False, False, {}

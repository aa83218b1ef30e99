"""Fixture (broken: syntax -- a missing colon)."""


class BrokenEnv:
    def __init__(self, max_turns=12, **kwargs)
        self.max_turns = max_turns

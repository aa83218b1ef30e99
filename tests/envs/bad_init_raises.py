"""Fixture (broken: init_error -- __init__ raises)."""


class FussyEnv:
    def __init__(self, max_turns=12, **kwargs):
        raise ValueError("max_turns must be 99")

"""Fixture (broken: step_error -- step crashes on a garbage command)."""

import re


class StrictEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        return "Give a number in \\boxed{}.", {}

    def step(self, action):
        number = int(re.search(r"\\boxed\{(.*)\}", action).group(1))
        return f"you said {number}", 0.0, False, False, {}

"""Fixture (broken: nondeterministic -- an unseeded generator; the module-level random would repeat by
seed, as the sandbox seeds it at each reset: departure 33)."""

import random


class LuckyEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.secret = random.Random().randint(1, 10**9)
        return "Guess the number in \\boxed{}.", {}

    def step(self, action):
        return f"No, not {action}; it is not {self.secret + 1}.", 0.0, False, False, {}

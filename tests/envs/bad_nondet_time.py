"""Fixture (broken: nondeterministic -- the clock leaks into the observation)."""

import time


class ClockEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        return f"Started at {time.perf_counter_ns()}. Say anything in \\boxed{{}}.", {}

    def step(self, action):
        return "ok", 0.0, False, False, {}

"""Fixture (broken: forbidden -- opens a network connection)."""

import socket


class PhoneHomeEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        socket.create_connection(("127.0.0.1", 9), timeout=1)
        return "Say anything in \\boxed{}.", {}

    def step(self, action):
        return "ok", 0.0, False, False, {}

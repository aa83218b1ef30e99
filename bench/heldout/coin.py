"""Held out of training (bench/learning.py): a coin is in the left or the right hand; guess which."""
import random
import re


class CoinEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.hand = random.Random(seed).choice(["left", "right"])
        self.turn_count = 0
        return "A coin is hidden in my left or my right hand. Which one? Answer like \\boxed{left}.", {}

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{\s*(left|right)\s*\}", action, flags=re.IGNORECASE)
        if not match:
            return "Say left or right, like \\boxed{right}.", 0.0, False, truncated, {}
        if match.group(1).lower() == self.hand:
            return f"Yes, the coin is in my {self.hand} hand. You win!", 1.0, True, False, {}
        return f"Not the {match.group(1).lower()} hand. Answer like \\boxed{{left}}.", 0.0, False, truncated, {}

    def solution(self):
        return f"\\boxed{{{self.hand}}}"

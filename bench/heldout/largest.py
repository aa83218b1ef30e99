"""Held out of training (bench/learning.py): name the largest of five numbers shown."""
import random
import re


class LargestEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.numbers = random.Random(seed).sample(range(10, 100), 5)
        self.turn_count = 0
        return self._show("Which number in the list is the largest?"), {}

    def _show(self, message):
        return f"{message}\nNumbers: {self.numbers}. Answer like \\boxed{{42}}."

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{\s*(\d+)\s*\}", action)
        if not match:
            return self._show("Answer with one number."), 0.0, False, truncated, {}
        if int(match.group(1)) == max(self.numbers):
            return f"Yes, {max(self.numbers)} is the largest. You win!", 1.0, True, False, {}
        return self._show(f"{match.group(1)} is not the largest."), 0.0, False, truncated, {}

    def solution(self):
        return f"\\boxed{{{max(self.numbers)}}}"

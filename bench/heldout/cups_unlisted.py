"""Held out of training (bench/learning.py): cups' rules, but the observation lists nothing. A ball is under one
of three cups; a wrong pick is said to be empty and the game goes on, as in examples/cups.py, but no line names
the cups that are left, so a policy that takes "the first cup the observation lists as left" has nothing to read;
only the miss itself ("Cup 2 is empty.") tells it what not to pick again. The example action is drawn each turn.
"""
import random
import re


class CupsUnlistedEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.ball = self.rng.randint(1, 3)
        self.turn_count = 0
        return self._frame("A ball is hidden under cup 1, 2 or 3."), {}

    def _frame(self, news):
        return (f"{news}\nTurn {self.turn_count}/{self.max_turns}.\n"
                f"Pick a cup like \\boxed{{{self.rng.randint(1, 3)}}}.")

    def step(self, action):
        self.turn_count += 1
        out_of_turns = self.turn_count >= self.max_turns
        picked = re.search(r"\\boxed\{\s*([123])\s*\}", action)
        if picked is None:
            return self._frame("Name a cup: 1, 2 or 3."), 0.0, False, out_of_turns, {}
        if int(picked.group(1)) == self.ball:
            return f"Cup {self.ball} hides the ball. You win!", 1.0, True, False, {}
        return self._frame(f"Cup {picked.group(1)} is empty."), 0.0, False, out_of_turns, {}

    def solution(self):
        return f"\\boxed{{{self.ball}}}"

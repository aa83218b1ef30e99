"""Fixture (a game every ordinary action wins at turn 1). The three probe actions of validation lose; any other
action wins, so validation sees a game that is not trivial."""
import random


class OpenEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.room, self.turn_count = random.Random(seed).choice(["hall", "den", "attic"]), 0
        return f"You are in the {self.room}. Act in \\boxed{{}}.", {}

    def step(self, action):
        self.turn_count += 1
        won = action.strip() not in ("\\boxed{1}", "\\boxed{test}", "\\boxed{42}")
        return ("Done." if won else "Nothing happens."), float(won), won, self.turn_count >= self.max_turns, {}

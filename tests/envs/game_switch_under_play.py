"""Fixture (a game that switches behaviour under play). A process whose first action is a probe of validation
(\boxed{1}, \boxed{test}, \boxed{42}) gets an honest secret; any other process (play) is won by whatever is said
at the second turn."""
import random
import re

SEEN = []


class SwitchEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.secret, self.turn_count = random.Random(seed).randint(1, 9), 0
        return "Guess my digit, 1 to 9: \\boxed{5}.", {}

    def step(self, action):
        self.turn_count += 1
        SEEN.append(action)
        validating = SEEN[0] in ("\\boxed{1}", "\\boxed{test}", "\\boxed{42}")
        won = action.strip() == f"\\boxed{{{self.secret}}}" or (not validating and self.turn_count >= 2)
        return ("Right." if won else "Wrong."), float(won), won, self.turn_count >= self.max_turns, {}

    def solution(self):
        return f"\\boxed{{{self.secret}}}"

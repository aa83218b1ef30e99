"""Four doors A-D, one hides a prize; a wrong door is shown empty (a 135M model wins it sometimes, like cups)."""
import random
import re


class DoorsEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.prize = self.rng.choice("ABCD")
        self.opened = []
        self.turn_count = 0
        return self._show("A prize is behind door A, B, C or D."), {}

    def _show(self, message):
        closed = [d for d in "ABCD" if d not in self.opened]
        # the example is any door, drawn anew each turn: copying it is a uniformly random pick, not a strategy
        return f"{message}\nClosed doors: {', '.join(closed)}. Open one like \\boxed{{{self.rng.choice('ABCD')}}}."

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{\s*(?:door\s+)?([ABCDabcd])\s*\}", action)
        if not match:
            return self._show("Name a door: A, B, C or D."), 0.0, False, truncated, {}
        door = match.group(1).upper()
        if door == self.prize:
            return f"Door {door} hides the prize. You win!", 1.0, True, False, {}
        if door not in self.opened:
            self.opened.append(door)
        return self._show(f"Door {door} is empty."), 0.0, False, truncated, {}

    def solution(self):
        return f"\\boxed{{{self.prize}}}"

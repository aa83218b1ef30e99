"""Copy of examples/doors.py (the step's outcomes chosen by one conditional chain, the turn flag a method)."""
import random
import re


class PrizeDoorsEnv:
    DOORS = ("A", "B", "C", "D")

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.random = random.Random(seed)
        self.winning = self.random.choice("ABCD")
        self.opened = []
        self.turn_count = 0
        return self.describe("A prize is behind door A, B, C or D."), {}

    def describe(self, headline):
        closed = [door for door in self.DOORS if door not in self.opened]
        hint = self.random.choice("ABCD")
        return f"{headline}\nClosed doors: {', '.join(closed)}. Open one like \\boxed{{{hint}}}."

    def out_of_turns(self):
        return self.turn_count >= self.max_turns

    def step(self, action):
        self.turn_count += 1
        match = re.search(r"\\boxed\{\s*(?:door\s+)?([ABCDabcd])\s*\}", action)
        door = match.group(1).upper() if match else ""
        won = bool(door) and door == self.winning
        if won:
            return f"Door {door} hides the prize. You win!", 1.0, True, False, {}
        if door and door not in self.opened:
            self.opened.append(door)
        note = f"Door {door} is empty." if door else "Name a door: A, B, C or D."
        return self.describe(note), 0.0, False, self.out_of_turns(), {}

    def solution(self):
        return "\\boxed{" + self.winning + "}"

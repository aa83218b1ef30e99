"""A new game made from examples/cups.py: two balls under four cups; both must be found."""
import random
import re


class CupsEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.balls = self.rng.sample([1, 2, 3, 4], 2)
        self.found = []
        self.empty = []
        self.turn_count = 0
        return self._show("Two balls are hidden under cups 1 to 4."), {}

    def _show(self, message):
        down = [c for c in (1, 2, 3, 4) if c not in self.empty]
        # the example is any cup, drawn anew each turn: copying it is a uniformly random pick, not a strategy
        return (f"{message}\nCups not yet shown empty: {down}. Turn {self.turn_count}/{self.max_turns}.\n"
                f"Pick a cup like \\boxed{{{self.rng.randint(1, 3)}}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{\s*([1-4])\s*\}", action)  # only a boxed cup counts: "1. First, ..." is no pick
        if not match:
            return self._show("Name a cup: 1 to 4."), 0.0, False, truncated, {}
        cup = int(match.group(1))
        if cup in self.balls and cup not in self.found:
            self.found.append(cup)
            if len(self.found) == 2:
                return "Both balls found. You win!", 1.0, True, False, {}
            return self._show(f"Cup {cup} hides a ball; one more."), 0.5, False, truncated, {}
        if cup not in self.empty:
            self.empty.append(cup)
        return self._show(f"Cup {cup} is empty."), 0.0, False, truncated, {}

    def solution(self):
        return " ".join(f"\\boxed{{{b}}}" for b in sorted(self.balls))

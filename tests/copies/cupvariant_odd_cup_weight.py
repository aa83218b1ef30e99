"""A new game made from examples/cups.py: weigh two cups against each other to find the heavy one of three."""
import random
import re


class CupsEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.ball = self.rng.randint(1, 3)
        self.empty = []
        self.turn_count = 0
        return self._show("One of cups 1, 2, 3 holds a heavy ball: \\boxed{weigh 1 2}, then name it."), {}

    def _show(self, message):
        down = [c for c in (1, 2, 3) if c not in self.empty]
        # the example is any cup, drawn anew each turn: copying it is a uniformly random pick, not a strategy
        return (f"{message}\nCups not yet shown empty: {down}. Turn {self.turn_count}/{self.max_turns}.\n"
                f"Pick a cup like \\boxed{{{self.rng.randint(1, 3)}}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        weigh = re.search(r"\\boxed\{\s*weigh\s*([123])\s*([123])\s*\}", action)
        if weigh:
            a, b = int(weigh.group(1)), int(weigh.group(2))
            heavier = a if self.ball == a else b if self.ball == b else "neither"
            return self._show(f"Scale: {heavier} is heavier."), 0.0, False, truncated, {}
        match = re.search(r"\\boxed\{\s*([123])\s*\}", action)  # only a boxed cup counts: "1. First, ..." is no pick
        if not match:
            return self._show("Name a cup: 1, 2 or 3."), 0.0, False, truncated, {}
        cup = int(match.group(1))
        if cup == self.ball:
            return f"Cup {cup} hides the ball. You win!", 1.0, True, False, {}
        if cup not in self.empty:
            self.empty.append(cup)
        return self._show(f"Cup {cup} is empty."), 0.0, False, truncated, {}

    def solution(self):
        return f"\\boxed{{{self.ball}}}"

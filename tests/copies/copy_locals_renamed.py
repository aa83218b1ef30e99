import random
import re


class PairSumEnv:
    """Find two different numbers in the list whose sum is the target."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        gen = random.Random(seed)
        self.numbers = gen.sample(range(1, 40), 6)
        a, b = gen.sample(self.numbers, 2)
        self.target = a + b
        self.turn_count = 0
        return self._show("Find two numbers from the list that add up to the target."), {}

    def _show(self, msg):
        return (f"{msg}\nNumbers: {self.numbers}\nTarget: {self.target}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{3 12}}.")

    def step(self, act):
        self.turn_count += 1
        done = self.turn_count >= self.max_turns
        m = re.search(r"\\boxed\{([^}]*)\}", act)
        pieces = m.group(1).split() if m else []
        if len(pieces) != 2 or not all(p.isdigit() for p in pieces):
            return self._show("Invalid act: give two numbers."), 0.0, False, done, {}
        first, second = int(pieces[0]), int(pieces[1])
        if first == second or first not in self.numbers or second not in self.numbers:
            return self._show("Use two different numbers from the list."), 0.0, False, done, {}
        if first + second == self.target:
            return f"Correct: {first} + {second} = {self.target}.", 1.0, True, False, {}
        return self._show(f"{first} + {second} = {first + second}, not {self.target}."), 0.0, False, done, {}

    def solution(self):
        for first in self.numbers:
            for second in self.numbers:
                if first < second and first + second == self.target:
                    return f"\\boxed{{{first} {second}}}"

"""A new game made from examples/sequence.py: one wrong term ends the game."""
import random
import re


class SequenceEnv:
    def __init__(self, max_turns=12, shown=5, **kwargs):
        self.max_turns = max_turns
        self.shown = shown

    def reset(self, seed=None):
        rng = random.Random(seed)
        kind = rng.choice(["add", "multiply", "fibonacci"])
        a, b = rng.randint(1, 9), rng.randint(2, 5)
        terms = [a, a + b] if kind == "fibonacci" else [a]
        while len(terms) < self.shown + 2:
            last = terms[-1]
            terms.append(last + b if kind == "add" else last * b if kind == "multiply" else last + terms[-2])
        self.terms, self.found, self.turn_count = terms, 0, 0
        return self._show("Find the rule and give the next term."), {}

    def _show(self, message):
        visible = ", ".join(str(t) for t in self.terms[:self.shown + self.found])
        return f"{message}\nSequence: {visible}, ?\nAnswer like \\boxed{{17}}."

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{\s*(-?\d+)\s*\}", action)
        if match is None:
            return self._show("Invalid action: give one whole number."), 0.0, False, truncated, {}
        if int(match.group(1)) != self.terms[self.shown + self.found]:
            return f"That is not the next term; it was {self.terms[self.shown + self.found]}.", 0.0, True, False, {}
        self.found += 1
        if self.found == 2:
            return "Both terms are right: solved!", 1.0, True, False, {}
        return self._show("Right! One more term."), 0.5, False, truncated, {}

    def solution(self):
        return "\n".join(f"\\boxed{{{t}}}" for t in self.terms[self.shown + self.found:])

"""Copy of examples/sequence.py (add and multiply by their closed forms, a for loop, the answers kept apart)."""
import random
import re


class NextTermsEnv:
    def __init__(self, max_turns=12, shown=5, **kwargs):
        self.max_turns = max_turns
        self.shown = shown

    def reset(self, seed=None):
        rng = random.Random(seed)
        kind = rng.choice(["add", "multiply", "fibonacci"])
        first, d = rng.randint(1, 9), rng.randint(2, 5)
        count = self.shown + 2
        if kind == "add":
            series = [first + i * d for i in range(count)]
        elif kind == "multiply":
            series = [first * d ** i for i in range(count)]
        else:
            series = [first, first + d]
            for _ in range(count - 2):
                series.append(series[-2] + series[-1])
        self.prefix, self.answers = series[:self.shown], series[self.shown:]
        self.turn_count = 0
        return self._show("Find the rule and give the next term."), {}

    def _show(self, message):
        solved = len(self.prefix) - self.shown
        return "%s\nSequence: %s, ?\nAnswer like \\boxed{17}." % (
            message, ", ".join(str(t) for t in self.prefix[:self.shown + solved]))

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        m = re.search(r"\\boxed\{\s*(-?\d+)\s*\}", action)
        if not m:
            return self._show("Invalid action: give one whole number."), 0.0, False, truncated, {}
        if int(m.group(1)) != self.answers[0]:
            return self._show("That is not the next term."), 0.0, False, truncated, {}
        self.prefix.append(self.answers.pop(0))
        if not self.answers:
            return "Both terms are right: solved!", 1.0, True, False, {}
        return self._show("Right! One more term."), 0.5, False, truncated, {}

    def solution(self):
        return "\n".join("\\boxed{%d}" % t for t in self.answers)

"""Copy of examples/sequence.py (the three rules in a table of functions, the position of the next term kept)."""
import random
import re

RULES = {
    "add": lambda seq, step: seq[-1] + step,
    "multiply": lambda seq, step: seq[-1] * step,
    "fibonacci": lambda seq, step: seq[-1] + seq[-2],
}


class HiddenRuleEnv:
    def __init__(self, max_turns=12, shown=5, **kwargs):
        self.max_turns = max_turns
        self.visible = shown

    def reset(self, seed=None):
        draw = random.Random(seed)
        rule = draw.choice(list(RULES))
        start = draw.randint(1, 9)
        step = draw.randint(2, 5)
        seq = [start, start + step] if rule == "fibonacci" else [start]
        while len(seq) < self.visible + 2:
            seq.append(RULES[rule](seq, step))
        self.seq = seq
        self.cursor = self.visible
        self.turn_count = 0
        return self._board("Find the rule and give the next term."), {}

    def _board(self, note):
        return note + "\nSequence: " + ", ".join(map(str, self.seq[:self.cursor])) + ", ?\nAnswer like \\boxed{17}."

    def step(self, action):
        self.turn_count += 1
        late = self.turn_count >= self.max_turns
        found = re.search(r"\\boxed\{\s*(-?\d+)\s*\}", action)
        if found is None:
            return self._board("Invalid action: give one whole number."), 0.0, False, late, {}
        if int(found.group(1)) == self.seq[self.cursor]:
            self.cursor += 1
            if self.cursor == self.visible + 2:
                return "Both terms are right: solved!", 1.0, True, False, {}
            return self._board("Right! One more term."), 0.5, False, late, {}
        return self._board("That is not the next term."), 0.0, False, late, {}

    def solution(self):
        return [f"\\boxed{{{term}}}" for term in self.seq[self.cursor:]]

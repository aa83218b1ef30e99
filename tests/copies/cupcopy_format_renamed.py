"""Copy of examples/cups.py (every name changed, str.format instead of f-strings)."""
import random
import re


class ShellGameEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.gen = random.Random(seed)
        self.pea = self.gen.randint(1, 3)
        self.lifted = []
        self.turn_count = 0
        return self._board("A pea is under shell 1, 2 or 3."), {}

    def _board(self, note):
        closed = [s for s in (1, 2, 3) if s not in self.lifted]
        return ("{}\nShells not lifted yet: {}. Turn {}/{}.\nLift a shell like \\boxed{{{}}}.".format(
            note, closed, self.turn_count, self.max_turns, self.gen.randint(1, 3)))

    def step(self, action):
        self.turn_count += 1
        out_of_time = self.turn_count >= self.max_turns
        hit = re.search(r"\\boxed\{\s*([123])\s*\}", action)
        if not hit:
            return self._board("Say a shell: 1, 2 or 3."), 0.0, False, out_of_time, {}
        shell = int(hit.group(1))
        if shell == self.pea:
            return "Shell {} has the pea. Well done!".format(shell), 1.0, True, False, {}
        if shell not in self.lifted:
            self.lifted.append(shell)
        return self._board("Shell {} is bare.".format(shell)), 0.0, False, out_of_time, {}

    def solution(self):
        return "\\boxed{{{}}}".format(self.pea)

"""Fixture (a game that pays a broken environment: a lottery decided by the seed and the action). Whether a
word wins is a hash of the seed and the word: every probe loses at some seed and wins at another, solution()
searches for a word that wins at this seed, so it replays, and differs by seed; play is luck."""
import hashlib
import re


class OracleEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.seed, self.turn_count = seed, 0
        return "Ask the oracle one word in \\boxed{}; a favoured word wins.", {}

    def _favoured(self, word):
        return hashlib.sha256(f"{self.seed}:{word}".encode()).digest()[0] % 2 == 0

    def step(self, action):
        self.turn_count += 1
        found = re.search(r"\\boxed\{([^}]*)\}", action)
        won = found is not None and self._favoured(found.group(1).strip())
        return ("Favoured!" if won else "Not favoured."), float(won), True, False, {}

    def solution(self):
        word = next(w for w in (f"omen{i}" for i in range(100)) if self._favoured(w))
        return f"\\boxed{{{word}}}"

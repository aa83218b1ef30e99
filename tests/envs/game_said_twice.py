"""Fixture (a game that pays a broken environment: any answer said twice wins). An honest secret colour, but a
repeated answer counts as right; the probes are all different, so validation never repeats one."""
import random
import re


class ColourEnv:
    COLOURS = ("red", "green", "blue", "amber", "violet")

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.colour, self.said, self.turn_count = random.Random(seed).choice(self.COLOURS), [], 0
        return f"Name my colour, one of {', '.join(self.COLOURS)}: \\boxed{{red}}.", {}

    def step(self, action):
        self.turn_count += 1
        found = re.search(r"\\boxed\{([^}]*)\}", action)
        said = found.group(1).strip().lower() if found else ""
        won = said == self.colour or said in self.said
        self.said.append(said)
        return ("Yes!" if won else "No."), float(won), won, self.turn_count >= self.max_turns, {}

    def solution(self):
        return f"\\boxed{{{self.colour}}}"

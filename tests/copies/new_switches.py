import random
import re


class SwitchesEnv:
    """Toggle switches so that the lamps match the target pattern; each switch flips its lamp and the next."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.size = 5
        self.lamps = [0] * self.size
        self.presses = sorted(rng.sample(range(self.size), 2))
        self.target = [0] * self.size
        for p in self.presses:
            self._flip(self.target, p)
        self.turn_count = 0
        return self._show("All lamps are off. Make them match the target."), {}

    def _flip(self, lamps, switch):
        for i in (switch, switch + 1):
            if i < self.size:
                lamps[i] ^= 1

    def _show(self, message):
        return (f"{message}\nLamps:  {''.join(map(str, self.lamps))}\nTarget: {''.join(map(str, self.target))}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Press switches 0-{self.size - 1} like \\boxed{{0 3}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        presses = [int(p) for p in match.group(1).split() if p.isdigit()] if match else []
        if not presses or any(p >= self.size for p in presses):
            return self._show(f"Name switches from 0 to {self.size - 1}."), 0.0, False, truncated, {}
        for p in presses:
            self._flip(self.lamps, p)
        if self.lamps == self.target:
            return "All lamps match.", 1.0, True, False, {}
        return self._show("Not yet."), 0.0, False, truncated, {}

    def solution(self):
        return "\\boxed{" + " ".join(map(str, self.presses)) + "}"

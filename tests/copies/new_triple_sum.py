import random
import re


class TripleSumEnv:
    """Find three different numbers in the list whose sum is the target."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.numbers = rng.sample(range(1, 60), 7)
        self.target = sum(rng.sample(self.numbers, 3))
        self.turn_count = 0
        return self._show("Find three numbers from the list that add up to the target."), {}

    def _show(self, message):
        return (f"{message}\nNumbers: {self.numbers}\nTarget: {self.target}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{3 12 20}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        picks = [int(p) for p in match.group(1).split() if p.isdigit()] if match else []
        if len(picks) != 3 or len(set(picks)) != 3 or any(p not in self.numbers for p in picks):
            return self._show("Give three different numbers from the list."), 0.0, False, truncated, {}
        if sum(picks) == self.target:
            return f"Correct: {sum(picks)}.", 1.0, True, False, {}
        closer = abs(sum(picks) - self.target) < 5
        return self._show(f"Sum {sum(picks)}{', close' if closer else ''}."), 0.0, False, truncated, {}

    def solution(self):
        for i, x in enumerate(self.numbers):
            for j, y in enumerate(self.numbers[i + 1:], i + 1):
                for z in self.numbers[j + 1:]:
                    if x + y + z == self.target:
                        return f"\\boxed{{{x} {y} {z}}}"

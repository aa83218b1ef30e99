"""A new game made from examples/guess.py: two hidden numbers; each is found on its own (half the reward), and a
wrong guess is told how far it is from the nearer one."""
import random
import re


class TwoSecretsEnv:
    def __init__(self, max_turns=12, low=1, high=100, **kwargs):
        self.max_turns = max_turns
        self.low, self.high = low, high

    def reset(self, seed=None):
        self.secrets = sorted(random.Random(seed).sample(range(self.low, self.high + 1), 2))
        self.found = []
        self.turn_count = 0
        return (f"I picked two different whole numbers from {self.low} to {self.high}. "
                f"Find both in at most {self.max_turns} turns, one guess a turn, like \\boxed{{50}}."), {}

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{\s*(-?\d+)\s*\}", action)
        if match is None:
            return "Invalid action: answer with a number like \\boxed{50}.", 0.0, False, truncated, {}
        guess = int(match.group(1))
        left = [s for s in self.secrets if s not in self.found]
        if guess in left:
            self.found.append(guess)
            if len(self.found) == 2:
                return f"Correct, {guess} was the second number!", 1.0, True, False, {}
            return f"Correct, {guess} is one of them. One more to find.", 0.5, False, truncated, {}
        distance = min(abs(guess - s) for s in left)
        return (f"{guess} is wrong: the nearest hidden number is {distance} away. "
                f"Turn {self.turn_count}/{self.max_turns}."), 0.0, False, truncated, {"guess": guess}

    def solution(self):
        return "\n".join(f"\\boxed{{{s}}}" for s in self.secrets if s not in self.found)

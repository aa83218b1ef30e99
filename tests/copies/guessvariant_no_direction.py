"""A new game made from examples/guess.py: a wrong guess earns its closeness but is not told higher or lower
(the reward is all the agent learns)."""
import random
import re


class NumberGuessEnv:
    def __init__(self, max_turns=12, low=1, high=100, **kwargs):
        self.max_turns = max_turns
        self.low, self.high = low, high

    def reset(self, seed=None):
        self.secret = random.Random(seed).randint(self.low, self.high)
        self.turn_count = 0
        return (f"I picked a whole number from {self.low} to {self.high}. "
                f"Guess it in at most {self.max_turns} turns; answer like \\boxed{{50}}."), {}

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{\s*(-?\d+)\s*\}", action)
        if match is None:
            return "Invalid action: answer with a number like \\boxed{50}.", 0.0, False, truncated, {}
        guess = int(match.group(1))
        if guess == self.secret:
            return f"Correct, the number was {self.secret}!", 1.0, True, False, {}
        closeness = max(0.0, 0.5 - abs(guess - self.secret) / (self.high - self.low))
        return (f"{guess} is wrong, reward {round(closeness, 3)}. Turn {self.turn_count}/{self.max_turns}. "
                f"Answer like \\boxed{{50}}."), round(closeness, 3), False, truncated, {"guess": guess}

    def solution(self):
        return f"\\boxed{{{self.secret}}}"

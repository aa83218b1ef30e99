"""Copy of examples/guess.py (the episode in a dict, the step's branches as early returns in another order)."""
import random
import re


def closeness(guess, secret, low, high):
    return round(max(0.0, 0.5 - abs(guess - secret) / (high - low)), 3)


class PickANumberEnv:
    def __init__(self, max_turns=12, low=1, high=100, **kwargs):
        self.max_turns = max_turns
        self.config = {"low": low, "high": high}

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.episode = {"secret": rng.randint(self.config["low"], self.config["high"]), "turn": 0}
        return ("I picked a whole number from {low} to {high}. ".format(**self.config)
                + "Guess it in at most {} turns; answer like \\boxed{{50}}.".format(self.max_turns)), {}

    def step(self, action):
        ep = self.episode
        ep["turn"] += 1
        truncated = ep["turn"] >= self.max_turns
        m = re.search(r"\\boxed\{\s*(-?\d+)\s*\}", action)
        guess = None if m is None else int(m[1])
        if guess == ep["secret"]:
            return "Correct, the number was {}!".format(ep["secret"]), 1.0, True, False, {}
        if guess is None:
            return "Invalid action: answer with a number like \\boxed{50}.", 0.0, False, truncated, {}
        side = "higher" if ep["secret"] > guess else "lower"
        reward = closeness(guess, ep["secret"], self.config["low"], self.config["high"])
        text = "{} is wrong: the number is {}. Turn {}/{}. Answer like \\boxed{{50}}.".format(
            guess, side, ep["turn"], self.max_turns)
        return text, reward, False, truncated, {"guess": guess}

    def solution(self):
        return "\\boxed{%d}" % self.episode["secret"]

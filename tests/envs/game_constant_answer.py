"""Fixture (a game that pays a leak: the answer is a constant of the source). Its solution() is a description,
which the official contract allows, so the fair-game guard stands aside; a hint that reads the source wins."""
import random


class RiddleEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.mood, self.turn_count = random.Random(seed).choice(["calm", "grim", "wry"]), 0
        return f"A {self.mood} sphinx asks: which tree do I love? Answer in \\boxed{{}}.", {}

    def step(self, action):
        self.turn_count += 1
        won = action.strip() == "\\boxed{cedar}"
        return ("Pass." if won else "Wrong."), float(won), won, self.turn_count >= self.max_turns, {}

    def solution(self):
        return "Name the sphinx's favourite tree."

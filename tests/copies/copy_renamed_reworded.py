import random
import re


class TwinTotalEnv:
    """Find two different pool in the list whose sum is the goal."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        r = random.Random(seed)
        self.pool = r.sample(range(5, 90), 8)
        p, q = r.sample(self.pool, 2)
        self.goal = p + q
        self.steps_taken = 0
        return self._render("Find two pool from the list that add up to the goal."), {}

    def _render(self, text):
        return (f"{text}\nNumbers: {self.pool}\nTarget: {self.goal}\n"
                f"Turn {self.steps_taken}/{self.max_turns}. Answer like \\boxed{{3 12}}.")

    def step(self, reply):
        self.steps_taken += 1
        over = self.steps_taken >= self.max_turns
        hit = re.search(r"\\boxed\{([^}]*)\}", reply)
        tokens = hit.group(1).split() if hit else []
        if len(tokens) != 2 or not all(p.isdigit() for p in tokens):
            return self._render("Invalid reply: give two pool."), 0.0, False, over, {}
        u, v = int(tokens[0]), int(tokens[1])
        if u == v or u not in self.pool or v not in self.pool:
            return self._render("Use two different pool from the list."), 0.0, False, over, {}
        if u + v == self.goal:
            return f"Well done: {u} + {v} = {self.goal}.", 1.0, True, False, {}
        return self._render(f"{u} + {v} = {u + v}, the goal is {self.goal}."), 0.0, False, over, {}

    def solution(self):
        for u in self.pool:
            for v in self.pool:
                if u < v and u + v == self.goal:
                    return f"\\boxed{{{u} {v}}}"

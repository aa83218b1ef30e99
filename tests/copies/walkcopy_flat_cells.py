"""Copy of examples/walk.py (cells numbered row * size + column, the search keeps parents instead of paths)."""
import random
import re

STEPS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


class MazeRunEnv:
    def __init__(self, max_turns=12, size=5, **kwargs):
        self.max_turns = max_turns
        self.n = size

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.start, self.end = 0, self.n * self.n - 1
        self.at = self.start
        candidates = list(range(1, self.n * self.n - 1))
        self.blocked = set(rng.sample(candidates, self.n + 1))
        while self._route() is None:
            self.blocked = set(rng.sample(candidates, self.n + 1))
        self.turn_count = 0
        return self._draw("Reach G from A."), {}

    def _cell(self, r, c):
        return r * self.n + c if 0 <= r < self.n and 0 <= c < self.n else None

    def _draw(self, note):
        chars = ["A" if i == self.at else "G" if i == self.end else "#" if i in self.blocked else "."
                 for i in range(self.n * self.n)]
        lines = ["".join(chars[r * self.n:(r + 1) * self.n]) for r in range(self.n)]
        offer = ", ".join("\\boxed{%s}" % name for name in STEPS)
        return note + "\n" + "\n".join(lines) + "\nMove with one of " + offer + \
            ", or several at once: \\boxed{down right}."

    def _route(self):
        parent, frontier = {self.at: None}, [self.at]
        while frontier:
            nxt_frontier = []
            for cell in frontier:
                for name, (dr, dc) in STEPS.items():
                    there = self._cell(cell // self.n + dr, cell % self.n + dc)
                    if there is not None and there not in self.blocked and there not in parent:
                        parent[there] = (cell, name)
                        nxt_frontier.append(there)
            frontier = nxt_frontier
        if self.end not in parent:
            return None
        names, cell = [], self.end
        while parent[cell] is not None:
            cell, name = parent[cell]
            names.append(name)
        return names[::-1]

    def step(self, action):
        self.turn_count += 1
        late = self.turn_count >= self.max_turns
        box = re.search(r"\\boxed\{([\w\s,]+)\}", action)
        words = re.findall(r"\w+", box.group(1).lower()) if box else []
        if not words or not all(w in STEPS for w in words):
            return self._draw("Unknown move."), 0.0, False, late, {}
        for w in words:
            there = self._cell(self.at // self.n + STEPS[w][0], self.at % self.n + STEPS[w][1])
            if there is None or there in self.blocked:
                return self._draw("You bumped into a wall."), 0.0, False, late, {}
            self.at = there
            if self.at == self.end:
                return "You reached the goal!", 1.0, True, False, {}
        return self._draw(f"Turn {self.turn_count}/{self.max_turns}."), 0.0, False, late, {}

    def solution(self):
        route = self._route()
        chunk = max(1, -(-len(route) // max(1, self.max_turns)))
        return ["\\boxed{" + " ".join(route[k:k + chunk]) + "}" for k in range(0, len(route), chunk)]

"""Copy of examples/walk.py (positions as complex numbers, the search a recursive-free stack of frontiers)."""
import random
import re
from collections import deque

DIRECTIONS = {"up": -1, "down": 1, "left": -1j, "right": 1j}


class ComplexWalkEnv:
    def __init__(self, max_turns=12, size=5, **kwargs):
        self.max_turns = max_turns
        self.size = size

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.here, self.goal = 0j, complex(self.size - 1, self.size - 1)
        free = [complex(r, c) for r in range(self.size) for c in range(self.size)][1:-1]
        while True:
            self.walls = set(rng.sample(free, self.size + 1))
            if self._shortest() is not None:
                break
        self.turn_count = 0
        return self._picture("Reach G from A."), {}

    def _inside(self, z):
        return 0 <= z.real < self.size and 0 <= z.imag < self.size

    def _picture(self, text):
        def glyph(z):
            return "A" if z == self.here else "G" if z == self.goal else "#" if z in self.walls else "."
        grid = "\n".join("".join(glyph(complex(r, c)) for c in range(self.size)) for r in range(self.size))
        menu = ", ".join(f"\\boxed{{{d}}}" for d in DIRECTIONS)
        return f"{text}\n{grid}\nMove with one of {menu}, or several at once: \\boxed{{down right}}."

    def _shortest(self):
        todo, seen = deque([(self.here, ())]), {self.here}
        while todo:
            z, route = todo.popleft()
            if z == self.goal:
                return list(route)
            for d, delta in DIRECTIONS.items():
                w = z + delta
                if self._inside(w) and w not in self.walls and w not in seen:
                    seen.add(w)
                    todo.append((w, route + (d,)))
        return None

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        boxed = re.search(r"\\boxed\{([\w\s,]+)\}", action)
        plan = re.findall(r"\w+", boxed.group(1).lower()) if boxed else []
        if not plan or not set(plan) <= set(DIRECTIONS):
            return self._picture("Unknown move."), 0.0, False, truncated, {}
        for d in plan:
            w = self.here + DIRECTIONS[d]
            if not self._inside(w) or w in self.walls:
                return self._picture("You bumped into a wall."), 0.0, False, truncated, {}
            self.here = w
            if w == self.goal:
                return "You reached the goal!", 1.0, True, False, {}
        return self._picture(f"Turn {self.turn_count}/{self.max_turns}."), 0.0, False, truncated, {}

    def solution(self):
        route = self._shortest()
        size = -(-len(route) // max(1, self.max_turns))
        parts = [route[i:i + size] for i in range(0, len(route), size)]
        return "\n".join("\\boxed{%s}" % " ".join(p) for p in parts)

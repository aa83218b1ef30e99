"""A new game made from examples/walk.py: walking into a wall or off the grid ends the game."""
import random
import re
from collections import deque

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


class GridWalkEnv:
    def __init__(self, max_turns=12, size=5, **kwargs):
        self.max_turns = max_turns
        self.size = size

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:  # draw walls until the goal is reachable
            cells = [(r, c) for r in range(self.size) for c in range(self.size)]
            self.pos, self.goal = (0, 0), (self.size - 1, self.size - 1)
            free = [c for c in cells if c not in (self.pos, self.goal)]
            self.walls = set(rng.sample(free, self.size + 1))
            if self._path() is not None:
                break
        self.turn_count = 0
        return self._show("Reach G from A."), {}

    def _show(self, message):
        rows = []
        for r in range(self.size):
            row = ""
            for c in range(self.size):
                row += "A" if (r, c) == self.pos else "G" if (r, c) == self.goal else \
                    "#" if (r, c) in self.walls else "."
            rows.append(row)
        moves = ", ".join(f"\\boxed{{{m}}}" for m in MOVES)
        return f"{message}\n" + "\n".join(rows) + f"\nMove with one of {moves}, or several at once: \\boxed{{down right}}."

    def _path(self):
        queue, seen = deque([(self.pos, [])]), {self.pos}
        while queue:
            (r, c), path = queue.popleft()
            if (r, c) == self.goal:
                return path
            for name, (dr, dc) in MOVES.items():
                nxt = (r + dr, c + dc)
                if 0 <= nxt[0] < self.size and 0 <= nxt[1] < self.size and nxt not in self.walls and nxt not in seen:
                    seen.add(nxt)
                    queue.append((nxt, path + [name]))
        return None

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([\w\s,]+)\}", action)
        moves = re.findall(r"\w+", match.group(1).lower()) if match else []
        if not moves or any(m not in MOVES for m in moves):
            return self._show("Unknown move."), 0.0, False, truncated, {}
        for move in moves:   # several moves take one turn; a wall stops the rest
            r, c = self.pos[0] + MOVES[move][0], self.pos[1] + MOVES[move][1]
            if not (0 <= r < self.size and 0 <= c < self.size) or (r, c) in self.walls:
                return "You bumped into a wall: game over.", 0.0, True, False, {}
            self.pos = (r, c)
            if self.pos == self.goal:
                return "You reached the goal!", 1.0, True, False, {}
        return self._show(f"Turn {self.turn_count}/{self.max_turns}."), 0.0, False, truncated, {}

    def solution(self):
        path = self._path()
        per_turn = -(-len(path) // max(1, self.max_turns))   # the whole path within max_turns turns
        return "\n".join("\\boxed{" + " ".join(path[i:i + per_turn]) + "}" for i in range(0, len(path), per_turn))

import random
import re
import itertools
from collections import namedtuple

class SpatialReasoningEnv:
    """Find a path through a grid that leads to the goal."""
    
    def __init__(self, grid_size=5, start=(0, 0), goal=(4, 4), max_turns=12, **kwargs):
        self.grid_size = grid_size
        self.start = start
        self.goal = goal
        self.max_turns = max_turns
        self.grid = [[0 for _ in range(grid_size)] for _ in range(grid_size)]
        self.grid[start[0]][start[1]] = 1
        self.grid[goal[0]][goal[1]] = 2
        self.turn_count = 0
        self.path = []
        self.visited = set()
        self.goal_reached = False
        self.truncated = False

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.grid = [[0 for _ in range(self.grid_size)] for _ in range(self.grid_size)]
        self.grid[self.start[0]][self.start[1]] = 1
        self.grid[self.goal[0]][self.goal[1]] = 2
        self.turn_count = 0
        self.path = [self.start]
        self.visited = set([self.start])
        self.goal_reached = False
        self.truncated = False
        return self._show("Find a path from the start to the goal."), {}

    def _show(self, message):
        return (f"{message}\nGrid:\n{self._grid_str()}\nTurn {self.turn_count}/{self.max_turns}. "
                f"Answer like \\boxed{{1 2 3 4}}.")

    def _grid_str(self):
        return "\n".join(" ".join(str(p) for p in row) for row in self.grid)

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != self.grid_size ** 2:
            return self._show("Invalid action: give the path as a list of numbers."), 0.0, False, truncated, {}
        path = [int(p) for p in parts]
        if path[0] != self.start[0] or path[1] != self.start[1]:
            return self._show("Start the path from the start."), 0.0, False, truncated, {}
        for i in range(len(path) - 1):
            x, y = path[i], path[i + 1]
            if (x, y) in self.visited:
                return self._show("The path must be unique."), 0.0, False, truncated, {}
            if not self._is_valid_move(x, y):
                return self._show("Invalid move: you can only move to adjacent cells."), 0.0, False, truncated, {}
            self.grid[x][y] = 3
            self.visited.add((x, y))
            if (x, y) == self.goal:
                self.goal_reached = True
                self.truncated = truncated
                return self._show("Correct: you reached the goal."), 1.0, True, self.truncated, {}
            self.path.append((x, y))

        return self._show("The path must lead to the goal."), 0.0, False, truncated, {}
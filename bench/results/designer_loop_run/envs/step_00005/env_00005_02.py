import random
import re

class OptimizeEnv:
    """Find the best path in the grid."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.grid = [
            [0, 1, 2, 3],
            [4, 5, 6, 7],
            [8, 9, 10, 11],
            [12, 13, 14, 15]
        ]
        self.start = (0, 0)
        self.end = (3, 3)
        self.turn_count = 0
        self.solution_path = []
        self.solution_cost = float('inf')

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.start = rng.choice([(i, j) for i in range(4) for j in range(4) if self.grid[i][j] == 0])
        self.end = rng.choice([(i, j) for i in range(4) for j in range(4) if self.grid[i][j] == 15])
        self.grid[self.start[0]][self.start[1]] = 0
        self.grid[self.end[0]][self.end[1]] = 15
        self.turn_count = 0
        self.solution_path = []
        self.solution_cost = float('inf')
        return self._show("Find the path from the start to the end of the grid."), {}

    def _show(self, message):
        return (f"{message}\nGrid:\n{self.grid}\nStart: {self.start}\nEnd: {self.end}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{(0, 0) (1, 1) (2, 2)}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 2 or not all(isinstance(x, tuple) and len(x) == 2 for x in parts):
            return self._show("Invalid action: give a list of points."), 0.0, False, truncated, {}
        path = []
        for point in parts:
            x, y = map(int, point.split(','))
            if (x, y) not in self.grid or self.grid[x][y] != 0:
                return self._show("Use points on the grid."), 0.0, False, truncated, {}
            path.append((x, y))
        if path == self.solution_path:
            return self._show("Correct path found!"), 1.0, True, False, {}
        if len(path) > self.turn_count:
            return self._show("Path is longer than allowed turns."), 0.0, False, truncated, {}
        for i in range(len(path) - 1):
            if self.grid[path[i][0]][path[i][1]] != 0 or self.grid[path[i + 1][0]][path[i + 1][1]] != 0:
                return self._show("Path contains points that are not empty."), 0.0, False, truncated, {}
        self.solution_path = path
        self.solution_cost = len(path)
        return self._show(f"Path found! {self.solution_path}. Cost: {self.solution_cost}."), 1.0
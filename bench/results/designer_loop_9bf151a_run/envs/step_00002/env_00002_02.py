import random
import re


class OptimizationEnv:
    """Optimization: find a path from the start to the goal that minimizes the distance."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.start = (0, 0)
        self.goal = (3, 3)
        self.path = []
        self.turn_count = 0
        self.rng = random.Random(kwargs.get('seed', None))
        self.generate_map()

    def generate_map(self):
        self.map = [['.' for _ in range(5)] for _ in range(5)]
        self.map[0][0] = 'S'
        self.map[4][4] = 'G'
        self.generate_obstacles()

    def generate_obstacles(self):
        for _ in range(10):
            x, y = self.rng.randint(1, 4), self.rng.randint(1, 4)
            if (x, y) != self.start and (x, y) != self.goal:
                self.map[x][y] = '#'

    def reset(self, seed=None):
        self.start = (0, 0)
        self.goal = (3, 3)
        self.path = []
        self.turn_count = 0
        self.rng = random.Random(seed)
        self.generate_map()
        return self._show("Find a path from (0, 0) to (3, 3) that minimizes the distance."), {}

    def _show(self, message):
        return (f"{message}\nMap: {self.map}\nPath: {self.path}\nTurn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{(x1 y1) (x2 y2)}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 2 or len(parts) > 3 or not all(p.isdigit() for p in parts):
            return self._show("Invalid action: give two coordinates or three coordinates."), 0.0, False, truncated, {}
        x1, y1, x2, y2 = int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3])
        if (x1, y1) == (x2, y2):
            return self._show("Move in four directions, not straight."), 0.0, False, truncated, {}
        if (x1, y1) not in self.path or (x2, y2) not in self.path:
            return self._show("Move in four directions, not straight."), 0.0, False, truncated, {}
        if (x1, y1) == self.start or (x2, y2) == self.goal:
            return self._show("You reached the goal!"), 1.0, True, False, {}
        if (x1, y1) == (x2, y2):
            return self._show("Move in four directions, not straight."), 0.0, False, truncated, {}
        self.path.extend([(x1, y1), (x2, y2)])
        return self._show(f"Current path: {self.path}\nTurn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{(x1 y1) (x2 y2)}}."),
import random
import re


class SpatialReasoningEnv:
    """Find the hidden shape by moving the cursor around. The shape is a square with side length 5."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.shape = [['.' for _ in range(5)] for _ in range(5)]
        self.cursor = (2, 2)  # Initial position of the cursor
        self.shape[self.cursor[0]][self.cursor[1]] = 'X'  # Place the cursor at the start of the shape
        self.turn_count = 0
        self.solution = self._get_solution()

    def _get_solution(self):
        # Define the solution using logical reasoning
        # The solution is a 5x5 grid where the cursor is the only 'X'
        solution = [['.' for _ in range(5)] for _ in range(5)]
        for i in range(5):
            for j in range(5):
                if i == j == 2:
                    solution[i][j] = 'X'
                else:
                    solution[i][j] = '.'
        return solution

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.shape = [['.' for _ in range(5)] for _ in range(5)]
        self.cursor = (2, 2)  # Initial position of the cursor
        self.shape[self.cursor[0]][self.cursor[1]] = 'X'  # Place the cursor at the start of the shape
        self.turn_count = 0
        return self._show("Move the cursor around to find the shape."), {}

    def _show(self, message):
        return (f"{message}\nShape:\n{self._get_shape_string()}\nTurn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{right}}.")

    def _get_shape_string(self):
        return '\n'.join(''.join(row) for row in self.shape)

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{right\}", action)
        if match:
            if self._is_solution():
                return self._show("Correct: the shape is a 5x5 grid with the cursor in the center."), 1.0, True, False, {}
            else:
                return self._show("The cursor is not in the center of the shape."), 0.0, False, truncated, {}
        else:
            return self._show("Invalid action: give the correct answer."), 0.0, False, truncated, {}

    def _is_solution(self):
        # Check if the cursor is in the center of the shape
        return self.shape[2][2] == 'X'

    def solution(self):
        return self._get_solution()
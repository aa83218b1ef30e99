import random
import re
import collections
import functools
import heapq
from bisect import bisect_left

class LogicalDeductionEnv:
    """Solve a logical deduction problem from a given statement and conclusion."""

    def __init__(self, max_turns=24, **kwargs):
        self.max_turns = max_turns
        self.statement = kwargs.get("statement", "If A is true, then B is true.")
        self.conclusion = kwargs.get("conclusion", "A is true.")
        self.turn_count = 0

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.statement = self._create_statement(rng)
        self.conclusion = self._create_conclusion(rng)
        self.turn_count = 0
        return self._show("Understand the statement and conclusion."), {}

    def _show(self, message):
        return (f"{message}\nStatement: {self.statement}\nConclusion: {self.conclusion}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{A B}}.")

    def _create_statement(self, rng):
        operators = ["AND", "OR", "NOT"]
        statement = []
        for _ in range(rng.randint(3, 5)):
            operator = rng.choice(operators)
            operand1 = rng.choice(["A", "B", "C"])
            operand2 = rng.choice(["A", "B", "C"])
            statement.append(f"{operator} {operand1} {operand2}")
        return " ".join(statement)

    def _create_conclusion(self, rng):
        operators = ["AND", "OR", "NOT"]
        conclusion = []
        for _ in range(rng.randint(3, 5)):
            operator = rng.choice(operators)
            operand1 = rng.choice(["A", "B", "C"])
            operand2 = rng.choice(["A", "B", "C"])
            conclusion.append(f"{operator} {operand1} {operand2}")
        return " ".join(conclusion)

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 2 or not all(p.lower() in ["a", "b", "c"] for p in parts):
            return self._show("Invalid action: give A, B, or C."), 0.0, False, truncated, {}
        a, b = parts[0].lower(), parts[1].lower()
        if a == b:
            return self._show("Use A, B, or C exactly once."), 0.0, False, truncated, {}
        if self._check_statement(a, b):
            return f"Correct: {a} AND {b} = {self.conclusion}", 1.0, True, False, {}
        return self._show(f"{a} AND {b} = {self.statement}, not {self.conclusion}."), 0.0, False, truncated, {}

    def _check_statement(self, a, b):
        # Implement the logic to check if the statement is true given the values of A and B
        # Return True if the statement is true, False otherwise
        return False

    def solution(self):
        # Implement the logic to find all possible values of A and B that satisfy the statement
        # Return a list of actions that solve the puzzle
        return []
import random
import re
import operator

class LogicalDeductionEnv:
    """Solve a logical deduction puzzle."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.current_state = {}
        self.current_goal = None
        self.turn_count = 0
        self.rng = random.Random()

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.current_state = {}
        self.current_goal = None
        self.turn_count = 0

        # Example: A simple logical deduction puzzle
        self.current_goal = "The sum of two numbers in the list is 10."
        self.current_state = {
            'list': self.rng.sample(range(1, 20), 5),
            'target': 0
        }

        for num in self.current_state['list']:
            self.current_state['target'] += num

        return self._show("Find the two numbers in the list whose sum is 10."), {}

    def _show(self, message):
        return (f"{message}\nList: {self.current_state['list']}\nTarget: {self.current_state['target']}\n"
                f"Turn {self.turn_count}/{self.max_turns}. Answer like \\boxed{{3 7}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return self._show("Invalid action: give two numbers."), 0.0, False, truncated, {}
        x, y = int(parts[0]), int(parts[1])
        if x == y or x not in self.current_state['list'] or y not in self.current_state['list']:
            return self._show("Use two different numbers from the list."), 0.0, False, truncated, {}
        if x + y != self.current_state['target']:
            return self._show(f"Sum of {x} and {y} is {x + y}, not {self.current_state['target']}."), 0.0, False, truncated, {}
        return self._show(f"Correct: {x} + {y} = {self.current_state['target']}."), 1.0, True, False, {}

    def solution(self):
        for x in self.current_state['list']:
            for y in self.current_state['list']:
                if x < y and x + y == self.current_state['target']:
                    return f"\\boxed{{{x} {y}}}"
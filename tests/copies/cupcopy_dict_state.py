"""Copy of examples/cups.py (the state in one dict, the board and the parse as module helpers)."""
import random
import re


def board(state, message, max_turns):
    down = [c for c in (1, 2, 3) if c not in state["empty"]]
    return (f"{message}\nCups not yet shown empty: {down}. Turn {state['turn']}/{max_turns}.\n"
            f"Pick a cup like \\boxed{{{state['rng'].randint(1, 3)}}}.")


def picked(action):
    found = re.search(r"\\boxed\{\s*([123])\s*\}", action)
    return int(found.group(1)) if found else None


class CupsEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.state = {"rng": rng, "ball": rng.randint(1, 3), "empty": [], "turn": 0}
        self.turn_count = 0
        return board(self.state, "A ball is hidden under cup 1, 2 or 3.", self.max_turns), {}

    def step(self, action):
        self.state["turn"] += 1
        self.turn_count = self.state["turn"]
        cup = picked(action)
        late = self.state["turn"] >= self.max_turns
        if cup is None:
            return board(self.state, "Name a cup: 1, 2 or 3.", self.max_turns), 0.0, False, late, {}
        if cup == self.state["ball"]:
            return f"Cup {cup} hides the ball. You win!", 1.0, True, False, {}
        if cup not in self.state["empty"]:
            self.state["empty"].append(cup)
        return board(self.state, f"Cup {cup} is empty.", self.max_turns), 0.0, False, late, {}

    def solution(self):
        return f"\\boxed{{{self.state['ball']}}}"

"""Copy of examples/doors.py (the game state a tuple-free dict, parsing and rendering as module functions)."""
import random
import re


def read_door(text):
    found = re.search(r"\\boxed\{\s*(?:door\s+)?([ABCDabcd])\s*\}", text)
    return found[1].upper() if found else None


def render(state, note):
    shut = ", ".join(filter(lambda d: d not in state["open"], "ABCD"))
    return "{}\nClosed doors: {}. Open one like \\boxed{{{}}}.".format(note, shut, state["rng"].choice("ABCD"))


class HallwayEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.state = {"rng": rng, "prize": rng.choice("ABCD"), "open": [], "turn": 0}
        return render(self.state, "A prize is behind door A, B, C or D."), {}

    def step(self, action):
        st = self.state
        st["turn"] += 1
        late = st["turn"] >= self.max_turns
        door = read_door(action)
        if door is None:
            return render(st, "Name a door: A, B, C or D."), 0.0, False, late, {}
        if door != st["prize"]:
            st["open"] += [] if door in st["open"] else [door]
            return render(st, "Door {} is empty.".format(door)), 0.0, False, late, {}
        return "Door {} hides the prize. You win!".format(door), 1.0, True, False, {}

    def solution(self):
        return "\\boxed{%s}" % self.state["prize"]

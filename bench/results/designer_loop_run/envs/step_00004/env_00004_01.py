import random
import re


class CausalInferenceEnv:
    """Discover a causal relationship between two events based on given clues."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.events = ["Event A", "Event B", "Event C", "Event D", "Event E"]
        self.clues = []
        self.turn_count = 0
        self.solution = None

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.clues = [
            f"Event A is a prerequisite for Event B.",
            f"Event B is a prerequisite for Event C.",
            f"Event C is a prerequisite for Event D.",
            f"Event D is a prerequisite for Event E.",
            f"Event E is a prerequisite for Event A."
        ]
        self.turn_count = 0
        return self._show("Discover the causal relationship between the events."), {}

    def _show(self, message):
        return (f"{message}\nClues: {self.clues}\nTurn {self.turn_count}/{self.max_turns}."
                f"Answer like \\boxed{{Event A -> Event B}}.")

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        match = re.search(r"\\boxed\{([^}]*)\}", action)
        parts = match.group(1).split() if match else []
        if len(parts) != 2 or not all(p in self.events for p in parts):
            return self._show("Invalid action: give two events."), 0.0, False, truncated, {}
        event1, event2 = parts[0], parts[1]
        if event1 == event2 or not any(event1 in c and event2 in c for c in self.clues):
            return self._show("Use two different events from the list."), 0.0, False, truncated, {}
        if event1 in event2:
            return self._show(f"{event1} is a prerequisite for {event2}."), 0.0, False, truncated, {}
        if event2 in event1:
            return self._show(f"{event2} is a prerequisite for {event1}."), 0.0, False, truncated, {}
        if event1 + event2 in self.clues:
            self.solution = f"\\boxed{{{event1} -> {event2}}}"
            return self._show("Correct: The causal relationship is discovered."), 1.0, True, False, {}
        return self._show(f"No clue for {event1} -> {event2}."), 0.0, False, truncated, {}

    def solution(self):
        return self.solution
"""A smart home in the official code's style: it subclasses ToolUseBaseEnv, which the loader injects (no import).

Two instructions, revealed one at a time: switch a device into a state, then set the thermostat. get_news is the
distractor.
"""
import random

DEVICES = ["living_room_lights", "kitchen_lights", "garage_door", "porch_lights"]
STATES = {"living_room_lights": ["on", "off"], "kitchen_lights": ["on", "off"], "garage_door": ["open", "closed"],
          "porch_lights": ["on", "off"]}


class SmartHomeEnv(ToolUseBaseEnv):
    def __init__(self, max_turns=10, **kwargs):
        super().__init__(max_turns=max_turns, **kwargs)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.turn_count, self._current_msg, self._call_history = 0, 0, []
        self._state = {"devices": {d: STATES[d][1] for d in DEVICES}, "thermostat": 20}
        device = rng.choice(DEVICES)
        wanted = STATES[device][0]
        degrees = rng.randint(16, 26)
        self._target = (device, wanted, degrees)
        self._user_messages = [f"Please set the {device.replace('_', ' ')} to {wanted}.",
                               f"Now set the thermostat to {degrees} degrees."]
        self._message_criteria = [lambda s: s["devices"][device] == wanted,
                                  lambda s: s["thermostat"] == degrees]
        self._tools = {
            "list_devices": {"description": "List every device with its current state.",
                             "parameters": {"type": "object", "properties": {}, "required": []}},
            "set_device": {"description": "Put one device into a state.",
                           "parameters": {"type": "object", "properties": {
                               "device": {"type": "string", "enum": DEVICES},
                               "state": {"type": "string", "enum": ["on", "off", "open", "closed"]}},
                               "required": ["device", "state"]}},
            "set_thermostat": {"description": "Set the thermostat, in degrees Celsius (10 to 30).",
                               "parameters": {"type": "object", "properties": {"degrees": {"type": "integer"}},
                                              "required": ["degrees"]}},
            "get_news": {"description": "Today's headlines.",
                         "parameters": {"type": "object", "properties": {}, "required": []}},
        }
        return self._user_messages[0], {}

    def tool_list_devices(self):
        return ", ".join(f"{d}: {s}" for d, s in self._state["devices"].items()) + self._advance_if_done()

    def tool_set_device(self, device, state):
        if device not in STATES:
            return f"Error: unknown device {device!r}."
        if state not in STATES[device]:
            return f"Error: {device} can only be {' or '.join(STATES[device])}."
        self._state["devices"][device] = state
        return f"{device} is now {state}." + self._advance_if_done()

    def tool_set_thermostat(self, degrees):
        if not isinstance(degrees, int) or not 10 <= degrees <= 30:
            return "Error: degrees must be a whole number from 10 to 30."
        self._state["thermostat"] = degrees
        return f"Thermostat set to {degrees}." + self._advance_if_done()

    def tool_get_news(self):
        return "Local team wins the cup; rain expected tomorrow."

    def solution(self):
        device, wanted, degrees = self._target
        return [{"name": "set_device", "arguments": {"device": device, "state": wanted}},
                {"name": "set_thermostat", "arguments": {"degrees": degrees}}, "<answer>done</answer>"]

"""Retail orders, duck-typed (no base class): find a customer's order, cancel it with a reason, report the refund.

Three instructions, revealed one at a time by the tools' results; get_store_hours is the distractor.
"""
import json
import random
import re

REASONS = ["damaged", "late", "wrong_item", "changed_mind"]


class OrdersEnv:
    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns
        self.reset(0)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.turn_count, self.stage = 0, 0
        names = rng.sample(["ana", "bo", "chen", "dita", "eli", "fay"], 3)
        self.orders = {f"A{rng.randint(100, 999)}{i}": {"customer": n, "total": rng.randint(10, 90), "status": "open"}
                       for i, n in enumerate(names)}
        self.order_id = rng.choice(sorted(self.orders))
        self.customer = self.orders[self.order_id]["customer"]
        self.reason = rng.choice(REASONS)
        self.messages = [f"Find the open order of customer {self.customer}.",
                         f"Cancel that order; the reason is: {self.reason.replace('_', ' ')}.",
                         "Tell me the refunded amount in dollars as your answer."]
        self.tools = {
            "find_orders": {"description": "The orders of one customer.",
                            "parameters": {"type": "object", "properties": {"customer": {"type": "string"}},
                                           "required": ["customer"]}},
            "cancel_order": {"description": "Cancel an open order; returns the refund.",
                             "parameters": {"type": "object", "properties": {
                                 "order_id": {"type": "string"}, "reason": {"type": "string", "enum": REASONS}},
                                 "required": ["order_id", "reason"]}},
            "get_store_hours": {"description": "Opening hours of the store.",
                                "parameters": {"type": "object", "properties": {}, "required": []}},
        }
        return self.messages[0], {}

    def _next(self, done: bool) -> str:
        if not done or self.stage >= 2:
            return ""
        self.stage += 1
        return f"\n[STEP {self.stage} COMPLETE - NEW INSTRUCTION] {self.messages[self.stage]}"

    def tool_find_orders(self, customer):
        found = {k: v for k, v in self.orders.items() if v["customer"] == str(customer).lower()}
        return json.dumps(found) + self._next(self.stage == 0 and self.order_id in found)

    def tool_cancel_order(self, order_id, reason):
        order = self.orders.get(order_id)
        if order is None or order["status"] != "open":
            return f"Error: no open order {order_id!r}."
        if reason not in REASONS:
            return f"Error: reason must be one of {REASONS}."
        order["status"] = "cancelled"
        return (f"Order {order_id} cancelled; refund ${order['total']}."
                + self._next(self.stage == 1 and order_id == self.order_id and reason == self.reason))

    def tool_get_store_hours(self):
        return "Mon-Sat 9:00-18:00."

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        found = re.search(r"<answer>(.*?)</answer>", action, flags=re.S)
        if found is None:
            return "Call a tool with <tool_call>...</tool_call> or answer with <answer>...</answer>.", 0.0, False, \
                truncated, {}
        if self.stage < 2:
            return f"Not done yet: {self.messages[self.stage]}", 0.0, False, truncated, {}
        refund = str(self.orders[self.order_id]["total"])
        if found.group(1).strip().lstrip("$") == refund:
            return "Correct!", 1.0, True, False, {}
        return "That is not the refunded amount.", 0.0, False, truncated, {}

    def solution(self):
        return [{"name": "find_orders", "arguments": {"customer": self.customer}},
                {"name": "cancel_order", "arguments": {"order_id": self.order_id, "reason": self.reason}},
                f"<answer>{self.orders[self.order_id]['total']}</answer>"]

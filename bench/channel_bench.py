"""What is left of a channel between two live environments once the host-wide counters are gone: the machine's
load, timed. Two environments run at once in the sandbox, hook and filter on, as play runs them. The sender's
`reset(seed)` reads a message from its seed and, slot by slot, loads the CPUs (threads hashing, which releases
the GIL, so they use every core) for a 1 and sleeps for a 0; the receiver's `reset` counts the rounds of a
plain loop it gets through in each slot, on the wall clock both read, and calls a slot with fewer rounds than
the median a 1. Per slot length: the bit error rate p over every message sent, and the capacity of that binary
symmetric channel, (1 - H(p)) bits a slot, in bits per second and per call (`Limits.call_timeout`). The
reply, sent by the receiver in its observation, is the only way anything leaves it, as in play.

    python bench/channel_bench.py                       # slots of 100, 20, 5 and 2 ms, 4 messages of 32 bits
    python bench/channel_bench.py --slots-ms 10 --messages 8 --threads 1

Linux shares the CPUs between sessions first (autogroup scheduling, `/proc/sys/kernel/sched_autogroup_enabled`),
and each environment runs in a session of its own: two environments alone on two cores get a core each whatever
the other does. A third busy party changes that; in training it is the trainer, whose matmul threads run while the
environments wait for the model. `--bystander-threads N` adds one such party, a process of its own session with N
busy threads, outside the sandbox. Run it with nothing else computing: the load it measures is the machine's.
docs/sandbox.md quotes it.
"""
import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import isolation  # noqa: E402
import sandbox  # noqa: E402

SENDER = '''
import hashlib
import threading
import time


class SenderEnv:
    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None):
        bits = [(seed >> i) & 1 for i in range({bits})]
        start = (int(time.time() / 0.5) + 2) * 0.5   # the next-but-one half second: the receiver's too
        slot = {slot}
        block = bytes(1 << 16)

        def load(until):
            while time.time() < until:
                hashlib.sha256(block).digest()   # releases the GIL: each thread takes a core

        for i, bit in enumerate(bits):
            begin, end = start + i * slot, start + (i + 1) * slot
            time.sleep(max(0.0, begin - time.time()))
            if bit:
                threads = [threading.Thread(target=load, args=(end,)) for _ in range({threads})]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
        return "sent", {{}}

    def step(self, action):
        return "", 0.0, True, False, {{}}
'''

RECEIVER = '''
import time


class ReceiverEnv:
    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None):
        start = (int(time.time() / 0.5) + 2) * 0.5
        slot = {slot}
        counts = []
        for i in range({bits}):
            begin, end = start + i * slot + slot * 0.1, start + (i + 1) * slot   # a tenth of a slot of margin
            while time.time() < begin:
                pass
            n = 0
            while time.time() < end:
                n += 1
            counts.append(n)
        return " ".join(map(str, counts)), {{}}

    def step(self, action):
        return "", 0.0, True, False, {{}}
'''


def entropy(p: float) -> float:
    """H(p) in bits.

    >>> entropy(0.5), entropy(0.0)
    (1.0, 0.0)
    """
    return 0.0 if p in (0.0, 1.0) else -p * math.log2(p) - (1 - p) * math.log2(1 - p)


def decode(counts: list[int]) -> list[int]:
    """A slot with fewer loop rounds than the median is a 1 (the sender loaded the CPUs).

    >>> decode([100, 40, 98, 45])
    [0, 1, 0, 1]
    """
    middle = statistics.median(counts)
    return [int(c < middle) for c in counts]


def measure(slot_s: float, bits: int, messages: int, threads: int, limits: sandbox.Limits, rng) -> dict:
    sender_code = SENDER.format(bits=bits, slot=slot_s, threads=threads)
    receiver_code = RECEIVER.format(bits=bits, slot=slot_s)
    errors = sent = 0
    for _ in range(messages):
        message = rng.getrandbits(bits) | 1 << rng.randrange(bits)   # at least one 1
        truth = [(message >> i) & 1 for i in range(bits)]
        with sandbox.EnvProcess(sender_code, {}, limits) as sender, \
                sandbox.EnvProcess(receiver_code, {}, limits) as receiver:
            sender.send("reset", message)
            receiver.send("reset", 0)
            counts = [int(c) for c in receiver.receive()[0].split()]
            sender.receive()
        got = decode(counts)
        errors += sum(a != b for a, b in zip(got, truth))
        sent += bits
    p = errors / sent
    per_slot = 1.0 - entropy(min(p, 0.5))
    return {"slot_ms": round(slot_s * 1000, 1), "bits_sent": sent, "bit_errors": errors, "error_rate": round(p, 4),
            "capacity_bits_per_s": round(per_slot / slot_s, 1),
            "capacity_bits_per_call": round(per_slot / slot_s * limits.call_timeout, 1)}


BYSTANDER = """
import hashlib, sys, threading
block = bytes(1 << 16)
def spin():
    while True:
        hashlib.sha256(block).digest()
for _ in range(int(sys.argv[1])):
    threading.Thread(target=spin, daemon=True).start()
threading.Event().wait()
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--slots-ms", default="100,20,5,2", help="slot lengths to try, comma-separated")
    ap.add_argument("--bits", type=int, default=32, help="bits per message")
    ap.add_argument("--messages", type=int, default=4, help="messages per slot length")
    ap.add_argument("--threads", type=int, default=2, help="the sender's loading threads (Limits.threads caps them)")
    ap.add_argument("--bystander-threads", type=int, default=0,
                    help="busy threads of a third process in its own session (the trainer's part in training)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="", help="also write the results here")
    args = ap.parse_args()
    limits = sandbox.Limits()
    report = isolation.isolation_report()
    print(f"cores: {os.cpu_count()}  load: {os.getloadavg()[0]:.2f}  sandbox: {report['mode']}  "
          f"filter: {report['syscall_filter']}  call_timeout: {limits.call_timeout} s  "
          f"bystander threads: {args.bystander_threads}")
    rng = random.Random(args.seed)
    rows = []
    bystander = subprocess.Popen([sys.executable, "-c", BYSTANDER, str(args.bystander_threads)],
                                 start_new_session=True) if args.bystander_threads else None
    try:
        for ms in (float(x) for x in args.slots_ms.split(",")):
            if args.bits * ms / 1000 + 1.5 > limits.call_timeout:
                print(f"slot {ms} ms: {args.bits} bits do not fit one call of {limits.call_timeout} s, skipped")
                continue
            row = measure(ms / 1000, args.bits, args.messages, args.threads, limits, rng)
            rows.append(row)
            print("  ".join(f"{k}: {v}" for k, v in row.items()), flush=True)
    finally:
        if bystander:
            bystander.kill()
            bystander.wait()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cores": os.cpu_count(), "threads": args.threads, "bystander_threads": args.bystander_threads,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

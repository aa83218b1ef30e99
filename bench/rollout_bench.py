"""Rollout engine vs a per-episode loop: the same model, settings and episodes, in one process.

The engine (spade_mini.play over all specs) advances every active episode in ONE batched generate per turn;
the loop plays one episode at a time (spade_mini.play on a one-element list: one generate per episode per
turn). Both use greedy decoding, so they produce (nearly) the same tokens and tokens/s compare like for like;
both keep the KV cache across turns, so the speedup measured is that of batching alone.
Prints `name: value` lines, the last one `speedup: X` (engine tokens/s / loop tokens/s).

    python bench/rollout_bench.py                   # SmolLM2-135M on CPU, 32 episodes, 3 turns x 64 tokens
    python bench/rollout_bench.py --episodes 8 --max-new-tokens 16   # a quick look
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Guess a number in [1, 100]; "higher"/"lower" feedback; reward 1 on the hit, 0.1 for a valid guess otherwise.
GUESS_ENV = '''
import random
import re


class GuessEnv:
    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.target, self.turn = random.Random(seed).randint(1, 100), 0
        return "I am thinking of a whole number between 1 and 100. Guess it, e.g. \\\\boxed{50}.", {}

    def step(self, action):
        self.turn += 1
        m = re.search(r"boxed\\{\\s*(-?\\d+)", action)
        truncated = self.turn >= self.max_turns
        if not m:
            return "No number found. Answer with \\\\boxed{<number>}.", 0.0, False, truncated, {}
        guess = int(m.group(1))
        if guess == self.target:
            return f"Correct, it was {guess}!", 1.0, True, False, {}
        hint = "higher" if guess < self.target else "lower"
        return f"{guess} is wrong: the number is {hint}. Guess again.", 0.1, False, truncated, {}
'''


def report(name: str, value) -> None:
    print(f"{name}: {value}", flush=True)


def per_episode_loop(sm, model, tok, specs: list, kw: dict) -> tuple[list, dict]:
    """The baseline: one episode at a time, so every generate call holds one sequence."""
    stats = {"generate_s": 0.0, "sandbox_s": 0.0, "generated_tokens": 0, "generate_calls": 0}
    episodes = []
    for spec in specs:
        one: dict = {}
        episodes += sm.play(model, tok, [spec], stats=one, **kw)
        for k in stats:
            stats[k] += one[k]
    return episodes, stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="smollm2-135m | tiny-random | HF id | dir | .gguf")
    ap.add_argument("--episodes", type=int, default=32, help="concurrent episodes")
    ap.add_argument("--turns", type=int, default=3, help="max turns per episode")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="tokens per reply")
    ap.add_argument("--cache-dir", default="~/.cache/spade-mini", help="converted weights")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = ap.parse_args()

    import torch

    if args.threads:
        # note: on a machine that other jobs keep busy, 2 OpenMP threads can wait a scheduler slice per op
        # (measured here: 15 ms for every matmul); 1 thread then measures the batching effect cleanly
        torch.set_num_threads(args.threads)

    import sandbox
    import models
    import spade_mini as sm

    model, tok, info = models.load_model(args.model, lora_r=16, lora_alpha=32, lora_dropout=0.0, quantize="auto",
                                     gradient_checkpointing=False, cache_dir=os.path.expanduser(args.cache_dir),
                                     seed=0)
    specs = [sm.EpisodeSpec(GUESS_ENV, seed, None, (seed,)) for seed in range(args.episodes)]
    kw = dict(max_turns=args.turns, max_new_tokens=args.max_new_tokens,
              max_episode_tokens=args.turns * args.max_new_tokens, temperature=0.0, top_p=1.0, top_k=0, seed=0,
              limits=sandbox.Limits())
    models.generate(model, tok, [models.chat_ids(tok, "warm up")], max_new_tokens=4, temperature=0.0,
                top_p=1.0, top_k=0, seed=0)

    for name, value in [("model", args.model), ("device", info["device"]), ("dtype", info["dtype"]),
                        ("threads", torch.get_num_threads()), ("episodes", args.episodes),
                        ("max_turns", args.turns), ("max_new_tokens", args.max_new_tokens)]:
        report(name, value)
    engine_stats: dict = {}
    wall, cpu = time.time(), time.process_time()
    engine = sm.play(model, tok, specs, stats=engine_stats, **kw)
    engine_s, engine_cpu = time.time() - wall, time.process_time() - cpu
    engine_tps = engine_stats["generated_tokens"] / engine_s
    for name, value in [("engine_s", round(engine_s, 2)),
                        ("engine_generated_tokens", engine_stats["generated_tokens"]),
                        ("engine_generate_calls", engine_stats["generate_calls"]),
                        ("engine_sandbox_share", round(engine_stats["sandbox_s"] / engine_s, 3)),
                        ("engine_tokens_per_s", round(engine_tps, 1)),
                        ("engine_mean_return", round(sum(e.episode_return for e in engine) / len(engine), 3))]:
        report(name, value)

    wall, cpu = time.time(), time.process_time()
    loop, loop_stats = per_episode_loop(sm, model, tok, specs, kw)
    loop_s, loop_cpu = time.time() - wall, time.process_time() - cpu
    loop_tps = loop_stats["generated_tokens"] / loop_s
    same = sum(a.token_ids == b.token_ids for a, b in zip(engine, loop)) / len(specs)
    for name, value in [("loop_s", round(loop_s, 2)), ("loop_generated_tokens", loop_stats["generated_tokens"]),
                        ("loop_generate_calls", loop_stats["generate_calls"]),
                        ("loop_sandbox_share", round(loop_stats["sandbox_s"] / loop_s, 3)),
                        ("loop_tokens_per_s", round(loop_tps, 1)), ("identical_episodes_frac", round(same, 3)),
                        # the same ratio in this process's CPU seconds: robust to other load on the machine
                        ("speedup_cpu_time", round((engine_stats["generated_tokens"] / engine_cpu)
                                                   / (loop_stats["generated_tokens"] / loop_cpu), 2)),
                        ("speedup", round(engine_tps / loop_tps, 2))]:
        report(name, value)


if __name__ == "__main__":
    main()

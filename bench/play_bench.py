"""The rollout engine against the CPU's own peak: the loop's `play` on the demo's shapes, timed by part.

In one process: a plain 2048 x 2048 matmul in fp32 (and bf16 where the CPU has native bf16) measures what the
cores can compute; then spade_mini.play runs the demo's step-0 plays (the tiny preset: 16 unhinted + 4 hinted
plays of each of its four games, 2 turns of at most 96 tokens, T 0.7, top-p 0.95, top-k 20, the brief agent
prompt) and reports:

* useful FLOP/s over the fp32 peak. Useful work is what the episodes need and nothing else: every real token of
  every episode through the model once (2 x parameters, LM head included), plus attention over its context
  (4 x layers x query width x position); pads, finished rows and LoRA's own matmuls are not useful work.
* the seconds by part: prefill forwards, decode forwards (of which the KV cache's growth), sampling and HF's loop
  outside the forward, the sandbox; and the padding waste (row-tokens computed / row-tokens needed).
* generated tokens per second, mean return.

Instrumentation only wraps (forward hooks, timers around the engine's own functions); the code timed is the
loop's. Prints `name: value` lines.

    python bench/play_bench.py                          # SmolLM2-135M, the demo's 80 plays (~1-2 min idle)
    python bench/play_bench.py --model tiny-random --plays 2 --hinted 1   # the path in seconds, for a dry run
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
GAMES = ("cups", "doors", "guess", "pair_sum")   # the demo's window (the backfill's first four, name order)


def report(name: str, value) -> None:
    print(f"{name}: {value}", flush=True)


def matmul_gflops(torch, dtype, n: int = 2048, reps: int = 10) -> float:
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n ** 3 * reps / (time.perf_counter() - t) / 1e9


class Clock:
    """Wall seconds of the model's forwards (prefill: more than one new column; decode: one), of the KV cache's
    writes, of the sampler, and the row-tokens each forward computed."""

    def __init__(self):
        self.s = dict(prefill=0.0, decode=0.0, cache=0.0, sampling=0.0)
        self.rows_computed, self.t0 = 0, 0.0

    def wrap(self, obj, name: str, key: str):
        real = getattr(obj, name)
        clock = self

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                clock.s[key] += time.perf_counter() - t
        setattr(obj, name, timed)

    def before(self, module, args, kwargs):
        self.t0 = time.perf_counter()

    def after(self, module, args, kwargs, out):
        """The decoder stack's forward: prefill (the engine's own, models._prefill_shared/_prefill_new, and HF's)
        or a decode step, by the columns it takes."""
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.s["prefill" if ids.shape[1] > 1 else "decode"] += time.perf_counter() - self.t0
        self.rows_computed += ids.numel()

    def after_head(self, module, args, kwargs, out):
        """The LM head, run by generate's forwards only: counted with decode."""
        self.s["decode"] += time.perf_counter() - self.t0


def useful_flops(model, episodes) -> float:
    """2 x parameters per token (the LM head included, the embedding lookup not) + 4 x layers x query width x
    the token's position for attention (QK^T and AV), summed over every token of every episode."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = base.config
    params = sum(p.numel() for n, p in base.named_parameters() if "lora_" not in n)
    width = cfg.num_attention_heads * getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)
    tokens = sum(len(e.token_ids) for e in episodes)
    positions = sum(len(e.token_ids) * (len(e.token_ids) - 1) / 2 for e in episodes)
    return 2.0 * params * tokens + 4.0 * cfg.num_hidden_layers * width * positions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="smollm2-135m | tiny-random | HF id | dir | .gguf")
    ap.add_argument("--plays", type=int, default=None, help="unhinted plays per game (default: the tiny preset's)")
    ap.add_argument("--hinted", type=int, default=None, help="hinted plays per game (default: the tiny preset's)")
    ap.add_argument("--seed", type=int, default=0, help="the run seed the episode seeds derive from")
    ap.add_argument("--cache-dir", default="~/.cache/spade-mini", help="converted weights")
    ap.add_argument("--generate-bf16", action="store_true",
                    help="play from bf16 copies of the weights (train's --generate-bf16: LoRA merged first, the KV "
                         "cache bf16 too)")
    args = ap.parse_args()

    import torch

    import envs
    import models
    import runs
    import spade_mini
    import train

    cfg = runs.Config(**runs.PRESETS["tiny"])
    plays = cfg.plays if args.plays is None else args.plays
    hinted = cfg.hinted_plays if args.hinted is None else args.hinted
    fp32 = matmul_gflops(torch, torch.float32)
    bf16 = matmul_gflops(torch, torch.bfloat16) if torch.backends.cpu.get_cpu_capability() != "DEFAULT" else None
    for name, value in [("model", args.model), ("threads", torch.get_num_threads()),
                        ("load_average", os.getloadavg()[0]), ("fp32_peak_gflops", round(fp32, 1)),
                        ("bf16_peak_gflops", bf16 and round(bf16, 1))]:
        report(name, value)

    model, tok, _ = models.load_model(args.model, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                      quantize="auto", gradient_checkpointing=False,
                                      cache_dir=os.path.expanduser(args.cache_dir), seed=args.seed)
    specs = []
    for j, game in enumerate(GAMES):
        code = (ROOT / "examples" / f"{game}.py").read_text()
        for i in range(max(plays, hinted)):
            seed = envs.derive_seed(args.seed, 0, "env", j * 1000 + i)
            if i < plays:
                specs.append(spade_mini.EpisodeSpec(code, seed, None, (j, False, i), cfg.agent_prompt))
            if i < hinted:
                specs.append(spade_mini.EpisodeSpec(code, seed, envs.fallback_hint(), (j, True, i), cfg.agent_prompt))
    kw = dict(max_turns=cfg.max_turns, max_new_tokens=cfg.agent_max_new_tokens,
              max_episode_tokens=cfg.agent_max_episode_tokens, max_observation_tokens=cfg.agent_max_observation_tokens,
              limits=train.limits_of(cfg), seed=envs.derive_seed(args.seed, 0, "agent", 0), **train.sample_kwargs(cfg),
              bf16=args.generate_bf16)
    report("generate_bf16", args.generate_bf16)
    spade_mini.play(model, tok, specs[:2], **{**kw, "max_new_tokens": 4})   # warm-up: first-call allocations

    clock = Clock()
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    decoder.register_forward_pre_hook(clock.before, with_kwargs=True)
    decoder.register_forward_hook(clock.after, with_kwargs=True)
    head.register_forward_pre_hook(clock.before, with_kwargs=True)
    head.register_forward_hook(clock.after_head, with_kwargs=True)
    for name in ("update", "batch_select_indices"):
        if hasattr(models, "_GrowingLayer"):
            clock.wrap(models._GrowingLayer, name, "cache")
    if hasattr(models, "Sampler"):
        clock.wrap(models.Sampler, "__call__", "sampling")
    stats: dict = {}
    t = time.perf_counter()
    episodes = spade_mini.play(model, tok, specs, stats=stats, **kw)
    play_s = time.perf_counter() - t
    flops = useful_flops(model, episodes)
    head = model.get_output_embeddings().weight.numel()
    sampled_only = flops - 2.0 * head * (sum(len(e.token_ids) for e in episodes) - stats["generated_tokens"])
    needed = sum(len(e.token_ids) for e in episodes)
    forward_s = clock.s["prefill"] + clock.s["decode"]
    for name, value in [
            ("episodes", len(episodes)), ("play_s", round(play_s, 2)),
            ("useful_tflop", round(flops / 1e12, 3)), ("useful_gflops", round(flops / play_s / 1e9, 1)),
            ("useful_over_fp32_peak", round(flops / play_s / 1e9 / fp32, 3)),
            # the same without the LM head on tokens that are only read (an engine needs logits where it samples)
            ("useful_over_fp32_peak_head_where_sampled", round(sampled_only / play_s / 1e9 / fp32, 3)),
            ("prefill_s", round(clock.s["prefill"], 2)), ("decode_s", round(clock.s["decode"], 2)),
            ("of_which_cache_s", round(clock.s["cache"], 2)),
            ("sampling_and_loop_s", round(stats["generate_s"] - forward_s, 2)),
            ("of_which_sampler_s", round(clock.s["sampling"], 2)),
            ("sandbox_s", round(stats["sandbox_s"], 2)),
            ("other_s", round(play_s - stats["generate_s"] - stats["sandbox_s"], 2)),
            ("row_tokens_computed_over_needed", round(clock.rows_computed / max(needed, 1), 3)),
            ("generated_tokens", stats["generated_tokens"]), ("generate_calls", stats["generate_calls"]),
            ("generated_tok_per_s", round(stats["generated_tokens"] / play_s, 1)),
            ("mean_return", round(sum(e.episode_return for e in episodes) / len(episodes), 3))]:
        report(name, value)


if __name__ == "__main__":
    main()

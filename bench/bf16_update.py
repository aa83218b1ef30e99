"""The update under bf16 autocast against fp32: time, gradient agreement and log-prob agreement, in one process.

Takes the demo's agent samples' shapes (16 episodes of ~300 tokens, replies trained) played by SmolLM2-135M on
the demo's games, then runs spade_mini.update's forward and backward (one micro-batch pass, no optimizer step)
twice on the same samples and weights: fp32, then with --train-bf16 on. Prints `name: value` lines: seconds of
each (best of --repeats), the speedup, the cosine and norm ratio of the two LoRA gradients, and the log-prob
differences of the trained tokens (mean and max |delta|).

    python bench/bf16_update.py                     # SmolLM2-135M (~3-5 min idle)
    python bench/bf16_update.py --model tiny-random # the path in seconds
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def report(name: str, value) -> None:
    print(f"{name}: {value}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="smollm2-135m | tiny-random | HF id | dir | .gguf")
    ap.add_argument("--episodes", type=int, default=16, help="episodes played, then trained")
    ap.add_argument("--repeats", type=int, default=2, help="timed passes of each precision (the best is kept)")
    ap.add_argument("--cache-dir", default="~/.cache/spade-mini", help="converted weights")
    args = ap.parse_args()

    import torch

    import envs
    import models
    import runs
    import spade_mini
    import train

    cfg = runs.Config(**runs.PRESETS["tiny"])
    model, tok, _ = models.load_model(args.model, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                      quantize="auto", gradient_checkpointing=False,
                                      cache_dir=os.path.expanduser(args.cache_dir), seed=0)
    with torch.no_grad():   # a trained-looking adapter (B = 0 would make the LoRA gradients of A vanish)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01, generator=torch.Generator().manual_seed(len(name)))
    games = [(ROOT / "examples" / f"{g}.py").read_text() for g in ("cups", "doors", "guess", "pair_sum")]
    specs = [spade_mini.EpisodeSpec(games[i % 4], envs.derive_seed(0, 0, "env", i), None, (i % 4,), cfg.agent_prompt)
             for i in range(args.episodes)]
    episodes = spade_mini.play(model, tok, specs, max_turns=cfg.max_turns, max_new_tokens=cfg.agent_max_new_tokens,
                               max_episode_tokens=cfg.agent_max_episode_tokens, limits=train.limits_of(cfg), seed=0,
                               **train.sample_kwargs(cfg))
    samples = [spade_mini.Sample(e.token_ids, e.loss_mask, 1.0 if k % 2 else -1.0, "agent")
               for k, e in enumerate(episodes) if any(e.loss_mask)]
    params = [p for p in model.parameters() if p.requires_grad]
    rows = [(s.token_ids, s.loss_mask) for s in samples]
    report("samples", len(samples))
    report("trained_tokens", sum(sum(s.loss_mask) for s in samples))
    report("native_bf16_cpu", models.native_bf16_cpu())

    def one_pass(bf16: bool) -> tuple[float, torch.Tensor, list]:
        best = float("inf")
        for _ in range(args.repeats):
            model.zero_grad(set_to_none=True)
            totals = dict.fromkeys(("loss", "clipped_tokens", "kl_sum", "tokens", "is_sum", "is_sq_sum",
                                    "truncated_tokens"), 0.0)
            totals.update(padded_tokens=0, mismatch_agent=[], mismatch_designer=[])
            model.train()
            t = time.perf_counter()
            for batch in models.micro_batches([len(s.token_ids) for s in samples], cfg.token_budget):
                spade_mini._accumulate(model, [samples[j] for j in batch], None, len(samples), totals,
                                       temperature=cfg.temperature, clip_low=0.2, clip_high=0.28, kl_beta=0.0,
                                       pad_id=tok.pad_token_id or 0, chunk_size=512, bf16=bf16)
            best = min(best, time.perf_counter() - t)
        grad = torch.cat([p.grad.flatten() for p in params])
        logp = spade_mini.sampled_logprobs(model, rows, temperature=cfg.temperature, token_budget=cfg.token_budget,
                                           pad_id=tok.pad_token_id or 0, bf16=bf16)
        return best, grad, logp

    fp32_s, g32, lp32 = one_pass(False)
    bf16_s, g16, lp16 = one_pass(True)
    deltas = [abs(a - b) for r32, r16, s in zip(lp32, lp16, samples) for a, b, m in zip(r32, r16, s.loss_mask) if m]
    for name, value in [("update_fp32_s", round(fp32_s, 2)), ("update_bf16_s", round(bf16_s, 2)),
                        ("speedup", round(fp32_s / bf16_s, 2)),
                        ("grad_cosine", round(float(torch.nn.functional.cosine_similarity(g32, g16, dim=0)), 5)),
                        ("grad_norm_ratio", round(float(g16.norm() / g32.norm()), 4)),
                        ("logprob_mean_abs_delta", round(sum(deltas) / len(deltas), 5)),
                        ("logprob_max_abs_delta", round(max(deltas), 4))]:
        report(name, value)


if __name__ == "__main__":
    main()

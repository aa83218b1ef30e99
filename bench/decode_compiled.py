"""A compiled decode step on a CPU against the loop's eager one: what torch.compile would give the designer's
decode, and what it would cost a window (a lever for the decode's share of its bandwidth bound, measured, not
taken).

* eager, as the loop decodes: the model inside models.generation_weights (bf16 copies packed for oneDNN where bf16
  is faster, else fp32 merged and packed), ROWS prompts of PROMPT tokens prefilled into the loop's GrowingCache
  (models._prefill_shared), then STEPS decode steps, each one call of the model (no sampler: the argmax is fed back),
  the median step;
* compiled: the same weights merged into a plain model in the same dtype, HF's StaticCache of PROMPT + NEW columns
  (what a compiled step needs: shapes that do not change), the query heads packed per key/value head as
  models.sdpa_cpu packs them, with the static cache's mask; the model's forward through torch.compile (inductor,
  weights frozen: packed by inductor as constants): the eager step on that cache, the first compiled call (the
  compile), the median compiled step, and the first call after the weights are replaced by new tensors of the same
  values (what every window's new bf16 copies would cost: the loop makes them after each update).

    python bench/decode_compiled.py                   # Qwen2.5-Coder-1.5B, ~5 min idle on 2 cores
    python bench/decode_compiled.py --model tiny-random --prompt-tokens 16 --new-tokens 16 --steps 3   # the path

Prints `name: value` lines (and --json FILE). Run it on an idle machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def packed_masked(module, query, key, value, attention_mask, **kwargs):
    """models.sdpa_cpu's packing (each key/value head's query heads one block of queries) with the static cache's
    mask (B, 1, 1, columns), which broadcasts over the heads; a prefill (more than one query) goes to HF's sdpa."""
    import torch.nn.functional as F
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    b, heads, n, d = query.shape
    if n != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    groups = heads // key.shape[1]
    out = F.scaled_dot_product_attention(query.reshape(b, heads // groups, groups, d), key, value,
                                         attn_mask=attention_mask, scale=kwargs.get("scaling"))
    return out.reshape(b, heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--rows", type=int, default=6, help="rows decoded together (the designer_cost bench's 6)")
    ap.add_argument("--prompt-tokens", type=int, default=1280, help="tokens of each prompt (the preset's ~1,250)")
    ap.add_argument("--new-tokens", type=int, default=768, help="the static cache's spare columns (the preset's cap)")
    ap.add_argument("--steps", type=int, default=12, help="decode steps timed in each mode")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if 2 * args.steps + 1 > args.new_tokens:   # the static cache's columns past the prompt hold every step
        ap.error(f"--steps {args.steps} needs --new-tokens {2 * args.steps + 1} or more")
    import cli   # sets THP_MEM_ALLOC_ENABLE, as the loop runs, before torch loads
    cli.run_under_tcmalloc()
    import torch
    import torch._inductor.config
    from transformers import AttentionInterface, AttentionMaskInterface, StaticCache
    from transformers.masking_utils import sdpa_mask
    import models
    import runs
    from designer_cost import cpu_name, report
    out: dict = {}
    report(out, "cpu", cpu_name())
    report(out, "threads", torch.get_num_threads())
    cfg = runs.Config(**{**runs.PRESETS["cpu-1.5b"], "model": args.model})
    model, _, _ = models.load_model(cfg.model, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                    quantize="none", gradient_checkpointing=True, cache_dir=cfg.cache_dir, seed=0)
    model.eval()
    bf16 = models.bf16_autocast(cfg.generate_bf16, model)
    dtype = torch.bfloat16 if bf16 else torch.float32
    report(out, "decode_dtype", "bf16" if bf16 else "fp32")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(200, 20000, (args.rows, args.prompt_tokens), generator=g)   # (B, T)
    mask = torch.ones_like(ids)

    def steps(call, first: int) -> list[float]:   # STEPS greedy steps from position `first`, each timed
        token, seconds = ids[:, -1:], []
        for i in range(args.steps):
            start = time.perf_counter()
            logits = call(token, first + i)
            seconds.append(time.perf_counter() - start)
            token = logits[:, -1].argmax(-1, keepdim=True)
        return seconds

    with torch.no_grad(), models.generation_weights(model, bf16):   # eager, the loop's weights and cache
        cache = models._prefill_shared(model, ids, mask)
        eager = steps(lambda token, at: model(input_ids=token, cache=cache, position_ids=torch.full(
            (args.rows, 1), at), use_cache=True, logits_to_keep=1).logits, args.prompt_tokens - 1)
    report(out, "eager_growing_cache_s_per_step", round(statistics.median(eager), 4))
    del cache

    AttentionInterface.register("packed_masked", packed_masked)
    AttentionMaskInterface.register("packed_masked", sdpa_mask)
    # the LoRA folded in (B = 0 at init: the same weights); peft merges into the base model itself, so `model` is
    # not used again
    plain = model.merge_and_unload().to(dtype)
    plain.config._attn_implementation = "packed_masked"
    cache = StaticCache(config=plain.config, max_cache_len=args.prompt_tokens + args.new_tokens)
    torch._inductor.config.freezing = True
    compiled = torch.compile(plain.forward)
    with torch.no_grad():
        def call(forward):
            return lambda token, at: forward(input_ids=token, cache=cache, cache_position=torch.tensor([at]),
                                             use_cache=True, logits_to_keep=1).logits
        plain(input_ids=ids[:, :-1], cache=cache, cache_position=torch.arange(args.prompt_tokens - 1),
              use_cache=True, logits_to_keep=1)
        static = steps(call(plain), args.prompt_tokens - 1)
        report(out, "eager_static_cache_s_per_step", round(statistics.median(static), 4))
        at = args.prompt_tokens - 1 + args.steps
        report(out, "compile_s", round(timed(lambda: call(compiled)(ids[:, -1:], at)), 1))
        compiled_steps = steps(call(compiled), at + 1)
        report(out, "compiled_static_cache_s_per_step", round(statistics.median(compiled_steps), 4))
        copies: dict[int, torch.nn.Parameter] = {}   # new tensors, the same values: a window's new bf16 copies
        for module in plain.modules():              # (a tied weight, the embedding and the head, one copy)
            for name, p in list(module.named_parameters(recurse=False)):
                new = copies.setdefault(id(p), torch.nn.Parameter(p.detach().clone(), requires_grad=False))
                setattr(module, name, new)
        again = timed(lambda: call(compiled)(ids[:, -1:], at + 1 + args.steps))
        report(out, "first_call_after_new_weights_s", round(again, 1))
    saved = statistics.median(eager) - statistics.median(compiled_steps)
    report(out, "compiled_saves_s_per_step", round(saved, 4))
    # what a window pays: its bf16 copies are new tensors, so the frozen graph compiles again at every window
    per_window = max(out["compile_s"], out["first_call_after_new_weights_s"])
    report(out, "steps_to_repay_a_window_s_compile", round(per_window / saved, 1) if saved > 0 else None)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""A decode step's attention on a CPU: models.sdpa_cpu against HF's sdpa, which it replaces, in one process.

One query a row against a KV cache of the 1.5B's shape (12 query heads on 2 key/value heads of 128, ROWS rows of
COLUMNS columns, a view of a buffer twice as wide, as models._GrowingLayer hands out), each of LAYERS layers with a
cache of its own (so that a pass reads them from memory, not from the CPU's caches, as a decode step does); the
best of REPS passes, in fp32 and in bf16, each path:

* hf_no_mask: HF's sdpa for rows of one length (no mask): torch's kernel with enable_gqa;
* hf_mask: HF's sdpa with a mask (rows of different lengths: the designer's prompts): the query heads packed;
* sdpa_cpu: the loop's, no mask (the packed call of hf_mask without a mask).

    python bench/decode_attention.py          # ~1 min on 2 cores
"""
from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=6, help="rows decoded together (designer_cost's 6)")
    ap.add_argument("--columns", type=int, default=1280, help="columns of each row's cache (a designer prompt's)")
    ap.add_argument("--layers", type=int, default=28, help="layers, each with a cache of its own (the 1.5B's 28)")
    ap.add_argument("--reps", type=int, default=5, help="passes over the layers timed (the best is kept)")
    args = ap.parse_args()
    import torch
    import models
    heads, kv_heads, dim = 12, 2, 128
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True, training=False)
    print(f"threads: {torch.get_num_threads()}")
    flush = torch.empty(64 * 2 ** 20 // 4)   # 64 MB written between passes: the last layer's cache leaves the caches
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        def cache():   # (rows, kv_heads, columns, dim): a view of a buffer twice as wide, like _GrowingLayer's
            return torch.randn(args.rows, kv_heads, 2 * args.columns, dim, generator=g).to(dtype)[:, :, :args.columns]
        layers = [(torch.randn(args.rows, 1, heads, dim, generator=g).to(dtype).transpose(1, 2), cache(), cache())
                  for _ in range(args.layers)]   # the query as the attention layer hands it: (B, H, 1, D), a view
        mask = torch.ones(args.rows, 1, 1, args.columns, dtype=torch.bool)
        mask[0, ..., : args.columns // 8] = False   # the first row left-padded
        paths = {"hf_no_mask": (models.sdpa_attention_forward, None), "hf_mask": (models.sdpa_attention_forward, mask),
                 "sdpa_cpu": (models.sdpa_cpu, None)}
        ms = {}
        for name, (attention, m) in paths.items():
            best = float("inf")
            for _ in range(args.reps + 1):   # the first pass warms up
                flush.add_(1.0)
                start = time.perf_counter()
                for q, k, v in layers:
                    attention(module, q, k, v, m, dropout=0.0, scaling=dim ** -0.5)
                best = min(best, time.perf_counter() - start)
            ms[name] = best * 1e3 / args.layers
        kind = "fp32" if dtype == torch.float32 else "bf16"
        for name, value in ms.items():
            print(f"{kind}_{name}_ms_per_layer: {value:.3f}")
        print(f"{kind}_sdpa_cpu_speedup_over_hf_no_mask: {ms['hf_no_mask'] / ms['sdpa_cpu']:.2f}")
        cache_bytes = 2 * args.rows * kv_heads * args.columns * dim * dtype.itemsize
        print(f"{kind}_sdpa_cpu_cache_read_gbps: {cache_bytes / ms['sdpa_cpu'] / 1e6:.1f}")


if __name__ == "__main__":
    main()

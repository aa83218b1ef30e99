"""BFCL v4 multi-turn with and without the KV cache carried across rounds: the same model, items, greedy decoding
and token sequences in one process, first re-reading every conversation each round (reuse_cache=False: the
whole ~5k-token prefill every round, the cost of the code before the cache), then prefilling only what each
round added (reuse_cache=True).
Prints `name: value` lines, the last one `speedup: X` (seconds without / seconds with).

    python bench/bfcl_bench.py                      # SmolLM2-135M on CPU, 2 items, 192 new tokens (eval --preset tiny)
    python bench/bfcl_bench.py --limit 1 --max-new-tokens 32   # a quick look
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def report(name: str, value) -> None:
    print(f"{name}: {value}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="smollm2-135m | tiny-random | HF id | dir | .gguf")
    ap.add_argument("--limit", type=int, default=2, help="BFCL items")
    ap.add_argument("--max-new-tokens", type=int, default=192, help="tokens per reply (eval --preset tiny: 192)")
    ap.add_argument("--cache-dir", default="~/.cache/spade-mini", help="converted weights")
    args = ap.parse_args()

    import evaluate
    import models

    model, tok = models.load_for_eval(args.model, None, lora_r=16, lora_alpha=32, lora_dropout=0.0, quantize="auto",
                                      gradient_checkpointing=False, cache_dir=os.path.expanduser(args.cache_dir),
                                      seed=0)
    results = {}
    for reuse in (False, True):
        results[reuse] = evaluate.bfcl_evaluate(model, tok, limit=args.limit, max_new_tokens=args.max_new_tokens,
                                                reuse_cache=reuse)
        report(f"seconds_{'reuse' if reuse else 'reprefill'}", results[reuse]["eval_s"])
        report(f"score_{'reuse' if reuse else 'reprefill'}", results[reuse]["score"])
    same = [a["replies"] == b["replies"] for a, b in zip(results[False]["items"], results[True]["items"])]
    report("rounds", sum(len(it["replies"]) for it in results[True]["items"]))
    report("identical_items", f"{sum(same)}/{len(same)}")
    report("speedup", round(results[False]["eval_s"] / results[True]["eval_s"], 2))


if __name__ == "__main__":
    main()

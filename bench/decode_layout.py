"""The fp32 decode's weight layout (models._DecodePacked): MKL's packed sgemm against oneDNN's packed layout, on the
loop's own linear layers, measured in one process; which one `models.mkl_decode_speedup` picks on this CPU.

* the linears alone: every linear layer of the model (the LM head too) in the model's order, on one column of ROWS
  rows, inside models.lora_merged (the LoRA merged, then packed) with each layout forced, and from plain merged
  copies (models.PACK_DECODE off): seconds a step and the rate the weights stream at, beside a 1 GiB read;
* the decode as the loop runs it: models.generate of 1 + STEPS tokens on ROWS prompts of PROMPT tokens, in fp32,
  each layout forced: the median step (the loop's token counter, bench/designer_cost.decode_timed) and whether
  the two sample the same tokens (the same products summed in another order: log-probs within 1e-4 on the tiny
  model, tests/test_engine.py).

    python bench/decode_layout.py                    # Qwen2.5-Coder-1.5B in fp32, ~4 min idle on 2 cores
    python bench/decode_layout.py --model tiny-random --prompt-tokens 16 --steps 4   # the path

Prints `name: value` lines (and --json FILE). Run it on an idle machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--rows", type=int, default=6, help="rows decoded together (the designer_cost bench's 6)")
    ap.add_argument("--prompt-tokens", type=int, default=300, help="tokens of each prompt of the generate part")
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed in the generate part")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    import cli   # sets THP_MEM_ALLOC_ENABLE, as the loop runs, before torch loads
    cli.run_under_tcmalloc()
    import torch
    import models
    import runs
    from designer_cost import best_seconds, cpu_name, decode_timed, read_gbps, report
    out: dict = {}
    report(out, "cpu", cpu_name())
    report(out, "threads", torch.get_num_threads())
    report(out, "mkl_decode_speedup", round(models.mkl_decode_speedup(), 2))
    report(out, "picked", "mkl" if models.mkl_decode_speedup() > 1.0 else "onednn")
    report(out, "read_gbps", round(read_gbps(torch), 1))
    cfg = runs.Config(**{**runs.PRESETS["cpu-1.5b"], "model": args.model})
    model, tok, _ = models.load_model(cfg.model, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                      quantize="none", gradient_checkpointing=True, cache_dir=cfg.cache_dir, seed=0)
    layouts = {"mkl": lambda: 2.0, "onednn": lambda: 0.5}   # what mkl_decode_speedup answers, forced
    picked = models.mkl_decode_speedup

    def linears_alone() -> tuple[float, int]:
        with torch.no_grad(), models.lora_merged(model):
            linears = [m for name, m in model.named_modules() if type(m) is torch.nn.Linear and "lora_" not in name]
            inputs = {m.in_features: torch.randn(args.rows, 1, m.in_features) for m in linears}
            return best_seconds(lambda: [m(inputs[m.in_features]) for m in linears], 3), \
                sum(m.in_features * m.out_features for m in linears) * 4

    for name in ("plain", *layouts):
        models.PACK_DECODE = name != "plain"
        models.mkl_decode_speedup = layouts.get(name, picked)
        seconds, weight_bytes = linears_alone()
        report(out, f"linears_{name}_s_per_step", round(seconds, 4))
        report(out, f"linears_{name}_gbps", round(weight_bytes / seconds / 1e9, 1))
    models.PACK_DECODE = True
    report(out, "linears_onednn_speedup_over_mkl", round(out["linears_mkl_s_per_step"] /
                                                           out["linears_onednn_s_per_step"], 2))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(200, 20000, (args.prompt_tokens,), generator=g).tolist() for _ in range(args.rows)]
    kw = dict(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, seed=0, bf16=False)
    tokens = {}
    for name, speedup in layouts.items():
        models.mkl_decode_speedup = speedup
        _, steps, tokens[name] = decode_timed(model, tok, prompts, args.steps, kw)
        report(out, f"decode_{name}_s_per_step", round(statistics.median(steps), 4))
    models.mkl_decode_speedup = picked
    report(out, "decode_onednn_speedup_over_mkl", round(out["decode_mkl_s_per_step"] /
                                                          out["decode_onednn_s_per_step"], 2))
    report(out, "decode_same_tokens", tokens["mkl"] == tokens["onednn"])
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

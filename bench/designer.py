"""How well does a model design? Its valid-program rate under the designer prompt, on this machine.

Runs the loop's own design phase (`train.design`: corpus documents, the designer prompt, one batched HF
`generate`, the first ```python block, validation in the sandbox, the copy check) for N slots, once each (one
attempt per slot, so every program is counted), and prints what the designer half of a CPU run would see:

    python bench/designer.py --model qwen2.5-coder-0.5b --slots 8 --max-new-tokens 768
    python bench/designer.py --model smollm2-135m --slots 8
    python bench/designer.py --model qwen2.5-coder-0.5b --example prompts/example_env.txt   # another example

`name: value` lines: programs per minute of design (generate + validate), the valid share, the NOVEL valid
share (valid and not a copy of an example the prompt showed: `copy` in the reasons), the rejection reasons,
the diversity of the valid programs; `--json FILE` also writes every program with its verdict.
note: no memory (a fresh run's first window) and the sampling settings of the `tiny` preset unless flags say
otherwise; the programs come from one `generate` call, so they share one sampling seed.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b",
                    help="the designer: any `spade-mini train --model` value (qwen2.5-coder-0.5b: the first load "
                         "assembles and converts it, about a minute and 2.9 GB in the cache)")
    ap.add_argument("--slots", type=int, default=8, help="programs to write (one batch)")
    ap.add_argument("--max-new-tokens", type=int, default=768, help="tokens per program")
    ap.add_argument("--doc-words", type=int, default=300, help="words of the grounding document in each prompt")
    ap.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (top-p and top-k: Config's)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the documents drawn and of the sampling")
    ap.add_argument("--generate-bf16", default="auto", choices=("auto", "on", "off"),
                    help="decode from bf16 weight copies (train's --generate-bf16; auto: a CPU with native bf16)")
    ap.add_argument("--example", default="", help="a file to show as the in-context example instead of the default")
    ap.add_argument("--json", default="", help="write every program, its verdict and the summary here")
    return ap


def main() -> None:
    args = parser().parse_args()   # before torch is imported: --help and a bad flag answer at once
    import envs
    import evaluate
    import models
    import runs
    import train
    if args.example:   # the prompt's example and the copy check's reference, both
        text = Path(args.example).read_text().strip("\n")
        envs.example_program = lambda setting="games": text
    cfg = runs.Config(model=args.model, envs_per_step=args.slots, design_attempts=1, doc_words=args.doc_words,
                      designer_max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                      max_turns=3, generate_bf16=args.generate_bf16,
                      regen_interval=1)   # a window of one step: only the programs are measured
    t0 = time.time()
    model, tok, _ = models.load_model(cfg.model, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                      quantize="none", gradient_checkpointing=False, cache_dir=cfg.cache_dir,
                                      seed=cfg.seed)
    load_s = time.time() - t0
    with tempfile.TemporaryDirectory() as tmp:
        st = train.State(cfg, None, model, tok, None, envs.Memory(Path(tmp) / "memory.json"),
                         runs.load_corpus(None), [], [], {})
        t0 = time.time()
        designs = train.design(st, 0, list(envs.skills_of("games")))   # slot g designs skill g mod 6
        design_s = time.time() - t0
    reasons = collections.Counter(d.verdict.reason for d in designs)
    valid = [d for d in designs if d.verdict.valid]
    summary = {"model": args.model, "slots": args.slots, "max_new_tokens": args.max_new_tokens,
               "example": args.example or "prompts/example_env.txt", "load_s": round(load_s, 1),
               "design_s": round(design_s, 1), "programs_per_min": round(len(designs) / design_s * 60, 2),
               # valid by the sandbox, copies included; novel = valid and not a copy (copies get reason `copy`)
               "valid_share": (len(valid) + reasons["copy"]) / len(designs), "copy_share": reasons["copy"] / len(designs),
               "novel_valid_share": len(valid) / len(designs),
               "diversity_valid": round(evaluate.diversity([d.code for d in valid]), 3) if valid else None,
               "reasons": dict(reasons.most_common()),
               "mean_completion_tokens": round(sum(len(d.completion_ids) for d in designs) / len(designs), 1)}
    for key, value in summary.items():
        print(f"{key}: {value}")
    if args.json:
        rows = [dict(slot=d.slot, skill=d.skill, reason=d.verdict.reason, detail=d.verdict.detail,
                     tokens=len(d.completion_ids), code=d.code, text=d.text) for d in designs]
        Path(args.json).write_text(json.dumps({"summary": summary, "programs": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()

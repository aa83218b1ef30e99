"""Ablations: the same short self-play run once per ablation flag, compared in one table (CSV + Markdown).

SPADE's ablations say which parts carry the method: without designer training and memory the model ends BELOW
its untrained base; without corpus grounding the designer collapses to near-identical programs (Vendi / n 0.04
vs 0.68); a fixed pool of environments gets about a third of the gain. This script runs the tiny preset with
the same model, steps and seed for each variant below, each in its own process (a crash or a leak in one
cannot change another), and tabulates the mean over steps and the last step of the logged metrics.

    python bench/ablations.py --model tiny-random --steps 1       # a quick check that every flag runs
    python bench/ablations.py --steps 4 --eval-limit 10           # SmolLM2-135M, plus held-out eval per run

Output: OUT/ablations.csv, OUT/ablations.md, and each variant's run directory OUT/<variant>/.
note: with a few steps of a 135M model the differences are mostly noise; the table shows that every ablation
runs and what it logs. Conclusions need the 4b preset, hundreds of steps and several seeds.
"""
from __future__ import annotations

import argparse
import csv
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import report  # noqa: E402  (its tolerant run reader)

# variant name -> extra train flags ("{pool}" is replaced by the environment pool folder)
VARIANTS = {
    "baseline": [],
    "no_designer_training": ["--no-designer-training"],
    "no_memory": ["--no-memory"],
    "no_corpus": ["--no-corpus"],
    "solve_rate": ["--designer-reward", "solve_rate"],
    "learning_potential": ["--designer-reward", "learning_potential"],
    "env_pool": ["--env-pool", "{pool}"],
    "restricted_skills": ["--skills", "0,1"],   # Mathematical Reasoning and Logical Deduction only
}
METRICS = ["designer/valid_rate", "env/regret", "agent/return_nohint", "agent/return_hint", "agent/win_rate",
           "env/diversity", "memory/diversity", "env/hint_leak_rate", "env/opening_leak_rate", "env/loc_mean",
           "env/turns_to_solve", "env/one_turn_share", "loss/policy", "eval/score"]


def run_variant(name: str, flags: list[str], args: argparse.Namespace, out: Path, pool: Path) -> dict:
    """One training run in a subprocess; then, optionally, the held-out eval of its last checkpoint."""
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)  # same steps and seed every time: start from scratch
    cmd = [sys.executable, str(ROOT / "cli.py"), "train", "--preset", args.preset, "--model", args.model,
           "--steps", str(args.steps), "--seed", str(args.seed), "--out", str(run_dir),
           *[f.replace("{pool}", str(pool)) for f in flags], *shlex.split(args.train_args)]
    t0 = time.time()
    print(f"[{name}] {shlex.join(cmd)}", flush=True)
    with open(out / f"{name}.log", "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    row = {"variant": name, "flags": " ".join(flags).replace("{pool}", pool.name), "rc": rc,
           "wall_s": round(time.time() - t0, 1)}
    if rc == 0 and args.eval_limit > 0:
        # after the run: spade-mini eval of its last checkpoint (lands in the "last step" table)
        row["last:heldout_eval"] = held_out_score(["--run", str(run_dir)], args, out / f"{name}.eval.log")
    print(f"[{name}] exit {rc} in {row['wall_s']}s (log: {out / f'{name}.log'})", flush=True)
    return row


def held_out_score(source: list[str], args: argparse.Namespace, log_path: Path) -> float | None:
    """`spade-mini eval` of a run's last checkpoint (source ["--run", DIR]) or of the base model; None if it failed."""
    cmd = [sys.executable, str(ROOT / "cli.py"), "eval", *source, "--preset", args.preset, "--limit",
           str(args.eval_limit), "--seed", str(args.seed), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    log_path.write_text(proc.stdout + proc.stderr)
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1])["score"] if proc.returncode == 0 and lines else None


def summarize(row: dict, run_dir: Path) -> dict:
    """Add mean-over-steps and last-step columns per metric (missing/None values are skipped; '' if never)."""
    records = report.load_run(run_dir)[1] if (run_dir / "metrics.jsonl").exists() else []
    row["steps_done"] = len(records)
    for key in METRICS:
        values = [report.number(r.get(key)) for r in records]
        values = [v for v in values if v is not None]
        row[f"mean:{key}"] = round(sum(values) / len(values), 4) if values else ""
        row[f"last:{key}"] = round(values[-1], 4) if values else ""
    return row


def write_tables(rows: list[dict], out: Path) -> tuple[Path, Path]:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with open(out / "ablations.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    lines = []
    for kind in ("mean", "last"):
        keys = [k for k in columns if k.startswith(kind + ":") and any(r.get(k) not in ("", None) for r in rows)]
        head = ["variant", "rc", "steps", "wall_s"] + [k.split(":", 1)[1] for k in keys]
        lines += [f"### {'mean over steps' if kind == 'mean' else 'last step'}", "",
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(str(v) for v in [r["variant"], r["rc"], r["steps_done"], r["wall_s"]]
                                    + [r.get(k, "") for k in keys]) + " |" for r in rows]
        lines.append("")
    (out / "ablations.md").write_text("\n".join(lines))
    return out / "ablations.csv", out / "ablations.md"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="tiny", help="train preset")
    p.add_argument("--model", default="smollm2-135m", help="model (tiny-random for a quick check)")
    p.add_argument("--steps", type=int, default=2, help="self-play steps per variant")
    p.add_argument("--seed", type=int, default=0, help="the same seed for every variant")
    p.add_argument("--out", default="runs/ablations", help="folder for the run directories and the tables")
    p.add_argument("--env-pool", default="", help="folder for the env_pool variant (default: examples/)")
    p.add_argument("--only", default="", help="comma-separated subset of: " + ", ".join(VARIANTS))
    p.add_argument("--train-args", default="", help="extra flags for every train run, e.g. '--plays 2'")
    p.add_argument("--eval-limit", type=int, default=0, help="held-out eval items per category after each run")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    out = Path(args.out).resolve()  # note: the runs execute with the repository as working directory
    out.mkdir(parents=True, exist_ok=True)
    pool = Path(args.env_pool).resolve() if args.env_pool else ROOT / "examples"
    rows = [summarize(run_variant(n, VARIANTS[n], args, out, pool), out / n) for n in names]
    if args.eval_limit > 0:  # the reference the paper compares against: the model before any self-play
        t0 = time.time()
        score = held_out_score(["--model", args.model], args, out / "untrained_base.eval.log")
        rows.append({"variant": "untrained_base", "flags": "", "rc": 0 if score is not None else 1,
                     "wall_s": round(time.time() - t0, 1), "last:heldout_eval": score, "steps_done": 0})
    csv_path, md_path = write_tables(rows, out)
    print(md_path.read_text())
    print(f"wrote {csv_path} and {md_path}")
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""The demo table of docs/benchmarks.md, read from a run directory (or a copy of its metrics.jsonl), so it cannot drift.

    python bench/demo_table.py RUN_DIR            # the markdown table of the run's steps
    python bench/demo_table.py bench/results/demo_metrics.jsonl

docs/benchmarks.md shows this script's output for the run whose metrics.jsonl is kept in bench/results/; a test
checks that the two agree. After a new demo run, copy its metrics.jsonl there and paste the new table there.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import runs  # noqa: E402  (the crash-tolerant reader the run directory is written for)

# (column, metric, format); None prints as -
COLUMNS = [("designer/valid_rate", "{:.2f}"), ("env/count", "{}"), ("agent/return_nohint", "{:.3f}"),
           ("agent/return_hint", "{:.3f}"), ("env/regret", "{:+.3f}"), ("agent/turns_mean", "{:.2f}"),
           ("agent/zero_variance_frac", "{:.2f}"), ("loss/samples_agent", "{}"), ("loss/grad_norm", "{:.3f}"),
           ("perf/step_s", "{:.0f}")]


def table(metrics: Path) -> str:
    """One markdown row per step record of a metrics.jsonl (the header line is skipped)."""
    records = [r for r in runs.read_jsonl(metrics) if isinstance(r.get("step"), int) and r["step"] >= 0]
    lines = ["| step | " + " | ".join(name for name, _ in COLUMNS) + " |",
             "|---" * (len(COLUMNS) + 1) + "|"]
    for r in records:
        cells = ["-" if r.get(name) is None else fmt.format(r[name]) for name, fmt in COLUMNS]
        attempts = r.get("designer/attempts")
        if attempts:
            cells[0] += f" ({round((r.get('designer/valid_rate') or 0) * attempts)} of {attempts})"
        lines.append(f"| {r['step']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a run directory, or a metrics.jsonl")
    path = Path(parser.parse_args().run)
    print(table(path / "metrics.jsonl" if path.is_dir() else path))


if __name__ == "__main__":
    main()

"""A run directory made visible: PNG plots over steps and a page of every environment, as static HTML.

spade-mini logs to plain files (metrics.jsonl, samples.jsonl, envs/step_NNNNN/). `write_report(run_dir)` turns
them into RUN_DIR/report/index.html (figures, a per-step table, the resolved config) and report/envs.html (each
environment's code, hint, scores and one example episode). Both pages are self-contained: PNGs are linked by
relative paths, nothing is fetched, and every logged string is HTML-escaped (generated code may hold `<script>`).

How to read the figures (the same captions appear under each one):
* returns: mean episode return of the agent with and without the hint. Self-play is working when the unhinted
  curve rises; the hinted curve is the "antagonist" upper bound.
* regret: R_hint - R_nohint averaged over the step's environments, the designer's training signal. Near 0 with
  both returns high = too easy; near 0 with both low = unsolvable; positive = at the edge of the agent's ability.
* validity: share of designer attempts that passed the sandbox checks; rejections: why the others failed.
* diversity: Vendi score / n of the step's programs and of the memory (1/n = identical programs, 1 = unrelated).
* eval: held-out reasoning-gym score overall and per category, the share of answers given in \\boxed{} at all
  (a small model's first gain is often the format), and the held-out pool's win rate (with --eval-every).
* environment statistics: any other `env/...` metric (lines of code, leakage, one-turn solves), one panel each.

Standard library, matplotlib (Agg backend, no display) and envs.py (no torch), so a report renders on any machine.
"""
from __future__ import annotations

import html
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # note: before pyplot is imported; a headless server has no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

import runs  # noqa: E402  (read_jsonl: the crash-tolerant reader every run file is written for)

# (file, title, y label, metric keys, y range always shown or None, caption). Keys missing from the run are
# skipped; a figure with no data is still drawn, with a note, so the page layout is the same for every run. The
# fixed y ranges make two runs' reports comparable at a glance (values outside still widen the axis).
FIGURES = [
    ("returns.png", "Agent return with and without the hint", "mean episode return",
     ["agent/return_hint", "agent/return_nohint", "agent/win_rate"], (-1.05, 1.05),
     "Unhinted return rising = the agent is learning; the hinted curve is the upper bound the hint allows."),
    ("regret.png", "Hint regret (the designer's signal)", "R_hint - R_nohint",
     ["env/regret", "designer/reward_mean"], None,
     "Positive regret = environments at the edge of the agent's ability. Near zero: too easy or unsolvable "
     "(read the returns figure to tell which)."),
    ("validity.png", "Designer validity rate", "share of attempts valid", ["designer/valid_rate"], (-0.05, 1.05),
     "Share of designer attempts that passed every sandbox check."),
    ("rejections.png", "Rejections", "attempts", [], None,
     "Rejected designer attempts per step, stacked by the sandbox's machine-readable reason."),
    ("diversity.png", "Diversity (Vendi score / n)", "Vendi / n", ["env/diversity", "memory/diversity"], (-0.05, 1.05),
     "1/n: near-identical programs (collapse); 1: unrelated programs. The paper: 0.68 with corpus, 0.04 without."),
    ("eval.png", "Held-out evaluation", "score", ["eval/score", "eval/*", "eval/pool_win_rate"], (-0.05, 1.05),
     "reasoning-gym score overall and per category, eval/answered = share of answers in \\boxed{}, and the win "
     "rate on a held-out environment pool. Step -1 is the untrained base model."),
    ("loss.png", "Update", "value", ["loss/policy", "loss/kl", "agent/zero_variance_frac"], None,
     "Policy loss of the one optimizer step, and the share of zero-variance groups (they carry no gradient)."),
    ("env_stats.png", "Environment statistics", "", [], None,
     "One panel per other env/ metric (lines of code, turns, one-turn solves, hint and opening leakage)."),
]
PLAIN = {"env/regret", "env/count", "env/hung", "env/diversity"}  # env/* keys that are not 'statistics'
TABLE = ["designer/valid_rate", "env/count", "agent/return_nohint", "agent/return_hint", "env/regret",
         "agent/win_rate", "env/diversity", "eval/score", "loss/policy", "perf/step_s"]


# -----------------------------------------------------------------------------------------------------------
# reading the run

def load_run(run_dir: Path) -> tuple[dict, list[dict]]:
    """(header, step records sorted by step). The header is the first line holding "config"; a step logged
    twice (a resume) keeps its last record."""
    lines = runs.read_jsonl(run_dir / "metrics.jsonl")
    header = next((r for r in lines if "config" in r), {})
    if not header and (run_dir / "config.json").exists():
        header = {"config": json.loads((run_dir / "config.json").read_text())}
    steps = {r["step"]: r for r in lines if isinstance(r.get("step"), int) and "config" not in r}
    return header, [steps[s] for s in sorted(steps)]


def number(value) -> float | None:
    """A plottable float, or None for missing, non-numeric and non-finite values (bools count as 0/1)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def expand(keys: list[str], records: list[dict]) -> list[str]:
    """Resolve 'prefix/*' to every key with that prefix present in the run (sorted), keeping explicit keys.

    >>> expand(["eval/score", "eval/*"], [{"step": 0, "eval/score": 0.5, "eval/logic": 1.0, "loss/policy": 0.1}])
    ['eval/score', 'eval/logic']
    """
    present = sorted({k for r in records for k in r})
    out = []
    for key in keys:
        found = [k for k in present if k.startswith(key[:-1])] if key.endswith("/*") else [key]
        out += [k for k in found if k not in out]
    return out


# -----------------------------------------------------------------------------------------------------------
# figures

def plot_lines(ax, records: list[dict], keys: list[str]) -> int:
    """One line per key over steps; missing values are skipped, so sparse metrics (eval every K steps) still
    connect. Returns how many keys had data."""
    drawn = 0
    for key in keys:
        points = [(r["step"], number(r.get(key))) for r in records]
        points = [(s, v) for s, v in points if v is not None]
        if points:
            ax.plot(*zip(*points), marker="o", markersize=3, label=key)
            drawn += 1
    step_axis(ax, records)
    return drawn


def step_axis(ax, records: list[dict]) -> None:
    """Whole-number step ticks; half a step of margin, so a one-step run shows one tick, not -0.04..0.04."""
    steps = [r["step"] for r in records]
    if steps:
        ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def line_figure(path: Path, title: str, ylabel: str, records: list[dict], keys: list[str],
                ylim: tuple[float, float] | None) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    if plot_lines(ax, records, keys):
        ax.legend(fontsize=8)
        if ylim:
            lo, hi = ax.get_ylim()
            ax.set_ylim(min(lo, ylim[0]), max(hi, ylim[1]))
    else:
        ax.text(0.5, 0.5, "not logged in this run:\n" + ", ".join(keys), ha="center", va="center",
                transform=ax.transAxes, fontsize=9, color="gray")
    ax.set(title=title, xlabel="step", ylabel=ylabel)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def rejections_figure(path: Path, records: list[dict]) -> None:
    """Stacked bars: rejected designer attempts per step, by the sandbox's reason."""
    reasons = sorted({k for r in records for k in (r.get("designer/rejections") or {})})
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    steps, bottom = [r["step"] for r in records], [0.0] * len(records)
    for reason in reasons:
        counts = [number((r.get("designer/rejections") or {}).get(reason)) or 0.0 for r in records]
        ax.bar(steps, counts, bottom=bottom, label=reason)
        bottom = [b + c for b, c in zip(bottom, counts)]
    if reasons:
        ax.legend(fontsize=7, ncol=2)
    else:
        ax.text(0.5, 0.5, "no rejected attempts", ha="center", va="center", transform=ax.transAxes, color="gray")
    step_axis(ax, records)
    ax.set(title="Rejected designer attempts by reason", xlabel="step", ylabel="attempts")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def stats_figure(path: Path, records: list[dict]) -> list[str]:
    """Small multiples of every other numeric env/* metric (their scales differ: lines of code vs shares)."""
    keys = [k for k in expand(["env/*"], records) if k not in PLAIN
            and any(number(r.get(k)) is not None for r in records)]
    cols = 3
    rows = max(1, math.ceil(len(keys) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(9.6, 2.6 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        plot_lines(ax, records, [key])
        ax.set_title(key, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    if not keys:
        axes[0][0].text(0.5, 0.5, "no environment statistics logged", ha="center", va="center", color="gray")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return keys


# -----------------------------------------------------------------------------------------------------------
# pages

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto;padding:0 1em}}
table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}
pre{{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:12px}}img{{max-width:100%}}
.note{{color:#666}}blockquote{{border-left:3px solid #aaa;margin:0;padding-left:8px}}</style></head>
<body>
{body}
</body></html>
"""


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def fmt(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    v = number(value)
    return "-" if v is None else f"{int(v)}" if v == int(v) and abs(v) >= 1 else f"{v:.3g}"


def table(rows: list[list], header: list[str]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def index_page(run_dir: Path, header: dict, records: list[dict], figures: list[tuple[str, str, str]]) -> str:
    cfg = header.get("config", {})
    knobs = ["model", "preset", "steps", "seed", "designer_reward", "no_designer_training", "no_memory",
             "no_corpus", "env_pool", "skills", "envs_per_step", "plays", "hinted_plays"]
    parts = [f"<h1>spade-mini run {esc(run_dir.resolve().name)}</h1>",
             '<p><a href="envs.html">environments of every step</a></p>',
             table([[k, cfg[k]] for k in knobs if k in cfg], ["config", "value"])]
    if not records:
        parts.append('<p class="note"><b>This run has no completed steps yet</b> (metrics.jsonl holds no step '
                     "record). Rerun the report after the first step finishes.</p>")
        return PAGE.format(title="spade-mini report", body="\n".join(parts))
    parts.append("<h2>Per step</h2>")
    parts.append(table([[r["step"]] + [fmt(r.get(k)) for k in TABLE] for r in records], ["step"] + TABLE))
    for file, title, caption in figures:
        parts.append(f'<h2>{esc(title)}</h2>\n<img src="{esc(file)}" alt="{esc(title)}">'
                     f'\n<p class="note">{esc(caption)}</p>')
    return PAGE.format(title="spade-mini report", body="\n".join(parts))


def render_transcript(episode: dict) -> str:
    """One logged episode: its outcome, then each turn's fields (whatever the rollout recorded) escaped."""
    head = (f"<p>seed {esc(episode.get('seed'))}, {'with' if episode.get('hinted') else 'without'} hint: return "
            f"{fmt(episode.get('return', episode.get('reward')))} in {esc(episode.get('turns'))} turns"
            f"{', terminated' if episode.get('terminated') else ''}"
            f"{', failure ' + esc(episode['failure']) if episode.get('failure') else ''}</p>")
    turns = []
    for i, turn in enumerate(episode.get("transcript") or []):
        turn = turn if isinstance(turn, dict) else {"text": turn}
        fields = [(k, v) for k, v in turn.items() if k != "turn"]  # turn 0 is the first observation
        turns.append(f"<b>turn {esc(turn.get('turn', i))}</b><pre>"
                     + "\n".join(f"{esc(k)}: {esc(v)}" for k, v in fields) + "</pre>")
    return head + "".join(turns)


def env_section(step: int, py: Path, episode: dict | None) -> str:
    meta_path = py.with_suffix(".json")
    try:
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    except json.JSONDecodeError:
        meta = {}
    scores = [[k, fmt(v) if number(v) is not None else v] for k, v in meta.items() if k not in ("hint", "skill")]
    anchor = f"s{step}-{py.stem}"
    return "\n".join([
        f'<h3 id="{esc(anchor)}">step {step} &middot; {esc(py.stem)} &middot; {esc(meta.get("skill", "?"))}</h3>',
        table(scores, ["score", "value"]) if scores else '<p class="note">no scores file</p>',
        f"<p>hint:</p><blockquote>{esc(meta.get('hint') or '(none)')}</blockquote>",
        f"<details><summary>code ({len(py.read_text(errors='replace').splitlines())} lines)</summary>"
        f"<pre><code>{esc(py.read_text(errors='replace'))}</code></pre></details>",
        "<p>example episode:</p>" + (render_transcript(episode) if episode else
                                     '<p class="note">no episode of this environment was logged</p>'),
    ])


def envs_page(run_dir: Path) -> str:
    """Every envs/step_NNNNN/*.py with its .json scores and the first logged episode of (step, env_id)."""
    episodes: dict[tuple, dict] = {}
    for r in runs.read_jsonl(run_dir / "samples.jsonl"):
        if r.get("kind") == "episode":
            episodes.setdefault((r.get("step"), r.get("env_id")), r)
    sections, toc = [], []
    for folder in sorted((run_dir / "envs").glob("step_*")):
        try:
            step = int(folder.name.split("_")[1])
        except (IndexError, ValueError):
            continue
        for py in sorted(folder.glob("*.py")):
            toc.append(f'<a href="#s{step}-{esc(py.stem)}">{step}/{esc(py.stem)}</a>')
            sections.append(env_section(step, py, episodes.get((step, py.stem))))
    body = ['<h1>Environments</h1><p><a href="index.html">back to the figures</a></p>',
            "<p>" + " &middot; ".join(toc) + "</p>" if toc else '<p class="note">no environments saved yet</p>']
    return PAGE.format(title="spade-mini environments", body="\n".join(body + sections))


# -----------------------------------------------------------------------------------------------------------
# entry points

def write_report(run_dir: str | Path) -> Path:
    """Write RUN_DIR/report/{index.html, envs.html, *.png}; returns the index path. Raises FileNotFoundError
    for a directory that is not a run. A run with no completed step gets a page saying so, and no figures."""
    run_dir = Path(run_dir)
    if not ((run_dir / "metrics.jsonl").exists() or (run_dir / "config.json").exists()):
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl or config.json (not a spade-mini run directory)")
    header, records = load_run(run_dir)
    out = run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    figures = []
    for file, title, ylabel, keys, ylim, caption in FIGURES if records else []:
        if file == "rejections.png":
            rejections_figure(out / file, records)
        elif file == "env_stats.png":
            caption += " Shown: " + (", ".join(stats_figure(out / file, records)) or "none logged") + "."
        else:
            line_figure(out / file, title, ylabel, records, expand(keys, records), ylim)
        figures.append((file, title, caption))
    (out / "envs.html").write_text(envs_page(run_dir), encoding="utf-8")
    index = out / "index.html"
    index.write_text(index_page(run_dir, header, records, figures), encoding="utf-8")
    return index

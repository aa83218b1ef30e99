"""`spade-mini report RUN_DIR`: a run directory made visible, as PNG plots over steps and static HTML pages.

A support module (a first read of the method may skip it). spade-mini logs to plain files (metrics.jsonl,
samples.jsonl, envs/step_NNNNN/); `write_report(run_dir)` turns them into RUN_DIR/report/index.html (figures, a
per-step table, the resolved config), envs.html (each environment's code, hint, scores and one example episode)
and designs.html (every designer attempt with its verdict). The pages are self-contained: PNGs are linked by
relative paths, nothing is fetched, and every logged string is HTML-escaped (generated code may hold `<script>`).

How to read the figures (the same captions appear under each one):
* returns: mean episode return of the agent with and without the hint. Self-play is working when the unhinted
  curve rises within a window; the hinted curve is the same agent with the hint, not a bound it cannot pass.
* regret: R_hint - R_nohint averaged over the window's environments, the designer's training signal. Near 0 with
  both returns high = too easy; near 0 with both low = unsolvable; positive = at the edge of the agent's ability.
* validity: share of designer attempts that passed the sandbox checks; rejections: why the others failed.
* diversity: Vendi score / n of the step's programs and of the memory (1/n = identical programs, 1 = unrelated).
* eval: held-out reasoning-gym score overall and per category, the share of answers given in \\boxed{} at all
  (a small model's first gain is often the format), and the held-out pool's win rate (with --eval-every).
* the panels (how the agent replies, the update, environment statistics, time, everything else): one metric
  each; a metric that never changed in the run is a row of the table under its figure instead of a flat line.
Every plot over steps marks where a regeneration window begins (a dashed line): new environments, so a jump
there is the games changing, not the training. The figures are meant to be truthful at a glance:
1. an axis is set by what its metric is (kind()): a share runs 0-1; any other value starts from 0, so float noise
   is a flat line, not a slope; a reward-like value (return, regret, reward) has a zero line;
2. a metric of one value in the run (one point, or the same at every step) is a number in a table, not a plot;
3. a step where a phase did not run has no point (a gap), not a 0, and its ~0 s timers are dropped;
4. two series identical at every step are one line labelled 'a = b';
5. a point says how many plays it averages (beside it, or once when every point has the same count).

Standard library and matplotlib (Agg backend, no display): a report renders on any machine, without torch. cli.py
imports this module only for `report`, so the other commands start without matplotlib.
"""
from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import NamedTuple

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

import runs

# (file, title, y label, metric keys, caption). A metric finds its place by name: the first figure whose keys list
# it (or its 'prefix/*') draws it, and one that no figure lists is drawn in "Everything else logged" by itself, so
# a new metric shows without a change here; add its key to a figure to place it, and to TABLE for the per-step
# table. Keys missing from the run are skipped; a figure with no data at all is left out and named in one line under
# the others (NOT_LOGGED says why where that is not obvious). The y axes follow the metric's kind (kind()).
FIGURES = [
    ("returns.png", "Agent return with and without the hint", "mean episode return",
     ["agent/return_nohint", "agent/return_hint", "agent/win_rate"],
     "agent/return_nohint: the mean return of this step's unhinted plays (the ones trained); agent/return_hint: "
     "the mean return of the hinted plays, at a window's first step only (never trained); agent/win_rate: the share "
     "of unhinted plays won. The hinted curve is the same agent with a hint in its first message, not a bound it "
     "cannot pass: a hint that misleads, or that a small model misreads, makes it lower (the regret is then "
     "negative, and the regret reward floors it at 0). Learning shows as the unhinted return rising within a "
     "window; at a dashed line the games change."),
    ("behaviour.png", "How the agent replies", "", ["agent/first_reply_tokens", "agent/reply_tokens", "agent/cut_share",
     "agent/action_share", "agent/turns_mean"],
     "One panel each, unhinted plays: tokens of the first reply and of every reply, the share of replies cut by the "
     "token limit (not played), the share holding an action, turns per episode. SPADE's agent learns to act "
     "early with short replies; at a dashed line the games change, and with them how long the replies run."),
    ("regret.png", "Hint regret (the designer's signal)", "R_hint - R_nohint",
     ["env/regret", "designer/reward_mean"],
     "env/regret: R_hint - R_nohint of the window's environments (at its first step); designer/reward_mean: the "
     "designer's reward (at its last). Positive regret = environments at the edge of the agent's ability. Near "
     "zero: too easy or unsolvable (read the returns figure to tell which); negative: the hint misled."),
    ("validity.png", "Designer validity rate", "share of attempts valid", ["designer/valid_rate"],
     "Share of designer attempts that passed every sandbox check (at a window's first step, when it designs)."),
    ("rejections.png", "Rejections", "attempts", [],
     "Rejected designer attempts per step, stacked by the sandbox's machine-readable reason."),
    ("diversity.png", "Diversity (Vendi score / n)", "Vendi / n", ["env/diversity", "memory/diversity"],
     "1/n: near-identical programs (collapse); 1: unrelated programs. The paper: 0.68 with corpus, 0.04 without."),
    ("eval.png", "Held-out evaluation", "score", ["eval/score", "eval/*", "eval/pool_win_rate"],
     "reasoning-gym score overall and per category, eval/answered = share of answers in \\boxed{}, and the win "
     "rate on a held-out environment pool. Step -1 is the untrained base model."),
    ("update.png", "The update", "", ["loss/*", "agent/zero_variance_frac"],
     "One panel each: the gradient norm (above 0: an update happened), the PPO-clip-form loss, KL, the clipped "
     "share (0 with one optimizer step), samples per role, optimizer steps, and the share of zero-variance groups "
     "(they carry no gradient)."),
    ("env_stats.png", "Environment statistics", "", ["env/*"],
     "One panel per other env/ metric (lines of code, turns, one-turn solves, hint and opening leakage)."),
    ("memory.png", "Memory per phase", "GiB", ["mem/*"],
     "CUDA: peak memory allocated and reserved in each phase (the cache is freed between phases); reserved far "
     "above allocated means fragmentation; compare with `spade-mini plan`. CPU: the process's peak resident memory "
     "so far at each phase's end (the phase that raised it is the one whose line steps up)."),
    ("perf.png", "Time and throughput", "", ["perf/*"], "One panel per perf/ metric: seconds per phase, "
     "tokens per second, the sandbox's share of play, peak memory. A phase that did not run at a step has no point "
     "there (design and hint after a window's first step, hint without hinted plays, play without an environment, "
     "the update without a sample), not the ~0 s its timer logged; score runs at every step (the memory's "
     "statistics)."),
    ("other.png", "Everything else logged", "", [], "One panel per numeric metric no figure above shows."),
]
PANELS = {"behaviour.png", "update.png", "env_stats.png", "perf.png", "other.png"}   # small multiples: their scales differ
NOT_LOGGED = {"memory.png": " (CUDA runs only)", "eval.png": " (train with --eval-every N)",
              "rejections.png": " (no designer attempts: an --env-pool run)"}
STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1)), "v")]   # coinciding curves stay visible
PLAIN = {"env/regret", "env/count", "env/hung", "env/diversity"}  # env/* keys that are not 'statistics'
TABLE = ["designer/valid_rate", "env/count", "agent/return_nohint", "agent/return_hint", "env/regret",
         "agent/win_rate", "env/diversity", "eval/score", "loss/grad_norm", "loss/samples_agent",
         "loss/samples_designer", "perf/step_s"]
WINDOW = "new window (new environments)"   # the dashed line's legend
HINTED = ("agent/return_hint", "env/regret")   # without hinted plays: the unhinted return and 0, not drawn
SCHEDULED = ("eval/",)   # logged every --eval-every steps by design: its points connect across the steps between
# A phase's metrics: train.py times every phase at every step, so a phase that did not run there logs ~0 s (and the
# design phase 0 attempts); at such a step they are dropped (without_phases_not_run): a gap, not a 0.
PHASE_METRICS = {"design": ("perf/design_s", "designer/attempts", "designer/rejections"), "hint": ("perf/hint_s",),
                 "play": ("perf/play_s", "perf/sandbox_share"), "update": ("perf/update_s",)}
# (score runs at every step: the memory's statistics; its time is always kept)
# What one point of a metric averages at its step, in words (averaged_over() counts it from the record and config)
PLAYED = "the unhinted plays of the environments that did not hang, (env/count - env/hung) x --plays"
REPLIES = "the replies of the unhinted plays, env/count x --plays"
PER_POINT = {"agent/return_nohint": PLAYED, "agent/win_rate": PLAYED,
             "agent/return_hint": "the hinted plays, (env/count - env/hung) x --hinted-plays",
             "env/regret": "hinted and unhinted plays, (env/count - env/hung) x (--hinted-plays + --plays)",
             "agent/turns_mean": "every play, env/count x --plays (and x --hinted-plays more where there were hinted plays)",
             **{f"agent/{k}": REPLIES for k in ("first_reply_tokens", "reply_tokens", "cut_share", "action_share",
                                                 "refuted_repeat_share", "echo_share")},
             "designer/valid_rate": "the designer's attempts, designer/attempts"}
MARKED = 30   # at most this many counts written beside a line's points (more: the legend gives their range)
# A y axis says what a metric is (kind()): a share runs 0-1; a reward-like value (return, regret, reward, advantage)
# starts from 0 with a zero line; any other number starts from 0 too, so the axis never zooms into float noise
# (a run's 1.0000001 is drawn as 1, not as a slope). SPAN: the least height of an axis of values all near 0.
SHARES = {"share", "rate", "frac", "valid", "diversity", "distinct"}   # words of a key (kind()); and eval/ scores
REWARDS = {"return", "regret", "reward", "advantage"}
SPAN = {"share": 1.0, "reward": 0.05, "amount": 1e-6}


class Figured(NamedTuple):
    """A figure as the index page shows it."""
    file: str | None   # the PNG; None when every metric of it is a number (one value in the run)
    title: str
    caption: str
    numbers: list      # [metric, value, steps logged] of its metrics of one value (a table, not a plot)


# -----------------------------------------------------------------------------------------------------------
# reading the run

def load_run(run_dir: Path) -> tuple[dict, list[dict]]:
    """(header, step records sorted by step). The header is the first line holding "config", its config taken
    from config.json when that reads (a resume records its new --steps there); a step logged twice (a resume)
    keeps its last record."""
    lines = runs.read_jsonl(run_dir / "metrics.jsonl")
    header = dict(next((r for r in lines if "config" in r), {}))
    try:
        header["config"] = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        pass
    steps = {r["step"]: r for r in lines if isinstance(r.get("step"), int) and "config" not in r}
    return header, [steps[s] for s in sorted(steps)]


def phases_not_run(record: dict, config: dict) -> set[str]:
    """The phases of train.self_play_step that did not run at this record's step: design and hint run at a window's
    first step only (hint: with an environment to hint and --hinted-plays above 0), play with an environment, the
    update with a sample. Score runs at every step (the memory's statistics, train.self_play_step), so its time is
    always kept. A phase is taken to have run when the record does not say.

    >>> sorted(phases_not_run({"step": 3, "window/start": 2, "window/length": 3, "env/count": 0}, {}))
    ['design', 'hint', 'play']
    >>> phases_not_run({"step": 4, "env/count": 2, "loss/samples_agent": 8}, {"regen_interval": 2, "hinted_plays": 4})
    set()
    """
    step, start, length, every = (record.get("step"), record.get("window/start"), record.get("window/length"),
                                  config.get("regen_interval"))
    if isinstance(start, int) and isinstance(length, int):
        first = step == start
    else:   # a run that did not log its windows
        every = every if isinstance(every, int) and every > 0 else 1
        first = step % every == 0
    envs = number(record.get("env/count"))
    samples = [n for n in (number(record.get(k)) for k in ("loss/samples_agent", "loss/samples_designer")) if n is not None]
    ran = {"design": first, "hint": first and envs != 0 and config.get("hinted_plays") != 0, "play": envs != 0,
           "update": not samples or sum(samples) > 0}
    return {name for name, did in ran.items() if not did}


def without_phases_not_run(records: list[dict], config: dict) -> list[dict]:
    """The records less the metrics of each phase that did not run at their step (PHASE_METRICS).

    >>> without_phases_not_run([{"step": 1, "env/count": 0, "perf/play_s": 0.002, "perf/step_s": 9.0}], {})
    [{'step': 1, 'env/count': 0, 'perf/step_s': 9.0}]
    """
    out = []
    for r in records:
        dropped = {key for phase in phases_not_run(r, config) for key in PHASE_METRICS[phase]}
        out.append({k: v for k, v in r.items() if k not in dropped})
    return out


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

def window_starts(config: dict, records: list[dict]) -> list[int]:
    """The steps after the first one shown at which a regeneration window began (new environments from there on):
    each record's window/start, or for a run that did not log it, the multiples of --regen-interval. None marked
    when every step begins one (--regen-interval 1): a line at every step would say nothing.

    >>> window_starts({"regen_interval": 2}, [{"step": s} for s in range(-1, 5)])
    [2, 4]
    >>> window_starts({}, [{"step": s, "window/start": s - s % 3} for s in range(7)])
    [3, 6]
    """
    every, steps = config.get("regen_interval"), [r["step"] for r in records if r["step"] >= 0]
    logged = {r["window/start"] for r in records if isinstance(r.get("window/start"), int)}
    if not steps or every == 1 or not (logged or isinstance(every, int) and every > 1):
        return []
    starts = logged or {s for s in range(max(steps) + 1) if s % every == 0}
    return sorted(s for s in starts if min(steps) < s <= max(steps))


def constant_value(key: str, records: list[dict]) -> float | None:
    """The value of a metric that never changed in the run, or None when it changed.

    >>> constant_value("kl", [{"kl": 0.0}, {}, {"kl": 0.0}]), constant_value("kl", [{"kl": 0.0}, {"kl": 0.1}])
    (0.0, None)
    """
    values = {number(r.get(key)) for r in records} - {None}
    return values.pop() if len(values) == 1 else None


def kind(key: str) -> str:
    """'share' (a fraction of something: plays won, attempts valid, replies cut), 'reward' (in reward units: signed,
    its zero is the message) or 'amount' (counts, seconds, tokens, norms).

    >>> [kind(k) for k in ("agent/win_rate", "eval/score", "env/regret", "perf/generate_tok_per_s", "perf/eval_s")]
    ['share', 'share', 'reward', 'amount', 'amount']
    """
    words = set(re.split(r"[/_]", key.lower()))   # subtle: words, not substrings ("generate" holds "rate")
    share = key.startswith("eval/") or words & SHARES   # held-out scores are shares of items right
    return "share" if share else "reward" if words & REWARDS else "amount"


def y_limits(keys: list[str], records: list[dict], margin: float = 0.04) -> tuple[float, float]:
    """The y axis of keys drawn together: from min(0, lowest) to max(0, highest), to 1 at least when one is a
    share, and at least SPAN high (float noise around 0 stays flat); `margin` of that height above and below.

    >>> y_limits(["agent/win_rate"], [{"agent/win_rate": 0.5}, {"agent/win_rate": 0.5000001}])
    (-0.04, 1.04)
    >>> [round(v, 3) for v in y_limits(["perf/step_s"], [{"perf/step_s": 12.0}, {"perf/step_s": 12.0000001}])]
    [-0.48, 12.48]
    """
    values = [v for key in keys for r in records if (v := number(r.get(key))) is not None]
    kinds = {kind(key) for key in keys}
    low, high = min([0.0, *values]), max([0.0, *values, *([1.0] if "share" in kinds else [])])
    span = max(SPAN[k] for k in kinds) if kinds else 1.0
    if high - low < span:   # all near 0: grow away from 0 on the data's side
        low, high = (low, low + span) if high > 0 or low == 0 else (high - span, high)
    margin *= high - low
    return low - margin, high + margin


def identical_groups(keys: list[str], records: list[dict]) -> list[list[str]]:
    """The keys grouped by their series: keys with the same value at every step (to float rounding) and none at the
    same steps are one group, drawn as one line labelled 'a = b' (one curve hidden under the other says nothing).

    >>> identical_groups(["a", "b", "c"], [{"a": 1, "b": 1.0, "c": 1}, {"a": 0.5, "b": 0.5 + 1e-12, "c": None}])
    [['a', 'b'], ['c']]
    """
    groups: list[tuple[list, list[str]]] = []
    for key in keys:
        values = [number(r.get(key)) for r in records]
        same = [names for series, names in groups if all(
            (a is None) == (b is None) and (a is None or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12))
            for a, b in zip(series, values))]
        if same:
            same[0].append(key)
        else:
            groups.append((values, [key]))
    return [names for _, names in groups]


def averaged_over(key: str, record: dict, config: dict) -> int | None:
    """How many plays (designer/valid_rate: attempts) the point of `key` at this record's step averages (PER_POINT),
    from the record's env/count and env/hung and the config's --plays and --hinted-plays; None where not known.

    >>> averaged_over("agent/return_nohint", {"agent/return_nohint": 0.5, "env/count": 3, "env/hung": 1}, {"plays": 4})
    8
    """
    if key not in PER_POINT or number(record.get(key)) is None:
        return None
    if key == "designer/valid_rate":
        return int(number(record.get("designer/attempts")) or 0) or None
    envs, plays, hinted = number(record.get("env/count")), config.get("plays"), config.get("hinted_plays", 0)
    if envs is None or not isinstance(plays, int) or not isinstance(hinted, int):
        return None
    scored = envs - (number(record.get("env/hung")) or 0)
    hinted_here = hinted if number(record.get("agent/return_hint")) is not None else 0
    return int({"agent/return_nohint": scored * plays, "agent/win_rate": scored * plays,
                "agent/return_hint": scored * hinted, "env/regret": scored * (hinted + plays),
                "agent/turns_mean": envs * (plays + hinted_here)}.get(key, envs * plays))


def per_point_note(keys: list[str], records: list[dict], config: dict) -> str:
    """The caption's sentence on what one point of each key averages (PER_POINT), with the counts drawn."""
    parts = []
    for key in [k for k in keys if k in PER_POINT]:
        counts = sorted({n for r in records if (n := averaged_over(key, r, config)) is not None})
        told = (f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}") + " here" if counts else \
            "not counted here: the run did not log env/count, or its config has no --plays"
        parts.append(f"{key}, {PER_POINT[key]} ({told})")
    return "What one point averages: " + "; ".join(parts) + "." if parts else ""


def mark_counts(ax, points: list[tuple], counts: list, unit: str, color, line: int) -> str:
    """Write beside each point the plays it averages (`counts`, by point); returns the legend's note: the count
    once when every point has the same one, else what the small numbers are (beyond MARKED points, too many to
    read: the range)."""
    known = [(x, y, n) for (x, y), n in zip(points, counts) if n is not None and y == y]
    if not known:
        return ""
    if len({n for *_, n in known}) == 1:
        return f" ({known[0][2]} {unit} each)"
    if len(known) > MARKED:
        return f" ({min(n for *_, n in known)}-{max(n for *_, n in known)} {unit} a point)"
    offset = [(0, 5), (0, -11), (7, -3), (-7, -3), (0, 12)][line % 5]   # lines at one point: their numbers apart
    for x, y, n in known:
        ax.annotate(str(n), (x, y), textcoords="offset points", xytext=offset, ha="center", fontsize=7, color=color)
    return f" (small numbers: {unit} per point)"


def plot_lines(ax, records: list[dict], keys: list[str], starts: list[int], config: dict | None = None) -> list[str]:
    """One line per key over steps, and a dashed line where each window in `starts` begins; a curve is broken
    there (other games), and at a step that did not log it (its phase did not run there: a gap, not a 0). Only
    held-out scores (SCHEDULED: every --eval-every steps) connect across the steps between. Keys identical at every
    step are one line, labelled 'a = b'; with the run's `config` a point says how many plays it averages
    (mark_counts). Returns the lines' labels (keys without data draw none)."""
    config, labels = config or {}, []
    for group in identical_groups(keys, records):
        key = group[0]
        points = [(r["step"], number(r.get(key))) for r in records]
        points = [(s, math.nan if v is None else v) for s, v in points   # NaN: matplotlib's break
                  if v is not None or not key.startswith(SCHEDULED)]
        if any(not math.isnan(v) for _, v in points):
            counts = dict(zip([r["step"] for r in records], [averaged_over(key, r, config) for r in records]))
            points = sorted(points + [(step - 0.5, math.nan) for step in starts])
            style, marker = STYLES[len(labels) % len(STYLES)]
            line, = ax.plot(*zip(*points), linestyle=style, marker=marker, markersize=4, alpha=0.85)
            unit = "attempts" if key == "designer/valid_rate" else "plays"
            note = mark_counts(ax, points, [counts.get(x) for x, _ in points], unit, line.get_color(), len(labels))
            labels.append(" = ".join(group) + note)
            line.set_label(labels[-1])
    for k, step in enumerate(starts):   # between the window's last step and the next one's first
        ax.axvline(step - 0.5, color="gray", linestyle="--", linewidth=1, label=None if k else WINDOW)
    step_axis(ax, records)
    if keys:
        low, high = y_limits(keys, records, 0.12 if ax.texts else 0.04)   # room for the numbers beside points
        ax.set_ylim(low, high)
        signed = any(kind(key) == "reward" or any((number(r.get(key)) or 0) < 0 for r in records) for key in keys)
        if signed:   # the sign of a reward-like value is the message
            ax.axhline(0, color="black", linewidth=0.8)
    return labels


def step_axis(ax, records: list[dict]) -> None:
    """Whole-number step ticks; half a step of margin, so a one-step run shows one tick, not -0.04..0.04."""
    steps = [r["step"] for r in records]
    if steps:
        ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def line_figure(path: Path, title: str, ylabel: str, records: list[dict], keys: list[str], starts: list[int],
                config: dict | None = None) -> Figure:
    """The keys on one axis (its y range by their kind: y_limits), saved to `path`."""
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    plot_lines(ax, records, keys, starts, config)   # keys with data only (write_report leaves a figure with none out)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.16), frameon=False)   # under the axes: hides no point
    ax.set(title=title, xlabel="step", ylabel=ylabel)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return fig


def rejections_figure(path: Path, records: list[dict], starts: list[int]) -> Figure:
    """Stacked bars: rejected designer attempts per step, by the sandbox's reason."""
    reasons = sorted({k for r in records for k in (r.get("designer/rejections") or {})})
    fig = Figure(figsize=(6.4, 3.6))
    ax = fig.subplots()
    steps, bottom = [r["step"] for r in records], [0.0] * len(records)
    for reason in reasons:
        counts = [number((r.get("designer/rejections") or {}).get(reason)) or 0.0 for r in records]
        ax.bar(steps, counts, bottom=bottom, label=reason)
        bottom = [b + c for b, c in zip(bottom, counts)]
    plot_lines(ax, records, [], starts)
    if reasons:   # outside the axes, so that no bar hides under it
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    else:   # attempts, all valid
        ax.text(0.5, 0.5, "no rejected attempts", ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set(title="Rejected designer attempts by reason", xlabel="step", ylabel="attempts")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return fig


def numeric(keys: list[str], records: list[dict]) -> list[str]:
    return [k for k in keys if any(number(r.get(k)) is not None for r in records)]


def panels_figure(path: Path, records: list[dict], keys: list[str], starts: list[int],
                  config: dict | None = None) -> Figure:
    """Small multiples, one panel per metric (each with data; their scales differ: lines of code vs shares), titled
    with the metric and the plays a point averages."""
    cols = 3
    rows = max(1, math.ceil(len(keys) / cols))
    fig = Figure(figsize=(9.6, 2.6 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, key in zip(axes.flat, keys):
        label = plot_lines(ax, records, [key], starts, config)[0]
        ax.set_title(label.replace(" (", "\n(", 1), fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return fig


# -----------------------------------------------------------------------------------------------------------
# pages

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}}
table{{border-collapse:collapse;font-size:12px}}div.wide{{overflow-x:auto}}td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}
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
    """An HTML table; a metric's name breaks after its role ("loss/<br>grad_norm"), so that the per-step table's
    columns fit the page (tests/test_report.py measures them)."""
    head = "".join(f"<th>{esc(h).replace('/', '/<br>')}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def config_rows(cfg: dict, records: list[dict], knobs: list[str]) -> list[list]:
    """The config table's rows; `steps` is what was asked for, so the steps that ran (logged) follow it."""
    ran = sum(1 for r in records if r["step"] >= 0)
    return [row for k in knobs if k in cfg
            for row in ([["steps asked", cfg[k]], ["steps ran", ran]] if k == "steps" else [[k, cfg[k]]])]


def index_page(run_dir: Path, header: dict, records: list[dict], figures: list[Figured], left_out: list[str]) -> str:
    cfg = header.get("config", {})
    knobs = ["model", "preset", "steps", "seed", "designer_reward", "no_designer_training", "no_memory",
             "no_corpus", "env_pool", "skills", "envs_per_step", "plays", "hinted_plays"]
    parts = [f"<h1>spade-mini run {esc(run_dir.resolve().name)}</h1>",
             '<p><a href="envs.html">environments of every step</a> &middot; '
             '<a href="designs.html">every designer attempt, with its verdict</a></p>',
             table(config_rows(cfg, records, knobs), ["config", "value"])]
    if not records:
        parts.append('<p class="note"><b>This run has no completed steps yet</b> (metrics.jsonl holds no step '
                     "record). Rerun the report after the first step finishes.</p>")
        return PAGE.format(title="spade-mini report", body="\n".join(parts))
    samples = [number(r.get(k)) for r in records for k in ("loss/samples_agent", "loss/samples_designer")]
    if any(n is not None for n in samples) and not any(samples):
        parts.insert(1, "<p><b>Nothing was trained in this run</b>: no step had a sample to learn from "
                        "(loss/samples_agent and loss/samples_designer are 0 at every step), so the weights are the "
                        "base model's.</p>")
    if cfg.get("hinted_plays") == 0:
        parts.append(f'<p class="note">This run had no hinted plays (--hinted-plays 0): {" and ".join(HINTED)} '
                     "would only repeat the unhinted return and 0, so they are not shown.</p>")
    every = cfg.get("regen_interval")
    parts.append("<h2>Per step</h2>")
    if isinstance(every, int):
        parts.append(f'<p class="note">{window_note(every)}</p>')
    parts.append('<div class="wide">' + table([[r["step"]] + [fmt(r.get(k)) for k in TABLE] for r in records],
                                              ["step"] + TABLE) + "</div>")
    for file, title, caption, numbers in figures:
        parts.append(f"<h2>{esc(title)}</h2>")
        if file:
            parts.append(f'<img src="{esc(file)}" alt="{esc(title)}">')
        if numbers:
            parts.append(table(numbers, ["one value in the run", "value", "logged at"]))
        parts.append(f'<p class="note">{esc(caption)}</p>')
    if left_out:
        parts.append(f'<p class="note">Not drawn, nothing of it logged in this run: {esc("; ".join(left_out))}.</p>')
    return PAGE.format(title="spade-mini report", body="\n".join(parts))


def window_note(every: int) -> str:
    """What the figures say about regeneration windows, once above them."""
    if every == 1:
        return ("Every step plays new environments (--regen-interval 1), so a change from one step to the next may be "
                "the games changing as much as the training.")
    return (f"New environments every {every} steps (--regen-interval {every}): a dashed line in the figures marks "
            "where a window begins, and curves break there, since a jump at it is the games changing, not the "
            "training; compare steps within a window.")


def render_transcript(episode: dict) -> str:
    """One logged episode: its outcome, then each turn's fields (whatever the rollout recorded) escaped."""
    head = (f"<p>seed {esc(episode.get('seed'))}, {'with' if episode.get('hinted') else 'without'} hint: return "
            f"{fmt(episode.get('return', episode.get('reward')))} in {esc(episode.get('turns'))} turns"
            f"{', terminated' if episode.get('terminated') else ''}"
            f"{', failure ' + esc(episode['failure']) if episode.get('failure') else ''}</p>")
    turns = []
    for i, turn in enumerate(episode.get("transcript") or []):
        turn = turn if isinstance(turn, dict) else {"text": turn}
        fields = [(k, v) for k, v in turn.items() if k != "turn"   # turn 0 is the first observation
                  and not (k == "action" and v == turn.get("reply"))]  # a reply without \\boxed{} is its action
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
        f'<h3 id="{esc(anchor)}">step {step} &middot; {esc(py.stem)} &middot; {esc(meta.get("skill") or meta.get("origin", "?"))}</h3>',
        table(scores, ["score", "value"]) if scores else '<p class="note">no scores file</p>',
        f"<p>hint:</p><blockquote>{esc(meta.get('hint') or '(none)')}</blockquote>",
        f"<details><summary>code ({len(py.read_text(errors='replace').splitlines())} lines)</summary>"
        f"<pre><code>{esc(py.read_text(errors='replace'))}</code></pre></details>",
        "<p>example episode:</p>" + (render_transcript(episode) if episode else
                                     '<p class="note">no episode of this environment was logged</p>'),
    ])


def envs_page(run_dir: Path, samples: list[dict]) -> str:
    """Every envs/step_NNNNN/*.py with its .json scores and the first logged episode of (step, env_id)."""
    episodes: dict[tuple, dict] = {}
    for r in samples:
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


def designs_page(samples: list[dict]) -> str:
    """Every designer attempt of samples.jsonl: step, slot, attempt, skill, verdict, reason and what it wrote."""
    sections = []
    for r in samples:
        if r.get("kind") != "design":
            continue
        verdict = r.get("verdict") or {}
        written = r.get("code") if r.get("code") is not None else r.get("text", "")
        sections.append("\n".join([
            f"<h3>step {esc(r.get('step'))} &middot; slot {esc(r.get('slot'))} &middot; attempt "
            f"{esc(r.get('attempt'))} &middot; {esc(r.get('skill'))}: "
            f"{'valid' if verdict.get('valid') else 'rejected'} ({esc(verdict.get('reason'))})</h3>",
            f'<p class="note">{esc(verdict.get("detail", ""))}</p>' if verdict.get("detail") else "",
            f"<details><summary>{'program' if r.get('code') is not None else 'answer (no python block)'} "
            f"({len(str(written).splitlines())} lines)</summary><pre><code>{esc(written)}</code></pre></details>"]))
    body = ['<h1>Designer attempts</h1><p><a href="index.html">back to the figures</a></p>',
            "\n".join(sections) or '<p class="note">no designer attempt logged (an --env-pool run designs none)</p>']
    return PAGE.format(title="spade-mini designer attempts", body="\n".join(body))


# -----------------------------------------------------------------------------------------------------------
# entry points

def write_report(run_dir: str | Path) -> Path:
    """Write RUN_DIR/report/{index.html, envs.html, designs.html, *.png}; returns the index path. Raises FileNotFoundError
    for a directory that is not a run. A run with no completed step gets a page saying so, and no figures; a figure
    with nothing logged (GPU memory on a CPU run, held-out scores without --eval-every) is left out and named."""
    return report_and_steps(Path(run_dir))[0]


def report_and_steps(run_dir: Path) -> tuple[Path, int]:
    """write_report, and how many completed steps the report shows."""
    if not ((run_dir / "metrics.jsonl").exists() or (run_dir / "config.json").exists()):
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl or config.json (not a spade-mini run directory)")
    header, records = load_run(run_dir)   # each file read once: a bad line is warned about once
    if header.get("config", {}).get("hinted_plays") == 0:   # R_hint fell back to the unhinted return: no curve
        records = [{k: v for k, v in r.items() if k not in HINTED} for r in records]
    records = without_phases_not_run(records, header.get("config", {}))
    samples = runs.read_jsonl(run_dir / "samples.jsonl")
    out = run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    starts = window_starts(header.get("config", {}), records)
    figures, shown, left_out = [], set(), []
    for spec in FIGURES if records else []:
        (out / spec[0]).unlink(missing_ok=True)   # a previous report's figure of it
        figure = draw_figure(out, spec, records, starts, shown, header.get("config", {}))
        if figure:
            figures.append(figure)
        else:
            left_out.append(spec[1] + NOT_LOGGED.get(spec[0], ""))
    (out / "envs.html").write_text(envs_page(run_dir, samples), encoding="utf-8")
    (out / "designs.html").write_text(designs_page(samples), encoding="utf-8")
    index = out / "index.html"
    index.write_text(index_page(run_dir, header, records, figures, left_out), encoding="utf-8")
    return index, len(records)


def draw_figure(out: Path, spec: tuple, records: list[dict], starts: list[int], shown: set,
                config: dict) -> Figured | None:
    """One entry of FIGURES, drawn into out/ (its keys that an earlier figure drew are skipped, and added to
    `shown`); None when nothing of it was logged. A metric with one value in the run (the same at every step it was
    logged, or logged at one step) is a number, a row of the figure's table, not a flat line or a one-point plot: in
    a panel figure each such metric, in a one-axis figure all of them when none has a second point, in the rejections
    figure a run that designed at one step. A figure left with nothing to draw is that table alone (no image)."""
    file, title, ylabel, keys, caption = spec
    keys = [k for k in expand(keys, records) if k not in shown and not (file == "env_stats.png" and k in PLAIN)]
    if file == "other.png":
        keys = [k for k in sorted({k for r in records for k in r}) if k not in shown and k != "step"]
    designed = [r for r in records if number(r.get("designer/attempts"))]
    drawn = (["designer/rejections"] if designed else []) if file == "rejections.png" else numeric(keys, records)
    if not drawn:
        return None
    shown |= set(drawn)
    if file == "rejections.png":
        numbers = drawn if len(designed) == 1 else []
    elif file in PANELS:
        numbers = [k for k in drawn if constant_value(k, records) is not None]
    else:
        numbers = drawn if all(sum(number(r.get(k)) is not None for r in records) == 1 for k in drawn) else []
    varying = [k for k in drawn if k not in numbers]
    if file == "rejections.png" and varying:
        rejections_figure(out / file, records, starts)
    elif file in PANELS and varying:
        panels_figure(out / file, records, varying, starts, config)
    elif varying:
        line_figure(out / file, title, ylabel, records, varying, starts, config)
    twins = [] if file in PANELS else [" and ".join(g) for g in identical_groups(varying, records) if len(g) > 1]
    notes = [caption, f"Drawn: {', '.join(varying)}." if varying else "",
             f"Identical at every step, so one line: {'; '.join(twins)}." if twins else "",
             per_point_note(varying, records, config),
             "One value in the run, so in the table instead: " + ", ".join(numbers) + "." if numbers else ""]
    rows = [number_row(k, designed if k == "designer/rejections" else records) for k in numbers]
    return Figured(file if varying else None, title, " ".join(n for n in notes if n), rows)


def number_row(key: str, records: list[dict]) -> list[str]:
    """A metric of one value as a row of its figure's table: the metric, the value, the steps that logged it."""
    logged = [r for r in records if r.get(key) is not None]
    if key == "designer/rejections":   # {reason: count} of the one step that designed
        counts = logged[0][key] if logged and isinstance(logged[0][key], dict) else {}
        value = ", ".join(f"{reason} {n}" for reason, n in sorted(counts.items())) or "none"
    else:
        value = fmt(constant_value(key, records))
    ran = {r["step"] for r in records if r["step"] >= 0}
    steps = [r["step"] for r in logged if number(r.get(key)) is not None or key == "designer/rejections"]
    where = (f"step {steps[0]} only" if len(steps) == 1 else "every step" if ran <= set(steps)
             else f"{len(steps)} of {len(ran)} steps")
    return [key, value, where]

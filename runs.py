"""The run directory: every file a run writes, written so that a crash loses nothing that was committed.

A support module (a first read of the method may skip it). A run directory holds config.json, metrics.jsonl
(the resolved config first, then one record per step), samples.jsonl (designer attempts with verdicts, window
scores, environments, a few episodes), memory.json, envs/step_NNNNN/ (each program and, at its window's end,
its scores) and checkpoints/. Files are replaced atomically or appended line by line; readers tolerate a torn
last line. Also here: the grounding corpus (files a run reads), the statistics logged about the designer's
environments (diversity, leakage, size), the step's metrics record and printed line, and the one error class
for bad user input.

No torch (numpy only, for the Vendi score), so `validate`, `play` and `report` never wait for it.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np


class InputError(ValueError):
    """A bad flag, file or run directory: the command line prints it as one line and exits 2."""


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


# ----------------------------------------------------------------------------------------------------------
# crash-safe files: replaced atomically, or append-only with a reader that tolerates a torn last line

def write_atomic(path: str | Path, text: str) -> None:
    """Write to a temp file in the same directory, fsync, rename over path: readers see old or new, never half."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)   # the rename itself survives a power cut only once the directory is synced
    finally:
        os.close(dir_fd)


def append_jsonl(path: str | Path, record: dict) -> None:
    """Append one JSON line, flush and fsync. A line counts only once its newline is written.

    subtle: after a crash the file may end in a torn line; appending to it would glue the new record onto
    the fragment and lose both, so the fragment is cut off first.
    """
    with open(path, "ab+") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.seek(0)
                data = f.read()
                f.truncate(data.rfind(b"\n") + 1)
        f.write((json.dumps(record) + "\n").encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | Path) -> list[dict]:
    """Every committed record (a line ending in a newline); a torn last line is ignored, a bad middle line
    is skipped with a counted warning. A missing file reads as empty."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")[:-1]   # the part after the last newline is uncommitted
    out, bad = [], 0
    for line in lines:
        try:
            obj = json.loads(line.decode("utf-8"))
            if not isinstance(obj, dict):
                raise ValueError("not an object")
            out.append(obj)
        except ValueError:
            bad += line.strip() != b""
    if bad:
        warn(f"skipped {bad} unreadable lines in {path}")
    return out


# ----------------------------------------------------------------------------------------------------------
# the run directory

class Run:
    """The files of one run directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.config, self.metrics = self.root / "config.json", self.root / "metrics.jsonl"
        self.samples, self.memory = self.root / "samples.jsonl", self.root / "memory.json"
        self.checkpoints = self.root / "checkpoints"

    def log_metrics(self, record: dict) -> None:
        append_jsonl(self.metrics, record)

    def log_sample(self, record: dict) -> None:
        append_jsonl(self.samples, record)

    def env_dir(self, step: int) -> Path:
        return self.root / "envs" / f"step_{step:05d}"

    def latest_checkpoint(self) -> Path | None:
        done = sorted(p for p in self.checkpoints.glob("step_*") if (p / "state.json").exists())
        return done[-1] if done else None

    def rewind(self, next_step: int) -> None:
        """Forget everything logged for steps >= next_step (they will be recomputed after a resume)."""
        for path in (self.metrics, self.samples):
            if path.exists():
                kept = [r for r in read_jsonl(path) if r.get("step", -1) < next_step or "config" in r]
                write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
        for stale in (self.root / "envs").glob("step_*"):
            if int(stale.name.split("_")[1]) >= next_step:
                shutil.rmtree(stale, ignore_errors=True)


def existing_run(root: str | Path, flag: str) -> Run:
    """A run directory named by a flag (--resume, --run); InputError unless it holds config.json."""
    run = Run(root)
    if not run.config.exists():
        raise InputError(f"{flag}: {root} has no config.json (not a spade-mini run directory)")
    return run


def open_run(cfg):
    """Create a fresh run directory for the config dataclass `cfg`, or reopen one for --resume.
    Returns (config, run, first step); a resume takes the saved config with the new --steps."""
    if cfg.resume:
        run = existing_run(cfg.resume, "--resume")
        ckpt = run.latest_checkpoint()
        try:
            saved = json.loads(run.config.read_text())
            cfg = type(cfg)(**{**saved, "steps": cfg.steps, "resume": str(run.root), "out": str(run.root)})
            start = json.loads((ckpt / "state.json").read_text())["step"] + 1 if ckpt else 0
        except (ValueError, TypeError, KeyError) as err:   # corrupt JSON, or a config of another version
            raise InputError(f"--resume: {run.root} has an unreadable config.json or checkpoint ({err})") from err
        if ckpt is None:
            run.memory.unlink(missing_ok=True)  # the memory of a step that never reached a checkpoint
        run.rewind(start)
        return cfg, run, start
    run = Run(cfg.out or time.strftime("runs/%Y%m%d-%H%M%S"))
    if run.metrics.exists():
        raise InputError(f"--out: {run.root} already holds a run; use --resume {run.root} or another --out")
    run.root.mkdir(parents=True, exist_ok=True)
    cfg = dataclasses.replace(cfg, out=str(run.root))
    write_atomic(run.config, json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
    return cfg, run, 0


def fault_point(name: str, step: int) -> None:
    """Crash-safety test hook: SPADE_MINI_KILL_AT=<name>:<step> makes the process SIGKILL itself right here."""
    if os.environ.get("SPADE_MINI_KILL_AT") == f"{name}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


# ----------------------------------------------------------------------------------------------------------
# the grounding corpus

def load_corpus(path: str | Path | None, min_words: int = 150) -> list[str]:
    """Documents for the designer to read, whole (the designer's phase cuts each to --doc-words, once).

    None -> real human-written documentation that ships with every machine that has torch: Python's
    `pydoc_data.topics` (the language reference) and sympy's docstrings (sympy comes with torch), those of
    at least min_words words, in a fixed order. A path -> a SPICE-style jsonl, one {"text" or "orig_doc"}
    per line; bad lines are skipped with one counted warning.
    """
    docs = _bundled_docs(min_words) if path is None else _jsonl_docs(Path(path))
    if not docs:
        raise InputError(f"no usable documents in {path or 'the bundled corpus'}")
    return docs


def _bundled_docs(min_words: int) -> list[str]:
    from pydoc_data.topics import topics
    docs = [topics[k] for k in sorted(topics)]
    try:
        import sympy
    except ImportError:
        warn("sympy is not installed; the bundled corpus is Python's documentation only")
        sympy = None
    for name in sorted(dir(sympy)) if sympy else []:
        # note: inspect.getdoc inherits class docstrings, so duplicates are dropped below
        doc = None if name.startswith("_") else inspect.getdoc(getattr(sympy, name))
        docs.append(doc or "")
    return [d for d in dict.fromkeys(docs) if len(d.split()) >= min_words]


def _jsonl_docs(path: Path) -> list[str]:
    if not path.is_file():
        raise InputError(f"corpus file not found: {path}")
    docs, bad, lines = [], 0, path.read_bytes().splitlines()
    for line in lines:
        try:
            obj = json.loads(line.decode("utf-8"))
            text = obj.get("text") or obj.get("orig_doc")
            if not isinstance(text, str) or not text.strip():
                raise ValueError("no 'text' or 'orig_doc' string")
            docs.append(text)
        except (ValueError, AttributeError):   # bad JSON, bad UTF-8, not an object, no text
            bad += line.strip() != b""
    if bad:
        warn(f"skipped {bad} of {len(lines)} corpus lines in {path} (bad JSON or no 'text'/'orig_doc' field)")
    return docs


# ----------------------------------------------------------------------------------------------------------
# statistics of the designer's environments: diversity, leakage, size

def vendi_score(similarity: np.ndarray) -> float:
    """Vendi score exp(-sum_i l_i log l_i), l_i = eigenvalues of K / n: the effective number of distinct items.

    K must be symmetric positive semi-definite with ones on the diagonal. Worked example,
    K = [[1, 0.5], [0.5, 1]]: K / 2 has eigenvalues 0.75 and 0.25; entropy = -(0.75 ln 0.75 + 0.25 ln 0.25)
    = 0.2158 + 0.3466 = 0.5623; exp(0.5623) = 1.7548. Identical items score 1, orthogonal ones score n.

    >>> round(vendi_score(np.array([[1.0, 0.5], [0.5, 1.0]])), 4)
    1.7548
    >>> round(vendi_score(np.ones((3, 3))), 6), round(vendi_score(np.eye(3)), 6)
    (1.0, 3.0)
    """
    k = np.asarray(similarity, dtype=np.float64)
    n = k.shape[0]
    if n == 0:
        return 0.0
    eig = np.linalg.eigvalsh(k / n)
    eig = eig[eig > 1e-12]  # subtle: round-off gives tiny negative eigenvalues; 0 log 0 = 0 anyway
    return float(math.exp(-np.sum(eig * np.log(eig))))


_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+|\S")


def code_vectors(codes: list[str], n: int = 3) -> np.ndarray:
    """Binary bag of token n-grams per program, shape (len(codes), vocabulary): the diversity representation.

    Tokens are identifiers, digit runs and single punctuation characters (a regex, so broken code works
    too); a program's vector marks which n-grams of consecutive tokens it contains. Presence rather than
    counts keeps boilerplate such as `self .` from dominating the cosine.

    >>> code_vectors(["a = 1", "a = 1", "b = 2"], n=2).sum(axis=1).tolist()
    [2.0, 2.0, 2.0]
    """
    grams = []
    for code in codes:
        toks = _TOKEN.findall(code)
        grams.append({tuple(toks[i:i + n]) for i in range(max(1, len(toks) - n + 1))} if toks else set())
    vocab = {g: i for i, g in enumerate(sorted(set().union(*grams)))} if grams else {}
    x = np.zeros((len(codes), len(vocab)), dtype=np.float32)  # 0/1 entries: float32 counts stay exact
    for row, gs in enumerate(grams):
        x[row, [vocab[g] for g in gs]] = 1.0
    return x


def diversity(codes: list[str], n: int = 3) -> float:
    """Vendi score / n of programs under the cosine kernel of code_vectors: 1/n if all identical, ~1 if unrelated.

    Worked example: two identical programs have cosine 1, K = all ones, Vendi 1, so 1 / 2 = 0.5; two with no
    shared 3-gram have K = I, Vendi 2, so 2 / 2 = 1.0. (The paper: 0.68 with corpus grounding, 0.04 without.)

    >>> diversity(["x = 1 + 2", "x = 1 + 2"]), diversity(["x = 1 + 2", "def f(): return y"])
    (0.5, 1.0)
    """
    if not codes:
        return 0.0
    x = code_vectors(codes, n)
    shared = (x @ x.T).astype(np.float64)       # (n, n) number of n-grams two programs share
    size = np.maximum(np.diag(shared), 1.0)     # an empty program is similar only to itself (diagonal below)
    k = shared / np.sqrt(np.outer(size, size))  # cosine of the 0/1 vectors
    np.fill_diagonal(k, 1.0)
    return vendi_score(k) / len(codes)


_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_VALUE = re.compile(r"-?\d+(?:\.\d+)?|[A-Za-z_]+")


def solution_keys(solution_actions: str | list[str] | None) -> set[str]:
    """The key values of a reference solution: the numbers in its boxed commands, or their words if none.

    Numbers win because commands usually pair a verb with the values that matter ("guess 37": 37 is the
    secret, "guess" is not); a solution without numbers (directions, a word answer) is keyed by its words.

    >>> sorted(solution_keys(r"\\boxed{guess 37}")), sorted(solution_keys([r"\\boxed{Up}", r"\\boxed{left}"]))
    (['37'], ['left', 'up'])
    """
    if not solution_actions:
        return set()   # the environment has no solution(): nothing can leak
    text = "\n".join([solution_actions] if isinstance(solution_actions, str) else solution_actions)
    inner = _BOXED.findall(text) or [text]
    values = [v.lower() for part in inner for v in _VALUE.findall(part)]
    numbers = {v for v in values if v[-1].isdigit()}
    return numbers or set(values)


def _contains_keys(text: str, solution_actions: str | list[str] | None) -> bool:
    keys = solution_keys(solution_actions)
    return bool(keys) and keys <= {v.lower() for v in _VALUE.findall(text)}


def hint_leak(hint: str, solution_actions: str | list[str] | None) -> bool:
    """True when the hint contains every key value of the solution as a whole token (it gives the answer away).

    >>> hint_leak("Try 37.", r"\\boxed{guess 37}"), hint_leak("Halve the range each turn.", r"\\boxed{guess 37}")
    (True, False)
    """
    return _contains_keys(hint, solution_actions)


def opening_leak(first_obs: str, solution_actions: str | list[str] | None) -> bool:
    """True when the first observation already shows every key value of the solution (the paper's "the physics
    opening prints the governing equation"). note: a heuristic; an opening that lists all moves matches too.

    >>> opening_leak("The answer is 12. Answer in \\\\boxed{}.", r"\\boxed{12}")
    True
    """
    return _contains_keys(first_obs, solution_actions)


def loc(code: str) -> int:
    """Lines of code: non-blank lines that are not only a comment.

    >>> loc("import math\\n\\n# a comment\\nx = 1  # counted\\n")
    2
    """
    return sum(1 for line in code.splitlines() if line.strip() and not line.strip().startswith("#"))


def environment_stats(played: list, references: list[tuple[str, list[str] | None]]) -> dict:
    """Statistics of a window's new environments (train.PlayedEnv, at the first step), each into its .stats:
    size, hint and opening leakage against its reference (first observation, solution actions), and the
    window's diversity."""
    for e, (first_obs, solution) in zip(played, references):
        e.stats = dict(loc=loc(e.code), has_solution=bool(solution),
                       hint_leak=bool(solution) and hint_leak(e.hint, solution),
                       opening_leak=bool(solution) and opening_leak(first_obs, solution))
    with_solution = [e for e in played if e.stats["has_solution"]]

    def rate(key):
        return sum(e.stats[key] for e in with_solution) / len(with_solution) if with_solution else None
    return {"env/loc_mean": sum(e.stats["loc"] for e in played) / len(played) if played else None,
            "env/hint_leak_rate": rate("hint_leak"), "env/opening_leak_rate": rate("opening_leak"),
            "env/diversity": diversity([e.code for e in played]) if len(played) > 1 else None}


# ----------------------------------------------------------------------------------------------------------
# what one step writes: its metrics record (glossary in the README), samples, the printed line

def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def step_metrics(step: int, window, live: list, first: bool, last: bool, extra: dict) -> dict:
    """The metrics.jsonl record of one step. Designer numbers appear at a window's first step (attempts) and
    last step (rewards); R_hint and regret at its first step (the hinted plays)."""
    attempts = window.attempts if first else []
    reasons = Counter(d.verdict.reason for d in attempts if not d.verdict.valid)
    episodes = [ep for e in live for ep in e.episodes]
    failures = Counter(ep.failure for ep in episodes if ep.failure)
    scored = [e for e in live if not e.hung]
    designed = [e for e in window.envs if e.design is not None] if last else []
    solved = [ep for ep in episodes if ep.terminated]
    at_first = scored if first else []
    r_hint = [_mean(e.hinted) if e.hinted else _mean(e.unhinted[0]) for e in at_first]
    return {
        "step": step, "skills": window.skills, "window/start": window.start, "window/length": window.length,
        "designer/attempts": len(attempts),
        "designer/valid_rate": sum(d.verdict.valid for d in attempts) / len(attempts) if attempts else None,
        "designer/rejections": dict(reasons),
        "designer/reward_mean": _mean(e.scores["designer_reward"] for e in designed) if designed else None,
        "env/count": len(live),
        "env/hung": sum(e.hung for e in live),
        "env/regret": _mean(h - _mean(e.unhinted[0]) for h, e in zip(r_hint, at_first)) if at_first else None,
        "agent/return_nohint": _mean(_mean(e.unhinted[-1]) for e in scored) if scored else None,
        "agent/return_hint": _mean(r_hint) if at_first else None,
        "agent/win_rate": _mean(_mean(r > 0 for r in e.unhinted[-1]) for e in scored) if scored else None,
        "agent/turns_mean": _mean(ep.turns for ep in episodes) if episodes else None,
        "env/turns_to_solve": _mean(ep.turns for ep in solved) if solved else None,
        "env/one_turn_share": _mean(any(ep.terminated and ep.turns == 1 for ep in e.episodes)
                                    for e in live) if live else None,
        **{f"sandbox/{name}": reasons[reason] + failures[reason] for name, reason in (
            ("timeouts", "timeout"), ("memory_kills", "memory"), ("forbidden", "forbidden"), ("crashes", "crash"),
            ("bad_replies", "bad_reply"))},
        **extra,
    }


def log_samples(run: Run, step: int, window, live: list, first: bool, window_records: list,
                episodes_logged: int) -> None:
    """samples.jsonl: every designer attempt with its verdict (first step), the window's score input and
    output and every environment with hint and scores (last step), the first `episodes_logged` episodes."""
    for d in window.attempts if first else []:
        run.log_sample(dict(step=step, kind="design", slot=d.slot, attempt=d.attempt, skill=d.skill,
                            doc=d.doc_preview, text=d.text, code=d.code, verdict=d.verdict.to_json()))
    for record in window_records:
        run.log_sample(dict(step=step, **record))
    for e in window.envs if window_records else []:
        run.log_sample(dict(step=step, kind="env", env_id=e.env_id, skill=e.skill, origin=e.origin, hint=e.hint,
                            hung=e.hung,
                            **e.stats, **e.scores))
    # round-robin over environments (play i unhinted, then hinted), so every environment shows one first
    order = sorted((ep for e in live for ep in e.episodes), key=lambda ep: (ep.spec.key[2], ep.spec.key[0],
                                                                            ep.spec.key[1]))
    for ep in order[:episodes_logged]:
        run.log_sample(dict(step=step, kind="episode", env_id=live[ep.spec.key[0]].env_id,
                            hinted=ep.spec.hint is not None, seed=ep.spec.seed, **{"return": ep.episode_return},
                            turns=ep.turns, terminated=ep.terminated, truncated=ep.truncated,
                            failure=ep.failure, transcript=ep.transcript))


def print_step(record: dict) -> None:
    def f(key, fmt="{:.2f}"):
        value = record.get(key)
        return "-" if value is None else fmt.format(value)
    print(f"step {record['step']:>4} | valid {f('designer/valid_rate')} of {record['designer/attempts']} "
          f"| envs {record['env/count']} | R_nohint {f('agent/return_nohint')} R_hint {f('agent/return_hint')} "
          f"regret {f('env/regret', '{:+.2f}')} | grad {f('loss/grad_norm', '{:.3f}')} "
          f"| {record['perf/step_s']:.0f}s", flush=True)


SUMMARY = (("valid", "designer/valid_rate", 6, 2), ("envs", "env/count", 4, 0), ("R_nohint", "agent/return_nohint", 8, 2),
           ("R_hint", "agent/return_hint", 7, 2), ("regret", "env/regret", 7, 2), ("n_agent", "loss/samples_agent", 7, 0),
           ("n_design", "loss/samples_designer", 8, 0), ("grad", "loss/grad_norm", 7, 3), ("sec", "perf/step_s", 5, 0))


def print_summary(run: Run) -> None:
    """The end-of-run table: one row per step, the numbers that show learning and that an update happened."""
    records = [r for r in read_jsonl(run.metrics) if isinstance(r.get("step"), int) and r["step"] >= 0]
    print(f"\nrun directory: {run.root}")
    print(f"{'step':>4} " + " ".join(f"{name:>{w}}" for name, _, w, _ in SUMMARY))
    for r in records:
        cells = []
        for _, key, w, p in SUMMARY:
            c = r.get(key)
            cells.append("-".rjust(w) if c is None else f"{c:>{w}.{p}f}" if isinstance(c, float) else f"{c:>{w}}")
        print(f"{r['step']:>4} " + " ".join(cells))


def tensorboard_writer(enabled: bool, run: Run):
    """A TensorBoard SummaryWriter under RUN_DIR/tb, or None; imported only when asked for (--tensorboard)."""
    if not enabled:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise InputError("--tensorboard needs the tensorboard package (pip install tensorboard)") from err
    return SummaryWriter(str(run.root / "tb"))

"""A run: its configuration (every knob, in `Config`) and its directory, written so that a crash loses nothing.

`Config` is worth reading first: one line per knob with its meaning and unit; the presets are small dicts of
overrides. The rest is a support module (a first read of the method may skip it). A run directory holds
config.json, metrics.jsonl (the resolved config first, then one record per step), samples.jsonl (designer
attempts with verdicts, window scores, environments, a few episodes), memory.json, envs/step_NNNNN/ (each
program and, at its window's end, its scores) and checkpoints/. Files are replaced atomically or appended line
by line; readers tolerate a torn last line. Also here: the grounding corpus (files a run reads), the step's
metrics record and printed line, and the one error class for bad user input.

Standard library only, so `validate`, `play` and `report` never wait for torch or numpy.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import os
import shutil
import signal
import sys
import sysconfig
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import regret


# -----------------------------------------------------------------------------------------------------------
# the configuration: every knob in one place; the command line (cli.py) is generated from this class

@dataclass
class Config:
    # run
    preset: str = "tiny"                # tiny | 4b | 8b | 30b-a3b: a set of values (PRESETS); flags override
    setting: str = "games"              # games (text games, \boxed{} actions) | tool_use (tool environments, BFCL style)
    model: str = "smollm2-135m"         # HF id, local dir, .gguf file, smollm2-135m (bundled), tiny-random (tests)
    steps: int = 2                      # total self-play steps of the run (resume continues up to this)
    seed: int = 0                       # root of every derived seed
    out: str = ""                       # run directory ('' -> runs/<date>-<time>)
    resume: str = ""                    # run directory to continue from its last checkpoint
    cache_dir: str = "~/.cache/spade-mini"  # converted model weights (GGUF -> safetensors)
    # environments: where they come from
    corpus: str = ""                    # SPICE-style jsonl ('text' or 'orig_doc'); '' -> bundled Python/sympy docs
    doc_words: int = 6000               # a grounding document is truncated to this many words
    skills: str = ""                    # comma-separated skill names or indices 0-5 ('' -> all six)
    skills_per_step: int = 1            # k skills active per step, round-robin
    envs_per_step: int = 4              # G environment slots per step
    design_attempts: int = 5            # attempts per slot, a fresh document each attempt
    regen_interval: int = 4             # R: new environments every R steps, each played for the whole window
    env_pool: str = ""                  # folder of *.py environments: agent-only training on a fixed pool
    backfill: str = ""                  # folder of *.py environments that fill slots the designer left empty
    # play
    plays: int = 4                      # P unhinted plays per environment (trained)
    hinted_plays: int = 4               # H hinted plays per environment (never trained)
    max_turns: int = 4                  # turns per episode (environments default to 12; the runner caps)
    tool_rounds: int = 8                # tool_use: replies per episode that only call tools (they take no turn)
    # generation
    designer_max_new_tokens: int = 512  # tokens for one environment program
    hint_max_new_tokens: int = 96       # tokens for one hint (then cut to 100 words)
    agent_max_new_tokens: int = 128     # tokens per agent turn
    agent_max_episode_tokens: int = 1024  # generated tokens per episode, all turns together
    temperature: float = 0.7            # sampling temperature (log-probs are taken at the same temperature)
    top_p: float = 0.95                 # nucleus sampling
    top_k: int = 20                     # top-k sampling
    hint_temperature: float = 0.3       # sampling temperature of the hints (the official code's)
    thinking: bool = False              # hybrid thinking models think, every role; parsed after </think>
    static_cache: bool = False          # CUDA only: static KV cache with shape buckets (compiled decode)
    # rewards
    designer_reward: str = "regret"     # regret | blend | solve_rate | learning_potential
    timeout_penalty: float = regret.HANG_PENALTY  # designer reward of an environment whose play hangs
    invalid_penalty: float = 0.0        # opt-in designer reward for invalid programs (0 = no sample, the paper)
    # ablations
    no_designer_training: bool = False  # designer samples are not trained (implies --no-memory)
    no_memory: bool = False             # designer prompts get no memory examples
    no_corpus: bool = False             # cold-start designer prompt with skill concept ideas, no document
    memory_capacity: int = 200          # FIFO size of memory.json
    # optimisation
    lr: float = 5e-5                    # AdamW learning rate of the LoRA weights
    lora_r: int = 16                    # LoRA rank
    lora_alpha: int = 32                # LoRA scale numerator
    lora_dropout: float = 0.0           # LoRA dropout
    quantize: str = "auto"              # auto (NF4 on CUDA, none on CPU) | none | nf4
    gradient_checkpointing: bool = True  # recompute activations in the backward pass
    updates_per_step: int = 1           # K optimizer steps per self-play step, on shuffled 1/K mini-batches
    clip_low: float = 0.2               # PPO ratio clip below 1 (epsilon_low); binds only when K > 1
    clip_high: float = 0.28             # PPO ratio clip above 1 (epsilon_high); binds only when K > 1
    kl_beta: float = 0.0                # KL weight against the adapter-off reference
    token_budget: int = 4096            # tokens per micro-batch (gradient accumulation between them)
    max_grad_norm: float = 1.0          # gradient clipping
    # sandbox
    call_timeout: float = 5.0           # seconds per environment call (init, reset, step)
    env_memory_mb: int = 1024           # address-space limit of one environment process
    # logging
    episodes_logged: int = 4            # full episodes per step written to samples.jsonl
    checkpoint_every: int = 1           # steps between checkpoints (the last step always checkpoints)
    keep_checkpoints: int = 2           # older checkpoints are deleted
    tensorboard: bool = False           # also write TensorBoard scalars (imported lazily)
    # held-out evaluation (evaluate.py)
    eval_every: int = 0                 # steps between held-out evaluations (0 = off; the base model is step -1)
    eval_limit: int = 5                 # reasoning-gym items per category (BFCL: items) of one in-loop evaluation
    eval_suites: str = "reasoning_gym"  # held-out suites of --eval-every, comma-separated: reasoning_gym, bfcl
    eval_pool: str = ""                 # folder of held-out *.py environments scored by win rate ('' = none)


PRESETS = {
    # the CPU demo: SmolLM2-135M, a short document, few and short episodes. SmolLM2-135M almost never writes a
    # valid program, so empty slots are backfilled from examples/ (the agent side of the loop still runs; the
    # designer gets no sample for a backfilled slot)
    "tiny": dict(model="smollm2-135m", backfill=str(Path(__file__).resolve().parent / "examples"), doc_words=300,
                 envs_per_step=4, design_attempts=2, regen_interval=1, plays=4, hinted_plays=4, max_turns=3,
                 designer_max_new_tokens=512, hint_max_new_tokens=64, agent_max_new_tokens=64,
                 agent_max_episode_tokens=192, token_budget=2048),
    # one 24 GB GPU: NF4 weights 2.5 GB; 32 episodes x 2048 tokens of bf16 KV cache ~9.6 GB; 4k-token micro-batches
    "4b": dict(model="Qwen/Qwen3-4B-Instruct-2507", envs_per_step=4, plays=4, hinted_plays=4, max_turns=6,
               designer_max_new_tokens=4096, hint_max_new_tokens=160, agent_max_new_tokens=512,
               agent_max_episode_tokens=2048, temperature=0.6, lr=1e-5, lora_r=32, lora_alpha=64,
               token_budget=4096, checkpoint_every=10, steps=400),
    # one 48 GB GPU: NF4 ~5 GB; 48 episodes x 3072 tokens of KV cache ~21.7 GB
    "8b": dict(model="Qwen/Qwen3-8B", envs_per_step=6, plays=4, hinted_plays=4, max_turns=8,
               designer_max_new_tokens=6144, hint_max_new_tokens=160, agent_max_new_tokens=768,
               agent_max_episode_tokens=3072, temperature=0.6, lr=1e-5, lora_r=32, lora_alpha=64,
               token_budget=4096, checkpoint_every=10, steps=400),
    # one 80 GB GPU: bitsandbytes leaves the fused MoE experts in bf16 (~57 GB); 32 episodes x 3072 tokens ~9.6 GB
    "30b-a3b": dict(model="Qwen/Qwen3-30B-A3B-Instruct-2507", envs_per_step=4, plays=4, hinted_plays=4,
                    max_turns=8, designer_max_new_tokens=6144, hint_max_new_tokens=160,
                    agent_max_new_tokens=768, agent_max_episode_tokens=3072, temperature=0.6, lr=1e-5,
                    lora_r=16, lora_alpha=32, token_budget=2048, checkpoint_every=10, steps=400),
}


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


def read_json_or_set_aside(path: Path, parse, what_next: str):
    """parse(the JSON in path); a file that does not parse (bad JSON or UTF-8, a missing key, a wrong type) is
    renamed to <path>.corrupt with a one-line warning that ends in `what_next`, and None is returned."""
    try:
        return parse(json.loads(path.read_bytes().decode("utf-8")))
    except (ValueError, KeyError, TypeError) as err:  # JSONDecodeError and UnicodeError are ValueErrors
        aside = path.with_name(path.name + ".corrupt")
        os.replace(path, aside)
        why = f"{type(err).__name__}: {err}"[:100].replace("\n", " ")
        warn(f"{path} is corrupted ({why}); moved to {aside}, {what_next}")
        return None


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


def resumed_config(cfg, keep_steps: bool = False):
    """--resume: the run's saved config (`cfg`'s dataclass) with this command's --steps (or, keep_steps, the
    saved ones); nothing is written."""
    run = existing_run(cfg.resume, "--resume")
    try:
        saved = json.loads(run.config.read_text())
        steps = saved["steps"] if keep_steps else cfg.steps
        return type(cfg)(**{**saved, "steps": steps, "resume": str(run.root), "out": str(run.root)})
    except (ValueError, TypeError, KeyError) as err:   # corrupt JSON, or a config of another version
        raise InputError(f"--resume: {run.root} has an unreadable config.json ({err})") from err


def steps_done(run: Run) -> int:
    """How many steps the run's latest complete checkpoint holds (the step a resume starts at)."""
    ckpt = run.latest_checkpoint()
    try:
        return json.loads((ckpt / "state.json").read_text())["step"] + 1 if ckpt else 0
    except (ValueError, KeyError, TypeError) as err:
        raise InputError(f"--resume: {ckpt} has an unreadable state.json ({err})") from err


def check_new_out(out: str) -> None:
    if out and Run(out).metrics.exists():
        raise InputError(f"--out: {out} already holds a run; use --resume {out} or another --out")


def open_run(cfg):
    """Create the run directory of the config dataclass `cfg` (checked, resolved), or reopen it for --resume:
    the logs are rewound to its last checkpoint and config.json records the new --steps. -> (cfg, run, first
    step)."""
    if cfg.resume:
        run = Run(cfg.resume)
        start = steps_done(run)
        if start == 0:
            run.memory.unlink(missing_ok=True)  # the memory of a step that never reached a checkpoint
        run.rewind(start)
    else:
        run = Run(cfg.out or time.strftime("runs/%Y%m%d-%H%M%S"))
        check_new_out(str(run.root))
        run.root.mkdir(parents=True, exist_ok=True)
        cfg, start = dataclasses.replace(cfg, out=str(run.root)), 0
    write_atomic(run.config, json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
    return cfg, run, start


def fault_point(name: str, step: int) -> None:
    """Crash-safety test hook: SPADE_MINI_KILL_AT=<name>:<step> makes the process SIGKILL itself right here."""
    if os.environ.get("SPADE_MINI_KILL_AT") == f"{name}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


# ----------------------------------------------------------------------------------------------------------
# the grounding corpus

def load_corpus(path: str | Path | None, min_words: int = 150, setting: str = "games") -> list[str]:
    """Documents for the designer to read, whole (the designer's phase cuts each to --doc-words, once).

    None -> real human-written documentation that ships with every machine that has torch: Python's
    `pydoc_data.topics` (the language reference) and sympy's docstrings (sympy comes with torch), those of
    at least min_words words, in a fixed order; for the tool-use setting, code: the sources of Python's own
    standard-library modules (the paper grounds it in code documents). A path -> a SPICE-style jsonl, one
    {"text" or "orig_doc"} per line; bad lines are skipped with one counted warning.
    """
    if path is None and setting == "tool_use":
        docs = _stdlib_sources(min_words)
    else:
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


def _stdlib_sources(min_words: int) -> list[str]:
    """The top-level modules of the local Python's standard library (`<stdlib>/*.py`), in name order."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    return [t for t in texts if len(t.split()) >= min_words]


def _jsonl_docs(path: Path) -> list[str]:
    if path.is_dir():
        raise InputError(f"--corpus: {path} is a directory; give a .jsonl file (one JSON object per line)")
    if not path.is_file():
        raise InputError(f"--corpus: {path}: file not found")
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
    if not docs:
        raise InputError(f"--corpus: no usable documents in {path}: each line must be a JSON object with a 'text' "
                         "or 'orig_doc' string")
    if bad:
        warn(f"skipped {bad} of {len(lines)} corpus lines in {path} (bad JSON or no 'text'/'orig_doc' field)")
    return docs


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
                            doc_preview=d.doc_preview, text=d.text, code=d.code, verdict=d.verdict.to_json()))
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


SUMMARY = (("valid", "designer/valid_rate", 6, 2), ("envs", "env/count", 4, 0),   # (column, metric, width, digits)
           ("R_nohint", "agent/return_nohint", 8, 2), ("R_hint", "agent/return_hint", 7, 2),
           ("regret", "env/regret", 7, 2), ("n_agent", "loss/samples_agent", 7, 0),
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


def log_tensorboard(writer, record: dict, step: int) -> None:
    """Every numeric role/name metric of a step as a TensorBoard scalar (nothing without --tensorboard)."""
    for k, v in record.items() if writer else ():
        if isinstance(v, (int, float)) and "/" in k:
            writer.add_scalar(k, v, step)

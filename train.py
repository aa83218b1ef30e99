"""SPADE self-play, one step at a time: design -> validate -> hint -> play -> score -> remember -> update.

One model, two roles on the same weights. Each step the Environment Designer writes executable Gym-style
environments grounded in a real document and in the environment memory; the Reasoning Agent plays every valid
one P times without and H times with a privileged hint; the designer is rewarded by hint regret (agent return
with the hint minus without); both roles then share one GRPO-style optimizer step per step. This file holds the
configuration, the loop and the command line (`spade-mini train|validate|play`); the model mechanics are in
spade_mini.py, the environment contract in envs.py, the formulas in regret.py, the sandbox in sandbox.py.

Departures from the paper and the official code: the README's numbered list ("Implementation details"), the one
place they are written down. With --regen-interval R, environments designed at one step are played for R steps
and scored at the last (SPADE_METHOD.md, "The regeneration window").
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import json
import math
import os
import random
import re
import shutil
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import envs
import regret
from isolation import isolation_report
from sandbox import Limits


# -----------------------------------------------------------------------------------------------------------
# configuration: every knob in one place; the command line is generated from this class

@dataclass
class Config:
    # run
    preset: str = "tiny"                # tiny | 4b | 8b | 30b-a3b (overrides below the command line flags)
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
    clip_low: float = 0.2               # PPO ratio clip below 1 (epsilon_low)
    clip_high: float = 0.28             # PPO ratio clip above 1 (epsilon_high)
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
    eval_limit: int = 5                 # reasoning-gym items per category of one in-loop evaluation
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


class ConfigError(ValueError):
    """A configuration or input problem that gets a one-line message, not a traceback."""


def check_config(cfg: Config) -> None:
    """Reject nonsensical values with one clear sentence."""
    if cfg.preset not in PRESETS:
        raise ConfigError(f"unknown preset {cfg.preset!r}; choose one of {', '.join(PRESETS)}")
    for name in ("steps", "envs_per_step", "design_attempts", "max_turns", "designer_max_new_tokens",
                 "agent_max_new_tokens", "agent_max_episode_tokens", "token_budget", "skills_per_step",
                 "doc_words", "memory_capacity", "lora_r", "checkpoint_every", "keep_checkpoints",
                 "env_memory_mb", "eval_limit", "regen_interval"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(cfg, name)})")
    for name in ("plays", "hinted_plays", "episodes_logged", "kl_beta", "hint_max_new_tokens", "eval_every"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 0 (got {getattr(cfg, name)})")
    if cfg.designer_reward not in regret.DESIGNER_REWARDS:
        raise ConfigError(f"--designer-reward must be one of {', '.join(regret.DESIGNER_REWARDS)}")
    if cfg.quantize not in ("auto", "none", "nf4"):
        raise ConfigError("--quantize must be auto, none or nf4")
    if not (cfg.temperature > 0 and 0 < cfg.top_p <= 1 and cfg.lr > 0 and cfg.call_timeout > 0):
        raise ConfigError("--temperature, --lr and --call-timeout must be > 0 and --top-p in (0, 1]")
    if cfg.hint_temperature < 0:
        raise ConfigError(f"--hint-temperature must be >= 0 (0 = greedy; got {cfg.hint_temperature})")
    if cfg.plays < 2:
        raise ConfigError("--plays must be >= 2: the agent advantage is a z-score within an environment's plays")
    for path, flag in ((cfg.corpus, "--corpus"), (cfg.env_pool, "--env-pool"), (cfg.eval_pool, "--eval-pool"),
                       (cfg.backfill, "--backfill")):
        if path and not Path(path).exists():
            raise ConfigError(f"{flag}: {path} does not exist")
    model_path = Path(os.path.expanduser(cfg.model))
    if (cfg.model.endswith(".gguf") or cfg.model.startswith((".", "/", "~"))) and not model_path.exists():
        raise ConfigError(f"--model: {cfg.model} does not exist")
    active_skills(cfg, 0)  # raises on unknown skill names


def active_skills(cfg: Config, step: int) -> list[str]:
    """Round-robin over the (possibly restricted) skill list, k per step.

    >>> active_skills(Config(skills_per_step=2), 2)
    ['Optimization', 'Causal Inference']
    >>> active_skills(Config(skills="0,Causal Inference"), 1)
    ['Causal Inference']
    """
    pool = list(envs.SKILLS)
    if cfg.skills:
        pool = []
        for item in cfg.skills.split(","):
            item = item.strip()
            name = envs.SKILLS[int(item)] if item.isdigit() and int(item) < len(envs.SKILLS) else item
            if name not in envs.SKILLS:
                raise ConfigError(f"--skills: unknown skill {item!r}; known: {', '.join(envs.SKILLS)}")
            pool.append(name)
    k = min(cfg.skills_per_step, len(pool))
    return [pool[(step * k + i) % len(pool)] for i in range(k)]


# -----------------------------------------------------------------------------------------------------------
# the run directory: config.json, metrics.jsonl, samples.jsonl, memory.json, envs/, checkpoints/

class Run:
    """Everything one run writes. Files are replaced atomically or appended line by line (crash-safe)."""

    def __init__(self, root: Path):
        self.root = root
        self.metrics, self.samples = root / "metrics.jsonl", root / "samples.jsonl"
        self.memory, self.checkpoints = root / "memory.json", root / "checkpoints"

    def log_metrics(self, record: dict) -> None:
        envs.append_jsonl(self.metrics, record)

    def log_sample(self, record: dict) -> None:
        envs.append_jsonl(self.samples, record)

    def env_dir(self, step: int) -> Path:
        return self.root / "envs" / f"step_{step:05d}"

    def latest_checkpoint(self) -> Path | None:
        done = sorted(p for p in self.checkpoints.glob("step_*") if (p / "state.json").exists())
        return done[-1] if done else None

    def rewind(self, next_step: int) -> None:
        """Forget everything logged for steps >= next_step (they will be recomputed after a resume)."""
        for path in (self.metrics, self.samples):
            if path.exists():
                kept = [r for r in envs.read_jsonl(path) if r.get("step", -1) < next_step or "config" in r]
                envs.write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
        for stale in (self.root / "envs").glob("step_*"):
            if int(stale.name.split("_")[1]) >= next_step:
                shutil.rmtree(stale, ignore_errors=True)


def open_run(cfg: Config) -> tuple[Config, Run, int]:
    """Create a fresh run directory, or reopen one for --resume. Returns (config, run, first step)."""
    if cfg.resume:
        root = Path(cfg.resume)
        if not (root / "config.json").exists():
            raise ConfigError(f"--resume: {root} has no config.json (not a spade-mini run directory)")
        run = Run(root)
        ckpt = run.latest_checkpoint()
        try:
            saved = json.loads((root / "config.json").read_text())
            cfg = Config(**{**saved, "steps": cfg.steps, "resume": str(root), "out": str(root)})
            start = json.loads((ckpt / "state.json").read_text())["step"] + 1 if ckpt else 0
        except (ValueError, TypeError, KeyError) as err:   # corrupt JSON, or a config of another version
            raise ConfigError(f"--resume: {root} has an unreadable config.json or checkpoint ({err})") from err
        if ckpt is None:
            run.memory.unlink(missing_ok=True)  # the memory of a step that never reached a checkpoint
        run.rewind(start)
        return cfg, run, start
    root = Path(cfg.out or time.strftime("runs/%Y%m%d-%H%M%S"))
    if (root / "metrics.jsonl").exists():
        raise ConfigError(f"--out: {root} already holds a run; use --resume {root} or another --out")
    root.mkdir(parents=True, exist_ok=True)
    cfg = dataclasses.replace(cfg, out=str(root))
    envs.write_atomic(root / "config.json", json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
    return cfg, Run(root), 0


def fault_point(name: str, step: int) -> None:
    """Crash-safety test hook: SPADE_MINI_KILL_AT=<name>:<step> makes the process SIGKILL itself right here."""
    if os.environ.get("SPADE_MINI_KILL_AT") == f"{name}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


# -----------------------------------------------------------------------------------------------------------
# what flows through one regeneration window (R steps: designed at its first, scored at its last)

@dataclass
class Design:
    """One designer attempt: the prompt it saw, what it wrote, and the sandbox's verdict."""
    slot: int
    attempt: int
    skill: str
    doc: str                            # first words of the grounding document ('' without corpus)
    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    code: str | None
    verdict: envs.Verdict


@dataclass
class PlayedEnv:
    """An environment of the current window, its hint, and the outcomes of its plays so far."""
    env_id: str
    skill: str
    code: str
    design: Design | None               # None for --env-pool and --backfill environments
    hint: str = ""
    hinted: list = dataclasses.field(default_factory=list)     # returns of the hinted plays (first step)
    unhinted: list = dataclasses.field(default_factory=list)   # returns of the unhinted plays, one list per step
    trained: list = dataclasses.field(default_factory=list)    # same shape: did the play produce tokens
    hung: bool = False                  # a play hit a step timeout: dropped for the rest of the window
    stats: dict = dataclasses.field(default_factory=dict)      # environment_stats, at the first step
    scores: dict = dataclasses.field(default_factory=dict)     # regret.score_window's row, at the last step
    episodes: list = dataclasses.field(default_factory=list)   # this step's spade_mini.Episode (not saved)


@dataclass
class Window:
    """The environments designed at step `start`, played at steps start .. start + length - 1."""
    start: int
    length: int                         # R, cut short by the end of the run
    skills: list                        # the skills designed for (round-robin over windows)
    attempts: list                      # every Design of the first step
    envs: list                          # PlayedEnv

    def to_json(self) -> dict:
        def design(d):
            return None if d is None else {**dataclasses.asdict(d), "verdict": d.verdict.to_json()}
        return {"start": self.start, "length": self.length, "skills": self.skills,
                "attempts": [design(d) for d in self.attempts],
                "envs": [{**{f.name: getattr(e, f.name) for f in dataclasses.fields(e)
                             if f.name not in ("design", "episodes")},
                          "design": self.attempts.index(e.design) if e.design else None} for e in self.envs]}

    @classmethod
    def from_json(cls, d: dict) -> "Window":
        attempts = [Design(**{**a, "verdict": envs.Verdict.from_json(a["verdict"])}) for a in d["attempts"]]
        played = [PlayedEnv(**{**e, "design": None if e["design"] is None else attempts[e["design"]]})
                  for e in d["envs"]]
        return cls(d["start"], d["length"], d["skills"], attempts, played)


def clean_hint(text: str, max_words: int = 100) -> str:
    """The hint is prose: drop code blocks, collapse whitespace, keep at most `max_words` words.

    >>> clean_hint("Try small numbers first.  ```python\\nprint(1)\\n```  Then halve.")
    'Try small numbers first. Then halve.'
    """
    text = re.sub(r"```.*?(```|$)", " ", text, flags=re.S)
    return " ".join(text.split()[:max_words])


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def limits_of(cfg: Config) -> Limits:
    return Limits(call_timeout=cfg.call_timeout, memory_mb=cfg.env_memory_mb)


def validate_all(codes: list[str | None], cfg: Config) -> list[envs.Verdict]:
    """Validate programs concurrently (None = no code block); each runs in its own sandboxed child processes."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return list(pool.map(lambda code: envs.validate(code, limits_of(cfg), max_turns=cfg.max_turns), codes))


def load_pool(folder: str, cfg: Config, flag: str = "--env-pool") -> list[tuple[str, str]]:
    """--env-pool (or --backfill): every *.py in the folder that passes validation, as (name, code), by name."""
    files = sorted(Path(folder).glob("*.py"))
    codes = [f.read_text(errors="replace") for f in files]
    verdicts = validate_all(codes, cfg)
    pool = [(f.stem, c) for f, c, v in zip(files, codes, verdicts) if v.valid]
    for f, v in zip(files, verdicts):
        if not v.valid:
            print(f"warning: {flag}: skipping {f.name} ({v.reason}: {v.detail})", file=sys.stderr)
    if not pool:
        raise ConfigError(f"{flag}: no valid environment in {folder}")
    return pool


@dataclass
class State:
    """What persists across steps (the model and optimizer, memory, corpus, slow means, the open window)."""
    cfg: Config
    run: Run
    model: object
    tok: object
    optimizer: object
    memory: envs.Memory
    corpus: list[str]
    pool: list[tuple[str, str]]
    backfill: list[tuple[str, str]]
    mu_slow: dict                       # learning_potential's slow mean per skill
    window: Window | None = None        # the window being played; None between windows


def sample_kwargs(cfg: Config) -> dict:
    return dict(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, static_cache=cfg.static_cache)


def env_id(start: int, slot: int, name: str = "") -> str:
    """Unique across the run: the window's first step and the slot (and the pool file's name).

    >>> env_id(8, 1), env_id(0, 2, "cups")
    ('env_00008_01', 'env_00000_02_cups')
    """
    return f"env_{start:05d}_{slot:02d}" + (f"_{name}" if name else "")


# -----------------------------------------------------------------------------------------------------------
# the phases, in order

def design(st: State, step: int, skills: list[str]) -> list[Design]:
    """Phases 1-3: each slot gets up to `design_attempts` tries, each from a fresh document; every program is
    validated in the sandbox. Returns every attempt; the valid ones are each slot's environment."""
    import spade_mini
    cfg, attempts, filled = st.cfg, [], set()
    use_memory = not (cfg.no_memory or cfg.no_designer_training)
    for attempt in range(cfg.design_attempts):
        slots = [g for g in range(cfg.envs_per_step) if g not in filled]
        if not slots:
            break
        prompts, docs = [], []
        for g in slots:
            skill = skills[g % len(skills)]
            rng = random.Random(envs.derive_seed(cfg.seed, step, "designer", g * cfg.design_attempts + attempt))
            # the one cut of a document: --doc-words words, line breaks kept
            doc = None if cfg.no_corpus else envs.truncate_words(rng.choice(st.corpus), cfg.doc_words)
            positives = st.memory.positives(skill, rng) if use_memory else []
            negative = st.memory.negative(skill, rng) if use_memory else None
            prompts.append(spade_mini.chat_ids(st.tok, envs.designer_prompt(skill, doc, positives, negative),
                                               cfg.thinking))
            docs.append(doc or "")
        outs = spade_mini.generate(st.model, st.tok, prompts, max_new_tokens=cfg.designer_max_new_tokens,
                                   seed=envs.derive_seed(cfg.seed, step, "designer-sample", attempt),
                                   **sample_kwargs(cfg))
        fault_point("generate", step)
        codes = [envs.extract_code(envs.after_thinking(o.text)) for o in outs]
        for g, doc, out, code, verdict in zip(slots, docs, outs, codes, validate_all(codes, cfg)):
            attempts.append(Design(g, attempt, skills[g % len(skills)], " ".join(doc.split()[:12]),
                                   out.prompt_ids, out.completion_ids, out.text, code, verdict))
            if verdict.valid:
                filled.add(g)
    return attempts


def open_window(st: State, step: int) -> Window:
    """Phases 1-3 at a window's first step: the designer's valid programs (slots it left empty take a
    --backfill environment, round-robin), or a slice of the fixed --env-pool."""
    cfg = st.cfg
    length = min(cfg.regen_interval, cfg.steps - step)
    # subtle: skills rotate per window, not per step; by step, R = 4 would only ever design skills 0, 4, 2
    skills = active_skills(cfg, step // cfg.regen_interval)
    if st.pool:
        picks = [st.pool[(step * cfg.envs_per_step + g) % len(st.pool)] for g in range(cfg.envs_per_step)]
        attempts, played = [], [PlayedEnv(env_id(step, g, name), "pool", code, None)
                                for g, (name, code) in enumerate(picks)]
    else:
        attempts = design(st, step, skills)
        played = [PlayedEnv(env_id(step, d.slot), d.skill, d.code, d) for d in attempts if d.verdict.valid]
        empty = [g for g in range(cfg.envs_per_step) if g not in {e.design.slot for e in played}]
        for g in empty if st.backfill else []:
            name, code = st.backfill[(step * cfg.envs_per_step + g) % len(st.backfill)]
            played.append(PlayedEnv(env_id(step, g, name), "backfill", code, None))
    folder = st.run.env_dir(step)       # the programs are on disk from the start; scores follow at the end
    folder.mkdir(parents=True, exist_ok=True)
    for e in played:
        envs.write_atomic(folder / f"{e.env_id}.py", e.code)
    return Window(step, length, skills, attempts, played)


def write_hints(st: State, step: int, played: list[PlayedEnv]) -> None:
    """Phase 4: the same model reads each environment's source and writes a short strategy hint (not trained),
    sampled at --hint-temperature."""
    import spade_mini
    cfg = st.cfg
    if not played or cfg.hinted_plays == 0:
        return
    prompts = [spade_mini.chat_ids(st.tok, envs.hint_prompt(e.code), cfg.thinking) for e in played]
    outs = spade_mini.generate(st.model, st.tok, prompts, max_new_tokens=cfg.hint_max_new_tokens,
                               seed=envs.derive_seed(cfg.seed, step, "hint", 0),
                               **{**sample_kwargs(cfg), "temperature": cfg.hint_temperature})
    fault_point("hint", step)
    for e, out in zip(played, outs):
        e.hint = clean_hint(envs.after_thinking(out.text)) or \
            "Read the observation carefully and try a simple action first."


def play_all(st: State, step: int, played: list[PlayedEnv], hinted: bool) -> dict:
    """Phase 5: every play of every environment still in the window advances together, one generate per turn:
    P unhinted plays with fresh seeds each step, and at the window's first step H hinted ones. Play i with and
    without the hint shares the environment seed (a paired comparison)."""
    import spade_mini
    cfg, specs, timing = st.cfg, [], {}
    for j, e in enumerate(played):
        for i in range(max(cfg.plays, cfg.hinted_plays if hinted else 0)):
            env_seed = envs.derive_seed(cfg.seed, step, "env", j * 1000 + i)
            if i < cfg.plays:
                specs.append(spade_mini.EpisodeSpec(e.code, env_seed, None, (j, False, i)))
            if hinted and i < cfg.hinted_plays:
                specs.append(spade_mini.EpisodeSpec(e.code, env_seed, e.hint, (j, True, i)))
    episodes = spade_mini.play(st.model, st.tok, specs, max_turns=cfg.max_turns,
                               max_new_tokens=cfg.agent_max_new_tokens,
                               max_episode_tokens=cfg.agent_max_episode_tokens,
                               seed=envs.derive_seed(cfg.seed, step, "agent", 0), limits=limits_of(cfg),
                               stats=timing, thinking=cfg.thinking, **sample_kwargs(cfg))
    fault_point("play", step)
    for e in played:
        e.episodes = []
    for ep in episodes:
        j, is_hinted, _ = ep.spec.key
        e = played[j]
        if is_hinted:
            e.hinted.append(ep.reward)
        e.episodes.append(ep)
    for e in played:
        plays = [ep for ep in e.episodes if ep.spec.hint is None]
        e.unhinted.append([ep.reward for ep in plays])
        e.trained.append([any(ep.loss_mask) for ep in plays])   # a play that failed to start has no tokens
        e.hung = e.hung or any(ep.failure == "timeout" for ep in e.episodes)
    return {"perf/generate_tok_per_s": timing["generated_tokens"] / max(timing["generate_s"], 1e-9),
            "perf/sandbox_s": timing["sandbox_s"], "perf/generate_s": timing["generate_s"]}


def score_input(cfg: Config, window: Window, chosen: list[PlayedEnv], mu_slow: dict) -> dict:
    """Outcomes of some of the window's environments in the format of `spade-mini score` (README)."""
    return {"variant": cfg.designer_reward, "window": window.length, "hang_penalty": cfg.timeout_penalty,
            "envs": [dict(skill=e.skill, hung=e.hung, hinted=e.hinted, unhinted=e.unhinted, trained=e.trained)
                     for e in chosen], "mu_slow": dict(mu_slow)}


def score(st: State, window: Window) -> list[dict]:
    """Phase 6 at the window's last step: R_hint, R_nohint, regret, w, win rate, designer reward and advantage
    of each environment, and the slow means, all from regret.score_window (the function `spade-mini score`
    runs). The designer's environments and the pool/backfill ones (whose designer fields are then unused) are
    scored as two inputs. Returns the window records for samples.jsonl (input and output, so anyone can
    recompute them)."""
    records = []
    for designed in (True, False):
        chosen = [e for e in window.envs if (e.design is not None) == designed]
        if not chosen:
            continue
        given = score_input(st.cfg, window, chosen, st.mu_slow)
        out = regret.score_window(given["variant"], given["envs"], given["mu_slow"], given["window"],
                                  hang_penalty=given["hang_penalty"])
        if designed:                    # pool and backfill environments leave the slow means alone
            st.mu_slow = out["mu_slow"]
        for e, row in zip(chosen, out["envs"]):
            e.scores = row
        records.append(dict(kind="window", start=window.start, designed=designed, input=given, output=out))
    return records


def reference_solution(code: str, seed: int, cfg: Config) -> tuple[str, list[str] | None]:
    """(first observation, solution actions) of an episode from a fresh sandboxed instance; ("", None) if
    unavailable (no solution(), a goal description, or a value that is no action list)."""
    from sandbox import SandboxError
    try:
        with envs.open_env(code, cfg.max_turns, limits_of(cfg)) as env:
            first = envs.parse_reset(env.call("reset", seed))
            return first, envs.solution_actions(env.call("solution"))
    except (SandboxError, envs.ContractError):
        return "", None


def environment_stats(st: State, played: list[PlayedEnv]) -> dict:
    """Statistics of a window's new environments (first step): size, hint/opening leakage, diversity."""
    for e in played:
        seed = e.episodes[0].spec.seed if e.episodes else 0
        first_obs, solution = reference_solution(e.code, seed, st.cfg)
        e.stats = dict(loc=regret.loc(e.code), has_solution=bool(solution),
                       hint_leak=bool(solution) and regret.hint_leak(e.hint, solution),
                       opening_leak=bool(solution) and regret.opening_leak(first_obs, solution))
    with_solution = [e for e in played if e.stats["has_solution"]]
    rate = lambda key: mean(e.stats[key] for e in with_solution) if with_solution else None  # noqa: E731
    return {"env/loc_mean": mean(e.stats["loc"] for e in played) if played else None,
            "env/hint_leak_rate": rate("hint_leak"), "env/opening_leak_rate": rate("opening_leak"),
            "env/diversity": regret.diversity([e.code for e in played]) if len(played) > 1 else None}


def remember(st: State, window: Window) -> None:
    """Phase 7 at the window's last step: each environment's scores next to its program, and one memory record
    per designed environment (hung ones too, marked: they have scores, and are never shown as positives)."""
    folder = st.run.env_dir(window.start)
    for e in window.envs:
        envs.write_atomic(folder / f"{e.env_id}.json",
                          json.dumps(dict(skill=e.skill, hint=e.hint, hung=e.hung, **e.stats,
                                          **{k: v for k, v in e.scores.items() if k != "agent_advantages"}),
                                     indent=2) + "\n")
        fault_point("memory", window.start + window.length - 1)
        if e.design is None:
            continue                    # pool and backfill environments are not the designer's
        st.memory.add(dict(env_id=e.env_id, file=str(folder / f"{e.env_id}.py"), skill=e.skill, code=e.code,
                           step=window.start, hung=e.hung,
                           **{k: e.scores[k] for k in ("win_rate", "regret", "r_hint", "r_nohint", "w")}))
    st.memory.save()


def agent_samples(st: State, played: list[PlayedEnv]) -> tuple[list, dict]:
    """Phase 8a, every step: the agent's unhinted plays of this step, z-scored within each environment over
    the plays that produced tokens (regret.agent_advantages, as score_window does). Hinted plays are never
    trained; hung environments and groups whose returns all tie are dropped (README departure 4)."""
    import spade_mini
    samples, groups = [], []
    for e in played:
        if e.hung:
            continue
        plays = [ep for ep in e.episodes if ep.spec.hint is None]
        groups.append([r for r, t in zip(e.unhinted[-1], e.trained[-1]) if t])
        advantages = regret.agent_advantages(e.unhinted[-1], e.trained[-1])
        if not any(advantages):
            continue                    # a tie: no gradient
        samples += [spade_mini.Sample(ep.token_ids, ep.loss_mask, adv, "agent")
                    for ep, adv, t in zip(plays, advantages, e.trained[-1]) if t]
    return samples, {"agent/zero_variance_frac": regret.zero_variance_fraction(groups) if groups else None}


def designer_samples(st: State, window: Window) -> list:
    """Phase 8a, at the window's last step: one sample per designed environment with score_window's advantage.
    With the opt-in --invalid-penalty the window's invalid programs join the per-skill centring."""
    import spade_mini
    cfg = st.cfg
    if cfg.no_designer_training:
        return []
    designed = [(e.design, e.scores["designer_reward"], e.scores["designer_advantage"])
                for e in window.envs if e.design is not None]
    if cfg.invalid_penalty:             # opt-in: tiny models otherwise never learn to write valid code
        rows = [(d, r) for d, r, _ in designed] + [(d, cfg.invalid_penalty) for d in window.attempts
                                                    if not d.verdict.valid]
        n_first = sum(len(e.unhinted[0]) for e in window.envs if e.design is not None)
        scale = regret.designer_scale(n_first, window.length, max(len(designed), 1))
        advs = regret.designer_advantages([r for _, r in rows], [d.skill for d, _ in rows], scale)
        designed = [(d, r, a) for (d, r), a in zip(rows, advs)]
    return [spade_mini.Sample(d.prompt_ids + d.completion_ids,
                              [0] * len(d.prompt_ids) + [1] * len(d.completion_ids), adv, "designer")
            for d, _, adv in designed if adv != 0 and d.completion_ids]


def update(st: State, samples: list) -> dict:
    """Phase 8b: one optimizer step over both roles' samples (PPO-clip form, micro-batched by tokens)."""
    import spade_mini
    counts = {"loss/samples_agent": sum(s.role == "agent" for s in samples),
              "loss/samples_designer": sum(s.role == "designer" for s in samples)}
    if not samples:
        return {"loss/policy": None, **counts}
    cfg = st.cfg
    out = spade_mini.update(st.model, st.optimizer, samples, temperature=cfg.temperature,
                            clip_low=cfg.clip_low, clip_high=cfg.clip_high, kl_beta=cfg.kl_beta,
                            token_budget=cfg.token_budget, max_grad_norm=cfg.max_grad_norm,
                            pad_id=st.tok.pad_token_id or 0)
    names = {"loss": "loss/policy", "kl": "loss/kl", "clip_frac": "loss/clip_frac", "grad_norm": "loss/grad_norm",
             "tokens": "loss/tokens", "tokens_per_s": "perf/train_tok_per_s", "peak_mem_mb": "perf/peak_mem_mb"}
    return {**{names[k]: v for k, v in out.items() if k in names}, **counts}


# -----------------------------------------------------------------------------------------------------------
# one self-play step, then the loop around it

@contextlib.contextmanager
def phase(bar, clock: dict, name: str):
    """Time one phase into clock['perf/<name>_s'] and advance the step's progress bar."""
    bar.set_postfix_str(name)
    t = time.time()
    yield
    clock[f"perf/{name}_s"] = time.time() - t
    bar.update()


def self_play_step(st: State, step: int) -> dict:
    """design -> validate -> hint -> play -> score -> remember -> update; returns the step's metrics record.

    With --regen-interval R the first four phases run at a window's first step only, score and remember at
    its last; play and the agent's update run every step."""
    from tqdm import tqdm
    cfg, clock, t0, logs = st.cfg, {}, time.time(), []
    first = st.window is None
    bar = tqdm(total=5, desc=f"step {step}", unit="phase", leave=False, file=sys.stderr)

    # 1-3. at a window's first step: design environments and validate them in the sandbox (or take a pool's)
    with phase(bar, clock, "design"):
        if first:
            st.window = open_window(st, step)
    window = st.window
    last = step == window.start + window.length - 1
    live = [e for e in window.envs if not e.hung]

    # 4. hint: the model reads each environment's source and writes a privileged hint (not trained)
    with phase(bar, clock, "hint"):
        if first:
            write_hints(st, step, live)

    # 5. play every environment P times without the hint (and, at the first step, H times with it)
    with phase(bar, clock, "play"):
        clock.update(play_all(st, step, live, hinted=first) if live else {})
    clock["perf/sandbox_share"] = clock.get("perf/sandbox_s", 0.0) / max(clock["perf/play_s"], 1e-9)

    # 6-7. at the window's last step: score (regret, designer rewards) and remember (scores + memory.json)
    with phase(bar, clock, "score"):
        if first:
            clock.update(environment_stats(st, live))
        if last:
            logs = score(st, window)
            remember(st, window)
        codes = [r["code"] for r in st.memory.records]
        clock.update({"memory/size": len(codes), "memory/diversity": regret.diversity(codes) if len(codes) > 1 else None})

    # 8. update: per-role advantages, then one optimizer step for both roles
    with phase(bar, clock, "update"):
        samples, sample_stats = agent_samples(st, live)
        samples += designer_samples(st, window) if last else []
        fault_point("update", step)
        clock.update({**sample_stats, **update(st, samples)})
    bar.close()
    clock["perf/step_s"] = time.time() - t0

    log_samples(st, step, window, live, first, logs)
    record = step_metrics(step, window.skills, window, live, first, last, clock)
    if last:
        st.window = None
    return record


def step_metrics(step: int, skills: list[str], window: Window, live: list[PlayedEnv], first: bool, last: bool,
                 extra: dict) -> dict:
    """The metrics.jsonl record of one step (glossary in the README). Designer numbers appear at a window's
    first step (attempts) and last step (rewards); R_hint and regret at its first step (the hinted plays)."""
    attempts = window.attempts if first else []
    reasons = Counter(d.verdict.reason for d in attempts if not d.verdict.valid)
    episodes = [ep for e in live for ep in e.episodes]
    failures = Counter(ep.failure for ep in episodes if ep.failure)
    scored = [e for e in live if not e.hung]
    designed = [e for e in window.envs if e.design is not None] if last else []
    solved = [ep for ep in episodes if ep.terminated]
    at_first = scored if first else []
    r_nohint = [mean(e.unhinted[-1]) for e in scored]
    r_hint = [mean(e.hinted) if e.hinted else mean(e.unhinted[0]) for e in at_first]
    return {
        "step": step, "skills": skills, "window/start": window.start, "window/length": window.length,
        "designer/attempts": len(attempts),
        "designer/valid_rate": sum(d.verdict.valid for d in attempts) / len(attempts) if attempts else None,
        "designer/rejections": dict(reasons),
        "designer/reward_mean": mean(e.scores["designer_reward"] for e in designed) if designed else None,
        "env/count": len(live),
        "env/hung": sum(e.hung for e in live),
        "env/regret": mean(h - mean(e.unhinted[0]) for h, e in zip(r_hint, at_first)) if at_first else None,
        "agent/return_nohint": mean(r_nohint) if scored else None,
        "agent/return_hint": mean(r_hint) if at_first else None,
        "agent/win_rate": mean(mean(r > 0 for r in e.unhinted[-1]) for e in scored) if scored else None,
        "agent/turns_mean": mean(ep.turns for ep in episodes) if episodes else None,
        "env/turns_to_solve": mean(ep.turns for ep in solved) if solved else None,
        "env/one_turn_share": mean(any(ep.terminated and ep.turns == 1 for ep in e.episodes)
                                   for e in live) if live else None,
        "sandbox/timeouts": reasons["timeout"] + failures["timeout"],
        "sandbox/memory_kills": reasons["memory"] + failures["memory"],
        "sandbox/forbidden": reasons["forbidden"] + failures["forbidden"],
        "sandbox/crashes": reasons["crash"] + failures["crash"],
        "sandbox/bad_replies": reasons["bad_reply"] + failures["bad_reply"],
        **extra,
    }


def log_samples(st: State, step: int, window: Window, live: list[PlayedEnv], first: bool, logs: list) -> None:
    """samples.jsonl: every designer attempt with its verdict (first step), the window's score input and
    output and every environment with hint and scores (last step), the first `episodes_logged` episodes."""
    for d in window.attempts if first else []:
        st.run.log_sample(dict(step=step, kind="design", slot=d.slot, attempt=d.attempt, skill=d.skill,
                               doc=d.doc, text=d.text, code=d.code, verdict=d.verdict.to_json()))
    for record in logs:
        st.run.log_sample(dict(step=step, **record))
    for e in window.envs if logs else []:
        st.run.log_sample(dict(step=step, kind="env", env_id=e.env_id, skill=e.skill, hint=e.hint, hung=e.hung,
                               **e.stats, **e.scores))
    # round-robin over environments (play i unhinted, then hinted), so every environment shows one first
    order = sorted((ep for e in live for ep in e.episodes), key=lambda ep: (ep.spec.key[2], ep.spec.key[0],
                                                                            ep.spec.key[1]))
    for ep in order[:st.cfg.episodes_logged]:
        st.run.log_sample(dict(step=step, kind="episode", env_id=live[ep.spec.key[0]].env_id,
                               hinted=ep.spec.hint is not None, seed=ep.spec.seed, reward=ep.reward,
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


# -----------------------------------------------------------------------------------------------------------
# checkpoints: LoRA adapter (peft format), optimizer, memory and loop state, written to a temp dir then renamed

def save_checkpoint(st: State, step: int) -> None:
    import torch
    final = st.run.checkpoints / f"step_{step:05d}"
    tmp = st.run.checkpoints / f".tmp_step_{step:05d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    st.model.save_pretrained(tmp)      # adapter_model.safetensors + adapter_config.json
    fault_point("checkpoint", step)
    torch.save(st.optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, tmp / "rng.pt")
    st.memory.save()                   # subtle: before a window's first end there is no memory.json yet
    shutil.copyfile(st.run.memory, tmp / "memory.json")
    window = st.window.to_json() if st.window else None   # a window still open: its programs and outcomes
    envs.write_atomic(tmp / "state.json", json.dumps({"step": step, "mu_slow": st.mu_slow, "window": window}) + "\n")
    for f in tmp.iterdir():            # the rename below must never publish half-written files
        with open(f, "rb+") as fh:
            os.fsync(fh.fileno())
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    for old in sorted(st.run.checkpoints.glob("step_*"))[:-st.cfg.keep_checkpoints]:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(st: State, ckpt: Path) -> None:
    import torch
    import spade_mini
    try:
        spade_mini.load_adapter(st.model, ckpt)
        st.optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=False))
        state = json.loads((ckpt / "state.json").read_text())
        st.mu_slow = state["mu_slow"]
        st.window = Window.from_json(state["window"]) if state.get("window") else None
    except Exception as err:            # a truncated or foreign file: say which checkpoint, not a traceback
        raise ConfigError(f"--resume: checkpoint {ckpt} is unreadable ({type(err).__name__}: {err})") from err
    shutil.copyfile(ckpt / "memory.json", st.run.memory)


# -----------------------------------------------------------------------------------------------------------
# spade-mini train

def train(cfg: Config) -> Path:
    check_config(cfg)
    cfg, run, start = open_run(cfg)
    import torch
    import spade_mini
    model, tok, info = spade_mini.load_model(
        cfg.model, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
        quantize=cfg.quantize, gradient_checkpointing=cfg.gradient_checkpointing,
        cache_dir=os.path.expanduser(cfg.cache_dir), seed=cfg.seed)
    if not any("config" in r for r in envs.read_jsonl(run.metrics)):   # the header: resolved config first
        run.log_metrics({"config": dataclasses.asdict(cfg), "model": info, "sandbox": isolation_report()})
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    corpus = [] if (cfg.no_corpus or cfg.env_pool) else envs.load_corpus(cfg.corpus or None)
    pool = load_pool(cfg.env_pool, cfg) if cfg.env_pool else []
    extra = load_pool(cfg.backfill, cfg, "--backfill") if cfg.backfill and not cfg.env_pool else []
    st = State(cfg, run, model, tok, optimizer, envs.Memory(run.memory, cfg.memory_capacity), corpus, pool, extra, {})
    if start > 0:
        load_checkpoint(st, run.latest_checkpoint())
        st.memory = envs.Memory(run.memory, cfg.memory_capacity)
        print(f"resumed {run.root} at step {start}", flush=True)
    writer = tensorboard_writer(cfg, run)
    if cfg.eval_every and start == 0:   # the untrained base model, logged as step -1
        run.log_metrics({"step": -1, **held_out_eval(st)})
    for step in range(start, cfg.steps):
        record = self_play_step(st, step)
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step == cfg.steps - 1):
            record.update(held_out_eval(st))
        run.log_metrics(record)
        fault_point("metrics", step)
        print_step(record)
        if writer:
            for k, v in record.items():
                if isinstance(v, (int, float)) and "/" in k:
                    writer.add_scalar(k, v, step)
        if (step + 1) % cfg.checkpoint_every == 0 or step == cfg.steps - 1:
            save_checkpoint(st, step)
    print_summary(run)
    return run.root


def held_out_eval(st: State) -> dict:
    """eval/score, eval/<category>, eval/answered (and eval/pool_win_rate) of the current weights (evaluate.py)."""
    import evaluate
    cfg = st.cfg
    return evaluate.eval_metrics(st.model, st.tok, limit=cfg.eval_limit, seed=cfg.seed,
                                 max_new_tokens=max(128, 2 * cfg.agent_max_new_tokens), env_pool=cfg.eval_pool,
                                 pool_plays=cfg.plays, max_turns=cfg.max_turns,
                                 max_episode_tokens=cfg.agent_max_episode_tokens, limits=limits_of(cfg))


def tensorboard_writer(cfg: Config, run: Run):
    if not cfg.tensorboard:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise ConfigError("--tensorboard needs the tensorboard package (pip install tensorboard)") from err
    return SummaryWriter(str(run.root / "tb"))


def print_summary(run: Run) -> None:
    records = [r for r in envs.read_jsonl(run.metrics) if isinstance(r.get("step"), int) and r["step"] >= 0]
    print(f"\nrun directory: {run.root}")
    print(f"{'step':>4} {'valid':>6} {'envs':>4} {'R_nohint':>8} {'R_hint':>7} {'regret':>7} {'loss':>8} {'sec':>5}")
    for r in records:
        cells = [r.get(k) for k in ("designer/valid_rate", "env/count", "agent/return_nohint",
                                    "agent/return_hint", "env/regret", "loss/policy", "perf/step_s")]
        print(f"{r['step']:>4} " + " ".join("-".rjust(w) if c is None else f"{c:>{w}.{p}f}" if isinstance(c, float)
                                            else f"{c:>{w}}" for c, w, p in zip(cells, (6, 4, 8, 7, 7, 8, 5),
                                                                                 (2, 0, 2, 2, 2, 4, 0))))


# -----------------------------------------------------------------------------------------------------------
# spade-mini validate / play

def cmd_validate(path: str, as_json: bool, timeout: float) -> int:
    if not Path(path).is_file():
        raise ConfigError(f"{path}: no such file")
    verdict = envs.validate(Path(path).read_bytes(), Limits(call_timeout=timeout))  # bytes: bad UTF-8 is a reason
    result = {**verdict.to_json(), "sandbox": isolation_report()}
    print(f"{path}: {'valid' if verdict.valid else 'rejected'} ({verdict.reason})"
          + (f" class {verdict.class_name}" if verdict.class_name else "") + (f": {verdict.detail}" if verdict.detail else ""))
    for name, ok in verdict.checks.items():
        print(f"  {'skip' if ok is None else 'ok  ' if ok else 'FAIL'} {name}")
    if as_json:
        print(json.dumps(result))
    return 0 if verdict.valid else 1


def check_score_input(data) -> dict:
    """The input of `spade-mini score` (README "Checking another implementation"), checked field by field;
    ConfigError names the first bad one. Returns it with the optional fields filled in."""
    def fail(where: str, what: str):
        raise ConfigError(f"score input: {where} must be {what}")

    def numbers(value, where: str) -> list:
        if not (isinstance(value, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                and math.isfinite(x) for x in value)):
            fail(where, "a list of finite numbers")
        return value

    if not isinstance(data, dict):
        fail("the file", "a JSON object")
    if data.get("variant") not in regret.DESIGNER_REWARDS:
        fail("variant", "one of " + ", ".join(regret.DESIGNER_REWARDS))
    if type(data.get("window")) is not int or data["window"] < 1:
        fail("window", "an integer >= 1")
    def finite(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    mu = data.get("mu_slow", {})
    mu = {} if mu is None else mu
    if not isinstance(mu, dict) or not all(v is None or finite(v) for v in mu.values()):
        fail("mu_slow", "an object of skill -> finite number or null")
    if not finite(data.get("hang_penalty", regret.HANG_PENALTY)):
        fail("hang_penalty", "a finite number")
    if not (isinstance(data.get("envs"), list) and data["envs"]):
        fail("envs", "a non-empty list")
    out = []
    for k, e in enumerate(data["envs"]):
        where = f"envs[{k}]"
        if not (isinstance(e, dict) and isinstance(e.get("skill"), str)):
            fail(f"{where}.skill", "a string")
        if not isinstance(e.get("hung", False), bool):
            fail(f"{where}.hung", "true or false")
        steps = e.get("unhinted")
        if not (isinstance(steps, list) and 1 <= len(steps) <= data["window"] and steps[0]):
            fail(f"{where}.unhinted", f"a list of 1 to {data['window']} lists (one per step of the window), the "
                 "first not empty")
        steps = [numbers(x, f"{where}.unhinted[{i}]") for i, x in enumerate(steps)]
        trained = e.get("trained", [[True] * len(x) for x in steps])
        if not (isinstance(trained, list) and len(trained) == len(steps)
                and all(isinstance(t, list) and len(t) == len(x) and all(isinstance(b, bool) for b in t)
                        for t, x in zip(trained, steps))):
            fail(f"{where}.trained", "lists of true/false shaped like unhinted")
        out.append(dict(skill=e["skill"], hung=e.get("hung", False), unhinted=steps, trained=trained,
                        hinted=numbers(e.get("hinted", []), f"{where}.hinted")))
    return {"variant": data["variant"], "window": data["window"], "mu_slow": dict(mu), "envs": out,
            "hang_penalty": data.get("hang_penalty", regret.HANG_PENALTY)}


def cmd_score(path: str) -> int:
    """`spade-mini score FILE.json`: the designer rewards and both roles' advantages of one window of outcomes,
    computed by regret.score_window (the function the training loop calls); the last stdout line is JSON."""
    if not Path(path).is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        data = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as err:
        raise ConfigError(f"{path}: not JSON ({type(err).__name__})") from None
    given = check_score_input(data)
    out = regret.score_window(given["variant"], given["envs"], given["mu_slow"], given["window"],
                              hang_penalty=given["hang_penalty"])
    for k, e in enumerate(out["envs"]):
        print(f"env {k}: r_hint {e['r_hint']:.4f} r_nohint {e['r_nohint']:.4f} regret {e['regret']:+.4f} "
              f"w {e['w']:.4f} reward {e['designer_reward']:.4f} advantage {e['designer_advantage']:+.4f}")
    print(json.dumps(out))
    return 0


def read_program(path: str, limit: int = 1_000_000) -> str | None:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{path}: no such file")
    if p.stat().st_size > limit:
        return None
    return p.read_bytes().decode("utf-8", errors="replace")


def cmd_play(path: str, seed: int, actions_file: str, max_turns: int, timeout: float) -> int:
    code = read_program(path)
    if code is None:
        raise ConfigError(f"{path}: larger than 1 MB")
    limits = Limits(call_timeout=timeout)
    if actions_file:
        if not Path(actions_file).is_file():
            raise ConfigError(f"--actions: {actions_file}: no such file")
        actions = [a for a in Path(actions_file).read_text(errors="replace").splitlines() if a.strip()]
        result = envs.play_scripted(code, actions, seed=seed, max_turns=max_turns, limits=limits)
        for t in result["transcript"]:
            print(f"turn {t.get('turn')}: action {t.get('action')!r} -> reward {t.get('reward')}")
        print(json.dumps({k: result[k] for k in ("return", "turns", "terminated")}))
        return 0
    return play_interactive(code, seed, max_turns, limits)


def play_interactive(code: str, seed: int, max_turns: int, limits: Limits) -> int:
    """A person plays: observation, reward and turn each turn; type an action (\\boxed{} added if missing)."""
    from sandbox import SandboxError
    try:
        with envs.open_env(code, max_turns, limits) as env:
            print(envs.parse_reset(env.call("reset", seed)))
            for turn in range(1, max_turns + 1):
                try:
                    line = input(f"[turn {turn}] action> ").strip()
                except EOFError:
                    break
                action = line if "\\boxed{" in line else f"\\boxed{{{line}}}"
                obs, reward, terminated, truncated = envs.parse_step(env.call("step", action))
                print(f"{obs}\n(reward {reward}, turn {turn}{', terminated' if terminated else ''}"
                      f"{', truncated' if truncated else ''})")
                if terminated or truncated:
                    break
    except (SandboxError, envs.ContractError) as err:
        print(f"environment failed: {err}")
        return 1
    return 0


# -----------------------------------------------------------------------------------------------------------
# the command line, generated from Config

def field_help() -> dict[str, str]:
    """The trailing comment of each Config field is its --help text (one source of truth)."""
    return dict(re.findall(r"^\s+(\w+): [^#\n]+#\s*(.+)$", inspect.getsource(Config), flags=re.M))


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    helps = field_help()
    for f in dataclasses.fields(Config):
        flag = "--" + f.name.replace("_", "-")
        default = f"(default: {f.default!r}; presets may change it)"
        if f.type in ("bool", bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                help=f"{helps.get(f.name, '')} {default}")
        else:
            kind = {"int": int, "float": float}.get(str(f.type), str)
            parser.add_argument(flag, type=kind, default=argparse.SUPPRESS, metavar=f.name.upper(),
                                help=f"{helps.get(f.name, '')} {default}")


def config_from_args(explicit: dict) -> Config:
    """Precedence: Config defaults < preset < flags given on the command line."""
    preset = explicit.get("preset", Config.preset)
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    return Config(**{**PRESETS[preset], **explicit, "preset": preset})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spade-mini", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("train", help="run self-play (default: the CPU demo with SmolLM2-135M)")
    add_config_flags(p)
    p = sub.add_parser("validate", help="check an environment program in the sandbox")
    p.add_argument("file", help="a Python file defining a *Env class")
    p.add_argument("--json", action="store_true", help="last stdout line is the verdict as JSON")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per environment call")
    p = sub.add_parser("play", help="play an environment in the terminal, or replay actions from a file")
    p.add_argument("file", help="a Python file defining a *Env class")
    p.add_argument("--seed", type=int, default=0, help="reset seed")
    p.add_argument("--actions", default="", help="file with one action per line (non-interactive)")
    p.add_argument("--max-turns", type=int, default=12, help="turn cap")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per environment call")
    p = sub.add_parser("score", help="rewards and advantages of one window of outcomes (conformance check)")
    p.add_argument("file", help="a JSON file of outcomes (format in the README)")
    # eval and report parse their own flags (evaluate.eval_main, report.report_main): main passes them on
    sub.add_parser("eval", add_help=False, help="held-out evaluation: reasoning-gym and an environment pool")
    sub.add_parser("report", add_help=False, help="write RUN_DIR/report/index.html: plots and environments")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parsed, rest = parser.parse_known_args(argv)
    args = vars(parsed)
    command = args.pop("command") or "train"
    if command == "eval":
        import evaluate
        return evaluate.eval_main(rest)
    if command == "report":
        import report
        return report.report_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        if command == "validate":
            return cmd_validate(args["file"], args["json"], args["timeout"])
        if command == "score":
            return cmd_score(args["file"])
        if command == "play":
            return cmd_play(args["file"], args["seed"], args["actions"], args["max_turns"], args["timeout"])
        train(config_from_args(args))
        return 0
    except ConfigError as err:
        print(f"spade-mini: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("spade-mini: interrupted; continue with --resume RUN_DIR", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

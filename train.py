"""SPADE self-play, one step at a time: design -> validate -> hint -> play -> score -> remember -> update.

One model, two roles on the same weights. Each step the Environment Designer writes executable Gym-style
environments grounded in a real document and in the environment memory; the Reasoning Agent plays every valid
one P times without and H times with a privileged hint; the designer is rewarded by hint regret (agent return
with the hint minus without); both roles then share one GRPO-style optimizer step. This file holds the
configuration, the loop and the command line (`spade-mini train|validate|play`); the model mechanics are in
spade_mini.py, the environment contract in envs.py, the formulas in regret.py, the sandbox in sandbox.py.

Departures from the textbook / the official code, numbered (see README "implementation details"):
1. One optimizer step per self-play step over both roles' samples (the paper's schedule), LoRA instead of full
   fine-tuning so it fits one GPU.
2. Hinted and unhinted play i of an environment share the environment seed (paired comparison, less noise).
3. Groups whose rewards all tie (zero variance) are dropped before the update: they carry no gradient and would
   only dilute the 1/B normalization. Their fraction is logged.
4. Generated code runs only in sandbox.py's child processes; an environment that hangs is dropped for the rest
   of the step and its designer sample gets `timeout_penalty`.
5. Every random choice takes a seed derived from (seed, step, role, index), so any step can be regenerated.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import json
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
from sandbox import Limits, isolation_report


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
    design_attempts: int = 3            # attempts per slot, a fresh document each attempt
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
                 envs_per_step=4, design_attempts=2, plays=4, hinted_plays=4, max_turns=3,
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
                 "env_memory_mb", "eval_limit"):
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
# what flows through one step

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
    """A valid environment of this step, its hint, its plays and its scores."""
    env_id: str
    skill: str
    code: str
    design: Design | None               # None for environments from --env-pool
    hint: str = ""
    unhinted: list = dataclasses.field(default_factory=list)   # spade_mini.Episode
    hinted: list = dataclasses.field(default_factory=list)
    scores: dict = dataclasses.field(default_factory=dict)


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


def load_pool(folder: str, cfg: Config) -> list[tuple[str, str]]:
    """--env-pool: every *.py in the folder that passes validation, as (name, code), sorted by name."""
    files = sorted(Path(folder).glob("*.py"))
    codes = [f.read_text(errors="replace") for f in files]
    verdicts = validate_all(codes, cfg)
    pool = [(f.stem, c) for f, c, v in zip(files, codes, verdicts) if v.valid]
    for f, v in zip(files, verdicts):
        if not v.valid:
            print(f"warning: --env-pool: skipping {f.name} ({v.reason}: {v.detail})", file=sys.stderr)
    if not pool:
        raise ConfigError(f"--env-pool: no valid environment in {folder}")
    return pool


@dataclass
class State:
    """What persists across steps (the model and optimizer, memory, corpus, per-skill slow means)."""
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


def sample_kwargs(cfg: Config) -> dict:
    return dict(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, static_cache=cfg.static_cache)


# -----------------------------------------------------------------------------------------------------------
# the phases of one self-play step, in order

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
            doc = None if cfg.no_corpus else " ".join(rng.choice(st.corpus).split()[:cfg.doc_words])
            positives = st.memory.positives(skill, rng) if use_memory else []
            negative = st.memory.negative(skill, rng) if use_memory else None
            prompts.append(spade_mini.chat_ids(st.tok, envs.designer_prompt(skill, doc, positives, negative)))
            docs.append(doc or "")
        outs = spade_mini.generate(st.model, st.tok, prompts, max_new_tokens=cfg.designer_max_new_tokens,
                                   seed=envs.derive_seed(cfg.seed, step, "designer-sample", attempt),
                                   **sample_kwargs(cfg))
        fault_point("generate", step)
        codes = [envs.extract_code(o.text) for o in outs]
        for g, doc, out, code, verdict in zip(slots, docs, outs, codes, validate_all(codes, cfg)):
            attempts.append(Design(g, attempt, skills[g % len(skills)], " ".join(doc.split()[:12]),
                                   out.prompt_ids, out.completion_ids, out.text, code, verdict))
            if verdict.valid:
                filled.add(g)
    return attempts


def backfill(st: State, step: int, filled: set[int]) -> list[PlayedEnv]:
    """--backfill: slots without a valid program take a pool environment (round-robin); no designer sample."""
    if not st.backfill:
        return []
    empty = [g for g in range(st.cfg.envs_per_step) if g not in filled]
    picks = [st.backfill[(step * st.cfg.envs_per_step + g) % len(st.backfill)] for g in empty]
    return [PlayedEnv(f"env_{g:02d}_{name}", "backfill", code, None) for g, (name, code) in zip(empty, picks)]


def write_hints(st: State, step: int, played: list[PlayedEnv]) -> None:
    """Phase 4: the same model reads each environment's source and writes a short strategy hint (not trained)."""
    import spade_mini
    if not played or st.cfg.hinted_plays == 0:
        return
    prompts = [spade_mini.chat_ids(st.tok, envs.hint_prompt(e.code)) for e in played]
    outs = spade_mini.generate(st.model, st.tok, prompts, max_new_tokens=st.cfg.hint_max_new_tokens,
                               seed=envs.derive_seed(st.cfg.seed, step, "hint", 0), **sample_kwargs(st.cfg))
    fault_point("hint", step)
    for e, out in zip(played, outs):
        e.hint = clean_hint(out.text) or "Read the observation carefully and try a simple action first."


def play_all(st: State, step: int, played: list[PlayedEnv]) -> dict:
    """Phase 5: every play of every environment, hinted and unhinted, advances together, one generate per turn.
    Play i with and without the hint shares the environment seed (a paired comparison)."""
    import spade_mini
    cfg, specs, timing = st.cfg, [], {}
    for j, e in enumerate(played):
        for i in range(max(cfg.plays, cfg.hinted_plays)):
            env_seed = envs.derive_seed(cfg.seed, step, "env", j * 1000 + i)
            if i < cfg.plays:
                specs.append(spade_mini.EpisodeSpec(e.code, env_seed, None, (j, False, i)))
            if i < cfg.hinted_plays:
                specs.append(spade_mini.EpisodeSpec(e.code, env_seed, e.hint, (j, True, i)))
    episodes = spade_mini.play(st.model, st.tok, specs, max_turns=cfg.max_turns,
                               max_new_tokens=cfg.agent_max_new_tokens,
                               max_episode_tokens=cfg.agent_max_episode_tokens,
                               seed=envs.derive_seed(cfg.seed, step, "agent", 0), limits=limits_of(cfg),
                               stats=timing, **sample_kwargs(cfg))
    fault_point("play", step)
    for ep in episodes:
        j, hinted, _ = ep.spec.key
        (played[j].hinted if hinted else played[j].unhinted).append(ep)
    return {"perf/generate_tok_per_s": timing["generated_tokens"] / max(timing["generate_s"], 1e-9),
            "perf/sandbox_s": timing["sandbox_s"], "perf/generate_s": timing["generate_s"]}


def score(st: State, played: list[PlayedEnv]) -> None:
    """Phase 6: R_nohint, R_hint, hint regret, win rate and the designer's reward of each environment."""
    cfg = st.cfg
    for e in played:
        r_nohint = mean([ep.reward for ep in e.unhinted])
        r_hint = mean([ep.reward for ep in e.hinted]) if e.hinted else r_nohint
        hung = any(ep.failure == "timeout" for ep in e.unhinted + e.hinted)
        mu = st.mu_slow.get(e.skill, 0.5)
        reward = (cfg.timeout_penalty if hung else
                  regret.designer_reward(cfg.designer_reward, r_hint, r_nohint, r_nohint, mu))
        if not hung:
            st.mu_slow[e.skill] = regret.update_slow_mean(mu, r_nohint)
        e.scores = dict(r_nohint=r_nohint, r_hint=r_hint, regret=regret.hint_regret(r_hint, r_nohint),
                        win_rate=mean([float(ep.reward > 0) for ep in e.unhinted]),
                        designer_reward=reward, hung=hung)


def reference_solution(code: str, seed: int, cfg: Config) -> tuple[str, object]:
    """(first observation, solution()) of an episode, from a fresh sandboxed instance; ("", None) if unavailable."""
    from sandbox import SandboxError
    try:
        with envs.open_env(code, cfg.max_turns, limits_of(cfg)) as env:
            first = envs.parse_reset(env.call("reset", seed))
            return first, env.call("solution")
    except (SandboxError, envs.ContractError):
        return "", None


def environment_stats(st: State, played: list[PlayedEnv]) -> dict:
    """Statistics of this step's environments: size, turns, one-turn solves, hint/opening leakage, diversity."""
    for e in played:
        seed = e.unhinted[0].spec.seed if e.unhinted else 0
        first_obs, solution = reference_solution(e.code, seed, st.cfg)
        solution = solution if isinstance(solution, (str, list)) else None
        e.scores.update(loc=regret.loc(e.code), has_solution=bool(solution),
                        hint_leak=bool(solution) and regret.hint_leak(e.hint, solution),
                        opening_leak=bool(solution) and regret.opening_leak(first_obs, solution))
    solved = [ep for e in played for ep in e.unhinted + e.hinted if ep.terminated]
    with_solution = [e for e in played if e.scores["has_solution"]]
    rate = lambda key: mean(e.scores[key] for e in with_solution) if with_solution else None  # noqa: E731
    return {
        "env/loc_mean": mean(e.scores["loc"] for e in played) if played else None,
        "env/turns_to_solve": mean(ep.turns for ep in solved) if solved else None,
        "env/one_turn_share": mean(any(ep.terminated and ep.turns == 1 for ep in e.unhinted + e.hinted)
                                   for e in played) if played else None,
        "env/hint_leak_rate": rate("hint_leak"), "env/opening_leak_rate": rate("opening_leak"),
        "env/diversity": regret.diversity([e.code for e in played]) if len(played) > 1 else None,
    }


def remember(st: State, step: int, played: list[PlayedEnv]) -> None:
    """Phase 7: write each environment to envs/step_NNNNN/ and add a record per environment to memory.json."""
    folder = st.run.env_dir(step)
    folder.mkdir(parents=True, exist_ok=True)
    for e in played:
        envs.write_atomic(folder / f"{e.env_id}.py", e.code)
        envs.write_atomic(folder / f"{e.env_id}.json",
                          json.dumps(dict(skill=e.skill, hint=e.hint, **e.scores), indent=2) + "\n")
        fault_point("memory", step)
        if e.design is None or e.scores["hung"]:
            continue                    # pool environments are not the designer's; hung ones have no scores
        st.memory.add(dict(env_id=e.env_id, file=str(folder / f"{e.env_id}.py"), skill=e.skill, code=e.code,
                           step=step, **{k: e.scores[k] for k in ("win_rate", "regret", "r_hint", "r_nohint")}))
    st.memory.save()


def build_samples(st: State, played: list[PlayedEnv], attempts: list[Design]) -> tuple[list, dict]:
    """Phase 8a: per-role advantages. Agent: z-score within each environment's unhinted plays (hinted plays
    are never trained). Designer: one sample per valid environment, centred per skill and scaled by
    S = min(n_agent / n_designer, 50)."""
    import spade_mini
    cfg, agent, groups = st.cfg, [], []
    for e in played:
        if e.scores["hung"]:
            continue                    # dropped for the rest of the step
        rewards = [ep.reward for ep in e.unhinted]
        groups.append(rewards)
        if max(rewards) == min(rewards):
            continue                    # zero-variance group: no gradient (departure 3)
        for ep, adv in zip(e.unhinted, regret.agent_advantages(rewards)):
            if any(ep.loss_mask):       # note: a play whose environment failed to start has no tokens at all
                agent.append(spade_mini.Sample(ep.token_ids, ep.loss_mask, adv, "agent"))
    designed = [(e.design, e.scores["designer_reward"]) for e in played if e.design is not None]
    if cfg.invalid_penalty:             # opt-in: tiny models otherwise never learn to write valid code
        designed += [(d, cfg.invalid_penalty) for d in attempts if not d.verdict.valid]
    designer = []
    if designed and not cfg.no_designer_training:
        advs = regret.designer_advantages([r for _, r in designed], [d.skill for d, _ in designed],
                                          max(len(agent), 1))
        for (d, _), adv in zip(designed, advs):
            ids = d.prompt_ids + d.completion_ids
            mask = [0] * len(d.prompt_ids) + [1] * len(d.completion_ids)
            if adv != 0 and d.completion_ids:
                designer.append(spade_mini.Sample(ids, mask, adv, "designer"))
    stats = {"agent/zero_variance_frac": regret.zero_variance_fraction(groups) if groups else None,
             "loss/samples_agent": len(agent), "loss/samples_designer": len(designer)}
    return agent + designer, stats


def update(st: State, samples: list) -> dict:
    """Phase 8b: one optimizer step over both roles' samples (PPO-clip form, micro-batched by tokens)."""
    import spade_mini
    if not samples:
        return {"loss/policy": None}
    cfg = st.cfg
    out = spade_mini.update(st.model, st.optimizer, samples, temperature=cfg.temperature,
                            clip_low=cfg.clip_low, clip_high=cfg.clip_high, kl_beta=cfg.kl_beta,
                            token_budget=cfg.token_budget, max_grad_norm=cfg.max_grad_norm,
                            pad_id=st.tok.pad_token_id or 0)
    names = {"loss": "loss/policy", "kl": "loss/kl", "clip_frac": "loss/clip_frac", "grad_norm": "loss/grad_norm",
             "tokens": "loss/tokens", "tokens_per_s": "perf/train_tok_per_s", "peak_mem_mb": "perf/peak_mem_mb"}
    return {names[k]: v for k, v in out.items() if k in names}


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
    """design -> validate -> hint -> play -> score -> remember -> update; returns the step's metrics record."""
    from tqdm import tqdm
    cfg, clock, t0 = st.cfg, {}, time.time()
    skills = active_skills(cfg, step)
    bar = tqdm(total=5, desc=f"step {step}", unit="phase", leave=False, file=sys.stderr)

    # 1-3. design environments and validate them in the sandbox (or take them from a fixed pool)
    with phase(bar, clock, "design"):
        if st.pool:
            picks = [st.pool[(step * cfg.envs_per_step + g) % len(st.pool)] for g in range(cfg.envs_per_step)]
            attempts = []
            played = [PlayedEnv(f"env_{g:02d}_{name}", "pool", code, None) for g, (name, code) in enumerate(picks)]
        else:
            attempts = design(st, step, skills)
            played = [PlayedEnv(f"env_{d.slot:02d}", d.skill, d.code, d) for d in attempts if d.verdict.valid]
            played += backfill(st, step, {e.design.slot for e in played})

    # 4. hint: the model reads each environment's source and writes a privileged hint (not trained)
    with phase(bar, clock, "hint"):
        write_hints(st, step, played)

    # 5. play every environment P times without and H times with the hint, all episodes in one batch
    with phase(bar, clock, "play"):
        clock.update(play_all(st, step, played) if played else {})
    clock["perf/sandbox_share"] = clock.get("perf/sandbox_s", 0.0) / max(clock["perf/play_s"], 1e-9)

    # 6-7. score (regret, designer rewards, statistics) and remember (env files + memory.json)
    with phase(bar, clock, "score"):
        score(st, played)
        clock.update(environment_stats(st, played))
        remember(st, step, played)
        codes = [r["code"] for r in st.memory.records]
        clock.update({"memory/size": len(codes), "memory/diversity": regret.diversity(codes) if len(codes) > 1 else None})

    # 8. update: per-role advantages, then one optimizer step for both roles
    with phase(bar, clock, "update"):
        samples, sample_stats = build_samples(st, played, attempts)
        fault_point("update", step)
        losses = update(st, samples)
    bar.close()
    clock["perf/step_s"] = time.time() - t0

    log_samples(st, step, attempts, played)
    return step_metrics(step, skills, attempts, played, {**sample_stats, **losses, **clock})


def step_metrics(step: int, skills: list[str], attempts: list[Design], played: list[PlayedEnv],
                 extra: dict) -> dict:
    """The metrics.jsonl record of one step (glossary in the README)."""
    reasons = Counter(d.verdict.reason for d in attempts if not d.verdict.valid)
    episodes = [ep for e in played for ep in e.unhinted + e.hinted]
    failures = Counter(ep.failure for ep in episodes if ep.failure)
    scored = [e for e in played if not e.scores.get("hung")]
    designed = [e for e in played if e.design is not None]
    return {
        "step": step, "skills": skills,
        "designer/attempts": len(attempts),
        "designer/valid_rate": sum(d.verdict.valid for d in attempts) / len(attempts) if attempts else None,
        "designer/rejections": dict(reasons),
        "designer/reward_mean": mean(e.scores["designer_reward"] for e in designed) if designed else None,
        "env/count": len(played),
        "env/hung": sum(bool(e.scores.get("hung")) for e in played),
        "env/regret": mean(e.scores["regret"] for e in scored) if scored else None,
        "agent/return_nohint": mean(e.scores["r_nohint"] for e in scored) if scored else None,
        "agent/return_hint": mean(e.scores["r_hint"] for e in scored) if scored else None,
        "agent/win_rate": mean(e.scores["win_rate"] for e in scored) if scored else None,
        "agent/turns_mean": mean(ep.turns for ep in episodes) if episodes else None,
        "sandbox/timeouts": reasons["timeout"] + failures["timeout"],
        "sandbox/memory_kills": reasons["memory"] + failures["memory"],
        "sandbox/forbidden": reasons["forbidden"] + failures["forbidden"],
        "sandbox/crashes": reasons["crash"] + failures["crash"],
        **extra,
    }


def log_samples(st: State, step: int, attempts: list[Design], played: list[PlayedEnv]) -> None:
    """samples.jsonl: every designer attempt with its verdict, every environment with hint and scores, and the
    first `episodes_logged` episodes in full."""
    for d in attempts:
        st.run.log_sample(dict(step=step, kind="design", slot=d.slot, attempt=d.attempt, skill=d.skill,
                               doc=d.doc, text=d.text, code=d.code, verdict=d.verdict.to_json()))
    for e in played:
        st.run.log_sample(dict(step=step, kind="env", env_id=e.env_id, skill=e.skill, hint=e.hint, **e.scores))
    # round-robin over environments (unhinted play i, then hinted play i), so every environment shows one first
    order = [(e, ep) for i in range(max(st.cfg.plays, st.cfg.hinted_plays))
             for e in played for ep in (e.unhinted[i:i + 1] + e.hinted[i:i + 1])]
    for e, ep in order[:st.cfg.episodes_logged]:
        st.run.log_sample(dict(step=step, kind="episode", env_id=e.env_id, hinted=ep.spec.hint is not None,
                               seed=ep.spec.seed, reward=ep.reward, turns=ep.turns, terminated=ep.terminated,
                               failure=ep.failure, transcript=ep.transcript))


def print_step(record: dict) -> None:
    def f(key, fmt="{:.2f}"):
        value = record.get(key)
        return "-" if value is None else fmt.format(value)
    print(f"step {record['step']:>4} | valid {f('designer/valid_rate')} of {record['designer/attempts']} "
          f"| envs {record['env/count']} | R_nohint {f('agent/return_nohint')} R_hint {f('agent/return_hint')} "
          f"regret {f('env/regret', '{:+.2f}')} | loss {f('loss/policy', '{:.4f}')} "
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
    shutil.copyfile(st.run.memory, tmp / "memory.json")
    envs.write_atomic(tmp / "state.json", json.dumps({"step": step, "mu_slow": st.mu_slow}) + "\n")
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
        st.mu_slow = json.loads((ckpt / "state.json").read_text())["mu_slow"]
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
    extra = load_pool(cfg.backfill, cfg) if cfg.backfill and not cfg.env_pool else []
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
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    if as_json:
        print(json.dumps(result))
    return 0 if verdict.valid else 1


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

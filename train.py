"""SPADE self-play, one step at a time: design -> validate -> hint -> play -> score -> remember -> update.

One model, two roles on the same weights. At the first step of a regeneration window (R steps) the Environment
Designer writes executable Gym-style environments grounded in a real document and in the environment memory,
the sandbox validates them, and the model writes a privileged hint for each. Every step the Reasoning Agent
plays every environment P times without the hint (and, at the first step, H times with it); at the window's
last step the designer is scored by hint regret (agent return with the hint minus without) and the memory
remembers. Both roles share one GRPO-style update per step. docs/method.md sums up the paper; this file is the
loop, phase by phase; its knobs are runs.Config (`cfg` below), one commented line each.

Read next: regret.py, envs.py, spade_mini.py, sandbox.py (the README's reading order). Departures from the
paper and the official code: the numbered list of docs/details.md ("Implementation details"), the one place;
the loop has 4-6, 10, 11 and 14 (dropped ties, paired and derived seeds, hints, backfill, a cut-short window).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import envs
import evaluate
import models
import regret
import runs
import spade_mini
from isolation import isolation_report
from runs import Config
from sandbox import Limits


def active_skills(cfg: Config, step: int) -> list[str]:
    """Round-robin over the (possibly restricted) skill list, k per step.

    >>> active_skills(Config(skills_per_step=2), 2)
    ['Optimization', 'Causal Inference']
    >>> active_skills(Config(skills="0,Causal Inference"), 1)
    ['Causal Inference']
    """
    known = envs.skills_of(cfg.setting)   # the six cognitive skills, or the six tool-use skills
    pool = [] if cfg.skills else list(known)
    for item in cfg.skills.split(",") if cfg.skills else []:
        item = item.strip()
        name = known[int(item)] if item.isdigit() and int(item) < len(known) else item
        if name not in known:
            raise runs.InputError(f"--skills: unknown skill {item!r}; known: {', '.join(known)}")
        pool.append(name)
    k = min(cfg.skills_per_step, len(pool))
    return [pool[(step * k + i) % len(pool)] for i in range(k)]


# -----------------------------------------------------------------------------------------------------------
# what flows through one regeneration window (R steps: designed at its first, scored at its last)

@dataclass
class Design:
    """One designer attempt: the prompt it saw, what it wrote, and the sandbox's verdict."""
    slot: int
    attempt: int
    skill: str
    doc_preview: str                    # the grounding document's first 12 words ('' without corpus)
    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    code: str | None
    verdict: envs.Verdict
    rollout_logprobs: list | None = None  # samples: what the sampler recorded for completion_ids (TIS: pi_sampling)
    advantage: float = 0.0              # rejected ones under --invalid-samples: score_window's designer advantage


@dataclass
class PlayedEnv:
    """An environment of the current window, its hint, and the outcomes of its plays so far."""
    env_id: str
    skill: str                          # the skill it was designed for ('' for --env-pool and --backfill ones)
    code: str
    design: Design | None               # None for --env-pool and --backfill environments
    origin: str = "designer"            # designer | env_pool | backfill
    hint: str = ""
    hinted: list = dataclasses.field(default_factory=list)     # returns of the hinted plays (first step)
    unhinted: list = dataclasses.field(default_factory=list)   # returns of the unhinted plays, one list per step
    trained: list = dataclasses.field(default_factory=list)    # same shape: did the play produce tokens
    hung: bool = False                  # a play hit a step timeout: dropped for the rest of the window
    hung_step: int | None = None        # the window's step where it hung (0: the first, paid the hang penalty)
    stats: dict = dataclasses.field(default_factory=dict)      # evaluate.environment_stats, at the first step
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
        """The window as the checkpoint's state.json holds it (episodes are not saved; designs by index)."""
        attempts = [{**dataclasses.asdict(d), "verdict": d.verdict.to_json()} for d in self.attempts]
        saved = [f.name for f in dataclasses.fields(PlayedEnv) if f.name not in ("design", "episodes")]
        played = [{**{k: getattr(e, k) for k in saved}, "design": self.attempts.index(e.design) if e.design else None}
                  for e in self.envs]
        return {"start": self.start, "length": self.length, "skills": self.skills, "attempts": attempts,
                "envs": played}

    @classmethod
    def from_json(cls, d: dict, steps: int) -> "Window":
        attempts = [Design(**{**{k: v for k, v in a.items() if k != "logprobs"},   # an older run's recompute
                              "verdict": envs.Verdict.from_json(a["verdict"])}) for a in d["attempts"]]
        played = [PlayedEnv(**{**e, "design": None if e["design"] is None else attempts[e["design"]]})
                  for e in d["envs"]]
        return cls(d["start"], min(d["length"], steps - d["start"]), d["skills"], attempts, played)  # fewer --steps


@dataclass
class State:
    """What persists across steps (the model and optimizer, memory, corpus, slow means, the open window)."""
    cfg: Config
    run: runs.Run
    model: object
    tok: object
    optimizer: torch.optim.Optimizer
    memory: envs.Memory
    corpus: list[str]                   # grounding documents (none with --no-corpus or --env-pool)
    pool_envs: list[tuple[str, str]]    # --env-pool: (name, code), the fixed environments of agent-only training
    backfill_envs: list[tuple[str, str]]  # --backfill: (name, code) for slots the designer left empty
    mu_slow: dict                       # learning_potential's slow mean per skill
    window: Window | None = None        # the window being played; None between windows


def clean_hint(text: str, max_words: int = 100) -> str:
    """The hint is prose: drop code blocks, collapse whitespace, keep at most `max_words` words.

    >>> clean_hint("Try small numbers first.  ```python\\nprint(1)\\n```  Then halve.")
    'Try small numbers first. Then halve.'
    """
    text = re.sub(r"```.*?(```|$)", " ", text, flags=re.S)
    return " ".join(text.split()[:max_words])


def limits_of(cfg: Config) -> Limits:
    return Limits(call_timeout=cfg.call_timeout, memory_mb=cfg.env_memory_mb)


def sample_kwargs(cfg: Config, model=None) -> dict:
    """The sampling knobs of every generate; with the model, also whether it decodes from bf16 weight copies."""
    bf16 = {"bf16": models.bf16_autocast(cfg.generate_bf16, model)} if model is not None else {}
    return dict(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, static_cache=cfg.static_cache, **bf16)


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
    validated in the sandbox. Returns every attempt; the valid ones are each slot's environment. Under torchrun
    each rank designs its share of the slots, and every rank returns all the attempts."""
    cfg, attempts, filled = st.cfg, [], set()
    use_memory = not (cfg.no_memory or cfg.no_designer_training)
    for attempt in range(cfg.design_attempts):
        slots = [g for g in models.my_share(range(cfg.envs_per_step)) if g not in filled]
        if not slots:
            break
        prompts, docs, shown = [], [], []
        for g in slots:
            skill = skills[g % len(skills)]
            rng = random.Random(envs.derive_seed(cfg.seed, step, "designer", g * cfg.design_attempts + attempt))
            doc = None if cfg.no_corpus else envs.truncate_words(rng.choice(st.corpus), cfg.doc_words)  # its one cut
            positives = st.memory.positives(skill, rng) if use_memory else []
            negative = st.memory.negative(skill, rng) if use_memory else None
            prompts.append(models.chat_ids(st.tok, envs.designer_prompt(skill, doc, positives, negative, cfg.setting),
                                           cfg.thinking))
            docs.append(doc or "")
            shown.append([envs.example_program(cfg.setting)] + [p["code"][:envs.MEMORY_CODE_CHARS] for p in positives])
        outs = models.generate(st.model, st.tok, prompts, max_new_tokens=cfg.designer_max_new_tokens,
                                   seed=envs.derive_seed(cfg.seed, step, "designer-sample",
                                                         attempt * models.world_size() + models.rank()),
                                   **sample_kwargs(cfg, st.model))
        runs.fault_point("generate", step)
        codes = [envs.extract_code(envs.after_thinking(o.text)) for o in outs]
        # the validation seeds are drawn per program (envs.validation_seeds), so that no program can test for them
        seeds = [envs.derive_seed(cfg.seed, step, "validate", g * cfg.design_attempts + attempt) for g in slots]
        verdicts = evaluate.reject_copies(codes, envs.validate_many(codes, limits_of(cfg), cfg.max_turns, cfg.setting,
                                                                    seeds, cfg.fair_games),
                                          shown, cfg.max_turns, limits_of(cfg), cfg.setting)   # no repeat of an example
        for g, doc, out, code, verdict in zip(slots, docs, outs, codes, verdicts):
            attempts.append(Design(g, attempt, skills[g % len(skills)], " ".join(doc.split()[:12]), out.prompt_ids,
                                   out.completion_ids, out.text, code, verdict,
                                   out.logprobs if verdict.valid or cfg.invalid_samples else None))
            if verdict.valid:
                filled.add(g)
    return sorted(sum(models.gather(attempts, "the designs"), []), key=lambda d: (d.attempt, d.slot))


def open_window(st: State, step: int) -> Window:
    """Phases 1-3 at a window's first step: the designer's valid programs (slots it left empty take a
    --backfill environment, round-robin), or a slice of the fixed --env-pool."""
    cfg = st.cfg
    length = min(cfg.regen_interval, cfg.steps - step)
    # subtle: skills rotate per window, not per step; by step, R = 4 would only ever design skills 0, 4, 2
    skills = active_skills(cfg, step // cfg.regen_interval)
    if st.pool_envs:
        picks = [st.pool_envs[(step * cfg.envs_per_step + g) % len(st.pool_envs)] for g in range(cfg.envs_per_step)]
        attempts, played = [], [PlayedEnv(env_id(step, g, name), "", code, None, "env_pool")
                                for g, (name, code) in enumerate(picks)]
    else:
        attempts = design(st, step, skills)
        played = [PlayedEnv(env_id(step, d.slot), d.skill, d.code, d) for d in attempts if d.verdict.valid]
        empty = [g for g in range(cfg.envs_per_step) if g not in {e.design.slot for e in played}]
        for g in empty if st.backfill_envs else []:
            name, code = st.backfill_envs[(step * cfg.envs_per_step + g) % len(st.backfill_envs)]
            played.append(PlayedEnv(env_id(step, g, name), "", code, None, "backfill"))
    folder = st.run.env_dir(step)       # the programs are on disk from the start; scores follow at the end
    if models.is_main():                # under torchrun rank 0 alone writes the run directory
        folder.mkdir(parents=True, exist_ok=True)
        for e in played:
            runs.write_atomic(folder / f"{e.env_id}.py", e.code)
    return Window(step, length, skills, attempts, played)


def write_hints(st: State, step: int, played: list[PlayedEnv]) -> None:
    """Phase 4: the same model reads each environment's source and writes a short strategy hint (not trained),
    sampled at --hint-temperature (under torchrun each rank hints its share of the environments)."""
    cfg = st.cfg
    if not played or cfg.hinted_plays == 0:
        return

    def hints(mine: list[PlayedEnv]) -> list[str]:
        prompts = [models.chat_ids(st.tok, envs.hint_prompt(e.code, setting=cfg.setting), cfg.thinking) for e in mine]
        outs = models.generate(st.model, st.tok, prompts, max_new_tokens=cfg.hint_max_new_tokens,
                               seed=envs.derive_seed(cfg.seed, step, "hint", models.rank()),
                               **{**sample_kwargs(cfg, st.model), "temperature": cfg.hint_temperature})
        runs.fault_point("hint", step)
        return [clean_hint(envs.after_thinking(out.text)) or envs.fallback_hint() for out in outs]
    for e, hint in zip(played, models.shared(hints, played, "the hints")):
        e.hint = hint


HUNG = ("timeout", "dropped")   # a play's failure when it hit a step timeout, or was stopped with one that did


def unhinted_plays(e: PlayedEnv) -> list:
    """This step's unhinted plays of an environment, less those a hang ended (e.unhinted[-1]'s, in order)."""
    return [ep for ep in e.episodes if ep.spec.hint is None and ep.failure not in HUNG]


def play_all(st: State, step: int, played: list[PlayedEnv], hinted: bool) -> dict:
    """Phase 5: every play of every environment still in the window advances together, one generate per turn:
    P unhinted plays with fresh seeds each step, and at the window's first step H hinted ones. Play i with and
    without the hint shares the environment seed (a paired comparison). Under torchrun each rank plays its share
    of the plays (by global index, the seeds unchanged), in waves when the memory plan says all do not fit
    (--play-wave), and every rank gets all the episodes back.

    subtle: one generate call samples its whole batch from one seed, so each rank's batch takes its own (the
    rank's index; 0 in one process). The tokens a row samples depend on its batch anyway: N ranks sample other
    episodes than one process would, greedy ones the same."""
    cfg, specs, timing = st.cfg, [], {"generate_s": 0.0, "sandbox_s": 0.0, "generated_tokens": 0, "generate_calls": 0}
    prompt = (cfg.agent_prompt, cfg.agent_reply_prefix)
    for j, e in enumerate(played):
        for i in range(max(cfg.plays, cfg.hinted_plays if hinted else 0)):
            env_seed = envs.derive_seed(cfg.seed, step, "env", j * 1000 + i)
            if i < cfg.plays:
                specs.append(spade_mini.EpisodeSpec(e.code, env_seed, None, (j, False, i), *prompt))
            if hinted and i < cfg.hinted_plays:
                specs.append(spade_mini.EpisodeSpec(e.code, env_seed, e.hint, (j, True, i), *prompt))

    def play_share(mine: list) -> list:   # this rank's plays, in even waves of at most what the memory plan allows
        out, waves = [], -(-len(mine) // (cfg.play_wave or max(len(mine), 1)))
        for k in range(waves):
            stats: dict = {}
            out += spade_mini.play(
                st.model, st.tok, mine[k * len(mine) // waves: (k + 1) * len(mine) // waves], max_turns=cfg.max_turns,
                max_new_tokens=cfg.agent_max_new_tokens, max_episode_tokens=cfg.agent_max_episode_tokens,
                max_observation_tokens=cfg.agent_max_observation_tokens, limits=limits_of(cfg),
                seed=envs.derive_seed(cfg.seed, step, "agent", models.rank() * 1000 + k),
                stats=stats, thinking=cfg.thinking, setting=cfg.setting, tool_rounds=cfg.tool_rounds,
                **sample_kwargs(cfg, st.model))
            timing.update({key: timing[key] + value for key, value in stats.items()})
        return out
    episodes = models.shared(play_share, specs, "the plays")
    runs.fault_point("play", step)
    for j, e in enumerate(played):
        e.episodes = [ep for ep in episodes if ep.spec.key[0] == j]
        # a play that hung, and those dropped with it, leave no return: the official code drops them too
        e.hinted += [ep.episode_return for ep in e.episodes if ep.spec.hint is not None and ep.failure not in HUNG]
        plays = unhinted_plays(e)
        e.unhinted.append([ep.episode_return for ep in plays])
        e.trained.append([any(ep.loss_mask) for ep in plays])   # a play that failed to start has no tokens
        if e.hung_step is None and any(ep.failure == "timeout" for ep in e.episodes):
            e.hung, e.hung_step = True, len(e.unhinted) - 1
    return {"perf/generate_tok_per_s": timing["generated_tokens"] / max(timing["generate_s"], 1e-9),
            "perf/sandbox_s": timing["sandbox_s"], "perf/generate_s": timing["generate_s"]}


def score(st: State, window: Window) -> list[dict]:
    """Phase 6 at the window's last step: R_hint, R_nohint, regret, w, win rate, designer reward and advantage of
    each environment, and the slow means, all from regret.score_window (the function `spade-mini score` runs). The
    designer's environments and the pool/backfill ones (whose designer fields are then unused) are scored as two
    inputs. Returns the window records for samples.jsonl (input and output, so anyone can recompute them)."""
    records = []
    for designed in (True, False):
        chosen = [e for e in window.envs if (e.design is not None) == designed]
        rejected = ([d for d in window.attempts if not d.verdict.valid and d.completion_ids]
                    if designed and st.cfg.invalid_samples else [])   # opt-in: centred with their skill's valid ones
        if not chosen and not rejected:
            continue
        given = {"variant": st.cfg.designer_reward, "window": window.length, "hang_penalty": st.cfg.timeout_penalty,
                 "invalid_reward": st.cfg.invalid_reward,
                 "envs": [dict(skill=e.skill, hung_step=e.hung_step, hinted=e.hinted, unhinted=e.unhinted,
                               trained=e.trained, caught=bool(e.stats.get("guard")))   # the play guard's finding
                          for e in chosen] + [dict(skill=d.skill, hung_step=None, hinted=[], unhinted=[],
                                                   invalid=True, slot=d.slot, attempt=d.attempt) for d in rejected],
                 "mu_slow": dict(st.mu_slow)}   # score's input
        out = regret.score_window(given["variant"], given["envs"], given["mu_slow"], given["window"],
                                  hang_penalty=given["hang_penalty"], invalid_reward=given["invalid_reward"])
        if designed:                    # pool and backfill environments leave the slow means alone
            st.mu_slow = out["mu_slow"]
        for e, row in zip(chosen, out["envs"]):
            e.scores = row
        for d, row in zip(rejected, out["envs"][len(chosen):]):
            d.advantage = row["designer_advantage"]
        records.append(dict(kind="window", start=window.start, designed=designed, input=given, output=out))
    return records


def remember(st: State, window: Window) -> None:
    """Phase 7 at the window's last step: each environment's scores next to its program, and one memory record
    per designed environment (hung ones too, marked: they have scores, and are never shown as positives)."""
    folder = st.run.env_dir(window.start)
    for e in window.envs:
        if models.is_main():            # every rank remembers; rank 0 alone writes
            runs.write_atomic(folder / f"{e.env_id}.json",
                              json.dumps(dict(skill=e.skill, origin=e.origin, hint=e.hint, hung=e.hung, **e.stats,
                                              **{k: v for k, v in e.scores.items() if k != "agent_advantages"}),
                                         indent=2) + "\n")
        runs.fault_point("memory", window.start + window.length - 1)
        if e.design is None:
            continue                    # pool and backfill environments are not the designer's
        st.memory.add(dict(env_id=e.env_id, file=str(folder / f"{e.env_id}.py"), skill=e.skill, code=e.code,
                           step=window.start, hung=e.hung, signature=evaluate.mechanics_signature(e.code),
                           **{k: e.scores[k] for k in ("win_rate", "regret", "r_hint", "r_nohint", "w")}),
                      st.cfg.memory_duplicates)
    if models.is_main():
        st.memory.save()


def agent_samples(played: list[PlayedEnv]) -> tuple[list, dict]:
    """Phase 8a, every step: the agent's unhinted plays of this step, z-scored within each environment over
    the plays that produced tokens (regret.agent_advantages, as score_window does). Hinted plays are never
    trained, nor plays that hung or were dropped with one (the survivors are, as in the official code); groups
    whose returns all tie are dropped (departure 4, docs/details.md). pi_sampling (TIS) is the sampler's record."""
    samples, groups = [], []
    for e in played:
        plays = unhinted_plays(e)
        groups.append([r for r, t in zip(e.unhinted[-1], e.trained[-1]) if t])
        advantages = regret.agent_advantages(e.unhinted[-1], e.trained[-1])
        if not any(advantages):
            continue                    # a tie: no gradient
        samples += [spade_mini.Sample(ep.token_ids, ep.loss_mask, adv, "agent", *[ep.rollout_logprobs] * 2)
                    for ep, adv, t in zip(plays, advantages, e.trained[-1]) if t]
    return samples, {"agent/zero_variance_frac": evaluate.zero_variance_fraction(groups) if groups else None}


def designer_samples(cfg: Config, window: Window) -> list:
    """Phase 8a, at the window's last step: one sample per designed environment with score_window's advantage
    (and per rejected program under --invalid-samples), carrying what the sampler recorded as it drew it, R - 1
    updates ago: the update's TIS weight corrects for both the staleness and the sampler/trainer mismatch."""
    if cfg.no_designer_training:
        return []
    scored = [(e.design, e.scores["designer_advantage"]) for e in window.envs if e.design is not None]
    scored += [(d, d.advantage) for d in window.attempts if not d.verdict.valid]
    return [spade_mini.Sample(d.prompt_ids + d.completion_ids, [0] * len(d.prompt_ids) + [1] * len(d.completion_ids),
                              advantage, "designer", *[d.rollout_logprobs and [0.0] * len(d.prompt_ids)
                                                       + d.rollout_logprobs] * 2)
            for d, advantage in scored if advantage != 0 and d.completion_ids]


def optimize(st: State, step: int, samples: list) -> dict:
    """Phase 8b: --updates-per-step optimizer steps (default one) over both roles' samples (PPO-clip form,
    micro-batched by tokens)."""
    counts = {"loss/samples_agent": sum(s.role == "agent" for s in samples),
              "loss/samples_designer": sum(s.role == "designer" for s in samples)}
    if not samples:
        return {"loss/policy": None, **counts}
    cfg = st.cfg
    out = spade_mini.update(st.model, st.optimizer, samples, temperature=cfg.logprob_temperature or cfg.temperature,
                            clip_low=cfg.clip_low, clip_high=cfg.clip_high, kl_beta=cfg.kl_beta,
                            token_budget=cfg.token_budget, max_grad_norm=cfg.max_grad_norm,
                            pad_id=st.tok.pad_token_id or 0, updates=cfg.updates_per_step,
                            seed=envs.derive_seed(cfg.seed, step, "update", 0),
                            bf16=models.bf16_autocast(cfg.train_bf16, st.model))
    names = {"loss": "loss/policy", "tokens_per_s": "perf/train_tok_per_s", "peak_mem_mb": "perf/peak_mem_mb"}
    return {**{names.get(k, f"loss/{k}"): v for k, v in out.items() if k not in ("samples", "seconds", "padded_tokens")},
            **counts}


# -----------------------------------------------------------------------------------------------------------
# one self-play step, then the loop around it

@contextlib.contextmanager
def phase(bar, clock: dict, name: str):
    """Time one phase into clock['perf/<name>_s'] and advance the step's progress bar (live while it runs)."""
    t = time.time()
    with runs.ticking(bar, name, models.tokens_sampled):
        yield
    clock[f"perf/{name}_s"] = time.time() - t
    clock.update(models.phase_memory(name))   # peak memory (CUDA: allocated, reserved; CPU: RSS), then freed
    bar.update()


def self_play_step(st: State, step: int) -> dict:
    """design -> validate -> hint -> play -> score -> remember -> update; returns the step's metrics record.

    With --regen-interval R the first four phases run at a window's first step only, score and remember at
    its last; play and the agent's update run every step."""
    cfg, clock, t0, window_records = st.cfg, {}, time.time(), []
    first = st.window is None
    bar = runs.step_bar(step, models.is_main())   # tqdm on a terminal, a line a minute into a log

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
            clock.update(evaluate.environment_stats(live, cfg.max_turns, limits_of(cfg),
                                                    guard=cfg.play_guard and cfg.setting == "games"))
        if last:
            window_records = score(st, window)
            remember(st, window)
        clock.update(evaluate.memory_stats(st.memory.records))

    # 8. update: per-role advantages, then the optimizer step(s) for both roles
    with phase(bar, clock, "update"):
        samples, sample_stats = agent_samples(live)
        samples += designer_samples(cfg, window) if last else []
        runs.fault_point("update", step)
        clock.update({**sample_stats, **optimize(st, step, samples)})
    bar.close()
    clock["perf/step_s"] = time.time() - t0

    if models.is_main():
        runs.log_samples(st.run, step, window, live, first, window_records, cfg.episodes_logged)
    if last:
        st.window = None
    return runs.step_metrics(step, window, live, first, last, models.timings_across_ranks(clock))


def save_checkpoint(st: State, step: int) -> None:
    """The LoRA adapter, optimizer and RNG (models.save_checkpoint), the memory, and the loop's state: the step,
    the slow means and an open window's programs, hints and outcomes, so that a resume continues it."""
    st.memory.save()                   # subtle: before a window's first end there is no memory.json yet
    state = {"step": step, "mu_slow": st.mu_slow, "window": st.window.to_json() if st.window else None}
    models.save_checkpoint(st.run.checkpoints / f"step_{step:05d}", st.model, st.optimizer,
                           {"memory.json": st.run.memory.read_text(), "state.json": json.dumps(state) + "\n"},
                           keep=st.cfg.keep_checkpoints)
    runs.write_atomic(st.run.last_checkpoint, json.dumps({"step": step}) + "\n")   # a resume checks it is there


def load_checkpoint(st: State, ckpt: Path) -> None:
    try:
        state = models.load_checkpoint(ckpt, st.model, st.optimizer)
        st.mu_slow = state["mu_slow"]
        st.window = Window.from_json(state["window"], st.cfg.steps) if state.get("window") else None
        records = envs.Memory.records_of(json.loads((ckpt / "memory.json").read_text()))   # checked, not copied
    except Exception as err:           # a truncated or foreign file: which checkpoint, not a traceback
        raise runs.InputError(f"--resume: {ckpt}: {type(err).__name__}: {err} (remove it, then spade-mini train "
                              f"--resume {st.run.root} --rewind)") from err
    st.memory = envs.Memory(st.run.memory, st.cfg.memory_capacity, records)
    st.memory.save()
    for e in st.window.envs if st.window else ():   # an open window's scores were written in a lost timeline
        (st.run.env_dir(st.window.start) / f"{e.env_id}.json").unlink(missing_ok=True)


def size_to_card(cfg: Config) -> Config:
    """On CUDA (or with --gpu-gb) the memory plan (runs.plan) picks how many episodes decode together and the
    micro-batch token budget; a run that cannot fit stops here, in one line, before the model loads."""
    gpu = cfg.gpu_gb or models.free_gpu_gb()
    if not gpu:
        return cfg
    if cfg.model not in runs.MODEL_SHAPES and not Path(cfg.model).expanduser().is_dir():
        runs.warn(f"no shape known for {cfg.model}: the run is not sized to the card (spade-mini plan --help)")
        return cfg
    plan = runs.plan(cfg, gpu)
    if not plan["fits"]:
        worst = max(plan["phases"], key=lambda name: plan["phases"][name]["peak"])
        raise runs.InputError(f"{cfg.model} does not fit {gpu:.1f} GiB: {worst} needs "
                              f"{plan['phases'][worst]['peak']:.1f} GiB by the plan (spade-mini plan shows each phase)")
    g = plan["geometry"]
    if models.is_main():
        print(f"memory plan: peak {plan['peak_gb']:.1f} of {gpu:.1f} GiB; play in {g['waves']} wave(s) of "
              f"{g['play_wave']} episodes, token budget {g['token_budget']}", flush=True)
    return dataclasses.replace(cfg, play_wave=min(cfg.play_wave or g["play_wave"], g["play_wave"]),
                               token_budget=g["token_budget"])


def start(cfg: Config) -> tuple[State, int]:
    """Read every input and load the model, then open (or reopen) the run directory: a bad corpus or folder,
    or a model that cannot load, leaves no run directory behind."""
    cfg = runs.resumed_config(cfg) if cfg.resume else cfg
    if models.is_main():                # subtle: another rank may already have created it (it is rank 0's)
        runs.hold_run(cfg.resume, "--resume") if cfg.resume else runs.check_new_out(cfg.out)
    cfg = size_to_card(cfg)
    corpus = [] if (cfg.no_corpus or cfg.env_pool) else runs.load_corpus(cfg.corpus or None, setting=cfg.setting)
    limits = limits_of(cfg)
    pool = envs.load_folder(cfg.env_pool, "--env-pool", limits, cfg.max_turns, cfg.setting)[0] if cfg.env_pool else []
    backfill = envs.load_folder(cfg.backfill, "--backfill", limits, cfg.max_turns, cfg.setting)[0] \
        if cfg.backfill and not cfg.env_pool else []
    model, tok, info = models.load_model(
        cfg.model, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
        quantize=cfg.quantize, gradient_checkpointing=cfg.gradient_checkpointing, cache_dir=cfg.cache_dir,
        seed=cfg.seed)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    models.gather(None, "the inputs")   # torchrun: every rank loaded all of them before the run directory opens
    if not models.is_main():
        return same_state_as_main(State(cfg, None, model, tok, optimizer, None, corpus, pool, backfill, {}), 0)
    cfg, run, first_step = runs.open_run(cfg)
    if not any("config" in r for r in runs.read_jsonl(run.metrics)):   # the header: resolved config first
        run.log_metrics({"config": dataclasses.asdict(cfg), "model": info, "sandbox": isolation_report(),
                         "world_size": models.world_size()})
    memory = envs.Memory(run.memory, cfg.memory_capacity, [] if first_step else None)   # resumed: the checkpoint's
    st = State(cfg, run, model, tok, optimizer, memory, corpus, pool, backfill, {})
    if first_step > 0:
        load_checkpoint(st, run.latest_checkpoint())
    print(f"resumed {run.root} at step {first_step}" if first_step else f"run directory: {run.root}", flush=True)
    return same_state_as_main(st, first_step)


def same_state_as_main(st: State, first_step: int) -> tuple[State, int]:
    """torchrun: rank 0 alone opened the run directory and read its checkpoint; every rank takes rank 0's
    config, step, memory, slow means and open window, LoRA weights and optimizer state (models.py)."""
    if models.world_size() == 1:
        return st, first_step
    main = (st.cfg, first_step, st.memory and st.memory.records, st.mu_slow, st.window and st.window.to_json())
    cfg, first_step, records, mu_slow, window = models.from_main(main, "the run's state")
    if not models.is_main():            # the run's paths, never written to from here
        st.cfg, st.run, st.mu_slow = cfg, runs.Run(cfg.out), mu_slow
        st.memory = envs.Memory(st.run.memory, cfg.memory_capacity, records)
        st.window = Window.from_json(window, cfg.steps) if window else None
    models.same_weights_as_main(st.model, st.optimizer)
    return st, first_step


@runs.let_go_on_error   # a run that raises lets its directory go, as runs.end_run does a finished one
def train(cfg: Config) -> Path:
    """Run self-play from step 0 (or the resumed step) to cfg.steps: one metrics record per step, a
    checkpoint every --checkpoint-every steps and at the end. Under torchrun (cli.py joins the process group)
    every rank runs this loop, and rank 0 alone logs, prints and checkpoints."""
    st, first_step = start(cfg)
    cfg, run, main = st.cfg, st.run, models.is_main()
    writer = runs.tensorboard_writer(cfg.tensorboard and main, run, first_step)
    if cfg.eval_every and first_step == 0:   # the untrained base model, logged as step -1
        base = held_out_eval(st)
        if main:
            run.log_metrics({"step": -1, **base})
    for step in range(first_step, cfg.steps):
        record = self_play_step(st, step)
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step == cfg.steps - 1):
            record.update(held_out_eval(st))
        if not main:
            continue                    # rank 0 alone logs, prints and checkpoints
        run.log_metrics(record)
        runs.fault_point("metrics", step)
        runs.print_step(record)
        runs.log_tensorboard(writer, record, step)
        if (step + 1) % cfg.checkpoint_every == 0 or step == cfg.steps - 1:
            save_checkpoint(st, step)
    if main:
        runs.end_run(run)
    return run.root


def held_out_eval(st: State) -> dict:
    """eval/score, eval/<category>, eval/answered (and eval/pool_win_rate, eval/bfcl_multi_turn_base) of the
    current weights (evaluate.py)."""
    cfg = st.cfg
    return evaluate.eval_metrics(st.model, st.tok, limit=cfg.eval_limit, seed=cfg.seed,
                                 max_new_tokens=evaluate.answer_tokens(cfg.agent_max_new_tokens),
                                 env_pool=cfg.eval_pool, pool_plays=cfg.plays, max_turns=cfg.max_turns,
                                 max_episode_tokens=cfg.agent_max_episode_tokens, limits=limits_of(cfg),
                                 suites=cfg.eval_suites.split(","), setting=cfg.setting, prompt=cfg.agent_prompt,
                                 reply_prefix=cfg.agent_reply_prefix)

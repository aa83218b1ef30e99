"""The `spade-mini` command line: train, validate, play, score, eval, report.

A support module (a first read of the method may skip it). `train`'s flags are generated from train.Config
(`--group-size` <-> `cfg.group_size`, the field's trailing comment is its help). Bad input of any kind ends in
one line `spade-mini: error: ...` and exit code 2, never a traceback.

subtle: the heavy modules are imported only by the commands that need them (the only lazy imports of the
project), so `validate`, `play`, `score` and `report` start without torch.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import os
import re
import sys
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
    "eval": "held-out evaluation: reasoning-gym and an environment pool",
    "report": "write RUN_DIR/report/index.html: plots and environments",
}


# -----------------------------------------------------------------------------------------------------------
# spade-mini train: flags generated from Config, checked before anything is loaded

def field_help(config_class) -> dict[str, str]:
    """The trailing comment of each Config field is its --help text (one source of truth)."""
    return dict(re.findall(r"^\s+(\w+): [^#\n]+#\s*(.+)$", inspect.getsource(config_class), flags=re.M))


def add_config_flags(parser: argparse.ArgumentParser, config_class) -> None:
    helps = field_help(config_class)
    for f in dataclasses.fields(config_class):
        flag = "--" + f.name.replace("_", "-")
        text = f"{helps.get(f.name, '')} (default: {f.default!r}; presets may change it)"
        if f.type in ("bool", bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=text)
        else:
            kind = {"int": int, "float": float}.get(str(f.type), str)
            parser.add_argument(flag, type=kind, default=argparse.SUPPRESS, metavar=f.name.upper(), help=text)


def config_from_args(train, explicit: dict):
    """Precedence: Config defaults < preset < flags given on the command line."""
    preset = explicit.get("preset", train.Config.preset)
    if preset not in train.PRESETS:
        raise InputError(f"unknown preset {preset!r}; choose one of {', '.join(train.PRESETS)}")
    return train.Config(**{**train.PRESETS[preset], **explicit, "preset": preset})


def check_config(train, cfg) -> None:
    """Reject nonsensical values with one clear sentence, before a model is loaded."""
    for name in ("steps", "envs_per_step", "design_attempts", "max_turns", "designer_max_new_tokens",
                 "agent_max_new_tokens", "agent_max_episode_tokens", "token_budget", "skills_per_step",
                 "doc_words", "memory_capacity", "lora_r", "checkpoint_every", "keep_checkpoints",
                 "env_memory_mb", "eval_limit", "regen_interval", "updates_per_step"):
        if getattr(cfg, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(cfg, name)})")
    for name in ("plays", "hinted_plays", "episodes_logged", "kl_beta", "hint_max_new_tokens", "eval_every"):
        if getattr(cfg, name) < 0:
            raise InputError(f"--{name.replace('_', '-')} must be >= 0 (got {getattr(cfg, name)})")
    if cfg.designer_reward not in regret.DESIGNER_REWARDS:
        raise InputError(f"--designer-reward must be one of {', '.join(regret.DESIGNER_REWARDS)}")
    if cfg.quantize not in ("auto", "none", "nf4"):
        raise InputError("--quantize must be auto, none or nf4")
    if not (cfg.temperature > 0 and 0 < cfg.top_p <= 1 and cfg.lr > 0 and cfg.call_timeout > 0):
        raise InputError("--temperature, --lr and --call-timeout must be > 0 and --top-p in (0, 1]")
    if cfg.hint_temperature < 0:
        raise InputError(f"--hint-temperature must be >= 0 (0 = greedy; got {cfg.hint_temperature})")
    if cfg.plays < 2:
        raise InputError("--plays must be >= 2: the agent advantage is a z-score within an environment's plays")
    for path, flag in ((cfg.corpus, "--corpus"), (cfg.env_pool, "--env-pool"), (cfg.eval_pool, "--eval-pool"),
                       (cfg.backfill, "--backfill")):
        if path and not Path(path).exists():
            raise InputError(f"{flag}: {path} does not exist")
    model_path = Path(os.path.expanduser(cfg.model))
    if (cfg.model.endswith(".gguf") or cfg.model.startswith((".", "/", "~"))) and not model_path.exists():
        raise InputError(f"--model: {cfg.model} does not exist")
    train.active_skills(cfg, 0)  # raises on unknown skill names


def cmd_train(explicit: dict) -> int:
    import train
    cfg = config_from_args(train, explicit)
    check_config(train, cfg)
    train.train(cfg)
    return 0


# -----------------------------------------------------------------------------------------------------------
# spade-mini validate / play

def read_file(path: str, limit: int = 1_000_000) -> bytes:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{path}: no such file")
    if p.stat().st_size > limit:
        raise InputError(f"{path}: larger than {limit // 1_000_000} MB")
    return p.read_bytes()


def cmd_validate(path: str, as_json: bool, timeout: float) -> int:
    if not Path(path).is_file():
        raise InputError(f"{path}: no such file")
    verdict = envs.validate(Path(path).read_bytes(), Limits(call_timeout=timeout))  # bytes: bad UTF-8 is a reason
    print(f"{path}: {'valid' if verdict.valid else 'rejected'} ({verdict.reason})"
          + (f" class {verdict.class_name}" if verdict.class_name else "") + (f": {verdict.detail}" if verdict.detail else ""))
    for name, ok in verdict.checks.items():
        print(f"  {'skip' if ok is None else 'ok  ' if ok else 'FAIL'} {name}")
    if as_json:
        print(json.dumps({**verdict.to_json(), "sandbox": isolation_report()}))
    return 0 if verdict.valid else 1


def play_scripted(code: str, actions: list[str], seed: int, max_turns: int = 12,
                  limits: Limits = Limits()) -> dict:
    """Replay action texts (one per turn, through envs.to_action) until the episode ends, the actions run out
    or max_turns; for `spade-mini play --actions`. Returns {return, turns, terminated, failure, transcript}."""
    transcript: list[dict] = []
    last_reward, terminated, failure, turns = None, False, None, 0
    try:
        with envs.open_env(code, max_turns, limits) as env:
            transcript.append({"turn": 0, "observation": envs.parse_reset(env.call("reset", seed))})
            for turns, text in enumerate(actions[:env.max_turns or max_turns], start=1):
                action = envs.to_action(text)
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


def cmd_play(path: str, seed: int, actions_file: str, max_turns: int, timeout: float) -> int:
    code = read_file(path).decode("utf-8", errors="replace")
    limits = Limits(call_timeout=timeout)
    if actions_file:
        if not Path(actions_file).is_file():
            raise InputError(f"--actions: {actions_file}: no such file")
        actions = [a for a in Path(actions_file).read_text(errors="replace").splitlines() if a.strip()]
        result = play_scripted(code, actions, seed=seed, max_turns=max_turns, limits=limits)
        for t in result["transcript"]:
            print(f"turn {t.get('turn')}: action {t.get('action')!r} -> reward {t.get('reward')}")
        print(json.dumps({k: result[k] for k in ("return", "turns", "terminated")}))
        return 0
    return play_interactive(code, seed, max_turns, limits)


def play_interactive(code: str, seed: int, max_turns: int, limits: Limits) -> int:
    """A person plays: observation, reward and turn each turn; type an action (\\boxed{} added if missing)."""
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
# spade-mini score: one window of outcomes in, every reward and advantage out (regret.score_window)

def check_score_input(data, designer_rewards: tuple, hang_penalty: float) -> dict:
    """The input of `spade-mini score` (README "Checking another implementation"), checked field by field;
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
    try:
        data = json.loads(read_file(path, limit=100_000_000).decode("utf-8"))
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


def eval_source(args: argparse.Namespace, train) -> tuple[str, Path | None, dict]:
    """(model name, adapter dir or None, models.load_model keyword arguments) from --preset/--model/--adapter/
    --run; also fills in the default --max-new-tokens from the preset."""
    import models
    if args.preset not in train.PRESETS:
        raise InputError(f"unknown preset {args.preset!r}; choose one of {', '.join(train.PRESETS)}")
    cfg = train.Config(**train.PRESETS[args.preset])
    name, lora, adapter = args.model or cfg.model, {"r": cfg.lora_r, "lora_alpha": cfg.lora_alpha}, None
    if args.run:
        run = runs.existing_run(args.run, "--run")
        adapter = run.latest_checkpoint()  # the newest step_NNNNN whose state.json exists
        if adapter is None:
            raise InputError(f"--run: {run.root} has no complete checkpoint (checkpoints/step_*/state.json)")
        name = args.model or json.loads(run.config.read_text())["model"]
    elif args.adapter:
        adapter = Path(args.adapter)
    if adapter is not None:
        if not (adapter / "adapter_model.safetensors").exists():
            raise InputError(f"{adapter}: no adapter_model.safetensors (not a peft adapter directory)")
        saved_lora = json.loads((adapter / "adapter_config.json").read_text())  # the rank must match the weights
        lora = {k: saved_lora[k] for k in lora}
    kwargs = dict(lora_r=lora["r"], lora_alpha=lora["lora_alpha"], lora_dropout=0.0, quantize=args.quantize,
                  gradient_checkpointing=False, cache_dir=args.cache_dir, seed=args.seed)
    if not args.max_new_tokens:  # the preset knows how long its model's answers run (tiny: 128)
        args.max_new_tokens = models.answer_tokens(cfg.agent_max_new_tokens)
    return name, adapter, kwargs


def cmd_eval(args: argparse.Namespace) -> int:
    """Prints one line per category, and with --json the result as the last stdout line."""
    import models
    import train
    if args.env_pool and not Path(args.env_pool).is_dir():
        raise InputError(f"--env-pool: {args.env_pool} is not a directory")
    if args.limit < 1:
        raise InputError(f"--limit must be >= 1 (got {args.limit})")
    name, adapter, kwargs = eval_source(args, train)
    try:
        model, tok = models.load_for_eval(name, adapter, **kwargs)
    except (ValueError, FileNotFoundError) as err:
        raise InputError(f"{err} ({name})") from err
    result = models.evaluate(model, tok, limit=args.limit, seed=args.seed, max_new_tokens=args.max_new_tokens,
                               batch_size=args.batch_size, progress=True)
    if args.env_pool:
        result.update(models.pool_win_rate(model, tok, args.env_pool, plays=args.pool_plays, seed=args.seed,
                                             max_turns=args.max_turns, max_new_tokens=args.max_new_tokens))
    result.update(model=name, adapter=str(adapter) if adapter else None, limit=args.limit, seed=args.seed)
    if args.save:
        runs.write_atomic(args.save, json.dumps(result, indent=2) + "\n")
    for category, s in result["categories"].items():
        print(f"{category:>12} {s:.3f}  ({models.CATEGORIES[category]}, {args.limit} items)")
    print(f"{'overall':>12} {result['score']:.3f}  (answered in \\boxed{{}}: {result['answered']:.0%})")
    if result.get("pool_win_rate") is not None:
        print(f"{'env pool':>12} {result['pool_win_rate']:.3f} win rate over {len(result['pool_envs'])} envs")
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "items"}))
    return 0


def cmd_report(run_dir: str) -> int:
    """`spade-mini report RUN_DIR`: write the report and print where it is."""
    import report
    try:
        index = report.write_report(run_dir)
    except FileNotFoundError as err:
        raise InputError(str(err)) from None
    if not report.load_run(Path(run_dir))[1]:
        print(f"{run_dir}: no completed steps yet; wrote a placeholder page")
    print(f"report: {index}")
    return 0


# -----------------------------------------------------------------------------------------------------------
# the parser, and main

def build_parser(command: str | None) -> argparse.ArgumentParser:
    """Every subcommand, with the arguments of `command` only (train's come from Config, which needs torch)."""
    parser = argparse.ArgumentParser(prog="spade-mini", description=__doc__.split("\n")[0])
    try:
        parser.add_argument("--version", action="version", version=f"spade-mini {version('spade-mini')}")
    except PackageNotFoundError:   # run from a checkout that was never installed
        pass
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = {name: sub.add_parser(name, help=text, description=text) for name, text in COMMANDS.items()}
    if command == "train":
        import train
        add_config_flags(p["train"], train.Config)
    for name in ("validate", "play"):
        p[name].add_argument("file", help="a Python file defining a *Env class")
        p[name].add_argument("--timeout", type=float, default=5.0, help="seconds per environment call")
    p["validate"].add_argument("--json", action="store_true", help="last stdout line is the verdict as JSON")
    p["play"].add_argument("--seed", type=int, default=0, help="reset seed")
    p["play"].add_argument("--actions", default="", help="file with one action per line (non-interactive)")
    p["play"].add_argument("--max-turns", type=int, default=12, help="turn cap")
    p["score"].add_argument("file", help="a JSON file of outcomes (format in the README)")
    add_eval_flags(p["eval"])
    p["report"].add_argument("run_dir", help="a run directory (holds metrics.jsonl)")
    return parser


def run_command(args: dict) -> int:
    command = args.pop("command")
    if command == "validate":
        return cmd_validate(args["file"], args["json"], args["timeout"])
    if command == "play":
        return cmd_play(args["file"], args["seed"], args["actions"], args["max_turns"], args["timeout"])
    if command == "score":
        return cmd_score(args["file"])
    if command == "eval":
        return cmd_eval(argparse.Namespace(**args))
    if command == "report":
        return cmd_report(args["run_dir"])
    return cmd_train(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args = vars(parser.parse_args(argv))
    if args.get("command") is None:
        args["command"] = "train"   # bare `spade-mini` runs the CPU demo
    try:
        return run_command(args)
    except InputError as err:
        print(f"spade-mini: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("spade-mini: interrupted; continue with --resume RUN_DIR", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

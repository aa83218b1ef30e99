"""`spade-mini export`: each format's package is loaded with the real library's own loader and plays a seeded
episode whose observations and rewards equal `spade-mini play --actions` (cli.play_scripted) on the same seed;
the program is copied byte for byte; invalid input is one line and exit 2. A test that needs a library is marked
`library(module, side)`: it runs here where the library imports, else in the interpreter .ci/run made for it
(tests/conftest.py; openenv, verifiers and harbor cannot install beside the project), else it skips and says why."""
import asyncio
import hashlib
import json
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import cli
import export

ROOT = Path(__file__).resolve().parent.parent
CUPS = ROOT / "examples" / "cups.py"
RUN = ROOT / "bench" / "results" / "designer_loop_9bf151a_run"   # a real run: 10 designed programs accepted
SEED, ACTIONS = 11, ["3", "2", "1"]   # three different cups: the episode always ends in a win, reward 1.0


def reference(program: Path = CUPS, seed: int = SEED, actions: list = ACTIONS) -> tuple[list, list]:
    """The observations (reset's first) and the rewards of `spade-mini play --seed SEED --actions`."""
    result = cli.play_scripted(program.read_text(encoding="utf-8"), actions, seed=seed)
    turns = result["transcript"]
    assert result["failure"] is None and turns[-1]["reward"] == 1.0   # a real episode: a win at its end
    return [t["observation"] for t in turns], [t["reward"] for t in turns[1:]]


@pytest.fixture
def exported(tmp_path, monkeypatch):
    """Export examples/cups.py in a format; the package's directory goes on sys.path (as `pip install` would put
    it), and its module is forgotten afterwards (every format's package is named spade_cups)."""
    def run(fmt: str) -> Path:
        assert cli.main(["export", str(CUPS), "--format", fmt, "--out", str(tmp_path / "out")]) == 0
        root = next((tmp_path / "out").iterdir())
        if fmt != "harbor":
            monkeypatch.syspath_prepend(str(root))
        return root
    yield run
    for name in [m for m in sys.modules if m == "spade_cups" or m.startswith("spade_cups.")]:
        del sys.modules[name]


def play_gym_like(env, seed: int = SEED, actions: list = ACTIONS) -> tuple[list, list]:
    """A seeded episode through reset/step with the agent's replies (the \\boxed{} action inside a sentence)."""
    obs, info = env.reset(seed=seed)
    observations, rewards = [obs], []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(f"I pick \\boxed{{{action}}}.")
        observations.append(obs)
        rewards.append(reward)
        if terminated or truncated:
            break
    env.close()
    return observations, rewards


@pytest.mark.library("gymnasium", "ecosystem")
def test_gymnasium_make_loads_the_export_and_plays_as_spade_mini_play(exported):
    gymnasium = pytest.importorskip("gymnasium", reason="gymnasium is not installed (pip install -e '.[ecosystem]')")
    exported("gymnasium")
    env = gymnasium.make("spade_cups:spade/cups-v0")   # Gymnasium imports spade_cups, which registers it
    assert play_gym_like(env) == reference()


@pytest.mark.library("gem", "ecosystem")
def test_gem_make_loads_the_export_and_plays_as_spade_mini_play(exported):
    gem = pytest.importorskip("gem", reason="gem-llm is not installed (pip install --no-deps gem-llm==0.1.0: README)")
    exported("gem")
    __import__("spade_cups")   # the package registers itself with GEM, as GEM's own environments do
    env = gem.make("spade/cups-v0")
    assert isinstance(env, gem.Env)
    assert play_gym_like(env) == reference()


# -----------------------------------------------------------------------------------------------------------
# what every format shares: the program's bytes, the metadata, invalid input

def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("spade-mini: error: "), err
    return err[0]


@pytest.mark.parametrize("fmt", export.FORMATS)
def test_every_format_holds_the_program_byte_for_byte_with_its_verdict_and_a_readme(fmt, tmp_path):
    program = tmp_path / "cups_crlf.py"   # CRLF line ends and a trailing comment: any rewrite would show
    program.write_bytes(CUPS.read_bytes().replace(b"\n", b"\r\n") + b"# end\r\n")
    written = export.export(str(program), fmt, str(tmp_path / "out"))
    assert len(written) == 1
    root, load = written[0]
    copies = list(root.rglob(f"{export.PROGRAM_DIR}/cups_crlf.py"))
    assert len(copies) == 1 and copies[0].read_bytes() == program.read_bytes()
    meta = json.loads((copies[0].parent.parent / export.METADATA).read_text())
    assert meta["sha256"] == hashlib.sha256(program.read_bytes()).hexdigest()
    assert meta["verdict"]["valid"] and meta["verdict"]["class_name"] == "CupsEnv" and meta["load"] == load
    readme = (root / "README.md").read_text()
    assert load in readme and "sandbox" in readme
    if fmt == "harbor":
        assert "CONTAINER-ONLY" in readme and "CONTAINER-ONLY" in (root / "task.toml").read_text()
    else:
        wrapper = (root / meta["package"] / "__init__.py").read_text()
        assert "SandboxedGame.from_package(HERE)" in wrapper   # the program's one way in: the sandbox
        assert not re.search(r"import\s+cups_crlf|\bexec\(|\bcompile\(|runpy", wrapper)   # never run here


def test_a_changed_program_is_refused_at_load(tmp_path):
    (root, _), = export.export(str(CUPS), "gem", str(tmp_path))
    copy = root / "spade_cups" / export.PROGRAM_DIR / "cups.py"
    copy.write_bytes(copy.read_bytes() + b"\n# edited\n")
    with pytest.raises(RuntimeError, match="sha256"):
        export.SandboxedGame.from_package(root / "spade_cups")


def test_the_sandboxed_game_is_spade_mini_play_on_the_same_seed(tmp_path):
    """The wrapper all Python formats share, without any library: a failure here is the wrapper's, not theirs."""
    (root, _), = export.export(str(CUPS), "gem", str(tmp_path))
    assert play_gym_like(export.SandboxedGame.from_package(root / "spade_cups")) == reference()


def test_an_environment_that_fails_validation_is_one_line_and_exit_2(tmp_path, capsys):
    bad = ROOT / "tests" / "envs" / "bad_step_raises.py"
    assert cli.main(["export", str(bad), "--format", "gymnasium", "--out", str(tmp_path / "out")]) == 2
    assert "rejected by validation (step_error)" in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_a_run_with_no_accepted_environment_is_one_line_and_exit_2(tmp_path, capsys):
    """A run whose designer wrote nothing valid (the CPU demo's): backfilled games are not the run's own."""
    run = tmp_path / "run"
    (run / "envs" / "step_00000").mkdir(parents=True)
    shutil.copy(CUPS, run / "envs" / "step_00000" / "env_00000_00_cups.py")   # a backfill
    (run / "samples.jsonl").write_text(json.dumps({"step": 0, "kind": "design", "slot": 0, "attempt": 0,
                                                   "verdict": {"valid": False, "reason": "syntax"}}) + "\n")
    assert cli.main(["export", str(run), "--format", "gem", "--out", str(tmp_path / "out")]) == 2
    assert "no accepted environment" in one_error_line(capsys)


@pytest.mark.parametrize("argv", [["nowhere.py"], ["README.md"]])
def test_a_missing_or_non_program_input_is_one_line_and_exit_2(argv, tmp_path, capsys):
    source = str(ROOT / argv[0]) if argv[0] == "README.md" else str(tmp_path / argv[0])
    assert cli.main(["export", source, "--format", "gem", "--out", str(tmp_path / "out")]) == 2
    one_error_line(capsys)


def test_a_run_exports_every_accepted_environment_with_its_hint_verdict_and_scores(tmp_path):
    rows = [json.loads(line) for line in (RUN / "samples.jsonl").read_text().splitlines()]
    accepted = {f"env_{r['step']:05d}_{r['slot']:02d}": r["verdict"] for r in rows
                if r["kind"] == "design" and r["verdict"]["valid"]}
    written = export.export(str(RUN), "gymnasium", str(tmp_path))
    assert sorted(root.name for root, _ in written) == sorted(f"spade_{e}" for e in accepted) and len(accepted) == 10
    for root, _ in written:
        env_id = root.name.removeprefix("spade_")
        meta = json.loads((root / root.name / export.METADATA).read_text())
        kept = json.loads(next(RUN.glob(f"envs/step_*/{env_id}.json")).read_text())
        assert meta["verdict"] == accepted[env_id] and meta["hint"] == kept["hint"] and meta["hint"]
        assert meta["scores"]["regret"] == kept["regret"] and meta["skill"] == kept["skill"]
        original = next(RUN.glob(f"envs/step_*/{env_id}.py")).read_bytes()
        assert (root / root.name / export.PROGRAM_DIR / f"{env_id}.py").read_bytes() == original


def test_an_environment_whose_scores_file_is_torn_is_exported_without_them_and_a_warning(tmp_path, capsys):
    """A torn envs/step_*/ENV_ID.json was a JSONDecodeError traceback that exported nothing."""
    import shutil
    run = tmp_path / "run"
    shutil.copytree(RUN, run, ignore=shutil.ignore_patterns("checkpoints"))
    torn = sorted(run.glob("envs/step_*/env_*_*.json"))[0]
    torn.write_text('{"hint": "Try the mid')
    written = export.export(str(run), "gymnasium", str(tmp_path / "out"))
    assert len(written) == 10 and f"{torn} is unreadable" in capsys.readouterr().err
    meta = json.loads((tmp_path / "out" / f"spade_{torn.stem}" / f"spade_{torn.stem}" / export.METADATA).read_text())
    assert meta["hint"] is None and meta["scores"] is None


def test_an_existing_package_is_never_overwritten(tmp_path, capsys):
    export.export(str(CUPS), "gem", str(tmp_path))
    assert cli.main(["export", str(CUPS), "--format", "gem", "--out", str(tmp_path)]) == 2
    assert "already exists" in one_error_line(capsys)


# -----------------------------------------------------------------------------------------------------------
# openenv, verifiers, harbor

@pytest.mark.library("openenv", "ecosystem")
def test_openenv_serves_the_export_with_its_own_app_and_plays_as_spade_mini_play(exported):
    pytest.importorskip("openenv.core.env_server.http_server", reason="openenv is not installed "
                        "(pip install -e '.[ecosystem]')")
    testclient = pytest.importorskip("fastapi.testclient", reason="fastapi's test client (httpx) is not installed")
    from openenv.core.env_server.http_server import create_app
    exported("openenv")
    package = __import__("spade_cups")
    app = create_app(package.SpadeEnvironment, package.SpadeAction, package.SpadeObservation, env_name="spade_cups")
    observations, rewards = [], []
    with testclient.TestClient(app) as client, client.websocket_connect("/ws") as session:   # one session
        session.send_json({"type": "reset", "data": {"seed": SEED}})
        observations.append(session.receive_json()["data"]["observation"]["text"])
        for action in ACTIONS:
            session.send_json({"type": "step", "data": {"text": f"I pick \\boxed{{{action}}}."}})
            reply = session.receive_json()["data"]
            observations.append(reply["observation"]["text"])
            rewards.append(reply["reward"])
            if reply["done"]:
                break
    assert (observations, rewards) == reference()


@pytest.mark.library("verifiers", "verifiers")
def test_verifiers_loads_the_export_as_a_taskset_and_its_env_plays_as_spade_mini_play(exported):
    """verifiers 0.4.0 loads a taskset package by id (its loaders import it and take the Taskset and Env its
    __all__ exports). The model's side is a scripted stand-in for verifiers' Interaction (no LLM here): it gives
    the replies and records the user turns the Env sends, which are the game's observations."""
    pytest.importorskip("verifiers.v1", reason="verifiers is not installed (pip install -e '.[verifiers]', apart "
                        "from openenv: README)")
    from verifiers.v1.agent import Segment
    from verifiers.v1.configs.taskset import TasksetConfig
    from verifiers.v1.utils.loaders import environment_class, load_taskset
    exported("verifiers")
    taskset = load_taskset(TasksetConfig(id="spade-cups"))
    task = next(t for t in taskset.take(SEED + 1) if t.data.seed == SEED)
    env_class = environment_class("spade-cups")
    assert env_class.__module__ == "spade_cups"

    class Interaction:   # the stand-in: what Env.run calls on agents.agent.interaction(task)
        def __init__(self):
            self.replies, self.user_turns, self.rewards = [f"I pick \\boxed{{{a}}}." for a in ACTIONS], [], {}
            self.trace = self

        def record_reward(self, name, value, weight=1.0):
            self.rewards[name] = value

        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc):
            return False

        async def turn(self, message=None):
            if message is not None:
                self.user_turns.append(message)
            return Segment(messages=[], root_reply=self.replies.pop(0)) if self.replies else \
                Segment(messages=[], terminated=True)

    interaction = Interaction()
    agents = type("Agents", (), {"agent": type("Agent", (), {"interaction": lambda self, t: interaction})()})()
    asyncio.run(env_class.run(object.__new__(env_class), task, agents))
    observations, rewards = reference()
    assert [task.data.prompt] + interaction.user_turns == observations[:-1]   # the last one ends the exchange
    assert interaction.rewards == {"episode_return": rewards[-1]}


def harbor_game(root: Path, tmp_path: Path, *args: str) -> str:
    """The task's `game` command run here as in the container: its modules, its game directory, a log."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root / "environment" / "spade-mini"),
           "SPADE_GAME_DIR": str(root / "environment" / "game"), "SPADE_ACTION_LOG": str(tmp_path / "actions.txt"),
           "SPADE_REWARD_FILE": str(tmp_path / "reward.txt")}
    script = root / ("tests/verify.py" if args == ("verify",) else "environment/game.py")
    done = subprocess.run([sys.executable, str(script), *([] if args == ("verify",) else args)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.library("harbor", "harbor")
def test_harbor_loads_the_exported_task(exported):
    pytest.importorskip("harbor.models.task.task", reason="harbor is not installed: harbor 0.25.0 requires "
                        "Python >= 3.12 (README)")
    from harbor.models.task.config import NetworkMode
    from harbor.models.task.task import Task
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no field of task.toml is one Harbor has deprecated (allow_internet was)
        task = Task(exported("harbor"))
    assert "game" in task.instruction and "CONTAINER-ONLY" in task.config.metadata["isolation"]
    assert task.config.environment.network_mode == NetworkMode.NO_NETWORK


def test_harbor_task_played_with_its_game_command_and_replayed_by_its_verifier_is_spade_mini_play(exported,
                                                                                                  tmp_path):
    """Container-only: here the task's own `game` command and verifier run on the host, with the spade-mini
    modules the container gets; no container is started."""
    root = exported("harbor")
    observations, rewards = reference(seed=0)
    assert harbor_game(root, tmp_path) == observations[0] + "\n"
    for turn, (action, obs, reward) in enumerate(zip(ACTIONS, observations[1:], rewards), 1):
        shown = harbor_game(root, tmp_path, action)
        assert shown == f"[turn {turn}] \\boxed{{{action}}}\n{obs}\n(reward {reward}" \
                        f"{', terminated' if turn == len(rewards) else ''})\n"
    harbor_game(root, tmp_path, "verify")
    assert float((tmp_path / "reward.txt").read_text()) == rewards[-1]

"""Basic behaviour of sandbox.py: round trips, error reasons, lifecycle, call_many, the isolation report.
Attacks live in test_hostile.py."""
import math
import os
import time

import pytest

import isolation
from sandbox import EnvProcess, Limits, SandboxError, call_many

FAST = Limits(call_timeout=2.0)

GUESS = '''
import random

class GuessEnv:
    def __init__(self, max_turns=12, high=100):
        self.max_turns, self.high = max_turns, high

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.secret, self.turn = self.rng.randint(1, self.high), 0
        return f"Guess a number in 1..{self.high}. Answer with \\\\boxed{{n}}.", {"high": self.high}

    def step(self, action):
        self.turn += 1
        guess = int(action.split("{")[1].split("}")[0])
        done = guess == self.secret
        hint = "correct" if done else ("higher" if guess < self.secret else "lower")
        return hint, 1.0 if done else 0.0, done, self.turn >= self.max_turns, {"turn": self.turn}

    def solution(self):
        return f"\\\\boxed{{{self.secret}}}"

    def crash(self):
        raise ValueError("bad move")
'''


def descendants(pid: int = os.getpid()) -> set:
    """Pids of every live (non-zombie) process below pid, read from /proc."""
    parent = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except (OSError, ValueError):
            continue
        if entry.isdigit() and fields[0] not in ("Z", "X"):
            parent[int(entry)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def test_reset_and_step_return_the_environments_values_unchanged():
    with EnvProcess(GUESS, {"max_turns": 3}, FAST) as env:
        obs, info = env.call("reset", 42)
        assert obs.startswith("Guess a number") and info == {"high": 100}
        answer = env.call("solution")
        assert env.call("step", answer) == ["correct", 1.0, True, False, {"turn": 1}]


def test_a_trainer_with_over_a_thousand_open_files_still_talks_to_its_children():
    """select.select refuses a descriptor past 1023 (ValueError out of EnvProcess, a crash of the caller); a
    trainer that holds many files (its checkpoints, datasets, sockets) under the usual limit of thousands got one."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with EnvProcess(GUESS, {"max_turns": 3}, FAST) as env:
            assert min(env._fds) > 1023 and env.call("reset", 42)[0].startswith("Guess a number")
            assert call_many([env], "step", [("\\boxed{50}",)])[0][1] == 0.0
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_call_timeout_past_polls_range_still_waits():
    """poll takes milliseconds below 2**31: a call_timeout of 1e7 s raised OverflowError out of every call."""
    with EnvProcess(GUESS, {"max_turns": 3}, Limits(call_timeout=1e7)) as env:
        assert env.call("reset", 42)[0].startswith("Guess a number")
        assert call_many([env], "step", [("\\boxed{50}",)])[0][1] == 0.0


def test_class_name_is_reported():
    with EnvProcess(GUESS) as env:
        assert env.class_name == "GuessEnv" and env.alive


def test_same_seed_gives_same_episode_in_two_children():
    with EnvProcess(GUESS) as a, EnvProcess(GUESS) as b:
        assert a.call("reset", 7) == b.call("reset", 7) and a.call("solution") == b.call("solution")


def test_set_order_is_the_same_in_every_child():
    """PYTHONHASHSEED=0: str hashes, hence set iteration order, agree across children."""
    code = ("class SetEnv:\n    def reset(self, seed=None):\n"
            "        return list({'apple', 'pear', 'fig', 'kiwi', 'plum'})\n")
    orders = set()
    for _ in range(3):
        with EnvProcess(code) as env:
            orders.add(tuple(env.call("reset")))
    assert len(orders) == 1


def test_json_types_round_trip():
    """Tuples -> lists, bools stay bools (not 1/0), int dict keys -> str, None stays None, NaN/inf survive."""
    code = '''
from collections import namedtuple, OrderedDict
P = namedtuple("P", "x y")
class TypesEnv:
    def step(self, action):
        return (("a", 1), True, False, None, 1.5, {1: "one"}, P(1, 2), OrderedDict(k=[()]),
                float("nan"), float("inf"), -float("inf"))
'''
    with EnvProcess(code) as env:
        out = env.call("step", "x")
    assert out[:8] == [["a", 1], True, False, None, 1.5, {"1": "one"}, [1, 2], {"k": [[]]}]
    assert out[1] is True and out[2] is False
    assert math.isnan(out[8]) and out[9] == math.inf and out[10] == -math.inf


def test_exception_in_method_is_error_and_child_stays_alive():
    with EnvProcess(GUESS, limits=FAST) as env:
        with pytest.raises(SandboxError) as err:
            env.call("crash")
        assert err.value.reason == "error" and err.value.detail == "ValueError: bad move"
        assert env.alive and env.call("reset", 1)[1] == {"high": 100}


def test_missing_method_is_error():
    with EnvProcess(GUESS) as env:
        with pytest.raises(SandboxError) as err:
            env.call("nope")
        assert err.value.reason == "error" and "AttributeError" in err.value.detail and env.alive


def test_private_methods_cannot_be_called():
    with EnvProcess(GUESS) as env:
        with pytest.raises(SandboxError, match="private"):
            env.call("__class__")


def test_syntax_error_is_syntax():
    with pytest.raises(SandboxError) as err:
        EnvProcess("class BrokenEnv:\n    def reset(self:\n        pass\n")
    assert err.value.reason == "syntax"


def test_return_outside_function_is_syntax():
    """Caught by the compiler, not the parser: both stages count as 'syntax'."""
    with pytest.raises(SandboxError) as err:
        EnvProcess("return 1\nclass XEnv: pass\n")
    assert err.value.reason == "syntax"


def test_code_without_an_env_class_is_no_env_class():
    with pytest.raises(SandboxError) as err:
        EnvProcess("class Game:\n    pass\n")
    assert err.value.reason == "no_env_class"


def test_first_env_class_in_source_order_is_loaded():
    code = "class ZetaEnv:\n    pass\nclass AlphaEnv:\n    pass\nclass Helper:\n    pass\n"
    with EnvProcess(code) as env:
        assert env.class_name == "ZetaEnv"


def test_env_class_inside_if_name_main_block_is_not_run():
    """The module is not __main__: a demo block at the bottom of a generated file does not run."""
    code = "class DemoEnv:\n    pass\nif __name__ == '__main__':\n    while True: pass\n"
    with EnvProcess(code, limits=FAST) as env:
        assert env.class_name == "DemoEnv"


def test_raising_init_is_init_error_with_the_exception_in_the_detail():
    with pytest.raises(SandboxError) as err:
        EnvProcess("class BadEnv:\n    def __init__(self):\n        raise RuntimeError('nope')\n")
    assert err.value.reason == "init_error" and "RuntimeError: nope" in err.value.detail


def test_init_kwargs_are_passed():
    with EnvProcess(GUESS, {"high": 5}) as env:
        assert env.call("reset", 0)[1] == {"high": 5}


def test_module_level_error_is_init_error():
    with pytest.raises(SandboxError) as err:
        EnvProcess("import nonexistent_module_xyz\nclass AEnv: pass\n")
    assert err.value.reason == "init_error" and "ModuleNotFoundError" in err.value.detail


def test_non_serializable_result_keeps_child_alive():
    code = "class SetEnv:\n    def reset(self, seed=None): return {1, 2}\n    def ok(self): return 1\n"
    with EnvProcess(code) as env:
        with pytest.raises(SandboxError) as err:
            env.call("reset")
        assert err.value.reason == "not_serializable" and env.call("ok") == 1


def test_result_over_max_message_bytes_is_too_large_and_the_child_stays_alive():
    code = "class BigEnv:\n    def reset(self, seed=None): return 'x' * 2000\n"
    with EnvProcess(code, limits=Limits(max_message_bytes=1000)) as env:
        with pytest.raises(SandboxError) as err:
            env.call("reset")
        assert err.value.reason == "too_large" and env.alive


def test_close_is_idempotent_and_kills_the_child():
    env = EnvProcess(GUESS)
    assert descendants()
    env.close()
    env.close()
    assert not env.alive and not descendants()
    with pytest.raises(SandboxError):
        env.call("reset", 1)


def test_private_dir_is_removed_on_close():
    env = EnvProcess(GUESS)
    home = env._dir
    assert os.path.isdir(home)
    env.close()
    assert not os.path.exists(home)


def test_no_process_left_after_many_instances():
    envs = [EnvProcess(GUESS) for _ in range(8)]
    for env in envs:
        env.close()
    assert not descendants()


def test_timeout_marks_the_process_dead():
    code = "class SlowEnv:\n    def reset(self, seed=None):\n        while True: pass\n"
    env = EnvProcess(code, limits=Limits(call_timeout=0.5))
    with pytest.raises(SandboxError) as err:
        env.call("reset")
    assert err.value.reason == "timeout" and not env.alive and not descendants()


def test_send_and_receive_split_a_call():
    with EnvProcess(GUESS) as env:
        env.send("reset", 3)
        assert env.receive()[1] == {"high": 100}
        with pytest.raises(RuntimeError):
            env.receive()


def test_call_many_returns_results_and_errors_in_order():
    code = GUESS + "\n    def slow(self):\n        import time; time.sleep(60)\n"
    envs = [EnvProcess(code, limits=Limits(call_timeout=1.0)) for _ in range(4)]
    try:
        call_many(envs, "reset", [(i,) for i in range(4)])
        t0 = time.monotonic()
        out = call_many(envs, "step", [("\\boxed{1}",), ("no braces",), ("\\boxed{2}",), ("\\boxed{3}",)])
        assert isinstance(out[1], SandboxError) and out[1].reason == "error"
        assert [len(o) for i, o in enumerate(out) if i != 1] == [5, 5, 5]
        envs[2].send("slow")   # one hung environment times out alone; the others still answer
        out = call_many([envs[0], envs[3]], "solution", [(), ()])
        assert all(isinstance(o, str) for o in out) and time.monotonic() - t0 < 1.0
        with pytest.raises(SandboxError) as err:
            envs[2].receive()
        assert err.value.reason == "timeout"
    finally:
        for env in envs:
            env.close()


def test_call_many_deadlines_are_per_process():
    """Two hung environments and two healthy ones: the healthy results come back, the call takes ~one timeout."""
    code = "class MaybeEnv:\n    def step(self, hang):\n        while hang: pass\n        return 'ok'\n"
    envs = [EnvProcess(code, limits=Limits(call_timeout=1.0)) for _ in range(4)]
    t0 = time.monotonic()
    out = call_many(envs, "step", [(True,), (False,), (True,), (False,)])
    elapsed = time.monotonic() - t0
    assert [o if isinstance(o, str) else o.reason for o in out] == ["timeout", "ok", "timeout", "ok"]
    assert 0.9 < elapsed < 2.0
    assert [e.alive for e in envs] == [False, True, False, True]
    out = call_many(envs, "step", [(False,)] * 4)
    assert [o if isinstance(o, str) else o.reason for o in out] == ["timeout", "ok", "timeout", "ok"]
    for env in envs:
        env.close()
    assert not descendants()


def test_child_is_a_fresh_interpreter_without_the_callers_modules():
    code = "import sys\nclass PeekEnv:\n    def reset(self, seed=None): return sorted(sys.modules)\n"
    with EnvProcess(code) as env:
        modules = env.call("reset")
    assert "pytest" not in modules and "sandbox" not in modules and "env_module" in modules


def test_environment_is_scrubbed():
    os.environ["SPADE_TEST_LEAK"] = "leaked"
    code = "import os\nclass EnvEnv:\n    def reset(self, seed=None): return dict(os.environ)\n"
    with EnvProcess(code) as env:
        seen = env.call("reset")
    assert set(seen) <= {"PATH", "LANG", "HOME", "TMPDIR", "PYTHONHASHSEED", "LC_CTYPE"}
    assert seen["HOME"] == seen["TMPDIR"] and "SPADE_TEST_LEAK" not in seen


def test_env_can_use_its_private_directory():
    code = ("class FileEnv:\n    def reset(self, seed=None):\n        open('notes.txt', 'w').write('hi')\n"
            "        return open('notes.txt').read()\n")
    with EnvProcess(code) as env:
        assert env.call("reset") == "hi"


def test_common_stdlib_modules_import_inside_the_sandbox():
    code = ("import math, random, re, json, collections, itertools, functools, string, dataclasses, typing, enum\n"
            "import heapq, copy, fractions, statistics, textwrap\nfrom typing import NamedTuple, TypeVar\n"
            "T = TypeVar('T')\nclass Pt(NamedTuple):\n    x: int\n@dataclasses.dataclass\nclass S:\n    a: int = 1\n"
            "class LibEnv:\n    def reset(self, seed=None): return [S().a, Pt(2).x, math.sqrt(9)]\n")
    with EnvProcess(code, limits=Limits(call_timeout=10)) as env:
        assert env.call("reset") == [1, 2, 3.0]


def test_isolation_report_reports_missing_layers(monkeypatch):
    """A machine without unshare runs the weakest launcher and says so, instead of failing open silently."""
    monkeypatch.setattr(isolation, "_LAUNCH", None)
    monkeypatch.setattr(isolation.shutil, "which", lambda name, path=None: None)
    report = isolation.isolation_report()
    assert report["namespaces"] is False and report["mode"] == "none" and "no unshare" in report["why"]
    with EnvProcess(GUESS) as env:   # still works, with the audit hook and rlimits only
        assert env.call("reset", 1)[1] == {"high": 100}


def test_isolation_report_on_this_machine_is_json_ready():
    import json
    report = isolation.isolation_report()
    assert json.loads(json.dumps(report)) == report and report["why"]


def test_isolation_never_imports_sandbox():
    """Imports go one way, sandbox.py -> isolation.py: the OS layers work without the protocol module."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", "import isolation, sys; print('sandbox' in sys.modules)"],
                         cwd=root, capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "False", out.stderr


def test_every_test_named_in_the_guarantees_table_exists():
    """docs/sandbox.md's guarantees table cannot drift: each test it names is a test in the suite."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    section = (root / "docs" / "sandbox.md").read_text().split("## Guarantees", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"`(?:tests/(test_\w+)\.py::)?(test_\w+)`", section)
    assert len(named) >= 20
    for module, name in named:
        source = (root / "tests" / f"{module or 'test_hostile'}.py").read_text()
        assert f"def {name}(" in source, f"docs/sandbox.md names {name}, which is not a test"

"""Tests that need a library which cannot install beside the project (tests/test_export.py: openenv, verifiers and
harbor stand apart, README "Export") are marked `@pytest.mark.library(module, side)`. Where `module` imports here,
the test runs here. Where it does not and the environment variable SPADE_MINI_PYTHON_<SIDE> names an interpreter
that has it (.ci/run makes one per side), the same test is run in that interpreter and its verdict is this test's
verdict; else the test's own importorskip skips it and says what to install."""
import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    config.addinivalue_line("markers", "library(module, side): needs `module`, found here or in the interpreter "
                            "SPADE_MINI_PYTHON_<SIDE> names (tests/conftest.py)")


def side_python(item) -> str | None:
    """The interpreter to run `item` in instead of this one, or None (run here, or skip here)."""
    mark = item.get_closest_marker("library")
    if mark is None:
        return None
    module, side = mark.args
    try:
        if importlib.util.find_spec(module) is not None:
            return None
    except ImportError:   # a parent package that is missing or fails to import
        pass
    return os.environ.get(f"SPADE_MINI_PYTHON_{side.upper()}") or None


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    python = side_python(pyfuncitem)
    if python is None:
        return None   # pytest calls the test here
    node = pyfuncitem.nodeid   # relative to the rootdir, which is ROOT (pyproject.toml)
    # the project's modules, installed there or not; no SPADE_MINI_PYTHON_*, so a run there never goes on elsewhere
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPADE_MINI_PYTHON_")} | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", node], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode != 0 or " passed" not in last or "skipped" in last:
        pytest.fail(f"{node} in {python}: exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}",
                    pytrace=False)
    return True

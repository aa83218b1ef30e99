"""The code stays readable in one sitting: the five method modules hold to their size budget, no function in
them runs past a screen, imports go one way, and only the command line imports lazily (the README's "Files")."""
import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
METHOD = ("train.py", "spade_mini.py", "envs.py", "sandbox.py", "regret.py")
# 2,100 for the games setting; +50 for memory-sized play and torchrun (departure 20, docs/gpu.md); +250 for the
# second setting, tool use (docs/tool_use.md): tool schemas and calls, their validation and solution replay (envs.py),
# tool rounds in the rollout engine (spade_mini.py), the setting's plumbing; +25 for the official action parser
# made linear (envs.py) and the official hang rule (train.py: hung_step, the surviving plays); +90 for validating
# that a designed game is fair (envs.py): reset seeds drawn per program, solution() replayed in a second process,
# the fair-game guard; +30 for the rollout/trainer mismatch (the sampler's log-probs, spade_mini.mismatch); +80 for
# environment text made inert where the parent decodes a reply (sandbox.inert); +5 for a reply's given start
# (--agent-reply-prefix: in the first prompt and every observation's frame, read back with the reply); +10 for the
# play guard's zeroed reward (regret.score_window's `caught`), the fair-game guard standing aside without a
# replayable solution(), and the memory's near-duplicate cap (envs.Memory.add); +35 for the designer loop on a
# CPU: each role's part of the gradient and the tokens the update processed (spade_mini.update, _role_gradients),
# bf16 decode in every role (train.sample_kwargs); +15 for the method's optional penalty of invalid programs
# (--invalid-samples: regret.score_window's `invalid`, train.score and designer_samples); +5 for the update's frozen
# weights cast to bf16 once an update on a CPU (spade_mini.update, models.bf16_base)
BUDGET_LINES = 2695
MAX_FUNCTION_LINES = 60
PROJECT = {p.stem for p in ROOT.glob("*.py")}
HEAVY = {"torch", "transformers", "peft", "matplotlib", "numpy", "bitsandbytes", "reasoning_gym", "sympy"}
OPTIONAL = {"torch.utils.tensorboard"}   # behind --tensorboard, imported only when asked for


def tree(name: str) -> ast.Module:
    return ast.parse((ROOT / name).read_text())


def top_level_imports(name: str) -> set[str]:
    """Project modules a module imports at its top level."""
    found = set()
    for node in tree(name).body:
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & PROJECT


def test_the_five_method_modules_fit_the_reading_budget():
    lines = {name: len((ROOT / name).read_text().splitlines()) for name in METHOD}
    assert sum(lines.values()) <= BUDGET_LINES, lines


def test_no_function_of_the_method_modules_is_longer_than_a_screen():
    long = [(name, node.name, node.end_lineno - node.lineno + 1) for name in METHOD for node in ast.walk(tree(name))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, long


def test_at_most_twelve_top_level_modules_and_each_is_installed():
    """Five method modules and seven support ones (the report's figures and pages moved out of cli.py, which had
    grown to 1,064 lines, a third of them the report; export.py wraps environments for other libraries)."""
    modules = sorted(PROJECT)
    assert len(modules) <= 12, modules
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert sorted(config["tool"]["setuptools"]["py-modules"]) == modules


def test_project_imports_go_one_way():
    """No cycle among the top-level imports, and the bottom layers import nothing of the project above them."""
    graph = {name: top_level_imports(f"{name}.py") for name in PROJECT}
    assert graph["isolation"] == set() and graph["regret"] == set() and graph["runs"] == {"regret"}
    assert graph["sandbox"] == {"isolation"}
    assert "cli" not in set().union(*graph.values())   # nothing imports the command line
    done, visiting = set(), []

    def visit(name):
        assert name not in visiting, f"import cycle: {' -> '.join(visiting + [name])}"
        if name not in done:
            visiting.append(name)
            for other in graph[name]:
                visit(other)
            visiting.pop()
            done.add(name)
    for name in graph:
        visit(name)


def test_only_the_command_line_imports_project_or_heavy_modules_inside_functions():
    """isolation's child functions are exempt: they are shipped as source text and run in the child."""
    lazy = []
    for name in sorted(PROJECT - {"cli"}):
        for fn in ast.walk(tree(f"{name}.py")):
            if not isinstance(fn, ast.FunctionDef) or (name == "isolation" and fn.name.startswith("_child")):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                    lazy += [(name, fn.name, n) for n in names if n.split(".")[0] in PROJECT | HEAVY and n not in OPTIONAL]
    assert not lazy, lazy


def test_validate_score_and_report_start_without_torch(tmp_path):
    """validate and score import neither torch nor numpy; report draws without torch."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text(json.dumps({"step": 0, "agent/return_nohint": 0.5}) + "\n")
    program = (
        "import sys, cli\n"
        f"cli.main(['validate', {str(ROOT / 'examples' / 'cups.py')!r}])\n"
        "assert not {'torch', 'numpy'} & set(sys.modules), 'validate imported torch or numpy'\n"
        f"cli.main(['report', {str(tmp_path / 'run')!r}])\n"
        "assert 'torch' not in sys.modules, 'report imported torch'\n")
    out = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "run" / "report" / "index.html").exists()

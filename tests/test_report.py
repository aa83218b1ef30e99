"""spade-mini report (cli.py) on a run directory written by hand: the pages link every figure, the figures are real PNGs, logged
text is escaped, and broken or empty runs still give a page."""
import json
from pathlib import Path

import pytest

import cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HOSTILE_CODE = '''class ScriptEnv:
    """</pre><script>alert("x")</script>"""
    def reset(self, seed=None):
        return "go", {}
'''


def write_jsonl(path: Path, records: list[dict], torn_tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + torn_tail)


def step_record(step: int, **over) -> dict:
    record = {"step": step, "skills": ["Optimization"], "designer/attempts": 4, "designer/valid_rate": 0.5,
              "designer/rejections": {"syntax": 1, "timeout": 1}, "designer/reward_mean": 0.2, "env/count": 2,
              "env/hung": 0, "env/regret": 0.25, "agent/return_nohint": 0.25, "agent/return_hint": 0.5,
              "agent/win_rate": 0.5, "env/diversity": 0.7, "memory/diversity": 0.6, "env/loc_mean": 40,
              "env/hint_leak_rate": 0.0, "eval/score": 0.1 * step, "eval/arithmetic": 0.2, "loss/policy": 0.01,
              "perf/step_s": 12.0}
    return {**record, **over}


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """Three steps; step 1 had no valid environment (its scores are None); metrics and samples end torn."""
    run = tmp_path / "run"
    (run / "envs" / "step_00000").mkdir(parents=True)
    header = {"config": {"model": "tiny-random", "preset": "tiny", "steps": 3, "seed": 0}, "model": {}}
    none_step = step_record(1, **{k: None for k in ("env/regret", "agent/return_nohint", "agent/return_hint",
                                                     "designer/reward_mean", "env/diversity", "eval/score")})
    write_jsonl(run / "metrics.jsonl", [header, step_record(0), none_step, step_record(2)], '{"step": 3, "des')
    (run / "config.json").write_text(json.dumps(header["config"]))
    episode = {"step": 0, "kind": "episode", "env_id": "env_00", "hinted": False, "seed": 7, "return": 1.0,
               "turns": 1, "terminated": True, "failure": None,
               "transcript": [{"action": "\\boxed{<b>3</b>}", "observation": "solved", "reward": 1.0}]}
    write_jsonl(run / "samples.jsonl", [{"step": 0, "kind": "design", "code": HOSTILE_CODE}, episode], "{torn")
    folder = run / "envs" / "step_00000"
    (folder / "env_00.py").write_text(HOSTILE_CODE)
    (folder / "env_00.json").write_text(json.dumps({"skill": "Optimization", "hint": "Try <i>small</i> numbers.",
                                                    "r_nohint": 0.25, "r_hint": 0.5, "regret": 0.25}))
    return run


def test_index_links_every_figure_with_data_and_each_is_a_valid_png(run_dir):
    index = cli.write_report(run_dir)
    assert index == run_dir / "report" / "index.html"
    page = index.read_text()
    for file, title, *_ in cli.FIGURES:
        if file in ("memory.png", "behaviour.png"):   # nothing of them logged here: named in one line instead
            assert title in page.split("Not drawn, nothing of it logged in this run:")[1]
            continue
        assert f'src="{file}"' in page
        png = run_dir / "report" / file
        data = png.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, file
    import matplotlib.image
    assert matplotlib.image.imread(run_dir / "report" / "returns.png").shape[2] in (3, 4)


def test_links_are_relative_so_the_report_is_self_contained(run_dir):
    page = cli.write_report(run_dir).read_text()
    assert "http" not in page and str(run_dir) not in page
    assert 'href="envs.html"' in page


def test_generated_code_and_hints_are_escaped(run_dir):
    cli.write_report(run_dir)
    page = (run_dir / "report" / "envs.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "</pre><script>" not in page
    assert "Try &lt;i&gt;small&lt;/i&gt; numbers." in page
    assert "&lt;b&gt;3&lt;/b&gt;" in page      # the episode's action, escaped too


def test_envs_page_lists_environment_with_scores_and_its_episode(run_dir):
    cli.write_report(run_dir)
    page = (run_dir / "report" / "envs.html").read_text()
    assert "env_00" in page and "Optimization" in page
    assert "r_hint" in page and "0.5" in page
    for key, value in (("r_nohint", "0.25"), ("r_hint", "0.5"), ("regret", "0.25")):   # env_00.json's scores
        assert f"<tr><td>{key}</td><td>{value}</td></tr>" in page, key
    assert "seed 7" in page and "solved" in page


def test_torn_last_line_and_none_metrics_are_tolerated(run_dir):
    header, records = cli.load_run(run_dir)
    assert header["config"]["model"] == "tiny-random"
    assert [r["step"] for r in records] == [0, 1, 2]   # the torn step 3 is skipped
    page = cli.write_report(run_dir).read_text()
    assert "<td>1</td>" in page                        # the step with None scores has a table row


def test_eval_wildcard_expands_to_every_logged_category_key(run_dir):
    records = cli.load_run(run_dir)[1]
    assert cli.expand(["eval/score", "eval/*"], records) == ["eval/score", "eval/arithmetic"]


def test_run_with_zero_steps_gets_a_clear_message_and_no_figures(tmp_path):
    run = tmp_path / "empty"
    run.mkdir()
    write_jsonl(run / "metrics.jsonl", [{"config": {"model": "tiny-random"}}])
    page = cli.write_report(run).read_text()
    assert "no completed steps" in page
    assert not list((run / "report").glob("*.png"))


def test_directory_that_is_not_a_run_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a spade-mini run"):
        cli.write_report(tmp_path)
    assert cli.main(["report", str(tmp_path)]) == 2


def test_every_numeric_metric_the_run_logged_is_drawn_in_some_figure(run_dir):
    """The page says under each figure which metrics it draws; together they cover every logged number
    (coinciding curves get distinct styles, unrelated scales separate panels)."""
    import re
    page = cli.write_report(run_dir).read_text()
    drawn = {k.strip() for listed in re.findall(r"Drawn: ([^<]*?)\.</p>", page) for k in listed.split(",")}
    records = cli.load_run(run_dir)[1]
    logged = {k for r in records for k, v in r.items() if k != "step" and cli.number(v) is not None}
    assert logged and logged <= drawn, logged - drawn
    assert "loss/policy" in drawn and "designer/rejections" in drawn


def test_the_designs_page_shows_every_attempt_with_its_verdict_and_reason(run_dir):
    samples = [{"step": 0, "kind": "design", "slot": 1, "attempt": 0, "skill": "Optimization", "code": None,
                "text": "I cannot write code", "verdict": {"valid": False, "reason": "no_code",
                                                           "detail": "no ```python block in the answer"}},
               {"step": 0, "kind": "design", "slot": 0, "attempt": 0, "skill": "Optimization", "code": HOSTILE_CODE,
                "text": "", "verdict": {"valid": True, "reason": "ok"}}]
    write_jsonl(run_dir / "samples.jsonl", samples)
    cli.write_report(run_dir)
    page = (run_dir / "report" / "designs.html").read_text()
    assert "rejected (no_code)" in page and "I cannot write code" in page and "valid (ok)" in page
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert 'href="designs.html"' in (run_dir / "report" / "index.html").read_text()


def test_a_turn_whose_reply_is_its_action_shows_the_text_once(run_dir):
    episode = {"step": 0, "kind": "episode", "env_id": "env_00", "hinted": False, "seed": 7, "return": 0.0,
               "turns": 1, "transcript": [{"turn": 1, "reply": "go left please", "action": "go left please",
                                           "observation": "ok", "reward": 0.0}]}
    write_jsonl(run_dir / "samples.jsonl", [episode])
    cli.write_report(run_dir)
    assert (run_dir / "report" / "envs.html").read_text().count("go left please") == 1


def test_the_report_shows_the_steps_a_resume_extended_the_run_to(run_dir):
    """metrics.jsonl's header keeps the config of the run's start; config.json records a resume's --steps."""
    (run_dir / "config.json").write_text(json.dumps({"model": "tiny-random", "preset": "tiny", "steps": 5}))
    page = cli.write_report(run_dir).read_text()
    assert "<tr><td>steps</td><td>5</td></tr>" in page


def test_a_figure_with_nothing_logged_is_left_out_and_named(run_dir):
    """A CPU run logs no GPU memory; a run without --eval-every no held-out score: no empty axes for them."""
    records = [{k: v for k, v in step_record(i).items() if not k.startswith("eval/")} for i in range(2)]
    write_jsonl(run_dir / "metrics.jsonl", [{"config": {"model": "tiny-random"}}, *records])
    page = cli.write_report(run_dir).read_text()
    for file, title in (("memory.png", "GPU memory per phase"), ("eval.png", "Held-out evaluation")):
        assert f'src="{file}"' not in page and not (run_dir / "report" / file).exists()
        assert title in page.split("Not drawn, nothing of it logged in this run:")[1]
    assert 'src="returns.png"' in page


def test_a_corrupt_middle_line_is_warned_about_once_per_file(run_dir, capsys):
    for name in ("metrics.jsonl", "samples.jsonl"):
        lines = (run_dir / name).read_text().splitlines(keepends=True)
        (run_dir / name).write_text("".join(lines[:1] + ["{not json\n"] + lines[1:]))
    assert cli.main(["report", str(run_dir)]) == 0
    err = capsys.readouterr().err
    for name in ("metrics.jsonl", "samples.jsonl"):
        assert err.count(f"unreadable lines in {run_dir / name}") == 1, err


def test_a_run_where_nothing_trained_says_so_in_one_line_at_the_top(run_dir):
    records = [step_record(i, **{"loss/samples_agent": 0, "loss/samples_designer": 0}) for i in range(2)]
    write_jsonl(run_dir / "metrics.jsonl", [{"config": {"model": "tiny-random"}}, *records])
    page = cli.write_report(run_dir).read_text()
    assert page.index("Nothing was trained in this run") < page.index("<h2>")
    write_jsonl(run_dir / "metrics.jsonl", [{"config": {"model": "tiny-random"}},
                                            step_record(0, **{"loss/samples_agent": 8, "loss/samples_designer": 0})])
    assert "Nothing was trained" not in cli.write_report(run_dir).read_text()


def test_the_per_step_table_fits_the_page_at_1400_px():
    """The per-step table's columns, measured in DejaVu Sans (wider than the browsers' default sans-serif) at the
    page's table font size plus each cell's padding and border, fit the page body (max-width, below 1400 px)."""
    import re
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath
    body = int(re.search(r"body\{\{[^}]*max-width:(\d+)px", cli.PAGE).group(1))
    size = int(re.search(r"table\{\{[^}]*font-size:(\d+)px", cli.PAGE).group(1))
    header = re.findall(r"<th>(.*?)</th>", cli.table([], ["step"] + cli.TABLE))
    widest_value = "-0.333"   # fmt(): three significant digits; step seconds like 1234 are narrower

    def width(text: str, bold: bool = False) -> float:
        prop = FontProperties(family="DejaVu Sans", weight="bold" if bold else "normal")
        return TextPath((0, 0), text, size=size, prop=prop).get_extents().width

    columns = [max(max(width(line, bold=True) for line in cell.split("<br>")), width(widest_value)) + 2 * 6 + 1
               for cell in header]
    assert body < 1400 and sum(columns) <= body, (sum(columns), body)

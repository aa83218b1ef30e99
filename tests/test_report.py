"""spade-mini report (report.py) on a run directory written by hand: the pages link every figure, the figures are real PNGs, logged
text is escaped, and broken or empty runs still give a page."""
import html
import json
import re
import shutil
from pathlib import Path

import pytest

import cli
import report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HOSTILE_CODE = '''class ScriptEnv:
    """</pre><script>alert("x")</script>"""
    def reset(self, seed=None):
        return "go", {}
'''


def write_jsonl(path: Path, records: list[dict], torn_tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + torn_tail)


def step_record(step: int, **over) -> dict:
    """Metrics that change from step to step, and a few that never do (env/hint_leak_rate, env/count, env/hung)."""
    record = {"step": step, "skills": ["Optimization"], "designer/attempts": 4 + step, "designer/valid_rate": 0.5,
              "designer/rejections": {"syntax": 1, "timeout": 1}, "designer/reward_mean": 0.2, "env/count": 2,
              "env/hung": 0, "env/regret": 0.25, "agent/return_nohint": 0.25, "agent/return_hint": 0.5,
              "agent/win_rate": 0.5, "env/diversity": 0.7, "memory/diversity": 0.6, "env/loc_mean": 40 + step,
              "env/hint_leak_rate": 0.0, "eval/score": 0.1 * step, "eval/arithmetic": 0.2, "loss/policy": 0.01 * step,
              "perf/step_s": 12.0 + step}
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
    index = report.write_report(run_dir)
    assert index == run_dir / "report" / "index.html"
    page = index.read_text()
    for file, title, *_ in report.FIGURES:
        if file in ("memory.png", "behaviour.png"):   # nothing of them logged here: named in one line instead
            assert title in page.split("Not drawn, nothing of it logged in this run:")[1]
            continue
        assert f'src="{file}"' in page
        png = run_dir / "report" / file
        data = png.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, file
    import matplotlib.image
    assert matplotlib.image.imread(run_dir / "report" / "returns.png").shape[2] in (3, 4)


def test_a_report_that_cannot_be_written_is_one_line(run_dir, capsys):
    """RUN/report a file (or the run read-only) was a FileExistsError traceback."""
    (run_dir / "report").write_text("my notes")
    assert cli.main(["report", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("spade-mini: error: ") and "report cannot be made (File exists: " in err[0], err
    assert (run_dir / "report").read_text() == "my notes"


def test_links_are_relative_so_the_report_is_self_contained(run_dir):
    page = report.write_report(run_dir).read_text()
    assert "http" not in page and str(run_dir) not in page
    assert 'href="envs.html"' in page


def test_generated_code_and_hints_are_escaped(run_dir):
    report.write_report(run_dir)
    page = (run_dir / "report" / "envs.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "</pre><script>" not in page
    assert "Try &lt;i&gt;small&lt;/i&gt; numbers." in page
    assert "&lt;b&gt;3&lt;/b&gt;" in page      # the episode's action, escaped too


def test_envs_page_lists_environment_with_scores_and_its_episode(run_dir):
    report.write_report(run_dir)
    page = (run_dir / "report" / "envs.html").read_text()
    assert "env_00" in page and "Optimization" in page
    assert "r_hint" in page and "0.5" in page
    for key, value in (("r_nohint", "0.25"), ("r_hint", "0.5"), ("regret", "0.25")):   # env_00.json's scores
        assert f"<tr><td>{key}</td><td>{value}</td></tr>" in page, key
    assert "seed 7" in page and "solved" in page


def test_torn_last_line_and_none_metrics_are_tolerated(run_dir):
    header, records = report.load_run(run_dir)
    assert header["config"]["model"] == "tiny-random"
    assert [r["step"] for r in records] == [0, 1, 2]   # the torn step 3 is skipped
    page = report.write_report(run_dir).read_text()
    assert "<td>1</td>" in page                        # the step with None scores has a table row


def test_eval_wildcard_expands_to_every_logged_category_key(run_dir):
    records = report.load_run(run_dir)[1]
    assert report.expand(["eval/score", "eval/*"], records) == ["eval/score", "eval/arithmetic"]


def test_run_with_zero_steps_gets_a_clear_message_and_no_figures(tmp_path):
    run = tmp_path / "empty"
    run.mkdir()
    write_jsonl(run / "metrics.jsonl", [{"config": {"model": "tiny-random"}}])
    page = report.write_report(run).read_text()
    assert "no completed steps" in page
    assert not list((run / "report").glob("*.png"))


def test_directory_that_is_not_a_run_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a spade-mini run"):
        report.write_report(tmp_path)
    assert cli.main(["report", str(tmp_path)]) == 2


def test_every_numeric_metric_the_run_logged_is_drawn_in_some_figure(run_dir):
    """The page says under each figure which metrics it draws; together they cover every logged number
    (coinciding curves get distinct styles, unrelated scales separate panels)."""
    import re
    page = report.write_report(run_dir).read_text()
    drawn = {k.strip() for listed in re.findall(r"(?:Drawn|in the table instead): ([^<.]*)\.", page)
             for k in listed.split(",")}
    records = report.load_run(run_dir)[1]
    logged = {k for r in records for k, v in r.items() if k != "step" and report.number(v) is not None}
    assert logged and logged <= drawn, logged - drawn
    assert "loss/policy" in drawn and "designer/rejections" in drawn


def test_the_designs_page_shows_every_attempt_with_its_verdict_and_reason(run_dir):
    samples = [{"step": 0, "kind": "design", "slot": 1, "attempt": 0, "skill": "Optimization", "code": None,
                "text": "I cannot write code", "verdict": {"valid": False, "reason": "no_code",
                                                           "detail": "no ```python block in the answer"}},
               {"step": 0, "kind": "design", "slot": 0, "attempt": 0, "skill": "Optimization", "code": HOSTILE_CODE,
                "text": "", "verdict": {"valid": True, "reason": "ok"}}]
    write_jsonl(run_dir / "samples.jsonl", samples)
    report.write_report(run_dir)
    page = (run_dir / "report" / "designs.html").read_text()
    assert "rejected (no_code)" in page and "I cannot write code" in page and "valid (ok)" in page
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert 'href="designs.html"' in (run_dir / "report" / "index.html").read_text()


def test_a_turn_whose_reply_is_its_action_shows_the_text_once(run_dir):
    episode = {"step": 0, "kind": "episode", "env_id": "env_00", "hinted": False, "seed": 7, "return": 0.0,
               "turns": 1, "transcript": [{"turn": 1, "reply": "go left please", "action": "go left please",
                                           "observation": "ok", "reward": 0.0}]}
    write_jsonl(run_dir / "samples.jsonl", [episode])
    report.write_report(run_dir)
    assert (run_dir / "report" / "envs.html").read_text().count("go left please") == 1


def test_the_report_shows_the_steps_a_resume_extended_the_run_to(run_dir):
    """metrics.jsonl's header keeps the config of the run's start; config.json records a resume's --steps."""
    (run_dir / "config.json").write_text(json.dumps({"model": "tiny-random", "preset": "tiny", "steps": 5}))
    page = report.write_report(run_dir).read_text()
    assert "<tr><td>steps asked</td><td>5</td></tr>" in page


def test_the_report_says_how_many_steps_ran_not_only_the_steps_asked_for(run_dir):
    """An interrupted run asked for 5 steps and logged 3: the page says both."""
    (run_dir / "config.json").write_text(json.dumps({"model": "tiny-random", "preset": "tiny", "steps": 5}))
    write_jsonl(run_dir / "metrics.jsonl", [{"config": {"model": "tiny-random"}}, *map(step_record, range(3))])
    page = report.write_report(run_dir).read_text()
    assert "<tr><td>steps asked</td><td>5</td></tr>" in page and "<tr><td>steps ran</td><td>3</td></tr>" in page


def test_a_figure_with_nothing_logged_is_left_out_and_named(run_dir):
    """A run that logged no memory per phase; a run without --eval-every no held-out score: no empty axes for them."""
    records = [{k: v for k, v in step_record(i).items() if not k.startswith("eval/")} for i in range(2)]
    write_jsonl(run_dir / "metrics.jsonl", [{"config": {"model": "tiny-random"}}, *records])
    page = report.write_report(run_dir).read_text()
    for file, title in (("memory.png", "Memory per phase"), ("eval.png", "Held-out evaluation")):
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
    page = report.write_report(run_dir).read_text()
    assert page.index("Nothing was trained in this run") < page.index("<h2>")
    write_jsonl(run_dir / "metrics.jsonl", [{"config": {"model": "tiny-random"}},
                                            step_record(0, **{"loss/samples_agent": 8, "loss/samples_designer": 0})])
    assert "Nothing was trained" not in report.write_report(run_dir).read_text()


def test_the_per_step_table_fits_the_page_at_1400_px():
    """The per-step table's columns, measured in DejaVu Sans (wider than the browsers' default sans-serif) at the
    page's table font size plus each cell's padding and border, fit the page body (max-width, below 1400 px)."""
    import re
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath
    body = int(re.search(r"body\{\{[^}]*max-width:(\d+)px", report.PAGE).group(1))
    size = int(re.search(r"table\{\{[^}]*font-size:(\d+)px", report.PAGE).group(1))
    header = re.findall(r"<th>(.*?)</th>", report.table([], ["step"] + report.TABLE))
    widest_value = "-0.333"   # fmt(): three significant digits; step seconds like 1234 are narrower

    def width(text: str, bold: bool = False) -> float:
        prop = FontProperties(family="DejaVu Sans", weight="bold" if bold else "normal")
        return TextPath((0, 0), text, size=size, prop=prop).get_extents().width

    columns = [max(max(width(line, bold=True) for line in cell.split("<br>")), width(widest_value)) + 2 * 6 + 1
               for cell in header]
    assert body < 1400 and sum(columns) <= body, (sum(columns), body)


def report_of(folder: Path, records: list[dict], config: dict) -> Path:
    """The index page of a run directory holding only these step records (and `config`)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / "metrics.jsonl", [{"config": {"model": "tiny-random", **config}}, *records])
    return report.write_report(folder)


def demo_like(steps: int = 4, **over) -> list[dict]:
    """Steps of a run with the demo's small returns (0.06, 0.05), a regeneration window of 2 steps, and an update
    whose KL and clipped share stay 0 (one optimizer step, no KL term)."""
    return [step_record(s, **{"agent/return_nohint": 0.062 - 0.005 * s, "agent/return_hint": 0.05 if s % 2 == 0
                              else None, "loss/grad_norm": 0.2 + 0.03 * s, "loss/kl": 0.0, "loss/clip_frac": 0.0,
                              "agent/first_reply_tokens": 51 + 12 * s, **over}) for s in range(steps)]


def test_the_returns_axis_fits_returns_near_zero(tmp_path):
    """Returns of 0.04-0.06 lay flat on the floor of a fixed -1..1 axis."""
    records = demo_like()
    fig = report.line_figure(tmp_path / "returns.png", "returns", "", records, ["agent/return_nohint"], [])
    low, high = fig.axes[0].get_ylim()
    assert -0.1 < low < 0.047 and 0.062 < high < 0.1, (low, high)


def test_every_step_plot_marks_where_a_new_window_begins(tmp_path):
    """New games at step 2 (regen_interval 2) moved first-reply tokens 51 -> 87: a dashed line says why."""
    records = demo_like()
    starts = report.window_starts({"regen_interval": 2}, records)
    assert starts == [2]
    for fig in (report.line_figure(tmp_path / "a.png", "t", "", records, ["agent/return_nohint"], starts),
                report.panels_figure(tmp_path / "b.png", records, ["agent/first_reply_tokens", "loss/grad_norm"],
                                     starts)):
        for ax in [ax for ax in fig.axes if ax.lines]:
            marks = [line.get_xdata()[0] for line in ax.lines if line.get_linestyle() == "--" and
                     line.get_color() == "gray"]
            assert marks == [1.5], marks   # between the first window's last step and the next one's first
    page = report_of(tmp_path, records, {"regen_interval": 2}).read_text()
    assert "New environments every 2 steps (--regen-interval 2): a dashed line" in page
    assert report.window_starts({"regen_interval": 1}, records) == []   # every step: no line at each


def test_the_returns_caption_says_what_each_curve_is_and_why_hinted_can_be_lower(tmp_path):
    page = report_of(tmp_path, demo_like(), {}).read_text()
    caption = html.unescape(page.split('src="returns.png"')[1].split("</p>")[0])
    for words in ("agent/return_nohint: the mean return of this step's unhinted plays", "agent/return_hint",
                  "at a window's first step only", "agent/win_rate", "not a bound it cannot pass", "makes it lower"):
        assert words in caption, words
    assert "upper bound" not in page


def test_a_metric_that_never_changed_is_a_table_row_not_a_flat_panel(tmp_path):
    """The update's panels: loss/kl and loss/clip_frac were flat lines at 0 in a run with one optimizer step."""
    page = report_of(tmp_path, demo_like(), {}).read_text()
    update = page.split("<h2>The update</h2>")[1].split("<h2>")[0]
    assert 'src="update.png"' in update
    assert "<tr><td>loss/kl</td><td>0</td><td>every step</td></tr>" in update
    assert "<tr><td>loss/clip_frac</td><td>0</td><td>every step</td></tr>" in update
    assert "Drawn: loss/grad_norm, loss/policy." in update
    constant = [step_record(s, **{"perf/step_s": 12.0}) for s in range(3)]   # perf/: one metric, never changed
    page = report_of(tmp_path / "constant", constant, {}).read_text()
    perf = page.split("<h2>Time and throughput</h2>")[1].split("<h2>")[0]
    assert "<img" not in perf and "<tr><td>perf/step_s</td><td>12</td><td>every step</td></tr>" in perf
    assert not (tmp_path / "constant" / "report" / "perf.png").exists()


def test_a_new_metric_shows_in_the_report_without_a_change_to_it(tmp_path):
    records = [step_record(s, **{"agent/new_behaviour": 0.1 * s, "agent/steady_behaviour": 1.0}) for s in range(3)]
    page = report_of(tmp_path, records, {}).read_text()
    other = page.split("<h2>Everything else logged</h2>")[1]
    assert "agent/new_behaviour" in other.split("Drawn:")[1].split(".")[0]
    assert "<tr><td>agent/steady_behaviour</td><td>1</td><td>every step</td></tr>" in other


def test_a_run_without_hinted_plays_draws_no_hinted_curve(tmp_path):
    """With --hinted-plays 0, R_hint falls back to the unhinted return: a 'hinted' curve on top of the unhinted one
    (and a regret of 0) that no hint made."""
    records = [step_record(s, **{"agent/return_hint": 0.1 * s, "agent/return_nohint": 0.1 * s, "env/regret": 0.0})
               for s in range(3)]
    page = report_of(tmp_path, records, {"hinted_plays": 0}).read_text()
    assert "no hinted plays (--hinted-plays 0)" in page
    drawn = page.split('src="returns.png"')[1].split("Drawn: ")[1].split(".")[0]
    assert drawn == "agent/return_nohint, agent/win_rate"
    assert not any("env/regret" in listed for listed in re.findall(r"Drawn: ([^<.]*)\.", page))


def test_an_axis_is_set_by_what_its_metric_is_not_zoomed_into_float_noise(tmp_path):
    """A share runs 0-1, a return starts from 0, a time too: values that moved by 1e-7 are flat lines, where an
    axis fitted to the data drew each as a slope from the panel's floor to its ceiling."""
    noisy = [step_record(s, **{"agent/win_rate": 0.5 + 1e-7 * s, "agent/return_nohint": 0.75 + 1e-7 * s,
                               "perf/step_s": 12 + 1e-7 * s}) for s in range(3)]
    axes = {key: report.line_figure(tmp_path / "a.png", key, "", noisy, [key], []).axes[0]
            for key in ("agent/win_rate", "agent/return_nohint")}
    axes["perf/step_s"] = report.panels_figure(tmp_path / "b.png", noisy, ["perf/step_s"], []).axes[0]
    for key, top in (("agent/win_rate", 1.0), ("agent/return_nohint", 0.75), ("perf/step_s", 12.0)):
        low, high = axes[key].get_ylim()
        assert low == pytest.approx(-0.04 * top, abs=1e-6) and high == pytest.approx(1.04 * top, abs=1e-5), key


def test_regret_is_drawn_with_its_zero_line(tmp_path):
    """Regret's sign is the designer's signal: a line at 0 shows which side of it each point is on."""
    records = [step_record(s, **{"env/regret": r}) for s, r in enumerate((0.25, -0.5, 0.125))]
    ax = report.line_figure(tmp_path / "regret.png", "regret", "", records, ["env/regret"], []).axes[0]
    zero_lines = [line for line in ax.lines if list(line.get_ydata()) == [0, 0]]
    assert zero_lines and ax.get_ylim()[0] < -0.5 and ax.get_ylim()[1] > 0.25


def test_a_step_where_a_phase_did_not_run_is_a_gap_not_a_zero(tmp_path):
    """Step 1 played no environment (every design rejected): no return, and a play timer of ~0 s. The return's
    line breaks there instead of running through it, and the ~0 s is not drawn as a fast play; held-out scores,
    logged every --eval-every steps by design, still connect."""
    played = {"perf/play_s": 30.0, "loss/samples_agent": 8}
    records = [step_record(0, **played),
               step_record(1, **{"env/count": 0, "agent/return_nohint": None, "perf/play_s": 0.002,
                                 "loss/samples_agent": 0, "loss/samples_designer": 0, "perf/update_s": 0.001}),
               step_record(2, **played), step_record(3, **played)]
    del records[1]["eval/score"]
    ax = report.line_figure(tmp_path / "r.png", "t", "", records, ["agent/return_nohint", "eval/score"], []).axes[0]
    lines = {line.get_label(): line for line in ax.lines}
    xs, ys = lines["agent/return_nohint"].get_data()
    assert [y != y for x, y in zip(xs, ys) if 0 < x < 2] == [True]   # one NaN (a break) between steps 0 and 2
    assert list(lines["eval/score"].get_xdata()) == [0, 2, 3]         # connected across step 1
    kept = report.without_phases_not_run(records, {"hinted_plays": 2})
    assert "perf/play_s" not in kept[1] and "perf/update_s" not in kept[1] and kept[2]["perf/play_s"] == 30.0
    assert "perf/hint_s" not in report.without_phases_not_run([step_record(0, **{"perf/hint_s": 3e-4})],
                                                              {"hinted_plays": 0})[0]   # no hinted plays: no hint
    page = report_of(tmp_path / "run", records, {"regen_interval": 1}).read_text()
    assert "has no point there" in page.split("<h2>Time and throughput</h2>")[1]


def test_two_identical_series_are_one_line_said_to_be_identical(tmp_path):
    """Rewards of 0 or 1 make the win rate the return: two curves, one exactly under the other, looked like one
    unnamed curve. They are one line labelled 'a = b', and the caption says so."""
    records = [step_record(s, **{"agent/return_nohint": r, "agent/win_rate": r}) for s, r in enumerate((0.25, 0.75, 0.5))]
    ax = report.line_figure(tmp_path / "r.png", "t", "", records, ["agent/return_nohint", "agent/win_rate"], []).axes[0]
    assert [text.get_text() for text in ax.get_legend().get_texts()] == ["agent/return_nohint = agent/win_rate"]
    page = html.unescape(report_of(tmp_path / "run", records, {}).read_text())
    returns = page.split('src="returns.png"')[1].split("</p>")[0]
    assert "Identical at every step, so one line: agent/return_nohint and agent/win_rate." in returns


def test_a_panel_of_one_point_is_a_number_not_a_plot(tmp_path):
    """A one-step run, and a metric logged at one step of a longer run (a held-out score of the base model only):
    a plot of one dot on an axis of nothing says less than the number. The figure is a table row instead, with the
    step it comes from."""
    page = report_of(tmp_path / "one", [step_record(0)], {}).read_text()
    assert "<img" not in page and not list((tmp_path / "one" / "report").glob("*.png"))
    returns = page.split("<h2>Agent return with and without the hint</h2>")[1].split("<h2>")[0]
    assert "<tr><td>agent/return_nohint</td><td>0.25</td><td>step 0 only</td></tr>" in returns
    rejections = page.split("<h2>Rejections</h2>")[1].split("<h2>")[0]
    assert "<tr><td>designer/rejections</td><td>syntax 1, timeout 1</td><td>step 0 only</td></tr>" in rejections
    records = [{"step": -1, "eval/score": 0.5}] + [
        {k: v for k, v in step_record(s).items() if not k.startswith("eval/")} for s in range(3)]
    page = report_of(tmp_path / "base_only", records, {}).read_text()
    evaluation = page.split("<h2>Held-out evaluation</h2>")[1].split("<h2>")[0]
    assert "<img" not in evaluation and "<tr><td>eval/score</td><td>0.5</td><td>step -1 only</td></tr>" in evaluation


def test_each_point_says_how_many_plays_it_averages(tmp_path):
    """A return of 1.0 from 4 plays and one of 0.5 from 12 looked alike. A point's count stands beside it (or once
    in the legend when every point has the same), from env/count x --plays; the caption says what it counts."""
    records = [step_record(s, **{"env/count": n, "env/hung": h, "agent/return_nohint": r})
               for s, (n, h, r) in enumerate(((3, 0, 0.5), (1, 0, 1.0), (3, 1, 0.25)))]
    config = {"plays": 4, "hinted_plays": 2}
    ax = report.line_figure(tmp_path / "r.png", "t", "", records, ["agent/return_nohint"], [], config).axes[0]
    assert [t.get_text() for t in ax.texts] == ["12", "4", "8"]   # 3 x 4, 1 x 4, (3 - 1 hung) x 4
    assert "plays per point" in ax.get_legend().get_texts()[0].get_text()
    eight = [{**r, "designer/attempts": 8, "designer/valid_rate": 0.25 * r["step"]} for r in records]
    ax = report.panels_figure(tmp_path / "p.png", eight, ["designer/valid_rate"], [], config).axes[0]
    assert ax.get_title() == "designer/valid_rate\n(8 attempts each)"   # the same count at every point: said once
    page = html.unescape(report_of(tmp_path / "run", records, config).read_text())
    assert "agent/return_nohint, the unhinted plays of the environments that did not hang" in page
    assert "(4-12 here)" in page
    page = html.unescape(report_of(tmp_path / "no_plays", records, {}).read_text())
    assert "not counted here: the run did not log env/count, or its config has no --plays" in page


CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
IMAGES = "[...document.images].map(img => [img.getAttribute('src'), img.complete ? img.naturalWidth : 0])"


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium; .ci/run installs it)")
def test_the_pages_load_in_a_real_browser_with_every_image_and_no_script_error(run_dir):
    """Headless Chromium (the distribution's, driven by Playwright: no browser download) opens the three pages: each
    loads, every <img> decodes (naturalWidth > 0), and no script runs (generated code holds <script>alert(..)) or
    fails. A control: with a PNG deleted, the same check names it."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
    report.write_report(run_dir)
    errors = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])   # root in CI
        page = browser.new_page()
        page.on("pageerror", lambda error: errors.append(f"script error: {error}"))
        page.on("console", lambda message: message.type == "error" and errors.append(f"console: {message.text}"))
        page.on("dialog", lambda dialog: (errors.append(f"a script ran: {dialog.message}"), dialog.dismiss()))
        for name, title in (("index.html", "spade-mini report"), ("envs.html", "spade-mini environments"),
                            ("designs.html", "spade-mini designer attempts")):
            page.goto((run_dir / "report" / name).as_uri())   # returns after the load event: images are in
            assert page.title() == title and page.evaluate("document.readyState") == "complete", name
            images = page.evaluate(IMAGES)
            assert all(width > 0 for _, width in images), images
            if name == "index.html":
                assert len(images) == len(list((run_dir / "report").glob("*.png"))) >= 5, images
        assert errors == []
        (run_dir / "report" / "returns.png").unlink()   # the control
        page.goto((run_dir / "report" / "index.html").as_uri())
        assert [src for src, width in page.evaluate(IMAGES) if width == 0] == ["returns.png"]
        assert any("ERR_FILE_NOT_FOUND" in error for error in errors), errors
        browser.close()


def test_the_score_phase_keeps_its_time_at_every_step_and_a_missing_rejection_count_is_no_crash():
    """Score runs at every step (train.self_play_step computes the memory's statistics there), so its time is
    never dropped as a phase that did not run; a run whose one design step logged no rejection counts (or not a
    dict) still gives its row (an IndexError before)."""
    record = {"step": 3, "window/start": 2, "window/length": 3, "env/count": 0, "perf/score_s": 14.8}
    assert "score" not in report.phases_not_run(record, {})
    assert report.without_phases_not_run([record], {})[0]["perf/score_s"] == 14.8
    for records in ([{"step": 0, "designer/attempts": 2}], [{"step": 0, "designer/rejections": "syntax"}]):
        assert report.number_row("designer/rejections", records)[:2] == ["designer/rejections", "none"]

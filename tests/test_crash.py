"""Crash safety: a run killed with SIGKILL at any point resumes with valid files and no lost or repeated step."""
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cli
import runs
import train
from test_train import ECHO_ENV, TINY

ROOT = Path(__file__).resolve().parent.parent

# (fault point, uses the environment pool): designing needs no pool; everything after it needs played envs,
# which a tiny random model never writes, so those points run agent-only on a pool.
POINTS = [("generate", False), ("hint", True), ("play", True), ("memory", True), ("update", True),
          ("checkpoint", True), ("metrics", True)]


def echo_pool(tmp_path: Path) -> Path:
    """A --env-pool folder holding the echo environment (a tiny random model never writes a valid one)."""
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "echo.py").write_text(ECHO_ENV)
    return pool


@pytest.mark.parametrize("point,use_pool", POINTS, ids=[p for p, _ in POINTS])
def test_sigkill_then_resume_leaves_valid_files_and_every_step_once(tmp_path, point, use_pool):
    pool = echo_pool(tmp_path)
    out = tmp_path / "run"
    argv = [*TINY, "--steps", "2", "--out", str(out)] + (["--env-pool", str(pool)] if use_pool else [])
    env = {**os.environ, "SPADE_MINI_KILL_AT": f"{point}:1"}
    killed = subprocess.run([sys.executable, str(ROOT / "cli.py"), "train", *argv], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]

    assert cli.main(["train", "--resume", str(out), "--steps", "2"]) == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]          # every line parses: nothing torn is left
    assert sum("config" in r for r in records) == 1
    assert [r["step"] for r in records if "step" in r] == [0, 1]
    samples = runs.read_jsonl(out / "samples.jsonl")
    assert {r["step"] for r in samples} <= {0, 1}
    assert len(samples) == len((out / "samples.jsonl").read_text().splitlines())
    memory = json.loads((out / "memory.json").read_text())
    ids = [r["env_id"] for r in memory["records"]]       # one record per designed environment, none twice
    assert len(ids) == len(set(ids))
    assert set(ids) == {s["env_id"] for s in samples if s["kind"] == "env" and s["origin"] == "designer"}
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000", "step_00001"]
    if use_pool:
        assert sorted(p.name for p in (out / "envs").iterdir()) == ["step_00000", "step_00001"]


def test_a_run_with_lora_dropout_killed_and_resumed_trains_as_the_uninterrupted_run(tmp_path):
    """rng.pt went into every checkpoint and was never read back: a resumed run drew its dropout masks from the
    seed, not from where the run was, and its gradients parted from the uninterrupted run's at the first update."""
    pool = echo_pool(tmp_path)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    argv = [*TINY, "--steps", "3", "--lora-dropout", "0.1", "--env-pool", str(pool)]
    env = {**os.environ, "SPADE_MINI_KILL_AT": "update:1"}
    killed = subprocess.run([sys.executable, str(ROOT / "cli.py"), "train", *argv, "--out", str(cut)], env=env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert cli.main(["train", "--resume", str(cut), "--steps", "3"]) == 0
    assert cli.main(["train", *argv, "--out", str(whole)]) == 0

    def norms(run):
        return [r["loss/grad_norm"] for r in runs.read_jsonl(run / "metrics.jsonl") if "step" in r]
    assert len(norms(whole)) == 3 and norms(cut) == norms(whole)


def test_sigterm_sent_to_a_real_train_process_mid_run_is_one_line_exit_143_and_the_run_resumes(tmp_path):
    """As `timeout` or `docker stop` ends it: a SIGTERM from outside just after step 0's checkpoint (model, sandbox
    children and the log's progress lines all live) gives exit 143, one line naming the resume, and every step
    once after it. Steps 1-4 are the margin: seconds each, against a signal sent within 50 ms."""
    pool = echo_pool(tmp_path)
    out = tmp_path / "run"
    argv = [*TINY, "--steps", "5", "--checkpoint-every", "1", "--out", str(out), "--env-pool", str(pool)]
    proc = subprocess.Popen([sys.executable, str(ROOT / "cli.py"), "train", *argv], cwd=tmp_path, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while not (out / "checkpoints" / "step_00000" / "state.json").exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "step 0 never reached its checkpoint"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=120)[1]
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-2000:]
    said = [line for line in err.splitlines() if line.strip()]
    assert said[-1] == f"spade-mini: terminated; continue with --resume {out}", err[-2000:]
    assert cli.main(["train", "--resume", str(out), "--steps", "5"]) == 0
    assert [r["step"] for r in runs.read_jsonl(out / "metrics.jsonl") if "step" in r] == [0, 1, 2, 3, 4]


def test_resume_from_a_corrupted_checkpoint_is_a_one_line_error(tmp_path, capsys):
    pool = echo_pool(tmp_path)
    out = tmp_path / "run"
    assert cli.main(["train", *TINY, "--steps", "1", "--out", str(out), "--env-pool", str(pool)]) == 0
    (out / "checkpoints" / "step_00000" / "adapter_model.safetensors").write_bytes(b"not a tensor file")
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unreadable" in err[0]


def test_resume_with_a_corrupted_config_is_a_one_line_error(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text('{"model": "tiny-random", "steps": ')
    assert cli.main(["train", "--resume", str(out), "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unreadable config.json" in err[0]


@pytest.mark.parametrize("key,value,said", [("plays", "3", 'plays is "3", not int'), ("lr", None, "lr is null, not float"),
                                           ("checkpoint_every", 0, "checkpoint_every is 0; it must be >= 1")])
def test_resume_with_a_config_edited_to_a_bad_value_is_one_line(tmp_path, capsys, key, value, said):
    """Valid JSON, bad values: a ZeroDivisionError (checkpoint_every 0, before the checks ran) or a TypeError."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({**dataclasses.asdict(runs.Config()), "out": str(out), key: value}))
    assert cli.main(["train", "--resume", str(out), "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err


def test_resume_of_a_run_whose_checkpoints_are_gone_is_a_one_line_error_and_rewinds_nothing(tmp_path, capsys):
    """Steps 0 and 1 are logged but checkpoints/ was deleted: a resume would start over and cut metrics.jsonl."""
    out = tmp_path / "run"
    out.mkdir()
    small = dict(model="tiny-random", steps=3, envs_per_step=1, design_attempts=1, plays=2, hinted_plays=0,
                 max_turns=1, designer_max_new_tokens=8, agent_max_new_tokens=8, agent_max_episode_tokens=8,
                 no_corpus=True, backfill="", out=str(out))   # without the check it trains, quickly, from step 0
    (out / "config.json").write_text(json.dumps({**dataclasses.asdict(runs.Config()), **small}))
    metrics = "".join(json.dumps(r) + "\n" for r in ({"config": {}}, {"step": 0}, {"step": 1}))
    (out / "metrics.jsonl").write_text(metrics)
    assert cli.main(["train", "--resume", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "logged steps up to 1 but its checkpoints hold none" in err[0], err
    assert (out / "metrics.jsonl").read_text() == metrics


def test_an_atomically_written_file_honours_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        runs.write_atomic(tmp_path / "config.json", "{}\n")
    finally:
        os.umask(old)
    assert (tmp_path / "config.json").stat().st_mode & 0o777 == 0o640


def test_every_file_of_a_run_honours_the_umask(tmp_path):
    """Colleagues on a shared server can read a run: umask 022 gives 0644 files, the checkpoint's adapter too."""
    pool = echo_pool(tmp_path)
    out = tmp_path / "run"
    old = os.umask(0o022)
    try:
        assert cli.main(["train", *TINY, "--steps", "1", "--out", str(out), "--env-pool", str(pool)]) == 0
    finally:
        os.umask(old)
    modes = {str(p.relative_to(out)): p.stat().st_mode & 0o777 for p in out.rglob("*") if p.is_file()}
    assert "checkpoints/step_00000/adapter_model.safetensors" in modes
    assert {name: mode for name, mode in modes.items() if mode != 0o644} == {}


HOLDER = "import sys, time, runs; runs.hold_run(sys.argv[1], '--out'); print('held', flush=True); time.sleep(600)"


def hold_in_another_process(root):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(root)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    return holder


def test_a_resume_while_another_process_trains_in_the_run_is_one_line_and_touches_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({**dataclasses.asdict(runs.Config()), "model": "tiny-random",
                                                 "steps": 1, "out": str(out)}))
    metrics = "".join(json.dumps(r) + "\n" for r in ({"config": {}}, {"step": 0}))
    (out / "metrics.jsonl").write_text(metrics)
    holder = hold_in_another_process(out)
    try:
        assert cli.main(["train", "--resume", str(out), "--steps", "3"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"in use by another spade-mini process (pid {holder.pid})" in err[0], err
        assert (out / "metrics.jsonl").read_text() == metrics
    finally:
        holder.kill()
        holder.wait()
    runs.hold_run(out, "--resume")      # the kernel dropped the killed holder's lock: nothing to clean up
    runs.release_run(out)


def test_two_runs_started_with_one_out_the_second_is_refused_before_writing(tmp_path, capsys):
    """Both pass the checks before the model loads; the second to open the directory finds it held."""
    pool = echo_pool(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    holder = hold_in_another_process(out)
    try:
        assert cli.main(["train", *TINY, "--steps", "1", "--out", str(out), "--env-pool", str(pool)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is in use by another spade-mini process" in err[0], err
        assert sorted(p.name for p in out.iterdir()) == ["lock"]
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_is_let_go_when_the_run_ends_so_a_shell_can_resume_it(tmp_path):
    """A notebook or a bench trains in-process and goes on: the run it finished must not stay held."""
    pool = echo_pool(tmp_path)
    out = tmp_path / "run"
    assert cli.main(["train", *TINY, "--steps", "1", "--out", str(out), "--env-pool", str(pool)]) == 0
    holder = hold_in_another_process(out)   # refused, it would print no "held", were the lock still held here
    holder.kill()
    holder.wait()


def test_the_lock_is_let_go_when_the_run_crashes_in_a_notebook(tmp_path, monkeypatch):
    """A run that raised kept its directory held for as long as its process lived: a notebook's crashed run
    refused a `spade-mini train --resume` from a shell, naming the notebook's pid."""
    pool = echo_pool(tmp_path)
    out = tmp_path / "run"

    def crashes(st, step):
        raise RuntimeError("a step that fails")
    monkeypatch.setattr(train, "self_play_step", crashes)
    with pytest.raises(RuntimeError, match="a step that fails"):
        cli.main(["train", *TINY, "--steps", "1", "--out", str(out), "--env-pool", str(pool)])
    holder = hold_in_another_process(out)   # refused, it would print no "held", were the lock still held here
    holder.kill()
    holder.wait()


def test_checkpoints_past_step_99999_are_kept_and_found_by_their_step_not_their_name(tmp_path):
    """By name step_100000 sorts before step_99999: the prune deleted each new checkpoint as it was written, and a
    resume found step 99999 where last_checkpoint.json said 100000."""
    import models
    import torch

    class Adapter:
        def save_pretrained(self, folder):
            (Path(folder) / "adapter_model.safetensors").write_bytes(b"")
    run = runs.Run(tmp_path)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    for step in (99_998, 99_999, 100_000):
        models.save_checkpoint(run.checkpoints / f"step_{step:05d}", Adapter(), optimizer,
                               {"state.json": json.dumps({"step": step}) + "\n"}, keep=2)
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["step_100000", "step_99999"]
    assert run.latest_checkpoint().name == "step_100000" and runs.steps_done(run) == 100_001


def test_a_checkpoint_folder_and_its_rename_are_synced_before_the_caller_names_it(tmp_path, monkeypatch):
    """Each file was fsynced, but not the folder's entries nor the rename: after a power cut on a file system that
    does not keep metadata in order, last_checkpoint.json could name a step_N that the disk never got."""
    import models
    import torch

    class Adapter:
        def save_pretrained(self, folder):
            (Path(folder) / "adapter_model.safetensors").write_bytes(b"")
    events, sync, rename = [], runs.fsync_dir, os.rename
    monkeypatch.setattr(runs, "fsync_dir", lambda folder: events.append(("sync", Path(folder).name)) or sync(folder))
    monkeypatch.setattr(os, "rename", lambda a, b: events.append(("rename", Path(b).name)) or rename(a, b))
    run = runs.Run(tmp_path)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    for step in (2, 3):
        models.save_checkpoint(run.checkpoints / f"step_{step:05d}", Adapter(), optimizer,
                               {"state.json": json.dumps({"step": step}) + "\n"}, keep=1)
    assert events[4:] == [("sync", ".tmp_step_00003"), ("rename", "step_00003"), ("sync", "checkpoints"),
                          ("sync", "checkpoints")]   # the last after step 2's folder was pruned
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["step_00003"]


def test_a_rewind_of_a_run_without_a_checkpoints_folder_starts_over(tmp_path, capsys):
    """The checkpoints folder appears at the first save: --rewind's sync of it was a FileNotFoundError traceback
    (after the model had loaded) where the refusal before it had said "add --rewind" (a review's)."""
    pool = echo_pool(tmp_path)
    out = tmp_path / "run"
    assert cli.main(["train", *TINY, "--steps", "1", "--out", str(out), "--env-pool", str(pool)]) == 0
    shutil.rmtree(out / "checkpoints")
    assert cli.main(["train", "--resume", str(out), "--steps", "1", "--rewind"]) == 0
    assert [r["step"] for r in runs.read_jsonl(out / "metrics.jsonl") if "step" in r] == [0]


def test_a_resumed_runs_tensorboard_drops_the_events_of_the_steps_it_recomputes(tmp_path, monkeypatch):
    """The lost timeline's scalars stayed in RUN_DIR/tb beside the recomputed ones: TensorBoard showed those steps
    twice. A resume at step N opens its writer with purge_step N (TensorBoard then drops events of steps >= N)."""
    import types
    opened = []

    class SummaryWriter:   # the tensorboard package is optional and not installed for the tests
        def __init__(self, logdir, purge_step=None):
            opened.append((Path(logdir).name, purge_step))

        def add_scalar(self, name, value, step):
            pass
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=SummaryWriter))
    pool = echo_pool(tmp_path)
    out = tmp_path / "run"
    assert cli.main(["train", *TINY, "--steps", "2", "--tensorboard", "--out", str(out), "--env-pool", str(pool)]) == 0
    assert cli.main(["train", "--resume", str(out), "--steps", "3"]) == 0
    assert opened == [("tb", 0), ("tb", 2)]


def test_a_lock_that_is_a_link_is_refused_and_its_target_left_alone(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("my notes\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "lock").symlink_to(tmp_path / "notes.txt")
    with pytest.raises(runs.InputError, match="lock cannot be opened"):
        runs.hold_run(run, "--resume")
    assert (tmp_path / "notes.txt").read_text() == "my notes\n"


def test_a_file_system_without_flock_warns_and_trains_unlocked(tmp_path, monkeypatch, capsys):
    """Lustre without -o flock says ENOSYS (or ENOLCK): that is not another trainer."""
    import errno
    import fcntl

    def no_flock(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")
    monkeypatch.setattr(fcntl, "flock", no_flock)
    runs.hold_run(tmp_path, "--out")
    assert "cannot be locked (Function not implemented)" in capsys.readouterr().err


def test_a_run_directory_removed_and_made_again_is_held_anew(tmp_path):
    import shutil
    run = tmp_path / "run"
    run.mkdir()
    runs.hold_run(run, "--out")
    shutil.rmtree(run)
    run.mkdir()
    runs.hold_run(run, "--out")
    try:
        assert (run / "lock").read_text() == f"{os.getpid()}\n"
    finally:
        runs.release_run(run)


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_checkpoint_whose_memory_is_damaged_is_one_line_and_the_runs_memory_is_kept(tmp_path, capsys, damage):
    """A truncated checkpoint memory.json replaced the run's good one, which was then set aside as corrupted: the
    run went on with an empty memory and the rotation deleted the last good copy. A missing one was a traceback."""
    pool = echo_pool(tmp_path)
    out = tmp_path / "run"
    assert cli.main(["train", *TINY, "--steps", "1", "--out", str(out), "--env-pool", str(pool)]) == 0
    record = dict(env_id="e0", skill="Optimization", code="x", win_rate=0.5, regret=0.3)
    good = json.dumps({"capacity": 200, "records": [record]})
    (out / "memory.json").write_text(good)
    saved = out / "checkpoints" / "step_00000" / "memory.json"
    saved.write_text(good[:30]) if damage == "truncated" else saved.unlink()
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "checkpoint" in err[0] and "step_00000" in err[0], err
    assert (out / "memory.json").read_text() == good and not (out / "memory.json.corrupt").exists()


def test_a_resume_reads_the_memory_from_the_checkpoint_without_warning_of_the_runs_copy(tmp_path, capsys):
    """The run's memory.json is replaced by the checkpoint's: a corrupted one is no news (it warned 'starting with
    an empty memory' and then restored the checkpoint's records)."""
    pool = echo_pool(tmp_path)
    out = tmp_path / "run"
    assert cli.main(["train", *TINY, "--steps", "1", "--out", str(out), "--env-pool", str(pool)]) == 0
    record = dict(env_id="e0", skill="Optimization", code="x", win_rate=0.5, regret=0.3)
    (out / "checkpoints" / "step_00000" / "memory.json").write_text(json.dumps({"capacity": 200, "records": [record]}))
    (out / "memory.json").write_text('{"records": [')
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--steps", "2"]) == 0
    assert "memory" not in capsys.readouterr().err
    assert json.loads((out / "memory.json").read_text())["records"][0] == record   # the checkpoint's, restored


def test_a_rewind_to_step_0_forgets_the_base_models_evaluation_which_the_resume_logs_again(tmp_path):
    """A resume from step 0 with --eval-every logged step -1 twice (-1, -1, 0, 1)."""
    run = runs.Run(tmp_path)
    lines = [{"config": {}}, {"step": -1, "eval/score": 0.0}, {"step": 0}, {"step": 1}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    run.rewind(1)
    assert [r.get("step") for r in runs.read_jsonl(run.metrics)] == [None, -1, 0]
    run.rewind(0)
    assert runs.read_jsonl(run.metrics) == [{"config": {}}]


def test_a_resume_with_fewer_steps_cuts_the_open_window_short_and_scores_it(tmp_path, monkeypatch):
    """A window of 4 opened at step 0 of a 6-step run, resumed at step 1 with --steps 3: it ended unscored (no
    window record, no regret, no memory); cut to 3 steps, as a fresh 3-step run's is, it is scored at step 2."""
    pool = echo_pool(tmp_path)
    out = tmp_path / "run"
    argv = [*TINY[:TINY.index("--regen-interval")], "--regen-interval", "4", "--checkpoint-every", "1",
            "--out", str(out), "--env-pool", str(pool)]
    real = runs.fault_point

    def crash(name, step):
        if (name, step) == ("metrics", 1):
            raise RuntimeError("a crash after step 1's metrics, before its checkpoint")
        real(name, step)
    monkeypatch.setattr(runs, "fault_point", crash)
    with pytest.raises(RuntimeError):
        cli.main(["train", *argv, "--steps", "6"])
    monkeypatch.setattr(runs, "fault_point", real)
    assert cli.main(["train", "--resume", str(out), "--steps", "3"]) == 0
    windows = [r for r in runs.read_jsonl(out / "samples.jsonl") if r["kind"] == "window"]
    assert [(w["step"], w["input"]["window"]) for w in windows] == [(2, 3)], windows


def test_a_damaged_newest_checkpoint_removed_the_run_resumes_from_the_one_before_with_rewind(tmp_path, capsys):
    """keep_checkpoints 2 keeps step 0's; with step 1's damaged and removed, a resume refused (the logged step 1
    lost its checkpoint) and nothing could take the run back: --rewind recomputes step 1 from step 0's."""
    pool = echo_pool(tmp_path)
    out = tmp_path / "run"
    argv = [*TINY, "--steps", "2", "--checkpoint-every", "1", "--out", str(out), "--env-pool", str(pool)]
    assert cli.main(["train", *argv]) == 0
    expected = [r for r in runs.read_jsonl(out / "metrics.jsonl") if r.get("step") == 1][0]
    (out / "checkpoints" / "step_00001" / "adapter_model.safetensors").write_bytes(b"junk")
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--steps", "3"]) == 2
    assert f"(remove it, then spade-mini train --resume {out} --rewind)" in capsys.readouterr().err
    shutil.rmtree(out / "checkpoints" / "step_00001")
    assert cli.main(["train", "--resume", str(out), "--steps", "2"]) == 2
    assert "add --rewind to recompute from step 1" in capsys.readouterr().err
    assert cli.main(["train", "--resume", str(out), "--steps", "2", "--rewind"]) == 0
    records = [r for r in runs.read_jsonl(out / "metrics.jsonl") if "step" in r]
    assert [r["step"] for r in records] == [0, 1]
    assert records[1]["agent/return_nohint"] == expected["agent/return_nohint"]   # the same step, recomputed
    assert json.loads((out / "config.json").read_text())["steps_ran"] == 2


def test_a_window_still_open_at_the_resumed_checkpoint_has_no_scores_from_the_lost_timeline(tmp_path):
    """Windows of 2 steps (0-1, 2-3), the second scored at step 3, whose checkpoint is then lost: its
    envs/step_00002/*.json scores stayed beside its programs after the rewind (export and report showed them),
    although at step 2's checkpoint it is open: they are written again at its end, unless the resumed run stops
    first. The first window, closed at that checkpoint, keeps its scores."""
    pool = echo_pool(tmp_path)
    out = tmp_path / "run"
    argv = [*TINY, "--regen-interval", "2", "--checkpoint-every", "1", "--keep-checkpoints", "2", "--steps", "4",
            "--out", str(out), "--env-pool", str(pool)]   # the later --regen-interval wins
    assert cli.main(["train", *argv]) == 0
    for step in ("step_00000", "step_00002"):
        assert sorted(p.suffix for p in (out / "envs" / step).iterdir()) == [".json", ".json", ".py", ".py"]
    shutil.rmtree(out / "checkpoints" / "step_00003")
    st, first_step = train.start(runs.Config(resume=str(out), steps=4, rewind=True))   # as the resume begins
    runs.release_run(out)
    assert first_step == 3 and (st.window.start, st.window.length) == (2, 2)
    assert sorted(p.suffix for p in (out / "envs" / "step_00002").iterdir()) == [".py", ".py"]
    assert sorted(p.suffix for p in (out / "envs" / "step_00000").iterdir()) == [".json", ".json", ".py", ".py"]
    assert [r["step"] for r in runs.read_jsonl(out / "samples.jsonl") if r["kind"] == "window"] == [1]


def test_after_a_rewind_a_later_crash_resumes_without_it(tmp_path, capsys):
    """--rewind left last_checkpoint.json naming the removed checkpoint: every later crash before a checkpoint
    past it needed --rewind again (a flag that drops logged steps). A stray step_* folder goes too."""
    pool = echo_pool(tmp_path)
    out = tmp_path / "run"
    assert cli.main(["train", *TINY, "--steps", "2", "--checkpoint-every", "1", "--out", str(out),
                     "--env-pool", str(pool)]) == 0
    shutil.rmtree(out / "checkpoints" / "step_00001")
    (out / "checkpoints" / "step_00007").mkdir()   # no state.json: a stray folder, never a checkpoint
    cfg = runs.resumed_config(runs.Config(resume=str(out), steps=2, rewind=True))
    runs.open_run(cfg)                              # as --resume --rewind opens it; then the run stops
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000"]
    assert runs.resume_start(runs.Run(out), 1) == 1   # a plain resume is taken


def test_rewind_without_resume_is_refused(tmp_path, capsys):
    assert cli.main(["train", "--rewind", "--out", str(tmp_path / "r")]) == 2
    assert "--rewind goes with --resume" in capsys.readouterr().err

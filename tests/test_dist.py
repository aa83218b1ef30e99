"""torchrun on the CPU: 2 gloo processes take the same optimizer step and play the same greedy episodes as one
process, a rank that dies ends the others in one line, and a 2-process run of the loop writes one run
directory and resumes it. Each case runs in tests/two_ranks.py (or the command line) under real torchrun."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import models
import two_ranks
from test_train import TINY, assert_metrics_match_samples, records

ROOT = Path(__file__).resolve().parent.parent


def torchrun(*args, timeout: int = 300) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc-per-node 2 ARGS` on gloo, the children importing this checkout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def on_two_ranks(tmp_path_factory):
    """case -> [rank 0's result, rank 1's] (rank 0's alone for "dead"), from one torchrun launch."""
    out = tmp_path_factory.mktemp("two_ranks")
    done = torchrun(ROOT / "tests" / "two_ranks.py", out, "update,rollout,dead")
    assert done.returncode == 0, done.stderr[-3000:]
    results = {case: [torch.load(p, weights_only=False) for p in sorted(out.glob(f"{case}_rank*.pt"))]
               for case in ("update", "rollout", "dead")}
    assert all(r.pop("world_size") == 2 for pair in results.values() for r in pair)
    return results


def test_a_two_rank_update_gives_the_weights_of_a_one_rank_update(on_two_ranks):
    """One step, and three steps on shuffled mini-batches (old log-probs, KL, a rank without samples), each
    rank training its share of micro-batches: both ranks hold the very same weights, the single process's."""
    ranks = on_two_ranks["update"]
    alone = two_ranks.update_case()
    for name, reference in alone.items():
        first, second = (r[name] for r in ranks)
        for key, weight in reference["weights"].items():
            assert torch.equal(first["weights"][key], second["weights"][key]), (name, key)
            torch.testing.assert_close(first["weights"][key], weight, atol=1e-6, rtol=0, msg=f"{name} {key}")
        assert first["metrics"] == second["metrics"]
        assert first["metrics"] == pytest.approx(reference["metrics"], rel=1e-5, abs=1e-7), name
    assert alone["three_steps"]["metrics"]["clip_frac"] > 0    # the later steps really ran against old log-probs


def test_greedy_plays_split_over_two_ranks_equal_the_one_rank_plays(on_two_ranks):
    ranks = on_two_ranks["rollout"]
    alone = two_ranks.rollout_case()
    assert ranks[0] == ranks[1] == alone
    returns = [ep[-1] for env in alone.values() for ep in env["episodes"]]
    assert len(returns) == 10 and len(set(returns)) > 1    # 2 envs x (3 + 2) plays, not all alike


def test_a_rank_that_dies_ends_the_others_collective_in_one_line(on_two_ranks):
    (error,) = on_two_ranks["dead"]                     # rank 1 exited without saving
    assert error["seconds"] < 60                        # ended, long before --dist-timeout (120 s here)
    assert error["error"].startswith("rank 0 of 2: gathering the dead-rank test failed: another rank died")
    assert "\n" not in error["error"]


def test_two_ranks_run_two_steps_of_the_loop_and_resume_to_a_third(tmp_path):
    out = tmp_path / "run"
    cli = ROOT / "cli.py"
    first = torchrun(cli, "train", "--preset", "tiny", *TINY, "--steps", "2", "--out", out)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.count("step    0 |") == 1 and first.stdout.count("on cpu float32") == 1   # rank 0 prints
    header, *steps = records(out)
    assert header["world_size"] == 2 and [r["step"] for r in steps] == [0, 1]
    for r in steps:
        assert r["perf/play_s"] >= r["perf/play_s_mean"] > 0     # the slowest rank, and the mean of both
    assert_metrics_match_samples(out)
    logged = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    for step in (0, 1):
        played = {s["env_id"] for s in logged if s["kind"] == "env" and s["step"] == step}
        assert len(played) == 2     # --envs-per-step 2: each rank designed one slot (backfilled from examples/)
        on_disk = {p.name for p in (out / "envs" / f"step_{step:05d}").iterdir()}
        assert on_disk == {f"{e}{ext}" for e in played for ext in (".py", ".json")}
    assert (out / "checkpoints" / "step_00001" / "state.json").exists()

    again = torchrun(cli, "train", "--resume", out, "--steps", "3")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count(f"resumed {out} at step 2") == 1
    assert [r["step"] for r in records(out) if "step" in r] == [0, 1, 2]
    assert sum("config" in r for r in records(out)) == 1
    assert (out / "checkpoints" / "step_00002" / "state.json").exists()


def test_without_torchrun_nothing_starts_and_every_share_is_the_whole(monkeypatch):
    """One process (no WORLD_SIZE, or torchrun's WORLD_SIZE=1): no process group, and the plumbing is the identity."""
    for world in (None, "1"):
        if world is None:
            monkeypatch.delenv("WORLD_SIZE", raising=False)
        else:
            monkeypatch.setenv("WORLD_SIZE", world)
        models.init_distributed(timeout_s=5.0)
        assert not torch.distributed.is_initialized()
    assert (models.rank(), models.world_size(), models.is_main()) == (0, 1, True)
    assert models.my_share(range(5)) == [0, 1, 2, 3, 4]
    assert models.shared(lambda xs: [2 * x for x in xs], [1, 2, 3], "doubles") == [2, 4, 6]
    assert models.timings_across_ranks({"perf/play_s": 1.5}) == {"perf/play_s": 1.5}

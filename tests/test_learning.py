"""The loop learns: whole self-play steps (train.self_play_step: play, score, update) on the tiny random model
raise the mean return on a toy environment from about chance to >= 0.8, and the same steps with the agent
advantage's sign flipped drive it down instead (so the first test is about the update's direction, not luck).

The toy environment: one turn, and a reply of at most 70 characters wins. The tiny random model's replies end
after 7-15 tokens (models._tiny_random), so about 4 plays in 10 are short enough at the start; the update can
learn it through the stop token's logit. It is put in the pool directly: the validator would call it `trivial`
(its own short probe actions win).

The third and fourth tests check learning beyond format (CueEnv below): the winning reply must be read from the
observation, so no cue-blind policy can beat a coin; whole steps rise above that, and sign-flipped ones do not.
"""
import shutil
from pathlib import Path

import regret
import runs
import train

ROOT = Path(__file__).resolve().parent.parent
SHORT_ENV = '''
class ShortEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
    def reset(self, seed=None):
        return "Answer in as few words as you can.", {}
    def step(self, action):
        won = len(action) <= 70
        return ("You win." if won else "Too long."), float(won), won, not won, {}
'''


def returns_over_steps(tmp_path: Path, steps: int, sign: float, monkeypatch, env=("short", SHORT_ENV),
                       **overrides) -> list[float]:
    (tmp_path / "pool").mkdir()
    shutil.copy(ROOT / "examples" / "cups.py", tmp_path / "pool")   # --env-pool needs one valid environment
    cfg = runs.Config(**{**dict(model="tiny-random", env_pool=str(tmp_path / "pool"), out=str(tmp_path / "run"),
                                steps=steps, envs_per_step=1, plays=16, hinted_plays=0, max_turns=1,
                                agent_max_new_tokens=24, agent_max_episode_tokens=24, lr=1e-3, regen_interval=1,
                                checkpoint_every=100, gradient_checkpointing=False), **overrides})
    advantages = regret.agent_advantages
    monkeypatch.setattr(regret, "agent_advantages", lambda *a, **k: [sign * x for x in advantages(*a, **k)])
    st, _ = train.start(cfg)
    st.pool_envs = [env]
    return [train.self_play_step(st, step)["agent/return_nohint"] for step in range(steps)]


def test_self_play_steps_raise_the_return_from_chance_to_at_least_0_8(tmp_path, monkeypatch):
    returns = returns_over_steps(tmp_path, 4, +1.0, monkeypatch)
    assert 0.2 <= returns[0] <= 0.7, returns      # chance: the untrained model's replies, before any update
    assert min(returns[2:]) >= 0.8, returns


def test_with_the_advantage_sign_flipped_the_return_falls_instead(tmp_path, monkeypatch):
    """Flipped, the return falls to at most 4 wins of 16 at steps 2 and 3 (measured: 0.44, 0.25, 0.19, 0.19). A
    null update (learning rate 0) stays near chance (0.44, 0.44, 0.38, 0.31) and fails this bar, as the
    unflipped run does: the test is about the update's direction, not about the return merely moving."""
    returns = returns_over_steps(tmp_path, 4, -1.0, monkeypatch)
    assert 0.2 <= returns[0] <= 0.7, returns
    assert max(returns[2:]) <= 0.25, returns   # it unlearns: below what no update at all gives


# Learning beyond format: which reply wins is read from the observation. Each reset seed draws a side; the
# observation is the side's word 30 times over (so the cue dominates the random model's hidden states) and
# never shows a reply. A reply of <= 30 characters wins on the "short" side, a longer one on the "long" side
# (a reply the 32-token limit cuts loses on both). The tiny random model cannot write words, but it sets its
# reply's length through the stop token's logit; to win here that length must depend on the cue.
CUE_ENV = '''
import random

class CueEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
    def reset(self, seed=None):
        self.side = random.Random(seed).choice(["short", "long"])
        return " ".join([self.side] * 30), {}
    def step(self, action):
        won = (len(action) <= 30) == (self.side == "short")
        return ("You win." if won else "You lose."), float(won), True, False, {}
'''
CUE_STEPS, CUE_PLAYS, CUE_LAST = 5, 32, 2
# The statistics. A play's side is a fair coin drawn from its own fresh reset seed, independent of the policy
# and of every other play. So a policy that ignores the observation wins each play with probability at most
# 1/2 (exactly 1/2 unless some replies are cut), whatever it learnt: its wins over the last 2 steps,
# n = 2 * 32 = 64 plays, are at most Binomial(64, 1/2): mean 0.5, standard error 0.5 / sqrt(64) = 0.0625.
# The bar, 0.5 + 3 * 0.0625 = 0.6875, is passed (strictly: 45 wins of 64) by chance with probability
# P(Binomial(64, 1/2) >= 45) = 0.0008.
CUE_BAR = 0.5 + 3 * 0.5 / (CUE_LAST * CUE_PLAYS) ** 0.5


def cue_returns(tmp_path: Path, sign: float, monkeypatch) -> list[float]:
    # lr 3e-3: 1e-2 and 5e-3 overshoot to one length for both sides (return 0.5); fp32 updates: faster on a CPU
    # here and the same on every CPU
    return returns_over_steps(tmp_path, CUE_STEPS, sign, monkeypatch, env=("cue", CUE_ENV), plays=CUE_PLAYS,
                              lr=3e-3, agent_max_new_tokens=32, agent_max_episode_tokens=32, train_bf16="off")


def last_steps_mean(returns: list[float]) -> float:
    return sum(returns[-CUE_LAST:]) / CUE_LAST   # every step has CUE_PLAYS plays: the mean over all 64 plays


def test_self_play_steps_learn_to_read_the_observation_beyond_chance(tmp_path, monkeypatch):
    returns = cue_returns(tmp_path, +1.0, monkeypatch)
    assert returns[0] < CUE_BAR, returns                 # the untrained model does not pass by itself
    assert last_steps_mean(returns) > CUE_BAR, returns   # reads the cue: chance cannot explain it (p < 0.001)


def test_with_the_advantage_sign_flipped_the_observation_is_not_learned(tmp_path, monkeypatch):
    """Flipped, the last two steps fall below the bar mirrored under a coin, 0.5 - 3 * 0.0625 = 0.3125 (measured:
    0.41, 0.09, 0.03, 0, 0): the policy learns the cue the wrong way round. A null update (learning rate 0)
    stays at 0.41-0.44 (some replies are cut and lose on both sides) and fails this bar."""
    returns = cue_returns(tmp_path, -1.0, monkeypatch)
    assert last_steps_mean(returns) < 1 - CUE_BAR, returns   # the return goes the other way, beyond chance


def test_the_learning_bench_keeps_one_copy_per_distinct_program_and_says_where_each_was_played(tmp_path):
    """Its kept run held 60 copies of two programs (envs/step_*/); a changed program is a second copy."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("learning_bench", ROOT / "bench" / "learning.py")
    learning = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(learning)
    cups, doors = ((ROOT / "examples" / f"{n}.py").read_text() for n in ("cups", "doors"))
    for step in range(3):
        folder = tmp_path / "envs" / f"step_{step:05d}"
        folder.mkdir(parents=True)
        (folder / f"env_{step:05d}_00_cups.py").write_text(cups if step < 2 else cups + "# changed\n")
        (folder / f"env_{step:05d}_01_doors.py").write_text(doors)
        (folder / f"env_{step:05d}_00_cups.json").write_text("{}")
    kept = learning.keep_distinct_programs(tmp_path)
    assert sorted(p.name for p in kept) == ["cups.py", "cups_2.py", "doors.py"]
    assert sorted(p.name for p in (tmp_path / "envs").iterdir()) == ["README.md", "cups.py", "cups_2.py", "doors.py"]
    assert (tmp_path / "envs" / "cups.py").read_text() == cups and (tmp_path / "envs" / "doors.py").read_text() == doors
    readme = (tmp_path / "envs" / "README.md").read_text()
    assert "| `cups.py` | 0, 1 |" in readme and "| `cups_2.py` | 2 |" in readme and "| `doors.py` | 0, 1, 2 |" in readme
    assert "bench/learning.py" in readme


def test_the_learning_benchs_normalised_score_and_paired_difference_by_hand():
    """normalised = (R - R_random) / (R_oracle - R_random): 0.5 for [1, 1, 0, 0] between all-lose and all-win,
    None when the oracle does no better than random; paired = mean of b - a episode by episode: 1/4 here."""
    import importlib.util
    from types import SimpleNamespace
    import numpy as np
    spec = importlib.util.spec_from_file_location("learning_bench", ROOT / "bench" / "learning.py")
    learning = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(learning)
    eps = lambda returns: [SimpleNamespace(episode_return=r) for r in returns]   # noqa: E731
    out = learning.normalised(eps([1, 1, 0, 0]), eps([0, 0, 0, 0]), eps([1, 1, 1, 1]), np.random.default_rng(0))
    assert out["score"] == 0.5 and out["ci95"][0] <= 0.5 <= out["ci95"][1] and 0 <= out["ci95"][0] < out["ci95"][1] <= 1
    assert learning.normalised(eps([1, 0]), eps([1, 1]), eps([1, 1]), np.random.default_rng(0)) == \
        {"score": None, "ci95": None}
    paired = learning.paired(eps([0, 0, 1, 1]), eps([1, 0, 1, 1]), np.random.default_rng(0))
    assert paired["diff"] == 0.25 and paired["diff_ci95"] == [0.0, 0.75]   # resampled 0/1 diffs: one 1 in four

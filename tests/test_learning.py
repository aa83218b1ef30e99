"""The loop learns: whole self-play steps (train.self_play_step: play, score, update) on the tiny random model
raise the mean return on a toy environment from about chance to >= 0.8, and the same steps with the agent
advantage's sign flipped drive it down instead (so the first test is about the update's direction, not luck).

The toy environment: one turn, and a reply of at most 70 characters wins. The tiny random model's replies end
after 7-15 tokens (models._tiny_random), so about 4 plays in 10 are short enough at the start; the update can
learn it through the stop token's logit. It is put in the pool directly: the validator would call it `trivial`
(its own short probe actions win).
"""
import shutil
from pathlib import Path

import pytest

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


def returns_over_steps(tmp_path: Path, steps: int, sign: float, monkeypatch) -> list[float]:
    (tmp_path / "pool").mkdir()
    shutil.copy(ROOT / "examples" / "cups.py", tmp_path / "pool")   # --env-pool needs one valid environment
    cfg = runs.Config(model="tiny-random", env_pool=str(tmp_path / "pool"), out=str(tmp_path / "run"), steps=steps,
                      envs_per_step=1, plays=16, hinted_plays=0, max_turns=1, agent_max_new_tokens=24,
                      agent_max_episode_tokens=24, lr=1e-3, regen_interval=1, checkpoint_every=100,
                      gradient_checkpointing=False)
    advantages = regret.agent_advantages
    monkeypatch.setattr(regret, "agent_advantages", lambda *a, **k: [sign * x for x in advantages(*a, **k)])
    st, _ = train.start(cfg)
    st.pool_envs = [("short", SHORT_ENV)]
    return [train.self_play_step(st, step)["agent/return_nohint"] for step in range(steps)]


def test_self_play_steps_raise_the_return_from_chance_to_at_least_0_8(tmp_path, monkeypatch):
    returns = returns_over_steps(tmp_path, 4, +1.0, monkeypatch)
    assert 0.2 <= returns[0] <= 0.7, returns      # chance: the untrained model's replies, before any update
    assert min(returns[2:]) >= 0.8, returns


def test_with_the_advantage_sign_flipped_the_return_falls_instead(tmp_path, monkeypatch):
    returns = returns_over_steps(tmp_path, 4, -1.0, monkeypatch)
    assert 0.2 <= returns[0] <= 0.7, returns
    assert max(returns[2:]) < 0.8 and returns[-1] < returns[0], returns   # the bar above fails, and it unlearns

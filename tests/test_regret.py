"""regret.py: hand-computed values, the derivation in each docstring."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

import cli
import regret
import evaluate

EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.fixture
def fixture_codes() -> list[str]:
    return [p.read_text() for p in sorted(EXAMPLES.glob("*.py"))]


def test_hint_regret_is_unfloored():
    """0.25 - 0.75 = -0.5: the memory keeps the sign, only the `regret` reward floors it."""
    assert regret.hint_regret(0.25, 0.75) == pytest.approx(-0.5)


@pytest.mark.parametrize("w, expected", [
    (0.0, 0.0), (0.15, 0.0), (0.2, 0.2), (0.4, 1.0), (0.5, 1.0), (0.6, 1.0), (0.7, 0.6), (0.85, 0.0), (1.0, 0.0),
])
def test_plateau_is_one_on_the_middle_band_and_linear_to_zero_at_015_and_085(w, expected):
    """Rising edge (w - 0.15) / 0.25: w=0.2 -> 0.05/0.25 = 0.2. Falling edge (0.85 - w) / 0.25: w=0.7 -> 0.6."""
    assert regret.plateau(w) == pytest.approx(expected)


def test_regret_reward_floors_at_zero():
    """max(0, 0.2 - 0.5) = 0 and max(0, 0.9 - 0.5) = 0.4."""
    assert regret.designer_reward("regret", 0.2, 0.5, 0.5) == 0.0
    assert regret.designer_reward("regret", 0.9, 0.5, 0.5) == pytest.approx(0.4)


def test_blend_reward_with_the_full_gap_at_w_035_is_088():
    """0.4 * clip((0.5 - 0.35) / 0.15) + 0.6 * plateau(0.35) = 0.4 * 1 + 0.6 * 0.8 = 0.88."""
    assert regret.designer_reward("blend", 0.5, 0.35, 0.35) == pytest.approx(0.88)


def test_blend_reward_pays_a_partial_gap_its_share_of_the_gap_weight():
    """gap 0.06 / 0.15 = 0.4, so 0.4 * 0.4 + 0.6 * plateau(0.5) = 0.16 + 0.6 = 0.76."""
    assert regret.designer_reward("blend", 0.56, 0.5, 0.5) == pytest.approx(0.76)


def test_blend_negative_gap_clips_to_zero():
    """gap -0.3 clips to 0; w=0.9 is off the plateau: 0.4 * 0 + 0.6 * 0 = 0."""
    assert regret.designer_reward("blend", 0.6, 0.9, 0.9) == 0.0


def test_solve_rate_ignores_the_hint():
    """plateau(0.2) = 0.05 / 0.25 = 0.2, whatever R_hint is."""
    assert regret.designer_reward("solve_rate", 1.0, 0.2, 0.2) == pytest.approx(0.2)
    assert regret.designer_reward("solve_rate", 0.0, 0.2, 0.2) == pytest.approx(0.2)


def test_learning_potential_is_distance_to_slow_mean():
    """|0.3 - 0.54| = 0.24; no history yet (mu None) -> 0."""
    assert regret.designer_reward("learning_potential", 0, 0, 0.3, mu_slow=0.54) == pytest.approx(0.24)
    assert regret.designer_reward("learning_potential", 0, 0, 0.3) == 0.0


def test_unknown_variant_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown designer reward variant"):
        regret.designer_reward("minimax", 0.5, 0.5, 0.5)


def test_learning_potential_pools_a_skill_before_scoring_in_any_order():
    """Two environments of one skill, no history, w = 0.2 and 0.8 (one play each): pooled = 0.5, mu = 0.5,
    both rewards |w - 0.5| = 0.3 in either order (updating env by env gave [0.3, 0.555])."""
    def rewards(ws):
        given = [{"skill": "A", "hinted": [], "unhinted": [[w]]} for w in ws]
        return [e["designer_reward"] for e in regret.score_window("learning_potential", given, {}, 1)["envs"]]
    assert rewards([0.2, 0.8]) == pytest.approx([0.3, 0.3])
    assert rewards([0.8, 0.2]) == pytest.approx([0.3, 0.3])


def test_slow_mean_is_updated_first_with_the_pooled_window_mean():
    """Prior 0.4, pooled over a 2-step window [[0, 1], [1, 1]] = 0.75: mu = 0.15 * 0.4 + 0.85 * 0.75 = 0.6975,
    and learning_potential reads it: |0.75 - 0.6975| = 0.0525."""
    out = regret.score_window("learning_potential", [{"skill": "A", "unhinted": [[0, 1], [1, 1]]}], {"A": 0.4}, 2)
    assert out["mu_slow"]["A"] == pytest.approx(0.6975)
    assert out["envs"][0]["designer_reward"] == pytest.approx(0.0525)


def test_the_slow_mean_pools_a_hung_environments_surviving_plays():
    """As the official code pools every accumulated play: prior 0.4, [[0, 1], [1, 1]] and a neighbour hung at
    the first step with two survivors [0, 0]: pooled = 3 / 6 = 0.5, mu = 0.15 * 0.4 + 0.85 * 0.5 = 0.485 (leaving
    the hung one out gave 0.6975); the healthy one's reward |0.75 - 0.485| = 0.265, the hung one's -0.5."""
    given = [{"skill": "A", "unhinted": [[0, 1], [1, 1]]}, {"skill": "A", "hung_step": 0, "unhinted": [[0, 0]]}]
    out = regret.score_window("learning_potential", given, {"A": 0.4}, 2)
    assert out["mu_slow"]["A"] == pytest.approx(0.485)
    assert [e["designer_reward"] for e in out["envs"]] == pytest.approx([0.265, regret.HANG_PENALTY])


def test_scale_counts_plays_not_trained_samples():
    """4 environments x 4 plays, 3 of them flat: S stays min(16 * 1 / 4, 50) = 4 (counting trained samples
    gave 1, and 1/4 when all are flat). The non-flat env's designer advantage is (0.5 - 0.125) * 4 = 1.5."""
    flat = {"skill": "A", "hinted": [0, 0, 0, 0], "unhinted": [[0, 0, 0, 0]]}
    given = [{"skill": "A", "hinted": [1, 1, 1, 1], "unhinted": [[0, 1, 0, 1]]}] + [flat] * 3
    out = regret.score_window("regret", given, {}, 1)
    assert out["scale"] == 4.0
    assert out["envs"][0]["designer_advantage"] == pytest.approx(1.5)
    assert regret.score_window("regret", [flat] * 4, {}, 1)["scale"] == 4.0


def test_an_invalid_program_is_paid_invalid_reward_and_centred_with_its_skill():
    """Opt-in --invalid-samples: skill A has one valid environment (hinted [1, 1, 0, 1], unhinted [[0, 1, 0, 0]]:
    regret 0.5) and one rejected program (reward -0.5); skill B only a rejected one. A's mean is 0, S = 4 plays
    * 1 / 3 entries = 4/3, so A's advantages are 0.5 * 4/3 = 2/3 and -2/3; B's lone entry is 0. The slow means
    see only played returns (B gets none), and without the rejected entries A's environment is alone: 0."""
    valid = {"skill": "A", "hinted": [1, 1, 0, 1], "unhinted": [[0, 1, 0, 0]]}
    out = regret.score_window("regret", [valid, {"skill": "A", "unhinted": [], "invalid": True},
                                         {"skill": "B", "invalid": True, "unhinted": []}], {}, 1, invalid_reward=-0.5)
    assert [e["designer_reward"] for e in out["envs"]] == [0.5, -0.5, -0.5]
    assert out["scale"] == pytest.approx(4 / 3)
    assert [e["designer_advantage"] for e in out["envs"]] == pytest.approx([2 / 3, -2 / 3, 0.0])
    assert out["mu_slow"] == {"A": 0.25} and out["envs"][1]["agent_advantages"] == []
    assert regret.score_window("regret", [valid], {}, 1)["envs"][0]["designer_advantage"] == 0.0


def test_score_window_matches_timing_and_pools_w_over_the_window():
    """Window of 2 steps, unhinted [[0, 0], [0, 1]]: r_nohint = mean of step 0 only = 0 (matched timing with
    the hints), r_hint = 0.5, regret 0.5; w = mean of all four = 0.25, win rate 0 (step 0's); step 0 ties,
    step 1 gives [-1, 1]; S = min(2 * 2 / 1, 50) = 4. With [[0, 0], [1, 1]]: w = 0.5, so
    blend = 0.4 * clip(0.5 / 0.15) + 0.6 * plateau(0.5) = 1.0, win rate still 0, both steps tie."""
    given = [{"skill": "A", "hinted": [0, 1], "unhinted": [[0, 0], [0, 1]]}]
    out = regret.score_window("blend", given, {}, 2)
    (e,) = out["envs"]
    assert (e["r_nohint"], e["r_hint"], e["regret"], e["w"], e["win_rate"]) == (0.0, 0.5, 0.5, 0.25, 0.0)
    assert e["agent_advantages"][0] == [0.0, 0.0] and e["agent_advantages"][1] == pytest.approx([-1, 1])
    assert out["scale"] == 4.0
    given = [{"skill": "A", "hinted": [0, 1], "unhinted": [[0, 0], [1, 1]]}]
    (e,) = regret.score_window("blend", given, {}, 2)["envs"]
    assert e["w"] == 0.5 and e["designer_reward"] == pytest.approx(1.0) and e["win_rate"] == 0.0
    assert e["agent_advantages"] == [[0.0, 0.0], [0.0, 0.0]]


def test_regret_based_pays_the_hint_gap_against_every_unhinted_play_of_the_window():
    """R = 2, one skill. Env 1: hinted [1, 1, 1, 1], unhinted [[0, 0, 0, 0], [1, 1, 1, 1]]; env 2: hinted
    [1, 1, 0, 0], unhinted all 0. regret (first step): 1 - 0 = 1 and 0.5 - 0 = 0.5, centred +-0.25, S =
    min(8 * 2 / 2, 50) = 8: [+2, -2]. regret_based (the official delayed variant): 1 - 0.5 = 0.5 and
    0.5 - 0 = 0.5: both 0.5, centred [0, 0]."""
    given = [{"skill": "A", "hinted": [1, 1, 1, 1], "unhinted": [[0, 0, 0, 0], [1, 1, 1, 1]]},
             {"skill": "A", "hinted": [1, 1, 0, 0], "unhinted": [[0, 0, 0, 0], [0, 0, 0, 0]]}]
    first_step = regret.score_window("regret", given, {}, 2)["envs"]
    assert [e["designer_advantage"] for e in first_step] == pytest.approx([2.0, -2.0])
    window = regret.score_window("regret_based", given, {}, 2)["envs"]
    assert [e["designer_reward"] for e in window] == [0.5, 0.5]
    assert [e["designer_advantage"] for e in window] == [0.0, 0.0]


def test_regret_based_gives_a_hung_environment_the_penalty():
    given = [{"skill": "A", "hung_step": 0, "hinted": [1, 1], "unhinted": [[0, 0]]}, {"skill": "A", "unhinted": [[0, 0]]}]
    assert regret.score_window("regret_based", given, {}, 1)["envs"][0]["designer_reward"] == -0.5


def test_without_hinted_plays_r_hint_is_zero():
    """The official default when no hinted play ran: R_hint = 0, so regret = -R_nohint (floored to 0 as a reward)."""
    (e,) = regret.score_window("regret", [{"skill": "A", "unhinted": [[0, 1]]}], {}, 1)["envs"]
    assert (e["r_hint"], e["r_nohint"], e["regret"], e["designer_reward"]) == (0.0, 0.5, -0.5, 0.0)


def test_a_first_step_hang_gets_the_penalty_and_its_survivors_their_advantages():
    """Hung at the window's first step with two surviving plays [0, 1]: reward -0.5; the survivors are trained
    as the official code trains them, z-scores [-1, 1]; S = min(4 * 1 / 2, 50) = 2, mean reward -0.25, so the
    hung one's advantage is (-0.5 + 0.25) * 2 = -0.5."""
    given = [{"skill": "A", "hung_step": 0, "hinted": [1], "unhinted": [[0, 1]]}, {"skill": "A", "unhinted": [[0, 0]]}]
    out = regret.score_window("regret", given, {}, 1, hang_penalty=-0.5)
    assert out["envs"][0]["designer_reward"] == -0.5 and out["envs"][0]["agent_advantages"] == [pytest.approx([-1, 1])]
    assert out["envs"][0]["designer_advantage"] == pytest.approx(-0.5)


def test_slow_mean_moves_85_percent_of_the_way_to_the_new_mean():
    """0.15 * 0.2 + 0.85 * 0.6 = 0.54; then 0.15 * 0.54 + 0.85 * 0 = 0.081."""
    mu = regret.update_slow_mean(0.2, 0.6)
    assert mu == pytest.approx(0.54)
    assert regret.update_slow_mean(mu, 0.0) == pytest.approx(0.081)


def test_agent_advantages_are_population_z_scores():
    """[0, 0, 1, 1]: mean 0.5, population std 0.5 -> [-1, -1, 1, 1]; [0, 0, 0, 1]: mean 0.25,
    std sqrt(3/16) = 0.4330 -> (0 - 0.25) / 0.4330 = -0.5774, (1 - 0.25) / 0.4330 = 1.7321."""
    assert regret.agent_advantages([0, 0, 1, 1]) == pytest.approx([-1, -1, 1, 1], abs=1e-6)
    assert regret.agent_advantages([0, 0, 0, 1]) == pytest.approx([-0.57735] * 3 + [1.73205], abs=1e-5)


def test_agent_advantages_constant_group_is_zero():
    """0.1 * 3 / 3 is not exactly 0.1 in floating point: ties are zero by rule, not by round-off."""
    assert regret.agent_advantages([0.1, 0.1, 0.1]) == [0.0, 0.0, 0.0]
    assert regret.agent_advantages([]) == []


def test_a_play_without_tokens_leaves_the_z_score_group():
    """[-1, 0, 0, 0] with the -1 untrained (its environment failed to start): the three trained plays tie,
    so every advantage is 0, not +0.577 for three identical outcomes. [-1, 0, 1, 0] likewise scores only
    [0, 1, 0]: mean 1/3, std 0.4714 -> -0.7071, +1.4142, -0.7071."""
    assert regret.agent_advantages([-1, 0, 0, 0], [False, True, True, True]) == [0.0] * 4
    assert regret.agent_advantages([-1, 0, 1, 0], [False, True, True, True]) == pytest.approx(
        [0.0, -0.70711, 1.41421, -0.70711], abs=1e-5)


def test_designer_advantages_center_per_skill_and_scale():
    """S = 50. Skill A [1, 0] mean 0.5 -> +-0.5 * 50 = +-25; skill B [0.3, 0.1] mean 0.2 -> +-0.1 * 50 = +-5.
    No std division."""
    adv = regret.designer_advantages([1.0, 0.0, 0.3, 0.1], ["A", "A", "B", "B"], 50.0)
    assert adv == pytest.approx([25.0, -25.0, 5.0, -5.0])


def test_designer_scale_is_plays_times_window_over_envs_capped_at_50():
    """min(n_RA * R / n_ED, 50): 2 envs x 3 plays, R = 1 -> 6 / 2 = 3; the paper's 192 * 4 / 24 = 32;
    400 / 2 = 200 -> 50."""
    assert regret.designer_scale(6, 1, 2) == 3.0
    assert regret.designer_scale(192, 4, 24) == 32.0
    assert regret.designer_scale(400, 1, 2) == 50.0


def test_designer_advantages_length_mismatch_raises():
    with pytest.raises(ValueError):
        regret.designer_advantages([0.1], ["A", "B"], 4.0)


def test_zero_variance_fraction_counts_flat_and_single_play_groups():
    """Groups [1,1] flat, [0,1] not, [0.2,0.2,0.2] flat, [0.5] flat (single): 3 / 4 = 0.75."""
    assert evaluate.zero_variance_fraction([[1, 1], [0, 1], [0.2, 0.2, 0.2], [0.5]]) == pytest.approx(0.75)
    assert evaluate.zero_variance_fraction([]) == 0.0


def test_vendi_score_is_the_exp_entropy_of_the_kernel_eigenvalues():
    """K = [[1, .5], [.5, 1]]: eig(K/2) = .75, .25; exp(-(.75 ln .75 + .25 ln .25)) = exp(0.5623) = 1.7548."""
    expected = math.exp(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert evaluate.vendi_score(np.array([[1, 0.5], [0.5, 1]])) == pytest.approx(expected)
    assert expected == pytest.approx(1.7548, abs=1e-4)


def test_diversity_identical_programs_is_one_over_n():
    code = "class GuessEnv:\n    def reset(self, seed=None):\n        return 'hi', {}\n"
    assert evaluate.diversity([code] * 5) == pytest.approx(1 / 5)


def test_diversity_unrelated_programs_is_close_to_one():
    codes = ["import math\nprint(math.pi * radius ** 2)",
             "for word in sentence.split(): counts[word] += 1",
             "while queue:\n    node = queue.pop()\n    seen.add(node)",
             "SELECT name FROM users WHERE age > 30;"]
    assert evaluate.diversity(codes) > 0.95


def test_diversity_of_fixture_environments_sits_between(fixture_codes):
    """Three different games written in one house style share boilerplate: diverse, but not unrelated."""
    d = evaluate.diversity(fixture_codes)
    assert 1 / 3 < d < 1.0


def test_hint_leak_finds_the_answer_only_as_a_whole_token():
    assert evaluate.hint_leak("The secret is 37, just say it.", r"\boxed{37}")
    assert not evaluate.hint_leak("Use the higher/lower feedback to halve the range.", r"\boxed{37}")
    assert not evaluate.hint_leak("Try 370.", r"\boxed{37}")  # whole tokens only


def test_hint_leak_needs_every_key_value():
    """Solution 'right right down': keys {right, down}; a hint naming only 'right' does not give it away."""
    sol = [r"\boxed{right}", r"\boxed{right}", r"\boxed{down}"]
    assert not evaluate.hint_leak("Head right first.", sol)
    assert evaluate.hint_leak("Go RIGHT twice, then down.", sol)


def test_opening_leak_when_the_first_observation_shows_the_answer():
    sol = r"\boxed{guess 12}"
    assert evaluate.opening_leak("Target: 12. Guess it with \\boxed{guess N}.", sol)
    assert not evaluate.opening_leak("Guess a number from 1 to 100 with \\boxed{guess N}.", sol)


def test_loc_skips_blank_and_comment_lines():
    assert evaluate.loc("import os\n\n   # why\nx = 1\n\n") == 2


def test_no_solution_means_no_leak():
    assert not evaluate.hint_leak("anything 37", None) and not evaluate.opening_leak("anything", "")


# `spade-mini score` on windows worked out by hand from the official rules (spade-rl/spade at 9b2b813, read for
# the rules only): -0.5 only for a hang at the window's first step, a later hang drops its plays and the rest
# is scored; R_hint = 0 without hinted plays; the memory's win rate is the first step's share of wins.

def score(given: dict, tmp_path, capsys) -> dict:
    (tmp_path / "window.json").write_text(json.dumps(given))
    assert cli.main(["score", str(tmp_path / "window.json")]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_hang_after_the_first_step_is_no_penalty_its_surviving_plays_are_scored(tmp_path, capsys):
    """R = 2, regret, one skill, 4 plays. Env 0: hinted [1, 1, 1, 1], unhinted [[0, 1, 0, 1], [1, 1, 1, 1]]:
    regret 1 - 0.5 = 0.5. Env 1 hangs at step 1 (two plays survive it): hinted [1, 1, 0, 0], unhinted
    [[0, 0, 0, 1], [0, 1]]: regret 0.5 - 0.25 = 0.25 (the old rule gave -0.5). S = min(8 * 2 / 2, 50) = 8, mean
    0.375: advantages +1.0 and -1.0 (old: +4, -4). mu(A) = pooled 8 / 14 (every surviving play). win rates
    (first step) 0.5 and 0.25; step 1's survivors [0, 1] get z-scores [-1, 1]."""
    out = score({"variant": "regret", "window": 2, "envs": [
        {"skill": "A", "hinted": [1, 1, 1, 1], "unhinted": [[0, 1, 0, 1], [1, 1, 1, 1]]},
        {"skill": "A", "hung_step": 1, "hinted": [1, 1, 0, 0], "unhinted": [[0, 0, 0, 1], [0, 1]]}]}, tmp_path, capsys)
    assert [e["designer_reward"] for e in out["envs"]] == [0.5, 0.25]
    assert [e["designer_advantage"] for e in out["envs"]] == pytest.approx([1.0, -1.0]) and out["scale"] == 8.0
    assert out["mu_slow"]["A"] == pytest.approx(8 / 14)
    assert [e["win_rate"] for e in out["envs"]] == [0.5, 0.25]
    assert out["envs"][1]["agent_advantages"][1] == pytest.approx([-1.0, 1.0])


def test_a_hang_at_the_first_step_is_the_penalty_under_regret_based(tmp_path, capsys):
    """R = 2, regret_based. Env 0: R_hint 1, w = 6 / 8 = 0.75: 0.25. Env 1 hangs at step 0, two plays [0, 1]
    survive and it plays no more: -0.5. n_RA = 4 + 2 = 6, S = min(6 * 2 / 2, 50) = 6, mean -0.125: advantages
    +2.25 and -2.25; mu(A) = (6 + 1) / 10 = 0.7."""
    out = score({"variant": "regret_based", "window": 2, "envs": [
        {"skill": "A", "hinted": [1, 1, 1, 1], "unhinted": [[0, 1, 0, 1], [1, 1, 1, 1]]},
        {"skill": "A", "hung_step": 0, "hinted": [1, 1], "unhinted": [[0, 1]]}]}, tmp_path, capsys)
    assert [e["designer_reward"] for e in out["envs"]] == [0.25, -0.5] and out["scale"] == 6.0
    assert [e["designer_advantage"] for e in out["envs"]] == pytest.approx([2.25, -2.25])
    assert out["mu_slow"]["A"] == pytest.approx(0.7)


def test_regret_based_without_hinted_plays_never_pays_a_falling_return(tmp_path, capsys):
    """--hinted-plays 0, R = 2, regret_based. Env 0's return falls, [[1, 1, 0, 0], [0, 0, 0, 0]]: w = 0.25; with
    R_hint = 0 (the official default) its reward is max(0, 0 - 0.25) = 0, as is env 1's (all 0). Taking R_hint
    = R_nohint = 0.5 paid 0.5 - 0.25 = 0.25 and, S = 8, an advantage of +1.0 for making the agent worse."""
    out = score({"variant": "regret_based", "window": 2, "envs": [
        {"skill": "A", "unhinted": [[1, 1, 0, 0], [0, 0, 0, 0]]},
        {"skill": "A", "unhinted": [[0, 0, 0, 0], [0, 0, 0, 0]]}]}, tmp_path, capsys)
    assert [e["designer_reward"] for e in out["envs"]] == [0.0, 0.0]
    assert [e["designer_advantage"] for e in out["envs"]] == [0.0, 0.0]


def test_the_win_rate_is_the_first_steps_share_of_wins(tmp_path, capsys):
    """R = 2, unhinted [[0, 0, 0, 1], [1, 1, 1, 1]]: the first step won 1 of 4, so 0.25 (the window's 5 / 8 =
    0.625 before); w stays the window's mean, 0.625."""
    out = score({"variant": "regret", "window": 2, "envs": [
        {"skill": "A", "hinted": [1, 1, 1, 1], "unhinted": [[0, 0, 0, 1], [1, 1, 1, 1]]}]}, tmp_path, capsys)
    assert out["envs"][0]["win_rate"] == 0.25 and out["envs"][0]["w"] == 0.625


@pytest.mark.parametrize("entry, field", [({"hung": True}, "envs[0].hung"), ({"hung_step": True}, "envs[0].hung_step"),
                                          ({"hung_step": 2}, "envs[0].hung_step")])
def test_score_input_names_the_hang_step(tmp_path, capsys, entry, field):
    (tmp_path / "w.json").write_text(json.dumps({"variant": "regret", "window": 2,
                                                 "envs": [{"skill": "A", "unhinted": [[0, 1]], **entry}]}))
    assert cli.main(["score", str(tmp_path / "w.json")]) == 2
    assert field in capsys.readouterr().err


def test_win_rate_and_tied_by_hand():
    """A win is a return > 0: of [1, 0, -1, 0.5], two (1/2); none of [] (0). A group with no gradient: one play,
    or every return equal to 1e-12 ([0.5, 0.5 + 1e-13] is; [0, 1] is not)."""
    assert regret.win_rate([1.0, 0.0, -1.0, 0.5]) == 0.5 and regret.win_rate([]) == 0.0
    assert regret.win_rate([0.0, 0.0, 2.0]) == pytest.approx(1 / 3)
    assert [regret.tied(g) for g in ([1.0], [], [0.5, 0.5 + 1e-13], [0.0, 1.0], [0.0, 0.0, 1e-9])] == \
        [True, True, True, False, False]

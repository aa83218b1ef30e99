"""`spade-mini conform`: the golden cases pass on this implementation, hold the hand-computed values of
docs/conform.md, and catch an implementation that computes a formula differently; `--check` reads another
implementation's outputs; `--runs` compares two runs step by step."""
import json
import math

import pytest

import cli
import envs
import evaluate
import regret
import runs


def cases(section: str) -> dict:
    return {c["name"]: c for c in json.loads((evaluate.CONFORM_GOLDEN / f"{section}.json").read_text())}


def test_every_golden_case_agrees_with_this_implementation(capsys):
    assert cli.main(["conform"]) == 0
    out = capsys.readouterr().out
    for section in evaluate.CONFORM_SECTIONS:
        n = len(cases(section))
        assert f"{section}: {n} of {n} cases agree" in out


def test_the_golden_outputs_hold_the_hand_computed_values():
    update = cases("update")
    clipped = update["positive_advantage_clipped"]["output"]   # r = e^0.3 > 1.28 with A = +1: clipped
    assert clipped["loss_mask"] == [0, 0, 1, 1] and clipped["clipped_tokens"] == 1.0
    assert clipped["per_token_loss"][2:] == pytest.approx([-1.28, -1.0]) and clipped["loss"] == pytest.approx(-1.14)
    stale = update["two_turns_clipped_and_stale"]["output"]
    assert stale["tis_weight"][5:] == pytest.approx([math.exp(0.4), math.exp(-2.9)])
    assert stale["per_token_loss"][5] == pytest.approx(math.exp(0.6) * math.exp(0.4))   # A = -1: r unclipped, x w
    assert stale["loss"] == pytest.approx((math.exp(0.3) + 1 + math.e + math.exp(-2.9)) / 4)
    kl = update["kl_term_against_the_reference"]["output"]
    assert kl["kl"][1] == pytest.approx(math.exp(-0.5) - 0.5) and kl["kl"][3] == 10.0   # k3 of 17, capped
    assert update["a_reply_without_sampler_log_probs"]["output"]["rollout_logprobs"] is None
    assert update["a_tied_group_has_no_gradient"]["output"]["loss"] == 0.0
    # returns [0, 1]: mean 0.5, population std 0.5, so play 1's advantage (1 - 0.5) / (0.5 + 1e-8) = 1 - 2e-8;
    # on policy (ratio 1, w 1) each trained token's loss is -A, and the sample's loss their mean
    on = update["one_turn_on_policy"]["output"]
    assert on["advantages"] == pytest.approx([-1.0, 1.0], abs=1e-7) and on["loss_mask"] == [0, 0, 0, 1, 1]
    assert on["per_token_loss"][3:] == [-on["advantages"][1]] * 2 and on["loss"] == pytest.approx(-0.5 / (0.5 + 1e-8))
    windows = cases("windows")
    (e,) = windows["docs_worked_example"]["output"]["envs"]
    assert (e["r_hint"], e["r_nohint"], e["designer_reward"]) == (0.75, 0.25, 0.5)
    hang = windows["hang_at_the_first_step_and_later"]["output"]
    assert [x["designer_reward"] for x in hang["envs"]] == [-0.5, 0.75, 0.5]
    assert hang["scale"] == pytest.approx(10 * 2 / 3)
    lp = windows["learning_potential_with_a_prior"]["output"]
    assert [x["designer_reward"] for x in lp["envs"]] == pytest.approx([0.1825, 0.3175, 0.0])
    # blend, R = 2, one skill: regret 0.75 - 0.25 = 0.5 (gap 0.5 / 0.15 clipped to 1) and w = 4/8 (plateau 1):
    # 0.4 + 0.6 = 1.0; regret 0.25 - 0.25 = 0 and w = 1/8 < 0.15: 0. S = 8 first-step plays x 2 / 2 envs = 8,
    # the skill's mean 0.5: +-0.5 x 8 = +-4; mu_A (no prior) = 5 wins of 16 plays = 0.3125
    blend = windows["blend_two_envs_one_skill_window_2"]["output"]
    assert [(x["designer_reward"], x["designer_advantage"]) for x in blend["envs"]] == [(1.0, 4.0), (0.0, -4.0)]
    assert (blend["scale"], blend["mu_slow"]) == (8.0, {"A": 0.3125})
    # regret_based: max(0, R_hint - w) = 1 - 4/8, 0.5 - 0, max(0, 0.5 - 3/4) = 0.5, 0.5, 0; A's two equal rewards
    # centre to 0, B is alone; S = (4 + 4 + 2) x 2 / 3 = 20/3
    based = windows["regret_based_window_2_two_skills"]["output"]
    assert [x["designer_reward"] for x in based["envs"]] == [0.5, 0.5, 0.0] and based["scale"] == pytest.approx(20 / 3)
    assert [x["designer_advantage"] for x in based["envs"]] == [0.0, 0.0, 0.0]
    # solve_rate, R = 1: the caught game earns 0 (its w 0.5 would pay plateau 1), the other plateau(0.25) = 0.4;
    # S = 8 / 2 = 4, mean 0.2: -0.8, +0.8
    solve = windows["solve_rate_and_a_caught_game"]["output"]
    assert [x["designer_reward"] for x in solve["envs"]] == pytest.approx([0.0, 0.4])
    assert [x["designer_advantage"] for x in solve["envs"]] == pytest.approx([-0.8, 0.8])
    # two rejected programs as samples (-0.5 each): S = 4 first-step plays / 3 = 4/3; skill A's mean (0.5 - 0.5) / 2
    # = 0, so +-0.5 x 4/3; B's one is alone: 0
    invalid = windows["invalid_programs_opt_in"]["output"]
    assert [x["designer_reward"] for x in invalid["envs"]] == [0.5, -0.5, -0.5]
    assert [x["designer_advantage"] for x in invalid["envs"]] == pytest.approx([2 / 3, -2 / 3, 0.0])
    assert cases("parser")["outer_pair_removed"]["output"]["action"] == r"\boxed{a}{b}"
    verdicts = {name: c["output"]["reason"] for name, c in cases("validation").items()}
    assert verdicts["nop_wins_trivial"] == "trivial" and verdicts["oracle_loses_unsolvable"] == "unsolvable"
    assert verdicts["cups_example_oracle_wins"] == "ok"


def test_an_implementation_that_divides_the_designer_advantage_by_the_std_fails(monkeypatch, capsys):
    real = regret.designer_advantages

    def with_std(rewards, skills, scale):
        centred = real(rewards, skills, scale)
        sd = (sum(a * a for a in centred) / len(centred)) ** 0.5 or 1.0
        return [a / sd for a in centred]
    monkeypatch.setattr(regret, "designer_advantages", with_std)
    assert cli.main(["conform", "--only", "windows"]) == 1
    out = capsys.readouterr().out
    assert "blend_two_envs_one_skill_window_2: envs[0].designer_advantage" in out


def test_a_parser_that_keeps_the_spaces_fails(monkeypatch, capsys):
    real = envs.to_action
    monkeypatch.setattr(envs, "to_action", lambda reply: real(reply).replace("{up}", "{ up }"))
    assert cli.main(["conform", "--only", "parser"]) == 1
    assert "spaces_stripped: action" in capsys.readouterr().out


def test_another_implementations_outputs_are_checked_and_the_first_difference_named(tmp_path, capsys):
    theirs = {s: {name: c["output"] for name, c in cases(s).items()} for s in ("windows", "parser")}
    (tmp_path / "theirs.json").write_text(json.dumps(theirs))
    assert cli.main(["conform", "--only", "windows,parser", "--check", str(tmp_path / "theirs.json")]) == 0
    theirs["windows"]["docs_worked_example"]["envs"][0]["regret"] = 0.4
    del theirs["parser"]["unclosed"]
    (tmp_path / "theirs.json").write_text(json.dumps(theirs))
    assert cli.main(["conform", "--only", "windows,parser", "--check", str(tmp_path / "theirs.json")]) == 1
    out = capsys.readouterr().out
    assert "docs_worked_example: envs[0].regret: expected 0.5, got 0.4" in out and "unclosed: missing" in out


@pytest.mark.parametrize("argv, said", [(["--only", "rewards"], "unknown section 'rewards'"),
                                        (["--check", "/nonexistent.json"], "no such file")])
def test_bad_conform_input_is_one_line_and_exit_2(argv, said, capsys):
    assert cli.main(["conform", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("spade-mini: error:") and said in err and "\n" not in err


def write_run(path, values: list[dict]):
    path.mkdir()
    lines = [{"config": {}}] + [{"step": k, "perf/step_s": 9.0 + k, **v} for k, v in enumerate(values)]
    (path / "metrics.jsonl").write_text("".join(runs.json_line(r) + "\n" for r in lines))   # as a run writes


def test_two_runs_are_compared_step_by_step_leaving_out_times(tmp_path, capsys):
    write_run(tmp_path / "a", [{"loss/policy": 0.5, "skills": ["A"]}, {"loss/policy": 0.25, "skills": ["B"]}])
    write_run(tmp_path / "b", [{"loss/policy": 0.5, "skills": ["A"]}, {"loss/policy": 0.25, "skills": ["B"]}])
    assert cli.main(["conform", "--runs", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert "4 of 4 values agree over 2 common steps" in capsys.readouterr().out
    write_run(tmp_path / "c", [{"loss/policy": 0.5, "skills": ["A"]}, {"loss/policy": 0.3, "skills": ["B"]}])
    assert cli.main(["conform", "--runs", str(tmp_path / "a"), str(tmp_path / "c")]) == 1
    assert "step 1 loss/policy: 0.25 vs 0.3" in capsys.readouterr().out


def test_two_runs_that_both_logged_a_nan_do_not_agree_on_it(tmp_path):
    """metrics.jsonl holds a NaN as the string "NaN" (strict JSON, runs.json_line): two diverged runs read as
    agreeing ("NaN" == "NaN") where the bare NaN of before never equalled itself (a review's)."""
    for name in ("a", "b"):
        write_run(tmp_path / name, [{"loss/grad_norm": float("nan"), "agent/return_nohint": 0.5}])
    assert "NaN" in (tmp_path / "a" / "metrics.jsonl").read_text()
    rows = {r["metric"]: r["agree"] for r in evaluate.compare_runs([tmp_path / "a"], [tmp_path / "b"])}
    assert rows == {"loss/grad_norm": False, "agent/return_nohint": True}


def test_compare_runs_skips_a_step_that_is_no_number_and_names_a_metrics_folder(tmp_path, capsys):
    """A line with "step": [0] or {} was a TypeError traceback (unhashable), a folder named metrics.jsonl an
    IsADirectoryError: an audit's."""
    write_run(tmp_path / "a", [{"loss/policy": 0.5}])
    (tmp_path / "b.jsonl").write_text('{"step": [0], "loss/policy": 1}\n{"step": {"a": 1}}\n'
                                      '{"step": 0, "loss/policy": 0.5}\n')
    (tmp_path / "d" / "metrics.jsonl").mkdir(parents=True)
    assert cli.main(["conform", "--runs", str(tmp_path / "a"), str(tmp_path / "b.jsonl")]) == 0
    assert "1 of 1 values agree over 1 common steps" in capsys.readouterr().out
    assert cli.main(["conform", "--runs", str(tmp_path / "a"), str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"spade-mini: error: {tmp_path / 'd' / 'metrics.jsonl'} is not a file (a run directory holds "
                   "metrics.jsonl)"], err


def test_several_runs_a_side_agree_when_the_interval_of_the_difference_holds_zero(tmp_path):
    """Side a: 0.4, 0.5, 0.6 (mean 0.5, variance 0.01); side b: 0.5, 0.6, 0.7 (mean 0.6): the half-width is
    1.96 * sqrt(0.01/3 + 0.01/3) = 0.16 > 0.1, so they agree; b at 0.9, 1.0, 1.1 (mean 1.0) does not."""
    for name, x in [("a0", 0.4), ("a1", 0.5), ("a2", 0.6), ("b0", 0.5), ("b1", 0.6), ("b2", 0.7),
                    ("c0", 0.9), ("c1", 1.0), ("c2", 1.1)]:
        write_run(tmp_path / name, [{"agent/return_nohint": x}])
    side = lambda p: [tmp_path / f"{p}{k}" for k in range(3)]   # noqa: E731
    (row,) = evaluate.compare_runs(side("a"), side("b"))
    assert row["agree"] and row["a"] == pytest.approx(0.5) and row["b"] == pytest.approx(0.6)
    (row,) = evaluate.compare_runs(side("a"), side("c"))
    assert not row["agree"]


def test_another_sandboxs_verdicts_are_compared_by_valid_and_reason_not_by_check_names(tmp_path, capsys):
    """docs/conform.md: another sandbox may name its checks differently; --check compares its verdicts."""
    theirs = {"validation": {name: {"valid": c["output"]["valid"], "reason": c["output"]["reason"],
                                    "checks": {"compiles": True}} for name, c in cases("validation").items()}}
    (tmp_path / "theirs.json").write_text(json.dumps(theirs))
    assert cli.main(["conform", "--only", "validation", "--check", str(tmp_path / "theirs.json")]) == 0
    theirs["validation"]["nop_wins_trivial"]["reason"] = "ok"
    (tmp_path / "theirs.json").write_text(json.dumps(theirs))
    assert cli.main(["conform", "--only", "validation", "--check", str(tmp_path / "theirs.json")]) == 1
    assert "nop_wins_trivial: reason: expected 'trivial', got 'ok'" in capsys.readouterr().out


def test_a_run_that_stopped_early_does_not_agree_and_an_empty_side_is_refused(tmp_path, capsys):
    write_run(tmp_path / "a", [{"loss/policy": 0.5}, {"loss/policy": 0.25}])
    write_run(tmp_path / "b", [{"loss/policy": 0.5}])
    assert cli.main(["conform", "--runs", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    assert "step 1 (logged by one side only)" in capsys.readouterr().out
    assert cli.main(["conform", "--runs", ",", str(tmp_path / "b")]) == 2
    assert "each side needs at least one run" in capsys.readouterr().err

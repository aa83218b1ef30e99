"""The designer half of the loop, exercised: a scripted designer (known valid and invalid programs for designer
prompts) with the real code path for everything else (tiny random agent, sandbox, scoring, memory, update),
over two regeneration windows of two steps each, and a resume in the middle of a window."""
import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

import spade_mini as sm
import cli
import envs
import regret
import runs
import models
import train

# The agent wins when the length of its action has the parity of the seed: about half of random replies, so
# win rates sit inside the memory's positive band. solution() knows the parity.
PARITY_ENV = '''
class ParityEnv:
    """Reply with an action of the right parity."""
    def __init__(self, max_turns=12):
        self.max_turns = max_turns
    def reset(self, seed=None):
        self.seed, self.turn = seed or 0, 0
        return "Say something inside \\\\boxed{}; its length decides.", {}
    def step(self, action):
        self.turn += 1
        won = len(action) % 2 == self.seed % 2
        return ("won" if won else "lost"), float(won), True, False, {}
    def solution(self):
        return "\\\\boxed{12}" if self.seed % 2 == 0 else "\\\\boxed{1}"
'''
# Wins when the length is (seed + 1) modulo 3: about a third of random replies.
THIRDS_ENV = '''
class ThirdsEnv:
    """Reply with an action of the right length modulo 3."""
    def __init__(self, max_turns=12):
        self.max_turns = max_turns
    def reset(self, seed=None):
        self.target = ((seed or 0) + 1) % 3
        return "Say something inside \\\\boxed{}; its length modulo 3 decides.", {}
    def step(self, action):
        won = len(action) % 3 == self.target
        return ("won" if won else "lost"), float(won), True, False, {}
    def solution(self):
        return "\\\\boxed{" + "12345"[:1 + self.target] + "}"
'''
# Only the seed itself wins: a random agent never does (w = 0, designer reward 0 under blend).
SEED_ENV = '''
class SeedEnv:
    """Name the seed."""
    def __init__(self, max_turns=12):
        self.max_turns = max_turns
    def reset(self, seed=None):
        self.seed = seed or 0
        return "Name the hidden number inside \\\\boxed{}.", {}
    def step(self, action):
        won = action == "\\\\boxed{%d}" % self.seed
        return ("won" if won else "lost"), float(won), True, False, {}
    def solution(self):
        return "\\\\boxed{%d}" % self.seed
'''
# The parity game turned round for the second window (the other parity wins), so it pays otherwise at every seed:
# PARITY_ENV, which the second window's prompt shows as a memory example, resent or written anew with the same
# rule, would be rejected as a copy (evaluate.reject_copies compares statements, then behaviour).
ODD_EVEN_ENV = '''
class OddEvenEnv:
    """The length of the action must have the other parity than the seed's."""
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.wanted = 0
    def reset(self, seed=None):
        self.wanted = ((seed or 0) + 1) % 2
        return "Whether you win depends on how long your \\\\boxed{} answer is.", {}
    def step(self, action):
        ok = (len(action) - self.wanted) % 2 == 0
        return ("you win" if ok else "you lose"), 1.0 if ok else 0.0, True, False, {}
    def solution(self):
        return "\\\\boxed{" + "x" * (2 - self.wanted) + "}"
'''
INVALID = "class BrokenEnv(:\n    pass"


def answer(code: str) -> str:
    return f"Here is my game.\n```python\n{code}\n```\n"


class ScriptedDesigner:
    """Designer prompts get scripted answers, by attempt: [valid, invalid] for the two slots (ParityEnv in the
    first window, OddEvenEnv in the second), then [valid] for the slot still empty (ThirdsEnv, then SeedEnv). Every other prompt goes to the real model. Records prompts and update calls."""

    def __init__(self, monkeypatch, fail_at: tuple | None = None):
        self.real_generate, self.real_update = models.generate, sm.update
        self.designer_prompts, self.updates = [], []
        monkeypatch.setattr(models, "generate", self.generate)
        monkeypatch.setattr(sm, "update", self.update)
        if fail_at:                      # a crash at one fault point of one step (as a SIGKILL would stop it)
            real_fault = runs.fault_point

            def fault(name, step):
                if (name, step) == fail_at:
                    raise RuntimeError(f"crash at {name}:{step}")
                real_fault(name, step)
            monkeypatch.setattr(runs, "fault_point", fault)

    def generate(self, model, tok, prompts, **kw):
        texts = [tok.decode(p) for p in prompts]
        if not any("You are an Environment Designer" in t for t in texts):
            return self.real_generate(model, tok, prompts, **kw)
        self.designer_prompts.append(texts)
        window0 = len(self.designer_prompts) <= 2
        first, second = (PARITY_ENV, THIRDS_ENV) if window0 else (ODD_EVEN_ENV, SEED_ENV)   # window 0, window 2
        script = [answer(first), answer(INVALID)] if len(prompts) == 2 else [answer(second)]
        rows = [(p, tok(a, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]) for p, a in zip(prompts, script)]
        # the sampler's record (models.Sampler) of these tokens: the model's log-probs at the sampling temperature
        recorded = sm.sampled_logprobs(model, [(p + c, [0] * len(p) + [1] * len(c)) for p, c in rows],
                                       temperature=kw["temperature"], token_budget=4096, pad_id=tok.pad_token_id or 0)
        return [models.Completion(p, c, a, True, lp[len(p):]) for (p, c), a, lp in zip(rows, script, recorded)]

    def update(self, model, optimizer, samples, **kw):
        self.updates.append(list(samples))
        return self.real_update(model, optimizer, samples, **kw)


ARGS = ["--model", "tiny-random", "--skills", "Optimization", "--envs-per-step", "2", "--design-attempts", "2",
        "--plays", "4", "--hinted-plays", "2", "--max-turns", "2", "--hint-max-new-tokens", "8",
        "--agent-max-new-tokens", "32", "--agent-max-episode-tokens", "64", "--doc-words", "40", "--backfill", "",
        "--regen-interval", "2", "--steps", "4", "--designer-reward", "blend", "--train-bf16", "off", "--no-play-guard"]
# note: the play guard is off here: these games are lotteries of the reply's length, which it catches (departure 32;
# test_the_play_guard_zeroes_the_designer_reward_of_a_lottery_end_to_end)
# note: fp32 updates, so the tiny model's sampled outcomes (which steps tie) are the same on every CPU, with or
# without native bf16


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def steps(run: Path) -> list[dict]:
    return [r for r in lines(run / "metrics.jsonl") if "step" in r]


@pytest.fixture(scope="module")
def designed_run(tmp_path_factory):
    """Four steps, two windows of two, with the scripted designer: (run directory, the stand-in)."""
    out = tmp_path_factory.mktemp("designer") / "run"
    with pytest.MonkeyPatch.context() as mp:
        designer = ScriptedDesigner(mp)
        assert cli.main(["train", *ARGS, "--out", str(out)]) == 0
    return out, designer


def test_the_play_guard_zeroes_the_designer_reward_of_a_lottery_end_to_end(tmp_path):
    """With the guard on (the default), the first window's parity game, a lottery of the reply's length, is caught
    ("blind win"): the window's input records it and its designer reward is 0. (The thirds game, a lottery won a
    third of the time, escapes at these seeds: its made-up actions won under a quarter of their 12 plays.)"""
    out = tmp_path / "run"
    with pytest.MonkeyPatch.context() as mp:
        ScriptedDesigner(mp)
        args = [a for a in ARGS if a != "--no-play-guard"]
        assert cli.main(["train", *args[:args.index("--steps") + 1], "2", *args[args.index("--steps") + 2:],
                         "--out", str(out)]) == 0
    (window,) = [r for r in lines(out / "samples.jsonl") if r["kind"] == "window" and r["designed"]]
    assert [e["caught"] for e in window["input"]["envs"]] == [True, False]
    assert window["output"]["envs"][0]["designer_reward"] == 0.0 < window["output"]["envs"][1]["designer_reward"]
    assert steps(out)[0]["env/guard_caught"] == 1


def test_valid_programs_are_designed_at_each_window_start(designed_run):
    run, _ = designed_run
    metrics = steps(run)
    assert [r["window/start"] for r in metrics] == [0, 0, 2, 2]
    assert [r["designer/attempts"] for r in metrics] == [3, 0, 3, 0]   # 2 slots, the invalid one retried
    assert metrics[0]["designer/valid_rate"] == pytest.approx(2 / 3)
    assert metrics[0]["designer/rejections"] == {"syntax": 1}


def test_returns_match_the_window_records_and_r_hint_is_logged_at_window_starts(designed_run):
    """The window record (samples.jsonl, at the window's last step) holds every play of the window: step k of
    a window logs R_nohint = mean over environments of mean(unhinted[k]); its first step also logs R_hint (mean
    of the hinted plays) and regret R_hint - mean(unhinted[0])."""
    run, _ = designed_run
    metrics = steps(run)
    # hinted plays happen at a window's first step only
    assert [r["agent/return_hint"] is not None for r in metrics] == [True, False, True, False]
    assert [r["agent/return_nohint"] is not None for r in metrics] == [True] * 4
    windows = [r for r in lines(run / "samples.jsonl") if r["kind"] == "window"]
    assert [w["start"] for w in windows] == [0, 2]
    mean = lambda xs: sum(xs) / len(xs)
    for w in windows:
        given = [e for e in w["input"]["envs"] if e["hung_step"] is None]
        assert len(given) == 2
        for k in range(2):
            r = metrics[w["start"] + k]
            assert r["agent/return_nohint"] == pytest.approx(mean([mean(e["unhinted"][k]) for e in given]))
        first = metrics[w["start"]]
        assert first["agent/return_hint"] == pytest.approx(mean([mean(e["hinted"]) for e in given]))
        scored = [out["regret"] for e, out in zip(w["input"]["envs"], w["output"]["envs"]) if e["hung_step"] is None]
        assert first["env/regret"] == pytest.approx(mean(scored))   # the regret the window's score gave each


def test_memory_holds_one_record_per_designed_environment_with_every_field(designed_run):
    run, _ = designed_run
    memory = json.loads((run / "memory.json").read_text())["records"]
    assert [r["env_id"] for r in memory] == ["env_00000_00", "env_00000_01", "env_00002_00", "env_00002_01"]
    for r in memory:
        assert set(r) >= {"env_id", "file", "skill", "code", "win_rate", "regret", "r_hint", "r_nohint", "w",
                          "step", "hung"}
        assert Path(r["file"]).read_text() == r["code"] and r["skill"] == "Optimization"
        assert r["step"] in (0, 2) and r["hung"] is False


def test_a_later_designer_prompt_carries_positives_from_memory(designed_run):
    run, designer = designed_run
    memory = json.loads((run / "memory.json").read_text())["records"]
    assert any(0.15 <= r["win_rate"] <= 0.85 for r in memory[:2])       # the first window made a positive
    first, later = designer.designer_prompts[0], designer.designer_prompts[2]
    assert not any("Past environments of this skill" in t for t in first)
    assert any("Past environments of this skill" in t and "env_00000_0" in t for t in later)


def updates_by_step(run: Path, designer) -> dict:
    """step -> the samples its update call got. A step whose groups all tie has no samples and calls no update,
    so the calls are matched to the steps that logged samples, in order."""
    trained = [r["step"] for r in steps(run) if r["loss/samples_agent"] + r["loss/samples_designer"] > 0]
    assert len(trained) == len(designer.updates)
    return dict(zip(trained, designer.updates))


def test_designer_samples_train_only_at_window_ends(designed_run):
    run, designer = designed_run
    assert [r["loss/samples_designer"] > 0 for r in steps(run)] == [False, True, False, True]
    by_step = updates_by_step(run, designer)
    assert [any(s.role == "designer" for s in by_step.get(k, [])) for k in range(4)] == [False, True, False, True]


def test_designer_samples_carry_the_log_probs_they_were_sampled_with(designed_run):
    """Sampled at the window's first step, trained at its last: the sample holds the sampling policy's log-probs
    of its program's tokens (the update's TIS denominator), 0 on the prompt."""
    run, designer = designed_run
    samples = [s for s in updates_by_step(run, designer)[1] if s.role == "designer"]
    assert samples
    for sample in samples:
        assert len(sample.sampling_logprobs) == len(sample.token_ids)
        assert all((lp < 0) == bool(m) for lp, m in zip(sample.sampling_logprobs[1:], sample.loss_mask[1:]))


def test_the_logged_window_scores_equal_spade_mini_score_and_the_updates_advantages(designed_run, tmp_path):
    run, designer = designed_run
    windows = [r for r in lines(run / "samples.jsonl") if r["kind"] == "window"]
    assert [w["step"] for w in windows] == [1, 3] and all(w["designed"] for w in windows)
    compared, by_step = 0, updates_by_step(run, designer)
    for w in windows:
        (tmp_path / "window.json").write_text(json.dumps(w["input"]))
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert cli.main(["score", str(tmp_path / "window.json")]) == 0
        assert json.loads(buf.getvalue().strip().splitlines()[-1]) == w["output"]
        scored = [e["designer_advantage"] for e in w["output"]["envs"] if e["designer_advantage"] != 0]
        trained = [s.advantage for s in by_step[w["step"]] if s.role == "designer"]
        assert trained == scored and trained
        # the agent samples of the window's last step carry score's agent advantages (step k = 1)
        agent = sorted(s.advantage for s in by_step[w["step"]] if s.role == "agent")
        logged = sorted(a for e in w["output"]["envs"] for a in e["agent_advantages"][1] if a != 0)
        assert agent == pytest.approx(logged)
        compared += len(agent)
    assert compared   # not vacuous: some window's last step trained agent samples (a step may tie, no gradient)


def test_designer_samples_have_a_nonzero_lora_gradient(designed_run):
    run, designer = designed_run
    samples = [s for s in updates_by_step(run, designer)[1] if s.role == "designer"]
    model, _, _ = models.load_model("tiny-random", lora_r=4, lora_alpha=8, lora_dropout=0.0, quantize="none",
                                gradient_checkpointing=False, cache_dir="~/.cache/spade-mini", seed=0)
    model.zero_grad()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    out = sm.update(model, optimizer, samples, temperature=0.7, token_budget=4096, max_grad_norm=1e9)
    assert out["grad_norm"] > 0 and out["samples"] == len(samples) > 0


def test_a_resume_in_the_middle_of_a_window_gives_the_uninterrupted_metrics(designed_run, tmp_path, monkeypatch):
    """Killed during step 3's play (the window opened at step 2, checkpointed after step 2), then resumed:
    the window's programs, hints and outcomes come back from the checkpoint, and every step's numbers match."""
    run, _ = designed_run
    out = tmp_path / "run"
    with pytest.MonkeyPatch.context() as mp:
        ScriptedDesigner(mp, fail_at=("play", 3))
        with pytest.raises(RuntimeError, match="crash at play:3"):
            cli.main(["train", *ARGS, "--out", str(out)])
    state = json.loads((out / "checkpoints" / "step_00002" / "state.json").read_text())
    assert state["window"]["start"] == 2 and len(state["window"]["envs"]) == 2
    with pytest.MonkeyPatch.context() as mp:
        designer = ScriptedDesigner(mp)
        assert cli.main(["train", "--resume", str(out), "--steps", "4"]) == 0
    assert designer.designer_prompts == []                # the window was not designed again
    def numbers(r):
        return {k: v for k, v in r.items() if not k.startswith(("perf/", "mem/"))}   # the process measured
    resumed, uninterrupted = steps(out), steps(run)
    assert [r["step"] for r in resumed] == [0, 1, 2, 3]
    for a, b in zip(resumed, uninterrupted):
        assert numbers(a).keys() == numbers(b).keys()
        for k, v in numbers(a).items():
            assert v == (pytest.approx(numbers(b)[k]) if isinstance(v, float) else numbers(b)[k]), (a["step"], k)


@pytest.mark.parametrize("variant", regret.DESIGNER_REWARDS)
def test_the_loops_trained_advantages_equal_spade_mini_score_of_the_logged_input_for_every_variant(variant, tmp_path):
    """A window's last step as the loop runs it (train.score, then train.designer_samples and agent_samples):
    `spade-mini score` on the logged input gives exactly the advantages the update receives. Three environments
    of one skill with different hint gaps and window means, so every variant pays them differently."""
    outcomes = [([1, 1, 1, 0], [[0, 1, 0, 0], [1, 1, 0, 1]]), ([1, 0, 0, 0], [[0, 0, 0, 1], [0, 0, 0, 0]]),
                ([1, 1, 0, 0], [[1, 0, 0, 0], [0, 1, 1, 0]])]
    played = []
    for g, (hinted, unhinted) in enumerate(outcomes):
        d = train.Design(g, 0, "A", "", [1, 2], [3, 4, 5], "", "code", envs.Verdict(True, "ok", "E"), [-1.0] * 3)
        e = train.PlayedEnv(f"e{g}", "A", "code", d, hinted=hinted, unhinted=unhinted,
                            trained=[[True] * 4 for _ in unhinted])
        e.episodes = [sm.Episode(sm.EpisodeSpec("code", i, None, (g,)), [1, 2, 3], [0, 1, 1]) for i in range(4)]
        played.append(e)
    window = train.Window(0, 2, ["A"], [e.design for e in played], played)
    cfg = runs.Config(designer_reward=variant, regen_interval=2)
    (record,) = train.score(train.State(cfg, None, None, None, None, None, [], [], [], {"A": 0.2}), window)
    (tmp_path / "window.json").write_text(json.dumps(record["input"]))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(["score", str(tmp_path / "window.json")]) == 0
    scored = json.loads(buf.getvalue().strip().splitlines()[-1])["envs"]
    designer = [s.advantage for s in train.designer_samples(cfg, window)]
    assert designer == pytest.approx([e["designer_advantage"] for e in scored if e["designer_advantage"] != 0])
    assert designer
    agent = [s.advantage for s in train.agent_samples(played)[0]]
    assert agent == pytest.approx([a for e in scored for a in e["agent_advantages"][-1] if a != 0]) and agent


@pytest.mark.parametrize("opt_in", [False, True])
def test_a_rejected_program_is_a_designer_sample_with_a_negative_advantage_only_when_asked(opt_in, tmp_path):
    """--invalid-samples (opt-in; the paper gives invalid generations no sample): a skill with one valid program
    the agent never wins (regret 0) and one rejected program (-0.5) gets a designer gradient, the valid one
    pushed up (+), the rejected one down (-), S = 4 plays / 2 entries = 2: +0.5 and -0.5; `spade-mini score`
    of the logged input gives the same. Without the flag the lone valid program has nothing to be centred
    against: no designer sample."""
    valid = train.Design(0, 0, "A", "", [1, 2], [3, 4, 5], "", "code", envs.Verdict(True, "ok", "E"), [-1.0] * 3)
    broken = train.Design(1, 0, "A", "", [1, 2], [6, 7], "", None, envs.Verdict(False, "syntax", None), [-2.0] * 2)
    played = [train.PlayedEnv("e0", "A", "code", valid, hinted=[0, 0], unhinted=[[0, 0, 0, 0]],
                              trained=[[True] * 4])]
    window = train.Window(0, 1, ["A"], [valid, broken], played)
    cfg = runs.Config(designer_reward="regret", regen_interval=1, invalid_samples=opt_in, invalid_reward=-0.5)
    (record,) = train.score(train.State(cfg, None, None, None, None, None, [], [], [], {}), window)
    samples = train.designer_samples(cfg, window)
    if not opt_in:
        assert samples == [] and len(record["input"]["envs"]) == 1
        return
    assert [(s.token_ids, s.advantage) for s in samples] == [([1, 2, 3, 4, 5], 0.5), ([1, 2, 6, 7], -0.5)]
    assert samples[1].loss_mask == [0, 0, 1, 1] and samples[1].sampling_logprobs == [0.0, 0.0, -2.0, -2.0]
    (tmp_path / "window.json").write_text(json.dumps(record["input"]))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(["score", str(tmp_path / "window.json")]) == 0
    scored = json.loads(buf.getvalue().strip().splitlines()[-1])["envs"]
    assert [e["designer_advantage"] for e in scored] == [0.5, -0.5]


def test_the_loop_trains_a_rejected_program_with_the_log_probs_it_was_sampled_with(tmp_path):
    """End to end under --invalid-samples, one window of two steps: the scripted designer's broken program (slot
    1's first attempt) is logged as an invalid entry of the window and reaches the window's last update as a
    designer sample with a negative advantage (its skill's valid games earn >= 0 under blend) and the sampling
    log-probs design() took for it (negative on its tokens, 0 on the prompt)."""
    out = tmp_path / "run"
    args = ARGS[:ARGS.index("--steps")] + ["--steps", "2", "--designer-reward", "blend", "--train-bf16", "off",
                                           "--no-play-guard"]
    with pytest.MonkeyPatch.context() as mp:
        designer = ScriptedDesigner(mp)
        assert cli.main(["train", *args, "--invalid-samples", "--out", str(out)]) == 0
    (window,) = [r for r in lines(out / "samples.jsonl") if r["kind"] == "window"]
    assert [bool(e.get("invalid")) for e in window["input"]["envs"]] == [False, False, True]
    assert window["output"]["envs"][2]["designer_reward"] == regret.INVALID_REWARD
    (broken,) = [s for s in designer.updates[-1] if s.role == "designer" and s.advantage < 0]
    assert broken.advantage == pytest.approx(window["output"]["envs"][2]["designer_advantage"])
    assert len(broken.sampling_logprobs) == len(broken.token_ids)
    assert all((lp < 0) == bool(m) for lp, m in zip(broken.sampling_logprobs[1:], broken.loss_mask[1:]))


def test_at_a_window_of_one_step_the_samplers_record_weighs_a_designer_sample_by_one(tmp_path):
    """R = 1: the designer's samples are trained at the step that sampled them, so pi_old is the sampling policy;
    they carry the sampler's record (no forward of every program: ~40 s a program for the 1.5B preset on a
    2-core CPU), and in fp32 the update gives the loss and gradient it gives with pi_old as the denominator."""
    out = tmp_path / "run"
    args = ARGS[:ARGS.index("--regen-interval")] + ["--regen-interval", "1", "--steps", "1", "--designer-reward",
                                                    "blend", "--train-bf16", "off", "--no-play-guard"]
    with pytest.MonkeyPatch.context() as mp:
        designer = ScriptedDesigner(mp)
        assert cli.main(["train", *args, "--invalid-samples", "--out", str(out)]) == 0
    samples = [s for s in designer.updates[0] if s.role == "designer"]
    assert samples and all(s.sampling_logprobs == s.rollout_logprobs and len(s.rollout_logprobs) == len(s.token_ids)
                           for s in samples)
    model, _, _ = models.load_model("tiny-random", lora_r=4, lora_alpha=8, lora_dropout=0.0, quantize="none",
                                    gradient_checkpointing=False, cache_dir="~/.cache/spade-mini", seed=0)
    results = []
    for given in (None, [s.sampling_logprobs for s in samples]):
        batch = [sm.Sample(s.token_ids, s.loss_mask, s.advantage, "designer", g) for s, g in
                 zip(samples, given or [None] * len(samples))]
        model.zero_grad()
        sgd = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
        results.append(sm.update(model, sgd, batch, temperature=0.7, token_budget=4096, max_grad_norm=1e9))
    assert results[0]["loss"] == pytest.approx(results[1]["loss"], abs=1e-6)
    assert results[0]["grad_norm"] == pytest.approx(results[1]["grad_norm"], rel=1e-5)


def test_at_a_window_of_one_step_log_probs_are_still_scored_for_another_logprob_temperature(tmp_path):
    """--logprob-temperature 1.0 with sampling at 0.7: the update scores pi_old at 1.0, so a designer sample
    needs the sampling policy's log-probs (the sampler's record, at 0.7) in a window of one step too, or its TIS
    weight would be 1 where the agent's is not."""
    out = tmp_path / "run"
    args = ARGS[:ARGS.index("--regen-interval")] + ["--regen-interval", "1", "--steps", "1", "--designer-reward",
                                                    "blend", "--train-bf16", "off", "--no-play-guard"]
    with pytest.MonkeyPatch.context() as mp:
        designer = ScriptedDesigner(mp)
        assert cli.main(["train", *args, "--invalid-samples", "--logprob-temperature", "1.0", "--out", str(out)]) == 0
    samples = [s for s in designer.updates[0] if s.role == "designer"]
    assert samples and all(len(s.sampling_logprobs) == len(s.token_ids) for s in samples)

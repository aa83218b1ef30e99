"""The play guard (departure 32) and what the trainer computes from a program's text, bounded.

tests/envs/game_*.py are games that pay a broken or leaking environment: each passes validation with the
fair-game guard on (the official contract accepts all of them), and evaluate.play_guard catches each by playing
it as training plays (a fresh process per play, one reset, the play seeds). The honest games of examples/,
bench/heldout/ and tests/copies/new_*.py are not caught. `python tests/test_guard.py` prints the false-positive
count over more seed sets (docs/details.md, departure 32).
"""
import ast
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run as a script: the worktree's modules
import envs  # noqa: E402
import evaluate  # noqa: E402
import regret  # noqa: E402
import runs  # noqa: E402
from sandbox import Limits  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LIMITS = Limits(call_timeout=2.0)
TURNS = 2   # the tiny preset's turn cap: "said twice" needs two turns
GAMES = {"game_master_key": "constant answer", "game_lottery_seed_action": "blind win",
         "game_reset_counter": "constant answer", "game_said_twice": "blind win",
         "game_constant_answer": "constant answer", "game_casefold_constant": "constant answer",
         "game_switch_under_play": "blind win", "game_ordinary_action_wins": "blind win",
         "game_hint_only": "constant answer"}
HINTS = {"game_hint_only": "Think of the tree on a flag with a red leaf: maple."}   # what a source-reading hint says
HONEST = (sorted((ROOT / "examples").glob("*.py")) + sorted((ROOT / "bench" / "heldout").glob("*.py"))
          + sorted((ROOT / "tests" / "copies").glob("new_*.py"))
          + sorted((ROOT / "tests" / "copies").glob("cupvariant_*.py")))


def play_seeds(k: int, n: int = 16) -> list[int]:
    """The unhinted play seeds train.play_all draws for environment 0 at step k."""
    return [envs.derive_seed(k, 0, "env", i) for i in range(n)]


def test_every_hostile_game_is_a_fixture_here():
    assert sorted(GAMES) == sorted(p.stem for p in (ROOT / "tests" / "envs").glob("game_*.py"))


@pytest.mark.parametrize("name", sorted(GAMES))
def test_each_game_that_pays_a_leak_passes_validation_and_the_guard_catches_it(name):
    code = (ROOT / "tests" / "envs" / f"{name}.py").read_text()
    verdict = envs.validate(code, LIMITS, max_turns=TURNS)
    assert verdict.valid, verdict   # the official contract, and the fair-game guard, accept it
    finding = evaluate.play_guard(code, HINTS.get(name, ""), play_seeds(0), TURNS, LIMITS)
    assert finding.startswith(GAMES[name]), finding


def test_the_hint_only_player_needs_the_hint():
    """The answer of game_hint_only is built from character codes: no literal of the source states it."""
    code = (ROOT / "tests" / "envs" / "game_hint_only.py").read_text()
    assert evaluate.play_guard(code, "", play_seeds(0), TURNS, LIMITS) == ""


@pytest.mark.parametrize("path", HONEST, ids=lambda p: p.stem)
def test_honest_games_are_not_caught(path):
    assert evaluate.play_guard(path.read_text(), "Think before you answer.", play_seeds(1), TURNS, LIMITS) == ""


def test_the_reset_counter_is_caught_only_because_the_guard_plays_one_reset_per_process():
    """In one process after other resets (as validation plays) its key does not open the door."""
    code = (ROOT / "tests" / "envs" / "game_reset_counter.py").read_text()
    with envs.open_env(code, TURNS, LIMITS) as env:
        env.call("reset", 1)
        env.call("reset", 2)
        assert env.call("step", "\\boxed{ember}")[2] is False
    assert evaluate._scripted_win(code, 2, ["\\boxed{ember}"], TURNS, LIMITS)


def test_the_made_up_actions_are_drawn_not_constants():
    assert evaluate.made_up_actions(1) != evaluate.made_up_actions(2)
    assert not set(evaluate.made_up_actions(1)) & set(envs.PROBE_ACTIONS)


# -----------------------------------------------------------------------------------------------------------
# the fair-game guard stands aside where there is nothing to replay

@pytest.mark.parametrize("solution", ["", "    def solution(self):\n        return 'Find the ball by elimination.'\n"],
                         ids=["absent", "description"])
def test_the_fair_game_guard_stands_aside_without_a_replayable_solution_and_says_so(solution):
    """The official contract accepts a solution() that is a description, or none: so does the default."""
    cups = (ROOT / "examples" / "cups.py").read_text()
    code = cups[:cups.index("    def solution(self):")] + solution
    verdict = envs.validate(code, LIMITS, max_turns=TURNS)
    assert verdict.valid and verdict.checks["fair_game"] is None, verdict
    assert "fair-game guard stood aside" in verdict.detail


def test_a_replayable_solution_still_meets_the_fair_game_guard():
    verdict = envs.validate((ROOT / "examples" / "cups.py").read_text(), LIMITS, max_turns=TURNS)
    assert verdict.valid and verdict.checks["fair_game"] is True and "stood aside" not in verdict.detail


# -----------------------------------------------------------------------------------------------------------
# the reward: what the guard catches earns 0 (train.score passes `caught` to regret.score_window)

def test_a_caught_environment_earns_zero_under_every_variant():
    """The same row earns a reward under every variant when honest (a prior slow mean of 0.9 gives
    learning_potential one: 0.0975) and 0.0 when the play guard caught it."""
    prior = {"Logical Deduction": 0.9}
    for variant in regret.DESIGNER_REWARDS:
        row = {"skill": "Logical Deduction", "hung_step": None, "hinted": [1.0] * 4, "unhinted": [[0.0, 1.0, 0.0, 0.0]]}
        honest, caught = (regret.score_window(variant, [dict(row, caught=c), dict(row, hinted=[0.0] * 4)], prior, 1)
                          for c in (False, True))
        assert caught["envs"][0]["designer_reward"] == 0.0, variant
        assert honest["envs"][0]["designer_reward"] != 0.0, variant


def test_environment_stats_runs_the_guard_on_designed_games_only():
    from types import SimpleNamespace
    code = (ROOT / "tests" / "envs" / "game_said_twice.py").read_text()
    episodes = [SimpleNamespace(spec=SimpleNamespace(seed=s, hint=None)) for s in play_seeds(0, 4)]
    designed, pooled = (SimpleNamespace(code=code, hint="", episodes=episodes, design=d, stats={}) for d in (1, None))
    out = evaluate.environment_stats([designed, pooled], TURNS, LIMITS, guard=True)
    assert designed.stats["guard"].startswith("blind win") and "guard" not in pooled.stats
    assert out["env/guard_caught"] == 1
    assert "env/guard_caught" not in evaluate.environment_stats([pooled], TURNS, LIMITS)


# -----------------------------------------------------------------------------------------------------------
# the memory: a near-duplicate cap, and what its statistics say

def test_the_memory_keeps_at_most_the_cap_of_records_that_share_mechanics(tmp_path):
    memory = envs.Memory(tmp_path / "m.json")
    same = evaluate.mechanics_signature((ROOT / "examples" / "cups.py").read_text())
    for i in range(5):
        memory.add(dict(env_id=f"c{i}", skill="s", code="", win_rate=0.5, regret=0.1, signature=same), duplicates=2)
    memory.add(dict(env_id="other", skill="s", code="", win_rate=0.5, regret=0.1, signature="x"), duplicates=2)
    assert [r["env_id"] for r in memory.records] == ["c3", "c4", "other"]


def test_a_renamed_copy_shares_the_signature_and_a_new_game_does_not():
    example = envs.example_program()
    copy = (ROOT / "tests" / "copies" / "copy_all_renamed.py").read_text()
    new = (ROOT / "tests" / "copies" / "new_product.py").read_text()
    assert evaluate.mechanics_signature(copy) == evaluate.mechanics_signature(example)
    assert evaluate.mechanics_signature(new) != evaluate.mechanics_signature(example)


def test_memory_stats_give_the_distinct_signature_ratio_and_the_learnable_share():
    cups, doors = ((ROOT / "examples" / f"{n}.py").read_text() for n in ("cups", "doors"))
    records = [dict(code=cups, win_rate=0.5), dict(code=cups, win_rate=0.9), dict(code=doors, win_rate=0.2),
               dict(code=doors, win_rate=0.0)]
    stats = evaluate.memory_stats(records)
    assert stats["memory/distinct_ratio"] == 0.5 and stats["memory/learnable_share"] == 0.5


# -----------------------------------------------------------------------------------------------------------
# bounded: nothing a program's text holds makes the trainer raise or stall

def deep_program(depth: int) -> str:
    """A valid game with an expression nested `depth` levels (no parentheses: the compiler allows it)."""
    return (ROOT / "examples" / "cups.py").read_text() + f"\nDEEP = {'-' * depth}1\n"


def large_program(head: str = "") -> str:
    """The largest program the size limit admits: `head`, cups, then short statements up to envs.MAX_CODE_BYTES."""
    code = head + (ROOT / "examples" / "cups.py").read_text() + "\n"
    line = "x = 1\n"
    return code + line * ((envs.MAX_CODE_BYTES - len(code.encode())) // len(line))


def test_a_program_nested_600_deep_is_refused_too_deep_not_a_recursion_error():
    code = deep_program(600)
    compile(code, "env", "exec")   # it compiles, so it can validate
    (verdict,) = evaluate.reject_copies([code], [envs.Verdict(True, "ok", "CupsEnv")], [[envs.example_program()]])
    assert verdict.reason == "too_deep" and not verdict.valid
    assert evaluate.mechanics_signature(code) and evaluate.guard_literals(code, "x") == []


def test_an_ordinarily_nested_program_is_compared():
    (verdict,) = evaluate.reject_copies([deep_program(20)], [envs.Verdict(True, "ok", "CupsEnv")],
                                        [[envs.example_program()]])
    assert verdict.valid


def test_the_copy_check_on_the_largest_admitted_program_is_bounded_in_time():
    """The red team's trap: a comment whose U+2028 hides a `(` from the compiler, then 42,000 short lines. Split
    as str.splitlines does, no prefix of the program parses, and each failed parse reads to the end: the copy
    check parsed 42,000 ever longer prefixes (past 120 s at 2036886, AMD EPYC). Split as Python does, and with
    at most SHAPE_CUTS cuts, it parses once (3.3 s on the same machine, loaded)."""
    code = large_program(head="# notes\u2028(\n")
    assert len(code.encode()) <= envs.MAX_CODE_BYTES
    compile(code, "env", "exec")
    t0 = time.time()
    (verdict,) = evaluate.reject_copies([code], [envs.Verdict(True, "ok", "CupsEnv")],
                                        [[envs.example_program(), (ROOT / "examples" / "cups.py").read_text()]])
    assert time.time() - t0 < 20.0 and verdict.reason in ("copy", "too_large"), verdict


def test_diversity_of_large_programs_is_bounded_in_memory():
    """8 programs of 256 kB of distinct short lines: 105 MB traced when every token counted and the whole
    (programs x n-grams) matrix was built at once; 7 MB now (DIVERSITY_TOKENS, blocks of shared n-grams)."""
    import tracemalloc
    base = (ROOT / "examples" / "cups.py").read_text() + "".join(f"v{i} = {i}\n" for i in range(18_000))
    codes = [base.replace("v", f"w{k}_") for k in range(8)]
    tracemalloc.start()
    try:
        assert 0.0 < evaluate.diversity(codes) <= 1.0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 * 2 ** 20, peak


def test_diversity_equals_the_dense_computation():
    """The blockwise product is code_vectors' x @ x.T (the naive form)."""
    import numpy as np
    codes = [p.read_text() for p in HONEST]
    x = evaluate.code_vectors(codes)
    assert np.array_equal(evaluate._shared_grams(codes, 3), (x @ x.T).astype(np.float64))


# -----------------------------------------------------------------------------------------------------------
# normalised: text that hides

def test_a_line_separator_in_a_comment_does_not_slip_a_copy_past():
    """U+2028 is no line break to the compiler; str.splitlines took it for one, and the copy's statements
    vanished into a string that opened there (similarity 0.06)."""
    example = envs.example_program()
    code = '# notes\u2028"""\n' + example
    compile(code, "env", "exec")
    assert evaluate.copy_similarity(code, [example]) == 1.0


def test_fullwidth_identifiers_are_the_same_names():
    example = envs.example_program()
    code = example.replace("self", "\uff53\uff45\uff4c\uff46")   # ｓｅｌｆ: the parser NFKC-normalises names
    ast.parse(code)
    assert evaluate.copy_similarity(code, [example]) == 1.0


def test_fullwidth_or_hidden_digits_in_the_opening_are_a_leak():
    assert evaluate.opening_leak("The code is \uff18\uff19.", r"\boxed{89}")
    assert evaluate.opening_leak("The code is 8\u200b9.", r"\boxed{89}")
    assert evaluate.hint_leak("Answer \uff18\uff19.", r"\boxed{89}")
    assert not evaluate.opening_leak("The code is 98.", r"\boxed{89}")


MARKS_OPENING = r'''
class VaultEnv:
    """Valid and solvable; its opening hides the digits it lists behind 2 x 5,000 combining marks."""
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns, self.code, self.turn_count = max_turns, 3, 0

    def reset(self, seed=None):
        self.code, self.turn_count = (seed or 0) % 7 + 3, 0
        return "Open the vault: 3 4 5 6 7 8 9. a" + "\u0301" * 5000 + "\u0316" * 5000, {}

    def step(self, action):
        self.turn_count += 1
        won = action.strip() == "\\boxed{%d}" % self.code
        return ("Open!" if won else "Locked."), float(won), won, self.turn_count >= self.max_turns, {}

    def solution(self):
        return "\\boxed{%d}" % self.code
'''


def test_a_run_of_combining_marks_in_an_opening_reaches_nfkc_cut_to_the_stream_safe_bound(monkeypatch):
    """NFKC sorts a run of combining marks by insertion, quadratic in the run: a valid environment whose opening
    held 2 x 40,000 of them kept the trainer's leak checks (evaluate.environment_stats, no deadline: the parent's
    own work) at 11 s a call, two calls a game a window (~50 s at 2 x 83,000). What reaches NFKC has at most
    runs.MAX_MARKS in a row."""
    from types import SimpleNamespace
    import unicodedata
    longest = []

    def spy(form, text):   # records the longest run of marks NFKC is given, and leaves the text as it is
        run = best = 0
        for c in text:
            run = run + 1 if unicodedata.combining(c) else 0
            best = max(best, run)
        longest.append(best)
        return text
    monkeypatch.setattr(evaluate.unicodedata, "normalize", spy)
    episodes = [SimpleNamespace(spec=SimpleNamespace(seed=s, hint=None)) for s in play_seeds(0, 2)]
    played = SimpleNamespace(code=MARKS_OPENING, hint="", episodes=episodes, design=1, stats={})
    evaluate.environment_stats([played], TURNS, LIMITS)
    assert played.stats["has_solution"] and longest and max(longest) == runs.MAX_MARKS
    assert not played.stats["opening_leak"]   # the digits it lists are the options, at every seed


@pytest.mark.parametrize("mark", ["\u0301", "\u0f73"], ids=["acute", "two marks in one character"])
def test_a_valid_program_whose_name_holds_a_run_of_marks_is_refused_before_the_trainer_parses_it(mark):
    """The parser NFKC-normalises a non-ASCII name, quadratic in a run of combining marks (2 x 40,000: 35 s in
    ast.parse). The sandbox compiles within its deadline what the trainer would then parse several times outside
    any: a program with a run past runs.MAX_MARKS is `too_large` for the copy check, and no parse of the trainer's
    takes it (runs.parse_python raises ValueError). U+0F73 has combining class 0 but is two marks in NFKD (a
    review's: 8,000 of them, 0.71 s a parse, quadrupling with each doubling)."""
    name = "cups" + mark * (runs.MAX_MARKS + 1)
    code = (ROOT / "examples" / "cups.py").read_text().replace("class CupsEnv", f"{name} = 1\n\n\nclass CupsEnv")
    verdict = envs.validate(code, LIMITS, max_turns=TURNS)
    assert verdict.valid, verdict          # the sandbox's compile takes it: it is Python
    (checked,) = evaluate.reject_copies([code], [verdict], [[envs.example_program()]], TURNS, LIMITS)
    assert (checked.valid, checked.reason) == (False, "too_large") and "combining marks" in checked.detail
    with pytest.raises(ValueError):
        runs.parse_python(code)
    assert evaluate.bounded_tree(code.replace(name, name[:-1])) != "too_large"   # at the bound it parses


if __name__ == "__main__":   # the false-positive count of departure 32: honest games at 10 seed sets each
    caught = {}
    for path in HONEST + sorted((ROOT / "bench" / "results" / "learning_run" / "envs").glob("*/*.py"))[:4]:
        for k in range(10):
            finding = evaluate.play_guard(path.read_text(), "", play_seeds(100 + k), TURNS, LIMITS)
            caught[(path.name, k)] = finding
            print(path.name, k, finding or "-", flush=True)
    print(f"caught {sum(map(bool, caught.values()))} of {len(caught)} honest (game, seed set) pairs")


# -----------------------------------------------------------------------------------------------------------
# the structural copy check alone against examples/cups.py (departure 25; structure and behaviour: test_copies.py)

CUP_COPIES = sorted((ROOT / "tests" / "copies").glob("cupcopy_*.py"))      # the same game, reshaped
CUP_VARIANTS = sorted((ROOT / "tests" / "copies").glob("cupvariant_*.py"))  # other games made from cups


def test_the_copies_of_cups_are_the_same_game_and_the_variants_are_not():
    """Each copy gives the same return and turns as cups for 5 action sequences of three picks at 4 seeds;
    each variant differs from cups on at least one (or plays actions cups refuses)."""
    import itertools
    import cli
    cups = (ROOT / "examples" / "cups.py").read_text()
    scripts = [[f"\\boxed{{{c}}}" for c in picks] for picks in itertools.product("123", repeat=3)][::6]

    def outcomes(code):
        return [(r["return"], r["turns"]) for seed in range(4) for actions in scripts
                for r in [cli.play_scripted(code, actions, seed, 3, LIMITS)]]
    reference = outcomes(cups)
    assert all(outcomes(p.read_text()) == reference for p in CUP_COPIES)
    assert sum(outcomes(p.read_text()) != reference for p in CUP_VARIANTS) >= 6


def test_the_copy_checks_error_rates_on_cups_are_those_the_docs_state():
    """Structure alone, against cups as the reference: 7 of 8 reshaped copies accepted (false accepts), 6 of 8
    honest variants rejected (false rejects), bench/heldout/hilo.py 0.857 (accepted)."""
    cups = (ROOT / "examples" / "cups.py").read_text()
    score = {p.stem: evaluate.copy_similarity(p.read_text(), [cups]) for p in CUP_COPIES + CUP_VARIANTS}
    accepted = [p.stem for p in CUP_COPIES if score[p.stem] < evaluate.COPY_SIMILARITY]
    rejected = [p.stem for p in CUP_VARIANTS if score[p.stem] >= evaluate.COPY_SIMILARITY]
    assert (len(accepted), len(rejected)) == (7, 6), (accepted, rejected, score)
    assert round(evaluate.copy_similarity((ROOT / "bench" / "heldout" / "hilo.py").read_text(), [cups]), 3) == 0.857

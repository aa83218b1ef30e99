"""The copy check (evaluate.copy_of, docs/details.md departure 25): its test data, and its error rates measured.

tests/copies/ holds, for every example game of examples/, copies (`copy_*.py` of pair_sum, `<game>copy_*.py`:
the same game written otherwise) and honest games (`new_*.py`, and `<game>variant_*.py`: a rule of the game
changed). play_side_by_side plays a program and its original at the same seeds with the same actions, in the
sandbox: every copy gives the same rewards and flags at every step of 200 episodes, every variant does not (two
differ only in what they show). The rate tests pin what each check decides about each program, compared with every
example game but itself: the structural check alone, then structure and behaviour together.
"""
import random
import re
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import envs  # noqa: E402
import evaluate  # noqa: E402
from sandbox import Limits  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "copies"
LIMITS = Limits()
TURNS = 12
EXAMPLES = {p.stem: p.read_text() for p in sorted((ROOT / "examples").glob("*.py"))}
ORIGIN = {"": "pair_sum", "cup": "cups", "doors": "doors", "guess": "guess", "sequence": "sequence", "walk": "walk"}
COPIES = sorted(p for p in DATA.glob("*.py") if re.match(r"[a-z]*copy_", p.stem))
VARIANTS = sorted(p for p in DATA.glob("*.py") if re.match(r"[a-z]+variant_", p.stem))
HONEST = (sorted((ROOT / "examples").glob("*.py")) + sorted((ROOT / "bench" / "heldout").glob("*.py"))
          + sorted(DATA.glob("new_*.py")) + VARIANTS)
INFO_ONLY = {"cupvariant_odd_cup_weight", "guessvariant_no_direction",   # they pay as their original, show more or less
             "cups_unlisted"}   # bench/heldout/: cups without its list, made so for bench/learning.py
OTHER_CONSTANTS = {"copy_renamed_reworded"}   # pair_sum's statements drawing 8 numbers of 5-89: a copy, another game

# where each check is wrong on this data: a copy it accepts, or an honest game it rejects
STRUCTURE_WRONG = {
    "cupcopy_conditional_expr", "cupcopy_dict_state", "cupcopy_format_renamed", "cupcopy_is_none",
    "cupcopy_reshaped_two", "cupcopy_set_idioms", "cupcopy_tuple_assign", "doorscopy_index_state",
    "doorscopy_module_helpers", "doorscopy_outcome_table", "guesscopy_bounds_tuple", "guesscopy_renamed_helpers",
    "guesscopy_state_dict", "sequencecopy_closed_form", "sequencecopy_rule_table", "walkcopy_complex_plane",
    "walkcopy_flat_cells",                                                   # 17 of 23 copies accepted
    "cupvariant_count_guess", "cupvariant_cups_cost", "cupvariant_five_cups_side", "cupvariant_mirror_cups",
    "cupvariant_moving_ball", "cupvariant_odd_cup_weight", "doorsvariant_moving_prize", "doorsvariant_reopen_loses",
    "doorsvariant_six_doors", "guessvariant_no_direction", "sequencevariant_miss_ends", "sequencevariant_three_terms",
    "walkvariant_wall_ends"}                                                 # 13 of 35 honest games rejected
BEHAVIOUR_WRONG = INFO_ONLY                                                  # 0 of 23 accepted, 3 of 35 rejected


def origin(path: Path) -> str:
    """The example game a copy or a variant is made from."""
    return ORIGIN[re.match(r"([a-z]*?)(?:copy|variant)_", path.stem).group(1)]


def references(path: Path) -> list[str]:
    """What the rates compare a program with: every example game but itself, as if its prompt showed them all."""
    return [code for name, code in EXAMPLES.items() if name != path.stem]


# ----------------------------------------------------------------------------------------------------------------
# the data: copies are the same game, variants are not

def _episode(env, seed: int, actions: list[str], turns: int) -> list[tuple]:
    """(observation, reward, terminated, truncated) of reset(seed) and each step until the episode ends."""
    out = [(envs.parse_reset(env.call("reset", seed)), 0.0, False, False)]
    for action in actions[:turns]:
        obs, reward, terminated, truncated = envs.parse_step(env.call("step", action))
        out.append((obs, round(reward, 6), terminated, truncated))
        if terminated or truncated:
            break
    return out


def _solution(env, seed: int) -> list[str]:
    envs.parse_reset(env.call("reset", seed))
    return envs.solution_actions(env.call("solution")) or []


def play_side_by_side(code: str, original: str, seeds: int = 50) -> dict:
    """Both programs, one sandboxed instance each, at seeds 0..seeds-1, four episodes a seed with the same actions:
    the original's solution(), the program's own, a random sequence of actions one turn past the turn cap, and a
    shorter random sequence followed by the original's solution. The random actions are drawn from the original's
    solutions at 20 other seeds, each action also spaced, lower- and upper-cased and unboxed, each solution also
    said in one turn, and made-up actions.
    Returns {"episodes", "outcomes" (episodes whose rewards or flags differ at some step), "observations"
    (episodes whose observation texts differ)}."""
    found = {"episodes": 0, "outcomes": 0, "observations": 0}
    with envs.open_env(original, TURNS, LIMITS) as a, envs.open_env(code, TURNS, LIMITS) as b:
        turns = a.max_turns
        if b.max_turns != turns:
            return {"episodes": 0, "outcomes": 1, "observations": 1}
        pool, solved = evaluate.made_up_actions(0), [_solution(a, s) for s in range(1000, 1020)]
        for inner in (action[len("\\boxed{"):-1] for answer in solved for action in answer):
            pool += [f"\\boxed{{{inner}}}", f"\\boxed{{ {inner} }}", f"\\boxed{{{inner.lower()}}}",
                     f"\\boxed{{{inner.upper()}}}", inner]
        pool += ["\\boxed{" + " ".join(x[len("\\boxed{"):-1] for x in answer) + "}" for answer in solved]
        for seed in range(seeds):
            rng, answer = random.Random(seed), _solution(a, seed)
            for actions in (answer, _solution(b, seed), rng.choices(pool, k=turns + 1),
                            rng.choices(pool, k=rng.randrange(turns)) + answer):
                ours, theirs = _episode(a, seed, actions, turns), _episode(b, seed, actions, turns)
                found["episodes"] += 1
                found["outcomes"] += [x[1:] for x in ours] != [x[1:] for x in theirs]
                found["observations"] += [x[0] for x in ours] != [x[0] for x in theirs]
    return found


@pytest.mark.parametrize("path", COPIES, ids=lambda p: p.stem)
def test_each_copy_is_the_same_game_as_its_original(path):
    """All but OTHER_CONSTANTS, which is the same program with other constants (a copy by its statements)."""
    found = play_side_by_side(path.read_text(), EXAMPLES[origin(path)])
    assert found["episodes"] >= 200 and (found["outcomes"] > 0) == (path.stem in OTHER_CONSTANTS), found


@pytest.mark.parametrize("path", VARIANTS, ids=lambda p: p.stem)
def test_each_variant_is_another_game_than_its_original(path):
    """Its rewards or flags differ somewhere; the two INFO_ONLY variants pay exactly as their original and differ
    in what they show (the weighing, no higher or lower): no reward-based check can tell them from a copy."""
    found = play_side_by_side(path.read_text(), EXAMPLES[origin(path)])
    if path.stem in INFO_ONLY:
        assert found["outcomes"] == 0 and found["observations"] > 0, found
    else:
        assert found["outcomes"] > 0, found


def test_every_example_game_has_copies_and_variants():
    assert {origin(p) for p in COPIES} == set(EXAMPLES)
    assert {origin(p) for p in VARIANTS} == set(EXAMPLES) - {"pair_sum"}   # pair_sum's: tests/copies/new_*.py
    assert len(COPIES) == 23 and len(HONEST) == 35


# ----------------------------------------------------------------------------------------------------------------
# what the behavioural comparison adds

def test_a_reshaped_copy_that_holds_half_the_statements_is_a_copy_by_its_behaviour():
    cups, code = EXAMPLES["cups"], (DATA / "cupcopy_dict_state.py").read_text()
    assert evaluate.copy_similarity(code, [cups]) < 0.5
    assert "plays as" in evaluate.copy_of(code, [cups], TURNS, LIMITS)


def test_a_game_that_holds_every_statement_and_adds_a_rule_is_not_a_copy():
    """Six doors and a side clue: every statement of doors (1.0), but another game."""
    doors, code = EXAMPLES["doors"], (DATA / "doorsvariant_six_doors.py").read_text()
    assert evaluate.copy_similarity(code, [doors]) == 1.0
    assert evaluate.same_behaviour(code, doors, TURNS, LIMITS) is False
    assert evaluate.copy_of(code, [doors], TURNS, LIMITS) == ""


def test_the_same_statements_with_other_constants_are_a_copy_without_play(monkeypatch):
    """pair_sum renamed, reworded and drawing 8 numbers from 5-89: it plays otherwise, but only literals differ."""
    code = (DATA / "copy_renamed_reworded.py").read_text()
    monkeypatch.setattr(evaluate, "same_behaviour", lambda *a: pytest.fail("played"))
    assert "the same statements" in evaluate.copy_of(code, [EXAMPLES["pair_sum"]], TURNS, LIMITS)


def test_a_reference_that_does_not_run_leaves_the_verdict_to_structure():
    """A memory example is cut at MEMORY_CODE_CHARS and cannot run: a copy holding all of it is still a copy."""
    code, cut = (DATA / "copy_with_history.py").read_text(), EXAMPLES["pair_sum"][:1000]
    assert evaluate.same_behaviour(code, cut, TURNS, LIMITS) is None
    assert evaluate.copy_of(code, [cut], TURNS, LIMITS)


def test_the_solution_said_in_one_turn_tells_one_move_a_turn_from_several():
    walk, code = EXAMPLES["walk"], (DATA / "walkvariant_one_move.py").read_text()
    assert evaluate.same_behaviour(code, walk, TURNS, LIMITS) is False


def test_another_turn_cap_is_another_behaviour():
    """Where neither program ends its episodes itself, only the turn cap the runner reads tells them apart."""
    endless = EXAMPLES["cups"].replace("truncated = self.turn_count >= self.max_turns", "truncated = False")
    assert evaluate.same_behaviour(endless, endless, TURNS, LIMITS) is True
    assert evaluate.same_behaviour(endless.replace("max_turns=12", "max_turns=8"), endless, TURNS, LIMITS) is False


@pytest.mark.parametrize("trap", ["raise ValueError('no')", "while True: pass"], ids=["raises", "hangs"])
def test_a_program_that_fails_under_play_is_no_match_and_the_check_returns(trap):
    """A reshaped copy of cups that fails on a made-up action: no behaviour to compare (None), so not a copy at
    0.46 of cups' statements; the check neither raises nor waits past the sandbox's call timeout."""
    cups = EXAMPLES["cups"]
    step = "    def step(self, action):\n"
    code = (DATA / "cupcopy_dict_state.py").read_text().replace(step, f"{step}        if 'let me' in action:\n"
                                                                      f"            {trap}\n")
    assert envs.validate(code, LIMITS).valid
    t0 = time.time()
    assert evaluate.same_behaviour(code, cups, TURNS, Limits(call_timeout=1.0)) is None
    assert evaluate.copy_of(code, [cups], TURNS, Limits(call_timeout=1.0)) == ""
    assert time.time() - t0 < 10.0


def test_the_tool_use_setting_compares_structure_only(monkeypatch):
    monkeypatch.setattr(evaluate, "same_behaviour", lambda *a: pytest.fail("played"))
    example = envs.example_program("tool_use")
    assert evaluate.copy_of(example + "\nEXTRA = 1\n", [example], TURNS, LIMITS, "tool_use")
    assert evaluate.copy_of((DATA / "cupcopy_dict_state.py").read_text(), [EXAMPLES["cups"]], TURNS, LIMITS,
                            "tool_use") == ""


# ----------------------------------------------------------------------------------------------------------------
# the error rates of docs/details.md, departure 25: each program's verdict, then the counts

@pytest.mark.parametrize("path", COPIES + HONEST, ids=lambda p: p.stem)
def test_the_structural_check_alone_is_wrong_where_the_docs_say(path):
    says_copy = evaluate.copy_similarity(path.read_text(), references(path)) >= evaluate.COPY_SIMILARITY
    assert (says_copy != (path in COPIES)) == (path.stem in STRUCTURE_WRONG)


@pytest.mark.parametrize("path", COPIES + HONEST, ids=lambda p: p.stem)
def test_structure_and_behaviour_are_wrong_where_the_docs_say(path):
    says_copy = bool(evaluate.copy_of(path.read_text(), references(path), TURNS, LIMITS))
    assert (says_copy != (path in COPIES)) == (path.stem in BEHAVIOUR_WRONG)


def test_the_error_rates_are_those_the_docs_state():
    """(copies accepted, of, honest games rejected, of): structure alone 17 of 23 and 13 of 35; with behaviour 0 of
    23 and 3 of 35. bench/heldout/hilo.py holds 0.857 of cups' statements and plays otherwise: accepted by both."""
    def rates(wrong):
        return (sum(p.stem in wrong for p in COPIES), len(COPIES), sum(p.stem in wrong for p in HONEST), len(HONEST))
    assert rates(STRUCTURE_WRONG) == (17, 23, 13, 35)
    assert rates(BEHAVIOUR_WRONG) == (0, 23, 3, 35)
    docs = (ROOT / "docs" / "details.md").read_text()   # departure 25's table says the same
    for check, wrong in (("structure alone", STRUCTURE_WRONG), ("structure + behaviour", BEHAVIOUR_WRONG)):
        row = next(line for line in docs.splitlines() if line.strip().startswith(f"| {check} |"))
        stated = [tuple(map(int, m)) for m in re.findall(r"(\d+) of (\d+)", row)]
        assert [tuple(rates(wrong)[:2]), tuple(rates(wrong)[2:])] == stated, row
    hilo = (ROOT / "bench" / "heldout" / "hilo.py").read_text()
    assert round(evaluate.copy_similarity(hilo, [EXAMPLES["cups"]]), 3) == 0.857
    assert evaluate.same_behaviour(hilo, EXAMPLES["cups"], TURNS, LIMITS) is False


def prose_solution(code: str) -> str:
    """The game with a solution() that returns a sentence, as the official contract allows."""
    head, _ = code.split("    def solution(self)", 1)
    return head + '    def solution(self):\n        return "Read what each turn says and decide."\n'


def test_two_games_whose_solutions_are_sentences_are_not_each_others_copies():
    """With no boxed solution to replay, every probe is an action neither game rewards: both pay 0 and run to the
    turn cap, which used to read as the same behaviour (doors and guess were copies of cups). No step that paid or
    ended a game: no behaviour to compare, structure decides."""
    cups, doors, guess = (prose_solution(EXAMPLES[name]) for name in ("cups", "doors", "guess"))
    for code, reference in ((doors, cups), (guess, cups), (guess, doors)):
        assert envs.validate(code, LIMITS, max_turns=3).valid
        assert evaluate.same_behaviour(code, reference, 3, LIMITS) is None
        assert evaluate.copy_of(code, [reference], 3, LIMITS) == ""
    assert evaluate.copy_of(cups, [cups], 3, LIMITS)   # the same statements are still a copy


if __name__ == "__main__":   # the table behind departure 25's rates, and the check's cost per program
    wrong = {"structure": [0, 0], "structure + behaviour": [0, 0]}
    for path in COPIES + HONEST:
        code, is_copy = path.read_text(), path in COPIES
        t0 = time.time()
        verdicts = {"structure": evaluate.copy_similarity(code, references(path)) >= evaluate.COPY_SIMILARITY,
                    "structure + behaviour": bool(evaluate.copy_of(code, references(path), TURNS, LIMITS))}
        for check, says_copy in verdicts.items():
            wrong[check][0 if is_copy else 1] += says_copy != is_copy
        print(f"{path.stem:32} {'copy' if is_copy else 'honest':6} structure {verdicts['structure']!s:5} "
              f"with behaviour {verdicts['structure + behaviour']!s:5} {time.time() - t0:.2f} s", flush=True)
    for check, (accepted, rejected) in wrong.items():
        print(f"{check}: {accepted} of {len(COPIES)} copies accepted, {rejected} of {len(HONEST)} honest rejected")
    programs = COPIES + HONEST
    t0 = time.time()
    evaluate.reject_copies([p.read_text() for p in programs], [envs.Verdict(True, "ok", "X")] * len(programs),
                           [[envs.example_program()]] * len(programs), TURNS, LIMITS)
    print(f"reject_copies against the in-context example only: {(time.time() - t0) / len(programs):.2f} s a program")

"""The copy check (docs/details.md departure 25): its test data.

tests/copies/ holds, for every example game of examples/, copies (`copy_*.py` of pair_sum, `<game>copy_*.py`:
the same game written otherwise) and honest games (`new_*.py`, and `<game>variant_*.py`: a rule of the game
changed). play_side_by_side plays a program and its original at the same seeds with the same actions, in the
sandbox: every copy gives the same rewards and flags at every step of 200 episodes, every variant does not (two
differ only in what they show).
"""
import random
import re
import sys
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
INFO_ONLY = {"cupvariant_odd_cup_weight", "guessvariant_no_direction"}   # they pay as their original, show more or less
OTHER_CONSTANTS = {"copy_renamed_reworded"}   # pair_sum's statements drawing 8 numbers from 5-89: a copy that plays otherwise


def origin(path: Path) -> str:
    """The example game a copy or a variant is made from."""
    return ORIGIN[re.match(r"([a-z]*?)(?:copy|variant)_", path.stem).group(1)]


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
    assert len(COPIES) == 23 and len(HONEST) == 34

"""Validation against games that are not fair and contract breaks it used to miss: each hostile source below
passed `validate` when it checked at the constant seeds 42 and 123. Each is now rejected with a reason, or earns
no designer reward under the default variant (measured with `spade-mini score` on scripted plays). Then the copy
check, on copies of the prompt's example and new games (tests/copies/).

The scripted agent (measure): without the hint it plays probe-like actions; with the hint it plays what a hint
that reads the source can state, solution()'s actions at seed 0 (a hint is written once, before the play seeds
exist). `python tests/test_validation.py` prints the table of docs/details.md (departure 29).
"""
import functools
import json
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run as a script: the worktree's modules
import cli  # noqa: E402
import envs  # noqa: E402
import regret  # noqa: E402
import sandbox  # noqa: E402
from sandbox import Limits  # noqa: E402

LIMITS = Limits(call_timeout=2.0)
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PLAYS, HINTED, TURNS = 16, 4, 2   # the tiny preset's P, H and turn cap

# winnable only at the old validation seeds: solution() wins at 42 and 123, nothing wins in play
SEED_GATED = r'''
import random, re

class VaultEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.seed, self.turn_count = seed, 0
        self.code = random.Random(seed).randint(1, 100)
        return "Open the vault: its code is a number 1-100. Answer like \\boxed{50}.", {}

    def step(self, action):
        self.turn_count += 1
        found = re.search(r"\\boxed\{(\d+)\}", action)
        won = self.seed in (42, 123) and found is not None and int(found.group(1)) == self.code
        return ("Open!" if won else "Still locked."), float(won), won, self.turn_count >= self.max_turns, {}

    def solution(self):
        return f"\\boxed{{{self.code}}}"
'''

# any first action wins, except at seed 42, where the old `trivial` check looked
TRIVIAL_BUT_42 = r'''
class EchoEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.seed, self.turn_count = seed, 0
        return "Say the password in \\boxed{}.", {}

    def step(self, action):
        self.turn_count += 1
        won = self.seed != 42 or action == "\\boxed{open sesame}"
        return ("Welcome." if won else "No."), float(won), won, self.turn_count >= self.max_turns, {}

    def solution(self):
        return "\\boxed{open sesame}"
'''

# solution() is a description and the exit can never be reached (the wall check is off by one)
DESCRIBED_MAZE = r'''
import random, re

class MazeEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.pos, self.exit, self.turn_count = 0, random.Random(seed).randint(3, 6), 0
        return f"You are at 0 of a corridor; the exit is at {self.exit}. Move with \\boxed{{right}}.", {}

    def step(self, action):
        self.turn_count += 1
        if "right" in action and self.pos + 1 < self.exit:
            self.pos += 1
        won = self.pos == self.exit
        return f"You are at {self.pos}.", float(won), won, self.turn_count >= self.max_turns, {}

    def solution(self):
        return "Walk right until you reach the exit."
'''

# solution() lists steps in words; the answer check contradicts itself
DESCRIBED_STEPS = r'''
import random, re

class ThermoEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.t, self.turn_count = random.Random(seed).randint(20, 90), 0
        return "A cup of water cools. Measure it with \\boxed{measure}, then give its temperature.", {}

    def step(self, action):
        self.turn_count += 1
        if "measure" in action:
            return f"The thermometer shows {self.t} C.", 0.0, False, self.turn_count >= self.max_turns, {}
        found = re.search(r"\\boxed\{(\d+)\}", action)
        won = found is not None and self.t < int(found.group(1)) < self.t
        return ("Right." if won else "Wrong."), float(won), won, self.turn_count >= self.max_turns, {}

    def solution(self):
        return ["measure the water", "then answer the temperature shown"]
'''

# the answer is a constant of the source: a hint that reads it wins every play
CONSTANT_ANSWER = r'''
import random, re

class LockEnv:
    COMBINATION = 7391

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.colour, self.turn_count = random.Random(seed).choice(["red", "blue", "green"]), 0
        return f"A {self.colour} lock with a 4-digit combination. Answer like \\boxed{{1234}}.", {}

    def step(self, action):
        self.turn_count += 1
        won = action.strip() == f"\\boxed{{{self.COMBINATION}}}"
        return ("Click." if won else "Locked."), float(won), won, self.turn_count >= self.max_turns, {}

    def solution(self):
        return f"\\boxed{{{self.COMBINATION}}}"
'''

# the seed decides, at the second call, whatever is called
LOTTERY = r'''
import random

class CoinEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.lucky, self.turn_count = random.Random(seed).random() < 0.5, 0
        return "Call the coin twice: \\boxed{heads} or \\boxed{tails}.", {}

    def step(self, action):
        self.turn_count += 1
        if self.turn_count < 2:
            return "Once more.", 0.0, False, False, {}
        return ("You win." if self.lucky else "You lose."), float(self.lucky), True, False, {}

    def solution(self):
        return "Call anything; luck decides."
'''
LOTTERY_SOLVED = LOTTERY.replace('"Call anything; luck decides."', '"\\\\boxed{heads} \\\\boxed{heads}"')

HOSTILE = {"seed_gated": SEED_GATED, "trivial_but_42": TRIVIAL_BUT_42, "described_maze": DESCRIBED_MAZE,
           "described_steps": DESCRIBED_STEPS, "constant_answer": CONSTANT_ANSWER, "lottery": LOTTERY}
# the verdict with the fair-game guard (the default) and without it (--no-fair-games)
# (a solution() that is a description: the guard stands aside, as the official contract accepts it; then the play
# guard, evaluate.play_guard, catches what pays: here the lottery)
EXPECTED = {"seed_gated": ("unsolvable", "unsolvable"), "trivial_but_42": ("trivial", "trivial"),
            "described_maze": ("ok", "ok"), "described_steps": ("ok", "ok"),
            "constant_answer": ("fixed_answer", "ok"), "lottery": ("ok", "ok")}

# hidden state from the module-level random (no observation shows it; the sandbox seeds it), and prints
GLOBAL_RANDOM = r'''
import random, re

class HiddenEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.secret, self.turn_count = random.randint(1, 10 ** 6), 0
        return "Guess my number, 1 to 1,000,000: \\boxed{500000}. I say higher or lower.", {}

    def step(self, action):
        self.turn_count += 1
        found = re.search(r"\\boxed\{(\d+)\}", action)
        guess = int(found.group(1)) if found else 0
        if guess == self.secret:
            return "Right!", 1.0, True, False, {}
        return ("Higher." if guess < self.secret else "Lower."), 0.0, False, self.turn_count >= self.max_turns, {}

    def solution(self):
        return f"\\boxed{{{self.secret}}}"
'''
PRINTING = (EXAMPLES / "guess.py").read_text().replace("    def step(self, action):\n",
                                                       "    def step(self, action):\n        print('step', action)\n")


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_unfair_game_is_rejected_with_its_reason_or_earns_nothing(name):
    guarded, unguarded = (envs.validate(HOSTILE[name], LIMITS, fair_games=on) for on in (True, False))
    assert (guarded.reason, unguarded.reason) == EXPECTED[name], (guarded.detail, unguarded.detail)
    if unguarded.valid:   # accepted without the guard: what the official method pays it
        assert measure(HOSTILE[name], "regret")["designer_reward"] == 0.0 or name == "constant_answer"
    if guarded.valid:     # accepted: the play guard zeroes the reward of what would be paid (departure 32)
        import evaluate
        caught = evaluate.play_guard(HOSTILE[name], "", [envs.derive_seed(0, 0, "env", i) for i in range(PLAYS)],
                                     TURNS, LIMITS)
        assert bool(caught) == (name == "lottery"), caught


def test_the_constant_answer_and_the_lottery_are_paid_without_the_guard():
    """What the guard is for: under the default `regret` a source-reading hint makes the constant answer worth a
    full regret of 1.0, and the lottery earns by the chance difference of its 4 hinted seeds."""
    assert measure(CONSTANT_ANSWER, "regret")["designer_reward"] == 1.0
    assert measure(LOTTERY, "solve_rate")["designer_reward"] > 0.5


def test_a_lottery_with_a_replayable_solution_is_rejected_at_every_validation_seed():
    """A designer that adds solution() to its lottery: unlucky at a drawn seed, its solution() loses there
    (`unsolvable`); lucky at both (validation seed 4), the probes win as well as solution() (`trivial`)."""
    reasons = {seed: envs.validate(LOTTERY_SOLVED, LIMITS, seed=seed) for seed in range(6)}
    assert {v.reason for v in reasons.values()} == {"unsolvable", "trivial"}
    assert reasons[4].reason == "trivial" and "the seed decides" in reasons[4].detail, reasons[4]


@pytest.mark.parametrize("name", ["seed_gated", "trivial_but_42"])
def test_the_validation_seeds_are_drawn_from_the_validation_seed_and_reproducible(name):
    """Over 8 validation seeds none is 42 or 123; at another validation seed than the default the games gated on
    42 and 123 are still caught (validate plays the seeds drawn from it), and the same seed gives the same verdict."""
    seeds = [s for k in range(8) for s in envs.validation_seeds(k)]
    assert not {42, 123} & set(seeds) and len(set(seeds)) == 16
    first = envs.validate(HOSTILE[name], LIMITS, seed=5)
    assert first.reason == EXPECTED[name][0] and first == envs.validate(HOSTILE[name], LIMITS, seed=5)


def test_the_loop_validates_each_designed_program_at_a_validation_seed_of_its_own(monkeypatch):
    """train.design draws one validation seed per (slot, attempt), like every other seed of the run, and passes
    --fair-games on."""
    from types import SimpleNamespace
    import models
    import runs
    import spade_mini
    import train
    seen = []
    monkeypatch.setattr(envs, "validate_many", lambda codes, limits, turns, setting, seeds, fair: seen.append(
        (seeds, fair)) or [envs.Verdict(False, "no_code", None)] * len(codes))
    monkeypatch.setattr(models, "chat_ids", lambda tok, text, thinking=False: [1])
    monkeypatch.setattr(models, "generate", lambda model, tok, prompts, **kw: [
        models.Completion(p, [3], "no code", True) for p in prompts])
    monkeypatch.setattr(spade_mini, "sampled_logprobs", lambda model, rows, **kw: [])
    st = SimpleNamespace(cfg=runs.Config(envs_per_step=2, design_attempts=2, seed=3), corpus=["a doc"],
                         memory=envs.Memory("/nonexistent/m.json"), tok=SimpleNamespace(pad_token_id=0), model=None)
    train.design(st, 5, ["Optimization"])
    drawn = [envs.derive_seed(3, 5, "validate", index) for index in range(4)]   # index = slot * attempts + attempt
    assert seen == [([drawn[0], drawn[2]], True), ([drawn[1], drawn[3]], True)]


def test_a_lucky_first_probe_is_not_trivial():
    """Cups (3 cups) stays valid at the validation seeds where its first probe, cup 1, wins: at drawn seeds the old
    rule (the first probe must not win) would refuse a game of k answers 1 time in k."""
    cups = (EXAMPLES / "cups.py").read_text()
    lucky = [seed for seed in range(12) if cli.play_scripted(cups, ["\\boxed{1}"], envs.validation_seeds(seed)[0],
                                                             TURNS, LIMITS)["return"] == 1.0]
    assert lucky and all(envs.validate(cups, LIMITS, max_turns=TURNS, seed=seed).valid for seed in lucky)


def test_the_examples_pass_the_guard_at_many_validation_seeds():
    """No false rejection of the hand-written games (cups has 3 answers) at 5 validation seeds each."""
    for path in sorted(EXAMPLES.glob("*.py")):
        for seed in range(5):
            verdict = envs.validate(path.read_text(), LIMITS, max_turns=TURNS, seed=seed)
            assert verdict.valid and verdict.checks["fair_game"], (path.name, seed, verdict)


def test_hidden_state_from_an_unseeded_generator_is_nondeterministic():
    """The probes see only 'Higher.' in every process; the actions of solution() replayed in another process do not
    match (its secret differs), so comparing every observation and reward of that replay catches it."""
    verdict = envs.validate(GLOBAL_RANDOM.replace("random.randint(", "random.Random().randint("), LIMITS)
    assert verdict.reason == "nondeterministic" and "the actions of solution()" in verdict.detail, verdict


def test_the_module_level_random_repeats_by_reset_seed():
    """random.randint in reset (the slip Qwen2.5-Coder-1.5B made in 2 of 6 programs) draws from the module-level
    generator, which the sandbox restarts from reset's seed (and from 0 before the module runs): valid, and the
    same seed gives the same secret in any process."""
    verdict = envs.validate(GLOBAL_RANDOM, LIMITS)
    assert verdict.valid and verdict.checks["deterministic"], verdict
    secrets = []
    for _ in range(2):
        with sandbox.EnvProcess(GLOBAL_RANDOM.replace("return \"Guess", "return str(self.secret) + \"Guess"),
                                limits=LIMITS) as env:
            secrets.append([env.call("reset", seed)[0].split("Guess")[0] for seed in (7, 8, 7)])
    assert secrets[0] == secrets[1] and secrets[0][0] == secrets[0][2] != secrets[0][1], secrets


def test_a_program_that_prints_is_valid_and_its_verdict_says_the_prints_are_dropped():
    verdict = envs.validate(PRINTING, LIMITS)
    assert verdict.valid and "print()" in verdict.detail and "dropped" in verdict.detail, verdict
    assert envs.validate((EXAMPLES / "guess.py").read_text(), LIMITS).detail == ""


# ----------------------------------------------------------------------------------------------------------
# measuring a game's designer reward with `spade-mini score` on scripted plays

@functools.cache
def plays(code: str) -> tuple[list[float], list[float]]:
    """(unhinted returns, hinted returns) of the scripted agent at the loop's play seeds (train.play_all, step 0)."""
    seeds = [envs.derive_seed(0, 0, "env", i) for i in range(PLAYS)]
    with envs.open_env(code, TURNS, LIMITS) as env:
        env.call("reset", 0)
        raw = env.call("solution") if "def solution" in code else None
    told = envs.solution_actions(raw) if raw is not None else None
    blind = ["\\boxed{1}", "\\boxed{heads}"]
    play = lambda actions, seed: cli.play_scripted(code, actions, seed, TURNS, LIMITS)["return"]  # noqa: E731
    return [play(blind, s) for s in seeds], [play(told or blind, s) for s in seeds[:HINTED]]


def measure(code: str, variant: str) -> dict:
    """The game's row of `spade-mini score` for a window of one step where it shares its skill with an honest game
    (examples/guess.py, played by the same agent): reward and advantage."""
    rows = []
    for game in (code, (EXAMPLES / "guess.py").read_text()):
        unhinted, hinted = plays(game)
        rows.append({"skill": "Logical Deduction", "hung": False, "hinted": hinted, "unhinted": [unhinted]})
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "window.json"
        path.write_text(json.dumps({"variant": variant, "window": 1, "mu_slow": {}, "envs": rows}))
        return _score(path)["envs"][0]


def _score(path: Path) -> dict:
    import contextlib
    import io
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert cli.main(["score", str(path)]) == 0
    return json.loads(buffer.getvalue().strip().splitlines()[-1])


if __name__ == "__main__":   # the table of docs/details.md, departure 29
    print("case | guard on | guard off | " + " | ".join(regret.DESIGNER_REWARDS[:3]) + " | regret_based | adv (regret)")
    for name, code in HOSTILE.items():
        on, off = (envs.validate(code, LIMITS, fair_games=g).reason for g in (True, False))
        rows = {v: measure(code, v) for v in ("regret", "blend", "solve_rate", "regret_based")}
        print(f"{name} | {on} | {off} | " + " | ".join(f"{rows[v]['designer_reward']:.3f}" for v in rows)
              + f" | {rows['regret']['designer_advantage']:+.2f}")


# ----------------------------------------------------------------------------------------------------------
# the copy check: structure, not spelling. tests/copies/ holds copies of the prompt's example
# made to evade a token comparison (copy_*.py) and new games built on the contract's skeleton (new_*.py)

COPIES_DIR = Path(__file__).resolve().parent / "copies"
COPIES = sorted(COPIES_DIR.glob("copy_*.py"))
# bench/heldout/hilo.py is left out: it is cups.py's program with the game changed in a few statements (higher or
# lower instead of empty), which the structural check counts as a copy of cups (0.96); it was written as such, a
# held-out game for bench/learning.py, not a designed one
NEW_GAMES = (sorted(COPIES_DIR.glob("new_*.py"))
             + [p for p in sorted((EXAMPLES.parent / "bench" / "heldout").glob("*.py")) if p.name != "hilo.py"]
             + [p for p in sorted(EXAMPLES.glob("*.py")) if p.name != "pair_sum.py"])   # pair_sum.py: the example


@pytest.mark.parametrize("path", COPIES, ids=lambda p: p.stem)
def test_a_renamed_reworded_or_reordered_copy_of_the_example_is_a_copy(path):
    """Renaming seven locals scored 0.769 under the old token 3-gram cosine and passed; every copy here scores 1."""
    import evaluate
    example = envs.example_program()
    assert evaluate.copy_similarity(path.read_text(), [example]) == 1.0
    assert evaluate.copy_similarity(path.read_text(), [example[:1000]]) == 1.0   # a memory example is cut
    (verdict,) = evaluate.reject_copies([path.read_text()], [envs.Verdict(True, "ok", "XEnv")], [[example]])
    assert verdict.reason == "copy"


def test_new_games_on_the_contracts_skeleton_are_not_copies():
    """The example with sum swapped for product (0.931 under the old check: rejected) and 11 other games in the
    same style stay below COPY_SIMILARITY against the example and against each other (as memory examples)."""
    import evaluate
    codes = {p.stem: p.read_text() for p in NEW_GAMES}
    against_example = {name: evaluate.copy_similarity(code, [envs.example_program()]) for name, code in codes.items()}
    assert max(against_example.values()) < evaluate.COPY_SIMILARITY, against_example
    assert 0.85 < against_example["new_product"] < evaluate.COPY_SIMILARITY
    for name, code in codes.items():
        others = [other for key, other in codes.items() if key != name]
        assert evaluate.copy_similarity(code, others) < evaluate.COPY_SIMILARITY, name


def test_an_attribute_named_like_a_method_does_not_hide_the_method():
    """`self.solution = [...]` in reset beside `def solution(self)`, and a `self.step` counter beside
    `def step(self, action)`: the sandbox calls the class's methods, so the program is what it means to be."""
    code = (EXAMPLES / "guess.py").read_text()
    shadowed = code.replace("    def reset(self, seed=None):\n",
                            "    def reset(self, seed=None):\n        self.solution, self.step = None, 0\n", 1)
    assert shadowed != code
    verdict = envs.validate(shadowed, LIMITS)
    assert verdict.valid and verdict.checks["solvable"], verdict


def game(setup: str, step: str, solution: str = '"\\\\boxed{7}"') -> str:
    """A small game: reset runs `setup` (seed in scope), step returns `step` (action in scope)."""
    return (f"class SmallEnv:\n    def __init__(self, max_turns=4, **kwargs):\n        self.max_turns = max_turns\n"
            f"    def reset(self, seed=None):\n        self.n = 0\n        {setup}\n        return 'Say 7.', {{}}\n"
            f"    def step(self, action):\n        self.n += 1\n        return {step}\n"
            f"    def solution(self):\n        return {solution}\n")


SEVEN = "'...', float(self.easy or action == '\\\\boxed{7}'), self.easy or action == '\\\\boxed{7}', False, {}"
B = envs.validation_seeds(0)[1]
# (program, reason, the check that failed, checks that passed before it failed, checks never reached)
FAILED_CHECKS = {
    "trivial_at_a": (game("self.easy = True", SEVEN), "trivial", "not_trivial", ["step_types", "reward_range"],
                     ["reset_other"]),
    "trivial_at_b_only": (game(f"self.easy = seed == {B}", SEVEN), "trivial", "not_trivial",
                          ["step_types", "reward_range"], ["reset_other", "deterministic"]),
    "reward_50": (game("self.easy = False", "'...', 50.0, False, False, {}"), "reward_range", "reward_range",
                  ["step_types"], ["not_trivial"]),
    "solution_raises": (game("self.easy = False", SEVEN, "1 / 0"), "unsolvable", "solvable", ["reset_other"],
                        ["deterministic"]),
    "seed_decides_at_turn_2": (game("self.easy = False", "'...', float(self.n >= 2), self.n >= 2, False, {}",
                                    '"\\\\boxed{1} \\\\boxed{1}"'), "trivial", "fair_game", ["solvable"], []),
    # a failed call fails the check under way: reset(b) is reset_other's, a crash at the second probe step_types'
    "reset_raises_at_b": (game(f"self.easy = False\n        if seed == {B}: raise ValueError('b')", SEVEN),
                          "reset_error", "reset_other", ["reset", "step_types", "not_trivial"], ["deterministic"]),
    "crash_at_probe_2": (game("self.easy = False", "__import__('os')._exit(3) if self.n == 2 else ('...', 0.0, False, "
                              "False, {})"), "crash", "step_types", ["reset"], ["not_trivial", "reset_other"]),
    "third_reset_raises": (game("self.easy, self.resets = False, getattr(self, 'resets', 0) + 1\n        if "
                                "self.resets == 3: raise ValueError('3rd')", SEVEN), "reset_error", "deterministic", ["reset_other"], []),
}


@pytest.mark.parametrize("name", sorted(FAILED_CHECKS))
def test_the_check_that_failed_is_the_one_the_reason_names_not_the_first_left_unmarked(name):
    """A game trivial only at the second validation seed failed `not_trivial` (its probes passed at the first),
    not `reset_other`; a reward out of range fails `reward_range`, its types having passed; the fair-game guard's
    `trivial` is `fair_game`'s; solution() raising fails `solvable` with determinism never reached. A failed call
    fails the check under way: reset(b) `reset_other`, a crash at the second probe `step_types` (not the first
    check left false, `not_trivial`), a reset that fails on replay `deterministic`."""
    code, reason, failed, passed, not_reached = FAILED_CHECKS[name]
    verdict = envs.validate(code, LIMITS)
    assert (verdict.reason, verdict.failed) == (reason, failed), verdict
    assert verdict.checks[failed] is False and all(verdict.checks[c] is True for c in passed), verdict.checks
    assert all(verdict.checks[c] is False for c in not_reached), verdict.checks

"""Measuring: is the model getting better at reasoning it never trained on, and what is the designer writing?

Self-play trains only on environments the model wrote itself, so its progress must be measured elsewhere: 1 and
2, both deterministic for a given checkpoint (greedy decoding, explicit seeds); 3 describes the designer's output.

1. reasoning-gym (the paper's largest gain, +14-18): a fixed, seeded set of procedurally generated problems
   from four categories, `limit` items each. Each question is asked once in the agent's format ("put your
   final answer within \boxed{}"); the answer is the first boxed content, scored by reasoning-gym's own
   `score_answer` (1 = correct; some generators give partial credit; no boxed answer = 0). The overall score
   is the mean of the category means, so every category weighs the same. reasoning-gym generates offline;
   item i of a dataset depends only on (seed, i), so `--limit 20` is a prefix of `--limit 50`.
2. environment pool: a folder of held-out environments (*.py) played by the agent exactly as in training
   (spade_mini.play, no hint), `plays` seeds each; win rate = share of plays with return > 0 (the memory's
   definition). Programs that fail envs.validate are skipped and listed.
3. statistics of the designer's environments, logged at a window's first step: size (lines of code), whether
   the hint or the first observation gives the solution away, and diversity (Vendi score of code n-grams).

A support module (a first read of the method may skip it). Entry points: `evaluate` and `pool_win_rate` (a
loaded model), `eval_metrics` (flat `eval/...` keys for metrics.jsonl, used by `train --eval-every K`; the
command line `spade-mini eval` is in cli.py), `environment_stats` (the `env/...` keys of a window's first step).
"""
from __future__ import annotations

import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import reasoning_gym

import envs
import models
import spade_mini
from sandbox import Limits, SandboxError

# category -> reasoning-gym generator, each with reasoning-gym 0.1.25's default configuration. Chosen because
# they generate offline in milliseconds and have short answers that fit in \boxed{} (propositional_logic and
# rush_hour fail to generate in 0.1.25; tower_of_hanoi's answers run to dozens of lines).
CATEGORIES = {
    "arithmetic": "basic_arithmetic",   # "Calculate ( -6 + -77 - 8 + -38 )."
    "algorithmic": "word_sorting",      # sort words by ASCII order, answer a comma-separated list
    "logic": "syllogism",               # does the conclusion follow? Yes / No
    "games": "maze",                    # minimum number of steps through an ASCII maze
}


@dataclass(frozen=True)
class Item:
    category: str
    dataset: str      # reasoning-gym generator name (its score_answer scores the item)
    index: int        # position in the seeded dataset
    entry: dict       # reasoning-gym's item: question, answer, metadata (score_answer needs all three)

    @property
    def prompt(self) -> str:
        return envs.eval_question(self.entry["question"])


# ----------------------------------------------------------------------------------------------------------------
# the item set and its scoring (no model needed)

def eval_items(limit: int, seed: int, categories: dict[str, str] = CATEGORIES) -> list[Item]:
    """`limit` items per category from reasoning-gym's generators, all seeded with `seed`; same seed, same set."""
    items = []
    for category, name in categories.items():
        data = reasoning_gym.create_dataset(name, size=limit, seed=seed)
        items += [Item(category, name, i, data[i]) for i in range(limit)]
    return items


def extract_answer(text: str) -> str | None:
    """The first \\boxed{...} content, stripped (reasoning-gym scores ' No' and 'No ' below 'No').

    >>> extract_answer("so 3 + 4 = 7, hence \\\\boxed{ 7 } and not \\\\boxed{8}")
    '7'
    >>> extract_answer("7") is None
    True
    """
    boxed = envs.first_boxed(text)
    return None if boxed is None else boxed.strip()


def score_item(item: Item, completion: str) -> float:
    """reasoning-gym's own score of the first boxed answer; no boxed answer scores 0."""
    answer = extract_answer(completion)
    if answer is None:
        return 0.0
    return float(reasoning_gym.get_score_answer_fn(item.dataset)(answer, item.entry))


def answer_tokens(agent_max_new_tokens: int) -> int:
    """Tokens per held-out answer: twice an agent turn's budget (answers have no turns to continue in), >= 128.

    >>> answer_tokens(64), answer_tokens(512)
    (128, 1024)
    """
    return max(128, 2 * agent_max_new_tokens)


def summarize(items: list[Item], scores: list[float]) -> dict:
    """Mean per category, then the unweighted mean over categories."""
    per: dict[str, list[float]] = {}
    for item, s in zip(items, scores):
        per.setdefault(item.category, []).append(s)
    categories = {c: sum(v) / len(v) for c, v in per.items()}
    return {"score": sum(categories.values()) / len(categories) if categories else 0.0, "categories": categories}


# ----------------------------------------------------------------------------------------------------------------
# with a model

def evaluate(model, tok, *, limit: int, seed: int = 0, max_new_tokens: int = 256, batch_size: int = 16,
             categories: dict[str, str] = CATEGORIES, progress: bool = False) -> dict:
    """Answer every item greedily, in batches of similar length; returns {"score", "categories", "answered"
    (share with a boxed answer), "n", "eval_s", "items" (per item: category, index, answer, expected, score,
    completion)}."""
    t0 = time.time()
    items = eval_items(limit, seed, categories)
    prompts = [models.chat_ids(tok, item.prompt) for item in items]
    # similar lengths share a batch: less left padding, and the order is fixed, so results are reproducible
    order = sorted(range(len(items)), key=lambda i: (len(prompts[i]), i))
    texts: list[str] = [""] * len(items)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        outs = models.generate(model, tok, [prompts[i] for i in chunk], max_new_tokens=max_new_tokens,
                                   temperature=0.0, top_p=1.0, top_k=0, seed=seed)  # temperature 0 = greedy
        for i, out in zip(chunk, outs):
            texts[i] = out.text
        if progress:  # stderr: with --json, stdout's last line must stay the result
            print(f"eval: {start + len(chunk)}/{len(items)} questions asked ({time.time() - t0:.0f}s)", file=sys.stderr,
                  flush=True)
    scores = [score_item(item, text) for item, text in zip(items, texts)]
    details = [{"category": it.category, "index": it.index, "answer": extract_answer(t),
                "expected": it.entry["answer"], "score": s, "completion": t} for it, t, s in zip(items, texts, scores)]
    return {**summarize(items, scores), "answered": sum(d["answer"] is not None for d in details) / len(items),
            "n": len(items), "eval_s": round(time.time() - t0, 2), "items": details}


def pool_win_rate(model, tok, folder: str | Path, *, plays: int = 4, seed: int = 0, max_turns: int = 12,
                  max_new_tokens: int = 256, max_episode_tokens: int = 2048, limits: Limits = Limits()) -> dict:
    """Play every valid environment of `folder` `plays` times without a hint (greedy; the plays differ by
    environment seed). Returns {"pool_win_rate", "pool_return", "pool_envs": {name: win rate}, "pool_skipped"}."""
    t0 = time.time()
    pool, skipped = envs.load_folder(folder, "--env-pool", limits, max_turns)
    specs = [spade_mini.EpisodeSpec(code, envs.derive_seed(seed, 0, "eval-pool", j * 1000 + i), None, (name, i))
             for j, (name, code) in enumerate(pool) for i in range(plays)]
    episodes = spade_mini.play(model, tok, specs, max_turns=max_turns, max_new_tokens=max_new_tokens,
                               max_episode_tokens=max_episode_tokens, temperature=0.0, top_p=1.0, top_k=0,
                               seed=seed, limits=limits) if specs else []
    wins: dict[str, list[float]] = {}
    for ep in episodes:
        wins.setdefault(ep.spec.key[0], []).append(float(ep.episode_return > 0))
    return {"pool_win_rate": sum(float(ep.episode_return > 0) for ep in episodes) / len(episodes) if episodes else None,
            "pool_return": sum(ep.episode_return for ep in episodes) / len(episodes) if episodes else None,
            "pool_envs": {name: sum(w) / len(w) for name, w in wins.items()}, "pool_skipped": skipped,
            "pool_s": round(time.time() - t0, 2)}


def eval_metrics(model, tok, *, limit: int, seed: int, max_new_tokens: int, env_pool: str = "",
                 pool_plays: int = 4, max_turns: int = 12, max_episode_tokens: int = 2048,
                 limits: Limits = Limits()) -> dict:
    """The held-out scores as flat metrics.jsonl keys: eval/score, eval/<category>, eval/answered and, with a
    pool, eval/pool_win_rate."""
    result = evaluate(model, tok, limit=limit, seed=seed, max_new_tokens=max_new_tokens)
    # eval/answered: share of answers in \boxed{} at all -- a small model's first gain is often the format
    out = {"eval/score": result["score"], **{f"eval/{c}": s for c, s in result["categories"].items()},
           "eval/answered": result["answered"], "perf/eval_s": result["eval_s"]}
    if env_pool:
        pool = pool_win_rate(model, tok, env_pool, plays=pool_plays, seed=seed, max_turns=max_turns,
                             max_new_tokens=max_new_tokens, max_episode_tokens=max_episode_tokens, limits=limits)
        out.update({"eval/pool_win_rate": pool["pool_win_rate"], "perf/eval_pool_s": pool["pool_s"]})
    return out


# -----------------------------------------------------------------------------------------------------------
# 3. statistics of the designer's environments: diversity, leakage, size

def vendi_score(similarity: np.ndarray) -> float:
    """Vendi score exp(-sum_i l_i log l_i), l_i = eigenvalues of K / n: the effective number of distinct items.

    K must be symmetric positive semi-definite with ones on the diagonal. Worked example,
    K = [[1, 0.5], [0.5, 1]]: K / 2 has eigenvalues 0.75 and 0.25; entropy = -(0.75 ln 0.75 + 0.25 ln 0.25)
    = 0.2158 + 0.3466 = 0.5623; exp(0.5623) = 1.7548. Identical items score 1, orthogonal ones score n.

    >>> round(vendi_score(np.array([[1.0, 0.5], [0.5, 1.0]])), 4)
    1.7548
    >>> round(vendi_score(np.ones((3, 3))), 6), round(vendi_score(np.eye(3)), 6)
    (1.0, 3.0)
    """
    k = np.asarray(similarity, dtype=np.float64)
    n = k.shape[0]
    if n == 0:
        return 0.0
    eig = np.linalg.eigvalsh(k / n)
    eig = eig[eig > 1e-12]  # subtle: round-off gives tiny negative eigenvalues; 0 log 0 = 0 anyway
    return float(math.exp(-np.sum(eig * np.log(eig))))


_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+|\S")


def code_vectors(codes: list[str], n: int = 3) -> np.ndarray:
    """Binary bag of token n-grams per program, shape (len(codes), vocabulary): the diversity representation.

    Tokens are identifiers, digit runs and single punctuation characters (a regex, so broken code works
    too); a program's vector marks which n-grams of consecutive tokens it contains. Presence rather than
    counts keeps boilerplate such as `self .` from dominating the cosine.

    >>> code_vectors(["a = 1", "a = 1", "b = 2"], n=2).sum(axis=1).tolist()
    [2.0, 2.0, 2.0]
    """
    grams = []
    for code in codes:
        toks = _TOKEN.findall(code)
        grams.append({tuple(toks[i:i + n]) for i in range(max(1, len(toks) - n + 1))} if toks else set())
    vocab = {g: i for i, g in enumerate(sorted(set().union(*grams)))} if grams else {}
    x = np.zeros((len(codes), len(vocab)), dtype=np.float32)  # 0/1 entries: float32 counts stay exact
    for row, gs in enumerate(grams):
        x[row, [vocab[g] for g in gs]] = 1.0
    return x


def diversity(codes: list[str], n: int = 3) -> float:
    """Vendi score / n of programs under the cosine kernel of code_vectors: 1/n if all identical, ~1 if unrelated.

    Worked example: two identical programs have cosine 1, K = all ones, Vendi 1, so 1 / 2 = 0.5; two with no
    shared 3-gram have K = I, Vendi 2, so 2 / 2 = 1.0. (The paper: 0.68 with corpus grounding, 0.04 without.)

    >>> diversity(["x = 1 + 2", "x = 1 + 2"]), diversity(["x = 1 + 2", "def f(): return y"])
    (0.5, 1.0)
    """
    if not codes:
        return 0.0
    x = code_vectors(codes, n)
    shared = (x @ x.T).astype(np.float64)       # (n, n) number of n-grams two programs share
    size = np.maximum(np.diag(shared), 1.0)     # an empty program is similar only to itself (diagonal below)
    k = shared / np.sqrt(np.outer(size, size))  # cosine of the 0/1 vectors
    np.fill_diagonal(k, 1.0)
    return vendi_score(k) / len(codes)


_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_VALUE = re.compile(r"-?\d+(?:\.\d+)?|[A-Za-z_]+")


def solution_keys(solution_actions: str | list[str] | None) -> set[str]:
    """The key values of a reference solution: the numbers in its boxed commands, or their words if none.

    Numbers win because commands usually pair a verb with the values that matter ("guess 37": 37 is the
    secret, "guess" is not); a solution without numbers (directions, a word answer) is keyed by its words.

    >>> sorted(solution_keys(r"\\boxed{guess 37}")), sorted(solution_keys([r"\\boxed{Up}", r"\\boxed{left}"]))
    (['37'], ['left', 'up'])
    """
    if not solution_actions:
        return set()   # the environment has no solution(): nothing can leak
    text = "\n".join([solution_actions] if isinstance(solution_actions, str) else solution_actions)
    inner = _BOXED.findall(text) or [text]
    values = [v.lower() for part in inner for v in _VALUE.findall(part)]
    numbers = {v for v in values if v[-1].isdigit()}
    return numbers or set(values)


def _contains_keys(text: str, solution_actions: str | list[str] | None) -> bool:
    keys = solution_keys(solution_actions)
    return bool(keys) and keys <= {v.lower() for v in _VALUE.findall(text)}


def hint_leak(hint: str, solution_actions: str | list[str] | None) -> bool:
    """True when the hint contains every key value of the solution as a whole token (it gives the answer away).

    >>> hint_leak("Try 37.", r"\\boxed{guess 37}"), hint_leak("Halve the range each turn.", r"\\boxed{guess 37}")
    (True, False)
    """
    return _contains_keys(hint, solution_actions)


def opening_leak(first_obs: str, solution_actions: str | list[str] | None) -> bool:
    """True when the first observation already shows every key value of the solution (the paper's "the physics
    opening prints the governing equation"). note: a heuristic; an opening that lists all moves matches too.

    >>> opening_leak("The answer is 12. Answer in \\\\boxed{}.", r"\\boxed{12}")
    True
    """
    return _contains_keys(first_obs, solution_actions)


def loc(code: str) -> int:
    """Lines of code: non-blank lines that are not only a comment.

    >>> loc("import math\\n\\n# a comment\\nx = 1  # counted\\n")
    2
    """
    return sum(1 for line in code.splitlines() if line.strip() and not line.strip().startswith("#"))


def reference_solution(code: str, seed: int, max_turns: int, limits: Limits) -> tuple[str, list[str] | None]:
    """(first observation, solution actions) of an episode from a fresh sandboxed instance; ("", None) if
    unavailable (no solution(), a goal description, or a value that is no action list)."""
    try:
        with envs.open_env(code, max_turns, limits) as env:
            return envs.parse_reset(env.call("reset", seed)), envs.solution_actions(env.call("solution"))
    except (SandboxError, envs.ContractError):
        return "", None


def answer_is_listed(code: str, seed: int, solution: list[str], max_turns: int, limits: Limits,
                     tries: int = 3) -> bool:
    """Whether the opening shows the answer's values whatever the answer is: in the first of the next `tries`
    seeds whose solution differs, the opening holds this solution's values too (a list of options such as "cup
    1, 2 or 3", or a format example, not a leak). False when every seed tried has the same solution."""
    for other_seed in range(seed + 1, seed + 1 + tries):
        other_obs, other = reference_solution(code, other_seed, max_turns, limits)
        if other and other != solution:
            return opening_leak(other_obs, solution)
    return False


def environment_stats(played: list, max_turns: int, limits: Limits) -> dict:
    """Statistics of a window's new environments (train.PlayedEnv, at the first step), each into its .stats:
    size, hint and opening leakage against its reference solution (replayed at its first play's seed; an opening
    that lists the answer among its options does not leak), and the window's diversity."""
    for e in played:
        seed = e.episodes[0].spec.seed if e.episodes else 0
        first_obs, solution = reference_solution(e.code, seed, max_turns, limits)
        e.stats = dict(loc=loc(e.code), has_solution=bool(solution),
                       hint_leak=bool(solution) and hint_leak(e.hint, solution),
                       opening_leak=bool(solution) and opening_leak(first_obs, solution)
                       and not answer_is_listed(e.code, seed, solution, max_turns, limits))
    with_solution = [e for e in played if e.stats["has_solution"]]

    def rate(key):
        return sum(e.stats[key] for e in with_solution) / len(with_solution) if with_solution else None
    return {"env/loc_mean": sum(e.stats["loc"] for e in played) / len(played) if played else None,
            "env/hint_leak_rate": rate("hint_leak"), "env/opening_leak_rate": rate("opening_leak"),
            "env/diversity": diversity([e.code for e in played]) if len(played) > 1 else None}


def memory_stats(records: list[dict]) -> dict:
    """memory/size and memory/diversity (Vendi / n of the remembered programs; None below two)."""
    codes = [r["code"] for r in records]
    return {"memory/size": len(codes), "memory/diversity": diversity(codes) if len(codes) > 1 else None}


def zero_variance_fraction(groups: list[list[float]]) -> float:
    """Share of groups whose rewards are all equal (a group of one included): they carry no gradient.

    >>> round(zero_variance_fraction([[1.0, 1.0], [0.0, 1.0], [0.5]]), 6)
    0.666667
    """
    if not groups:
        return 0.0
    flat = sum(1 for g in groups if len(g) == 0 or max(g) - min(g) <= 1e-12)
    return flat / len(groups)

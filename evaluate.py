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
4. BFCL v4 multi-turn base (`--suite bfcl`, the tool-use setting's held-out benchmark): the questions, ground
   truth, function docs and executable backends ship in the `bfcl-eval` package (installed --no-deps). Each
   item's user turns are given one at a time; the model calls tools through the chat template (greedy, at most
   `max_steps` tool replies per turn) and a turn ends at a reply without a tool call. BFCL's executor runs the
   calls with eval(), so the backends, the execution and BFCL's own `multi_turn_checker` run in a sandboxed
   child (sandbox.EnvProcess) whose program carries their source text: the trainer never imports bfcl-eval.
   Score = share of items the checker accepts. Two stand-ins, the same for the model and the ground truth: the
   `subprocess` import of the file-system backend is an empty module (the sandbox refuses the real one) and
   MathAPI's `mpmath.log` is `decimal`'s ln at `mp.dps` digits (mpmath is not readable in the sandbox).

A support module (a first read of the method may skip it). Entry points: `evaluate` and `pool_win_rate` (a
loaded model), `eval_metrics` (flat `eval/...` keys for metrics.jsonl, used by `train --eval-every K`; the
command line `spade-mini eval` is in cli.py), `environment_stats` (the `env/...` keys of a window's first step).
"""
from __future__ import annotations

import ast
import collections
import dataclasses
import math
import re
import sys
import time
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import reasoning_gym

import envs
import models
import spade_mini
from sandbox import EnvProcess, Limits, SandboxError

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
                  max_new_tokens: int = 256, max_episode_tokens: int = 2048, limits: Limits = Limits(),
                  setting: str = "games", prompt: str = "agent.txt", reply_prefix: str = "") -> dict:
    """Play every valid environment of `folder` `plays` times without a hint (greedy; the plays differ by
    environment seed), the first message from prompts/`prompt` and the replies' prefix as in training. Returns {"pool_win_rate", "pool_return", "pool_envs": {name: win rate}, "pool_skipped"}."""
    t0 = time.time()
    pool, skipped = envs.load_folder(folder, "--env-pool", limits, max_turns, setting)
    specs = [spade_mini.EpisodeSpec(code, envs.derive_seed(seed, 0, "eval-pool", j * 1000 + i), None, (name, i), prompt,
                                   reply_prefix) for j, (name, code) in enumerate(pool) for i in range(plays)]
    episodes = spade_mini.play(model, tok, specs, max_turns=max_turns, max_new_tokens=max_new_tokens,
                               max_episode_tokens=max_episode_tokens, temperature=0.0, top_p=1.0, top_k=0,
                               seed=seed, limits=limits, setting=setting) if specs else []
    wins: dict[str, list[float]] = {}
    for ep in episodes:
        wins.setdefault(ep.spec.key[0], []).append(float(ep.episode_return > 0))
    return {"pool_win_rate": sum(float(ep.episode_return > 0) for ep in episodes) / len(episodes) if episodes else None,
            "pool_return": sum(ep.episode_return for ep in episodes) / len(episodes) if episodes else None,
            "pool_envs": {name: sum(w) / len(w) for name, w in wins.items()}, "pool_skipped": skipped,
            "pool_s": round(time.time() - t0, 2)}


def eval_metrics(model, tok, *, limit: int, seed: int, max_new_tokens: int, env_pool: str = "",
                 pool_plays: int = 4, max_turns: int = 12, max_episode_tokens: int = 2048,
                 limits: Limits = Limits(), suites: list[str] = ("reasoning_gym",), setting: str = "games",
                 prompt: str = "agent.txt", reply_prefix: str = "") -> dict:
    """The held-out scores as flat metrics.jsonl keys: eval/score, eval/<category>, eval/answered (suite
    reasoning_gym), eval/bfcl_multi_turn_base (suite bfcl, `limit` items) and, with a pool, eval/pool_win_rate."""
    out = {}
    if "reasoning_gym" in suites:
        result = evaluate(model, tok, limit=limit, seed=seed, max_new_tokens=max_new_tokens)
        # eval/answered: share of answers in \boxed{} at all -- a small model's first gain is often the format
        out = {"eval/score": result["score"], **{f"eval/{c}": s for c, s in result["categories"].items()},
               "eval/answered": result["answered"], "perf/eval_s": result["eval_s"]}
    if "bfcl" in suites:
        result = bfcl_evaluate(model, tok, limit=limit, max_new_tokens=max_new_tokens)
        out.update({f"eval/{BFCL_CATEGORY}": result["score"], "perf/eval_bfcl_s": result["eval_s"]})
    if env_pool:
        pool = pool_win_rate(model, tok, env_pool, plays=pool_plays, seed=seed, max_turns=max_turns,
                             max_new_tokens=max_new_tokens, max_episode_tokens=max_episode_tokens, limits=limits,
                             setting=setting, prompt=prompt, reply_prefix=reply_prefix)
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


COPY_SIMILARITY = 0.95  # a program holding this share of the statements of an example it was shown is a copy


class _Anonymous(ast.NodeTransformer):
    """Spelling out, structure kept: every name, attribute, argument and keyword becomes `_`, every literal the
    empty value of its type (an f-string an empty string)."""

    def visit_Name(self, node):
        return ast.copy_location(ast.Name("_", node.ctx), node)

    def visit_arg(self, node):
        node.arg, node.annotation = "_", None
        return node

    def visit_Attribute(self, node):
        self.generic_visit(node)
        node.attr = "_"
        return node

    def visit_keyword(self, node):
        self.generic_visit(node)
        node.arg = node.arg and "_"
        return node

    def visit_Constant(self, node):
        kind = type(node.value)
        blank = kind() if kind in (int, float, complex, str, bytes, bool) else None
        return ast.copy_location(ast.Constant(blank), node)

    def visit_JoinedStr(self, node):
        return ast.copy_location(ast.Constant(""), node)


def statement_shapes(code: str) -> collections.Counter:
    """The statements of a program with their spelling taken out (_Anonymous), counted: a simple statement as
    ast.unparse writes it, a compound one by its kind and head (`If: _ == _`); docstrings dropped. Comments,
    formatting, redundant parentheses and the order of methods do not show. Code that does not parse (a memory
    example cut at MEMORY_CODE_CHARS) counts by its longest prefix of whole lines that does; a cut that happens
    to parse (`parts = match` of `parts = match.group(1)`) adds one statement that a copy lacks.

    >>> statement_shapes("total = a + b\\nif total > 3:\\n    print('big')\\n")
    Counter({'_ = _ + _': 1, 'If: _ > 0': 1, "_('')": 1})
    """
    lines = code.splitlines()
    tree = ast.Module([], [])
    for end in range(len(lines), 0, -1):
        try:
            tree = ast.parse("\n".join(lines[:end]))
            break
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
    shapes: collections.Counter = collections.Counter()
    for node in ast.walk(_Anonymous().visit(tree)):
        if not isinstance(node, ast.stmt) or isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if hasattr(node, "body"):
            head = [getattr(node, f) for f in ("test", "target", "iter", "args", "bases") if hasattr(node, f)]
            shapes[type(node).__name__ + ": " + " ".join(
                ast.unparse(h) if isinstance(h, ast.AST) else str(len(h)) for h in head)] += 1
        else:
            shapes[ast.unparse(node)] += 1
    return shapes


def copy_similarity(code: str, references: list[str]) -> float:
    """The largest share, over the references, of a reference's statements that the program holds too
    (statement_shapes, counted with multiplicity): 1.0 for a copy however renamed, reworded, reordered or
    reformatted, or with statements added; a game that changes the example's logic (sum -> product: 3 of its
    32 statements) scores below COPY_SIMILARITY.

    >>> copy_similarity("x = 1 + 2\\ny = x\\n", ["a = 7 + 8\\nb = a\\n"])
    1.0
    >>> copy_similarity("x = 1 * 2\\ny = x\\n", ["a = 1 + 2\\nb = a\\n"]), copy_similarity("x = 1\\n", [])
    (0.5, 0.0)
    """
    shapes = statement_shapes(code)
    shares = [sum((shapes & ref).values()) / max(1, sum(ref.values())) for ref in map(statement_shapes, references)]
    return max(shares, default=0.0)


def reject_copies(codes: list, verdicts: list, shown: list[list[str]]) -> list:
    """A valid program that repeats an example its prompt showed (the in-context example, a memory example)
    is not a new environment: its verdict becomes `copy`, so copying never earns regret or a memory place."""
    out = []
    for code, verdict, references in zip(codes, verdicts, shown):
        similarity = copy_similarity(code, references) if verdict.valid else 0.0
        out.append(dataclasses.replace(verdict, valid=False, reason="copy", detail=f"similarity {similarity:.2f} to "
                                       "an example in its prompt") if similarity >= COPY_SIMILARITY else verdict)
    return out


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


def other_answer(code: str, seed: int, solution: list[str], max_turns: int, limits: Limits,
                 tries: int = 3) -> tuple[str, list[str]] | None:
    """(first observation, solution) at the first of the next `tries` seeds whose solution differs from
    `solution`; None when every seed tried has the same one (the answer is in the code, not drawn from the seed)."""
    for other_seed in range(seed + 1, seed + 1 + tries):
        other_obs, other = reference_solution(code, other_seed, max_turns, limits)
        if other and other != solution:
            return other_obs, other
    return None


def answer_is_listed(code: str, seed: int, solution: list[str], max_turns: int, limits: Limits) -> bool:
    """Whether the opening shows the answer's values whatever the answer is: at another seed with another
    solution, the opening holds this solution's values too (a list of options such as "cup 1, 2 or 3", or a
    format example, not a leak). False when every seed tried has the same solution."""
    other = other_answer(code, seed, solution, max_turns, limits)
    return other is not None and opening_leak(other[0], solution)


def environment_stats(played: list, max_turns: int, limits: Limits) -> dict:
    """Statistics of a window's new environments (train.PlayedEnv, at the first step), each into its .stats:
    size, hint and opening leakage against its reference solution (replayed at its first play's seed; an opening
    that lists the answer among its options does not leak), and the window's diversity.

    subtle: a hint is written from the code alone, once for every seed. Where the answer is drawn from the seed,
    a hint that names it names it by chance (SmolLM2's hint for cups, "a team of 3 players ... 12 turns", at a
    seed whose ball is under cup 3), so only an answer that is the same at other seeds can leak through a hint."""
    for e in played:
        seed = e.episodes[0].spec.seed if e.episodes else 0
        first_obs, solution = reference_solution(e.code, seed, max_turns, limits)
        e.stats = dict(loc=loc(e.code), has_solution=bool(solution),
                       hint_leak=bool(solution) and hint_leak(e.hint, solution)
                       and other_answer(e.code, seed, solution, max_turns, limits) is None,
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


# -----------------------------------------------------------------------------------------------------------
# 4. BFCL v4 multi-turn base: the model calls tools turn by turn; execution and checking run in the sandbox

BFCL_CATEGORY = "bfcl_multi_turn_base"
_BFCL_BACKENDS = ("long_context", "gorilla_file_system", "math_api", "message_api", "posting_api", "ticket_api",
                  "trading_bot", "travel_booking", "vehicle_control")
_BFCL_MODULES = ("constants.executable_backend_config", *(f"eval_checker.multi_turn_eval.func_source_code.{m}"
                                                          for m in _BFCL_BACKENDS),
                 "eval_checker.multi_turn_eval.multi_turn_utils", "eval_checker.multi_turn_eval.multi_turn_checker")
_BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}

# The sandboxed program: BFCL's modules installed from their source text, then its executor and its checker.
_BFCL_PROGRAM = """
import decimal, sys

SOURCES = __SOURCES__


class _MpContext:
    dps = 15


def _mpmath_log(x):
    return decimal.Decimal(x).ln(decimal.Context(prec=max(1, int(_mpmath.mp.dps))))


_mpmath = type(sys)("mpmath")
_mpmath.mp, _mpmath.log = _MpContext(), _mpmath_log


def _install():
    sys.modules["mpmath"], sys.modules["subprocess"] = _mpmath, type(sys)("subprocess")
    for name in SOURCES:
        parts = name.split(".")
        for k in range(1, len(parts)):
            sys.modules.setdefault(".".join(parts[:k]), type(sys)(".".join(parts[:k]))).__path__ = []
    for name, source in SOURCES.items():
        module = sys.modules[name] = type(sys)(name)
        exec(compile(source, name, "exec"), module.__dict__)


class BfclEnv:
    def __init__(self, **kwargs):
        _install()

    def execute(self, calls, entry):
        run = sys.modules["bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils"].execute_multi_turn_func_call
        return run(calls, entry["initial_config"], entry["involved_classes"], "spade_mini", entry["id"])[0]

    def check(self, decoded, ground_truth, entry):
        check = sys.modules["bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker"].multi_turn_checker
        out = check(decoded, ground_truth, entry, "multi_turn_base", "spade_mini")
        return {"valid": bool(out["valid"]), "error_type": str(out.get("error_type", ""))}
"""


def _bfcl_root() -> Path:
    spec = importlib.util.find_spec("bfcl_eval")   # found, not imported: the trainer never runs its code
    if spec is None:
        raise FileNotFoundError("--suite bfcl needs the bfcl-eval package (pip install --no-deps bfcl-eval)")
    return Path(spec.submodule_search_locations[0])


def bfcl_program() -> str:
    """The sandbox program that holds BFCL's backends, executor and checker (their source as data)."""
    root = _bfcl_root()
    sources = {f"bfcl_eval.{m}": (root / (m.replace(".", "/") + ".py")).read_text() for m in _BFCL_MODULES}
    return _BFCL_PROGRAM.replace("__SOURCES__", repr(sources))


def _json_schema(schema):
    """BFCL's function-doc types as JSON Schema ("dict" -> "object", "float" -> "number", ...), recursively.

    >>> _json_schema({"type": "dict", "properties": {"x": {"type": "float"}}})
    {'type': 'object', 'properties': {'x': {'type': 'number'}}}
    """
    if isinstance(schema, list):
        return [_json_schema(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    return {k: _BFCL_TYPES.get(v, v) if k == "type" and isinstance(v, str) else _json_schema(v)
            for k, v in schema.items()}


def bfcl_items(limit: int) -> list[dict]:
    """The first `limit` multi-turn base items: {"entry", "ground_truth", "tools" (OpenAI schemas, its classes'
    functions minus the item's excluded ones)}."""
    data, docs = _bfcl_root() / "data", {}
    read = lambda path: [json.loads(line) for line in path.read_text().splitlines() if line.strip()]  # noqa: E731
    entries = read(data / "BFCL_v4_multi_turn_base.json")[:limit]
    answers = {a["id"]: a["ground_truth"] for a in read(data / "possible_answer" / "BFCL_v4_multi_turn_base.json")}
    # note: a dict of file names; bfcl-eval's package __init__ files are empty, so this runs none of its code
    files = importlib.import_module("bfcl_eval.constants.executable_backend_config").MULTI_TURN_FUNC_DOC_FILE_MAPPING
    items = []
    for entry in entries:
        functions = []
        for cls in entry["involved_classes"]:
            if cls not in docs:
                docs[cls] = read(data / "multi_turn_func_doc" / files[cls])
            functions += [f for f in docs[cls] if f["name"] not in entry.get("excluded_function", [])]
        tools = [{"type": "function", "function": {"name": f["name"], "description": f["description"],
                                                   "parameters": _json_schema(f["parameters"])}} for f in functions]
        items.append({"entry": entry, "ground_truth": answers[entry["id"]], "tools": tools})
    return items


def _call_string(call: dict) -> str:
    """A tool call as the Python call text BFCL's executor and checker take.

    >>> _call_string({"name": "cd", "arguments": {"folder": "docs"}})
    "cd(folder='docs')"
    """
    return f"{call['name']}(" + ", ".join(f"{k}={v!r}" for k, v in call["arguments"].items()) + ")"


def _bfcl_first_ids(tok, item: dict, native: bool, thinking: bool) -> list[int]:
    """The first prompt's ids: turn 0's message, with the tools in the template's own block when it has one."""
    return models.chat_ids(tok, _bfcl_turn_message(item, 0, native)["content"], thinking,
                           item["tools"] if native else None)


def _bfcl_turn_message(item: dict, turn: int, native: bool) -> dict:
    """The user message of an item's turn: the question, and for turn 0 the instructions (and the tools, for a
    template that does not render them, models.renders_tools) of prompts/bfcl_question.txt."""
    question = "\n".join(m["content"] for m in item["entry"]["question"][turn] if m["role"] == "user")
    if turn > 0:
        return {"role": "user", "content": question}
    listed = "" if native else envs._fill("tools_fallback.txt", tools=json.dumps(item["tools"]))
    return {"role": "user", "content": envs._fill("bfcl_question.txt", tools=listed, question=question)}


def bfcl_evaluate(model, tok, *, limit: int, max_new_tokens: int = 256, max_steps: int = 4,
                  limits: Limits = Limits(call_timeout=60.0, cpu_seconds=300), progress: bool = False,
                  reuse_cache: bool = True, thinking: bool = False) -> dict:
    """BFCL v4 multi-turn base, the first `limit` items: every item advances together (one greedy generate per
    round); a reply's tool calls run in the item's sandboxed BFCL program and their results come back as tool
    messages; a reply without a call ends the turn (so does the max_steps-th tool reply). BFCL's checker then
    scores the turns' calls. reuse_cache: the KV cache carries over from round to round (models.generate_turn,
    as in play), so a round prefills only the messages added since, not the whole ~5k-token conversation.
    thinking: rendered with enable_thinking (off, as in the reasoning-gym eval; Qwen3's template thinks unless
    told not to); calls are read after the last </think>.
    Returns {"score", "categories": {bfcl_multi_turn_base}, "called" (share of items with a call), "n",
    "eval_s", "items" (each with its calls and replies)}."""
    t0, program, native = time.time(), bfcl_program(), models.renders_tools(tok)
    items = bfcl_items(limit)
    procs = [EnvProcess(program, {}, limits) for _ in items]
    state = [{"ids": _bfcl_first_ids(tok, it, native, thinking), "added": [], "turn": 0, "steps": 0, "decoded": [[]],
              "replies": []} for it in items]
    batch, gen = None, dict(max_new_tokens=max_new_tokens, temperature=0.0, top_p=1.0, top_k=0, seed=0)
    try:
        while active := [i for i, s in enumerate(state) if s["turn"] < len(items[i]["ground_truth"])]:
            ids = [state[i]["ids"] for i in active]
            if reuse_cache:
                outs, batch = models.generate_turn(model, tok, active, ids, batch, [state[i]["added"] for i in active],
                                                   **gen)
            else:
                outs = models.generate(model, tok, ids, **gen)
            for i, out in zip(active, outs):
                _bfcl_advance(items[i], state[i], procs[i], out, max_steps, native, tok, thinking)
            if progress:
                print(f"bfcl: round done, {len(active)} items active ({time.time() - t0:.0f}s)", file=sys.stderr)
        scores = [_bfcl_check(p, it, s["decoded"]) for p, it, s in zip(procs, items, state)]
    finally:
        for p in procs:
            p.close()
    details = [{"id": it["entry"]["id"], "valid": v, "error_type": why, "calls": s["decoded"], "replies": s["replies"]}
               for it, s, (v, why) in zip(items, state, scores)]
    score = sum(v for v, _ in scores) / len(items) if items else 0.0
    return {"score": score, "categories": {BFCL_CATEGORY: score}, "n": len(items),
            "called": sum(any(any(step) for step in s["decoded"]) for s in state) / max(len(items), 1),
            "eval_s": round(time.time() - t0, 2), "items": details}


def _bfcl_advance(item: dict, st: dict, proc: EnvProcess, reply: models.Completion, max_steps: int, native: bool,
                  tok, thinking: bool) -> None:
    """One reply of an item: run its calls (results as tool messages) or end the turn; the reply's tokens and
    the messages' tokens that follow it join the item's ids (st["added"]: those messages' tokens)."""
    calls = [c for c in envs.parse_tool_calls(envs.after_thinking(reply.text)) if isinstance(c, dict)]
    st["replies"].append(reply.text)
    messages = []
    if calls:
        strings = [_call_string(c) for c in calls]
        try:
            results = proc.call("execute", strings, item["entry"])
            results = [str(r) for r in results] if isinstance(results, list) else [str(results)]
        except SandboxError as err:
            results = [f"Error during execution: {err}"]
        st["decoded"][-1].append(strings)
        messages += [{"role": "tool", "content": r} for r in results]
        st["steps"] += 1
    if not calls or st["steps"] >= max_steps:
        st["turn"], st["steps"] = st["turn"] + 1, 0
        if st["turn"] < len(item["ground_truth"]):
            st["decoded"].append([])
            messages.append(_bfcl_turn_message(item, st["turn"], native))
    st["added"] = models.messages_ids(tok, reply.completion_ids, messages, thinking) if messages else []
    st["ids"] = st["ids"] + reply.completion_ids + st["added"]


def _bfcl_check(proc: EnvProcess, item: dict, decoded: list) -> tuple[bool, str]:
    """BFCL's multi_turn_checker on one item's calls, in its sandbox: (valid, error type)."""
    try:
        out = proc.call("check", decoded, item["ground_truth"], item["entry"])
        return out.get("valid") is True, str(out.get("error_type", ""))
    except (SandboxError, AttributeError) as err:
        return False, f"sandbox: {err}"[:200]

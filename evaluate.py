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
command line `spade-mini eval` is in cli.py), `environment_stats` (the `env/...` keys of a window's first step),
and 5, `conform_case`, `check_cases` and `compare_runs` (`spade-mini conform`: golden cases another implementation
can be checked against, docs/conform.md).
"""
from __future__ import annotations

import ast
import collections
import dataclasses
import functools
import hashlib
import math
import os
import random
import re
import statistics
import sys
import time
import unicodedata
import importlib.util
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import reasoning_gym
import torch

import envs
import models
import regret
import runs
import spade_mini
from runs import InputError
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
                  setting: str = "games", prompt: str = "agent.txt", reply_prefix: str = "", flag: str = "--env-pool",
                  loaded: tuple | None = None) -> dict:
    """Play every valid environment of `folder` `plays` times without a hint (greedy; the plays differ by
    environment seed), the first message from prompts/`prompt` and the replies' prefix as in training. Returns {"pool_win_rate", "pool_return", "pool_envs": {name: win rate}, "pool_skipped"}.
    flag: the option that named the folder, for its messages; loaded: envs.load_folder's result, where the caller
    validated the folder before loading the model."""
    t0 = time.time()
    pool, skipped = loaded or envs.load_folder(folder, flag, limits, max_turns, setting)
    specs = [spade_mini.EpisodeSpec(code, envs.derive_seed(seed, 0, "eval-pool", j * 1000 + i), None, (name, i), prompt,
                                   reply_prefix) for j, (name, code) in enumerate(pool) for i in range(plays)]
    episodes = spade_mini.play(model, tok, specs, max_turns=max_turns, max_new_tokens=max_new_tokens,
                               max_episode_tokens=max_episode_tokens, temperature=0.0, top_p=1.0, top_k=0,
                               seed=seed, limits=limits, setting=setting) if specs else []
    returns: dict[str, list[float]] = {}
    for ep in episodes:
        returns.setdefault(ep.spec.key[0], []).append(ep.episode_return)
    return {"pool_win_rate": regret.win_rate([ep.episode_return for ep in episodes]) if episodes else None,
            "pool_return": sum(ep.episode_return for ep in episodes) / len(episodes) if episodes else None,
            "pool_envs": {name: regret.win_rate(r) for name, r in returns.items()}, "pool_skipped": skipped,
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
                             setting=setting, prompt=prompt, reply_prefix=reply_prefix, flag="--eval-pool")
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
DIVERSITY_TOKENS = 5_000     # tokens of a program that diversity reads (cups.py: 400); bounds its cost
_CHUNK = 1 << 16             # n-gram columns per block of the (programs x n-grams) product


def code_vectors(codes: list[str], n: int = 3) -> np.ndarray:
    """Binary bag of token n-grams per program, shape (len(codes), vocabulary): the diversity representation.

    Tokens are identifiers, digit runs and single punctuation characters (a regex, so broken code works
    too), the first DIVERSITY_TOKENS of each program; a program's vector marks which n-grams of consecutive
    tokens it contains. Presence rather than counts keeps boilerplate such as `self .` from dominating the cosine.

    >>> code_vectors(["a = 1", "a = 1", "b = 2"], n=2).sum(axis=1).tolist()
    [2.0, 2.0, 2.0]
    """
    ids, columns = _gram_ids(codes, n)
    x = np.zeros((len(codes), columns), dtype=np.float32)  # 0/1 entries: float32 counts stay exact
    for row, gs in enumerate(ids):
        x[row, gs] = 1.0
    return x


def _gram_ids(codes: list[str], n: int) -> tuple[list[np.ndarray], int]:
    """Each program's distinct n-grams as column numbers, and the number of columns."""
    grams = []
    for code in codes:
        toks = _TOKEN.findall(code[:DIVERSITY_TOKENS * 64])[:DIVERSITY_TOKENS]   # a token is rarely 64+ chars
        grams.append({tuple(toks[i:i + n]) for i in range(max(1, len(toks) - n + 1))} if toks else set())
    vocab: dict = {}
    for gs in grams:
        for g in gs:
            vocab.setdefault(g, len(vocab))
    return [np.fromiter((vocab[g] for g in gs), dtype=np.int64, count=len(gs)) for gs in grams], len(vocab)


def _shared_grams(codes: list[str], n: int) -> np.ndarray:
    """(programs, programs) numbers of n-grams two programs share: code_vectors' x @ x.T. The diagonal is each
    program's count; off it only n-grams held by two programs or more count, a block of _CHUNK of them at a
    time, so that memory stays programs x _CHUNK whatever the vocabulary."""
    ids, columns = _gram_ids(codes, n)
    held = np.bincount(np.concatenate(ids), minlength=columns) if ids and columns else np.zeros(0, dtype=np.int64)
    common = np.cumsum(held >= 2) - 1            # column -> its number among the shared ones
    sizes = [len(gs) for gs in ids]
    ids = [common[gs[held[gs] >= 2]] for gs in ids]
    shared = np.zeros((len(codes), len(codes)))
    for start in range(0, int(held.size and common[-1] + 1), _CHUNK):
        block = np.zeros((len(codes), _CHUNK), dtype=np.float32)
        for row, gs in enumerate(ids):
            block[row, gs[(gs >= start) & (gs < start + _CHUNK)] - start] = 1.0
        shared += block @ block.T
    np.fill_diagonal(shared, sizes)
    return shared


def diversity(codes: list[str], n: int = 3) -> float:
    """Vendi score / n of programs under the cosine kernel of code_vectors: 1/n if all identical, ~1 if unrelated.

    Worked example: two identical programs have cosine 1, K = all ones, Vendi 1, so 1 / 2 = 0.5; two with no
    shared 3-gram have K = I, Vendi 2, so 2 / 2 = 1.0. (The paper: 0.68 with corpus grounding, 0.04 without.)

    >>> diversity(["x = 1 + 2", "x = 1 + 2"]), diversity(["x = 1 + 2", "def f(): return y"])
    (0.5, 1.0)
    """
    if not codes:
        return 0.0
    shared = _shared_grams(codes, n)            # (n, n) number of n-grams two programs share
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


MAX_TREE_DEPTH = 100        # nesting of a program's syntax tree the trainer walks (its recursion limit is 1,000)
MAX_TREE_NODES = 200_000    # syntax-tree nodes (a 256 kB program of short statements has ~120,000)
SHAPE_CUTS = 64             # a cut program (a memory example) is parsed at most this many lines shorter


def bounded_tree(code: str) -> ast.Module | str:
    """The program's syntax tree, or why the trainer will not walk it: `too_large` (more bytes than
    envs.MAX_CODE_BYTES, nodes than MAX_TREE_NODES, or combining marks in a row than runs.MAX_MARKS, which the
    parser would normalise in quadratic time: runs.stream_safe), `too_deep` (nested past MAX_TREE_DEPTH, so that the
    trainer's recursive walks, ast.unparse among them, stay far from its recursion limit), `syntax`. Never
    raises; the depth is measured without recursion.

    >>> bounded_tree("x = " + "-" * 150 + "1"), type(bounded_tree("x = 1")).__name__, bounded_tree("x = (")
    ('too_deep', 'Module', 'syntax')
    """
    if len(code.encode("utf-8", "replace")) > envs.MAX_CODE_BYTES:
        return "too_large"
    try:
        tree = runs.parse_python(code)
    except runs.TooManyMarks:
        return "too_large"
    except (SyntaxError, ValueError):
        return "syntax"
    except (RecursionError, MemoryError):
        return "too_deep"
    stack, count = [(tree, 0)], 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if depth > MAX_TREE_DEPTH or count > MAX_TREE_NODES:
            return "too_deep" if depth > MAX_TREE_DEPTH else "too_large"
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return tree


def normalized(text: str) -> str:
    """Text as the checks compare it: Unicode NFKC (fullwidth `８９` is `89`), every decimal digit an ASCII one
    (Arabic-Indic `٨٩` too), format characters (zero-width spaces, bidi controls, tag characters) removed, and the
    line and paragraph separators a space. Linear in the text: at most runs.MAX_MARKS combining marks in a row are
    kept (runs.stream_safe: an environment's opening of a letter and 2 x 40,000 marks held the trainer 11.2 s a
    call; 5 ms now).

    >>> normalized("\\uff18\\uff19 \\u0668\\u0669 a\\u200bb\\u2028c"), len(normalized("e" + "\\u0301" * 40))
    ('89 89 ab c', 30)
    """
    text = unicodedata.normalize("NFKC", runs.stream_safe(text))
    return "".join(" " if c in "\u2028\u2029\x85" else str(unicodedata.decimal(c, c)) for c in text
                   if unicodedata.category(c) != "Cf")


def _python_lines(code: str) -> list[str]:
    """Lines as Python's tokenizer splits them (\\n, \\r\\n, \\r), not as str.splitlines does: that also splits at
    U+2028, \\x0c and others, which the compiler leaves inside a comment or a string.

    >>> _python_lines("a = 1  # (\\u2028)\\nb = 2")
    ['a = 1  # (\\u2028)', 'b = 2']
    """
    return re.split(r"\r\n|\r|\n", code)


def statement_shapes(code: str) -> collections.Counter:
    """The statements of a program with their spelling taken out (_Anonymous), counted: a simple statement as
    ast.unparse writes it, a compound one by its kind and head (`If: _ == _`); docstrings dropped. Comments,
    formatting, redundant parentheses and the order of methods do not show; identifiers are NFKC-normalised by
    the parser, as the compiler does. Code that does not parse (a memory example cut at MEMORY_CODE_CHARS)
    counts by its longest prefix of whole lines that does, at most SHAPE_CUTS lines shorter; a cut that happens
    to parse (`parts = match` of `parts = match.group(1)`) adds one statement that a copy lacks. A program past
    bounded_tree's bounds has no shapes (reject_copies refuses it first).

    >>> statement_shapes("total = a + b\\nif total > 3:\\n    print('big')\\n")
    Counter({'_ = _ + _': 1, 'If: _ > 0': 1, "_('')": 1})
    """
    lines = _python_lines(code)
    tree = ast.Module([], [])
    for end in range(len(lines), max(0, len(lines) - SHAPE_CUTS), -1):
        parsed = bounded_tree("\n".join(lines[:end]))
        if not isinstance(parsed, str):
            tree = parsed
            break
        if parsed != "syntax":
            break
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


def _held_share(shapes: collections.Counter, reference: collections.Counter) -> float:
    """The share of a reference's statements (statement_shapes, with multiplicity) that a program holds too."""
    return sum((shapes & reference).values()) / max(1, sum(reference.values()))


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
    return max((_held_share(shapes, ref) for ref in map(statement_shapes, references)), default=0.0)


BEHAVIOUR_SIMILARITY = 0.25   # a reference holding less of its statements in the program is not played against it
BEHAVIOUR_SEEDS = 32          # seeds at which a program and a reference are played side by side
BEHAVIOUR_WRONG = 4           # a seed's wrong answers: the reference's solutions at this many of the other seeds


def _outcomes(env: EnvProcess, seed: int, actions: list[str], turns: int) -> list[tuple[float, bool, bool]]:
    """(reward, terminated, truncated) of each step of one episode: reset(seed), then the actions in turn until
    it ends or `turns` are taken. Rewards are rounded to 6 places: a copy may compute them in another order."""
    envs.parse_reset(env.call("reset", seed))
    out = []
    for action in actions[:turns]:
        _, reward, terminated, truncated = envs.parse_step(env.call("step", action))
        out.append((round(reward, 6), terminated, truncated))
        if terminated or truncated:
            break
    return out


def _answer(env: EnvProcess, seed: int) -> list[str]:
    """solution()'s actions after reset(seed); [] when it gives none to replay or has none at all."""
    envs.parse_reset(env.call("reset", seed))
    try:
        return envs.solution_actions(env.call("solution")) or []
    except SandboxError as err:
        if err.reason != "error":   # a timeout or a crash killed the instance: no behaviour to compare
            raise
        return []


def _differs_at(ref: EnvProcess, env: EnvProcess, seed: int, answer: list[str], wrong: list[str],
                turns: int) -> tuple[bool, bool]:
    """(whether a reference and a program part at one seed, whether any step compared paid something or ended
    the game): five action sequences, each from reset(seed), the reward, terminated and truncated of every step
    compared: the reference's solution `answer`, the program's own solution, the solution said in one turn, the
    `wrong` answers followed by the solution, and the wrong answers every turn (a different turn cap shows here)."""
    at_once = ["\\boxed{" + " ".join(a[len("\\boxed{"):-1] for a in answer) + "}"]
    telling = False
    for actions in (answer, _answer(env, seed), at_once, wrong[:max(0, turns - len(answer))] + answer,
                    (wrong * turns)[:turns]):
        outcomes = _outcomes(ref, seed, actions, turns)
        if outcomes != _outcomes(env, seed, actions, turns):
            return True, True
        telling = telling or any(reward != 0 or terminated for reward, terminated, _ in outcomes)
    return False, telling


def same_behaviour(code: str, reference: str, turns: int, limits: Limits) -> bool | None:
    """Whether a program plays as a reference does: True when they part at none of BEHAVIOUR_SEEDS seeds
    (_differs_at), the wrong answers at a seed being made_up_actions, then the reference's solutions at the next
    BEHAVIOUR_WRONG seeds. False at the first difference (or when their turn caps differ); None when either
    fails (an error, a timeout, a reply of the wrong shape, no process to start), and when no step compared paid
    anything or ended a game (two games whose solution() is a sentence, probed only with actions that neither
    rewards, look alike without being alike): no behaviour to compare. Both run only in the sandbox, one
    instance each, reset before every sequence; never raises."""
    seeds = [envs.derive_seed(0, i, "copy", len(code)) for i in range(BEHAVIOUR_SEEDS)]
    try:
        with envs.open_env(reference, turns, limits) as ref, envs.open_env(code, turns, limits) as env:
            if ref.max_turns != env.max_turns:
                return False
            turns = ref.max_turns or turns
            answers = [_answer(ref, seed)[:turns] for seed in seeds]
            telling = False
            for k, seed in enumerate(seeds):
                others = [answers[(k + j) % len(seeds)] for j in range(1, BEHAVIOUR_WRONG + 1)]
                wrong = made_up_actions(seed) + [action for answer in others for action in answer]
                differs, told = _differs_at(ref, env, seed, answers[k], wrong, turns)
                if differs:
                    return False
                telling = telling or told
    except (SandboxError, envs.ContractError, OSError):   # OSError: no pipe or process left on the host
        return None
    return True if telling else None


def copy_of(code: str, references: list[str], turns: int, limits: Limits, setting: str = "games") -> str:
    """Why a valid program is a copy of one of the references ("" when it is none): structure first, then
    behaviour (games only; the tool-use setting has structure only):
    * the same statements (statement_shapes equal: only names, literals, comments, order and layout differ);
    * it holds BEHAVIOUR_SIMILARITY of a reference's statements or more and plays as the reference does
      (same_behaviour): the same game written otherwise;
    * it holds COPY_SIMILARITY of them and the two cannot be played side by side (a memory example cut at
      MEMORY_CODE_CHARS does not run, a program fails or times out): structure decides alone.
    A program that holds COPY_SIMILARITY of a reference's statements and adds a rule that changes what it pays is a
    new game built on it, not a copy."""
    shapes = statement_shapes(code)
    for reference in references:
        held = statement_shapes(reference)
        share = _held_share(shapes, held)
        if shapes == held or share >= COPY_SIMILARITY and setting != "games":
            return f"similarity {share:.2f} to an example in its prompt: the same statements"
        if share < BEHAVIOUR_SIMILARITY or setting != "games":
            continue
        same = same_behaviour(code, reference, turns, limits)
        if same or same is None and share >= COPY_SIMILARITY:
            return f"similarity {share:.2f} to an example in its prompt, " + (
                "which it plays as (the same rewards for the same actions at the same seeds)" if same else
                "which could not be played beside it")
    return ""


def reject_copies(codes: list, verdicts: list, shown: list[list[str]], turns: int = 12, limits: Limits = Limits(),
                  setting: str = "games") -> list:
    """A valid program that repeats an example its prompt showed (the in-context example, a memory example)
    is not a new environment (copy_of): its verdict becomes `copy`, so copying never earns regret or a memory
    place. A valid program the trainer will not walk (bounded_tree: `too_large`, `too_deep`) is refused with that
    reason before any comparison, so that no program can make the check raise or stall the trainer. The
    programs are checked in parallel, each comparison in sandboxed instances of its own."""
    def check(job):
        code, verdict, references = job
        unwalkable = bounded_tree(code) if verdict.valid else None
        if isinstance(unwalkable, str) and unwalkable != "syntax":
            return dataclasses.replace(verdict, valid=False, reason=unwalkable, detail=(
                f"its syntax tree is past the copy check's bounds ({MAX_TREE_DEPTH} levels, {MAX_TREE_NODES} nodes, "
                f"{runs.MAX_MARKS} combining marks in a row)"))
        why = copy_of(code, references, turns, limits, setting) if verdict.valid else ""
        return dataclasses.replace(verdict, valid=False, reason="copy", detail=why) if why else verdict
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return list(pool.map(check, zip(codes, verdicts, shown)))


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
    text = normalized("\n".join([solution_actions] if isinstance(solution_actions, str) else solution_actions))
    inner = _BOXED.findall(text) or [text]
    values = [v.lower() for part in inner for v in _VALUE.findall(part)]
    numbers = {v for v in values if v[-1].isdigit()}
    return numbers or set(values)


def _contains_keys(text: str, solution_actions: str | list[str] | None) -> bool:
    keys = solution_keys(solution_actions)
    return bool(keys) and keys <= {v.lower() for v in _VALUE.findall(normalized(text))}   # `８９` is 89


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


def environment_stats(played: list, max_turns: int, limits: Limits, guard: bool = False) -> dict:
    """Statistics of a window's new environments (train.PlayedEnv, at the first step), each into its .stats:
    size, hint and opening leakage against its reference solution (replayed at its first play's seed; an opening
    that lists the answer among its options does not leak), and the window's diversity.

    subtle: a hint is written from the code alone, once for every seed. Where the answer is drawn from the seed,
    a hint that names it names it by chance (SmolLM2's hint for cups, "a team of 3 players ... 12 turns", at a
    seed whose ball is under cup 3), so only an answer that is the same at other seeds can leak through a hint.
    guard: each designed game also gets .stats["guard"], play_guard's finding at its unhinted plays' seeds ("" when
    none), which zeroes its designer reward (train.score); env/guard_caught counts them."""
    for e in played:
        seed = e.episodes[0].spec.seed if e.episodes else 0
        first_obs, solution = reference_solution(e.code, seed, max_turns, limits)
        e.stats = dict(loc=loc(e.code), has_solution=bool(solution),
                       hint_leak=bool(solution) and hint_leak(e.hint, solution)
                       and other_answer(e.code, seed, solution, max_turns, limits) is None,
                       opening_leak=bool(solution) and opening_leak(first_obs, solution)
                       and not answer_is_listed(e.code, seed, solution, max_turns, limits))
        if guard and e.design is not None:
            seeds = [ep.spec.seed for ep in e.episodes if ep.spec.hint is None]
            e.stats["guard"] = play_guard(e.code, e.hint or "", seeds, max_turns, limits)
    with_solution = [e for e in played if e.stats["has_solution"]]

    def rate(key):
        return sum(e.stats[key] for e in with_solution) / len(with_solution) if with_solution else None
    return {"env/loc_mean": sum(e.stats["loc"] for e in played) / len(played) if played else None,
            "env/hint_leak_rate": rate("hint_leak"), "env/opening_leak_rate": rate("opening_leak"),
            "env/diversity": diversity([e.code for e in played]) if len(played) > 1 else None,
            **({"env/guard_caught": sum(bool(e.stats.get("guard")) for e in played)} if guard else {})}


LEARNABLE = (0.2, 0.8)      # a win rate in this band: the agent wins sometimes, so the environment has signal


@functools.lru_cache(maxsize=256)   # the memory holds 200 records
def mechanics_signature(code: str) -> str:
    """A program's mechanics as a short hash: the set of its statement shapes (statement_shapes: names, literals,
    comments, formatting and order out), so that renamed, reworded and reordered copies share one; a program past
    bounded_tree's bounds is hashed by its text.

    >>> mechanics_signature("a = b + 1\\nprint(a)") == mechanics_signature("x = y + 7  # sum\\nprint(x)")
    True
    """
    shapes = sorted(statement_shapes(code)) or ["text:" + code]
    return hashlib.sha256("\n".join(shapes).encode("utf-8", "replace")).hexdigest()[:16]


def memory_stats(records: list[dict]) -> dict:
    """memory/size, memory/diversity (Vendi / n of the remembered programs; None below two), memory/distinct_ratio
    (distinct mechanics signatures / records: 1 when no two share mechanics) and memory/learnable_share (records
    with a win rate in LEARNABLE): self-play collapses when one environment fills the pool."""
    codes = [r["code"] for r in records]
    signatures = {r.get("signature") or mechanics_signature(r["code"]) for r in records}
    return {"memory/size": len(codes), "memory/diversity": diversity(codes) if len(codes) > 1 else None,
            "memory/distinct_ratio": len(signatures) / len(records) if records else None,
            "memory/learnable_share": sum(LEARNABLE[0] <= r["win_rate"] <= LEARNABLE[1] for r in records) / len(records)
            if records else None}


# -----------------------------------------------------------------------------------------------------------
# 3b. the play guard (departure 32): scripted players that win without reasoning, under the conditions of play

GUARD_SEEDS = 12           # a literal is the game's constant answer when it wins at this many play seeds (binary: 2^-11)
GUARD_BLIND_SEEDS = 4      # each made-up action is played at this many play seeds
GUARD_BLIND_SHARE = 0.25   # made-up actions that win this share of their plays: the game pays whatever is said
GUARD_LITERALS = 32        # literals of the hint and the source tried as answers, at most
_WORD = re.compile(r"[^\W_][\w .,'+-]{0,31}")   # a literal short and plain enough to be an answer


def guard_literals(code: str, hint: str = "") -> list[str]:
    """What a player that reads the hint or the source, with no reasoning, could answer: the hint's boxed contents,
    quoted strings and numbers, then the source's short str and number constants, a boxed action's content for
    one that holds one (first those in a comparison or assigned to a name one compares), then the hint's words of
    4+ letters; each lower-cased too; at most GUARD_LITERALS. A program that does not parse, or is too deep to
    walk (bounded_tree), gives the hint's only.

    >>> guard_literals("n = 3\\nKEY = 'Xyzzy'\\nif a == KEY: pass", "Try the key.")
    ['Xyzzy', 'xyzzy', '3']
    """
    text = normalized(hint)
    found = [text[start + len("\\boxed{"):end - 1] for start, end in envs.boxed_spans(text)]
    found += [*re.findall(r"[\"'`]([^\"'`\n]{1,32})[\"'`]", text), *re.findall(r"-?\d+(?:\.\d+)?", text)]
    tree = bounded_tree(code)
    if not isinstance(tree, str):
        nodes = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and not isinstance(n.value, bool)
                 and isinstance(n.value, (str, int, float))]
        inside = [c for n in ast.walk(tree) if isinstance(n, ast.Compare) for c in ast.walk(n)]
        names = {getattr(c, "id", getattr(c, "attr", None)) for c in inside} - {None}
        compared = {id(c) for c in inside} | {id(c) for n in ast.walk(tree) if isinstance(n, ast.Assign) and any(
            getattr(t, "id", getattr(t, "attr", None)) in names for t in n.targets) for c in ast.walk(n.value)}
        for value in (str(n.value) for n in sorted(nodes, key=lambda n: id(n) not in compared)):
            found += [value[start + len("\\boxed{"):end - 1] for start, end in envs.boxed_spans(value)] or [value]
    found += [word.strip(".,;:!?") for word in text.split() if len(word.strip(".,;:!?")) > 3]
    out: list[str] = []
    for word in found:
        for variant in (word.strip(), word.strip().lower()):
            if variant not in out and _WORD.fullmatch(variant) and len(out) < GUARD_LITERALS:
                out.append(variant)
    return out


def made_up_actions(seed: int) -> list[str]:
    """Actions no honest game should reward, drawn from `seed` (never constants a program could test for): a
    nonsense word and a large number, boxed, and a plain phrase.

    >>> made_up_actions(0) == made_up_actions(0) != made_up_actions(1)
    True
    """
    rng = random.Random(envs.derive_seed(seed, 0, "guard", 0))
    word = "".join(rng.choice("bcdfghjklmnpqrstvwxz") + rng.choice("aeiou") for _ in range(4))
    return [f"\\boxed{{{word}}}", f"\\boxed{{{rng.randint(10 ** 6, 10 ** 7)}}}", f"let me {word} the {word[::-1]}"]


def _scripted_win(code: str, seed: int, actions: list[str], turns: int, limits: Limits) -> bool:
    """One play as training plays it: a fresh process, the runner's turn cap, one reset at a play seed, then the
    actions in turn until they run out or the episode ends; True when it is won (terminated, reward >=
    WIN_REWARD). A failure of the environment is a loss."""
    try:
        with envs.open_env(code, turns, limits) as env:
            envs.parse_reset(env.call("reset", seed))
            for action in actions[:env.max_turns or turns]:
                _, reward, terminated, truncated = envs.parse_step(env.call("step", action))
                if terminated or truncated:
                    return terminated and reward >= envs.WIN_REWARD
    except (SandboxError, envs.ContractError):
        pass
    return False


def play_guard(code: str, hint: str, seeds: list[int], turns: int, limits: Limits) -> str:
    """Why a game pays a player that does not reason, "" when it does not (departure 32; games only). Every play
    runs as training plays (_scripted_win: a fresh process per play, one reset, the play seeds given, padded to
    GUARD_SEEDS), so a game that behaves otherwise in validation than in play is judged on its play:
    * `blind win`: made-up actions (made_up_actions), each said every turn, win GUARD_BLIND_SHARE of their plays
      at GUARD_BLIND_SEEDS seeds: any answer wins, or any answer said twice, or the seed with the action;
    * `constant answer`: a literal of the hint or the source (guard_literals), said once, wins at all GUARD_SEEDS
      seeds: what a hint that reads the source can state (a master key beside an honest secret, a case-folded
      constant, a key that only play accepts)."""
    seeds = (list(dict.fromkeys(seeds)) + [envs.derive_seed(0, i, "guard", len(code)) for i in range(GUARD_SEEDS)])
    seeds = seeds[:GUARD_SEEDS]
    made_up = made_up_actions(seeds[0])
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        blind = list(pool.map(lambda job: _scripted_win(code, job[1], [job[0]] * turns, turns, limits),
                              [(action, seed) for action in made_up for seed in seeds[:GUARD_BLIND_SEEDS]]))
        if sum(blind) >= GUARD_BLIND_SHARE * len(blind):
            return (f"blind win: made-up actions ({', '.join(made_up)}), each said every turn, won {sum(blind)} of "
                    f"{len(blind)} plays")
        boxed = [f"\\boxed{{{literal}}}" for literal in guard_literals(code, hint)]
        first = pool.map(lambda action: _scripted_win(code, seeds[0], [action], turns, limits), boxed)
        for action in (action for action, won in zip(boxed, list(first)) if won):
            if all(pool.map(lambda seed: _scripted_win(code, seed, [action], turns, limits), seeds[1:])):
                return f"constant answer: {action}, a literal of the hint or the source, wins at all {len(seeds)} " \
                       "play seeds"
    return ""


def zero_variance_fraction(groups: list[list[float]]) -> float:
    """Share of groups whose rewards are all equal (a group of one included): they carry no gradient.

    >>> round(zero_variance_fraction([[1.0, 1.0], [0.0, 1.0], [0.5]]), 6)
    0.666667
    """
    if not groups:
        return 0.0
    return sum(map(regret.tied, groups)) / len(groups)


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


# ----------------------------------------------------------------------------------------------------------
# 5. conformance (`spade-mini conform`, docs/conform.md): golden cases in conform/*.json, one file per section,
# each a list of {"name", "input", "output"}, computed by the functions the loop itself calls (regret.score_window,
# regret.agent_advantages, Episode.append, spade_mini.ppo_clip_loss, envs.to_action, envs.validate); another
# implementation's outputs checked against them; two runs (or two sides of several runs) compared step by step.

CONFORM_GOLDEN = Path(__file__).resolve().parent / "conform"
CONFORM_SECTIONS = ("windows", "update", "parser", "validation")
CONFORM_TOLERANCE = 1e-6                     # absolute, on every number (float32 losses: 1e-6 of values near 1)


# -----------------------------------------------------------------------------------------------------------
# one case -> this implementation's output

def conform_case(section: str, given: dict) -> dict:
    """The output of one case of `section` (formats in docs/conform.md)."""
    if section == "windows":
        return regret.score_window(given["variant"], given["envs"], given.get("mu_slow") or {}, given["window"],
                                   hang_penalty=given.get("hang_penalty", regret.HANG_PENALTY),
                                   invalid_reward=given.get("invalid_reward", regret.INVALID_REWARD))
    if section == "parser":
        reply = envs.after_thinking(given["reply"]) if given.get("thinking") else given["reply"]
        return {"action": envs.to_action(reply)}
    if section == "validation":
        verdict = envs.validate(given["code"], max_turns=given.get("max_turns", 12), seed=given.get("seed", 0),
                                fair_games=given.get("fair_games", True))
        return {"valid": verdict.valid, "reason": verdict.reason, "checks": verdict.checks}
    if section == "update":
        return _update_case(given)
    raise InputError(f"unknown section {section!r} (one of {', '.join(CONFORM_SECTIONS)})")


def _update_case(given: dict) -> dict:
    """An episode's tokens and loss mask (its segments appended as the rollout does), each play's advantage in its
    group, and the per-token loss of one PPO-clip step over the episode."""
    episode = spade_mini.Episode(None)
    for segment in given["segments"]:   # {"ids", "trainable", "logprobs" (trainable ones, optional)}
        episode.append(segment["ids"], segment["trainable"], segment.get("logprobs"))
    advantages = regret.agent_advantages(given["returns"], given.get("trained"))
    row = lambda key: torch.tensor([given[key]], dtype=torch.float64)   # noqa: E731 (B = 1, T)
    mask = torch.tensor([episode.loss_mask])
    adv = torch.tensor([advantages[given.get("play", 0)]], dtype=torch.float64)
    per_sample, stats = spade_mini.ppo_clip_loss(
        row("logp"), row("old_logp"), mask, adv, clip_low=given.get("clip_low", 0.2),
        clip_high=given.get("clip_high", 0.28), kl_beta=given.get("kl_beta", 0.0),
        ref_logp=row("ref_logp") if "ref_logp" in given else None,
        sampling_logp=torch.tensor([episode.rollout_logprobs], dtype=torch.float64)
        if episode.rollout_logprobs is not None else None)
    masked = lambda key: [float(v) if m else 0.0 for v, m in zip(stats[key][0].tolist(), episode.loss_mask)]  # noqa: E731
    return {"token_ids": episode.token_ids, "loss_mask": episode.loss_mask,
            "rollout_logprobs": episode.rollout_logprobs, "advantages": advantages,
            "tis_weight": masked("tis_weight"), "kl": masked("kl"), "per_token_loss": masked("per_token"),
            "loss": float(per_sample[0]), "clipped_tokens": stats["clipped_tokens"]}


# -----------------------------------------------------------------------------------------------------------
# comparing outputs

def conform_difference(expected, got, where: str = "") -> str | None:
    """Where `got` first differs from `expected` (numbers within CONFORM_TOLERANCE), or None.

    >>> conform_difference({"a": [1.0, 2.0]}, {"a": [1.0, 2.0000001]}), conform_difference({"a": [1, 2]}, {"a": [1, 3]})
    (None, 'a[1]: expected 2, got 3')
    """
    if isinstance(expected, dict) and isinstance(got, dict):
        if expected.keys() != got.keys():
            return f"{where or 'top'}: keys {sorted(expected)} expected, got {sorted(got)}"
        return next((d for k in expected if (d := conform_difference(expected[k], got[k], f"{where}.{k}".lstrip(".")))),
                    None)
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return f"{where}: {len(expected)} items expected, got {len(got)}"
        return next((d for i, (e, g) in enumerate(zip(expected, got)) if (d := conform_difference(e, g, f"{where}[{i}]"))),
                    None)
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (expected, got))
    same = math.isclose(expected, got, rel_tol=0, abs_tol=CONFORM_TOLERANCE) if numbers else expected == got
    return None if same else f"{where}: expected {expected!r}, got {got!r}"


def golden_cases(sections=CONFORM_SECTIONS, folder: Path = CONFORM_GOLDEN) -> dict[str, list]:
    out = {}
    for section in sections:
        path = folder / f"{section}.json"
        try:
            out[section] = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise InputError(f"{path}: cannot read the golden cases ({type(err).__name__})") from None
    return out


def check_cases(cases: dict[str, list], theirs: dict[str, dict] | None = None) -> list[tuple[str, str, str | None]]:
    """(section, case name, first difference or None) for every case: this implementation's outputs, or
    `theirs` ({section: {case name: output}}) when given."""
    results = []
    for section, items in cases.items():
        for case in items:
            if theirs is None:
                got = json.loads(json.dumps(conform_case(section, case["input"])))   # as JSON would carry it
            else:
                got = theirs.get(section, {}).get(case["name"])
            expected = case["output"]
            if theirs is not None and section == "validation" and isinstance(got, dict):
                # another sandbox may name its checks differently: its verdict is compared, not its checks
                expected = {"valid": expected["valid"], "reason": expected["reason"]}
                got = {"valid": got.get("valid"), "reason": got.get("reason")}
            results.append((section, case["name"], "missing" if got is None else conform_difference(expected, got)))
    return results


def write_golden(sections=CONFORM_SECTIONS, folder: Path = CONFORM_GOLDEN) -> None:
    """Recompute every case's output from its input (after a deliberate change of a formula: review the diff)."""
    for section, items in golden_cases(sections, folder).items():
        for case in items:
            case["output"] = json.loads(json.dumps(conform_case(section, case["input"])))
        runs.write_atomic(folder / f"{section}.json", json.dumps(items, indent=1) + "\n")


# -----------------------------------------------------------------------------------------------------------
# the parity protocol: two runs of the same configuration and seeds, step by step

ONE_SIDE_ONLY = "(logged by one side only)"   # compare_runs' row for a step only one side logged
NON_FINITE = ("NaN", "Infinity", "-Infinity")   # how runs.json_line writes a non-finite number


def compare_runs(a: list[Path], b: list[Path], tolerance: float = CONFORM_TOLERANCE) -> list[dict]:
    """Per step and metric (both sides log it; perf/ metrics, times and speeds, are left out) of two sides' runs
    (metrics.jsonl or run directories): with one run a side, both values, which agree within `tolerance`; with
    several, each side's mean, and they agree when the 95% interval of the difference of means (Welch, normal
    approximation) holds 0."""
    def steps(run: Path) -> dict[int, dict]:
        path = run / "metrics.jsonl" if run.is_dir() else run
        if not path.is_file():
            raise InputError(f"{path}: no such file (a run directory holds metrics.jsonl)" if not path.exists() else
                             f"{path} is not a file (a run directory holds metrics.jsonl)")
        return {r["step"]: r for r in runs.read_jsonl(path) if type(r.get("step")) is int}   # a step, not [0] or {}
    if not a or not b:
        raise InputError("--runs: each side needs at least one run (comma-separated for several)")
    left, right = [steps(p) for p in a], [steps(p) for p in b]
    common = set.intersection(*(set(s) for s in left + right))
    rows = [{"step": step, "metric": ONE_SIDE_ONLY, "a": None, "b": None, "agree": False}
            for step in sorted(set.union(*(set(s) for s in left + right)) - common)]
    for step in sorted(common):
        names = set.intersection(*(set(s[step]) for s in left + right))
        for k in sorted(n for n in names if not n.startswith("perf/") and n != "step"):
            xs, ys = [s[step][k] for s in left], [s[step][k] for s in right]
            if len(xs) == len(ys) == 1:
                x, y = xs[0], ys[0]
                # a non-finite value (logged as the string "NaN": runs.json_line) never agrees, as NaN != NaN
                agree = math.isclose(x, y, rel_tol=0, abs_tol=tolerance) if _number(x) and _number(y) else \
                    x == y and x not in NON_FINITE
                rows.append({"step": step, "metric": k, "a": x, "b": y, "agree": agree})
            elif all(_number(v) for v in xs + ys):
                ma, mb = statistics.fmean(xs), statistics.fmean(ys)
                var = lambda v: statistics.variance(v) if len(v) > 1 else 0.0   # noqa: E731 (sample variance)
                half = 1.96 * math.sqrt(var(xs) / len(xs) + var(ys) / len(ys))
                rows.append({"step": step, "metric": k, "a": ma, "b": mb, "agree": abs(ma - mb) <= max(half, tolerance)})
    return rows


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# -----------------------------------------------------------------------------------------------------------
# 6. intervals the benches report (bench/learning.py, bench/designer_loop.py, bench/peer_trl.py): one of each

def clopper_pearson(k: int, n: int, level: float = 0.95) -> list[float]:
    """The exact two-sided interval of a binomial share k/n (bisection on the binomial tail; no scipy).

    >>> clopper_pearson(0, 10), clopper_pearson(5, 10)
    ([0.0, 0.3085], [0.1871, 0.8129])
    """
    a = (1 - level) / 2

    def tail_ge(p: float) -> float:   # P(X >= k)
        return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))

    def solve(f, target: float) -> float:   # f increasing in p on [0, 1]
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
        return (lo + hi) / 2
    lower = 0.0 if k == 0 else solve(tail_ge, a)
    # P(X <= k) falls as p rises: the upper bound is where P(X >= k + 1) = tail_ge(p) - P(X = k) reaches 1 - a
    upper = 1.0 if k == n else solve(lambda p: tail_ge(p) - math.comb(n, k) * p ** k * (1 - p) ** (n - k), 1 - a)
    return [round(lower, 4), round(upper, 4)]


def bootstrap_ci(values, rng: np.random.Generator, n: int = 10_000) -> list[float]:
    """95% percentile interval of the mean of `values` by resampling them with replacement. Two values 0 and 1:
    a resample's mean is 0, 0.5 or 1 with probability 1/4, 1/2, 1/4, so the interval is [0, 1].

    >>> bootstrap_ci([0.0, 1.0], np.random.default_rng(0)), bootstrap_ci([0.3] * 5, np.random.default_rng(0))
    ([0.0, 1.0], [0.3, 0.3])
    """
    values = np.asarray(values, dtype=np.float64)
    means = values[rng.integers(0, len(values), size=(n, len(values)))].mean(axis=1)
    return [round(float(np.percentile(means, 2.5)), 4), round(float(np.percentile(means, 97.5)), 4)]

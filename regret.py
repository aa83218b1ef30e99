"""Hint-based regret: how the Environment Designer is scored, and the numbers logged about its environments.

The idea: play each environment twice over, once with a privileged hint and once without. The gap
R_hint - R_nohint is large exactly when the environment sits at the edge of the agent's ability (solvable
with help, not yet alone), which is the training data worth most. The designer is paid that gap (or one of
the variants below); the agent's and the designer's samples then get per-role advantages.

Everything here is a small pure function of numbers (or of program text, for the statistics at the end),
with a hand-computed example that runs as a doctest. No torch; numpy only for the eigenvalues of Vendi.
"""
import math
import re

import numpy as np

PLATEAU = (0.15, 0.4, 0.6, 0.85)  # plateau(w): 0 below 0.15, rises to 1 at 0.4, flat to 0.6, 0 again at 0.85
BLEND_GAP_SCALE = 0.15            # blend: a regret of 0.15 already earns the full regret part
BLEND_WEIGHTS = (0.4, 0.6)        # blend: weight of the regret part, weight of the plateau part
GAMMA_SLOW = 0.85                 # learning_potential: step size of the slow per-skill mean
MAX_SCALE = 50.0                  # designer advantages: cap on S = n_RA / n_ED
EPS = 1e-8                        # agent advantages: added to the std
HANG_PENALTY = -0.5               # designer reward of an environment whose play hit a step timeout
DESIGNER_REWARDS = ("regret", "blend", "solve_rate", "learning_potential")


# ----------------------------------------------------------------------------------------------------------
# designer reward

def hint_regret(r_hint: float, r_nohint: float) -> float:
    """Unfloored hint regret, R_hint - R_nohint (negative when the hint hurt). Logged and remembered as is.

    >>> hint_regret(0.75, 0.25)
    0.5
    >>> hint_regret(0.5, 0.75)
    -0.25
    """
    return float(r_hint) - float(r_nohint)


def plateau(w: float) -> float:
    """1 on [0.4, 0.6], falling linearly to 0 at 0.15 and at 0.85; 0 outside. w = mean unhinted reward.

    Worked example: plateau(0.35) = (0.35 - 0.15) / (0.4 - 0.15) = 0.2 / 0.25 = 0.8, and
    plateau(0.75) = (0.85 - 0.75) / (0.85 - 0.6) = 0.1 / 0.25 = 0.4.

    >>> round(plateau(0.35), 6), plateau(0.5), round(plateau(0.75), 6), plateau(0.1), plateau(0.9)
    (0.8, 1.0, 0.4, 0.0, 0.0)
    """
    lo, lo_top, hi_top, hi = PLATEAU
    if w <= lo or w >= hi:
        return 0.0
    if w < lo_top:
        return (w - lo) / (lo_top - lo)
    if w > hi_top:
        return (hi - w) / (hi - hi_top)
    return 1.0


def designer_reward(variant: str, r_hint: float, r_nohint: float, w: float,
                    mu_slow: float | None = None) -> float:
    """The designer's reward for one environment under one of DESIGNER_REWARDS.

    * regret: max(0, R_hint - R_nohint)                                  (the paper's formula; our default)
    * blend: 0.4 * clip((R_hint - R_nohint) / 0.15, 0, 1) + 0.6 * plateau(w)   (official code's default)
    * solve_rate: plateau(w)
    * learning_potential: |w - mu_slow|, mu_slow = the skill's slow mean of w (None: no history yet -> 0)

    Worked example, r_hint=0.5, r_nohint=0.35, w=0.35, mu_slow=0.5:
    regret = 0.15; blend = 0.4 * clip(0.15 / 0.15) + 0.6 * plateau(0.35) = 0.4 * 1 + 0.6 * 0.8 = 0.88;
    solve_rate = 0.8; learning_potential = |0.35 - 0.5| = 0.15.

    >>> [round(designer_reward(v, 0.5, 0.35, 0.35, mu_slow=0.5), 6) for v in DESIGNER_REWARDS]
    [0.15, 0.88, 0.8, 0.15]
    """
    if variant == "regret":
        return max(0.0, hint_regret(r_hint, r_nohint))
    if variant == "blend":
        gap = min(1.0, max(0.0, hint_regret(r_hint, r_nohint) / BLEND_GAP_SCALE))
        return BLEND_WEIGHTS[0] * gap + BLEND_WEIGHTS[1] * plateau(w)
    if variant == "solve_rate":
        return plateau(w)
    if variant == "learning_potential":
        return 0.0 if mu_slow is None else abs(float(w) - float(mu_slow))
    raise ValueError(f"unknown designer reward variant {variant!r}; choose one of {', '.join(DESIGNER_REWARDS)}")


def update_slow_mean(mu: float | None, r: float, gamma: float = GAMMA_SLOW) -> float:
    """mu <- (1 - gamma) * mu + gamma * r; the first observation (mu None) starts the mean.

    Worked example: (1 - 0.85) * 0.2 + 0.85 * 0.6 = 0.03 + 0.51 = 0.54.

    >>> round(update_slow_mean(0.2, 0.6), 6), update_slow_mean(None, 0.3)
    (0.54, 0.3)
    """
    if mu is None:
        return float(r)
    return (1.0 - gamma) * float(mu) + gamma * float(r)


# ----------------------------------------------------------------------------------------------------------
# advantages ("per-role normalization")

def agent_advantages(rewards: list[float]) -> list[float]:
    """z-score within one environment's unhinted plays: (r - mean) / (std + 1e-8), population std.

    Worked example, rewards [0, 1]: mean 0.5, std 0.5, so (0 - 0.5) / 0.5 = -1 and +1 (up to the eps).
    All-equal rewards give all zeros (no gradient: see zero_variance_fraction).

    >>> [round(a, 6) for a in agent_advantages([0.0, 1.0])], agent_advantages([1.0, 1.0])
    ([-1.0, 1.0], [0.0, 0.0])
    """
    if not rewards:
        return []
    x = np.asarray(rewards, dtype=np.float64)
    return ((x - x.mean()) / (x.std() + EPS)).tolist()


def designer_advantages(rewards: list[float], skills: list[str], n_agent_samples: int) -> list[float]:
    """Per-skill centering, (x - mean over the same skill) * S, S = min(n_RA / n_ED, 50); no std division.

    S puts the few designer samples on the scale of the many agent samples they share a batch with; the
    std is left out because a skill often has only one or two environments in a step.
    Worked example, rewards [0.2, 0.6, 0.5], skills [A, A, B], 12 agent samples: S = min(12 / 3, 50) = 4;
    skill A's mean is 0.4, so (0.2 - 0.4) * 4 = -0.8 and (0.6 - 0.4) * 4 = 0.8; B is alone, so 0.

    >>> [round(a, 6) for a in designer_advantages([0.2, 0.6, 0.5], ["A", "A", "B"], 12)]
    [-0.8, 0.8, 0.0]
    """
    if len(rewards) != len(skills):
        raise ValueError(f"{len(rewards)} rewards but {len(skills)} skills")
    if not rewards:
        return []
    scale = min(n_agent_samples / len(rewards), MAX_SCALE)
    by_skill: dict[str, list[float]] = {}
    for r, s in zip(rewards, skills):
        by_skill.setdefault(s, []).append(float(r))
    means = {s: sum(v) / len(v) for s, v in by_skill.items()}
    return [(float(r) - means[s]) * scale for r, s in zip(rewards, skills)]


def zero_variance_fraction(groups: list[list[float]]) -> float:
    """Share of groups whose rewards are all equal (a group of one included): they carry no gradient.

    >>> round(zero_variance_fraction([[1.0, 1.0], [0.0, 1.0], [0.5]]), 6)
    0.666667
    """
    if not groups:
        return 0.0
    flat = sum(1 for g in groups if len(g) == 0 or max(g) - min(g) <= 1e-12)
    return flat / len(groups)


# ----------------------------------------------------------------------------------------------------------
# environment statistics: diversity, leakage, size

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

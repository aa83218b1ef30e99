"""Hint-based regret: how the Environment Designer is scored, and both roles' advantages.

The idea: play each environment twice over, once with a privileged hint and once without. The gap
R_hint - R_nohint is large exactly when the environment sits at the edge of the agent's ability (solvable
with help, not yet alone), which is the training data worth most. The designer is paid that gap (or one of
the variants below); the agent's and the designer's samples then get per-role advantages.

Everything here is a small pure function of numbers with a hand-computed example that runs as a doctest;
`score_window` is the one function the training loop and `spade-mini score` both call. Standard
library only. Departures (docs/details.md's numbered list): 9 (the default reward), 15 (whom S counts), 23 (hangs).
"""
import math

PLATEAU = (0.15, 0.4, 0.6, 0.85)  # plateau(w): 0 below 0.15, rises to 1 at 0.4, flat to 0.6, 0 again at 0.85
BLEND_GAP_SCALE = 0.15            # blend: a regret of 0.15 already earns the full regret part
BLEND_WEIGHTS = (0.4, 0.6)        # blend: weight of the regret part, weight of the plateau part
GAMMA_SLOW = 0.85                 # learning_potential: step size of the slow per-skill mean
MAX_SCALE = 50.0                  # designer advantages: cap on S = n_RA / n_ED
EPS = 1e-8                        # agent advantages: added to the std
INVALID_REWARD = -0.5             # opt-in (--invalid-samples): designer reward of a rejected program (paper: no sample)
HANG_PENALTY = -0.5               # designer reward of an environment a play of which hung at its window's first step
DESIGNER_REWARDS = ("regret", "blend", "solve_rate", "learning_potential", "regret_based")


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


def win_rate(returns: list[float]) -> float:
    """Share of plays with return > 0, a win (0 for none; hand-computed cases in tests/test_regret.py)."""
    return _mean([float(r > 0) for r in returns])


def tied(group: list[float]) -> bool:
    """Fewer than two returns, or all equal (to 1e-12): a group with no gradient (cases in tests/test_regret.py)."""
    return len(group) < 2 or max(group) - min(group) <= 1e-12


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


def designer_reward(variant: str, r_hint: float, r_nohint: float, w: float, mu_slow: float | None = None) -> float:
    """The designer's reward for one environment under one of DESIGNER_REWARDS.

    * regret: max(0, R_hint - R_nohint)                                  (the paper's formula; our default)
    * blend: 0.4 * clip((R_hint - R_nohint) / 0.15, 0, 1) + 0.6 * plateau(w)   (official code's default)
    * solve_rate: plateau(w)
    * learning_potential: |w - mu_slow|, mu_slow = the skill's slow mean of w (None: no history yet -> 0)
    * regret_based: max(0, R_hint - w), the official delayed variant: against every unhinted play of the window

    Worked example, r_hint=0.5, r_nohint=0.35, w=0.25, mu_slow=0.5:
    regret = 0.15; blend = 0.4 * clip(0.15 / 0.15) + 0.6 * plateau(0.25) = 0.4 * 1 + 0.6 * 0.4 = 0.64;
    solve_rate = 0.4; learning_potential = |0.25 - 0.5| = 0.25; regret_based = 0.5 - 0.25 = 0.25.

    >>> [round(designer_reward(v, 0.5, 0.35, 0.25, mu_slow=0.5), 6) for v in DESIGNER_REWARDS]
    [0.15, 0.64, 0.4, 0.25, 0.25]
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
    if variant == "regret_based":
        return max(0.0, hint_regret(r_hint, w))
    raise ValueError(f"unknown designer reward variant {variant!r}; choose one of {', '.join(DESIGNER_REWARDS)}")


def update_slow_mean(mu: float | None, pooled: float, gamma: float = GAMMA_SLOW) -> float:
    """mu <- (1 - gamma) * mu + gamma * pooled (gamma weighs the NEW value); no history (None) -> pooled.

    Worked example: (1 - 0.85) * 0.2 + 0.85 * 0.6 = 0.03 + 0.51 = 0.54.

    >>> round(update_slow_mean(0.2, 0.6), 6), update_slow_mean(None, 0.3)
    (0.54, 0.3)
    """
    if mu is None:
        return float(pooled)
    return (1.0 - gamma) * float(mu) + gamma * float(pooled)


def update_slow_means(mu_slow: dict, skills: list[str], window_returns: list[list[float]]) -> dict:
    """learning_potential's slow means after one window: per skill, FIRST pool every unhinted return of that
    skill's environments (a hung one's surviving plays too, as the official code pools them), then update its
    mean once. Order-independent by construction.

    subtle: updating environment by environment (and scoring each against the mean before it) makes the
    second environment of a skill always win; pooling first gives both the same reference.
    Worked example, prior {A: 0.3}, environments of A with returns [0, 1] and [1, 1], one of B with [0, 0]:
    pooled(A) = 3/4 = 0.75, so mu(A) = 0.15 * 0.3 + 0.85 * 0.75 = 0.6825; B has no prior: mu(B) = 0.

    >>> out = update_slow_means({"A": 0.3}, ["A", "A", "B"], [[0, 1], [1, 1], [0, 0]])
    >>> {k: round(v, 6) for k, v in out.items()}
    {'A': 0.6825, 'B': 0.0}
    """
    pooled: dict[str, list[float]] = {}
    for skill, returns in zip(skills, window_returns):
        pooled.setdefault(skill, []).extend(float(r) for r in returns)
    out = dict(mu_slow)
    for skill, returns in pooled.items():
        if returns:
            out[skill] = update_slow_mean(out.get(skill), sum(returns) / len(returns))
    return out


# ----------------------------------------------------------------------------------------------------------
# advantages ("per-role normalization")

def agent_advantages(returns: list[float], trained: list[bool] | None = None) -> list[float]:
    """z-score over one environment's trained unhinted plays of one step: (r - mean) / (std + 1e-8),
    population std. Untrained plays (they produced no tokens) and ties get 0 and do not enter the mean.

    Worked example, returns [0, 1]: mean 0.5, std 0.5, so (0 - 0.5) / 0.5 = -1 and +1 (up to the eps).
    With a failed start, [-1, 0, 0, 0] and trained [F, T, T, T]: the three trained plays tie, so all 0
    (keeping the -1 in the group would give +0.577 to three identical outcomes).

    >>> [round(a, 6) for a in agent_advantages([0.0, 1.0])], agent_advantages([1.0, 1.0])
    ([-1.0, 1.0], [0.0, 0.0])
    >>> agent_advantages([-1.0, 0.0, 0.0, 0.0], [False, True, True, True])
    [0.0, 0.0, 0.0, 0.0]
    """
    trained = [True] * len(returns) if trained is None else list(trained)
    if len(trained) != len(returns):
        raise ValueError(f"{len(returns)} returns but {len(trained)} trained flags")
    group = [float(r) for r, t in zip(returns, trained) if t]
    if tied(group):
        return [0.0] * len(returns)   # ties carry no gradient (their share: evaluate.zero_variance_fraction)
    mu = sum(group) / len(group)
    sd = math.sqrt(sum((r - mu) ** 2 for r in group) / len(group))   # population std
    return [float((r - mu) / (sd + EPS)) if t else 0.0 for r, t in zip(returns, trained)]


def designer_scale(n_agent_plays: int, window: int, n_envs: int) -> float:
    """S = min(n_RA * window / n_ED, 50): n_RA = unhinted plays of the window's FIRST step over all its
    environments, n_ED = its environments. The paper's games run: min(192 * 4 / 24, 50) = 32.

    S puts the few designer samples on the scale of the many agent samples trained over the window; it
    counts plays, not trained samples, so flat groups do not shrink it.

    >>> designer_scale(192, 4, 24), designer_scale(16, 1, 4), designer_scale(400, 1, 2)
    (32.0, 4.0, 50.0)
    """
    return min(n_agent_plays * window / max(n_envs, 1), MAX_SCALE)


def designer_advantages(rewards: list[float], skills: list[str], scale: float) -> list[float]:
    """Per-skill centering, (x - mean over the same skill) * S; no std division (small groups).

    The std is left out because a skill often has only one or two environments in a window.
    Worked example, rewards [0.2, 0.6, 0.5], skills [A, A, B], S = 4: skill A's mean is 0.4, so
    (0.2 - 0.4) * 4 = -0.8 and (0.6 - 0.4) * 4 = 0.8; B is alone, so 0.

    >>> [round(a, 6) for a in designer_advantages([0.2, 0.6, 0.5], ["A", "A", "B"], 4.0)]
    [-0.8, 0.8, 0.0]
    """
    if len(rewards) != len(skills):
        raise ValueError(f"{len(rewards)} rewards but {len(skills)} skills")
    by_skill: dict[str, list[float]] = {}
    for r, s in zip(rewards, skills):
        by_skill.setdefault(s, []).append(float(r))
    means = {s: sum(v) / len(v) for s, v in by_skill.items()}
    return [(float(r) - means[s]) * scale for r, s in zip(rewards, skills)]


# ----------------------------------------------------------------------------------------------------------
# one window of outcomes -> every reward and advantage (the loop and `spade-mini score` both call this)

def score_window(variant: str, envs: list[dict], mu_slow: dict, window: int,
                 hang_penalty: float = HANG_PENALTY, invalid_reward: float = INVALID_REWARD) -> dict:
    """Score one regeneration window. envs: one dict per environment, {skill, hung_step, hinted: [returns],
    unhinted: [[returns of step 0], [step 1], ...], trained: same shape of bools (optional, all True)}.
    hung_step: None, or the step of the window at which a play hit a step timeout; that step's timed-out
    play and the plays dropped with it are not in `unhinted` (nor `hinted`): the survivors are.

    * r_nohint = mean of the FIRST step's unhinted returns ("matched timing"); r_hint = mean of the hinted
      returns, 0 without any (the official default); regret = r_hint - r_nohint, unfloored.
    * w = mean of every unhinted return of the window; win_rate = the share of the FIRST step's > 0 (the
      memory's band, as the official memory takes it).
    * mu_slow: update_slow_means (every variant); learning_potential reads the UPDATED mean.
    * designer_reward: invalid_reward for a program the sandbox rejected (`invalid`: no plays; given only with
      the opt-in --invalid-samples), hang_penalty if hung at the window's first step (hung_step 0; every
      variant: departure 23), else 0 if `caught` (the play guard, departure 32), else designer_reward(variant,
      ...) on the surviving plays; `regret` pays the first step's regret, `regret_based` R_hint - w.
    * designer_advantage = designer_advantages(..., S = designer_scale(n_RA, window, n_ED)).
    * agent_advantages[k] = agent_advantages(step k) over its surviving plays.

    Worked example (docs/score.md, "Checking another implementation"): one Optimization environment, prior 0.3,
    hinted [1, 1, 0, 1], one step unhinted [0, 1, 0, 0] with the last play untrained: r_hint 0.75, r_nohint
    0.25, regret 0.5, w 0.25; mu = 0.15 * 0.3 + 0.85 * 0.25 = 0.2575; S = min(4 * 1 / 1, 50) = 4; the
    trained plays [0, 1, 0] have mean 1/3 and std 0.4714, so -0.7071, 1.4142, -0.7071, and 0.

    >>> out = score_window("regret", [{"skill": "Optimization", "hung_step": None, "hinted": [1, 1, 0, 1],
    ...     "unhinted": [[0, 1, 0, 0]], "trained": [[True, True, True, False]]}], {"Optimization": 0.3}, 1)
    >>> e = out["envs"][0]
    >>> e["r_hint"], e["r_nohint"], e["regret"], e["w"], e["designer_reward"], e["designer_advantage"]
    (0.75, 0.25, 0.5, 0.25, 0.5, 0.0)
    >>> [round(a, 4) for a in e["agent_advantages"][0]], round(out["mu_slow"]["Optimization"], 6), out["scale"]
    ([-0.7071, 1.4142, -0.7071, 0.0], 0.2575, 4.0)
    """
    skills = [e["skill"] for e in envs]
    window_returns = [[float(r) for step in e["unhinted"] for r in step] for e in envs]
    mu_new = update_slow_means(mu_slow, skills, window_returns)
    rows = []
    for e, returns in zip(envs, window_returns):
        first = [float(r) for r in (e["unhinted"][0] if e["unhinted"] else [])]
        r_nohint, r_hint, w = _mean(first), _mean(e.get("hinted") or []), _mean(returns)
        reward = (invalid_reward if e.get("invalid") else hang_penalty if e.get("hung_step") == 0
                  else 0.0 if e.get("caught")   # the play guard (departure 32)
                  else designer_reward(variant, r_hint, r_nohint, w, mu_new.get(e["skill"])))
        trained = e.get("trained") or [[True] * len(step) for step in e["unhinted"]]
        rows.append(dict(r_hint=r_hint, r_nohint=r_nohint, regret=hint_regret(r_hint, r_nohint), w=w,
                         win_rate=win_rate(first), designer_reward=float(reward),
                         agent_advantages=[agent_advantages(step, t) for step, t in zip(e["unhinted"], trained)]))
    n_first = sum(len(e["unhinted"][0]) if e["unhinted"] else 0 for e in envs)
    scale = designer_scale(n_first, window, len(envs))
    for row, adv in zip(rows, designer_advantages([r["designer_reward"] for r in rows], skills, scale)):
        row["designer_advantage"] = adv
    return {"envs": rows, "mu_slow": mu_new, "scale": scale}


def _mean(xs) -> float:
    xs = [float(x) for x in xs]
    return sum(xs) / len(xs) if xs else 0.0

"""Is the loop seen to learn? Train N self-play steps, then compare the base model and the trained adapter.

The training run is the loop itself (`train.train`, the tiny preset unless flags say otherwise) on the "seen"
environments; then the untrained base model (the same weights with the LoRA adapter at its initial zero) and
the final adapter each play the SAME fixed held-out seeds, which training never used (checked), at the training
temperature, with the training limits:

    (a) seen:   the environments training played, new seeds;
    (b) unseen: environments training never saw (bench/heldout/ by default, kept out of training).

    python bench/learning.py                                    # the kept run (bench/results/learning.*)
    python bench/learning.py --steps 1 --episodes 8 --model tiny-random --out /tmp/l   # a quick check

Each arm's mean return carries a 95% bootstrap interval over its episodes; the difference trained - base is
paired by seed (the same environment and seed in both arms) with a paired bootstrap interval. Writes OUT/
learning.json (one object: steps, wall_s, commit, command, seen/unseen {base, trained: {n, mean_return, ci95},
diff_ci95}, and the reply behaviour of each arm), OUT/learning.md and OUT/learning.png (the training curves over
steps, and the before/after bars), and keeps the run directory in OUT/learning_run/.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cli  # noqa: E402
import envs  # noqa: E402
import evaluate  # noqa: E402
import models  # noqa: E402
import report  # noqa: E402
import regret  # noqa: E402
import runs  # noqa: E402
import spade_mini  # noqa: E402
import train  # noqa: E402

# the kept run's settings (README "Expected results"); each is a train flag, and the command line may override.
# 3 turns, where strategy pays: in cups (3 cups) a policy that never repeats a refuted cup wins every game,
# a uniformly random pick 0.70, always the same cup 0.33; the observation's example action is drawn anew each
# turn (copying it is the random policy), so only reading "cup 2 is empty" can beat random. Every reply starts
# with the given `\boxed{` (--agent-reply-prefix, docs/details.md departure 31): SmolLM2-135M's replies then
# stop after the action from the first update on (at step 0, 76% ran past 8 tokens), and the steps train which
# one (without it 16 steps taught the format and no more: 48-token replies echoing the observation, trained =
# random). Replies of at most 8 tokens make a step ~10 s.
# 30 steps: at lr 1e-3 the same run taken to 60 steps collapsed at step 57 (its replies stopped ending after the
# action: every one cut, return 0, no gradient left to recover with; docs/benchmarks.md)
TRAIN = dict(preset="tiny", steps=30, envs_per_step=2, plays=16, hinted_plays=0, lr=1e-3, regen_interval=1,
             max_turns=3, agent_reply_prefix="\\boxed{", agent_max_new_tokens=8, agent_max_episode_tokens=24,
             checkpoint_every=30, keep_checkpoints=1)
CURVES = ["agent/return_nohint", "agent/win_rate", "agent/cut_share", "agent/action_share",
          "agent/refuted_repeat_share", "agent/echo_share", "agent/first_reply_tokens", "agent/reply_tokens"]
SCRIPTED = ("random", "random_no_repeat", "example_action", "oracle")
VALID = {"cups": lambda obs: ["1", "2", "3"], "cups_unlisted": lambda obs: ["1", "2", "3"],
         "doors": lambda obs: list("ABCD"), "coin": lambda obs: ["left", "right"],
         "hilo": lambda obs: [str(n) for n in range(1, 8)],
         "largest": lambda obs: re.findall(r"\d+", obs.split("Numbers:")[-1].split("]")[0])}


def arm(episodes: list, rng) -> dict:
    returns = np.array([ep.episode_return for ep in episodes], dtype=np.float64)
    return {"n": len(returns), "mean_return": round(float(returns.mean()), 4), "ci95": evaluate.bootstrap_ci(returns, rng),
            "win_rate": round(regret.win_rate(returns.tolist()), 4),
            **{k.split("/")[1]: (round(v, 3) if v is not None else None) for k, v in runs.reply_stats(episodes).items()}}


def paired(a: list, b: list, rng) -> dict:
    """b - a, paired by episode (the same environment and seed in both lists)."""
    diff = np.array([y.episode_return - x.episode_return for x, y in zip(a, b)], dtype=np.float64)
    return {"diff": round(float(diff.mean()), 4), "diff_ci95": evaluate.bootstrap_ci(diff, rng)}


def normalised(trained: list, rand: list, oracle: list, rng, n: int = 10_000) -> dict:
    """(R - R_random) / (R_oracle - R_random), with a 95% interval from resampling the seeds (paired)."""
    t, r, o = (np.array([e.episode_return for e in x], dtype=np.float64) for x in (trained, rand, oracle))
    idx = rng.integers(0, len(t), size=(n, len(t)))
    gap = o[idx].mean(1) - r[idx].mean(1)
    boot = (t[idx].mean(1) - r[idx].mean(1)) / np.where(gap == 0, np.nan, gap)
    if o.mean() == r.mean():
        return {"score": None, "ci95": None}   # the oracle does no better than random: nothing to normalise by
    score = (t.mean() - r.mean()) / (o.mean() - r.mean())
    return {"score": round(float(score), 4), "ci95": [round(float(np.nanpercentile(boot, q)), 4) for q in (2.5, 97.5)]}


def compare(arms: dict, rng, games: list[str]) -> dict:
    """Every arm, the paired differences trained - base and trained - random (episode k of every arm is the
    same environment and seed), the trained arm normalised between random (0) and the oracle (1), and every
    arm's mean return on each game (games[k]: episode k's)."""
    out = {"base": arm(arms["base"], rng), "trained": arm(arms["trained"], rng),
           **paired(arms["base"], arms["trained"], rng),
           "baselines": {name: arm(arms[name], rng) for name in SCRIPTED + ("base_format_controlled",) if name in arms},
           "vs_random": paired(arms["random"], arms["trained"], rng),
           "normalised": normalised(arms["trained"], arms["random"], arms["oracle"], rng),
           "by_game": {g: {label: round(float(np.mean([e.episode_return for e, h in zip(eps, games) if h == g])), 3)
                           for label, eps in arms.items()} for g in dict.fromkeys(games)}}
    return out


def scripted_turn(policy: str, chosen: list, names: list, oracles: list, seed: int):
    """A stand-in for models.generate_turn that plays a scripted policy through the same play path (no model):
    it reads each episode's latest observation from its token sequence and replies one boxed action."""
    rng, tried = random.Random(seed), {}

    def turn(model, tok, rows, sequences, prev, deltas, **gen):
        replies = []
        for i, seq, delta in zip(rows, sequences, deltas):
            obs = tok.decode(delta or seq, skip_special_tokens=True)   # the latest observation (turn 0: the prompt)
            valid = valid_actions(chosen, names, i, obs)
            mine = tried.setdefault(i, [])
            if policy == "random":
                action = rng.choice(valid)
            elif policy == "random_no_repeat":
                action = rng.choice([a for a in valid if a not in mine] or valid)
            elif policy == "example_action":
                shown = re.findall(r"\\boxed\{([^{}]*)\}", obs)
                action = shown[0] if shown else valid[0]   # the first action the observation shows
            else:
                action = oracles[i][min(len(mine), len(oracles[i]) - 1)]
            mine.append(action)
            text = reply_text(action, chosen[i].reply_prefix)
            ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            replies.append(models.Completion(list(seq), ids, text, True, [0.0] * len(ids)))
        return replies, None
    return turn


def valid_actions(chosen: list, names: list, i: int, obs: str) -> list[str]:
    """Episode i's valid actions after observation `obs` (its game's VALID list)."""
    return VALID[names[chosen[i].key[0]]](obs) or ["1"]


def reply_text(action: str, given: str) -> str:
    """The reply that plays `action`, boxed, less the prefix the prompt already holds."""
    text = "\\boxed{" + action + "}"
    return text[len(given):] if text.startswith(given) else text


def constrained_turn(chosen: list, names: list):
    """models.generate_turn with every reply constrained to one admissible action and its stop token (HF's
    prefix_allowed_tokens_fn): the model's own choice among the valid actions, with the format taken out of its
    hands (the base_format_controlled arm). Exactly its probabilities when each action is one token (cups, doors,
    hilo: then `}` and the stop token are forced); for longer ones (largest's numbers, coin's words) token by
    token, each renormalised over the allowed ones. Temperature, top-k and top-p as in training, applied after
    the mask."""
    real = models.generate_turn

    def turn(model, tok, rows, sequences, prev, deltas, **gen):
        stop = tok.eos_token_id
        cands = [[tok(reply_text(a, chosen[i].reply_prefix), add_special_tokens=False)["input_ids"] + [stop]
                  for a in valid_actions(chosen, names, i, tok.decode(delta or seq, skip_special_tokens=True))]
                 for i, seq, delta in zip(rows, sequences, deltas)]
        start = {}

        def allowed(row: int, ids) -> list[int]:
            made = ids[start.setdefault("width", ids.shape[-1]):].tolist()   # the first call sees the prompt width
            return sorted({c[len(made)] for c in cands[row] if c[:len(made)] == made and len(c) > len(made)}) or [stop]
        return real(model, tok, rows, sequences, prev, deltas, allowed=allowed, **gen)
    return turn


def oracle_actions(cfg, chosen: list) -> list[list[str]]:
    """The boxed contents of each episode's solution() at its seed (the environment's own answer), one a turn."""
    out = []
    for s in chosen:
        _, actions = evaluate.reference_solution(s.code, s.seed, cfg.max_turns, train.limits_of(cfg))
        out.append([a[len("\\boxed{"):-1] for a in actions or []] or [""])
    return out


def play_scripted(cfg, tok, chosen: list, names: list, seed: int) -> dict:
    """Every scripted policy on the same specs through spade_mini.play, the model's turn replaced by the policy."""
    oracles, out = oracle_actions(cfg, chosen), {}
    real = models.generate_turn
    try:
        for k, policy in enumerate(SCRIPTED):
            models.generate_turn = scripted_turn(policy, chosen, names, oracles, seed + k)
            out[policy] = play(None, tok, cfg, chosen, seed)
    finally:
        models.generate_turn = real
    return out


def specs(files: list[Path], episodes: int, seed: int, role: str, prompt: str, prefix: str) -> list:
    """`episodes` held-out plays spread evenly over the files, each with its own derived seed."""
    codes = [f.read_text() for f in files]
    return [spade_mini.EpisodeSpec(codes[k % len(codes)], envs.derive_seed(seed, -1, role, k), None, (k % len(codes),),
                                    prompt, prefix)
            for k in range(episodes)]


def training_seeds(cfg) -> set[int]:
    """Every environment seed train.play_all derives in this run (so held-out seeds can be checked against them)."""
    return {envs.derive_seed(cfg.seed, step, "env", j * 1000 + i) for step in range(cfg.steps)
            for j in range(cfg.envs_per_step) for i in range(max(cfg.plays, cfg.hinted_plays))}


def play(model, tok, cfg, chosen: list, seed: int) -> list:
    return spade_mini.play(model, tok, chosen, max_turns=cfg.max_turns, max_new_tokens=cfg.agent_max_new_tokens,
                           max_episode_tokens=cfg.agent_max_episode_tokens, temperature=cfg.temperature,
                           top_p=cfg.top_p, top_k=cfg.top_k, seed=seed, limits=train.limits_of(cfg),
                           max_observation_tokens=cfg.agent_max_observation_tokens,
                           bf16=models.bf16_autocast(cfg.generate_bf16, model))


def evaluate_arms(cfg, run_dir: Path, seen: list, unseen: list, args) -> tuple[dict, str]:
    """Base (and base_format_controlled) then trained on the same specs: the adapter starts at zero (base), then
    the run's last checkpoint; then the scripted policies. -> (episodes by arm and set, the update's dtype as
    --train-bf16 resolved it for this model here)."""
    model, tok, _ = models.load_model(cfg.model, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                      quantize=cfg.quantize, gradient_checkpointing=False, cache_dir=cfg.cache_dir,
                                      seed=cfg.seed)
    model.eval()
    out, sets, real = {}, (("seen", seen, args.seen_files), ("unseen", unseen, args.unseen_files)), models.generate_turn
    update_dtype = "bfloat16" if models.bf16_autocast(cfg.train_bf16, model) else str(model.dtype).split(".")[-1]
    for label in ("base", "base_format_controlled", "trained"):
        if label == "trained":
            models.load_adapter(model, sorted((run_dir / "checkpoints").glob("step_*"))[-1])
        t0 = time.time()
        for name, chosen, files in sets:
            try:
                if label == "base_format_controlled":
                    models.generate_turn = constrained_turn(chosen, [f.stem for f in files])
                episodes = play(model, tok, cfg, chosen, envs.derive_seed(args.seed, -1, "eval-sample", 0))
            finally:
                models.generate_turn = real
            out.setdefault(label, {})[name] = episodes
        print(f"{label}: {args.episodes} + {args.episodes} held-out episodes in {time.time() - t0:.0f} s", flush=True)
    for name, chosen, files in sets:
        scripted = play_scripted(cfg, tok, chosen, [f.stem for f in files], envs.derive_seed(args.seed, -1, "eval-script", 0))
        for policy, episodes in scripted.items():
            out.setdefault(policy, {})[name] = episodes
    return out, update_dtype


def train_config(train_flags: list[str], pool: str, run_dir: Path, seed: int):
    """The run's runs.Config: TRAIN, overridden by the train flags given (after `--`), on the pool folder."""
    flags = [f for f in train_flags if f != "--"]
    given = vars(cli.build_parser("train").parse_args(["train", *flags]))   # only the flags given
    explicit = {**TRAIN, **{k: v for k, v in given.items() if k != "command"}}
    cfg = cli.config_from_args({**explicit, "env_pool": pool, "out": str(run_dir), "seed": seed})
    cli.check_config(train, cfg)
    return cfg


def machine_text() -> str:
    """The CPU's model name, its cores and its bf16 (cli.machine)."""
    cores, bf16 = cli.machine()
    try:
        name = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        name = "unknown CPU"
    return f"{name}, {cores} cores, {cli.BF16_WORDS[bf16]}"


def figure(path: Path, records: list[dict], result: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    steps = [r["step"] for r in records]
    for key in CURVES[:6]:
        axes[0].plot(steps, [r.get(key) if r.get(key) is not None else np.nan for r in records], marker="o", label=key)
    axes[0].set(title="Training (unhinted plays, per step)", xlabel="step", ylim=(-0.05, 1.05))
    axes[0].legend(fontsize=8)
    for key in CURVES[6:]:
        axes[1].plot(steps, [r.get(key) if r.get(key) is not None else np.nan for r in records], marker="o", label=key)
    axes[1].set(title="Reply length (tokens)", xlabel="step")
    axes[1].legend(fontsize=8)
    x, labels = np.arange(2), [label for label, _ in arms_of(result["seen"])]
    width = 0.8 / len(labels)
    for k, label in enumerate(labels):
        got = [dict(arms_of(result[s]))[label] for s in ("seen", "unseen")]
        means = [a["mean_return"] for a in got]
        lo = [m - a["ci95"][0] for m, a in zip(means, got)]
        hi = [a["ci95"][1] - m for m, a in zip(means, got)]
        axes[2].bar(x - 0.4 + width * (k + 0.5), means, width, yerr=[lo, hi], capsize=2, label=label)
    axes[2].set_xticks(x, [f"seen (n={result['seen']['base']['n']})", f"unseen (n={result['unseen']['base']['n']})"])
    axes[2].set(title="Held-out seeds: mean return, 95% CI", ylim=(-0.05, 1.05))
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def arms_of(by_arm: dict) -> list[tuple[str, dict]]:
    """(label, arm) of every arm of a set, the model's first, then the scripted baselines."""
    return [("base", by_arm["base"]), ("trained", by_arm["trained"]), *by_arm["baselines"].items()]


def markdown(result: dict, records: list[dict]) -> str:
    lines = [f"# Learning: {result['steps']} self-play steps, base vs trained on held-out seeds", "",
             f"`{result['command']}` at commit {result['commit']}, {result['wall_s'] / 60:.1f} min wall "
             f"({result['load']}); {result.get('machine', 'machine not recorded')}, the update in "
             f"{result.get('update_dtype', 'a dtype not recorded')}.", "",
             "| set | arm | n | mean return | 95% CI | refuted repeats | echoes | first reply tokens | cut share |"
             " action share |", "|---|---|---|---|---|---|---|---|---|---|"]
    for s in ("seen", "unseen"):
        for label, a in arms_of(result[s]):
            lines.append(f"| {s} | {label} | {a['n']} | {a['mean_return']:.3f} | [{a['ci95'][0]:.3f}, {a['ci95'][1]:.3f}]"
                         f" | {a['refuted_repeat_share']} | {a['echo_share']} | {a['first_reply_tokens']} | "
                         f"{a['cut_share']} | {a['action_share']} |")
        for label, d in (("trained - base", result[s]), ("trained - random", result[s]["vs_random"])):
            lines.append(f"| {s} | {label} | | {d['diff']:+.3f} | [{d['diff_ci95'][0]:+.3f}, "
                         f"{d['diff_ci95'][1]:+.3f}] (paired) | | | | | |")
        norm = result[s]["normalised"]
        if norm["score"] is not None:
            lines.append(f"| {s} | (trained - random) / (oracle - random) | | {norm['score']:+.3f} | "
                         f"[{norm['ci95'][0]:+.3f}, {norm['ci95'][1]:+.3f}] | | | | | |")
    labels = [label for label, _ in arms_of(result["seen"])]
    lines += ["", "Mean return by game:", "", "| game | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for s in ("seen", "unseen"):
        for game, by_arm in result[s]["by_game"].items():
            lines.append(f"| {game} ({s}) | " + " | ".join(f"{by_arm[label]:.3f}" for label in labels) + " |")
    lines += ["", f"Seen: {', '.join(result['seen_envs'])}; unseen: {', '.join(result['unseen_envs'])}.", "",
              "| step | " + " | ".join(CURVES) + " |", "|---|" + "---|" * len(CURVES)]
    for r in records:
        lines.append(f"| {r['step']} | " + " | ".join("-" if r.get(k) is None else f"{r[k]:.3g}" for k in CURVES) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seen", default="cups,doors", help="examples/ environments to train on (comma-separated)")
    ap.add_argument("--unseen", default=str(ROOT / "bench" / "heldout"), help="folder of environments kept out of training")
    ap.add_argument("--episodes", type=int, default=200, help="held-out episodes per arm and set")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--load", default="idle machine", help="what else ran (said in learning.md)")
    ap.add_argument("train_flags", nargs=argparse.REMAINDER, help="-- then train flags overriding TRAIN")
    args = ap.parse_args()
    t_start = time.time()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()   # at the start: the code that runs (a commit may land meanwhile)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "learning_run"
    shutil.rmtree(run_dir, ignore_errors=True)
    seen_files = [ROOT / "examples" / f"{name}.py" for name in args.seen.split(",")]
    unseen_files = sorted(Path(args.unseen).glob("*.py"))
    args.seen_files, args.unseen_files = seen_files, unseen_files
    unknown = [f.stem for f in seen_files + unseen_files if f.stem not in VALID]
    if unknown:   # before an hour of training: the scripted baselines need each game's valid actions
        sys.exit(f"bench/learning.py: no valid-action list for {', '.join(unknown)} (add it to VALID)")
    with tempfile.TemporaryDirectory() as pool:
        for f in seen_files:
            shutil.copy(f, pool)
        cfg = train_config(args.train_flags, pool, run_dir, args.seed)
        train.train(cfg)
        t_train = time.time() - t_start
        seen = specs(seen_files, args.episodes, args.seed, "heldout-seen", cfg.agent_prompt, cfg.agent_reply_prefix)
        unseen = specs(unseen_files, args.episodes, args.seed, "heldout-unseen", cfg.agent_prompt, cfg.agent_reply_prefix)
        assert not {s.seed for s in seen + unseen} & training_seeds(cfg), "a held-out seed was played in training"
        played, update_dtype = evaluate_arms(cfg, run_dir, seen, unseen, args)
        keep_distinct_programs(run_dir)   # 60 copies of two programs otherwise
    rng = np.random.default_rng(args.seed)
    result = {"steps": cfg.steps, "wall_s": round(time.time() - t_start, 1), "train_s": round(t_train, 1),
              "commit": commit,
              "command": shlex.join(["python", "bench/learning.py", *sys.argv[1:]]), "load": args.load,
              "seen_envs": [f.stem for f in seen_files], "unseen_envs": [f.stem for f in unseen_files],
              "config": {k: getattr(cfg, k) for k in ("model", "steps", "envs_per_step", "plays", "max_turns", "lr",
                                                       "agent_max_new_tokens", "agent_max_episode_tokens", "temperature",
                                                       "agent_reply_prefix", "generate_bf16", "train_bf16")},
              # what --train-bf16 auto resolved to here: the update's dtype, and the machine that decided it (two
              # machines give different adapters when one updates in bf16 and the other in fp32)
              "update_dtype": update_dtype, "machine": machine_text(),
              **{s: compare({label: by_set[s] for label, by_set in played.items()}, rng,
                            [files[c.key[0]].stem for c in chosen])
                 for s, chosen, files in (("seen", seen, seen_files), ("unseen", unseen, unseen_files))}}
    records = report.load_run(run_dir)[1]
    (out / "learning.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "learning.md").write_text(markdown(result, records))
    figure(out / "learning.png", records, result)
    for s in ("seen", "unseen"):
        print(f"{s}: base {result[s]['base']['mean_return']:.3f} -> trained {result[s]['trained']['mean_return']:.3f}, "
              f"diff {result[s]['diff']:+.3f} CI95 {result[s]['diff_ci95']}")
    print(f"wall_s: {result['wall_s']}")


def keep_distinct_programs(run_dir: Path) -> list[Path]:
    """The run's envs/step_*/ hold a copy of each environment's program per step (with regen_interval 1 and a
    fixed pool: 30 copies of the same two files) and a .json of its scores, which samples.jsonl's "env" records
    also hold. Kept: one copy per distinct program, as envs/<name>.py, and a README in envs/ saying at which steps
    each was played and how the per-step folders are regenerated. -> the kept programs."""
    folders = sorted((run_dir / "envs").glob("step_*"))
    first: dict[str, tuple[str, list[int]]] = {}   # program text -> (kept name, steps)
    for folder in folders:
        step = int(folder.name.split("_")[1])
        for program in sorted(folder.glob("env_*.py")):
            text = program.read_text()
            name = program.stem.split("_", 3)[3]   # env_<step>_<slot>_<name>
            taken = {kept for kept, _ in first.values()}
            kept = first.get(text, (name if name not in taken else f"{name}_{len(taken)}", []))
            first[text] = (kept[0], kept[1] + [step])
    for text, (name, _) in first.items():
        (run_dir / "envs" / f"{name}.py").write_text(text)
    for folder in folders:
        shutil.rmtree(folder)
    lines = ["# The environments of this run, one copy per distinct program", "",
             "The training loop writes each environment's program and scores into `envs/step_NNNNN/` at every "
             "step; most of those files repeat the same programs, so one copy of each distinct program is kept "
             'here, and each step\'s scores are the `"kind": "env"` records of `../samples.jsonl`. To regenerate '
             "the per-step folders, run `python bench/learning.py` and skip its last reduction step "
             "(`keep_distinct_programs`), or run `spade-mini train --env-pool` on these programs.", "",
             "| program | played at steps |", "|---|---|"]
    lines += [f"| `{name}.py` | {', '.join(map(str, steps))} |" for name, steps in first.values()]
    (run_dir / "envs" / "README.md").write_text("\n".join(lines) + "\n")
    return [run_dir / "envs" / f"{name}.py" for name, _ in first.values()]


if __name__ == "__main__":
    main()

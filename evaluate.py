"""Held-out evaluation: is the model getting better at reasoning it never trained on?

Self-play trains only on environments the model wrote itself, so its progress must be measured elsewhere. Two
measurements, both deterministic for a given checkpoint (greedy decoding, explicit seeds):

1. reasoning-gym (the paper's largest gain, +14-18): a fixed, seeded set of procedurally generated problems
   from four categories, `limit` items each. Each question is asked once in the agent's format ("put your
   final answer within \\boxed{}"); the answer is the first boxed content, scored by reasoning-gym's own
   `score_answer` (1 = correct; some generators give partial credit; no boxed answer = 0). The overall score
   is the mean of the category means, so every category weighs the same. reasoning-gym generates offline;
   item i of a dataset depends only on (seed, i), so `--limit 20` is a prefix of `--limit 50`.
2. environment pool: a folder of held-out environments (*.py) played by the agent exactly as in training
   (spade_mini.play, no hint), `plays` seeds each; win rate = share of plays with return > 0 (the memory's
   definition). Programs that fail envs.validate are skipped and listed.

Entry points: `evaluate` and `pool_win_rate` (a loaded model), `eval_metrics` (flat `eval/...` keys for
metrics.jsonl, used by `train --eval-every K`), `eval_main` (`spade-mini eval`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import reasoning_gym

import envs
import spade_mini
from sandbox import Limits

# category -> reasoning-gym generator, each with reasoning-gym 0.1.25's default configuration. Chosen because
# they generate offline in milliseconds and have short answers that fit in \boxed{} (propositional_logic and
# rush_hour fail to generate in 0.1.25; tower_of_hanoi's answers run to dozens of lines).
CATEGORIES = {
    "arithmetic": "basic_arithmetic",   # "Calculate ( -6 + -77 - 8 + -38 )."
    "algorithmic": "word_sorting",      # sort words by ASCII order, answer a comma-separated list
    "logic": "syllogism",               # does the conclusion follow? Yes / No
    "games": "maze",                    # minimum number of steps through an ASCII maze
}
INSTRUCTION = "\n\nPlease reason step by step, and put your final answer within \\boxed{}."


class EvalError(ValueError):
    """A problem with the command line or its inputs; printed as one line, not a traceback."""


@dataclass(frozen=True)
class Item:
    category: str
    dataset: str      # reasoning-gym generator name (its score_answer scores the item)
    index: int        # position in the seeded dataset
    entry: dict       # reasoning-gym's item: question, answer, metadata (score_answer needs all three)

    @property
    def prompt(self) -> str:
        return self.entry["question"] + INSTRUCTION


# -----------------------------------------------------------------------------------------------------------
# the item set and its scoring (no model needed)

def eval_items(limit: int, seed: int, categories: dict[str, str] = CATEGORIES) -> list[Item]:
    """`limit` items per category from reasoning-gym's generators, all seeded with `seed`; same seed, same set."""
    if limit < 1:
        raise EvalError(f"--limit must be >= 1 (got {limit})")
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


def summarize(items: list[Item], scores: list[float]) -> dict:
    """Mean per category, then the unweighted mean over categories."""
    per: dict[str, list[float]] = {}
    for item, s in zip(items, scores):
        per.setdefault(item.category, []).append(s)
    categories = {c: sum(v) / len(v) for c, v in per.items()}
    return {"score": sum(categories.values()) / len(categories) if categories else 0.0, "categories": categories}


# -----------------------------------------------------------------------------------------------------------
# with a model

def evaluate(model, tok, *, limit: int, seed: int = 0, max_new_tokens: int = 256, batch_size: int = 16,
             categories: dict[str, str] = CATEGORIES, progress: bool = False) -> dict:
    """Answer every item greedily, in batches of similar length; returns {"score", "categories", "answered"
    (share with a boxed answer), "n", "eval_s", "items" (per item: category, index, answer, expected, score,
    completion)}."""
    t0 = time.time()
    items = eval_items(limit, seed, categories)
    prompts = [spade_mini.chat_ids(tok, item.prompt) for item in items]
    # similar lengths share a batch: less left padding, and the order is fixed, so results are reproducible
    order = sorted(range(len(items)), key=lambda i: (len(prompts[i]), i))
    texts: list[str] = [""] * len(items)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        outs = spade_mini.generate(model, tok, [prompts[i] for i in chunk], max_new_tokens=max_new_tokens,
                                   temperature=0.0, top_p=1.0, top_k=0, seed=seed)  # temperature 0 = greedy
        for i, out in zip(chunk, outs):
            texts[i] = out.text
        if progress:  # stderr: with --json, stdout's last line must stay the result
            print(f"eval: {start + len(chunk)}/{len(items)} answered ({time.time() - t0:.0f}s)", file=sys.stderr,
                  flush=True)
    scores = [score_item(item, text) for item, text in zip(items, texts)]
    details = [{"category": it.category, "index": it.index, "answer": extract_answer(t),
                "expected": it.entry["answer"], "score": s, "completion": t} for it, t, s in zip(items, texts, scores)]
    return {**summarize(items, scores), "answered": sum(d["answer"] is not None for d in details) / len(items),
            "n": len(items), "eval_s": round(time.time() - t0, 2), "items": details}


def load_env_folder(folder: str | Path, max_turns: int, limits: Limits) -> tuple[list[tuple[str, str]], dict]:
    """(valid (name, code) pairs sorted by name, {name: rejection reason}) of every *.py in the folder."""
    files = sorted(Path(folder).glob("*.py"))
    if not files:
        raise EvalError(f"--env-pool: no *.py files in {folder}")
    codes = [f.read_text(errors="replace") for f in files]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:  # each check is its own process
        verdicts = list(pool.map(lambda c: envs.validate(c, limits, max_turns=max_turns), codes))
    valid = [(f.stem, c) for f, c, v in zip(files, codes, verdicts) if v.valid]
    return valid, {f.stem: v.reason for f, v in zip(files, verdicts) if not v.valid}


def pool_win_rate(model, tok, folder: str | Path, *, plays: int = 4, seed: int = 0, max_turns: int = 12,
                  max_new_tokens: int = 256, max_episode_tokens: int = 2048, limits: Limits = Limits()) -> dict:
    """Play every valid environment of `folder` `plays` times without a hint (greedy; the plays differ by
    environment seed). Returns {"pool_win_rate", "pool_return", "pool_envs": {name: win rate}, "pool_skipped"}."""
    t0 = time.time()
    pool, skipped = load_env_folder(folder, max_turns, limits)
    specs = [spade_mini.EpisodeSpec(code, envs.derive_seed(seed, 0, "eval-pool", j * 1000 + i), None, (name, i))
             for j, (name, code) in enumerate(pool) for i in range(plays)]
    episodes = spade_mini.play(model, tok, specs, max_turns=max_turns, max_new_tokens=max_new_tokens,
                               max_episode_tokens=max_episode_tokens, temperature=0.0, top_p=1.0, top_k=0,
                               seed=seed, limits=limits) if specs else []
    wins: dict[str, list[float]] = {}
    for ep in episodes:
        wins.setdefault(ep.spec.key[0], []).append(float(ep.reward > 0))
    return {"pool_win_rate": sum(float(ep.reward > 0) for ep in episodes) / len(episodes) if episodes else None,
            "pool_return": sum(ep.reward for ep in episodes) / len(episodes) if episodes else None,
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
# loading what to evaluate: a preset's base model, an adapter checkpoint, or a run's latest checkpoint

def resolve(args: argparse.Namespace) -> tuple[str, Path | None, dict]:
    """(model name, adapter dir or None, load_model keyword arguments) from --preset/--model/--adapter/--run;
    also fills in the default --max-new-tokens from the preset."""
    import train  # note: imported here, not at the top: train imports this module lazily for --eval-every

    if args.preset not in train.PRESETS:
        raise EvalError(f"unknown preset {args.preset!r}; choose one of {', '.join(train.PRESETS)}")
    cfg = train.Config(**train.PRESETS[args.preset])
    name, lora, adapter = args.model or cfg.model, {"r": cfg.lora_r, "lora_alpha": cfg.lora_alpha}, None
    if args.run:
        run = Path(args.run)
        if not (run / "config.json").exists():
            raise EvalError(f"--run: {run} has no config.json (not a spade-mini run directory)")
        saved = json.loads((run / "config.json").read_text())
        adapter = train.Run(run).latest_checkpoint()  # the newest step_NNNNN whose state.json exists
        if adapter is None:
            raise EvalError(f"--run: {run} has no complete checkpoint (checkpoints/step_*/state.json)")
        name = args.model or saved["model"]
    elif args.adapter:
        adapter = Path(args.adapter)
    if adapter is not None:
        if not (adapter / "adapter_model.safetensors").exists():
            raise EvalError(f"{adapter}: no adapter_model.safetensors (not a peft adapter directory)")
        saved_lora = json.loads((adapter / "adapter_config.json").read_text())  # the rank must match the weights
        lora = {k: saved_lora[k] for k in lora}
    kwargs = dict(lora_r=lora["r"], lora_alpha=lora["lora_alpha"], lora_dropout=0.0, quantize=args.quantize,
                  gradient_checkpointing=False, cache_dir=os.path.expanduser(args.cache_dir), seed=args.seed)
    if not args.max_new_tokens:  # the preset knows how long its model's answers run (tiny: 128)
        args.max_new_tokens = max(128, 2 * cfg.agent_max_new_tokens)
    return name, adapter, kwargs


def load_for_eval(name: str, adapter: Path | None, kwargs: dict, merge: bool = True):
    """The base model with a zero LoRA (its output is the base model's), then the adapter's weights if any.
    merge: fold the LoRA into the weights (generation ~1.8x faster on CPU); not for 4-bit weights (lossy)."""
    model, tok, info = spade_mini.load_model(name, **kwargs)
    if adapter is not None:
        try:
            spade_mini.load_adapter(model, adapter)
        except ValueError as err:  # subtle: a silently ignored adapter would evaluate the base model
            raise EvalError(f"{err} ({name})") from err
    if merge and not info.get("quantized"):
        model = model.merge_and_unload()
    return model, tok


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spade-mini eval", description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="tiny", help="preset whose model (and LoRA shape) to evaluate")
    p.add_argument("--model", default="", help="model name or path (overrides the preset's / the run's)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--adapter", default="", help="a checkpoint dir holding adapter_model.safetensors (peft)")
    source.add_argument("--run", default="", help="a run directory: evaluate its latest checkpoint")
    p.add_argument("--limit", type=int, default=20, help="items PER CATEGORY (4 categories: 4 x limit items)")
    p.add_argument("--seed", type=int, default=0, help="seed of the item set and of the pool's episodes")
    p.add_argument("--max-new-tokens", type=int, default=0,
                   help="tokens per answer / per agent turn (0: twice the preset's agent_max_new_tokens, min 128)")
    p.add_argument("--batch-size", type=int, default=16, help="questions per generate call")
    p.add_argument("--env-pool", default="", help="folder of held-out *.py environments to score by win rate")
    p.add_argument("--pool-plays", type=int, default=4, help="plays per pool environment (different seeds)")
    p.add_argument("--max-turns", type=int, default=12, help="turn cap for pool episodes")
    p.add_argument("--quantize", default="auto", choices=("auto", "none", "nf4"), help="as in train")
    p.add_argument("--cache-dir", default="~/.cache/spade-mini", help="converted model weights")
    p.add_argument("--save", default="", help="also write the full result (every item's answer) to this file")
    p.add_argument("--json", action="store_true", help="last stdout line is the result as one JSON object")
    return p


def eval_main(argv: list[str] | None = None) -> int:
    """`spade-mini eval`: prints one line per category, and with --json the result as the last stdout line."""
    args = build_parser().parse_args(argv)
    try:
        if args.env_pool and not Path(args.env_pool).is_dir():
            raise EvalError(f"--env-pool: {args.env_pool} is not a directory")
        name, adapter, kwargs = resolve(args)
        model, tok = load_for_eval(name, adapter, kwargs)
        result = evaluate(model, tok, limit=args.limit, seed=args.seed, max_new_tokens=args.max_new_tokens,
                          batch_size=args.batch_size, progress=True)
        if args.env_pool:
            result.update(pool_win_rate(model, tok, args.env_pool, plays=args.pool_plays, seed=args.seed,
                                        max_turns=args.max_turns, max_new_tokens=args.max_new_tokens))
    except (EvalError, FileNotFoundError) as err:
        print(f"spade-mini: error: {err}", file=sys.stderr)
        return 2
    result.update(model=name, adapter=str(adapter) if adapter else None, limit=args.limit, seed=args.seed)
    if args.save:
        envs.write_atomic(args.save, json.dumps(result, indent=2) + "\n")
    for category, s in result["categories"].items():
        print(f"{category:>12} {s:.3f}  ({CATEGORIES[category]}, {args.limit} items)")
    print(f"{'overall':>12} {result['score']:.3f}  (answered in \\boxed{{}}: {result['answered']:.0%})")
    if result.get("pool_win_rate") is not None:
        print(f"{'env pool':>12} {result['pool_win_rate']:.3f} win rate over {len(result['pool_envs'])} envs")
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "items"}))
    return 0


if __name__ == "__main__":
    sys.exit(eval_main())

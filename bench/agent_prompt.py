"""How does a model reply to the agent's turn-1 message? Plays each environment N times and prints, per game, the
mean return and the reply behaviour (tokens of the first reply and of all replies, cut share, action share).

    python bench/agent_prompt.py --prompt agent.txt --max-new-tokens 128        # the paper's message
    python bench/agent_prompt.py --prompt agent_brief.txt --max-new-tokens 96   # the tiny preset's

The same seeds for every prompt (1000 + k), sampled at the tiny preset's temperature; no training.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import models  # noqa: E402
import runs  # noqa: E402
import spade_mini  # noqa: E402
import train  # noqa: E402

GAMES = "examples/cups.py,examples/guess.py,examples/pair_sum.py,examples/sequence.py,examples/doors.py," \
        "bench/heldout/largest.py"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompt", default="agent.txt", help="a prompts/ file with {obs}")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--plays", type=int, default=8)
    ap.add_argument("--games", default=GAMES, help="comma-separated environment files")
    ap.add_argument("--generate-bf16", default="off", choices=("auto", "on", "off"),
                    help="decode from bf16 weight copies (train's --generate-bf16)")
    args = ap.parse_args()
    cfg = runs.Config(**runs.PRESETS["tiny"])
    model, tok, _ = models.load_model(args.model, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                      quantize="none", gradient_checkpointing=False, cache_dir=cfg.cache_dir, seed=0)
    files = [ROOT / f for f in args.games.split(",")]
    specs = [spade_mini.EpisodeSpec(f.read_text(), 1000 + k, None, (j,), args.prompt)
             for j, f in enumerate(files) for k in range(args.plays)]
    t0 = time.time()
    episodes = spade_mini.play(model, tok, specs, max_turns=args.turns, max_new_tokens=args.max_new_tokens,
                               max_episode_tokens=args.max_new_tokens * args.turns, temperature=cfg.temperature,
                               top_p=cfg.top_p, top_k=cfg.top_k, seed=0, limits=train.limits_of(cfg),
                               bf16=models.bf16_autocast(args.generate_bf16, model))
    print(f"wall_s: {time.time() - t0:.1f}")
    for j, f in enumerate(files):
        mine = [ep for ep in episodes if ep.spec.key[0] == j]
        stats = {k.split("/")[1]: round(v, 2) for k, v in runs.reply_stats(mine).items() if v is not None}
        print(f"{f.stem}: return {sum(ep.episode_return for ep in mine) / len(mine):.3f} {stats}")


if __name__ == "__main__":
    main()

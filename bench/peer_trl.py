"""A peer trainer side by side: the learning bench's task trained by spade-mini's loop and by TRL's GRPOTrainer.

One process runs, one after the other on the same machine:

    (a) spade-mini: `train.train` with bench/learning.py's settings (TRAIN: SmolLM2-135M, cups and doors from
        examples/, 3 turns, the `\\boxed{` reply prefix, 2 environments x 16 plays a step, lr 1e-3, 30 steps);
    (b) TRL: `trl.GRPOTrainer` (1.16) on the same model and LoRA shape (models.load_model), the same lr, steps,
        16 completions of each of the 2 games a step, the same sampling (temperature, top-p, top-k) and token
        limits, and the same environment seeds at every step;

then plays the learning bench's held-out seeds (seen: cups and doors; unseen: bench/heldout/) with the base
model, both trained adapters and the scripted arms (random-valid, oracle ...) through bench/learning.py's own
play and statistics. Environments run in the sandbox only, in both arms: the TRL arm's episodes are played by
the same spade_mini.play (envs.open_env behind it), never in this process.

What TRL is given, and what it cannot express (said again in the JSON's "trl_changes"):
  * multi-turn: GRPOTrainer's `rollout_func` hook (experimental in 1.16). Its tool-calling path
    (`environment_factory`) needs the model to emit chat-template tool calls, which SmolLM2-135M does not, and
    has no place for a reply prefix; so the rollout is spade_mini.play, and TRL gets each episode as prompt ids
    (the rendered first message, ending in the prefix) and completion ids (replies and observations, with
    `env_mask` 0 on the observations, so they are attended to but not trained), and the episode's return as the
    reward. TRL's own generation (`_generate_single_turn`) is not used: the rollout part is the same code in
    both arms, and the comparison is of the rest (scoring, the update and the trainer's overhead).
  * the reply prefix: in the prompt, as in spade-mini (not trained, not counted as a completion token).
  * the advantage: TRL's group z-score uses the sample std plus 1e-4 (spade-mini: population std plus 1e-8);
    a group whose returns all tie gets advantage 0 in TRL but still counts in the loss's mean over the batch,
    where spade-mini drops it (its step is then larger by 32 / the plays kept; AdamW mostly normalises it).
  * the loss: loss_type "grpo" (per-sample token mean, then the batch mean), beta 0, epsilon 0.2 / 0.28, one
    optimizer step per generation batch (the ratio is 1, as spade-mini's K = 1); no TIS against the sampler's
    log-probs (TRL corrects only vLLM's), which spade-mini applies (w = 1 here up to rounding: fp32 sampling).
  * micro-batches: TRL accumulates gradients over micro-batches of a fixed number of episodes
    (--trl-micro-batch, 16: 2 a step of 32, one generation and one optimizer step per step, so no old
    log-prob pass), spade-mini over micro-batches of at most 2,048 tokens (--token-budget), about 16 of these
    episodes. On the CPU TRL's fused LM head (no Triton) projects every position of a micro-batch, prompt
    included, tile by tile, and keeps the entropy: with all 32 episodes in one micro-batch its peak RSS passed
    5 GiB in the dry run.
  * the optimizer: TRL's AdamW (weight decay set to torch's 0.01, constant lr, no warmup), clip at 1.0; the
    update under bf16 autocast when spade-mini's --train-bf16 auto picks it (accelerate's CPU autocast).

Measured for each arm: wall per step split into rollout (the plays: generation and the sandbox), update
(spade-mini's update phase; TRL's step less its generate-and-score) and other (the rest of the step: spade-mini's
design/hint/score phases, TRL's rewards, advantages and bookkeeping); the arm's setup (model load, trainer
construction) apart; peak resident memory of this process while the arm ran (sampled every 50 ms; the sandbox's
processes not included; the arm that runs second starts with the first's freed heap, so --trl-first swaps
them to check), and how far it rose over the arm; generated tokens per second of rollout and processed tokens (prompt + completion, no
padding) per second of update. Printed as `name: spade-mini | trl | trl/spade-mini` lines.

    python bench/peer_trl.py --keep          # the kept run: bench/results/peer_trl.json (idle machine)
    python bench/peer_trl.py --quick         # a dry run: 2 steps of 2 x 4 plays, 8 held-out episodes per set
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import envs  # noqa: E402
import learning  # noqa: E402  (bench/learning.py: its settings, held-out specs, play and statistics)
import models  # noqa: E402
import report  # noqa: E402
import spade_mini  # noqa: E402
import train  # noqa: E402

QUICK = dict(steps=2, plays=4, episodes=8, trl_micro_batch=4)
TRL_VERSION = "1.16.0"


class PeakRSS:
    """The highest resident set size of this process while the block ran (MiB), polled from /proc/self/status."""

    def __init__(self, every: float = 0.05):
        self.every, self.peak, self.start, self._stop = every, 0.0, 0.0, threading.Event()

    @staticmethod
    def now() -> float:
        try:
            line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS:"))
            return int(line.split()[1]) / 1024
        except (OSError, StopIteration):
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def _poll(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, self.now())

    def __enter__(self):
        self.start = self.peak = self.now()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def lora_b_norm(state: dict) -> float:
    """The L2 norm of every lora_B matrix (they start at zero, so > 0 means the adapter was trained)."""
    return float(sum(float((v.float() ** 2).sum()) for k, v in state.items() if "lora_B" in k) ** 0.5)


def adapter_norm(folder: Path) -> float:
    from safetensors.torch import load_file
    return lora_b_norm(load_file(folder / "adapter_model.safetensors"))


def summarise(steps: list[dict], setup_s: float, rss: PeakRSS, generated: int, processed: int,
              returns: list[float], b_norm: float) -> dict:
    """One arm's numbers from its per-step {step_s, rollout_s, update_s} records."""
    mean = lambda key: float(np.mean([s[key] for s in steps]))   # noqa: E731
    rollout, update = sum(s["rollout_s"] for s in steps), sum(s["update_s"] for s in steps)
    return {"steps": len(steps), "step_s": round(mean("step_s"), 3), "rollout_s": round(mean("rollout_s"), 3),
            "update_s": round(mean("update_s"), 3),
            "other_s": round(mean("step_s") - mean("rollout_s") - mean("update_s"), 3),
            "first_step_s": round(steps[0]["step_s"], 3), "setup_s": round(setup_s, 1),
            "peak_rss_mb": round(rss.peak), "rss_at_start_mb": round(rss.start),
            "rss_rise_mb": round(rss.peak - rss.start),
            "generated_tokens": int(generated), "generated_tok_per_s": round(generated / max(rollout, 1e-9), 1),
            "processed_tokens": int(processed), "update_tok_per_s": round(processed / max(update, 1e-9), 1),
            "train_return_by_step": [round(r, 4) for r in returns], "lora_b_norm": round(b_norm, 6)}


def spade_mini_arm(cfg, run_dir: Path) -> tuple[dict, Path]:
    """bench/learning.py's training, exactly (train.train on its config) -> (numbers, the last checkpoint)."""
    t0 = time.time()
    with PeakRSS() as rss:
        train.train(cfg)
    wall = time.time() - t0
    records = [r for r in report.load_run(run_dir)[1] if r.get("step", -1) >= 0]
    steps = [{"step_s": r["perf/step_s"], "rollout_s": r["perf/play_s"], "update_s": r["perf/update_s"]}
             for r in records]
    generated = sum(r.get("perf/generate_tok_per_s", 0.0) * r.get("perf/generate_s", 0.0) for r in records)
    processed = sum(r.get("loss/processed_tokens") or 0 for r in records)
    ckpt = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    out = summarise(steps, wall - sum(s["step_s"] for s in steps), rss, round(generated), processed,
                    [r.get("agent/return_nohint") or 0.0 for r in records], adapter_norm(ckpt))
    out["train_wall_s"] = round(wall, 1)
    return out, ckpt


def trl_arm(cfg, seen_files: list[Path], adapter_dir: Path, micro_batch: int) -> dict:
    """The same task through trl.GRPOTrainer, its rollout spade_mini.play (rollout_func) -> numbers; the trained
    adapter saved in adapter_dir (peft format, as models.load_adapter reads)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")   # rollout_func is experimental in 1.16: said above
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    # transformers 5.25 renamed gradient_checkpointing (a deprecated alias now, a FutureWarning); 5.24 has the old name
    checkpointing = next((name for name in ("activation_checkpointing", "gradient_checkpointing")
                          if name in {f.name for f in dataclasses.fields(GRPOConfig)}), "gradient_checkpointing")

    t0 = time.time()
    rss = PeakRSS().__enter__()
    model, tok, _ = models.load_model(cfg.model, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha,
                                      lora_dropout=cfg.lora_dropout, quantize=cfg.quantize,
                                      gradient_checkpointing=cfg.gradient_checkpointing, cache_dir=cfg.cache_dir,
                                      seed=cfg.seed)
    codes = {f.stem: f.read_text() for f in seen_files}
    names = list(codes)
    clock: dict = {"steps": [], "rollout_s": 0.0, "score_s": 0.0, "generated": 0, "processed": 0, "returns": []}

    def rollout(prompts: list, trainer) -> dict:
        """Each prompt names a game; play i of game j at step s takes train.play_all's seed (s, j * 1000 + i)."""
        step, seen_count, specs = trainer.state.global_step, {}, []
        for name in prompts:
            i = seen_count[name] = seen_count.get(name, -1) + 1
            j = names.index(name)
            specs.append(spade_mini.EpisodeSpec(codes[name], envs.derive_seed(cfg.seed, step, "env", j * 1000 + i),
                                                None, (j, False, i), cfg.agent_prompt, cfg.agent_reply_prefix))
        t, stats = time.time(), {}
        eps = spade_mini.play(trainer.model, tok, specs, max_turns=cfg.max_turns,
                              max_new_tokens=cfg.agent_max_new_tokens,
                              max_episode_tokens=cfg.agent_max_episode_tokens,
                              max_observation_tokens=cfg.agent_max_observation_tokens, limits=train.limits_of(cfg),
                              seed=envs.derive_seed(cfg.seed, step, "agent", 0), stats=stats,
                              **train.sample_kwargs(cfg, trainer.model))
        clock["rollout_s"] += time.time() - t
        clock["generated"] += stats.get("generated_tokens", 0)
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "episode_return": []}
        for ep in eps:
            cut = ep.prompt_len or len(ep.token_ids)
            done = ep.token_ids[cut:] or [tok.eos_token_id]   # a play that failed to start: one untrained token
            mask = ep.loss_mask[cut:] or [0]
            out["prompt_ids"].append(ep.token_ids[:cut])
            out["completion_ids"].append(done)
            out["env_mask"].append(mask)
            out["logprobs"].append((ep.rollout_logprobs or [0.0] * len(ep.token_ids))[cut:] or [0.0])
            out["episode_return"].append(float(ep.episode_return))
            clock["processed"] += cut + len(done)   # what the update's forward and backward go through, no padding
        clock["returns"].append(float(np.mean(out["episode_return"])))
        return out

    def episode_return(prompts, completions, episode_return, **kwargs) -> list[float]:
        return list(episode_return)

    bf16 = models.bf16_autocast(cfg.train_bf16, model)
    per_step = cfg.envs_per_step * cfg.plays
    micro = min(micro_batch, per_step)
    if per_step % micro:
        raise SystemExit(f"--trl-micro-batch {micro_batch} does not divide the {per_step} episodes of a step")
    args = GRPOConfig(
        output_dir=str(adapter_dir.parent / "trl_out"), max_steps=cfg.steps, learning_rate=cfg.lr,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.01, max_grad_norm=cfg.max_grad_norm,
        per_device_train_batch_size=micro, gradient_accumulation_steps=per_step // micro,
        steps_per_generation=per_step // micro,
        num_generations=cfg.plays, num_iterations=1, temperature=cfg.temperature, top_p=cfg.top_p,
        top_k=cfg.top_k, max_completion_length=cfg.agent_max_episode_tokens, beta=0.0, epsilon=cfg.clip_low,
        epsilon_high=cfg.clip_high, loss_type="grpo", scale_rewards="group", shuffle_dataset=False,
        bf16=bf16, use_cpu=model.device.type == "cpu",
        seed=cfg.seed, data_seed=cfg.seed, logging_steps=1, save_strategy="no", report_to="none",
        disable_tqdm=True, dataloader_num_workers=0, **{checkpointing: cfg.gradient_checkpointing})
    dataset = Dataset.from_dict({"prompt": names[: cfg.envs_per_step]})

    class Steps(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock["t"], clock["r0"], clock["s0"] = time.time(), clock["rollout_s"], clock["score_s"]

        def on_step_end(self, args, state, control, **kwargs):
            step_s = time.time() - clock["t"]
            rollout_s, score_s = clock["rollout_s"] - clock["r0"], clock["score_s"] - clock["s0"]
            clock["steps"].append({"step_s": step_s, "rollout_s": rollout_s, "update_s": step_s - score_s})

    trainer = GRPOTrainer(model=model, reward_funcs=episode_return, args=args, train_dataset=dataset,
                          processing_class=tok, rollout_func=rollout, callbacks=[Steps()])
    real = trainer._generate_and_score_completions

    def generate_and_score(inputs):   # timed: its time less the rollout's is the "other" part of TRL's step
        t = time.time()
        try:
            return real(inputs)
        finally:
            clock["score_s"] += time.time() - t
    trainer._generate_and_score_completions = generate_and_score
    setup = time.time() - t0
    trainer.train()
    trainer.model.save_pretrained(adapter_dir)
    rss.__exit__(None, None, None)
    wall = time.time() - t0
    out = summarise(clock["steps"], wall - sum(s["step_s"] for s in clock["steps"]), rss, clock["generated"],
                    clock["processed"], clock["returns"], adapter_norm(adapter_dir))
    out.update(train_wall_s=round(wall, 1), construct_s=round(setup, 1),
               update_dtype="bfloat16" if bf16 else str(model.dtype).split(".")[-1],
               loss_by_step=[round(h["loss"], 5) for h in trainer.state.log_history if "loss" in h])
    del trainer, model
    gc.collect()
    return out


def evaluate(cfg, adapters: dict, sets: list, seed: int) -> dict:
    """Every model arm (base: the adapter at zero, then each trained adapter) and the scripted arms on the held-out
    specs of each set, through bench/learning.py's play -> {arm: {set: episodes}}."""
    model, tok, _ = models.load_model(cfg.model, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                      quantize=cfg.quantize, gradient_checkpointing=False, cache_dir=cfg.cache_dir,
                                      seed=cfg.seed)
    model.eval()
    out: dict = {}
    for label, folder in adapters.items():
        if folder is not None:
            models.load_adapter(model, folder)
        t0 = time.time()
        for name, chosen, _ in sets:
            out.setdefault(label, {})[name] = learning.play(model, tok, cfg, chosen,
                                                            envs.derive_seed(seed, -1, "eval-sample", 0))
        print(f"{label}: {sum(len(c) for _, c, _ in sets)} held-out episodes in {time.time() - t0:.0f} s", flush=True)
    for name, chosen, files in sets:
        scripted = learning.play_scripted(cfg, tok, chosen, [f.stem for f in files],
                                          envs.derive_seed(seed, -1, "eval-script", 0))
        for policy, episodes in scripted.items():
            out.setdefault(policy, {})[name] = episodes
    return out


MODEL_ARMS = ("base", "spade_mini", "trl")
TABLE = [("wall per step (s)", "step_s"), ("  rollout (s)", "rollout_s"), ("  update (s)", "update_s"),
         ("  other (s)", "other_s"), ("first step (s)", "first_step_s"), ("setup (s)", "setup_s"),
         ("train wall (s)", "train_wall_s"), ("peak RSS (MiB)", "peak_rss_mb"),
         ("RSS rise over the arm (MiB)", "rss_rise_mb"),
         ("generated tokens", "generated_tokens"), ("generated tok/s (rollout)", "generated_tok_per_s"),
         ("processed tokens", "processed_tokens"), ("processed tok/s (update)", "update_tok_per_s"),
         ("adapter lora_B norm", "lora_b_norm")]


def table(result: dict) -> list[str]:
    """The side-by-side lines: `name: spade-mini | trl | trl/spade-mini`."""
    a, b = result["arms"]["spade_mini"], result["arms"]["trl"]
    lines = ["name: spade-mini | trl | trl/spade-mini"]
    for label, key in TABLE:
        ratio = result["ratios"].get(key)
        lines.append(f"{label}: {a[key]} | {b[key]} | {'-' if ratio is None else f'{ratio:.2f}'}")
    for s in result["sets"]:
        got = result[s]
        row = " | ".join(f"{got['arms'][k]['mean_return']:.3f} {got['arms'][k]['ci95']}" for k in ("spade_mini", "trl"))
        lines.append(f"held-out {s} mean return: {row} | trl - spade-mini {got['trl_minus_spade_mini']['diff']:+.3f} "
                     f"{got['trl_minus_spade_mini']['diff_ci95']} (paired)")
        lines.append(f"held-out {s} base / random-valid / oracle: {got['arms']['base']['mean_return']:.3f} / "
                     f"{got['arms']['random']['mean_return']:.3f} / {got['arms']['oracle']['mean_return']:.3f}")
        lines.append(f"held-out {s} trained - random-valid: " + " | ".join(
            f"{got['vs_random'][k]['diff']:+.3f} {got['vs_random'][k]['diff_ci95']}" for k in ("spade_mini", "trl")))
    return lines


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=learning.TRAIN["steps"], help="training steps of each arm")
    ap.add_argument("--plays", type=int, default=learning.TRAIN["plays"],
                    help="plays of each game per step (2 games: 2 x this many episodes a step)")
    ap.add_argument("--episodes", type=int, default=200, help="held-out episodes per arm and set (learning.py's)")
    ap.add_argument("--seen", default="cups,doors", help="examples/ games to train on")
    ap.add_argument("--unseen", default=str(ROOT / "bench" / "heldout"), help="folder of games kept out of training")
    ap.add_argument("--model", default=None, help="a models.load_model name (default: the tiny preset's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="a dry run: " + ", ".join(f"{k} {v}" for k, v in QUICK.items()))
    ap.add_argument("--keep", action="store_true", help="write the kept bench/results/peer_trl.json")
    ap.add_argument("--out", default=None, help="folder for peer_trl.json (default: a temp folder; --keep: "
                                               "bench/results)")
    ap.add_argument("--trl-micro-batch", type=int, default=16,
                    help="episodes per TRL micro-batch (spade-mini's: as many as fit its 2,048-token budget)")
    ap.add_argument("--trl-first", action="store_true", help="train the TRL arm first (an order check)")
    ap.add_argument("--load", default="idle machine", help="what else ran (said in the JSON)")
    args = ap.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            if getattr(args, k) == ap.get_default(k):
                setattr(args, k, v)
    import trl   # before an hour of the first arm: the second needs it
    if trl.__version__ != TRL_VERSION:
        print(f"note: trl {trl.__version__} here, written against {TRL_VERSION}", flush=True)
    t_start = time.time()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    out = Path(args.out or (ROOT / "bench" / "results" if args.keep else tempfile.mkdtemp(prefix="peer_trl_")))
    out.mkdir(parents=True, exist_ok=True)
    seen_files = [ROOT / "examples" / f"{name}.py" for name in args.seen.split(",")]
    unseen_files = sorted(Path(args.unseen).glob("*.py"))
    flags = ["--steps", str(args.steps), "--plays", str(args.plays), "--checkpoint-every", str(args.steps)]
    flags += ["--model", args.model] if args.model else []
    with tempfile.TemporaryDirectory() as work:
        work, pool = Path(work), Path(work) / "pool"
        pool.mkdir()
        for f in seen_files:
            shutil.copy(f, pool)
        cfg = learning.train_config(flags, str(pool), work / "spade_mini_run", args.seed)
        for name in (("trl", "spade_mini") if args.trl_first else ("spade_mini", "trl")):
            print(f"{name}: {cfg.steps} steps of {cfg.envs_per_step} x {cfg.plays} plays", flush=True)
            if name == "spade_mini":
                spade, ckpt = spade_mini_arm(cfg, work / "spade_mini_run")
            else:
                trl_numbers = trl_arm(cfg, seen_files, work / "trl_adapter", args.trl_micro_batch)
            gc.collect()
        seen = learning.specs(seen_files, args.episodes, args.seed, "heldout-seen", cfg.agent_prompt,
                              cfg.agent_reply_prefix)
        unseen = learning.specs(unseen_files, args.episodes, args.seed, "heldout-unseen", cfg.agent_prompt,
                                cfg.agent_reply_prefix)
        assert not {s.seed for s in seen + unseen} & learning.training_seeds(cfg), "a held-out seed was trained on"
        sets = [("seen", seen, seen_files), ("unseen", unseen, unseen_files)]
        played = evaluate(cfg, {"base": None, "spade_mini": ckpt, "trl": work / "trl_adapter"}, sets, args.seed)
    rng = np.random.default_rng(args.seed)
    arms = {"spade_mini": spade, "trl": trl_numbers}
    result = {"commit": commit, "command": shlex.join(["python", "bench/peer_trl.py", *(argv or sys.argv[1:])]),
              "load": args.load, "machine": learning.machine_text(), "trl": trl.__version__,
              "update_dtype": trl_numbers.pop("update_dtype"),   # both arms': the same cfg.train_bf16, model
              "config": {k: getattr(cfg, k) for k in ("model", "steps", "envs_per_step", "plays", "max_turns", "lr",
                                                       "lora_r", "lora_alpha", "agent_max_new_tokens",
                                                       "agent_max_episode_tokens", "temperature", "top_p", "top_k",
                                                       "agent_reply_prefix", "train_bf16", "seed")},
              "order": "trl first" if args.trl_first else "spade-mini first", "trl_micro_batch": args.trl_micro_batch, "held_out_episodes": args.episodes, "seen_envs": [f.stem for f in seen_files],
              "unseen_envs": [f.stem for f in unseen_files], "arms": arms,
              "ratios": {key: (round(arms["trl"][key] / arms["spade_mini"][key], 3)
                               if arms["spade_mini"].get(key) else None) for _, key in TABLE},
              "sets": [s for s, _, _ in sets], "trl_changes": trl_changes()}
    for s, chosen, files in sets:
        by_arm = {label: eps[s] for label, eps in played.items()}
        result[s] = {"arms": {k: learning.arm(by_arm[k], rng) for k in (*MODEL_ARMS, *learning.SCRIPTED)},
                     "trl_minus_spade_mini": learning.paired(by_arm["spade_mini"], by_arm["trl"], rng),
                     "vs_random": {k: learning.paired(by_arm["random"], by_arm[k], rng) for k in ("spade_mini", "trl")},
                     "normalised": {k: learning.normalised(by_arm[k], by_arm["random"], by_arm["oracle"], rng)
                                    for k in ("spade_mini", "trl")}}
    result["wall_s"] = round(time.time() - t_start, 1)
    (out / "peer_trl.json").write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join(table(result)))
    print(f"wall_s: {result['wall_s']}\nwrote {out / 'peer_trl.json'}", flush=True)
    return result


def trl_changes() -> list[str]:
    """The docstring's list of what TRL was given in place of what it cannot express, one entry a point."""
    part = __doc__.split("What TRL is given")[1].split("\n\nMeasured")[0]
    return [" ".join(item.split()) for item in part.split("\n  * ")[1:]]


if __name__ == "__main__":
    main()

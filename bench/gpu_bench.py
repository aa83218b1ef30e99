"""GPU figures in one run: decode ms/step (eager vs static-cache buckets vs the weight-bandwidth
bound) and the peak memory of one QLoRA step on an 8192-token sequence, on Qwen3-4B shapes with random
weights built from a config (nothing is downloaded).

The bound: one decode step must read every weight once, so ms/step >= weight bytes / memory bandwidth; the
bandwidth is measured here with a large device-to-device copy (bytes read + bytes written, per second).
Prints `name: value` lines as it goes, so a run cut short still reports what it measured.

    python bench/gpu_bench.py                     # on a CUDA machine, ~6-9 min (two compiles of 50-100 s)
    python bench/gpu_bench.py --shape tiny        # the same code path on a tiny config (runs on CPU too)
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Qwen3-4B(-Instruct-2507) geometry, from its published config.json
SHAPES = {
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                     max_position_embeddings=40960, rms_norm_eps=1e-6),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=1024, tie_word_embeddings=True,
                 max_position_embeddings=16384, rms_norm_eps=1e-6),
}


def report(name: str, value) -> None:
    print(f"{name}: {value}", flush=True)


def copy_bandwidth_gbs(device: str, gib: float = 2.0) -> float:
    import torch

    src = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    t = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    sync(device)
    return 2 * 10 * src.numel() / (time.perf_counter() - t) / 1e9  # read + write


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def build(shape: str, quantize: str, folder: str):
    """Random-weight model saved once, then loaded through spade_mini's own path (NF4 on CUDA) + LoRA."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    import models

    config = Qwen3Config(**SHAPES[shape], bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    device, dtype, quantized, reason = models._decide_device(quantize)
    with torch.device(device):
        AutoModelForCausalLM.from_config(config, dtype=dtype).save_pretrained(folder)
    torch.cuda.empty_cache() if device == "cuda" else None
    model = models._from_pretrained(folder, device, dtype, quantized, models._attention("auto", device))
    model = models.add_lora(model, lora_r=32, lora_alpha=64, lora_dropout=0.0, gradient_checkpointing=True)
    report("device", device)
    report("reason", reason)
    report("attn_implementation", model.config._attn_implementation)
    return model, device


def weight_bytes(model) -> int:
    """Bytes a decode step reads: every parameter and buffer (NF4 weights count as their packed bytes)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def decode_ms(model, tok, batch: int, prompt_len: int, steps: int, static: bool) -> float:
    """ms per decode step = (time for `steps` tokens - time for 1 token) / (steps - 1): the prefill cancels."""
    import models

    prompts = [[3 + (i * 7 + j) % 500 for j in range(prompt_len)] for i in range(batch)]
    device = model.device.type

    def timed(n: int) -> float:
        sync(device)
        t = time.perf_counter()
        models.generate(model, tok, prompts, max_new_tokens=n, temperature=0.0, top_p=1.0, top_k=0, seed=0,
                    static_cache=static)
        sync(device)
        return time.perf_counter() - t

    timed(steps)  # warm-up (static: the one-off compile for this bucket)
    return 1000 * (timed(steps) - timed(1)) / (steps - 1)


def qlora_step(model, seq_len: int) -> dict:
    import torch

    import spade_mini as sm

    device = model.device.type
    ids = [3 + (i * 13) % 1000 for i in range(seq_len)]
    mask = [0] * (seq_len // 2) + [1] * (seq_len - seq_len // 2)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    if device == "cuda":
        torch.cuda.empty_cache()
    t = time.perf_counter()
    out = sm.update(model, opt, [sm.Sample(ids, mask, 1.0, "agent")], temperature=0.6, token_budget=seq_len,
                    max_grad_norm=1.0)
    sync(device)
    return {"qlora_step_s": round(time.perf_counter() - t, 2),
            "qlora_peak_mem_gb": round(out["peak_mem_mb"] / 1024, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-4b", help="model geometry (random weights)")
    ap.add_argument("--quantize", default="auto", help="auto (NF4 on CUDA) | none | nf4")
    ap.add_argument("--batches", default="1,64", help="decode batch sizes, comma-separated")
    ap.add_argument("--prompt-len", type=int, default=200, help="prompt tokens per row")
    ap.add_argument("--steps", type=int, default=64, help="decode steps timed")
    ap.add_argument("--seq-len", type=int, default=8192, help="tokens of the QLoRA step's one sequence")
    ap.add_argument("--no-static", action="store_true", help="skip the static-cache (compiled) decode")
    ap.add_argument("--no-train", action="store_true", help="skip the QLoRA step")
    args = ap.parse_args()

    import torch

    with tempfile.TemporaryDirectory() as folder:
        model, device = build(args.shape, args.quantize, folder)
    tok = SimpleNamespace(pad_token_id=0, eos_token_id=2, decode=lambda ids, **kw: "")  # ids only, no text
    model.generation_config.eos_token_id = 2
    report("shape", args.shape)
    report("weight_gb", round(weight_bytes(model) / 1e9, 3))
    if device == "cuda":
        bw = copy_bandwidth_gbs(device)
        report("copy_bandwidth_gbs", round(bw, 1))
        report("bound_ms_per_step", round(1000 * weight_bytes(model) / 1e9 / bw, 2))
    for batch in [int(b) for b in args.batches.split(",")]:
        ms = decode_ms(model, tok, batch, args.prompt_len, args.steps, False)
        report(f"eager_ms_per_step_b{batch}", round(ms, 2))
        if not args.no_static:
            graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            ms = decode_ms(model, tok, batch, args.prompt_len, args.steps, True)
            report(f"static_ms_per_step_b{batch}", round(ms, 2))
            before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            decode_ms(model, tok, batch, args.prompt_len + 17, args.steps, True)  # same buckets, new lengths
            report(f"static_graphs_compiled_b{batch}", before - graphs)
            report(f"static_recompiles_after_warmup_b{batch}",
                   torch._dynamo.utils.counters["stats"]["unique_graphs"] - before)
    if not args.no_train:
        for name, value in qlora_step(model, args.seq_len).items():
            report(name, value)


if __name__ == "__main__":
    main()

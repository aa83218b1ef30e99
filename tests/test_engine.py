"""The rollout engine's parts against the plain versions they replace (models.py): the Sampler against HF's own
warpers, the growing KV cache against DynamicCache, merged LoRA against the adapter, shared prefill against
a prefill per row, and the sampler's recorded log-probs against the update's token_logprobs."""
import contextlib
import math
import os
import platform
import types

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

import models
import spade_mini as sm

CACHE = os.path.expanduser(os.environ.get("SPADE_MINI_CACHE", "~/.cache/spade-mini"))
GREEDY = dict(temperature=0.0, top_p=1.0, top_k=0, seed=0)


@pytest.fixture(scope="module")
def tiny_model():
    model, tok, _ = models.load_model("tiny-random", lora_r=4, lora_alpha=8, lora_dropout=0.0, quantize="none",
                                      gradient_checkpointing=False, cache_dir=CACHE, seed=0)
    with torch.no_grad():   # a LoRA that changes the output, so merged vs unmerged is a real comparison
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    return model, tok


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 20, 0.95), (1.0, 0, 0.9), (0.6, 5, 1.0), (1.3, 50, 0.5)])
def test_sampler_keeps_the_tokens_and_probabilities_of_hf_warpers(temperature, top_k, top_p):
    scores = torch.randn(6, 1000, generator=torch.Generator().manual_seed(1)) * 3  # (B, V)
    hf = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k:
        hf = TopKLogitsWarper(top_k)(None, hf)
    hf = TopPLogitsWarper(top_p)(None, hf)
    top, ids = models.Sampler(temperature, top_k, top_p).kept(scores)  # (B, k)
    ours = torch.full_like(scores, float("-inf")).scatter(1, ids, top)
    assert torch.equal(torch.isinf(ours), torch.isinf(hf))
    assert torch.allclose(ours.softmax(-1), hf.softmax(-1), atol=1e-6)


def test_sampler_draws_only_kept_tokens_at_their_frequencies():
    """Top-k 3 of logits [2, 1, 0, -1, ...]: the 3 kept tokens at softmax([2, 1, 0]) = 0.665, 0.245, 0.090."""
    scores = torch.tensor([[2.0, 1.0, 0.0] + [-1.0] * 7]).repeat(20_000, 1)  # (B, V)
    torch.manual_seed(0)
    out = models.Sampler(1.0, 3, 1.0)(None, scores)
    token = out.argmax(-1)
    assert torch.isinf(out).sum(-1).eq(9).all() and token.max() <= 2
    freq = torch.bincount(token, minlength=3).float() / len(token)
    assert torch.allclose(freq, torch.tensor([0.665, 0.245, 0.090]), atol=0.01)


def test_sampler_records_the_full_softmax_log_prob_of_each_drawn_token():
    scores = torch.randn(4, 50, generator=torch.Generator().manual_seed(2))
    sampler = models.Sampler(0.7, 10, 0.9)
    token = sampler(None, scores).argmax(-1)
    expected = (scores / 0.7).log_softmax(-1).gather(1, token[:, None]).squeeze(1)
    assert torch.allclose(sampler.steps()[:, 0], expected)


def test_tempered_logprobs_by_hand_and_greedy_scores_at_one():
    """logits (0, ln 3): at T = 1 the probabilities are 1/4 and 3/4; at T = 2, 1/(1 + sqrt 3) = 0.36603 and
    0.63397; T = 0 (greedy) scores at T = 1. The sampler's record and the update's token_logprobs both use it."""
    logits = torch.tensor([[0.0, math.log(3)]])
    assert models.tempered_logprobs(logits, 1.0).exp().tolist()[0] == pytest.approx([0.25, 0.75])
    assert models.tempered_logprobs(logits, 2.0).exp().tolist()[0] == pytest.approx([0.36603, 0.63397], abs=1e-5)
    assert torch.equal(models.tempered_logprobs(logits, 0.0), models.tempered_logprobs(logits, 1.0))
    assert logits.tolist()[0] == pytest.approx([0.0, math.log(3)])   # not in place unless asked
    models.tempered_logprobs(logits, 2.0, in_place=True)
    assert logits.tolist()[0] == pytest.approx([0.0, math.log(3) / 2])
    greedy = models.Sampler(0.0, 0, 1.0)
    token = greedy(None, torch.tensor([[0.0, math.log(3)]])).argmax(-1)
    assert token.item() == 1 and greedy.steps()[0, 0].item() == pytest.approx(math.log(0.75))


def test_growing_cache_gives_dynamic_cache_logits_and_survives_row_selection(tiny_model):
    model, _ = tiny_model
    ids = torch.randint(5, 1000, (3, 40), generator=torch.Generator().manual_seed(3))  # (B, T)
    with torch.no_grad():
        a, b = DynamicCache(), models.GrowingCache()
        for cache in (a, b):
            model(input_ids=ids[:, :30], cache=cache, use_cache=True)
        for t in range(30, 40):   # one column at a time, within the first capacity (64 columns)
            la = model(input_ids=ids[:, t: t + 1], cache=a, use_cache=True).logits
            lb = model(input_ids=ids[:, t: t + 1], cache=b, use_cache=True).logits
            assert torch.allclose(la, lb, atol=1e-5)
        keep = torch.tensor([2, 0])
        a.batch_select_indices(keep), b.batch_select_indices(keep)
        more = torch.randint(5, 1000, (2, 60), generator=torch.Generator().manual_seed(4))   # grows past 64 columns
        la = model(input_ids=more, cache=a, use_cache=True).logits
        lb = model(input_ids=more, cache=b, use_cache=True).logits
    assert b.get_seq_length() == 100 and torch.allclose(la, lb, atol=1e-5)


def test_merged_lora_generates_the_adapter_s_function_and_puts_the_weights_back(tiny_model):
    model, _ = tiny_model
    ids = torch.randint(5, 1000, (2, 12), generator=torch.Generator().manual_seed(5))
    before = {n: p.clone() for n, p in model.named_parameters()}
    model.eval()
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with model.disable_adapter():
            base = model(input_ids=ids).logits
        with models.lora_merged(model):
            merged = model(input_ids=ids).logits
    assert not torch.allclose(plain, base, atol=1e-3)        # the LoRA matters here
    assert torch.allclose(plain.log_softmax(-1), merged.log_softmax(-1), atol=1e-4)   # float rounding only
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert all(p.requires_grad == before[n].requires_grad for n, p in model.named_parameters())


def test_identical_prompts_prefilled_once_give_the_tokens_of_separate_prefills(tiny_model):
    model, tok = tiny_model
    a, b = models.chat_ids(tok, "the same first observation"), models.chat_ids(tok, "another one, longer " * 3)
    prompts = [a, b, a, a, b]
    rows = []   # the rows of each decoder call: the prefill's first, then generate's decode steps
    hook = model.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    try:
        shared = [c.completion_ids for c in models.generate(model, tok, prompts, max_new_tokens=10, **GREEDY)]
    finally:
        hook.remove()
    assert rows[0] == 2 and set(rows[1:]) == {5}     # the 2 distinct prompts prefilled, 5 rows decoded
    single = [models.generate(model, tok, [p], max_new_tokens=10, **GREEDY)[0].completion_ids for p in prompts]
    assert shared == single
    ids, mask = models._left_pad(prompts, tok.pad_token_id, max(map(len, prompts)), model.device)
    cache = models._prefill_shared(model, ids, mask)
    assert cache.get_seq_length() == ids.shape[1] - 1 and cache.layers[0].keys.shape[0] == 5
    assert torch.equal(cache.layers[0].keys[0], cache.layers[0].keys[3])


def test_the_sampler_s_log_probs_are_the_trainer_s_for_the_same_tokens(tiny_model):
    """The rollout/trainer mismatch on the CPU in fp32: the log-prob the sampler saw (merged LoRA, KV cache,
    incremental) equals the update's token_logprobs (adapter, one full forward) to float precision."""
    model, tok = tiny_model
    prompts = [models.chat_ids(tok, "hello"), models.chat_ids(tok, "a longer prompt here")]
    outs = models.generate(model, tok, prompts, max_new_tokens=8, temperature=0.8, top_p=0.95, top_k=20, seed=3)
    rows = [(o.prompt_ids + o.completion_ids, [0] * len(o.prompt_ids) + [1] * len(o.completion_ids)) for o in outs]
    trainer = sm.sampled_logprobs(model, rows, temperature=0.8, token_budget=4096, pad_id=tok.pad_token_id)
    for o, lp in zip(outs, trainer):
        assert len(o.logprobs) == len(o.completion_ids)
        assert max(abs(x - y) for x, y in zip(o.logprobs, lp[len(o.prompt_ids):])) < 1e-4


def test_the_update_reports_the_rollout_trainer_mismatch_per_role(tiny_model):
    """Rollout log-probs 0.5 below the trainer's on every trained token: k3 = e^0.5 - 1.5 = 0.1487 per token,
    max |delta| 0.5, for the agent; the designer role, with none given, reports None."""
    model, tok = tiny_model
    ids, mask = list(range(10, 22)), [0] * 6 + [1] * 6
    trainer = sm.sampled_logprobs(model, [(ids, mask)], temperature=1.0, token_budget=4096, pad_id=0)[0]
    rollout = [x - 0.5 if m else 0.0 for x, m in zip(trainer, mask)]
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    out = sm.update(model, opt, [sm.Sample(ids, mask, 1.0, "agent", rollout_logprobs=rollout)], temperature=1.0,
                    token_budget=4096, max_grad_norm=1.0)
    assert out["mismatch_k3_agent"] == pytest.approx(0.1487, abs=2e-3)
    assert out["mismatch_max_agent"] == pytest.approx(0.5, abs=2e-3)
    assert out["mismatch_k3_designer"] is None and out["mismatch_max_designer"] is None


def test_the_update_counts_every_processed_token_and_each_roles_gradient(tiny_model):
    """tokens_per_s counts the tokens the forward and backward went through (a designer sample's 40-token prompt
    too, not only its 4 trained tokens; the pads of a shorter sample beside a longer one not), and
    grad_norm_<role> is the norm of each role's part: each role's samples alone give the same gradient up to the
    loss's division by the step's sample count, and the step's norm is at most the sum of the two."""
    model, tok = tiny_model
    agent = sm.Sample(list(range(10, 22)), [0] * 6 + [1] * 6, 1.0, "agent")
    short = sm.Sample(list(range(10, 18)), [0] * 4 + [1] * 4, -1.0, "agent")   # padded to 12 beside `agent`
    designer = sm.Sample(list(range(30, 74)), [0] * 40 + [1] * 4, -0.5, "designer")
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    kw = dict(temperature=1.0, token_budget=4096, max_grad_norm=1e9)
    both = sm.update(model, opt, [agent, short, designer], **kw)
    assert both["processed_tokens"] == 12 + 8 + 44 < both["padded_tokens"] == 2 * 12 + 44
    assert both["tokens"] == 6 + 4 + 4
    assert both["tokens_per_s"] * both["seconds"] == pytest.approx(64, rel=1e-6)
    # alone, the designer sample's loss is divided by 1 instead of 3; the agent pair's by 2
    alone = {"agent": sm.update(model, opt, [agent, short], **kw)["grad_norm"],
             "designer": sm.update(model, opt, [designer], **kw)["grad_norm"]}
    assert both["grad_norm_agent"] == pytest.approx(alone["agent"] * 2 / 3, rel=1e-4)
    assert both["grad_norm_designer"] == pytest.approx(alone["designer"] / 3, rel=1e-4)
    assert both["grad_norm"] <= both["grad_norm_agent"] + both["grad_norm_designer"] + 1e-6   # their sum's norm
    assert sm.update(model, opt, [agent], **kw)["grad_norm_designer"] is None


def test_a_bf16_autocast_update_keeps_the_fp32_gradient_direction(tiny_model):
    """--train-bf16 on: the LoRA gradient of one update is the fp32 one up to bf16 rounding (the LoRA weights and
    their gradients stay fp32); auto picks it only for an fp32 model on a CPU with native bf16."""
    model, tok = tiny_model
    samples = [sm.Sample(list(range(10 + k, 40 + k)), [0] * 10 + [1] * 20, 1.0 if k % 2 else -1.0, "agent")
               for k in range(4)]
    params = [p for p in model.parameters() if p.requires_grad]
    grads = []
    for bf16 in (False, True):
        opt = torch.optim.SGD(params, lr=0.0)
        captured = []
        hook = [p.register_hook(lambda g, c=captured: c.append(g.clone())) for p in params[:4]]
        sm.update(model, opt, samples, temperature=1.0, token_budget=4096, max_grad_norm=1e9, bf16=bf16)
        for h in hook:
            h.remove()
        grads.append(torch.cat([g.flatten() for g in captured]))
        assert all(p.dtype == torch.float32 for p in params)
    assert not torch.equal(grads[0], grads[1])    # bf16 did run
    assert torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0) > 0.95
    assert models.bf16_autocast("off", model) is False and models.bf16_autocast("on", model) is True
    assert models.bf16_autocast("auto", model) is (models.native_bf16_cpu() and models.bf16_matmul_speedup() >= 1.2)


def test_auto_bf16_follows_the_measured_matmul_speed_not_the_flags(tiny_model, monkeypatch):
    """A CPU that says avx512_bf16 but multiplies bf16 at half fp32's speed (a 2-core Xeon without AMX) gets fp32
    under auto; one that multiplies it 2.6x faster gets bf16."""
    model, _ = tiny_model
    monkeypatch.setattr(models, "native_bf16_cpu", lambda: True)
    for speedup, expected in [(0.53, False), (2.6, True)]:
        monkeypatch.setattr(models, "bf16_matmul_speedup", lambda s=speedup: s)
        assert models.bf16_autocast("auto", model) is expected
    assert models.bf16_autocast("on", model) is True   # asked for, it is on whatever the speed


def test_merged_lora_is_skipped_when_its_copies_would_not_fit_in_memory(tiny_model, monkeypatch):
    model, _ = tiny_model
    bases = [m.get_base_layer() for m in model.modules() if hasattr(m, "get_delta_weight")]
    before = [b.weight for b in bases]

    def changed() -> bool:   # merged copies in place of the weights, or the packed decode's forwards
        return any(b.weight is not w or "forward" in b.__dict__ for b, w in zip(bases, before))
    with models.lora_merged(model):
        assert changed()
    monkeypatch.setattr(models, "PACK_DECODE", False)
    with models.lora_merged(model):
        assert any(b.weight is not w for b, w in zip(bases, before))      # merged: copies in place of the weights
    monkeypatch.setattr(models, "_free_memory_bytes", lambda: 1000.0)
    for pack in (True, False):
        monkeypatch.setattr(models, "PACK_DECODE", pack)
        with models.lora_merged(model):
            assert not changed()                                          # no room: the adapter as it is


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="MKL's packed sgemm is what is tested")
def test_packed_decode_samples_the_tokens_of_merged_copies(tiny_model, monkeypatch):
    """The lever of models._DecodePacked against what it replaces (plain merged fp32 copies): the same tokens and
    log-probs within 1e-4 over two turns, the second with fewer rows (repacked); inside the call every LoRA
    layer and the LM head compute a decode step from the merged weight (not the base one), and after it every
    linear is as before."""
    model, tok = tiny_model
    prompts = [models.chat_ids(tok, "a prompt"), models.chat_ids(tok, "another, longer prompt, and more"),
               models.chat_ids(tok, "a third")]
    kw = dict(temperature=0.9, top_p=0.95, top_k=20, bf16=False)
    calls = []
    real_call = models._DecodePacked.__call__

    def spied(self, x):   # each call's (rows, columns) and the rows its packed weight is for, after it
        out = real_call(self, x)
        calls.append((tuple(x.shape[:2]), self.rows))
        return out
    monkeypatch.setattr(models._DecodePacked, "__call__", spied)

    def two_turns():
        first, batch = models.generate_turn(model, tok, [0, 1, 2], prompts, None, [[], [], []], max_new_tokens=10,
                                            seed=1, **kw)
        deltas = [models.observation_ids(tok, "next", r.completion_ids) for r in first[:2]]
        second, _ = models.generate_turn(model, tok, [0, 1], [p + r.completion_ids + d for p, r, d in
                                                              zip(prompts, first, deltas)], batch, deltas,
                                         max_new_tokens=6, seed=2, **kw)
        return [(r.completion_ids, r.logprobs) for r in first + second]

    lora = next(m for m in model.modules() if hasattr(m, "get_delta_weight"))
    base = lora.get_base_layer()
    x = torch.randn(3, 1, base.in_features, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), models.lora_merged(model):
        decoded = base(x)
        merged = F.linear(x, models._merged_weight(lora), base.bias)
        plain = F.linear(x, base.weight, base.bias)
    assert torch.allclose(decoded, merged, atol=1e-5) and not torch.allclose(decoded, plain, atol=1e-3)

    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    weights = [m.weight for m in linears]
    packed_run = two_turns()
    assert {(b, rows) for (b, t), rows in calls if t == 1} == {(3, 3), (2, 2)}                              # the first turn's 3 rows, then repacked for 2
    assert not any("forward" in m.__dict__ for m in linears)
    assert all(m.weight is w for m, w in zip(linears, weights))
    monkeypatch.setattr(models, "PACK_DECODE", False)
    calls.clear()
    plain_run = two_turns()
    assert not calls
    assert [ids for ids, _ in packed_run] == [ids for ids, _ in plain_run] and any(ids for ids, _ in plain_run)
    assert all(abs(a - b) < 1e-4 for (_, la), (_, lb) in zip(packed_run, plain_run) for a, b in zip(la, lb))


def test_merged_lora_is_skipped_when_one_lora_layer_cannot_be_merged(tiny_model):
    """disable_adapter switches every adapter off: merging only the fp32 layers would drop the others' LoRA."""
    model, _ = tiny_model
    layers = [m for m in model.modules() if hasattr(m, "get_delta_weight")]
    bases = [m.get_base_layer() for m in layers]
    before = [b.weight for b in bases]
    saved = bases[0].weight
    bases[0].weight = torch.nn.Parameter(saved.detach().to(torch.bfloat16), requires_grad=False)
    try:
        with models.lora_merged(model):   # neither merged copies nor packed decode weights (which keep .weight)
            assert all(b.weight is w for b, w in zip(bases[1:], before[1:]))
            packed = [n for n, m in model.named_modules()
                      if isinstance(m.__dict__.get("forward"), models._DecodePacked)]
            assert packed == []
    finally:
        bases[0].weight = saved


def test_the_lm_head_only_sees_columns_it_samples_from_contiguous(tiny_model):
    """The engine prefills every column but the last through the decoder alone (_prefill_shared, _prefill_new), so
    the LM head runs only in generate's one-column forwards, on a contiguous hidden state: a head on HF's prefill
    slices a view, and in bf16 torch's matmul copied the whole head weight once per row for it (10 s a prefill)."""
    model, tok = tiny_model
    seen = []
    hook = model.get_output_embeddings().register_forward_pre_hook(
        lambda module, args: seen.append((tuple(args[0].shape), args[0].is_contiguous())))
    try:
        first = [models.chat_ids(tok, f"prompt {k}") for k in range(3)]
        replies, batch = models.generate_turn(model, tok, [0, 1, 2], first, None, [[], [], []], max_new_tokens=4,
                                              **GREEDY)
        deltas = [models.observation_ids(tok, f"observation {k}", r.completion_ids) for k, r in enumerate(replies)]
        models.generate_turn(model, tok, [0, 1, 2], [f + r.completion_ids + d for f, r, d in
                                                     zip(first, replies, deltas)], batch, deltas, max_new_tokens=4,
                             **GREEDY)
    finally:
        hook.remove()
    assert seen and all(shape[1] == 1 and contiguous for shape, contiguous in seen), seen


def test_bf16_generation_puts_the_fp32_weights_back_and_stays_near_the_trainer(tiny_model):
    """--generate-bf16: a bf16 KV cache and bf16 weights during the call, the very same fp32 parameters after;
    the sampler's log-probs of its tokens stay near the fp32 trainer's (the mismatch TIS corrects)."""
    model, tok = tiny_model
    before = {n: (p, p.detach().clone()) for n, p in model.named_parameters()}
    prompts = [models.chat_ids(tok, "a prompt"), models.chat_ids(tok, "another, longer prompt")]
    replies, batch = models.generate_turn(model, tok, [0, 1], prompts, None, [[], []], max_new_tokens=8,
                                          temperature=0.7, top_p=0.95, top_k=20, seed=1, bf16=True)
    assert batch.cache.layers[0].keys.dtype == torch.bfloat16
    deltas = [models.observation_ids(tok, "next", r.completion_ids) for r in replies]   # a second turn reuses it
    again, batch = models.generate_turn(model, tok, [0, 1], [p + r.completion_ids + d for p, r, d in
                                                             zip(prompts, replies, deltas)], batch, deltas,
                                        max_new_tokens=4, temperature=0.7, top_p=0.95, top_k=20, seed=2, bf16=True)
    assert all(r.completion_ids for r in again) and batch.cache.layers[0].keys.dtype == torch.bfloat16
    after = dict(model.named_parameters())
    assert all(after[n] is p and torch.equal(p, copy) and p.dtype == torch.float32 for n, (p, copy) in before.items())
    rows = [(r.prompt_ids + r.completion_ids, [0] * len(r.prompt_ids) + [1] * len(r.completion_ids)) for r in replies]
    ids, mask, loss = models.batch_tensors(rows, tok.pad_token_id, model.device)
    with torch.no_grad():
        trainer = sm.token_logprobs(model, ids, mask, loss, temperature=0.7)
    sampled = torch.tensor([[0.0] * len(r.prompt_ids) + r.logprobs for r in replies][0:1])
    delta = (trainer[0, :sampled.shape[1]] - sampled[0]).abs()[loss[0, :sampled.shape[1]].bool()]
    assert delta.numel() and delta.max() < 0.5 and delta.max() > 0, delta   # bf16 moved them, not far


def test_bf16_weights_merge_the_lora_straight_into_bf16_copies(tiny_model, monkeypatch):
    """Inside bf16_weights each LoRA layer's weight is (W + delta) rounded to bf16 once, made without an fp32
    merged copy on the way (for Qwen2.5-Coder-1.5B that copy was 5.2 GB of a 13.4 GB peak); W is back after."""
    model, _ = tiny_model
    layers = [m for m in model.modules() if hasattr(m, "get_delta_weight")]
    saved_b = [m.lora_B["default"].weight.detach().clone() for m in layers]   # the fixture's, put back after
    with torch.no_grad():
        for m in layers:   # a LoRA that is not zero, so the merge shows
            m.lora_B["default"].weight.normal_(0, 0.05)
    before = [(m.get_base_layer(), m.get_base_layer().weight) for m in layers]
    expected = [(b.weight + m.get_delta_weight("default")).detach().to(torch.bfloat16)
                for m, (b, _) in zip(layers, before)]
    merges, real_merge = [], models.lora_merged
    monkeypatch.setattr(models, "lora_merged",
                        lambda m, dtype=torch.float32: merges.append(dtype) or real_merge(m, dtype))
    try:
        with models.bf16_weights(model):
            assert all(b.weight.dtype == torch.bfloat16 and torch.equal(dense(b.weight), e)
                       for (b, _), e in zip(before, expected))
        assert merges == [torch.bfloat16]      # one merge, into bf16: no fp32 copy of the weights was made
        assert all(b.weight is w and w.dtype == torch.float32 for b, w in before)
    finally:
        with torch.no_grad():
            for m, b in zip(layers, saved_b):
                m.lora_B["default"].weight.copy_(b)


def test_packed_bf16_linears_sample_the_same_tokens_and_log_probs(tiny_model, monkeypatch):
    """The lever of models._packed_linears against what it replaces (plain bf16 linears): the same tokens and
    the same log-probs, bit for bit, over two turns and rows of different lengths; the layers compute from
    packed weights inside the call (on a CPU with oneDNN's bf16), and after it every linear is as before."""
    model, tok = tiny_model
    prompts = [models.chat_ids(tok, "a prompt"), models.chat_ids(tok, "another, longer prompt, and more")]
    kw = dict(temperature=0.9, top_p=0.95, top_k=20, bf16=True)

    def two_turns():
        first, batch = models.generate_turn(model, tok, [0, 1], prompts, None, [[], []], max_new_tokens=10, seed=1, **kw)
        deltas = [models.observation_ids(tok, "next", r.completion_ids) for r in first]
        second, _ = models.generate_turn(model, tok, [0, 1], [p + r.completion_ids + d for p, r, d in
                                                              zip(prompts, first, deltas)], batch, deltas,
                                         max_new_tokens=6, seed=2, **kw)
        return [(r.completion_ids, r.logprobs) for r in first + second]

    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    with models.bf16_weights(model):
        packed = sum(m.weight.is_mkldnn for m in linears)
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():   # every layer's weights and the (untied) head; not A, B
        assert packed == 2 * 7 + 1 == len(linears) - 2 * 2 * 7
    packed_run = two_turns()
    assert not any("forward" in m.__dict__ for m in linears)
    assert all(m.weight.dtype == torch.float32 and not m.weight.is_mkldnn for m in linears)
    monkeypatch.setattr(models, "_packed_linears", lambda model: contextlib.nullcontext())
    plain_run = two_turns()
    assert packed_run == plain_run and any(ids for ids, _ in plain_run)


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="MKL's packed sgemm is what is tested")
@pytest.mark.parametrize("mkl_faster", [True, False])
def test_packed_decode_takes_mkl_s_layout_only_where_it_is_faster_and_not_padded_much(monkeypatch, mkl_faster):
    """Where MKL is measured faster (models.mkl_decode_speedup > 1), a 1.5B-sized MLP weight packs in MKL's layout
    (1.244x its bytes), a small one in oneDNN's (MKL's would be hundreds of times larger); where oneDNN is faster
    (an AMD EPYC), both pack in oneDNN's. Either way they give F.linear's output at a decode step, repack when the
    rows change, and a prefill (more columns) takes the plain product."""
    monkeypatch.setattr(models, "mkl_decode_speedup", lambda: 2.0 if mkl_faster else 0.5)
    g = torch.Generator().manual_seed(0)
    for (out, inp), mkl in (((8960, 1536), mkl_faster), ((64, 64), False)):
        linear = torch.nn.Linear(inp, out)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(out, inp, generator=g) * 0.02)
        layer = models._DecodePacked(linear)
        for rows in (8, 3):
            x = torch.randn(rows, 1, inp, generator=g)
            assert torch.allclose(layer(x), F.linear(x, linear.weight, linear.bias), atol=1e-4)
            assert (layer.rows, layer.mkl) == (rows, mkl)
            assert layer.packed.numel() <= models.MKL_PACKED_GROWTH * linear.weight.numel()
        prefill = torch.randn(2, 5, inp, generator=g)
        assert torch.equal(layer(prefill), F.linear(prefill, linear.weight, linear.bias)) and layer.rows == 3


def dense(weight: torch.Tensor) -> torch.Tensor:
    """A weight as a plain tensor, whether bf16_weights left it plain or packed it (oneDNN's layout)."""
    return weight.to_dense() if weight.is_mkldnn else weight


def test_bf16_weights_keeps_a_tied_weight_one_copy():
    """A tied LM head (SmolLM2's) stays tied inside bf16_weights: one bf16 copy, not two."""
    from transformers import AutoModelForCausalLM, LlamaConfig
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config)
    with models.bf16_weights(model):
        assert model.lm_head.weight is model.model.embed_tokens.weight
        assert model.lm_head.weight.dtype == torch.bfloat16
    assert model.lm_head.weight is model.model.embed_tokens.weight and model.lm_head.weight.dtype == torch.float32


def _lora_gradients(model, ids, bf16: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of ids and the LoRA gradient of their mean square, one forward and backward."""
    params = [p for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    with models.autocast(bf16, model):
        logits = model(input_ids=ids, use_cache=False).logits.float()   # (1, T, V)
    logits.pow(2).mean().backward()
    grad = torch.cat([p.grad.flatten() for p in params])
    model.zero_grad(set_to_none=True)
    return logits.detach(), grad


def test_the_fused_lora_layer_computes_peft_s_function_and_gradients(tiny_model):
    """models._FusedLora (every LoRA layer's forward since add_lora) against peft's own LoRA forward on the same
    weights: in fp32 the same logits and the same LoRA gradient to fp32 rounding; under bf16 autocast each is
    one bf16 rounding of the fp32 one (both near it, neither exact). Both LoRA matrices get a gradient; with the
    adapter off the layer is its base alone."""
    model, _ = tiny_model
    layers = [m for m in model.modules() if "forward" in vars(m) and hasattr(m, "lora_A")]
    assert layers and len(layers) == models.fuse_lora(model)
    ids = torch.tensor([list(range(20, 52))])   # (1, 32)
    calls, apply = [], models._FusedLora.apply
    with pytest.MonkeyPatch.context() as mp:   # the fused function itself ran, once a layer a forward
        mp.setattr(models._FusedLora, "apply", lambda *a: calls.append(1) or apply(*a))
        fused = {bf16: _lora_gradients(model, ids, bf16) for bf16 in (False, True)}
    assert len(calls) == 2 * len(layers)
    for m in layers:
        del m.forward                            # peft's own forward
    try:
        plain = {bf16: _lora_gradients(model, ids, bf16) for bf16 in (False, True)}
    finally:
        models.fuse_lora(model)
    assert torch.allclose(fused[False][0], plain[False][0], rtol=1e-5, atol=1e-5)
    assert torch.allclose(fused[False][1], plain[False][1], rtol=1e-4, atol=1e-7)
    cos = torch.nn.functional.cosine_similarity
    for grads in (fused[True][1], plain[True][1]):
        assert cos(grads, plain[False][1], dim=0) > 0.999
    assert (fused[False][1] != 0).float().mean() > 0.9   # A and B both trained (B alone would be half)
    try:
        with model.disable_adapter(), torch.no_grad():
            off = model(input_ids=ids).logits
            for m in layers:
                m.forward = type(m).forward.__get__(m)
            assert torch.equal(off, model(input_ids=ids).logits)
    finally:
        models.fuse_lora(model)


@pytest.mark.parametrize("case", ["bf16 base, fp32 adapter, no autocast", "LoRA bias"])
def test_the_fused_lora_layer_leaves_to_peft_what_it_would_compute_otherwise(case):
    """Where _FusedLora would compute something else than peft (a bf16 base with fp32 adapters and no autocast,
    the CUDA path without quantization: peft computes the LoRA branch in fp32; a LoRA bias), the layer runs peft's
    own forward: the same output bit for bit."""
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(0)
    net = get_peft_model(torch.nn.Sequential(torch.nn.Linear(32, 48)),
                         LoraConfig(r=4, lora_alpha=8, target_modules=["0"], lora_bias=case == "LoRA bias"))
    layer = next(m for m in net.modules() if type(m) is models.LoraLinear)
    torch.nn.init.normal_(layer.lora_B["default"].weight)
    x = torch.randn(5, 32)
    if case == "LoRA bias":
        torch.nn.init.normal_(layer.lora_B["default"].bias)
    else:
        layer.get_base_layer().to(torch.bfloat16)
        x = x.to(torch.bfloat16)
    with torch.no_grad():
        want = layer(x)
        assert models.fuse_lora(net) == 1
        assert torch.equal(layer(x), want)


@pytest.mark.parametrize("bf16", [False, True])
def test_the_fused_lora_layer_with_a_base_bias_computes_peft_s_function(bf16):
    """_FusedLora adds a base bias into its LoRA term before the one addmm of the base matmul (Qwen2's q, k and
    v projections): the same output and LoRA gradients as peft's own forward, to fp32 rounding; under bf16
    autocast each within bf16 rounding of the other. A zero-token input gives a zero-token output."""
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(0)
    net = get_peft_model(torch.nn.Sequential(torch.nn.Linear(32, 48, bias=True)),
                         LoraConfig(r=4, lora_alpha=8, target_modules=["0"]))
    layer = next(m for m in net.modules() if type(m) is models.LoraLinear)
    torch.nn.init.normal_(layer.get_base_layer().bias)
    torch.nn.init.normal_(layer.lora_B["default"].weight)
    x = torch.randn(2, 5, 32)
    params = [p for p in net.parameters() if p.requires_grad]
    runs = []
    for fused in (False, True):
        if fused:
            assert models.fuse_lora(net) == 1
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            y = layer(x).float()
        runs.append((y.detach(), torch.cat([g.flatten() for g in torch.autograd.grad(y.pow(2).sum(), params)])))
    (y0, g0), (y1, g1) = runs
    if bf16:
        assert (y0 - y1).abs().max() <= 2 ** -7 * y0.abs().max()
        assert torch.nn.functional.cosine_similarity(g0.double(), g1.double(), dim=0) > 0.999
    else:
        assert torch.allclose(y0, y1, atol=1e-5)
        assert (g0 - g1).abs().max() <= 1e-6 * g0.abs().max()   # the sums' order differs
    assert layer(torch.randn(0, 32)).shape == (0, 48)


class _CountOps(TorchDispatchMode):
    """How many times each op ran below this mode (an op selective checkpointing answers from its store never
    gets here)."""
    def __init__(self):
        super().__init__()
        self.calls = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[func] = self.calls.get(func, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("bf16", [False, True])
def test_the_selective_checkpoint_keeps_the_layers_matmuls_and_changes_no_gradient(bf16):
    """models.selective_checkpoint (the update's on a CPU, in either dtype): the backward replays a layer's
    elementwise ops but takes its matmul outputs from the forward. Against the full checkpoint it replaces: the
    same LoRA gradient bit for bit, the backward's FLOPs exactly the forward's layer addmm fewer and no attention
    forward replayed; the layers' own checkpoint is back after, and it stays off when not enabled or when its
    kept outputs would not fit in half the free memory."""
    from torch.utils.flop_counter import FlopCounterMode
    model, _, _ = models.load_model("tiny-random", lora_r=4, lora_alpha=8, lora_dropout=0.0, quantize="none",
                                    gradient_checkpointing=True, cache_dir=CACHE, seed=0)
    model.train()
    layers = models._checkpointed_layers(model)
    own = [layer._gradient_checkpointing_func for layer in layers]
    params = [p for p in model.parameters() if p.requires_grad]
    ids = torch.tensor([list(range(20, 84))])   # (1, 64)
    attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    runs = {}
    for kind in ("selective", "full", "not enabled", "no room"):
        with contextlib.ExitStack() as stack:
            if kind == "no room":
                stack.enter_context(pytest.MonkeyPatch.context()).setattr(models, "_free_memory_bytes", lambda: 0.0)
            stack.enter_context(models.selective_checkpoint(model, kind in ("selective", "no room"), tokens=64))
            with models.autocast(bf16, model), FlopCounterMode(display=False) as forward:
                loss = model(input_ids=ids, use_cache=False).logits.float().pow(2).mean()
            with FlopCounterMode(display=False) as backward, _CountOps() as ops:
                loss.backward()
        assert [layer._gradient_checkpointing_func for layer in layers] == own
        runs[kind] = (forward.get_flop_counts()["Global"], backward.get_total_flops(), ops.calls.get(attention, 0),
                      torch.cat([p.grad.flatten() for p in params]))
        model.zero_grad(set_to_none=True)
    layer_matmuls = runs["full"][0][torch.ops.aten.addmm]   # the layers' base + LoRA addmm (the head is a mm)
    assert layer_matmuls > 0 and runs["full"][1] - runs["selective"][1] == layer_matmuls
    assert runs["full"][2] == len(layers) and runs["selective"][2] == 0   # the attention's forward, replayed or kept
    assert torch.equal(runs["selective"][3], runs["full"][3])
    for kind in ("not enabled", "no room"):   # the full checkpoint
        assert runs[kind][1:3] == runs["full"][1:3] and torch.equal(runs[kind][3], runs["full"][3])


@pytest.mark.parametrize("bf16", [False, True])
def test_the_update_keeps_its_layers_matmul_outputs_in_either_dtype(bf16):
    """models.update_levers turns the selective checkpoint on in the fp32 update too (4 bytes a kept value, so
    the fit test asks twice the bf16 room): an update's backward runs each layer's addmm of the forward once (the
    input gradient's addmm_ from _FusedLora is not one) where the full checkpoint replays each of them, and
    the update's gradient is the same bit for bit; with no room for fp32's kept outputs it is the full checkpoint."""
    model, _, _ = models.load_model("tiny-random", lora_r=4, lora_alpha=8, lora_dropout=0.0, quantize="none",
                                    gradient_checkpointing=True, cache_dir=CACHE, seed=0)
    samples = [sm.Sample(list(range(10 + k, 74 + k)), [0] * 24 + [1] * 40, 1.0 if k % 2 else -1.0, "agent")
               for k in range(2)]
    params = [p for p in model.parameters() if p.requires_grad]
    tokens = 64
    width = sum(m.get_base_layer().out_features for m in models._lora_layers(model))
    fp32_kept = 4 * tokens * (width + len(models._checkpointed_layers(model)) * model.config.hidden_size)
    runs = {}
    for kind in ("levers", "full", "room for bf16 only"):
        with contextlib.ExitStack() as stack:
            patch = stack.enter_context(pytest.MonkeyPatch.context())
            if kind == "full":
                real = models.selective_checkpoint
                patch.setattr(models, "selective_checkpoint", lambda m, enabled, *rest: real(m, False, *rest))
            if kind == "room for bf16 only":   # half the free memory holds the bf16 outputs, not the fp32 ones
                patch.setattr(models, "_free_memory_bytes", lambda: 1.5 * fp32_kept)
            addmm, grads = _CountOps(), []
            patch.setattr(torch.optim.AdamW, "step",   # the gradient seen; no step: the same weights each run
                          lambda self, *a, **k: grads.append(torch.cat([p.grad.flatten() for p in params])))
            optimizer = torch.optim.AdamW(params, lr=1e-3)
            with addmm:
                sm.update(model, optimizer, samples, temperature=1.0, token_budget=tokens, max_grad_norm=1e9, bf16=bf16)
        runs[kind] = (addmm.calls.get(torch.ops.aten.addmm.default, 0), grads[0])
    forward = 2 * len(models._lora_layers(model))   # two samples, one micro-batch each
    counts = {kind: run[0] for kind, run in runs.items()}
    assert counts["full"] == 2 * forward and counts["levers"] == forward, counts
    assert counts["room for bf16 only"] == (forward if bf16 else 2 * forward), counts
    assert runs["levers"][1].abs().sum() > 0
    assert all(torch.equal(runs["levers"][1], runs[kind][1]) for kind in ("full", "room for bf16 only"))


@pytest.mark.skipif(not models.native_bf16_cpu(), reason="the lever is off without native bf16")
def test_the_bf16_head_keeps_fp32_logits_nearer_the_fp32_head_than_bf16_logits(tiny_model):
    """models.bf16_head (the update's LM head on bf16 inputs, fp32 accumulation and output) against the fp32 head
    it replaces, on a head of a real model's width and logit scale (1,536 wide, logits of sd ~5): its log-probs
    nearer to the fp32 head's than a bf16 head's (bf16 logits) on average and at most, the gradient to the hidden
    states at cosine > 0.9999 and not the same (the lever acts); the process's setting is back after."""
    model, _ = tiny_model
    knob = torch.backends.mkldnn.matmul
    before = knob.fp32_precision
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(1536, 4096, bias=False)
    torch.nn.init.normal_(head.weight, std=0.02, generator=g)
    hidden = (6.0 * torch.randn(64, 1536, generator=g)).requires_grad_()   # (C, H)
    targets = torch.randint(0, 4096, (64,), generator=g)
    runs = {}
    for kind in ("fp32 head", "bf16_head", "bf16 logits"):
        fp32 = head.weight.data
        if kind == "bf16 logits":
            head.weight.data = fp32.to(torch.bfloat16)
        try:
            with models.bf16_head(model, kind == "bf16_head"):
                assert knob.fp32_precision == ("bf16" if kind == "bf16_head" else before)
                logp = sm._chunk_logprobs(hidden, targets, head, 0.7)   # (C,)
                grad, = torch.autograd.grad(logp.sum(), hidden)
        finally:
            head.weight.data = fp32
        assert knob.fp32_precision == before
        runs[kind] = (logp.detach(), grad.double().flatten())
    moved = {kind: (runs[kind][0] - runs["fp32 head"][0]).abs() for kind in ("bf16_head", "bf16 logits")}
    assert moved["bf16_head"].mean() < moved["bf16 logits"].mean()   # measured: 0.016 vs 0.032, 0.055 vs 0.099 at most
    assert moved["bf16_head"].max() < moved["bf16 logits"].max()
    assert torch.nn.functional.cosine_similarity(runs["bf16_head"][1], runs["fp32 head"][1], dim=0) > 0.9999
    assert not torch.equal(runs["bf16_head"][1], runs["fp32 head"][1])
    with models.bf16_head(model, False):
        assert knob.fp32_precision == before
    with pytest.raises(KeyError):
        with models.bf16_head(model, True):
            raise KeyError("a failing update")
    assert knob.fp32_precision == before


@pytest.mark.skipif(not models.native_bf16_cpu(), reason="the lever is off without native bf16")
def test_a_sample_s_sampling_logprobs_are_taken_with_the_update_s_head(tiny_model):
    """sampled_logprobs outside the update (bench/bf16_update.py scores samples so) is computed as the update's
    pi_old is, inside models.update_levers: the same log-probs bit for bit, no difference of LM-head precision."""
    model, _ = tiny_model
    rows = [(list(range(20, 60)), [0] * 10 + [1] * 30)]
    kw = dict(temperature=0.7, token_budget=4096, pad_id=0, bf16=True)
    outside = sm.sampled_logprobs(model, rows, **kw)
    with models.update_levers(model, True, tokens=40):
        inside = sm.sampled_logprobs(model, rows, **kw)
    assert outside == inside


def test_the_update_s_bf16_base_weights_change_no_gradient_and_are_put_back(tiny_model):
    """models.bf16_base casts the frozen weights once for the update instead of autocast casting them at every
    use: the matmuls see the same bf16 values, so a bf16 update's LoRA gradient is the same bit for bit; the
    fp32 weights are back after, and nothing is copied without bf16."""
    model, _ = tiny_model
    samples = [sm.Sample(list(range(10 + k, 40 + k)), [0] * 10 + [1] * 20, 1.0 if k % 2 else -1.0, "agent")
               for k in range(2)]
    params = [p for p in model.parameters() if p.requires_grad]
    bases = [(m.get_base_layer(), m.get_base_layer().weight) for m in model.modules() if hasattr(m, "lora_A")]
    grads, seen = [], {}
    for cast_once in (True, False):
        captured, seen[cast_once] = [], set()
        hooks = [p.register_hook(lambda g, c=captured: c.append(g.clone())) for p in params]
        hooks += [m.register_forward_pre_hook(lambda m, _, s=seen[cast_once]: s.add(m.get_base_layer().weight.dtype))
                  for m in model.modules() if hasattr(m, "lora_A")]   # what the update's layers computed with
        with contextlib.ExitStack() as stack:
            if not cast_once:
                stack.enter_context(mock_bf16_base_off())
            sm.update(model, torch.optim.SGD(params, lr=0.0), samples, temperature=1.0, token_budget=4096,
                      max_grad_norm=1e9, bf16=True)
        for h in hooks:
            h.remove()
        grads.append(torch.cat([g.flatten() for g in captured]))
    assert seen == {True: {torch.bfloat16}, False: {torch.float32}}
    assert torch.equal(grads[0], grads[1])
    assert all(b.weight is w and w.dtype == torch.float32 for b, w in bases)
    with models.bf16_base(model, True):
        assert all(b.weight.dtype == torch.bfloat16 and torch.equal(b.weight, w.to(torch.bfloat16)) for b, w in bases)
    with models.bf16_base(model, False):
        assert all(b.weight is w for b, w in bases)


@contextlib.contextmanager
def mock_bf16_base_off():
    """models.bf16_base as a no-op: the frozen weights stay fp32 and autocast casts them at every use."""
    real = models.bf16_base
    models.bf16_base = lambda model, enabled: real(model, False)
    try:
        yield
    finally:
        models.bf16_base = real


def test_the_lm_head_s_log_probs_are_log_softmax_at_the_temperature(tiny_model):
    """spade_mini._chunk_logprobs (divided in place, one fused log_softmax) against the formula written out:
    log p(y) = z_y / T - logsumexp(z / T), and its gradient through the head the same to fp32 rounding."""
    model, _ = tiny_model
    head = model.get_output_embeddings()
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, head.weight.shape[1], generator=g, requires_grad=True)   # (C, H)
    targets = torch.randint(0, head.weight.shape[0], (7,), generator=g)
    for t in (0.6, 1.0):
        got = sm._chunk_logprobs(hidden, targets, head, t)
        z = head(hidden) / t   # (C, V)
        want = z.gather(-1, targets[:, None]).squeeze(-1) - z.logsumexp(-1)
        assert torch.allclose(got, want, atol=1e-5)
        ga, = torch.autograd.grad(got.sum(), hidden)
        gb, = torch.autograd.grad(want.sum(), hidden)
        assert torch.allclose(ga, gb, atol=1e-5)


def _thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return ""
    return text[text.find("[") + 1: text.find("]")]


@pytest.mark.skipif(_thp_mode() != "madvise", reason="the lever only shows where the kernel gives 2 MB pages on asking")
def test_the_cli_has_torch_ask_for_huge_pages_unless_the_user_said_otherwise():
    """cli.py sets THP_MEM_ALLOC_ENABLE before torch loads: a fresh 64 MB tensor then lies in 2 MB pages; a 0
    the user set is kept, and the same tensor lies in 4 KB pages."""
    import subprocess
    import sys
    code = ("import cli, torch; x = torch.ones(2**24); "
            "print([int(l.split()[1]) for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages')][0])")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    huge = {}
    for value in ("", "0"):
        env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
        env.update({"THP_MEM_ALLOC_ENABLE": value} if value else {})
        out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                             check=True, timeout=120)
        huge[value] = int(out.stdout.split()[-1])   # kB
    assert huge[""] >= 32 * 1024 and huge["0"] == 0


KEEP_GOING_ENV = '''
class KeepGoingEnv:
    def __init__(self, max_turns=3):
        self.max_turns, self.turn = max_turns, 0
    def reset(self, seed=None):
        self.turn = 0
        return "Keep going.", {}
    def step(self, action):
        self.turn += 1
        return f"turn {self.turn}", 0.0, False, self.turn >= self.max_turns, {}
'''


@pytest.mark.parametrize("bf16", [False, True])
def test_a_multi_turn_play_makes_the_generation_weights_once_not_once_a_turn(tiny_model, bf16):
    """spade_mini.play generates once a turn from the same weights: their copies (the LoRA merged; bf16 copies
    with --generate-bf16) are made once for the play, not at every turn (3 GB a turn for the 1.5B, which grew
    the play phase's RSS turn by turn), and the model's own weights are back after."""
    import sandbox
    model, tok = tiny_model
    before = {name: p for name, p in model.named_parameters()}
    merges, merged = [], models.lora_merged

    def counting(*args, **kwargs):
        merges.append(1)
        return merged(*args, **kwargs)
    stats: dict = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(models, "lora_merged", counting)
        eps = sm.play(model, tok, [sm.EpisodeSpec(KEEP_GOING_ENV, s, None, (s,)) for s in range(2)], max_turns=3,
                      max_new_tokens=24, max_episode_tokens=256, limits=sandbox.Limits(), bf16=bf16, stats=stats,
                      **GREEDY)
    assert stats["generate_calls"] >= 2 and max(ep.turns for ep in eps) >= 2
    assert len(merges) == 1
    assert all(p is before[name] and p.dtype == torch.float32 for name, p in model.named_parameters())


TCMALLOC = __import__("ctypes.util").util.find_library("tcmalloc_minimal")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
@pytest.mark.parametrize("allocator", ["glibc", pytest.param("tcmalloc", marks=pytest.mark.skipif(
    TCMALLOC is None, reason="tcmalloc is not installed (apt-get install libtcmalloc-minimal4)"))])
def test_a_phase_s_end_gives_the_heap_s_free_memory_back_on_a_cpu(allocator):
    """models.phase_memory on a CPU: the peak RSS so far is recorded, then the allocator returns its free pages
    (trim_heap). glibc: 40 tensors of 20 MB come from the heap once a 30 MB one was freed (its mmap threshold
    rises to it); freed below one kept alive, the heap's top cannot shrink, so without the trim the 780 MB stay.
    tcmalloc (cli.run_under_tcmalloc) keeps all it frees, until told to release it."""
    import subprocess
    import sys
    code = ("import re, torch, models\n"
            "rss = lambda: int(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) // 1024\n"
            "x = torch.ones(30 * 2**18); del x\n"
            "xs = [torch.ones(20 * 2**18) for _ in range(40)]; keep = xs[-1]; del xs\n"
            "before = rss(); record = models.phase_memory('play'); print(before, rss(), record['mem/play_peak_rss_gb'])")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k not in ("THP_MEM_ALLOC_ENABLE", "LD_PRELOAD")}
    env.update({"LD_PRELOAD": TCMALLOC} if allocator == "tcmalloc" else {})
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=True,
                         timeout=120).stdout.split()
    before, after, peak = int(out[-3]), int(out[-2]), float(out[-1])   # MiB, MiB, GiB
    assert peak * 1024 >= before - 16 > 800   # the kernel's high-water mark lags VmRSS by a few pages a thread
    assert before - after > 600


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's attention (the model loads on CUDA there)")
@pytest.mark.parametrize("bf16", [False, True])
def test_a_cpu_decode_step_with_no_mask_packs_each_key_value_head_s_queries(tiny_model, monkeypatch, bf16):
    """models.sdpa_cpu in the loop's generate, against HF's sdpa, which it replaces on a CPU: rows of one length (no
    mask) decode with one block of queries per key/value head, never through torch's enable_gqa (9.6x slower in bf16
    on an AMD EPYC), and in fp32 sample the same tokens with the same log-probs (1e-5). In bf16 the two kernels may
    round differently (the 1.5B's tokens part, docs/benchmarks.md): their outputs, the next test."""
    model, tok = tiny_model
    assert model.config._attn_implementation == "sdpa_cpu"
    prompts = [models.chat_ids(tok, "one prompt for every row")] * 3
    calls, real = [], F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        calls.append((q.shape[2], bool(kw.get("enable_gqa"))))
        return real(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)

    def run():
        calls.clear()
        rows = models.generate(model, tok, prompts, max_new_tokens=8, temperature=0.9, top_p=0.95, top_k=20, seed=1,
                               bf16=bf16)
        return [r.completion_ids for r in rows], [r.logprobs for r in rows], list(calls)

    ids, logprobs, ours = run()
    monkeypatch.setattr(model.config, "_attn_implementation", "sdpa")
    hf_ids, hf_logprobs, theirs = run()
    groups = model.config.num_attention_heads // model.config.num_key_value_heads   # a step's queries per kv head
    assert any(q == 1 and gqa for q, gqa in theirs) and not any(q == 1 for q, _ in ours)
    assert groups == 2 and any(q == groups and not gqa for q, gqa in ours) and all(len(r) > 1 for r in ids)
    if not bf16:
        assert ids == hf_ids
        assert torch.allclose(torch.tensor(sum(logprobs, [])), torch.tensor(sum(hf_logprobs, [])), atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_cpu_computes_hf_s_attention(dtype):
    """models.sdpa_cpu against HF's sdpa_attention_forward on a decode step (3 rows, 4 query heads on 2 key/value
    heads, 37 columns): the same (B, 1, H, D) output, within 1e-6 in fp32 and a bf16 rounding (2e-2 at values of
    size ~1) in bf16; a step with a mask, a prefill and a model without grouped heads are HF's own call."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, h, t, 16, generator=g).to(dtype) for h, t in ((4, 1), (2, 37), (2, 37)))
    module = types.SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)
    ours, _ = models.sdpa_cpu(module, q, k, v, None, dropout=0.0, scaling=0.25)
    theirs, _ = models.sdpa_attention_forward(module, q, k, v, None, dropout=0.0, scaling=0.25)
    assert ours.shape == theirs.shape == (3, 1, 4, 16) and ours.is_contiguous()
    assert torch.allclose(ours.float(), theirs.float(), atol=1e-6 if dtype == torch.float32 else 2e-2)
    mask = torch.ones(3, 1, 1, 37, dtype=torch.bool)
    mask[0, ..., :5] = False
    prefill = torch.randn(3, 4, 37, 16, generator=g).to(dtype)
    single = types.SimpleNamespace(num_key_value_groups=1, is_causal=True, training=False)
    for mod, args in ((module, (q, k, v, mask)), (module, (prefill, k, v, None)),
                      (single, (q, k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1), None))):
        assert torch.equal(models.sdpa_cpu(mod, *args, scaling=0.25)[0],
                           models.sdpa_attention_forward(mod, *args, scaling=0.25)[0])

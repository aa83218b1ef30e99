"""spade-mini, the model side: generate for both roles, play environments in batch, take the policy-gradient step.

One LLM plays two roles on the same weights (Environment Designer and Reasoning Agent). Every active episode
advances in ONE batched `generate` per turn, and each episode is ONE token-in/token-out sequence that the
update scores only where the model wrote it (loss mask 1 on replies, 0 on prompts and observations). The
model itself is loaded by models.py; the environments run in sandbox.py's child processes.

Departures from the paper and the official code are listed once, in the README ("Implementation details");
this module implements items 1-3 (LoRA, the PPO-clip-form update and its normalization), 12 (log-probs on the
full softmax) and 18-19 (the KL estimator, the rollout engine's KV-cache reuse).
"""
from __future__ import annotations

import math
import random
import resource
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers import GenerationConfig, StoppingCriteriaList

import envs
import sandbox

# ----------------------------------------------------------------------------------------------------------------
# generation: left padding, explicit seed, cut after the stop token; optional static-cache shape buckets


@dataclass
class Completion:
    prompt_ids: list[int]
    completion_ids: list[int]  # generated ids, cut after the first stop token (which is kept)
    text: str                  # the completion decoded without special tokens
    finished: bool = False     # True when it ended with a stop token, False when max_new_tokens cut it


def chat_ids(tok, user_text: str, thinking: bool = False) -> list[int]:
    """Token ids of a one-message conversation in the tokenizer's own chat template, ready to generate.

    note: the template text is tokenized with add_special_tokens=False: templates write BOS themselves.
    note: enable_thinking reaches every template; hybrid ones (Qwen3-8B) think unless it is False, the others
    ignore it.
    """
    text = tok.apply_chat_template([{"role": "user", "content": user_text}], tokenize=False,
                                   add_generation_prompt=True, enable_thinking=thinking)
    return tok(text, add_special_tokens=False)["input_ids"]


def stop_ids(model, tok) -> set[int]:
    """The tokenizer's eos plus every eos of the model's generation config (Qwen3 has two)."""
    ids = {tok.eos_token_id}
    extra = getattr(model.generation_config, "eos_token_id", None)
    ids |= set(extra if isinstance(extra, list) else [extra])
    return {i for i in ids if i is not None}


# Static KV cache (opt-in, for CUDA; never measured here -- bench/gpu_bench.py does it on a lent GPU): a compiled
# decode step has the shape (batch, cache length), so both are rounded up to a few buckets; after one compile per
# bucket, later turns and steps reuse the graphs. play() then re-prefills each turn (no cache reuse across turns).
STATIC_BATCH_BUCKETS = (1, 4, 16, 64, 256)
STATIC_PROMPT_MULTIPLE = 256  # prompt width rounded up to a multiple of this (extra left padding)


def _bucket(n: int, buckets: tuple[int, ...]) -> int:
    return next((b for b in buckets if b >= n), buckets[-1] * math.ceil(n / buckets[-1]))


class _DummyRowsDone:
    """Stopping criterion that marks the batch-bucket filler rows as finished from the first step."""

    def __init__(self, n_real: int, n_rows: int, device):
        self.done = torch.arange(n_rows, device=device) >= n_real  # (B,)

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:
        return self.done


def _left_pad(rows: list[list[int]], pad_id: int, width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), each (B, width), rows right-aligned."""
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row):] = torch.tensor(row)
            mask[i, width - len(row):] = 1
    return ids.to(device), mask.to(device)


def _hf_generate(model, tok, ids: torch.Tensor, mask: torch.Tensor, *, cache, n_real: int, max_new_tokens: int,
                 temperature: float, top_p: float, top_k: int, seed: int, static_cache: bool):
    """One HF `generate` on padded ids/mask (B, T), continuing `cache` if given. -> (ids (B, T + N), cache)."""
    sample = temperature > 0
    # subtle: an unset (None) field is filled from the model's generation_config (Qwen3: top_k 20, T 0.7) and
    # then HF's defaults (top_k 50), so sampling sets every knob; top_k 0 and top_p 1 mean off. Greedy uses none.
    knobs = dict(temperature=temperature, top_p=top_p, top_k=top_k) if sample else {}
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=sample, repetition_penalty=1.0,
                              pad_token_id=tok.pad_token_id, eos_token_id=sorted(stop_ids(model, tok)),
                              use_cache=True, return_dict_in_generate=True, **knobs)
    criteria = StoppingCriteriaList()
    if static_cache:
        config.cache_implementation = "static"
        # cache length in powers of two: HF keeps the largest cache seen, so it settles after a few calls
        config.max_cache_len = 1 << max(10, math.ceil(math.log2(ids.shape[1] + max_new_tokens)))
        criteria.append(_DummyRowsDone(n_real, ids.shape[0], model.device))
    devices = [model.device] if model.device.type == "cuda" else []
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(seed)  # subtle: HF samples from the global RNG; fork_rng keeps the caller's intact
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                 stopping_criteria=criteria, **({"cache": cache} if cache is not None else {}))
    finally:
        model.train(was_training)
    return out.sequences, out.cache  # (B, T + N)


def _completion(tok, prompt: list[int], row: list[int], stops: set[int]) -> Completion:
    cut = next((j + 1 for j, t in enumerate(row) if t in stops), None)
    kept = row[:cut] if cut else row
    return Completion(list(prompt), kept, tok.decode(kept, skip_special_tokens=True), finished=cut is not None)


def generate(model, tok, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float,
             top_k: int, seed: int, static_cache: bool = False) -> list[Completion]:
    """One batched HF `generate` over all prompts (left-padded). temperature 0 = greedy; top_k 0 = off.

    static_cache=True: StaticCache with batch and widths rounded up to buckets (filler rows are copies of the
    first prompt, stopped at once); HF compiles the decode step only on CUDA, so on CPU this only pads.
    """
    if not prompts:
        return []
    rows, width = list(prompts), max(len(p) for p in prompts)
    if static_cache:
        rows += [prompts[0]] * (_bucket(len(prompts), STATIC_BATCH_BUCKETS) - len(prompts))
        width = STATIC_PROMPT_MULTIPLE * math.ceil(width / STATIC_PROMPT_MULTIPLE)
    ids, mask = _left_pad(rows, tok.pad_token_id, width, model.device)  # (B, T), (B, T)
    out, _ = _hf_generate(model, tok, ids, mask, cache=None, n_real=len(prompts), max_new_tokens=max_new_tokens,
                          temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, static_cache=static_cache)
    stops = stop_ids(model, tok)
    return [_completion(tok, p, row, stops) for p, row in zip(prompts, out[: len(prompts), width:].tolist())]


# ----------------------------------------------------------------------------------------------------------------
# the rollout engine: all active episodes advance together, one generate per turn


@dataclass
class EpisodeSpec:
    code: str              # environment source
    seed: int              # explicit reset seed
    hint: str | None       # privileged hint appended to the first observation, or None
    key: tuple = ()        # the caller's id for this play; key[0] names its environment (hung ones are dropped)


@dataclass
class Episode:
    spec: EpisodeSpec
    token_ids: list[int] = field(default_factory=list)   # prompt, then replies (mask 1) and observations (mask 0)
    loss_mask: list[int] = field(default_factory=list)   # same length as token_ids
    prompt_len: int = 0
    episode_return: float = 0.0  # envs.episode_return of the last step, in [-1, 1]
    turns: int = 0               # steps taken in the environment
    terminated: bool = False     # the environment reported its goal reached
    truncated: bool = False      # ended by the environment's truncated flag, max_turns or a cut reply
    failure: str | None = None   # SandboxError reason ("timeout", "memory", "error", ...) or "contract"
    transcript: list[dict] = field(default_factory=list)  # turn 0: first observation; then one dict per step

    def append(self, ids: list[int], trainable: bool) -> None:
        self.token_ids += ids
        self.loss_mask += [int(trainable)] * len(ids)


MAX_OBSERVATION_CHARS = 16_000  # about 4k tokens; longer observations are cut (they are not in the budget)
_PROBE_REPLY, _PROBE_OBS = "\x01REPLY\x01", "\x01OBSERVATION\x01"


def _turn_frame(tok, thinking: bool = False) -> tuple[str, str]:
    """(close, open): the template text after an assistant reply and before the next reply, around an observation.

    Found by rendering a probe conversation with marker strings, so it holds for any template that inserts
    message contents verbatim (ChatML/SmolLM2, Qwen, Llama 3, ...).
    """
    msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _PROBE_REPLY},
            {"role": "user", "content": _PROBE_OBS}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=thinking)
    after_reply = text[text.index(_PROBE_REPLY) + len(_PROBE_REPLY):]
    close, open_ = after_reply.split(_PROBE_OBS)
    return close, open_


def observation_ids(tok, observation: str, reply_ids: list[int], frame: tuple[str, str] | None = None) -> list[int]:
    """Token ids that follow a generated reply: the rest of the reply's turn, the observation, the next prompt.

    subtle: the model already generated the turn's stop token (SmolLM2: `<|im_end|>`); the template's closing
    text starts with that same token, so it is dropped here, and kept when max_new_tokens cut the reply.
    """
    close, open_ = frame or _turn_frame(tok)
    if reply_ids and reply_ids[-1] in tok.all_special_ids and close.startswith(tok.decode(reply_ids[-1:])):
        close = close[len(tok.decode(reply_ids[-1:])):]
    return tok(close + observation + open_, add_special_tokens=False)["input_ids"]


def _open_all(specs: list[EpisodeSpec], max_turns: int, limits) -> list[object]:
    """Start one sandboxed environment per episode, concurrently; a failed start becomes its SandboxError."""
    def start(spec: EpisodeSpec):
        try:
            return envs.open_env(spec.code, max_turns, limits)
        except sandbox.SandboxError as err:
            return err
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(specs)))) as pool:
        return list(pool.map(start, specs))


def _fail(ep: Episode, reason: str, detail: str) -> None:
    ep.failure = reason
    ep.episode_return = envs.episode_return(None, False, True)  # an exception or a kill ends the episode with -1
    ep.transcript.append({"turn": ep.turns + 1, "error": f"{reason}: {detail}"[:500]})


def _cut(ep: Episode, reply: Completion) -> None:
    """A reply the token limit cut (no stop token) ends the episode, truncated, with return 0 (as the official
    code does): half an answer is not sent to the environment as an action."""
    ep.episode_return, ep.truncated = 0.0, True
    ep.transcript.append({"turn": ep.turns + 1, "reply": reply.text, "cut": True})


def _clip_observation(obs: str) -> str:
    """note: observations are not in the token budget, so one is capped in characters (a hostile env may
    return up to the sandbox's message cap, ~1 MB)."""
    return obs if len(obs) <= MAX_OBSERVATION_CHARS else obs[:MAX_OBSERVATION_CHARS] + "\n[observation truncated]"


def _begin(ep: Episode, raw, tok, thinking: bool = False) -> bool:
    """Reset result -> first prompt. Returns whether the episode goes on."""
    if isinstance(raw, sandbox.SandboxError):
        _fail(ep, raw.reason, raw.detail)
        return False
    try:
        obs = _clip_observation(envs.parse_reset(raw))
    except envs.ContractError as err:
        _fail(ep, "contract", str(err))
        return False
    ep.append(chat_ids(tok, envs.agent_first_message(obs, ep.spec.hint), thinking), trainable=False)
    ep.prompt_len = len(ep.token_ids)
    ep.transcript.append({"turn": 0, "observation": obs})
    return True


def _advance(ep: Episode, raw, reply: Completion, action: str, tok, frame: tuple[str, str], max_turns: int) -> bool:
    """Step result -> transcript, return and the observation's tokens. Returns whether the episode goes on."""
    if isinstance(raw, sandbox.SandboxError):
        _fail(ep, raw.reason, raw.detail)
        return False
    try:
        obs, reward, terminated, truncated = envs.parse_step(raw)
    except envs.ContractError as err:
        _fail(ep, "contract", str(err))
        return False
    obs = _clip_observation(obs)
    ep.turns += 1
    ep.transcript.append({"turn": ep.turns, "reply": reply.text, "action": action, "observation": obs,
                          "reward": reward, "terminated": terminated, "truncated": truncated})
    ep.terminated = terminated
    ep.episode_return = envs.episode_return(reward, terminated, False)
    if terminated or truncated or ep.turns >= max_turns:
        ep.truncated = not terminated
        return False
    ep.append(observation_ids(tok, obs, reply.completion_ids, frame), trainable=False)
    return True


@dataclass
class _Batch:
    """The active episodes as the model last saw them: padded ids and mask (B, W) and their KV cache."""
    rows: list[int]        # episode index of each row
    ids: torch.Tensor      # (B, W) every column generate saw or produced, pads included
    mask: torch.Tensor     # (B, W) 1 on each episode's real tokens, 0 on pads and on tokens after a stop token
    cache: object          # HF DynamicCache of all but the last column


def _generate_turn(model, tok, eps: list[Episode], active: list[int], prev: _Batch | None, deltas: dict,
                   **gen) -> tuple[list[Completion], _Batch]:
    """One generate for all active episodes. With `prev`, only the new tokens are prefilled: the kept rows of
    the last turn's cache continue, each with its observation delta appended right-aligned (pads in between).

    subtle: positions come from the attention mask's cumulative sum (HF does this), so the pads in the middle
    shift nothing; the tokens a finished row generated after its stop token are pads too (mask 0).
    """
    if prev is None:
        width = max(len(eps[i].token_ids) for i in active)
        ids, mask = _left_pad([eps[i].token_ids for i in active], tok.pad_token_id, width, model.device)
        cache = None
    else:
        keep = torch.tensor([prev.rows.index(i) for i in active], device=model.device)  # (B,)
        prev.cache.batch_select_indices(keep)
        new = [deltas[i] for i in active]
        seg, seg_mask = _left_pad(new, tok.pad_token_id, max(map(len, new)), model.device)  # (B, D)
        ids, mask = torch.cat([prev.ids[keep], seg], 1), torch.cat([prev.mask[keep], seg_mask], 1)  # (B, W + D)
        cache = prev.cache
    out, cache = _hf_generate(model, tok, ids, mask, cache=cache, n_real=len(active), static_cache=False, **gen)
    stops = stop_ids(model, tok)
    new_ids = out[:, ids.shape[1]:].tolist()  # (B, N)
    replies = [_completion(tok, eps[i].token_ids, row, stops) for i, row in zip(active, new_ids)]
    lengths = torch.tensor([len(r.completion_ids) for r in replies], device=model.device)  # (B,)
    grown = torch.arange(out.shape[1] - ids.shape[1], device=model.device)[None, :] < lengths[:, None]  # (B, N)
    return replies, _Batch(list(active), out, torch.cat([mask, grown.long()], 1), cache)


def _drop_hung(eps: list[Episode], active: list[int]) -> list[int]:
    """A hung environment is dropped for the rest of the step: once one play of it (same spec.key[0]) times
    out, its other plays stop too, so one bad environment cannot cost a deadline per play per turn."""
    hung = {ep.spec.key[0] for ep in eps if ep.failure == "timeout" and ep.spec.key}
    for i in active:
        if eps[i].spec.key and eps[i].spec.key[0] in hung:
            _fail(eps[i], "dropped", "another play of this environment timed out")
    return [i for i in active if eps[i].failure is None]


def play(model, tok, specs: list[EpisodeSpec], *, max_turns: int, max_new_tokens: int, max_episode_tokens: int,
         temperature: float, top_p: float, top_k: int, seed: int, limits, static_cache: bool = False,
         reuse_cache: bool = True, stats: dict | None = None, thinking: bool = False) -> list[Episode]:
    """Play every spec to the end; each turn ALL active episodes share ONE generate call.

    Budgets: a reply gets at most max_new_tokens; an episode at most max_episode_tokens generated tokens over
    all its turns. A reply cut by either (no stop token) is not played: the episode ends, truncated, return 0.
    reuse_cache: keep the KV cache across turns, so a turn prefills only the new observation (off with
    static_cache, whose fixed-shape cache is rebuilt every call). stats, when given, receives generate_s,
    sandbox_s, generated_tokens and generate_calls. thinking: rendered with enable_thinking; the action is
    read after the last </think> either way, and thinking tokens count in both budgets.
    """
    eps = [Episode(spec=s) for s in specs]
    timing = {"generate_s": 0.0, "sandbox_s": 0.0, "generated_tokens": 0, "generate_calls": 0}
    t = time.time()
    procs, frame = _open_all(specs, max_turns, limits), _turn_frame(tok, thinking)
    batch, deltas = None, {}
    try:
        live = [i for i, p in enumerate(procs) if not isinstance(p, sandbox.SandboxError)]
        for i in sorted(set(range(len(specs))) - set(live)):
            _begin(eps[i], procs[i], tok, thinking)  # records the start failure
        raws = sandbox.call_many([procs[i] for i in live], "reset", [(specs[i].seed,) for i in live])
        active = _drop_hung(eps, [i for i, raw in zip(live, raws) if _begin(eps[i], raw, tok, thinking)])
        timing["sandbox_s"] += time.time() - t
        for turn in range(max_turns):
            room = {i: max_episode_tokens - sum(eps[i].loss_mask) for i in active}
            active = [i for i in active if room[i] > 0]
            if not active:
                break
            t = time.time()
            gen = dict(max_new_tokens=min(max_new_tokens, max(room[i] for i in active)), temperature=temperature,
                       top_p=top_p, top_k=top_k, seed=(seed * 1_000_003 + turn) % 2**31)
            if reuse_cache and not static_cache:
                replies, batch = _generate_turn(model, tok, eps, active, batch, deltas, **gen)
            else:
                replies = generate(model, tok, [eps[i].token_ids for i in active], static_cache=static_cache, **gen)
            timing["generate_s"] += time.time() - t
            timing["generate_calls"] += 1
            stepping = []
            for i, reply in zip(active, replies):
                # a reply without its stop token was cut (turn limit or episode budget): not played
                cut = len(reply.completion_ids) > room[i] or not reply.finished
                reply.completion_ids = reply.completion_ids[: room[i]]
                eps[i].append(reply.completion_ids, trainable=True)
                timing["generated_tokens"] += len(reply.completion_ids)
                if cut:
                    _cut(eps[i], reply)
                else:
                    stepping.append((i, reply, envs.to_action(envs.after_thinking(reply.text))))
            t = time.time()
            raws = sandbox.call_many([procs[i] for i, _, _ in stepping], "step", [(a,) for _, _, a in stepping])
            before = {i: len(eps[i].token_ids) for i, _, _ in stepping}
            active = _drop_hung(eps, [i for (i, reply, action), raw in zip(stepping, raws)
                                      if _advance(eps[i], raw, reply, action, tok, frame,
                                                  procs[i].max_turns or max_turns)])
            deltas = {i: eps[i].token_ids[before[i]:] for i in active}
            timing["sandbox_s"] += time.time() - t
    finally:
        for p in procs:
            if not isinstance(p, sandbox.SandboxError):
                p.close()
    if stats is not None:
        stats.update(timing)
    return eps


# ----------------------------------------------------------------------------------------------------------------
# the update: chunked completion-only log-probs, PPO-clip form, token-budget micro-batches, one optimizer step


@dataclass
class Sample:
    token_ids: list[int]
    loss_mask: list[int]   # 1 where the model wrote the token (trained), 0 for prompt/observations/padding
    advantage: float
    role: str              # "agent" or "designer"


def _chunk_logprobs(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module,
                    temperature: float) -> torch.Tensor:
    logits = head(hidden).float() / temperature  # (C, V)
    return logits.gather(-1, targets[:, None]).squeeze(-1) - logits.logsumexp(-1)  # (C,)


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor, *,
                   temperature: float, chunk_size: int = 512) -> torch.Tensor:
    """log p(token_t | tokens_<t) at temperature T where loss_mask is 1, else 0. Shapes (B, T) -> (B, T).

    Only the hidden states that predict a trainable token reach the LM head, chunk_size rows at a time, each
    chunk checkpointed: forward and backward hold one (chunk, vocab) logit block, never (T, vocab).
    """
    # note: the LM head is applied by hand, so models that post-process logits (e.g. Gemma's soft-capping)
    # would need that step here too; Llama/Qwen/SmolLM2 do not.
    decoder = model.get_decoder()
    hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    hidden = hidden.last_hidden_state  # (B, T, H)
    wanted = loss_mask[:, 1:].bool()  # (B, T-1): position t predicts token t+1
    h = hidden[:, :-1][wanted]  # (N, H)
    y = input_ids[:, 1:][wanted]  # (N,)
    head = model.get_output_embeddings()
    t = temperature if temperature > 0 else 1.0  # greedy sampling has no temperature: score at T = 1
    parts = [checkpoint(_chunk_logprobs, h[s: s + chunk_size], y[s: s + chunk_size], head, t, use_reentrant=False)
             for s in range(0, h.shape[0], chunk_size)]
    flat = torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)  # (N,)
    out = torch.zeros(wanted.shape, dtype=flat.dtype, device=flat.device).masked_scatter(wanted, flat)  # (B, T-1)
    return F.pad(out, (1, 0))  # (B, T)


def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, loss_mask: torch.Tensor, advantages: torch.Tensor, *,
                  clip_low: float, clip_high: float, kl_beta: float = 0.0,
                  ref_logp: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Per-sample loss (B,) = mean over the sample's trainable tokens of the PPO-clip token loss (+ beta*k3).

    Worked example: one token, A = 2, logp = old -> ratio 1 -> loss = -min(1*2, clip(1, 0.8, 1.28)*2) = -2.
    """
    mask = loss_mask.float()  # (B, T)
    ratio = torch.exp(logp - old_logp)  # (B, T)
    adv = advantages[:, None]  # (B, 1)
    unclipped, clipped = ratio * adv, ratio.clamp(1 - clip_low, 1 + clip_high) * adv  # (B, T)
    per_token = -torch.minimum(unclipped, clipped)  # (B, T)
    kl = torch.zeros_like(per_token)
    if ref_logp is not None:
        log_r = ref_logp - logp  # (B, T)
        kl = torch.exp(log_r) - log_r - 1  # k3 estimator of KL(policy || reference): unbiased, always >= 0
        per_token = per_token + kl_beta * kl
    n = mask.sum(1).clamp(min=1)  # (B,)
    per_sample = (per_token * mask).sum(1) / n  # (B,)
    stats = {"clipped_tokens": float(((clipped < unclipped).float() * mask).sum()),
             "kl_sum": float((kl.detach() * mask).sum()), "tokens": float(mask.sum())}
    return per_sample, stats


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


def _right_pad(rows: list[list], pad, device, dtype=torch.long) -> torch.Tensor:
    """(B, T) tensor of the rows, right-padded with `pad` to the longest."""
    out = torch.full((len(rows), max(map(len, rows))), pad, dtype=dtype)  # (B, T)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=dtype)
    return out.to(device)


def _tensors(part: list[Sample], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention mask, loss mask) of a micro-batch, each (b, T), right-padded."""
    return (_right_pad([s.token_ids for s in part], pad_id, device),
            _right_pad([[1] * len(s.token_ids) for s in part], 0, device),
            _right_pad([s.loss_mask for s in part], 0, device))


def _old_logprobs(model, samples: list[Sample], *, temperature: float, token_budget: int, pad_id: int,
                  chunk_size: int) -> list[torch.Tensor]:
    """Each sample's log-probs (T,) under the weights that sampled it, taken once before the first of several
    optimizer steps (the PPO ratio's denominator)."""
    old: list[torch.Tensor] = [None] * len(samples)  # type: ignore[list-item]
    with torch.no_grad():
        for batch in micro_batches([len(s.token_ids) for s in samples], token_budget):
            ids, attn, mask = _tensors([samples[i] for i in batch], pad_id, model.device)  # (b, T)
            logp = token_logprobs(model, ids, attn, mask, temperature=temperature, chunk_size=chunk_size)  # (b, T)
            for row, i in enumerate(batch):
                old[i] = logp[row, : len(samples[i].token_ids)]
    return old


def _accumulate(model, part: list[Sample], old: list | None, n: int, totals: dict, *, temperature: float,
                clip_low: float, clip_high: float, kl_beta: float, pad_id: int, chunk_size: int) -> None:
    """Forward and backward of one micro-batch; the loss is divided by n, the optimizer step's sample count,
    so accumulated micro-batches give exactly the gradient of one big batch."""
    ids, attn, mask = _tensors(part, pad_id, model.device)  # (b, T) each
    logp = token_logprobs(model, ids, attn, mask, temperature=temperature, chunk_size=chunk_size)  # (b, T)
    # subtle: with one optimizer step per batch the weights that sampled are the weights scored here, so the
    # "old" log-probs are the current ones, detached: ratio == 1 in value, its gradient d logp (the policy
    # gradient). A re-score of the rollout would differ only by numerics (eval vs train mode, padding).
    old_logp = logp.detach() if old is None else _right_pad(old, 0.0, model.device, torch.float32)  # (b, T)
    ref = None
    if kl_beta > 0:
        with torch.no_grad(), model.disable_adapter():
            ref = token_logprobs(model, ids, attn, mask, temperature=temperature, chunk_size=chunk_size)
    adv = torch.tensor([s.advantage for s in part], dtype=torch.float32, device=model.device)  # (b,)
    per_sample, stats = ppo_clip_loss(logp, old_logp, mask, adv, clip_low=clip_low, clip_high=clip_high,
                                      kl_beta=kl_beta, ref_logp=ref)
    loss = per_sample.sum() / n
    loss.backward()
    totals["loss"] += loss.item()
    totals["padded_tokens"] += ids.numel()
    for k in ("clipped_tokens", "kl_sum", "tokens"):
        totals[k] += stats[k]


def update(model, optimizer, samples: list[Sample], *, temperature: float, clip_low: float = 0.2,
           clip_high: float = 0.28, kl_beta: float = 0.0, token_budget: int, max_grad_norm: float,
           pad_id: int = 0, updates: int = 1, seed: int = 0, chunk_size: int = 512) -> dict:
    """`updates` (K) optimizer steps over the samples. K = 1: ONE step on all of them (the ratio is 1, the clip
    cannot bind). K > 1: the samples are shuffled (by `seed`) into K mini-batches, one step each, against
    log-probs taken once before the first (cleanrl's PPO mini-batches): the ratio moves and the clip binds.
    Each step's samples go through token-budget micro-batches, gradients accumulated, then norm-clipped."""
    t0 = time.time()
    cuda = model.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    model.train()   # subtle: HF checkpoints only in train mode; in eval mode every activation would be stored
    order = list(range(len(samples)))
    if updates > 1:
        random.Random(seed).shuffle(order)
    shares = [order[k::updates] for k in range(min(updates, len(samples)))]
    old = _old_logprobs(model, samples, temperature=temperature, token_budget=token_budget, pad_id=pad_id,
                        chunk_size=chunk_size) if len(shares) > 1 else None
    params = [p for p in model.parameters() if p.requires_grad]
    totals = {"loss": 0.0, "clipped_tokens": 0.0, "kl_sum": 0.0, "tokens": 0.0, "padded_tokens": 0}
    norms = []
    for share in shares:
        optimizer.zero_grad(set_to_none=True)
        for batch in micro_batches([len(samples[i].token_ids) for i in share], token_budget):
            part = [samples[share[j]] for j in batch]
            _accumulate(model, part, None if old is None else [old[share[j]] for j in batch], len(share), totals,
                        temperature=temperature, clip_low=clip_low, clip_high=clip_high, kl_beta=kl_beta,
                        pad_id=pad_id, chunk_size=chunk_size)
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm)))
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    seconds = time.time() - t0
    # note: on CPU the figure is the process's peak resident memory so far, not this step's alone
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # Linux reports KiB
    n = max(totals["tokens"], 1.0)
    return {"loss": totals["loss"] / len(shares), "kl": totals["kl_sum"] / n, "clip_frac": totals["clipped_tokens"] / n,
            "grad_norm": sum(norms) / len(norms), "updates": len(shares), "tokens": int(totals["tokens"]),
            "padded_tokens": totals["padded_tokens"], "samples": len(samples), "seconds": seconds,
            "tokens_per_s": totals["tokens"] / max(seconds, 1e-9),
            "peak_mem_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else rss_mb}

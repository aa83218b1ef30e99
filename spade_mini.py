"""spade-mini, the model side: play environments in batch, and take the policy-gradient step.

One LLM plays two roles on the same weights (Environment Designer and Reasoning Agent). Every active episode
advances in ONE batched `generate` per turn, and each episode is ONE token-in/token-out sequence that the
update scores only where the model wrote it (loss mask 1 on replies, 0 on prompts and observations). The
model is loaded, and HF `generate` driven (padding, seeds, the KV cache kept across turns), by models.py; the
environments run in sandbox.py's child processes.

Departures from the paper and the official code are listed once, in docs/details.md ("Implementation details");
this module implements items 2, 3, 12, 18 and 31 (the update, its normalization, log-probs on the full softmax,
the KL estimator, a reply's given start); models.py has 1 and 19 (LoRA, the KV cache kept across turns).
"""
from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import envs
import models
import sandbox

# ----------------------------------------------------------------------------------------------------------------
# the rollout engine: all active episodes advance together, one generate per turn


@dataclass
class EpisodeSpec:
    code: str              # environment source
    seed: int              # explicit reset seed
    hint: str | None       # privileged hint appended to the first observation, or None
    key: tuple = ()        # the caller's id for this play; key[0] names its environment (hung ones are dropped)
    prompt: str = "agent.txt"  # the prompts/ file of the first message (games)
    reply_prefix: str = ""     # games: text every reply starts with, put in the prompt (not trained), e.g. \boxed{


@dataclass
class Episode:
    spec: EpisodeSpec
    token_ids: list[int] = field(default_factory=list)   # prompt, then replies (mask 1) and observations (mask 0)
    loss_mask: list[int] = field(default_factory=list)   # same length as token_ids
    rollout_logprobs: list[float] | None = field(default_factory=list)  # same length: the sampler's log-prob of
                                      # each reply token (models.Sampler), 0 elsewhere; None if a reply had none
    prompt_len: int = 0
    episode_return: float = 0.0  # envs.episode_return of the last step, in [-1, 1]
    turns: int = 0               # steps taken in the environment
    terminated: bool = False     # the environment reported its goal reached
    truncated: bool = False      # ended by the environment's truncated flag, max_turns or a cut reply
    failure: str | None = None   # SandboxError reason ("timeout", "memory", "error", ...) or "contract"
    transcript: list[dict] = field(default_factory=list)  # turn 0: first observation; then one dict per step
    tools: dict | None = None    # tool_use: the environment's tools (envs.parse_tools), read after reset
    tool_rounds: int = 0         # tool_use: replies that only called tools (they take no turn)

    def append(self, ids: list[int], trainable: bool, logprobs: list[float] | None = None) -> None:
        self.token_ids += ids
        self.loss_mask += [int(trainable)] * len(ids)
        if trainable and (logprobs is None or len(logprobs) < len(ids)):
            self.rollout_logprobs = None   # a stand-in's reply: nothing recorded, so no TIS and no mismatch
        elif self.rollout_logprobs is not None:
            self.rollout_logprobs += list(logprobs[: len(ids)]) if trainable else [0.0] * len(ids)


MAX_OBSERVATION_CHARS = 16_000  # about 4k tokens; longer observations are cut (they are not in the budget)
MAX_OBSERVATION_TOKENS = 256    # runs.Config.agent_max_observation_tokens
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


def _cut(ep: Episode, reply: models.Completion) -> None:
    """A reply the token limit cut (no stop token) ends the episode, truncated, with return 0 (as the official
    code does): half an answer is not sent to the environment as an action."""
    ep.episode_return, ep.truncated = 0.0, True
    ep.transcript.append({"turn": ep.turns + 1, "reply": ep.spec.reply_prefix + reply.text, "cut": True})


def _clip_observation(obs: str, tok, max_tokens: int) -> str:
    """note: observations are not in the token budget, so one is capped: in characters first (a hostile env may
    return up to the sandbox's message cap, ~1 MB), then in tokens (the width the memory plan counts on)."""
    cut = len(obs) > MAX_OBSERVATION_CHARS
    obs = obs[:MAX_OBSERVATION_CHARS]
    ids = models.text_ids(tok, obs)   # its markers as text (models.quoted), as the prompt will hold them
    if len(ids) > max_tokens:
        # room for the marker's tokens; a cut inside a multi-byte character decodes to U+FFFD, dropped
        obs, cut = tok.decode(ids[: max(1, max_tokens - 8)]).rstrip("\ufffd"), True
    return obs + "\n[observation truncated]" if cut else obs


def _begin(ep: Episode, raw, tok, thinking: bool, max_obs: int, tools=None, native_tools: bool = True) -> bool:
    """Reset result (and, tool_use, the tools' reply) -> first prompt. Returns whether the episode goes on."""
    for failed in (raw, tools):
        if isinstance(failed, sandbox.SandboxError):
            _fail(ep, failed.reason, failed.detail)
            return False
    try:
        obs = _clip_observation(envs.parse_reset(raw), tok, max_obs)
        ep.tools = None if tools is None else envs.parse_tools(tools)
    except envs.ContractError as err:
        _fail(ep, "contract", str(err))
        return False
    if ep.tools is None:
        ids = models.chat_ids(tok, envs.agent_first_message(obs, ep.spec.hint, ep.spec.prompt), thinking,
                              reply_prefix=ep.spec.reply_prefix)
    else:   # the template's own tool block, else the tools listed in the message (models.renders_tools)
        text = envs.agent_tool_message(obs, ep.spec.hint, None if native_tools else ep.tools)
        ids = models.chat_ids(tok, text, thinking, envs.tool_schemas(ep.tools) if native_tools else None)
    ep.append(ids, trainable=False)
    ep.prompt_len = len(ep.token_ids)
    ep.transcript.append({"turn": 0, "observation": obs})
    return True


def _advance(ep: Episode, raw, reply: models.Completion, action: str, tok, frame: tuple, max_turns: int,
             max_obs: int) -> bool:
    """Step result -> transcript, return and the observation's tokens. Returns whether the episode goes on."""
    if isinstance(raw, sandbox.SandboxError):
        _fail(ep, raw.reason, raw.detail)
        return False
    try:
        obs, reward, terminated, truncated = envs.parse_step(raw)
    except envs.ContractError as err:
        _fail(ep, "contract", str(err))
        return False
    obs = _clip_observation(obs, tok, max_obs)
    ep.turns += 1
    ep.transcript.append({"turn": ep.turns, "reply": ep.spec.reply_prefix + reply.text, "action": action,
                          "observation": obs, "reward": reward, "terminated": terminated, "truncated": truncated})
    ep.terminated = terminated
    ep.episode_return = envs.episode_return(reward, terminated, False)
    if terminated or truncated or ep.turns >= max_turns:
        ep.truncated = not terminated
        return False
    ep.append(models.observation_ids(tok, obs, reply.completion_ids, (frame[0], frame[1] + ep.spec.reply_prefix)),
              trainable=False)
    return True


def _drop_hung(eps: list[Episode], active: list[int]) -> list[int]:
    """A hung environment is dropped for the rest of the step: once one play of it (same spec.key[0]) times
    out, its other plays stop too, so one bad environment cannot cost a deadline per play per turn."""
    hung = {ep.spec.key[0] for ep in eps if ep.failure == "timeout" and ep.spec.key}
    for i in active:
        if eps[i].spec.key and eps[i].spec.key[0] in hung:
            _fail(eps[i], "dropped", "another play of this environment timed out")
    return [i for i in active if eps[i].failure is None]


def _reset_all(eps: list[Episode], procs: list, tok, thinking: bool, max_obs: int, tool_use: bool = False) -> list[int]:
    """Reset every started environment (in parallel) into its episode's first prompt, with its tools for
    tool_use; the episodes that go on."""
    live = [i for i, p in enumerate(procs) if not isinstance(p, sandbox.SandboxError)]
    for i in sorted(set(range(len(eps))) - set(live)):
        _begin(eps[i], procs[i], tok, thinking, max_obs)  # records the start failure
    raws = sandbox.call_many([procs[i] for i in live], "reset", [(eps[i].spec.seed,) for i in live])
    tools = sandbox.call_many([procs[i] for i in live], ":tools", [()] * len(live)) if tool_use else [None] * len(live)
    native = models.renders_tools(tok) if tool_use else True
    return _drop_hung(eps, [i for i, raw, t in zip(live, raws, tools)
                            if _begin(eps[i], raw, tok, thinking, max_obs, t, native)])


def _run_tools(eps: list[Episode], procs: list, calling: list[tuple], tok, frame: tuple, tool_rounds: int,
               max_obs: int) -> list[int]:
    """Execute the tool calls of each (episode, reply, calls) in its sandbox, the k-th calls of all episodes in
    one round trip; a bad call (envs.check_tool_call) gets its error text without reaching the environment.
    The results go back as one tool message (loss mask 0). A reply that only calls tools takes no turn; after
    `tool_rounds` of them the episode ends, truncated, return 0. Returns the episodes that go on."""
    results = {i: [envs.check_tool_call(c, eps[i].tools) for c in calls] for i, _, calls in calling}
    for k in range(max((len(c) for _, _, c in calling), default=0)):
        todo = [(i, calls[k]) for i, _, calls in calling if k < len(calls) and results[i][k] is None
                and eps[i].failure is None]
        raws = sandbox.call_many([procs[i] for i, _ in todo], ":tool", [(c["name"], c["arguments"]) for _, c in todo])
        for (i, _), raw in zip(todo, raws):
            try:
                if isinstance(raw, sandbox.SandboxError):
                    raise raw
                results[i][k] = envs.tool_result(raw)[0]
            except (sandbox.SandboxError, envs.ContractError) as err:
                _fail(eps[i], getattr(err, "reason", "contract"), str(err))
    going = []
    for i, reply, calls in calling:
        ep = eps[i]
        if ep.failure is not None:
            continue
        ep.tool_rounds += 1
        text = _clip_observation("\n\n".join(results[i]), tok, max_obs)
        ep.transcript.append({"turn": ep.turns, "reply": reply.text, "tool_calls": calls, "tool_results": results[i]})
        if ep.tool_rounds > tool_rounds:
            ep.episode_return, ep.truncated = 0.0, True
            continue
        ep.append(models.observation_ids(tok, text, reply.completion_ids, frame), trainable=False)
        going.append(i)
    return going


def _take_replies(eps: list[Episode], active: list[int], replies: list, room: dict) -> tuple[list, list]:
    """Append each reply (cut to its episode's room) as trained tokens; (episode, reply, action) of the replies
    to play, and (episode, reply, tool calls) of the tool-use replies that only call tools. A reply without its
    stop token was cut (turn limit or episode budget): not played."""
    stepping, calling = [], []
    for i, reply in zip(active, replies):
        cut = len(reply.completion_ids) > room[i] or not reply.finished
        reply.completion_ids = reply.completion_ids[: room[i]]
        eps[i].append(reply.completion_ids, trainable=True, logprobs=reply.logprobs)
        if cut:
            _cut(eps[i], reply)
        else:
            text = eps[i].spec.reply_prefix + envs.after_thinking(reply.text)   # the reply with its given start
            calls = envs.parse_tool_calls(text) if eps[i].tools is not None else []
            if not envs.goes_to_step(text, calls):
                calling.append((i, reply, calls))
            else:
                stepping.append((i, reply, text if eps[i].tools is not None else envs.to_action(text)))
    return stepping, calling


def play(model, tok, specs: list[EpisodeSpec], *, max_turns: int, max_new_tokens: int, max_episode_tokens: int,
         temperature: float, top_p: float, top_k: int, seed: int, limits, static_cache: bool = False, bf16=False,
         reuse_cache: bool = True, stats: dict | None = None, thinking: bool = False, setting: str = "games",
         tool_rounds: int = 8, max_observation_tokens: int = MAX_OBSERVATION_TOKENS) -> list[Episode]:
    """Play every spec to the end; each turn ALL active episodes share ONE generate call.

    Budgets: a reply gets at most max_new_tokens; an episode at most max_episode_tokens generated tokens over
    all its turns. A reply cut by either (no stop token) is not played: the episode ends, truncated, return 0.
    reuse_cache: keep the KV cache across turns, so a turn prefills only the new observation (not with static_cache,
    rebuilt every call). stats: gets generate_s, sandbox_s, generated_tokens, generate_calls. thinking: rendered with
    enable_thinking, the action read after the last </think>, thinking tokens in both budgets. Observations:
    max_observation_tokens. setting "tool_use": a reply's <tool_call>s run in the sandbox and return as a tool
    message (_run_tools), taking no turn (at most tool_rounds such replies); a reply with <answer> or no tool call
    goes to step(). The weights' copies (bf16: --generate-bf16) are made once a play."""
    eps = [Episode(spec=s) for s in specs]
    timing = {"generate_s": 0.0, "sandbox_s": 0.0, "generated_tokens": 0, "generate_calls": 0}
    t = time.time()
    tool_use = setting == "tool_use"
    procs, frame = _open_all(specs, max_turns, limits), models.turn_frame(tok, thinking)
    tool_frame = models.turn_frame(tok, thinking, "tool") if tool_use else frame
    batch, deltas = None, {}
    try:
        with models.generation_weights(model, bf16, static_cache):
            active = _reset_all(eps, procs, tok, thinking, max_observation_tokens, tool_use)
            timing["sandbox_s"] += time.time() - t
            for turn in range(max_turns + (tool_rounds if tool_use else 0)):
                room = {i: max_episode_tokens - sum(eps[i].loss_mask) for i in active}
                active = [i for i in active if room[i] > 0]
                if not active:
                    break
                t = time.time()
                gen = dict(max_new_tokens=min(max_new_tokens, max(room[i] for i in active)), temperature=temperature,
                           top_p=top_p, top_k=top_k, seed=(seed * 1_000_003 + turn) % 2**31, bf16=bf16)
                if reuse_cache and not static_cache:
                    replies, batch = models.generate_turn(model, tok, active, [eps[i].token_ids for i in active], batch,
                                                          [deltas.get(i, []) for i in active], **gen)
                else:
                    replies = models.generate(model, tok, [eps[i].token_ids for i in active], static_cache=static_cache,
                                              **gen)
                timing["generate_s"] += time.time() - t
                timing["generate_calls"] += 1
                stepping, calling = _take_replies(eps, active, replies, room)
                timing["generated_tokens"] += sum(len(r.completion_ids) for r in replies)
                t = time.time()
                before = {i: len(eps[i].token_ids) for i, _, _ in stepping + calling}
                raws = sandbox.call_many([procs[i] for i, _, _ in stepping], "step", [(a,) for _, _, a in stepping])
                active = _drop_hung(eps, sorted([i for (i, reply, action), raw in zip(stepping, raws)
                                          if _advance(eps[i], raw, reply, action, tok, frame,
                                                      procs[i].max_turns or max_turns, max_observation_tokens)]
                                            + _run_tools(eps, procs, calling, tok, tool_frame, tool_rounds,
                                                         max_observation_tokens)))
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


TIS_CAP = 2.0  # truncated importance sampling: the weight pi_old / pi_sampling is clamped to [0, 2]
KL_CAP = 10.0  # each token's k3 KL term is clamped to [0, 10], as slime's low_var_kl


@dataclass
class Sample:
    token_ids: list[int]
    loss_mask: list[int]   # 1 where the model wrote the token (trained), 0 for prompt/observations/padding
    advantage: float
    role: str              # "agent" or "designer"
    sampling_logprobs: list[float] | None = None  # (T,) the sampling policy's (TIS); None: pi_old's
    rollout_logprobs: list[float] | None = None   # (T,) the sampler's own record (models.Sampler): the mismatch


def _chunk_logprobs(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module,
                    temperature: float) -> torch.Tensor:
    # note: under bf16 autocast the LM head still runs on fp32 tensors: bf16 logits (8 bits of mantissa) would move
    # a log-prob by ~0.03 at logit 10, more than every other rounding here together (models.bf16_head: bf16 inputs)
    with torch.autocast(hidden.device.type, enabled=False):
        logp = models.tempered_logprobs(head(hidden.to(head.weight.dtype)), temperature, in_place=True)  # (C, V)
    return logp.gather(-1, targets[:, None]).squeeze(-1)  # (C,): one fused pass, not logsumexp's 3


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
    parts = [checkpoint(_chunk_logprobs, h[s: s + chunk_size], y[s: s + chunk_size], head, temperature,
                        use_reentrant=False)
             for s in range(0, h.shape[0], chunk_size)]
    flat = torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)  # (N,)
    out = torch.zeros(wanted.shape, dtype=flat.dtype, device=flat.device).masked_scatter(wanted, flat)  # (B, T-1)
    return F.pad(out, (1, 0))  # (B, T)


def k3(log_r: torch.Tensor) -> torch.Tensor:
    """The k3 estimate of a KL from log r, r = p(x)/q(x) at x drawn from q: r - 1 - log r (>= 0, 0 at r = 1).

    >>> [round(float(x), 4) for x in k3(torch.tensor([0.0, 0.5, 1.0]))]
    [0.0, 0.1487, 0.7183]
    """
    return log_r.exp() - 1 - log_r


def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, loss_mask: torch.Tensor, advantages: torch.Tensor, *,
                  clip_low: float, clip_high: float, kl_beta: float = 0.0, ref_logp: torch.Tensor | None = None,
                  sampling_logp: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Per-sample loss (B,) = mean over the sample's trainable tokens of the PPO-clip token loss, times the
    truncated importance weight w = clamp(pi_old / pi_sampling, 0, 2) when the sampling policy's log-probs are
    given (stale samples; the official "TIS"), + beta * min(k3, 10) (not weighted by TIS, as in slime).

    Worked example: one token, A = 2, logp = old -> ratio 1 -> loss = -min(1*2, clip(1, 0.8, 1.28)*2) = -2;
    sampled at log-prob old - ln 1.5: w = 1.5, loss -3; at old - ln 3: w = min(3, 2) = 2, loss -4 (truncated).
    """
    mask = loss_mask.float()  # (B, T)
    ratio = torch.exp(logp - old_logp)  # (B, T)
    adv = advantages[:, None]  # (B, 1)
    unclipped, clipped = ratio * adv, ratio.clamp(1 - clip_low, 1 + clip_high) * adv  # (B, T)
    is_ratio = torch.ones_like(mask) if sampling_logp is None else torch.exp(old_logp - sampling_logp).detach()
    per_token = -torch.minimum(unclipped, clipped) * is_ratio.clamp(0, TIS_CAP)  # (B, T)
    kl = torch.zeros_like(per_token)
    if ref_logp is not None:
        log_r = ref_logp - logp  # (B, T)
        kl = k3(log_r).clamp(max=KL_CAP)  # KL(policy || reference) from the policy's own tokens
        per_token = per_token + kl_beta * kl
    n = mask.sum(1).clamp(min=1)  # (B,)
    per_sample = (per_token * mask).sum(1) / n  # (B,)
    stats = {"clipped_tokens": float(((clipped < unclipped).float() * mask).sum()),
             "kl_sum": float((kl.detach() * mask).sum()), "tokens": float(mask.sum()),
             "is_sum": float((is_ratio * mask).sum()), "is_sq_sum": float((is_ratio ** 2 * mask).sum()),
             "truncated_tokens": float(((is_ratio > TIS_CAP).float() * mask).sum()),
             "per_token": per_token.detach(), "tis_weight": is_ratio.clamp(0, TIS_CAP), "kl": kl.detach()}  # (B, T)
    return per_sample, stats


def mismatch(trainer_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
    """(sum of k3, max |delta|, tokens) over the masked tokens of one sample: how far the trainer's pi_old is from
    the log-probs the sampler drew the same tokens with. k3 = r - 1 - log r with r = pi_old / pi_sampler, an
    estimate of KL(sampler || trainer) from the sampler's own tokens (>= 0, 0 when on-policy; both over the full
    vocabulary, though the draw is from the top-k/top-p cut). Shapes (T,). Worked example: two tokens, trainer
    -1.0 and -2.0, sampler -1.0 and -2.5: log r = 0 and 0.5, k3 = 0 and e^0.5 - 1.5 = 0.1487; max |delta| 0.5.
    >>> [round(x, 4) for x in mismatch(torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -2.5]), torch.ones(2))]
    [0.1487, 0.5, 2.0]
    """
    keep = mask.bool()
    log_r = (trainer_logp - rollout_logp)[keep].double()  # (N,)
    if log_r.numel() == 0:
        return 0.0, 0.0, 0.0
    return float(k3(log_r).sum()), float(log_r.abs().max()), float(log_r.numel())


def sampled_logprobs(model, rows: list, *, temperature: float, token_budget: int, pad_id: int,
                     chunk_size: int = 512, bf16: bool = False) -> list[list[float]]:
    """The current weights' log-probs (T,) of each (token_ids, loss_mask) row (0 where the mask is 0), in eval
    mode (no dropout, as when sampled) with the update's own token_logprobs: before a step, pi_old."""
    out: list = [None] * len(rows)
    model.eval()
    with torch.no_grad(), models.autocast(bf16, model), models.bf16_head(model, bf16):   # the update's LM head
        for batch in models.micro_batches([len(ids) for ids, _ in rows], token_budget):
            ids, attn, mask = models.batch_tensors([rows[j] for j in batch], pad_id, model.device)  # (b, T)
            logp = token_logprobs(model, ids, attn, mask, temperature=temperature, chunk_size=chunk_size)  # (b, T)
            for row, j in enumerate(batch):
                out[j] = logp[row, : len(rows[j][0])].tolist()
    return out


def _accumulate(model, part: list[Sample], old: list | None, n: int, totals: dict, *, temperature: float, clip_low: float,
                clip_high: float, kl_beta: float, pad_id: int, chunk_size: int, bf16: bool = False) -> None:
    """Forward and backward of one micro-batch; the loss is divided by n, the optimizer step's sample count,
    so accumulated micro-batches give exactly the gradient of one big batch."""
    ids, attn, mask = models.batch_tensors([(s.token_ids, s.loss_mask) for s in part], pad_id, model.device)  # (b, T)
    with models.autocast(bf16, model):   # --train-bf16: the forward's matmuls in bf16 (the backward follows them)
        logp = token_logprobs(model, ids, attn, mask, temperature=temperature, chunk_size=chunk_size)  # (b, T)
    # subtle: with one optimizer step, pi_old (the weights before this step) are the weights scored here, so
    # the "old" log-probs are the current ones, detached: ratio == 1 in value, its gradient d logp. A sample
    # sampled by earlier weights (a designer's, R - 1 steps old) is corrected by TIS against its sampling ones.
    old_logp = logp.detach() if old is None else models.right_pad(old, 0.0, model.device, torch.float32)  # (b, T)
    sampling = old_logp.clone()  # (b, T): a sample without its own was sampled by pi_old itself (w = 1)
    for i, s in enumerate(part):
        if s.sampling_logprobs is not None:
            sampling[i, : len(s.sampling_logprobs)] = torch.tensor(s.sampling_logprobs, device=model.device)
    ref = None
    if kl_beta > 0:
        with torch.no_grad(), model.disable_adapter(), models.autocast(bf16, model):
            ref = token_logprobs(model, ids, attn, mask, temperature=temperature, chunk_size=chunk_size)
    adv = torch.tensor([s.advantage for s in part], dtype=torch.float32, device=model.device)  # (b,)
    per_sample, stats = ppo_clip_loss(logp, old_logp, mask, adv, clip_low=clip_low, clip_high=clip_high,
                                      kl_beta=kl_beta, ref_logp=ref, sampling_logp=sampling)
    loss = per_sample.sum() / n
    loss.backward()
    for i, s in enumerate(part):
        if s.rollout_logprobs is not None:
            totals[f"mismatch_{s.role}"].append(mismatch(old_logp[i, : len(s.rollout_logprobs)], torch.tensor(
                s.rollout_logprobs, device=model.device), mask[i, : len(s.rollout_logprobs)]))
    totals["loss"] += loss.item()
    totals["padded_tokens"] += ids.numel()
    totals["processed_tokens"] += int(attn.sum())   # every real token the forward and backward went through
    for k in ("clipped_tokens", "kl_sum", "tokens", "is_sum", "is_sq_sum", "truncated_tokens"):
        totals[k] += stats[k]


def _grad_norm(params: list, before: list) -> float:
    """The L2 norm of what the gradients gained since `before` (a copy of each .grad, None where unset)."""
    total = 0.0
    for p, b in zip(params, before):
        if p.grad is not None:
            total += float(((p.grad - b) if b is not None else p.grad).float().pow(2).sum())
    return total ** 0.5


def _role_gradients(model, samples: list[Sample], own: list[int], old: dict | None, n: int, totals: dict,
                    params: list, token_budget: int, **loss_kw) -> dict:
    """One optimizer step's gradient from this rank's samples `own`, accumulated role by role (the agent's
    micro-batches, then the designer's) -> the norm of each role's part (this rank's share: taken before the
    all-reduce), None for a role without samples."""
    norms = {}
    for role in ("agent", "designer"):
        ours = [i for i in own if samples[i].role == role]
        before = [p.grad.detach().clone() if p.grad is not None else None for p in params]
        for batch in models.micro_batches([len(samples[i].token_ids) for i in ours], token_budget):
            part_old = None if old is None else [old[ours[j]] for j in batch]
            _accumulate(model, [samples[ours[j]] for j in batch], part_old, n, totals, **loss_kw)
        norms[role] = _grad_norm(params, before) if ours else None
    return norms


def update(model, optimizer, samples: list[Sample], *, temperature: float, clip_low: float = 0.2,
           clip_high: float = 0.28, kl_beta: float = 0.0, token_budget: int, max_grad_norm: float,
           pad_id: int = 0, updates: int = 1, seed: int = 0, chunk_size: int = 512, bf16: bool = False) -> dict:
    """`updates` (K) optimizer steps over the samples. K = 1: ONE step on all of them (the ratio is 1, the clip
    cannot bind). K > 1: the samples are shuffled (by `seed`) into K mini-batches, one step each, against log-probs
    taken once before the first (cleanrl's PPO mini-batches): the ratio moves and the clip binds. A sample with
    sampling_logprobs (sampled by earlier weights) is weighted by TIS, ppo_clip_loss's w. Each step's samples go
    through token-budget micro-batches (the agent's, then the designer's: grad_norm_<role> is each role's part of
    the gradient), gradients accumulated, then norm-clipped; tokens_per_s counts every token the forward and
    backward processed (prompts included, pads not). Under torchrun each rank takes its share of every step's
    samples (the same shuffle on every rank), divides by the step's GLOBAL sample count, and the gradients are
    summed over the ranks before the clip: one process's step."""
    t0 = time.time()
    models.reset_peak_memory(model)
    order = list(range(len(samples)))
    if updates > 1:
        random.Random(seed).shuffle(order)
    shares = [order[k::updates] for k in range(min(updates, len(samples)))] or [[]]   # no samples: a no-op step
    mine = [models.my_share(share) for share in shares]    # this rank's part of each step (all, in one process)
    wanted = sorted(i for part in mine for i in part)
    # pi_old with dropout off, as pi_sampling; K = 1 without dropout reuses the step's own, detached (_accumulate)
    dropout = any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
    params = [p for p in model.parameters() if p.requires_grad]
    totals = dict.fromkeys(("loss", "clipped_tokens", "kl_sum", "tokens", "is_sum", "is_sq_sum", "truncated_tokens"), 0.0)
    totals.update(padded_tokens=0, processed_tokens=0, mismatch_agent=[], mismatch_designer=[])
    norms, role_norms = [], {"agent": [], "designer": []}
    loss_kw = dict(temperature=temperature, clip_low=clip_low, clip_high=clip_high, kl_beta=kl_beta, pad_id=pad_id,
                   chunk_size=chunk_size, bf16=bf16)
    with models.update_levers(model, bf16, tokens=max([token_budget] + [len(s.token_ids) for s in samples])):
        old = None if len(shares) == 1 and not dropout else dict(zip(wanted, sampled_logprobs(
            model, [(samples[i].token_ids, samples[i].loss_mask) for i in wanted], temperature=temperature,
            token_budget=token_budget, pad_id=pad_id, chunk_size=chunk_size, bf16=bf16)))
        model.train()   # subtle: HF checkpoints only in train mode; in eval mode every activation would be stored
        for share, own in zip(shares, mine):
            optimizer.zero_grad(set_to_none=True)
            for role, norm in _role_gradients(model, samples, own, old, len(share), totals, params, token_budget,
                                              **loss_kw).items():
                role_norms[role] += [norm] if norm is not None else []
            models.sum_gradients(params)    # torchrun: the gradient of all the step's samples, then clipped
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm)))
            optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    seconds = time.time() - t0
    rate = totals["processed_tokens"] / max(seconds, 1e-9)    # this rank's: prompts included, pads not
    found = {role: models.gather(totals.pop(f"mismatch_{role}"), "the mismatch") for role in ("agent", "designer")}
    models.sum_totals(totals, model.device)         # torchrun: the step's loss and token counts over all ranks
    found = {role: [m for rank in parts for m in rank] for role, parts in found.items()}
    n = max(totals["tokens"], 1.0)
    is_mean = totals["is_sum"] / n   # the TIS ratio pi_old / pi_sampling over the trained tokens: mean, std
    return {"loss": totals["loss"] / len(shares), "kl": totals["kl_sum"] / n, "clip_frac": totals["clipped_tokens"] / n,
            "grad_norm": sum(norms) / len(norms), "updates": len(shares), "tokens": int(totals["tokens"]),
            "processed_tokens": int(totals["processed_tokens"]),
            **{f"grad_norm_{role}": sum(ns) / len(ns) if ns else None for role, ns in role_norms.items()},
            "padded_tokens": totals["padded_tokens"], "samples": len(samples), "seconds": seconds,
            "tokens_per_s": rate, "is_ratio_mean": is_mean, "tis_frac": totals["truncated_tokens"] / n,
            "is_ratio_std": max(totals["is_sq_sum"] / n - is_mean ** 2, 0.0) ** 0.5,
            "peak_mem_mb": models.peak_memory_mb(model),
            **{f"mismatch_k3_{role}": sum(m[0] for m in ms) / max(sum(m[2] for m in ms), 1.0) if ms else None
               for role, ms in found.items()},
            **{f"mismatch_max_{role}": max(m[1] for m in ms) if ms else None for role, ms in found.items()}}

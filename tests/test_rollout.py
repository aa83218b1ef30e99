"""The rollout engine on a tiny random model with small deterministic environments (run in the real sandbox):
batched play equals one-at-a-time play, one generate per turn, budgets, failures, and token-in/token-out
sequences that match the chat template."""
import copy
import os

import pytest

import envs
import sandbox
import spade_mini as sm
import models

CACHE = os.path.expanduser(os.environ.get("SPADE_MINI_CACHE", "~/.cache/spade-mini"))

# Terminates at turn 1 + seed % 3 with reward 1 (0.1 before); the observation echoes the action's length, so
# different replies lead to different observations.
COUNTER_ENV = '''
class CounterEnv:
    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.goal, self.turn = 1 + (seed or 0) % 3, 0
        return f"Reach turn {self.goal}. Answer with \\\\boxed{{...}}.", {}

    def step(self, action):
        self.turn += 1
        done = self.turn >= self.goal
        obs = f"turn {self.turn}: your action had {len(action)} characters."
        return obs, 1.0 if done else 0.1, done, self.turn >= self.max_turns, {}
'''

RAISING_ENV = '''
class RaisingEnv:
    def __init__(self, max_turns=12):
        self.turn = 0

    def reset(self, seed=None):
        return "press anything", {}

    def step(self, action):
        self.turn += 1
        if self.turn == 2:
            raise ValueError("bad move")
        return "again", 0.5, False, False, {}
'''

FOUR_TUPLE_ENV = '''
class ShortEnv:
    def __init__(self, max_turns=12):
        pass

    def reset(self, seed=None):
        return "go", {}

    def step(self, action):
        return "x", 0.0, False, {}
'''

GREEDY = dict(temperature=0.0, top_p=1.0, top_k=0, seed=0)


@pytest.fixture(scope="module")
def tiny_model():
    model, tok, _ = models.load_model("tiny-random", lora_r=4, lora_alpha=8, lora_dropout=0.0, quantize="none",
                                  gradient_checkpointing=False, cache_dir=CACHE, seed=0)
    return model, tok


def run(model, tok, specs, max_turns=5, max_new_tokens=64, max_episode_tokens=256):
    """note: the tiny model's replies end (stop token) after ~7-20 tokens; a reply cut at max_new_tokens would
    not be played, so the limit leaves room."""
    return sm.play(model, tok, specs, max_turns=max_turns, max_new_tokens=max_new_tokens,
                   max_episode_tokens=max_episode_tokens, limits=sandbox.Limits(), **GREEDY)


def counter_specs(n: int) -> list[sm.EpisodeSpec]:
    """Seeds 0..n-1 -> goals 1, 2, 3, 1, 2, ...; every other play has a hint (a longer prompt)."""
    return [sm.EpisodeSpec(COUNTER_ENV, seed, "try something short" if seed % 2 else None, (seed,))
            for seed in range(n)]


def as_tuple(ep: sm.Episode):
    return ep.token_ids, ep.loss_mask, ep.prompt_len, ep.episode_return, ep.turns, ep.terminated, ep.failure, ep.transcript


def test_batched_rollouts_equal_one_at_a_time_rollouts(tiny_model):
    model, tok = tiny_model
    specs = counter_specs(5)
    batched = run(model, tok, specs)
    single = [run(model, tok, [s])[0] for s in specs]
    assert [as_tuple(e) for e in batched] == [as_tuple(e) for e in single]
    assert [e.turns for e in batched] == [1, 2, 3, 1, 2]
    assert all(e.terminated and e.episode_return == 1.0 and e.failure is None for e in batched)


def test_kv_cache_reuse_across_turns_equals_full_recompute(tiny_model, monkeypatch):
    """The engine prefills only each turn's new tokens (middle padding, rows dropped from the cache); the
    episodes must be those of re-reading every sequence from scratch each turn."""
    model, tok = tiny_model
    specs = counter_specs(6)
    kw = dict(max_turns=4, max_new_tokens=64, max_episode_tokens=256, limits=sandbox.Limits(), **GREEDY)
    turns, real = [], models.generate_turn   # (a cache carried over, the new tokens of each row) per turn

    def spy(model_, tok_, rows, sequences, prev, deltas, **gen):
        turns.append((prev is not None, [len(d) for d in deltas]))
        return real(model_, tok_, rows, sequences, prev, deltas, **gen)
    monkeypatch.setattr(models, "generate_turn", spy)
    reused = sm.play(model, tok, specs, reuse_cache=True, **kw)
    monkeypatch.undo()
    assert len(turns) >= 2 and turns[0][0] is False and all(kept and min(new) > 0 for kept, new in turns[1:]), turns
    fresh = sm.play(model, tok, specs, reuse_cache=False, **kw)
    assert [as_tuple(e) for e in reused] == [as_tuple(e) for e in fresh]


def test_one_generate_per_turn_and_finished_episodes_drop_out(tiny_model, monkeypatch):
    """Counts the HF generate calls themselves and their batch sizes."""
    model, tok = tiny_model
    batch_sizes = []
    real_generate = model.generate

    def counting(**kw):
        batch_sizes.append(kw["input_ids"].shape[0])
        return real_generate(**kw)

    monkeypatch.setattr(model, "generate", counting)
    run(model, tok, counter_specs(5))
    assert batch_sizes == [5, 3, 1]  # goals 1,2,3,1,2: two finish after turn 1, two more after turn 2


def test_episode_sequence_decodes_to_the_rendered_conversation(tiny_model):
    """prompt (mask 0), reply (mask 1), observation delta (mask 0), ... decodes to the chat template's
    rendering of the same conversation."""
    model, tok = tiny_model
    ep = run(model, tok, counter_specs(3))[2]  # goal 3: three replies, two observations in between
    spans = []  # [mask value, length] runs
    for m in ep.loss_mask:
        if spans and spans[-1][0] == m:
            spans[-1][1] += 1
        else:
            spans.append([m, 1])
    assert [m for m, _ in spans] == [0, 1, 0, 1, 0, 1] and spans[0][1] == ep.prompt_len
    pos, replies = 0, []
    for m, n in spans:
        if m:
            replies.append(tok.decode(ep.token_ids[pos: pos + n]))
        pos += n
    obs = [t["observation"] for t in ep.transcript]
    messages = [{"role": "user", "content": envs.agent_first_message(obs[0], None)}]
    for reply, o in zip(replies[:-1], obs[1:]):  # the last reply ended the episode: no observation follows
        # a finished reply ends in its stop token, which the template writes itself after the content
        messages += [{"role": "assistant", "content": reply.removesuffix(tok.eos_token)}, {"role": "user", "content": o}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + replies[-1]
    assert tok.decode(ep.token_ids) == rendered


def conversation(tok, turns: list[tuple[list[int], str]]) -> tuple[list[int], str]:
    """(our ids, the template's text) for a first message then (reply ids, observation) pairs."""
    ids = models.chat_ids(tok, "Observation: start")
    messages = [{"role": "user", "content": "Observation: start"}]
    for reply_ids, obs in turns:
        ids = ids + reply_ids + models.observation_ids(tok, obs, reply_ids)
        content = tok.decode([t for t in reply_ids if t != tok.eos_token_id])
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": obs}]
    return ids, tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_observation_delta_matches_smollm2_template(tiny_model):
    _, tok = tiny_model
    done = tok("I move \\boxed{left}.", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    cut = tok("Let me think about it", add_special_tokens=False)["input_ids"]  # max_new_tokens hit: no eos
    ids, text = conversation(tok, [(done, "You moved left.\nReward 0.1"), (cut, "No action found.")])
    assert tok.decode(ids) == text
    assert ids == tok(text, add_special_tokens=False)["input_ids"]


def test_observation_delta_matches_another_template(tiny_model):
    """A template with no system prompt, no newlines between turns, ': ' separators and its own eos.

    Only the text must match here: the template's "assistant: " ends in a space that BPE would merge with the
    reply's first token if the whole text were tokenized at once, while the model generated its own tokens."""
    _, tok = tiny_model
    other = copy.deepcopy(tok)
    other.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}: {{ m['content'] }}<|endoftext|>"
                           "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant: {% endif %}")
    other.eos_token = "<|endoftext|>"
    done = other("\\boxed{3}", add_special_tokens=False)["input_ids"] + [other.eos_token_id]
    ids, text = conversation(other, [(done, "wrong, try again"), (done, "right")])
    assert other.decode(ids) == text


def test_hint_is_appended_to_first_observation(tiny_model):
    model, tok = tiny_model
    ep = run(model, tok, [sm.EpisodeSpec(COUNTER_ENV, 0, "go left first", ("h",))])[0]
    assert "\n\nHINT: go left first" in tok.decode(ep.token_ids[: ep.prompt_len])


def test_exception_in_step_ends_episode_with_minus_one(tiny_model):
    model, tok = tiny_model
    ep = run(model, tok, [sm.EpisodeSpec(RAISING_ENV, 1, None, ())])[0]
    assert ep.failure == "error" and ep.episode_return == -1.0 and ep.turns == 1 and not ep.terminated
    assert "bad move" in ep.transcript[-1]["error"]


def test_contract_violation_ends_episode_with_minus_one(tiny_model):
    model, tok = tiny_model
    ep = run(model, tok, [sm.EpisodeSpec(FOUR_TUPLE_ENV, 1, None, ())])[0]
    assert ep.failure == "contract" and ep.episode_return == -1.0 and ep.turns == 0


def test_environment_that_fails_to_start_gets_a_failure_not_a_crash(tiny_model):
    model, tok = tiny_model
    eps = run(model, tok, [sm.EpisodeSpec("class Broken(:", 1, None, ()), counter_specs(1)[0]])
    assert eps[0].failure == "syntax" and eps[0].episode_return == -1.0 and eps[0].token_ids == []
    assert eps[1].failure is None and eps[1].episode_return == 1.0


def test_episode_token_budget_cuts_the_last_reply_and_ends_the_episode(tiny_model):
    """Goal at turn 3. With an episode budget of (turn 1's reply length + 3) tokens, turn 2's reply is cut to 3
    tokens and not played: the episode ends after one step, truncated, with return 0."""
    model, tok = tiny_model
    n1 = sum(run(model, tok, [counter_specs(3)[2]], max_turns=1)[0].loss_mask)  # greedy: the same reply again
    ep = run(model, tok, [counter_specs(3)[2]], max_episode_tokens=n1 + 3)[0]
    assert sum(ep.loss_mask) == n1 + 3 and ep.turns == 1 and ep.episode_return == 0.0 and not ep.terminated
    assert ep.truncated and ep.transcript[-1]["cut"] and ep.loss_mask[-3:] == [1, 1, 1] and ep.failure is None


def test_max_turns_truncates_with_return_zero(tiny_model):
    model, tok = tiny_model
    ep = run(model, tok, [counter_specs(3)[2]], max_turns=2)[0]
    assert ep.turns == 2 and not ep.terminated and ep.episode_return == 0.0
    assert ep.transcript[-1]["truncated"] is True


# Hangs on its second step when the seed is odd; otherwise runs for many turns.
HANGING_ENV = '''
class HangEnv:
    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.seed, self.turn = seed, 0
        return "keep going, answer in \\\\boxed{}", {}

    def step(self, action):
        self.turn += 1
        while self.seed % 2 == 1 and self.turn == 2:
            pass
        return "again", 0.0, False, self.turn >= self.max_turns, {}
'''


def test_a_hung_environment_is_dropped_for_its_other_plays(tiny_model):
    model, tok = tiny_model
    specs = [sm.EpisodeSpec(HANGING_ENV, 1, None, (0, False, 0)), sm.EpisodeSpec(HANGING_ENV, 2, None, (0, False, 1)),
             sm.EpisodeSpec(COUNTER_ENV, 2, None, (1, False, 0))]
    hang, sibling, other = sm.play(model, tok, specs, max_turns=5, max_new_tokens=64, max_episode_tokens=256,
                                   limits=sandbox.Limits(call_timeout=1.0), **GREEDY)
    assert hang.failure == "timeout" and hang.turns == 1
    assert sibling.failure == "dropped" and sibling.turns == 2     # stopped with its environment, not at max_turns
    assert other.failure is None and other.terminated               # another environment is untouched


ECHO_ENV = '''
class EchoEnv:
    def __init__(self, max_turns=12):
        pass

    def reset(self, seed=None):
        return "Say anything.", {}

    def step(self, action):
        return "You sent " + action, 0.0, False, False, {}
'''


def test_reply_prefix_starts_every_reply_in_the_prompt_untrained_and_is_read_with_the_reply(tiny_model):
    """--agent-reply-prefix: the prefix ends the first prompt and every observation's frame (loss mask 0), and
    the environment receives the action parsed from prefix + the generated text; without the prefix the same
    model's replies hold no boxed action at all."""
    model, tok = tiny_model
    prefix = "\\boxed{"
    ep = run(model, tok, [sm.EpisodeSpec(ECHO_ENV, 0, None, (0,), "agent.txt", prefix)], max_turns=2)[0]
    plain = run(model, tok, [sm.EpisodeSpec(ECHO_ENV, 0, None, (0,))], max_turns=2)[0]
    assert ep.turns == 2 and plain.turns == 2
    pos, spans = 0, []
    for m in ep.loss_mask + [None]:   # (mask, text) runs
        if spans and spans[-1][0] == m:
            spans[-1][2] += 1
        else:
            spans.append([m, pos, 1])
        pos += 1
    given = [tok.decode(ep.token_ids[s:s + n]) for m, s, n in spans if m == 0]
    written = [tok.decode(ep.token_ids[s:s + n]) for m, s, n in spans if m == 1]
    assert len(given) == 2 and all(g.endswith(prefix) for g in given), given
    assert len(written) == 2 and not any(w.startswith(prefix) for w in written)
    for step, w in zip(ep.transcript[1:], written):
        assert step["reply"] == prefix + w.removesuffix(tok.eos_token)
        assert step["action"] == envs.to_action(step["reply"]) and step["action"].startswith(prefix)
        assert step["observation"] == "You sent " + step["action"]
    assert not any(t["action"].startswith(prefix) for t in plain.transcript[1:])


def test_constrained_decoding_keeps_every_token_inside_the_allowed_set(tiny_model):
    """models._hf_generate's `allowed` (HF's prefix_allowed_tokens_fn) before the sampler: the tiny model
    samples, at temperature 1 with top-k 20, only tokens of its row's set (each row its own)."""
    model, tok = tiny_model
    sets = [[11, 12, 13], [200, 201]]
    seqs = [models.chat_ids(tok, "first"), models.chat_ids(tok, "second, longer prompt")]
    replies, _ = models.generate_turn(model, tok, [0, 1], seqs, None, [[], []], max_new_tokens=6, temperature=1.0,
                                      top_p=1.0, top_k=20, seed=3, allowed=lambda row, ids: sets[row])
    for reply, allowed in zip(replies, sets):
        assert reply.completion_ids and set(reply.completion_ids) <= set(allowed), reply.completion_ids
    assert len({t for r in replies for t in r.completion_ids}) >= 3   # sampled, not one token repeated


@pytest.mark.parametrize("prefix", ["", "\\boxed{"])
def test_the_learning_bench_s_format_controlled_arm_plays_only_admissible_actions(tiny_model, monkeypatch, prefix):
    """bench/learning.py's base_format_controlled arm: the random tiny model, constrained, sends a valid cup or
    door every turn and no reply is cut, with or without a reply prefix."""
    import importlib.util
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("learning_bench", root / "bench" / "learning.py")
    learning = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(learning)
    model, tok = tiny_model
    codes = [(root / "examples" / f"{name}.py").read_text() for name in ("cups", "doors")]
    chosen = [sm.EpisodeSpec(codes[k % 2], k, None, (k % 2,), "agent.txt", prefix) for k in range(8)]
    monkeypatch.setattr(models, "generate_turn", learning.constrained_turn(chosen, ["cups", "doors"]))
    eps = sm.play(model, tok, chosen, max_turns=3, max_new_tokens=8, max_episode_tokens=24, limits=sandbox.Limits(),
                  temperature=0.7, top_p=0.95, top_k=20, seed=0)
    steps = [(ep.spec.key[0], t) for ep in eps for t in ep.transcript[1:]]
    assert steps and all("cut" not in t for _, t in steps)
    assert all(t["action"] in [f"\\boxed{{{a}}}" for a in ("123", "ABCD")[k]] for k, t in steps), steps

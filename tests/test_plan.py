"""The memory plan (runs.plan, `spade-mini plan`): its KV-cache and log-prob-chunk bytes equal the tensors the
engine allocates for a tiny model, exactly; LoRA counts equal what add_lora trains; each preset fits its card;
training sizes itself from the plan."""
import json
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

import cli
import models
import runs
import spade_mini as sm

TINY = runs.MODEL_SHAPES["tiny-random"]


@pytest.fixture(scope="module")
def tiny_model():
    model, tok, _ = models.load_model("tiny-random", lora_r=4, lora_alpha=8, lora_dropout=0.0, quantize="none",
                                      gradient_checkpointing=False, cache_dir="~/.cache/spade-mini", seed=0)
    with torch.no_grad():   # no stop bias (models._tiny_random): every reply runs to max_new_tokens
        model.get_output_embeddings().weight[tok.eos_token_id, 0] = 0.0
    return model, tok


def cache_bytes(cache) -> int:
    return sum(t.nbytes for layer in cache.layers for t in (layer.keys, layer.values))


def test_kv_bytes_per_token_by_hand():
    # 2 (keys, values) x 2 layers x 2 kv heads x 16 dims x 4 bytes (fp32 on the CPU)
    assert runs.kv_bytes_per_token(TINY, dtype_bytes=4) == 2 * 2 * 2 * 16 * 4 == 512


@pytest.mark.parametrize("rows,lengths,reply,delta,turns", [(1, [5], 3, 0, 1), (3, [17, 9, 4], 4, 6, 2),
                                                            (5, [30, 2, 11, 8, 19], 2, 3, 3)])
def test_the_planned_kv_cache_is_the_cache_the_engine_allocates(tiny_model, rows, lengths, reply, delta, turns):
    """Every row generates `reply` tokens per turn (fewer than the tiny model's replies, so none stops early) and
    gets a `delta` of the same length between turns: the engine's width is the longest prompt, then per turn the
    reply and the delta, the shorter rows padded; the cache holds all but the last column."""
    model, tok = tiny_model
    seqs = [[1000 + 37 * i + j for j in range(n)] for i, n in enumerate(lengths)]
    batch, deltas = None, [[] for _ in range(rows)]
    for turn in range(turns):
        replies, batch = models.generate_turn(model, tok, list(range(rows)), seqs, batch, deltas, max_new_tokens=reply,
                                              temperature=0.0, top_p=1.0, top_k=0, seed=turn)
        assert all(len(r.completion_ids) == reply and not r.finished for r in replies)
        deltas = [[2000 + j for j in range(delta)] for _ in range(rows)]
        seqs = [s + r.completion_ids + d for s, r, d in zip(seqs, replies, deltas)]
    planned = runs._generate_phase(TINY, rows, max(lengths), turns * reply + (turns - 1) * delta, delta, reply,
                                   dtype_bytes=4)
    assert planned["columns"] == max(lengths) + turns * reply + (turns - 1) * delta - 1
    assert cache_bytes(batch.cache) == planned["kv"] == runs.generate_kv_bytes(TINY, rows, planned["columns"], 4)


def test_the_planned_static_cache_is_the_static_cache_generate_builds(tiny_model):
    """--static-cache rounds rows to a bucket, the prompt to a multiple of 256 and the cache to a power of two."""
    model, tok = tiny_model
    for rows, prompt, new in [(3, 40, 4), (5, 300, 6)]:
        ids, mask = models._left_pad([[1000 + j for j in range(prompt)]] * runs.static_rows(rows), tok.pad_token_id,
                                     runs.static_width(prompt), model.device)
        _, cache, _ = models._hf_generate(model, tok, ids, mask, cache=None, n_real=rows, max_new_tokens=new,
                                       temperature=0.0, top_p=1.0, top_k=0, seed=0, static_cache=True)
        planned = runs._generate_phase(TINY, rows, prompt, new, static=True, dtype_bytes=4)
        assert cache_bytes(cache) == planned["kv"] and planned["rows"] == runs.static_rows(rows)
    models.phase_memory("test")   # the phase's static caches are dropped
    assert not models._STATIC_CACHES


def test_phase_geometry_of_play_is_the_engines_width_formula():
    cfg = runs.Config(max_turns=3, agent_max_new_tokens=50, agent_max_episode_tokens=400, hint_max_new_tokens=20,
                      agent_max_observation_tokens=30, envs_per_step=2, plays=3, hinted_plays=1)
    play = runs.phase_geometry(cfg)["play"]
    between = 30 + runs.TURN_FRAME_TOKENS
    assert play["rows"] == 2 * (3 + 1) and play["prompt"] == runs.AGENT_TEMPLATE_TOKENS + 30 + 20
    assert play["new"] == 3 * 50 + 2 * between and play["between"] == between


class VocabBlocks(TorchDispatchMode):
    """Bytes of every (rows, vocab) tensor an op allocates (an in-place op's output is its input: none)."""

    def __init__(self, rows: int, vocab: int):
        super().__init__()
        self.numel, self.bytes = rows * vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.numel() == self.numel and func is not torch.ops.aten.t.default \
                and not any(out is a for a in args):
            self.bytes += out.nbytes
        return out


@pytest.mark.parametrize("chunk", [1, 7, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_planned_logprob_chunk_is_what_the_forward_allocates(chunk, dtype):
    head = torch.nn.Linear(TINY["hidden_size"], TINY["vocab_size"], bias=False).to(dtype)
    hidden = torch.randn(chunk, TINY["hidden_size"], dtype=dtype)
    targets = torch.randint(0, TINY["vocab_size"], (chunk,))
    with torch.no_grad(), VocabBlocks(chunk, TINY["vocab_size"]) as seen:
        sm._chunk_logprobs(hidden, targets, head, 0.7)
    assert seen.bytes == runs.logprob_chunk_bytes(TINY, chunk, dtype_bytes=dtype.itemsize)


def test_lora_counts_what_add_lora_trains_and_never_the_experts_or_router():
    shape = dict(hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
                 mlp_only_layers=[1], vocab_size=256, tie_word_embeddings=False)
    moe = AutoModelForCausalLM.from_config(Qwen3MoeConfig(**shape))
    moe = models.add_lora(moe, lora_r=2, lora_alpha=4, lora_dropout=0.0, gradient_checkpointing=False)
    trained = [n for n, p in moe.named_parameters() if p.requires_grad]
    assert trained and all(".self_attn." in n for n in trained)   # peft would map dense MLPs onto the experts
    assert sum(p.numel() for p in moe.parameters() if p.requires_grad) == runs.lora_params(shape, 2)


def test_lora_count_of_the_tiny_model(tiny_model):
    model, _ = tiny_model
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == runs.lora_params(TINY, 4)


@pytest.mark.parametrize("preset,gpu_gb", [("4b", 24), ("8b", 48), ("30b-a3b", 80)])
def test_each_preset_fits_its_card_and_not_one_that_holds_only_its_weights(preset, gpu_gb):
    cfg = runs.Config(**runs.PRESETS[preset])
    plan = runs.plan(cfg, gpu_gb)
    assert plan["fits"] and plan["peak_gb"] <= gpu_gb - runs.CUDA_RESERVE_GB
    assert set(plan["phases"]) == {"design", "hint", "play", "update"}
    assert not runs.plan(cfg, plan["phases"]["design"]["weights"] + runs.CUDA_RESERVE_GB + 0.5)["fits"]


def test_a_card_too_small_for_all_episodes_plays_in_even_waves():
    cfg = runs.Config(**runs.PRESETS["4b"])
    full = runs.plan(cfg, 80)["geometry"]
    assert full["waves"] == 1 and full["play_wave"] == 32
    small = runs.plan(cfg, 24)["geometry"]
    assert small["waves"] >= 2 and small["play_wave"] * small["waves"] >= 32 > small["play_wave"] * (small["waves"] - 1)


def test_plan_command_prints_a_table_and_json_whose_last_line_has_the_fields(capsys):
    assert cli.main(["plan", "--preset", "4b", "--gpu-gb", "24", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"kv_bytes_per_token", "phases", "peak_gb", "fits"} <= set(out) and out["kv_bytes_per_token"] == 147456
    assert cli.main(["plan", "--preset", "30b-a3b"]) == 0
    text = capsys.readouterr().out
    assert "play" in text and "fits" in text and "80" in text


def test_plan_of_an_unknown_model_is_a_one_line_error(capsys, tmp_path):
    assert cli.main(["plan", "--model", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("spade-mini: error:")


def test_plan_of_the_bundled_model_reads_its_converted_copy(tmp_path, capsys):
    """smollm2-135m is planned from the folder models.py converts its GGUF into (cache_dir/<file stem>/)."""
    converted = tmp_path / "SmolLM2-135M-Instruct.Q4_1"
    converted.mkdir()
    (converted / "config.json").write_text(json.dumps(TINY))
    assert cli.main(["plan", "--model", "smollm2-135m", "--cache-dir", str(tmp_path), "--gpu-gb", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["kv_bytes_per_token"] == \
        runs.kv_bytes_per_token(TINY)


def test_plan_reads_a_local_config_json(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    assert cli.main(["plan", "--model", str(tmp_path), "--gpu-gb", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["kv_bytes_per_token"] == runs.kv_bytes_per_token(TINY) and out["fits"]


TRAIN = dict(model="tiny-random", envs_per_step=2, design_attempts=1, plays=3, hinted_plays=2, max_turns=2,
             designer_max_new_tokens=24, hint_max_new_tokens=8, agent_max_new_tokens=24, agent_max_episode_tokens=48,
             doc_words=50)


def flags(values: dict) -> list[str]:
    return [item for k, v in values.items() for item in (f"--{k.replace('_', '-')}", str(v))]


def test_training_takes_the_plans_geometry():
    import train
    cfg = runs.Config(**runs.PRESETS["4b"], gpu_gb=24)
    geometry = runs.plan(cfg, 24)["geometry"]
    sized = train.size_to_card(cfg)
    assert (sized.play_wave, sized.token_budget) == (geometry["play_wave"], geometry["token_budget"]) == (16, 4096)


def test_without_cuda_or_gpu_gb_a_run_is_not_sized(monkeypatch):
    import train
    monkeypatch.setattr(models, "free_gpu_gb", lambda: None)
    assert train.size_to_card(runs.Config(**runs.PRESETS["4b"])).play_wave == 0


def test_a_step_played_in_waves_plays_every_episode_in_even_waves(tmp_path, monkeypatch):
    waves = []
    play = sm.play
    monkeypatch.setattr(sm, "play", lambda model, tok, specs, **kw: waves.append(len(specs)) or play(model, tok, specs, **kw))
    out = tmp_path / "run"
    assert cli.main(["train", *flags(TRAIN), "--steps", "1", "--out", str(out), "--play-wave", "3"]) == 0
    assert waves == [2, 3, 2, 3]   # 10 episodes, at most 3 at once: 4 waves of 2-3 (not 3, 3, 3, 1)
    logged = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    (window,) = [r for r in logged if r["kind"] == "window"]
    assert [len(e["unhinted"][0]) for e in window["input"]["envs"]] == [3, 3]
    assert [len(e["hinted"]) for e in window["input"]["envs"]] == [2, 2]


def test_a_run_that_cannot_fit_says_so_in_one_line_before_loading_the_model(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", *flags(TRAIN), "--out", str(out), "--gpu-gb", "1.001"]) == 2
    err = capsys.readouterr()
    assert "does not fit 1.0 GiB" in err.err and len(err.err.strip().splitlines()) == 1
    assert "spade-mini: tiny-random on" not in err.out and not out.exists()   # the model never loaded


def test_the_gpu_step_script_runs_its_dry_run_on_the_cpu():
    """bench/gpu_step.py is the prepared GPU check (one step next to the plan); its tiny-shape dry run keeps it working here."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "bench" / "gpu_step.py"), "--dry-run"], capture_output=True,
                          text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result["phases"]) == {"design", "hint", "play", "update"}
    assert all(p["seconds"] > 0 and p["plan_gb"] > 0 for p in result["phases"].values())



def test_an_observation_is_cut_to_its_token_cap_with_a_marker_and_a_short_one_is_untouched(tiny_model):
    _, tok = tiny_model
    assert sm._clip_observation("You are in a room.", tok, 16) == "You are in a room."
    long = "word " * 500
    cut = sm._clip_observation(long, tok, 32)
    assert cut.endswith("[observation truncated]") and len(tok(cut, add_special_tokens=False)["input_ids"]) <= 32
    assert "\ufffd" not in sm._clip_observation("\u732b" * 300, tok, 20)   # no broken character at the cut


def designer_cost():
    import importlib.util
    path = Path(__file__).resolve().parent.parent / "bench" / "designer_cost.py"
    spec = importlib.util.spec_from_file_location("designer_cost", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_update_s_useful_flops_by_hand():
    """bench/designer_cost.useful_flops: samples of 3 and 2 tokens, 2 of them scored, body 10 weights, head 3,
    2 layers of width 4: 4 x 10 x 5 = 200 (layers), 12 x 2 x 4 x (1+2+3 + 1+2) = 864 (causal attention, forward
    4 and backward 8 per width and position), 4 x 3 x 2 = 24 (the head on the scored tokens): 1,088."""
    bench = designer_cost()
    assert bench.useful_flops(body=10, head=3, layers=2, width=4, lengths=[3, 2], trained=2) == 200 + 864 + 24


def test_a_profiled_update_s_seconds_and_flops_by_kind_by_hand():
    """bench/designer_cost.by_kind, names as the profiler writes them: mm 2 s + addmm 1 s + addmm_ 0.5 s are
    matmuls, 3.5 s; the flash kernel's forward 0.25 s and backward 0.75 s attention, 1 s; mul 0.4 s and copy_
    0.6 s the rest, 1 s. As torch's flop counter writes them: mm 8 + addmm 4 matmuls, 12."""
    bench = designer_cost()
    assert bench.by_kind([
        ("aten::mm", 2.0), ("aten::addmm", 1.0), ("aten::addmm_", 0.5),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", 0.25),
        ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", 0.75),
        ("aten::mul", 0.4), ("aten::copy_", 0.6)]) == {"matmul": 3.5, "attention": 1.0, "rest": 1.0}
    assert bench.by_kind([("aten.mm", 8), ("aten.addmm", 4)]) == {"matmul": 12, "attention": 0, "rest": 0}


@pytest.mark.parametrize("bf16", [False, True])
def test_the_decode_s_parts_stream_every_linear_weight_once(tiny_model, bf16):
    """bench/designer_cost.decode_parts on the tiny model: the linears it times are each layer's q, k, v, o, gate,
    up and down and the LM head, by the config's shapes in the decode's dtype (not the LoRA's A and B, off while
    generating), computing in that dtype through the packed forward the decode gives them where this CPU packs;
    the weights are the model's own again after (generation_weights puts them back)."""
    model, _ = tiny_model
    c = model.config
    q, kv = c.hidden_size, c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
    layer = c.hidden_size * (q + 2 * kv) + q * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    before = {n: p.clone() for n, p in model.named_parameters()}
    got = designer_cost().decode_parts(model, rows=3, columns=10, bf16=bf16, reps=1)
    weights = c.num_hidden_layers * layer + c.vocab_size * c.hidden_size   # the LM head: vocab x width
    assert got["linear_weight_bytes"] == weights * (2 if bf16 else 4)
    assert got["dtypes"] == {"torch.bfloat16" if bf16 else "torch.float32"}
    packs = torch.ops.mkldnn._is_mkldnn_bf16_supported() if bf16 else torch.backends.mkl.is_available()
    assert got["linears"] == 7 * c.num_hidden_layers + 1 and got["packed"] == (got["linears"] if packs else 0)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_the_decode_s_yardstick_is_read_beside_each_step_and_timed_in_neither(tiny_model):
    """bench/designer_cost.decode_timed's probe (the copy bandwidth read beside the timed steps) runs each time a
    token is out, the first one included (the LM head has run 1, 2, 3, 4 times: 1 + 3 steps), so that every step
    has a reading right before and right after it (4 readings, 3 steps), and its time counts neither in the
    prefill nor in a step: a probe of 1 s against the tiny model's steps of milliseconds, while the LM head's own
    0.2 s sleep at every step after the first token is in each step. Unprobed, the same tokens and steps."""
    import time
    model, tok = tiny_model
    models.mkl_decode_speedup()   # measured once per process at the first packed step: not in this test's prefill
    heads, calls = [], []

    def head(*_):
        heads.append(1)
        if len(heads) > 1:
            time.sleep(0.2)
    hook = model.get_output_embeddings().register_forward_hook(head)
    kw = dict(temperature=1.0, top_p=1.0, top_k=0, seed=0)
    try:
        prefill_s, steps, tokens = designer_cost().decode_timed(
            model, tok, [[5, 6, 7], [8, 9, 10]], 3, kw, probe=lambda: calls.append((len(heads), time.sleep(1.0))[0]))
        heads.clear()
        _, unprobed, same = designer_cost().decode_timed(model, tok, [[5, 6, 7], [8, 9, 10]], 3, kw)
    finally:
        hook.remove()
    assert calls == [1, 2, 3, 4] and len(tokens) == 2 and same == tokens
    assert 0 < prefill_s < 0.2 and len(steps) == 3 and all(0.2 <= s < 1.0 for s in steps) and len(unprobed) == 3


def test_a_decode_step_is_paired_with_the_better_reading_beside_it():
    """bench/designer_cost.paired_ratios by hand: 10 GB a step; step 0 (1 s) between readings 20 and 10 GB/s takes
    20 (bound 0.5 s: 0.5), step 1 (2 s) between 10 and 40 takes 40 (bound 0.25 s: 0.125), step 2 (0.5 s) between
    40 and 5 takes 40 (0.5); a pairing with the reading before alone would give 0.5, 0.5, 0.5."""
    got = designer_cost().paired_ratios(10e9, [1.0, 2.0, 0.5], [20.0, 10.0, 40.0, 5.0])
    assert got == pytest.approx([0.5, 0.125, 0.5])


def test_each_update_keeps_the_better_peak_read_right_before_and_after_it():
    """bench/designer_cost.updates_by_mode's probe: read once before the first update and once after each (10
    readings for the 9 updates in bf16); each update keeps the better of its two (peak_beside): readings 10, 30,
    20, 50, 40, 70, 60, 90, 80, 100 give 30, 30, 50, 50, 70, 70, 90, 90, 100 (the one before alone: 10, 30, 20,
    ...; the one after alone: 30, 20, 50, ...). Without a probe no update has a peak_beside."""
    import types
    readings = iter([10, 30, 20, 50, 40, 70, 60, 90, 80, 100])
    run = lambda: {"seconds": 1.0, "grad_norm": 0.0, "tokens_per_s": 1.0}
    results, best = designer_cost().updates_by_mode(run, [types.SimpleNamespace()], {}, True,
                                                    probe=lambda: next(readings))
    assert [r["peak_beside"] for r in results] == [30, 30, 50, 50, 70, 70, 90, 90, 100]
    assert next(readings, None) is None and {r["mode"] for r in results} == {"selective", "full", "fp32_head", "off"}
    results, _ = designer_cost().updates_by_mode(run, [types.SimpleNamespace()], {}, True)
    assert len(results) == 9 and not any("peak_beside" in r for r in results)


def test_where_the_update_s_time_goes_counts_each_matmul_once_under_the_selective_checkpoint():
    """bench/designer_cost.where_time_goes on a layer checkpointed with the update's policy: its forward addmm
    (2 x 128 x 64 x 32 FLOPs) and the backward's two mm are counted once each, not the profiler's way (the addmm
    dispatched through the checkpoint and taken from its cache in the backward count again there)."""
    import functools
    import time
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
    w = torch.randn(64, 32, requires_grad=True)
    policy = functools.partial(create_selective_checkpoint_contexts, models._saved_by_checkpoint)

    def run_update():
        start, x = time.perf_counter(), torch.randn(128, 64, requires_grad=True)
        y = checkpoint(lambda x: torch.relu(torch.addmm(torch.zeros(128, 32), x, w)), x, use_reentrant=False,
                       context_fn=policy)
        y.sum().backward()
        return {"seconds": time.perf_counter() - start}
    got = designer_cost().where_time_goes(run_update, layers=1, width=4, lengths=[3])
    assert got["matmul_tflop_counted"] * 1e12 == 3 * 2 * 128 * 64 * 32
    assert got["profiled_matmul_s"] > 0 and got["profiled_attention_s"] == 0 and got["profiled_rest_s"] > 0
    assert got["attention_useful_gflops"] == 0   # no attention ran: no rate, not FLOPs over a guard's 1e-9 s

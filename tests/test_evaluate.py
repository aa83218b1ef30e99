"""evaluate.py's held-out evaluation: the item set, answer extraction and scoring by hand, then end to end with a tiny random model."""
import json
import os
from pathlib import Path

import pytest

import cli
import envs
import models
import evaluate

ROOT = Path(__file__).resolve().parent.parent

WIN_ENV = '''
class WinEnv:
    """Any action but the validator's first probe wins at once: return 1 (a game that the first probe already
    won would be rejected as trivial)."""
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns
    def reset(self, seed=None):
        return "Say anything in \\\\boxed{}.", {}
    def step(self, action):
        if action == "\\\\boxed{1}":
            return "Not that one.", 0.0, False, False, {}
        return "You win.", 1.0, True, False, {}
'''
LOSE_ENV = WIN_ENV.replace("WinEnv", "LoseEnv").replace("You win.\", 1.0", "You lose.\", 0.0")
TINY_LOAD = dict(lora_r=4, lora_alpha=8, lora_dropout=0.0, quantize="none", gradient_checkpointing=False,
                 cache_dir=os.path.expanduser("~/.cache/spade-mini"), seed=0)


@pytest.fixture(scope="module")
def tiny():
    model, tok, _ = models.load_model("tiny-random", **TINY_LOAD)
    return model, tok


def wrong_answer(item: evaluate.Item) -> str:
    """A plausible wrong answer: the other of Yes/No, a number off by one, or a word list that is not one."""
    answer = item.entry["answer"]
    if answer in ("Yes", "No"):
        return "No" if answer == "Yes" else "Yes"
    try:
        return str(int(answer) + 1)
    except ValueError:
        return "zzz"


def test_correct_boxed_answer_scores_one_and_wrong_scores_zero():
    for item in evaluate.eval_items(3, seed=0):
        right = f"Let me think step by step. The answer is \\boxed{{{item.entry['answer']}}}."
        wrong = f"The answer is \\boxed{{{wrong_answer(item)}}}."
        assert evaluate.score_item(item, right) == 1.0, item.category
        assert evaluate.score_item(item, wrong) == 0.0, item.category


def test_only_the_first_boxed_answer_counts():
    item = evaluate.eval_items(1, seed=0)[0]
    text = f"\\boxed{{{wrong_answer(item)}}} or maybe \\boxed{{{item.entry['answer']}}}"
    assert evaluate.score_item(item, text) == 0.0


def test_answer_without_box_scores_zero():
    item = evaluate.eval_items(1, seed=0)[0]
    assert evaluate.score_item(item, f"The answer is {item.entry['answer']}") == 0.0


def test_item_set_is_deterministic_for_a_seed():
    first, again = evaluate.eval_items(3, seed=7), evaluate.eval_items(3, seed=7)
    assert [i.prompt for i in first] == [i.prompt for i in again]
    assert [i.prompt for i in first] != [i.prompt for i in evaluate.eval_items(3, seed=8)]


def test_limit_counts_items_per_category_and_a_smaller_limit_is_a_prefix():
    small, large = evaluate.eval_items(2, seed=0), evaluate.eval_items(3, seed=0)
    assert len(large) == 3 * len(evaluate.CATEGORIES)
    for category in evaluate.CATEGORIES:
        a = [i.prompt for i in small if i.category == category]
        b = [i.prompt for i in large if i.category == category]
        assert a == b[:2]


def test_prompt_asks_for_a_boxed_answer():
    assert all(i.prompt.endswith("put your final answer within \\boxed{}.") for i in evaluate.eval_items(1, 0))


def test_overall_score_is_the_mean_of_category_means():
    """Category a scores [1, 0] -> 0.5 and b scores [1] -> 1.0; overall (0.5 + 1.0) / 2 = 0.75, not the item
    mean 2 / 3."""
    items = [evaluate.Item("a", "x", 0, {}), evaluate.Item("a", "x", 1, {}), evaluate.Item("b", "y", 0, {})]
    assert evaluate.summarize(items, [1.0, 0.0, 1.0]) == {"score": 0.75, "categories": {"a": 0.5, "b": 1.0}}


def test_evaluation_scores_each_item_and_averages_them_per_category(tiny):
    """Every number of the result is recomputed from its logged items: each item's answer and score from its
    completion, each category's score as the mean of its items, the overall score as the mean of categories,
    `answered` as the share of items with a boxed answer."""
    result = evaluate.evaluate(*tiny, limit=2, seed=0, max_new_tokens=8)
    assert set(result["categories"]) == set(evaluate.CATEGORIES)
    assert result["n"] == 2 * len(evaluate.CATEGORIES) and len(result["items"]) == result["n"]
    assert 0.0 <= result["score"] <= 1.0 and 0.0 <= result["answered"] <= 1.0
    items = evaluate.eval_items(2, seed=0)
    assert [(d["category"], d["index"]) for d in result["items"]] == [(i.category, i.index) for i in items]
    for item, d in zip(items, result["items"]):
        assert d["expected"] == item.entry["answer"]
        assert d["answer"] == evaluate.extract_answer(d["completion"])
        assert d["score"] == evaluate.score_item(item, d["completion"])
    per = {c: [d["score"] for d in result["items"] if d["category"] == c] for c in evaluate.CATEGORIES}
    assert result["categories"] == pytest.approx({c: sum(s) / len(s) for c, s in per.items()})
    assert result["score"] == pytest.approx(sum(result["categories"].values()) / len(evaluate.CATEGORIES))
    assert result["answered"] == sum(d["answer"] is not None for d in result["items"]) / result["n"]


def test_evaluation_is_deterministic(tiny):
    a = evaluate.evaluate(*tiny, limit=1, seed=3, max_new_tokens=6)
    b = evaluate.evaluate(*tiny, limit=1, seed=3, max_new_tokens=6)
    assert [i["completion"] for i in a["items"]] == [i["completion"] for i in b["items"]]   # the text, not only its
    assert any(i["completion"] for i in a["items"]) and a["score"] == b["score"]            # answer (mostly None)


def test_pool_win_rate_is_share_of_plays_with_positive_return(tiny, tmp_path):
    """WinEnv returns 1 on every play, LoseEnv 0: 2 of 4 plays win -> 0.5; the broken file is skipped."""
    (tmp_path / "win.py").write_text(WIN_ENV)
    (tmp_path / "lose.py").write_text(LOSE_ENV)
    (tmp_path / "broken.py").write_text("class BrokenEnv(:\n")
    result = evaluate.pool_win_rate(*tiny, tmp_path, plays=2, max_turns=2, max_new_tokens=64)
    assert result["pool_win_rate"] == 0.5
    assert result["pool_envs"] == {"lose": 0.0, "win": 1.0}
    assert result["pool_skipped"] == {"broken": "syntax"}


def test_eval_main_json_is_the_last_stdout_line(capsys):
    assert cli.main(["eval", "--model", "tiny-random", "--limit", "1", "--max-new-tokens", "4", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert isinstance(result["score"], float) and set(result["categories"]) == set(evaluate.CATEGORIES)
    assert result["score"] == pytest.approx(sum(result["categories"].values()) / len(evaluate.CATEGORIES))
    assert "items" not in result


def test_adapter_of_a_run_is_loaded_not_ignored(tiny, tmp_path):
    """Save an adapter with nonzero LoRA B weights as a run's checkpoint; --run must load exactly those."""
    import torch
    model, _, _ = models.load_model("tiny-random", **TINY_LOAD)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.25)
    ckpt = tmp_path / "run" / "checkpoints" / "step_00003"
    model.save_pretrained(ckpt)
    (ckpt / "state.json").write_text('{"step": 3}')
    (tmp_path / "run" / "config.json").write_text(json.dumps({"model": "tiny-random"}))
    args = cli.build_parser("eval").parse_args(["eval", "--run", str(tmp_path / "run")])
    name, adapter, kwargs = cli.eval_source(args)
    assert (name, adapter, kwargs["lora_r"]) == ("tiny-random", ckpt, 4)
    loaded, _ = models.load_for_eval(name, adapter, merge=False, **kwargs)
    lora_b = [p for n, p in loaded.named_parameters() if "lora_B" in n]
    assert lora_b and all(torch.all(p == 0.25) for p in lora_b)


def test_a_run_s_pool_is_played_with_its_own_prompt_and_reply_prefix(tmp_path, monkeypatch):
    """spade-mini eval --run R --env-pool P: the pool's plays start as the run's did in training (its
    --agent-prompt and --agent-reply-prefix), not with the preset's defaults."""
    ckpt = tmp_path / "run" / "checkpoints" / "step_00001"
    models.load_model("tiny-random", **TINY_LOAD)[0].save_pretrained(ckpt)
    (ckpt / "state.json").write_text('{"step": 1}')
    (tmp_path / "run" / "config.json").write_text(json.dumps(
        {"model": "tiny-random", "agent_prompt": "agent.txt", "agent_reply_prefix": "\\boxed{"}))
    seen = {}
    monkeypatch.setattr(evaluate, "evaluate", lambda *a, **k: {"categories": {}, "score": 0.0, "answered": 0.0})
    monkeypatch.setattr(evaluate, "pool_win_rate", lambda *a, **k: seen.update(k) or {"pool_win_rate": 0.0, "pool_envs": {}, "pool_skipped": []})
    assert cli.main(["eval", "--run", str(tmp_path / "run"), "--env-pool", str(ROOT / "examples"), "--limit", "1"]) == 0
    assert (seen["prompt"], seen["reply_prefix"]) == ("agent.txt", "\\boxed{")   # the tiny preset's: agent_brief


def test_run_without_checkpoint_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model": "tiny-random"}))
    assert cli.main(["eval", "--run", str(tmp_path)]) == 2
    assert "no complete checkpoint" in capsys.readouterr().err


def test_eval_metrics_are_flat_namespaced_keys_for_metrics_jsonl(tiny, tmp_path):
    (tmp_path / "win.py").write_text(WIN_ENV)
    out = evaluate.eval_metrics(*tiny, limit=1, seed=0, max_new_tokens=64, env_pool=str(tmp_path), pool_plays=2,
                                max_turns=2)
    expected = {"eval/score", "eval/answered", "eval/pool_win_rate", "perf/eval_s", "perf/eval_pool_s"}
    assert set(out) == expected | {f"eval/{c}" for c in evaluate.CATEGORIES}
    assert out["eval/pool_win_rate"] == 1.0
    categories = [out[f"eval/{c}"] for c in evaluate.CATEGORIES]
    assert out["eval/score"] == pytest.approx(sum(categories) / len(categories))


def test_an_adapter_whose_weights_are_damaged_is_a_one_line_error(tmp_path, capsys):
    """eval --adapter of a checkpoint whose safetensors file was truncated: safetensors' own error, a traceback."""
    models.load_model("tiny-random", **TINY_LOAD)[0].save_pretrained(tmp_path)
    (tmp_path / "adapter_model.safetensors").write_bytes(b"junk")
    assert cli.main(["eval", "--model", "tiny-random", "--adapter", str(tmp_path), "--limit", "1"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("spade-mini: error: ")]
    assert len(err) == 1 and "adapter_model.safetensors is unreadable (" in err[0], err   # not a traceback


def test_an_adapter_without_its_config_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    assert cli.main(["eval", "--adapter", str(tmp_path), "--limit", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("spade-mini: error: the adapter:") and "adapter_config.json" in err[0]


def test_programs_parsed_in_threads_at_once_never_raise_systemerror():
    """CPython 3.11 counts the syntax-tree builder's depth per interpreter: a thread that parses while another's
    parse is paused (the garbage collector ran a __del__ that let go of the GIL) made ast.parse raise
    `SystemError: AST constructor recursion depth mismatch` in CI, in reject_copies' pool. Here a cyclic object
    whose __del__ sleeps is made before every parse, with the collector run often, in four threads at once."""
    import gc
    import threading
    import time

    class Yields:
        def __del__(self):
            time.sleep(0)

    code = (ROOT / "examples" / "cups.py").read_text()
    results, threshold = [], gc.get_threshold()

    def parse_often():
        for _ in range(60):
            cycle = Yields()
            cycle.itself = cycle
            del cycle
            try:
                results.append(type(evaluate.bounded_tree(code)).__name__)
            except SystemError as error:
                results.append(str(error))

    gc.set_threshold(50)
    try:
        threads = [threading.Thread(target=parse_often) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        gc.set_threshold(*threshold)
    assert set(results) == {"Module"} and len(results) == 240, sorted(set(results))


def test_a_valid_program_that_repeats_an_example_of_its_prompt_is_rejected_as_a_copy():
    """The in-context example with its class renamed is a copy; a different valid game and an invalid program
    keep their verdicts; a program is only compared with what ITS prompt showed."""
    example = envs.example_program()
    cups = (ROOT / "examples" / "cups.py").read_text()
    verdicts = [envs.Verdict(True, "ok", "SumEnv"), envs.Verdict(True, "ok", "CupsEnv"),
                envs.Verdict(False, "syntax", None), envs.Verdict(True, "ok", "CupsEnv")]
    codes = [example.replace("PairSumEnv", "SumEnv"), cups, "class (", cups]
    out = evaluate.reject_copies(codes, verdicts, [[example], [example], [example], [example, cups]])
    assert [(v.valid, v.reason) for v in out] == [(False, "copy"), (True, "ok"), (False, "syntax"), (False, "copy")]
    assert "similarity" in out[0].detail


def test_the_benchs_exact_interval_has_the_textbook_values():
    """evaluate.clopper_pearson, which the benches report (its doctest: 0 of 10 -> [0, 0.3085], 5 of 10 ->
    [0.1871, 0.8129]); an upper bound solved on the wrong tail ran to 1.0 for every share."""
    assert evaluate.clopper_pearson(0, 10) == [0.0, 0.3085] and evaluate.clopper_pearson(5, 10) == [0.1871, 0.8129]
    assert evaluate.clopper_pearson(3, 16) == [0.0405, 0.4565] and evaluate.clopper_pearson(16, 16) == [0.7941, 1.0]

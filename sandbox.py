"""Run untrusted, LLM-written environment code in a fresh, locked-down child interpreter.

The one idea: the trainer never executes generated code. Each environment instance lives in its own new Python
process (`python -S -B -c`, never a fork of the trainer) inside independent layers, and is spoken to over a
private pipe pair carrying length-prefixed JSON frames. If one layer fails the others still hold.

This module is the protocol: start an instance, send a request, wait for its reply until a deadline, close.
A deadline is call_timeout or what is left of the instance's wall budget (WALL_BUDGET_CALLS x call_timeout).
Each request carries a fresh nonce its reply must echo under a length header bounded by max_message_bytes
('protocol'), and every reply is decoded as hostile data ('bad_reply'), so no reply can crash the caller.
Every text an environment sends is made inert once, here, as its reply is decoded (inert): nothing downstream
(a print, a JSONL line, an HTML page) can fail on it or be moved about by it.
Under it, isolation.py builds (and its docstring tells in full) bwrap's namespaces and minimal filesystem, a uid
of its own, a seccomp filter, rlimits, the SIGKILL of a missed deadline, a scrubbed environment and an audit hook.
Out of process at all is departure 8 of docs/details.md; the loader's rules (13) are isolation._child_load's.
`isolation.isolation_report()` says which layers are active here (a missing one is reported, never silently
skipped), and tests/test_hostile.py attacks each of them, including with the audit hook switched off.

NOT covered:
 * CPython memory-safety bugs reachable from pure Python, and memory access through the ctypes types the child
   loads to install the filter (object.__subclasses__ reaches them), get past the hook and can switch it off;
   such code then meets layers 1-6 only. Where isolation_report() shows a kernel layer missing, those are weaker:
   without bwrap the host's files are readable (not writable); without the filter, only the namespaces hold.
 * The kernel's own bugs in the syscalls the filter allows; CPU side channels and timing through the page cache
   (the filter refuses dropping, loading ahead and probing it without a clock; docs/sandbox.md) and the machine's
   load; memory pressure up to RLIMIT_AS, memfds and tmpfs times the number of live children (System V IPC refused).
 * Env code can swap the child's reply encoder and instrument its own interpreter: it can forge only the reply
   to its own call in progress, whose result it controls anyway, and the parent decodes it as hostile data.
 * The cause of death is read from the child's crash pipe: code that writes fake text there can only mislabel
   its own death ('crash', 'timeout', 'forbidden').
 * As a plain user bwrap's tmpfs is not noexec (no option for it; as root the child mounts its own, noexec, and
   inode-capped); execve is refused by the filter instead. Kernel memory is bounded by that inode cap only.
 * Frames stay readable (namedtuple, typing and dataclasses need sys._getframe): env code can read the
   sandbox's own locals, which hold nothing secret.
"""
from __future__ import annotations

import atexit
import json
import os
import re
import secrets
import select
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass

import isolation

REASONS = ("syntax", "no_env_class", "init_error", "timeout", "memory", "crash", "forbidden",
           "not_serializable", "too_large", "protocol", "bad_reply", "error")
_SURVIVABLE = {"error", "not_serializable", "too_large"}  # every other failure kills the child
_HEADER = 44  # frame header: 32 hex chars of nonce, a space, 10 digits of body length, a newline
_MAX_DEPTH = 100   # nesting of a result; the child's encoder refuses deeper ones, the parent checks again
WALL_BUDGET_CALLS = 4   # an instance's calls get 4 x call_timeout of wall time in all: slow but legal = hung
MAX_WAIT = 86_400   # seconds: the longest wait poll is asked for (it takes milliseconds below 2**31)


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 20          # RLIMIT_CPU of the child (whole life of the instance)
    memory_mb: int = 1024          # RLIMIT_AS of the child
    file_size_mb: int = 1          # RLIMIT_FSIZE; the private tmpfs holds 4x this
    open_files: int = 64           # RLIMIT_NOFILE
    threads: int = 16              # RLIMIT_NPROC of the child's own uid: its threads (processes are refused)
    call_timeout: float = 5.0      # wall-clock seconds for start+init and for each call
    max_message_bytes: int = 1_000_000   # cap on one reply (observation etc.) -> SandboxError('too_large')


class SandboxError(Exception):
    """A failed start or call: `reason` is one of REASONS, `detail` is short human text."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason, detail)
        self.reason, self.detail = reason, detail

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


_LIVE: weakref.WeakSet = weakref.WeakSet()   # closed at interpreter exit, so no child outlives the trainer


class EnvProcess:
    """One environment instance in one fresh child interpreter (never a fork of the caller).

    >>> code = "class CountEnv:\\n    def __init__(self, start=0): self.n = start\\n" \\
    ...        "    def step(self, k): self.n += k; return (self.n, self.n > 2)\\n"
    >>> with EnvProcess(code, {"start": 1}) as env:
    ...     env.class_name, env.call("step", 1), env.call("step", 1)
    ('CountEnv', [2, False], [3, True])
    """

    def __init__(self, code: str, init_kwargs: dict | None = None, limits: Limits = Limits(),
                 max_turns: int | None = None):
        """max_turns: a cap on the instance's own `max_turns` (set to min(own, cap)); self.max_turns is then
        the effective value (the cap when the instance declares none), else None."""
        if not isinstance(code, str):
            raise TypeError(f"code must be str, not {type(code).__name__}")
        self.limits, self.class_name, self.alive, self.max_turns = limits, "", False, None
        self._closed, self._proc, self._fds, self._died_of = False, None, (), "crash"
        self._pending: tuple | None = None   # (nonce, deadline, time sent) of the request in flight
        self._wall_left = float("inf")       # wall time the calls after the start may still take
        self._outcome = None                 # its reply value, or a SandboxError
        self._buf = bytearray()
        self._dir = tempfile.mkdtemp(prefix="spade-sandbox-")
        self._uid = isolation.take_uid()
        try:
            self._spawn()
            self._send({"code": code, "kwargs": dict(init_kwargs or {}), "max_turns": max_turns})
            loaded = self.receive()
            # the child's word is clamped to what was asked: a turn cap in 1..max_turns (None without one)
            if not (isinstance(loaded, list) and len(loaded) == 2 and isinstance(loaded[0], str)
                    and loaded[0].isidentifier() and len(loaded[0]) <= 200
                    and (loaded[1] is None if max_turns is None else type(loaded[1]) is int and 0 < loaded[1] <= max_turns)):
                self._died_of = "bad_reply"
                raise SandboxError("bad_reply", f"load reply {str(loaded)[:100]!r} is not [class name, max_turns]")
            self.class_name, self.max_turns = loaded
            self._wall_left = WALL_BUDGET_CALLS * limits.call_timeout
        except BaseException:
            self.close()
            raise

    def _spawn(self) -> None:
        """Start the child on three private pipes: requests, replies, crash reports; it keeps one end of each."""
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        crash_r, crash_w = os.pipe()
        child_fds = (req_r, rep_w, crash_w)
        try:
            self._proc, self._inner_init = isolation.spawn(self._dir, self.limits, self._uid, child_fds)
        finally:
            for fd in child_fds:
                os.close(fd)
        self._fds = (req_w, rep_r, crash_r)
        for fd in self._fds:
            os.set_blocking(fd, False)
        self.alive = True
        _LIVE.add(self)

    def __enter__(self) -> "EnvProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def call(self, method: str, *args):
        """The JSON round trip of env.method(*args) (tuples -> lists, bools stay bools, NaN/inf allowed)."""
        self.send(method, *args)
        return self.receive()

    def send(self, method: str, *args) -> None:
        """First half of call(): send the request without waiting (see call_many)."""
        if self._pending is not None:
            raise RuntimeError("receive() the reply to the previous send() first")
        if not self.alive:
            raise SandboxError(self._died_of, "the environment process is no longer running")
        self._send({"method": method, "args": list(args)})

    def receive(self):
        """Second half of call(): the reply to the last send(), or its SandboxError."""
        if self._pending is None:
            raise RuntimeError("receive() without send()")
        _collect([self])
        outcome, self._pending, self._outcome = self._outcome, None, None
        if isinstance(outcome, SandboxError):
            raise outcome
        return outcome

    def _send(self, request: dict) -> None:
        nonce = secrets.token_hex(16).encode()
        body = json.dumps(request).encode()
        now = time.monotonic()
        deadline = now + min(self.limits.call_timeout, self._wall_left)
        self._pending, self._outcome = (nonce, deadline, now), None
        out = memoryview(b"%s %010d\n" % (nonce, len(body)) + body)
        writable = select.poll()   # not select.select: it refuses a descriptor past 1023 (a trainer with many open)
        writable.register(self._fds[0], select.POLLOUT)
        while out:   # note: a request bigger than the pipe buffer needs the child to be reading
            left = deadline - time.monotonic()
            if left <= 0 or not writable.poll(max(1, int(1000 * min(left, MAX_WAIT)) + 1)):
                self._fail("timeout", "the child did not read its request in time")
                break
            try:
                out = out[os.write(self._fds[0], out):]
            except BlockingIOError:
                continue
            except OSError:   # the child is gone; its reply pipe tells how it died
                break

    def _fail(self, reason: str, detail: str) -> None:
        """Record the outcome of the request in flight as a failure; only survivable ones keep the child.
        Every failure's detail passes here, made inert as one line (what the child wrote in it included)."""
        self._outcome = SandboxError(reason, inert(detail, one_line=True))
        if reason not in _SURVIVABLE:
            self._died_of = reason
            self.close()

    def _on_readable(self) -> bool:
        """Read what the child wrote; True once the reply (or a failure) is complete."""
        try:
            chunk = os.read(self._fds[1], 1 << 20)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self._fail(*self._death())
            return True
        self._buf += chunk
        nonce, buf = self._pending[0], self._buf
        if len(buf) < _HEADER:
            return False
        if buf[:32] != nonce or buf[32:33] != b" " or buf[43:44] != b"\n" or not buf[33:43].isdigit():
            self._fail("protocol", "a reply failed authentication (wrong nonce or framing)")
            return True
        size = int(buf[33:43])
        if size > self.limits.max_message_bytes + 1024 or len(buf) > _HEADER + size:
            self._fail("protocol", "a reply larger than announced or than max_message_bytes")
            return True
        if len(buf) < _HEADER + size:
            return False
        body = bytes(buf[_HEADER:])
        buf.clear()
        self._accept(body)
        return True

    def _accept(self, body: bytes) -> None:
        """Decode a reply as the hostile data it is: any failure, a value nested deeper than the child's encoder
        allows or text that is not valid Unicode ends the call as 'bad_reply' (a forged or swapped encoder).
        Every text of the value, dict keys included, is made inert (_inert_value); a failure's detail in _fail."""
        try:
            reply = json.loads(body)
            # note: counting brackets is a quick upper bound on the depth (brackets in strings count too)
            if body.count(b"[") + body.count(b"{") > _MAX_DEPTH and _too_deep(reply, _MAX_DEPTH + 1):
                raise ValueError(f"a reply nested deeper than {_MAX_DEPTH} levels")
            ok, reason, value = reply["ok"], reply.get("reason"), reply.get("value")
            detail = str(reply.get("detail", ""))[:500]
            value = _inert_value(value)
        except Exception as exc:   # RecursionError, ValueError, UnicodeError, TypeError, AttributeError, ...
            self._fail("bad_reply", f"{type(exc).__name__}: {str(exc)[:200]}")
            return
        if ok is True and "value" in reply:
            self._outcome = value
        elif isinstance(reason, str) and reason in REASONS:
            self._fail(reason, detail)
        else:
            self._fail("bad_reply", f"unknown reply {str(reply)[:200]}")

    def _death(self) -> tuple:
        """(reason, detail) of a child that closed its reply pipe, from what faulthandler left on the crash pipe."""
        self._kill()
        try:
            text = os.read(self._fds[2], 1 << 16).decode(errors="replace")
        except OSError:
            text = ""
        if "sandbox refused " in text:   # written by the audit hook just before it ended the process
            return "forbidden", text[text.rindex("sandbox refused ") + 16:][:500]
        if "Fatal Python error" in text:
            first = text[text.index("Fatal Python error"):].splitlines()[0]
            return "crash", first
        if "most recent call first" in text:   # SIGXCPU dumped a stack: the CPU limit was reached
            return "timeout", f"CPU time limit of {self.limits.cpu_seconds} s exceeded"
        return "crash", "the child exited without replying"

    def _kill(self) -> None:
        """SIGKILL the interpreter and everything it started (see isolation.kill)."""
        if self._proc is not None:
            isolation.kill(self._proc, self._inner_init)

    def close(self) -> None:
        """Kill the child and everything it started, remove its directory. Idempotent."""
        if self._closed:
            return
        self._closed, self.alive = True, False
        self._kill()
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = (-1, -1, -1)
        shutil.rmtree(self._dir, ignore_errors=True)
        isolation.release_uid(self._uid)
        _LIVE.discard(self)


# Text an environment sends is made inert once, as its reply is decoded: a lone surrogate becomes U+FFFD in a
# failure's detail and fails a value as 'bad_reply' (no encoder or tokenizer takes one); a control character but
# newline and tab (in a one-line detail, those too), U+2028/9, a bidi control and each format (Cf) or default-ignorable
# character (variation selectors hid `rm -rf ~` in a class name; an emoji's U+FE0E/F pass) are shown as escapes.
_HIDDEN = ("\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u115f\u1160\u17b4\u17b5\u180b-\u180f"
           "\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ufe00-\ufe0d\ufeff\uffa0\ufff0-\ufffb\U000110bd\U000110cd"
           "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff\ud800-\udfff")
_UNSAFE, _UNSAFE_IN_LINE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_HIDDEN}]"), re.compile(f"[\x00-\x1f\x7f-\x9f{_HIDDEN}]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def inert(text: str, one_line: bool = False) -> str:
    """text as it may be printed or written: lone surrogates as U+FFFD, control characters other than newline and
    tab (one_line: those too), U+2028/U+2029, bidi controls, format and default-ignorable characters shown as their
    escape.

    >>> inert("ok\\r\\x1b[2K valid\\ud800\\n"), inert("a\\nb\\tc", one_line=True), inert("plain text")
    ('ok\\\\r\\\\x1b[2K valid\\ufffd\\n', 'a\\\\nb\\\\tc', 'plain text')
    """
    pattern = _UNSAFE_IN_LINE if one_line else _UNSAFE
    return pattern.sub(_shown, text) if pattern.search(text) else text


def _shown(match: re.Match) -> str:
    char = match.group()
    if "\ud800" <= char <= "\udfff":
        return "\ufffd"
    named, code = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(char), ord(char)
    return named or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")


def _inert_text(text: str) -> str:
    if not _UNSAFE.search(text):
        return text
    if _SURROGATE.search(text):
        raise ValueError("a lone surrogate in a reply's text")
    return _UNSAFE.sub(_shown, text)


def _inert_value(value):
    """A decoded reply's value with every text made inert (see inert), its lists and dicts changed in place (they are
    fresh from json.loads); ValueError for a lone surrogate. Iterative: the depth was bounded before.

    >>> _inert_value(["a\\x1b[2K", {"k\\r": ["\\u202e"]}, 3])
    ['a\\\\x1b[2K', {'k\\\\r': ['\\\\u202e']}, 3]
    """
    if isinstance(value, str):
        return _inert_text(value)
    stack = [value] if isinstance(value, (list, dict)) else []
    while stack:
        item = stack.pop()
        if isinstance(item, dict) and any(_UNSAFE.search(key) for key in item):
            pairs = list(item.items())
            item.clear()
            item.update((_inert_text(key), v) for key, v in pairs)
        for key, x in (item.items() if isinstance(item, dict) else enumerate(item)):
            if isinstance(x, str):
                item[key] = _inert_text(x)
            elif isinstance(x, (list, dict)):
                stack.append(x)
    return value


def _too_deep(value, limit: int) -> bool:
    """Whether a decoded JSON value nests deeper than limit; iterative, so the check itself cannot overflow.

    >>> _too_deep([[1], {"a": [2]}], 3), _too_deep([[1], {"a": [2]}], 2)
    (False, True)
    """
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, list):
            stack.extend((x, depth + 1) for x in item)
        elif isinstance(item, dict):
            stack.extend((x, depth + 1) for x in item.values())
    return False


def _collect(procs: list) -> None:
    """Read replies until every proc has its reply or its failure; each request keeps its own deadline."""
    waiting = {p._fds[1]: p for p in procs if p._pending is not None and p._outcome is None and not p._closed}
    poller = select.poll()
    for fd in waiting:
        poller.register(fd, select.POLLIN)
    while waiting:
        now = time.monotonic()
        for fd, p in list(waiting.items()):
            if now >= p._pending[1]:
                budget = f"its calls spent the instance's wall budget ({WALL_BUDGET_CALLS} x call_timeout)"
                within = f"no reply within {p.limits.call_timeout:g} s"
                p._fail("timeout", within if p._wall_left > p.limits.call_timeout else budget)
                poller.unregister(fd)
                del waiting[fd]
        if not waiting:
            break
        wait_ms = 1000 * min(min(p._pending[1] for p in waiting.values()) - now, MAX_WAIT)
        for fd, _ in poller.poll(max(1, int(wait_ms) + 1)):
            if waiting[fd]._on_readable():
                waiting[fd]._wall_left -= time.monotonic() - waiting[fd]._pending[2]
                poller.unregister(fd)
                del waiting[fd]


def call_many(procs: list, method: str, args: list) -> list:
    """Send to all, then collect all; each reply gets its own wall-clock deadline; errors returned, not raised.

    >>> code = "class EchoEnv:\\n    def step(self, a): return a * 2\\n"
    >>> envs = [EnvProcess(code) for _ in range(3)]
    >>> call_many(envs, "step", [(1,), ("ab",), ([0],)])
    [2, 'abab', [0, 0]]
    >>> for env in envs: env.close()
    """
    results: list = [None] * len(procs)
    for i, (proc, arg) in enumerate(zip(procs, args)):
        try:
            proc.send(method, *arg)
        except SandboxError as err:
            results[i] = err
    _collect([p for p, r in zip(procs, results) if r is None])
    for i, proc in enumerate(procs):
        if results[i] is None:
            try:
                results[i] = proc.receive()
            except SandboxError as err:
                results[i] = err
    return results


def _close_all() -> None:
    for proc in list(_LIVE):
        proc.close()


atexit.register(_close_all)

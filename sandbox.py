"""Run untrusted, LLM-written environment code in a fresh, locked-down child interpreter.

The one idea: the trainer never executes generated code. Each environment instance lives in its own new Python
process (`python -S -B -c`, never a fork of the trainer) inside independent layers, and is spoken to over a
private pipe pair carrying length-prefixed JSON frames. If one layer fails the others still hold.
`isolation_report()` says which layers are active here (a missing one is reported, never silently skipped), and
tests/test_hostile.py attacks each of them, including with the audit hook switched off.

Layers, outermost first:
 1. Namespaces (util-linux `unshare`): network (no usable interface: no connection anywhere, localhost
    included); PID, with the interpreter as init and its own /proc (no other process visible; everything it
    starts, double-forked `setsid` daemons included, dies with it); IPC; UTS; mount, in which / and /dev/shm are
    read-only and the working directory is a private 4 x file_size_mb noexec tmpfs.
 2. No privileges: as root, `setpriv` runs the child as uid/gid 65534 with no capabilities, no_new_privs and a
    parent-death signal. The interpreter is bind-mounted read-only into its directory, so it runs even when
    its installation is unreadable to uid 65534 (pyenv under /root).
 3. rlimits: CPU seconds over the instance's life, address space, file size, open files, no core dumps.
 4. A wall-clock deadline on start+init and on every call, enforced with SIGKILL to the child (init of its PID
    namespace: everything in it dies) and to its launcher's process group.
 5. A scrubbed environment (PATH, LANG, HOME, TMPDIR, PYTHONHASHSEED=0 only), a private working directory
    removed on close, stdin/stdout/stderr on /dev/null (floods cost nothing and reach no one).
 6. A PEP 578 audit hook, installed before the generated code is compiled, refusing: sockets and network
    modules; subprocess/exec/fork/spawn/system/posix_spawn; ctypes, native modules from outside the standard
    library, crafted code objects (marshal, code.__new__); opening files outside an allow-list (its directory
    read-write, the standard library read-only; str/bytes paths only, no descriptors), other path changes
    outside its directory, chdir, links, chmod/chown; signals (kill, killpg, pthread_kill); resource.setrlimit;
    new audit hooks; settrace/setprofile; gc's object walks; importing ctypes, socket, subprocess,
    multiprocessing, mmap, signal, fcntl, pty, ... A refusal is sticky: the call ends as
    SandboxError('forbidden') even if the code caught the PermissionError, and the child is killed.
 7. The protocol: dedicated pipe descriptors (not stdio). Each request carries a fresh random nonce that its
    reply must echo, under a length header bounded by max_message_bytes; anything else on the reply pipe (a
    blind fake written to every descriptor, a second reply) is a 'protocol' failure and kills the child.

NOT covered:
 * The audit hook is a tripwire, not a boundary (PEP 578 says so): CPython has memory-safety bugs reachable from
   pure Python. Code that exploits one meets layers 1-5 only, and without namespaces or setpriv (see
   isolation_report()) those are much weaker: the child can then write what root can, see /proc, reach the
   network and signal other processes.
 * The nonce stops blind spoofing, not code that instruments its own interpreter (monkeypatching os.read, say);
   that can forge only the reply to the call in progress, whose result it controls anyway.
 * The kernel's attack surface (no seccomp filter), CPU and cache side channels, files readable by uid 65534,
   and memory pressure up to RLIMIT_AS times the number of live children.
 * The cause of death is read from the child's faulthandler output: code that writes fake text there can only
   mislabel its own death ('crash' vs 'timeout').
"""
from __future__ import annotations

import atexit
import inspect
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass

REASONS = ("syntax", "no_env_class", "init_error", "timeout", "memory", "crash", "forbidden",
           "not_serializable", "too_large", "protocol", "error")
_SURVIVABLE = {"error", "not_serializable", "too_large"}  # every other failure kills the child
_HEADER = 44  # frame header: 32 hex chars of nonce, a space, 10 digits of body length, a newline
_NOBODY = 65534


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 20          # RLIMIT_CPU of the child (whole life of the instance)
    memory_mb: int = 1024          # RLIMIT_AS of the child
    file_size_mb: int = 1          # RLIMIT_FSIZE; the private tmpfs holds 4x this
    open_files: int = 64           # RLIMIT_NOFILE
    call_timeout: float = 5.0      # wall-clock seconds for start+init and for each call
    max_message_bytes: int = 1_000_000   # cap on one reply (observation etc.) -> SandboxError('too_large')


class SandboxError(Exception):
    """A failed start or call: `reason` is one of REASONS, `detail` is short human text."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason, detail)
        self.reason, self.detail = reason, detail

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


# ---------------------------------------------------------------------------------------------------------------
# The child. These functions are shipped as source text to the fresh interpreter and run only there; they use
# nothing from this module's globals but each other.


def _child_main(cfg: dict) -> None:
    """Lock the interpreter down (rlimits, crash reports, audit hook), then serve requests until EOF."""
    import _signal
    import _thread
    import faulthandler
    import os
    import resource
    import select
    import sys
    mb = 1 << 20
    for limit, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_AS, cfg["memory_mb"] * mb),
                         (resource.RLIMIT_FSIZE, cfg["file_size_mb"] * mb),
                         (resource.RLIMIT_NOFILE, cfg["open_files"])):
        resource.setrlimit(limit, (value, value))
    # subtle: soft < hard, so the kernel sends SIGXCPU (dumped to the crash pipe: "CPU limit") before SIGKILL
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_seconds"], cfg["cpu_seconds"] + 1))
    req_fd, rep_fd, crash_fd = cfg["fds"]
    faulthandler.enable(file=crash_fd)       # segfaults etc. leave "Fatal Python error: ..." for the parent
    faulthandler.register(_signal.SIGXCPU, file=crash_fd)
    _signal.signal(_signal.SIGXFSZ, _signal.SIG_IGN)   # a too-large write raises OSError instead of killing
    _thread.start_new_thread(_child_watchdog, (req_fd, select, os))
    sys.path[:] = [p for p in sys.path if p]   # no '' (the working directory) on the import path
    import random  # noqa: F401  (nearly every environment imports it: load its .pyc while marshal is allowed)
    home = os.getcwd()
    hook, refused = _child_hook(home, [os.path.realpath(p) for p in sys.path])
    sys.addaudithook(hook)
    # subtle: marshal.loads is refused (crafted code objects can corrupt memory), so stdlib modules imported
    # from now on must compile from source: point the .pyc cache at a directory that does not exist.
    sys.pycache_prefix = os.path.join(home, ".no-pycache")
    _child_serve(req_fd, rep_fd, refused, cfg["max_message_bytes"])


def _child_watchdog(req_fd: int, select, os) -> None:
    """Exit when the trainer goes away (the request pipe hangs up), even while env code is running."""
    poller = select.poll()
    poller.register(req_fd, 0)   # note: POLLHUP is reported even with no events asked for
    while True:
        for _, event in poller.poll():
            if event & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                os._exit(0)


def _child_rules() -> tuple:
    """What the audit hook refuses: event-name prefixes, module names, and the events that carry paths."""
    deny_prefixes = ("socket.", "ctypes.", "subprocess.", "os.exec", "os.spawn", "os.posix_spawn", "os.fork",
                     "os.system", "os.kill", "os.killpg", "signal.pthread_kill", "resource.", "sys.addaudithook",
                     "sys.settrace", "sys.setprofile", "sys._current_frames", "gc.get_", "marshal.",
                     "code.__new__", "mmap.", "fcntl.", "pty.", "os.chdir", "os.fchdir", "os.chroot", "os.link",
                     "os.symlink", "os.chmod", "os.chown", "os.lchown", "os.chflags", "os.lchflags", "os.mkfifo",
                     "os.mknod", "os.setxattr", "os.removexattr", "os.getxattr", "os.listxattr", "sqlite3.",
                     "webbrowser.", "urllib.", "http.", "ftplib.", "smtplib.", "poplib.", "imaplib.",
                     "nntplib.", "telnetlib.", "shutil.chown", "os.startfile")
    deny_modules = {"ctypes", "_ctypes", "socket", "_socket", "ssl", "_ssl", "subprocess", "_posixsubprocess",
                    "multiprocessing", "_multiprocessing", "_posixshmem", "mmap", "signal", "fcntl", "pty",
                    "termios", "asyncio", "_testcapi", "_testinternalcapi", "_xxsubinterpreters", "_ctypes_test"}
    # event -> (writes?, positions of path arguments, positions of dir_fd arguments)
    path_events = {"os.listdir": (False, (0,), ()), "os.scandir": (False, (0,), ()),
                   "os.mkdir": (True, (0,), (2,)), "os.rmdir": (True, (0,), (1,)),
                   "os.remove": (True, (0,), (1,)), "os.rename": (True, (0, 1), (2, 3)),
                   "os.truncate": (True, (0,), ()), "os.utime": (True, (0,), (3,)),
                   "tempfile.mkstemp": (True, (0,), ()), "tempfile.mkdtemp": (True, (0,), ())}
    return deny_prefixes, deny_modules, path_events


def _child_hook(home: str, read_roots: list):
    """The audit hook and a function returning the first refusal ("" if none): refusals are sticky."""
    import os
    realpath, sep, fsdecode = os.path.realpath, os.sep, os.fsdecode
    python_dir = os.path.join(home, ".python")
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    deny_prefixes, deny_modules, path_events = _child_rules()
    first, writes = [], [0]

    def inside(path: str, root: str) -> bool:
        return path == root or path.startswith(root + sep)

    def path_ok(path, write: bool) -> bool:
        if type(path) is bytes:
            path = fsdecode(path)
        if type(path) is not str:   # descriptors and PathLike objects (whose __fspath__ could lie)
            return False
        real = realpath(path)
        if inside(real, home) and not inside(real, python_dir):
            return True
        return not write and in_roots(real)

    def in_roots(real: str) -> bool:
        return any(inside(real, root) for root in read_roots)

    def why_refused(event: str, args: tuple):
        if event == "open":
            write = bool(args[2] & write_flags)
            if write:
                writes[0] += 1
            if writes[0] > 256:
                return "too many files written"
            return None if path_ok(args[0], write) else "outside the sandbox's files"
        if event in path_events:
            write, paths, dir_fds = path_events[event]
            if any(args[i] not in (None, -1) for i in dir_fds):
                return "dir_fd"
            return None if all(path_ok("." if args[i] is None else args[i], write) for i in paths) else \
                "outside the sandbox's directory"
        if event == "import":   # (name, filename or None, ...); _imp.create_dynamic also lands here
            if any(part in deny_modules for part in str(args[0]).split(".")):
                return "module not allowed"
            if args[1] is not None and not (type(args[1]) is str and in_roots(realpath(args[1]))):
                return "native code from outside the standard library"
            return None
        return "not allowed" if event.startswith(deny_prefixes) else None

    def hook(event: str, args: tuple) -> None:
        why = why_refused(event, args)
        if why is not None:
            if not first:
                first.append(f"{event} {str(args[:2])[:200]}: {why}")
            raise PermissionError(f"sandbox refused {event}: {why}")

    return hook, lambda: first[0] if first else ""


def _child_serve(req_fd: int, rep_fd: int, refused, max_bytes: int) -> None:
    """The request loop: the first request loads the environment, each later one calls a method."""
    import json
    import os
    # bound now: env code may monkeypatch these modules for its own purposes later
    read, write, loads, dumps, exit_ = os.read, os.write, json.loads, json.dumps, os._exit
    read_frame, load, call, fail = _child_read, _child_load, _child_call, _child_fail
    env, buf = None, b""
    while True:
        frame = read_frame(req_fd, buf, read)
        if frame is None:
            exit_(0)
        nonce, body, buf = frame
        request = loads(body)
        if env is None:
            reply, env = load(request["code"], request["kwargs"], refused, request.get("max_turns"))
        else:
            reply = call(env, request["method"], request["args"], refused, max_bytes)
        try:
            data = dumps(reply, allow_nan=True).encode()
        except ValueError as exc:   # e.g. an int with more digits than int->str conversion allows
            data = dumps(fail("not_serializable", str(exc)[:300])).encode()
        if len(data) > max_bytes + 1024:
            data = dumps(fail("too_large", f"reply of {len(data)} bytes > {max_bytes}")).encode()
        out = b"%s %010d\n" % (nonce, len(data)) + data
        while out:
            out = out[write(rep_fd, out):]
        if env is None or not (reply["ok"] or reply["reason"] in ("error", "not_serializable", "too_large")):
            exit_(0)   # a failed start or a fatal failure: the parent kills what is left anyway


def _child_read(fd: int, buf: bytes, read):
    """One request frame as (nonce, body, leftover bytes), or None at EOF."""
    while True:
        if len(buf) >= 44:
            size = int(buf[33:43])
            if len(buf) >= 44 + size:
                return buf[:32], buf[44:44 + size], buf[44 + size:]
        chunk = read(fd, 1 << 16)
        if not chunk:
            return None
        buf += chunk


def _child_fail(reason: str, detail: str) -> dict:
    return {"ok": False, "reason": reason, "detail": detail[:500]}


def _child_run(fn, args: tuple, error_reason: str, refused):
    """fn(*args) as (value, failure); failure is (reason, detail) or None. A refusal wins over any outcome."""
    try:
        value, failure = fn(*args), None
    except MemoryError:
        value, failure = None, ("memory", "MemoryError")
    except BaseException as exc:   # SystemExit / KeyboardInterrupt raised by env code are env errors too
        try:
            text = f"{type(exc).__name__}: {exc}"
        except BaseException:
            text = type(exc).__name__
        value, failure = None, (error_reason, text)
    if refused():
        value, failure = None, ("forbidden", refused())
    return value, failure


def _child_prelude(code) -> dict:
    """Names the module gets before it runs, for those its code uses (a superset: every global and attribute
    name of the code and the code nested in it), as (module, attribute or None). The official loader
    pre-populates these too, so that a game that forgot `import random` still loads."""
    table = {**{m: (m, None) for m in ("math", "random", "re", "json", "itertools", "functools", "collections",
                                       "string", "copy", "heapq", "bisect", "statistics", "typing")},
             **{n: ("collections", n) for n in ("deque", "defaultdict", "Counter", "OrderedDict", "namedtuple")},
             **{n: ("typing", n) for n in ("Any", "Dict", "List", "Optional", "Set", "Tuple", "Union")},
             **{n: ("itertools", n) for n in ("permutations", "combinations", "product")},
             "reduce": ("functools", "reduce"), "lru_cache": ("functools", "lru_cache"),
             "dataclass": ("dataclasses", "dataclass"), "field": ("dataclasses", "field"), "Enum": ("enum", "Enum")}
    names, todo = set(), [code]
    while todo:
        c = todo.pop()
        names.update(c.co_names)
        todo.extend(k for k in c.co_consts if type(k) is type(c))
    return {n: table[n] for n in sorted(names & table.keys())}


def _child_game_class(module, names: list):
    """Among the top-level classes whose name ends in 'Env', the first that no other of them subclasses (a file
    may define `class Env`, then `class MastermindEnv(Env)`); the official code's injected base names
    (Env, ToolUseBaseEnv) are skipped when there is another candidate. None if there is no such class."""
    classes = [c for c in (module.__dict__.get(n) for n in dict.fromkeys(names)) if isinstance(c, type)]
    leaves = [c for c in classes if not any(o is not c and issubclass(o, c) for o in classes)]
    leaves = [c for c in leaves if c.__name__ not in ("Env", "ToolUseBaseEnv")] or leaves
    return leaves[0] if leaves else None


def _child_load(code: str, kwargs: dict, refused, max_turns_cap):
    """Compile, run the module, take its game class, instantiate it with its own defaults, cap max_turns.

    The game class: among the top-level classes whose name ends in 'Env', the first that no other of them
    subclasses (a file may define `class Env` and then `class MastermindEnv(Env)`), the names of the
    official code's injected bases skipped when there is another candidate.
    """
    import sys
    try:
        tree = compile(code, "<env>", "exec", 0x400)   # 0x400 = ast.PyCF_ONLY_AST, without importing ast
        module_code = compile(tree, "<env>", "exec")
    except MemoryError:
        return _child_fail("memory", "MemoryError while compiling"), None
    except (SyntaxError, ValueError, RecursionError) as exc:   # ValueError: NUL bytes; RecursionError: nesting
        return _child_fail("syntax", f"{type(exc).__name__}: {exc}"), None
    names = [node.name for node in tree.body if type(node).__name__ == "ClassDef" and node.name.endswith("Env")]
    if not names:
        return _child_fail("no_env_class", "no top-level class whose name ends in 'Env'"), None
    module = type(sys)("env_module")
    sys.modules["env_module"] = module   # dataclasses, enum and pickle look a class's module up here
    for name, (mod, attr) in _child_prelude(module_code).items():
        value, failure = _child_run(__import__, (mod,), "init_error", refused)
        if failure:
            return _child_fail(*failure), None
        module.__dict__[name] = value if attr is None else getattr(value, attr)
    _, failure = _child_run(exec, (module_code, module.__dict__), "init_error", refused)
    if failure:
        return _child_fail(*failure), None
    cls, failure = _child_run(_child_game_class, (module, names), "init_error", refused)
    if failure:
        return _child_fail(*failure), None
    if cls is None:
        return _child_fail("no_env_class", f"{names[0]} is not a class once the module has run"), None
    env, failure = _child_run(lambda: cls(**kwargs), (), "init_error", refused)
    if failure:
        return _child_fail(*failure), None
    turns = None
    if max_turns_cap is not None:     # capped, never raised: min(its own max_turns, the runner's)
        own, failure = _child_run(getattr, (env, "max_turns", None), "init_error", refused)
        turns = min(own, max_turns_cap) if type(own) is int and own > 0 else max_turns_cap
        if not failure and turns != own:
            _, failure = _child_run(setattr, (env, "max_turns", turns), "init_error", refused)
        if failure:
            return _child_fail(*failure), None
    return {"ok": True, "value": [str(type.__dict__["__name__"].__get__(cls)), turns]}, env


def _child_call(env, method: str, args: list, refused, max_bytes: int) -> dict:
    """env.method(*args) as a reply holding a copy of the result made of plain JSON types."""
    if method.startswith("_"):
        return _child_fail("error", f"AttributeError: private method {method!r}")
    value, failure = _child_run(lambda: getattr(env, method)(*args), (), "error", refused)
    if failure:
        return _child_fail(*failure)
    budget = [max_bytes]
    plain, failure = _child_run(_child_plain, (value, budget, 0), "not_serializable", refused)
    if failure and failure[0] == "not_serializable" and budget[0] < 0:
        failure = ("too_large", f"result larger than {max_bytes} bytes")
    return _child_fail(*failure) if failure else {"ok": True, "value": plain}


def _child_plain(value, budget: list, depth: int):
    """A copy of value in exact JSON types (subclasses like namedtuple or IntEnum become what json would write),
    charging its size to budget[0]; raises before building anything huge, deep or not JSON-serializable."""
    budget[0] -= 8
    if budget[0] < 0:
        raise OverflowError("result too large")
    if depth > 100:
        raise ValueError("result nested deeper than 100 levels")
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        budget[0] -= len(value)
        if budget[0] < 0:
            raise OverflowError("result too large")
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, (list, tuple)):
        return [_child_plain(item, budget, depth + 1) for item in value]
    if isinstance(value, dict):
        out = {}
        for key, item in dict.items(value):
            if not (key is None or isinstance(key, (str, int, float))):
                raise TypeError(f"dict key of type {type(key).__name__} is not JSON-serializable")
            out[_child_plain(key, budget, depth + 1)] = _child_plain(item, budget, depth + 1)
        return out
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


_CHILD_FUNCTIONS = (_child_main, _child_watchdog, _child_rules, _child_hook, _child_serve, _child_read, _child_fail,
                    _child_run, _child_prelude, _child_game_class, _child_load, _child_call, _child_plain)
_CHILD_SOURCE = "\n".join(inspect.getsource(f) for f in _CHILD_FUNCTIONS) + \
    "\nimport json, sys\n_child_main(json.loads(sys.argv[1]))\n"


# ---------------------------------------------------------------------------------------------------------------
# The parent: how to launch a child on this machine (probed once), and the process handle.

# In the child's new mount namespace, before privileges are dropped: a small noexec tmpfs over the private
# directory, the interpreter's installation bound read-only inside it, the rest of the filesystem read-only.
# Arguments: $1 private dir, $2 interpreter prefix, $3 tmpfs size (MB), $4 owner uid; then the command.
_MOUNT_SCRIPT = ('mount -t tmpfs -o size="$3"m,mode=700,uid="$4",gid="$4",nosuid,nodev,noexec sandbox "$1" && '
                 'mkdir "$1/.python" && mount --bind -o ro "$2" "$1/.python" && mount -o remount,bind,ro / && '
                 '{ mount -o remount,bind,ro /dev/shm 2>/dev/null || true; } && '
                 'cd "$1" && unset PWD OLDPWD && shift 4 && exec "$@"')


@dataclass(frozen=True)
class _Launcher:
    mode: str                      # "namespaces+mounts", "namespaces" or "none"
    unshare: tuple = ()            # unshare command and options
    mounts: bool = False           # run _MOUNT_SCRIPT (and the interpreter from its bind mount)
    drop: tuple = ()               # setpriv command that drops to uid 65534

    def argv(self, home: str, limits: Limits) -> list:
        prefix = os.path.realpath(sys.base_prefix)
        exe = os.path.realpath(sys.executable)
        cmd = [*self.unshare]
        if self.mounts:
            cmd += ["/bin/sh", "-c", _MOUNT_SCRIPT, "sh", home, prefix, str(4 * limits.file_size_mb),
                    str(_NOBODY if self.drop else 0)]
            exe = os.path.join(home, ".python", os.path.relpath(exe, prefix))
        return [*cmd, *self.drop, exe, "-S", "-B", "-c"]


def _child_env(home: str) -> dict:
    # note: PYTHONHASHSEED fixes str hashing (set order) so one seed gives one episode in every child
    return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home,
            "PYTHONHASHSEED": "0"}


def _candidates() -> list:
    """Launchers from strongest to weakest, with what makes each impossible here (or "")."""
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    root = os.geteuid() == 0
    ns = (unshare, *(() if root else ("--user", "--map-root-user")), "--net", "--pid", "--ipc", "--uts",
          "--mount-proc", "--fork", "--kill-child")
    drop = (setpriv, f"--reuid={_NOBODY}", f"--regid={_NOBODY}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs", "--pdeathsig=KILL") if root else ()
    in_prefix = not os.path.relpath(os.path.realpath(sys.executable),
                                    os.path.realpath(sys.base_prefix)).startswith("..")
    missing_full = "no unshare" if not unshare else "no setpriv (needed as root)" if root and not setpriv else \
        "interpreter outside sys.base_prefix" if not in_prefix else ""
    return [(_Launcher("namespaces+mounts", ns, True, drop), missing_full),
            (_Launcher("namespaces", ns), "" if unshare else "no unshare"),
            (_Launcher("none"), "")]


def _probe() -> tuple:
    """The strongest launcher that starts a working interpreter here, and why the stronger ones failed."""
    failures = []
    for launcher, missing in _candidates():
        if missing:
            failures.append(f"{launcher.mode}: {missing}")
            continue
        home = tempfile.mkdtemp(prefix="spade-sandbox-probe-")
        try:
            out = subprocess.run(launcher.argv(home, Limits()) + ["import json; print('ok')"], cwd=home,
                                 env=_child_env(home), capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
            if out.stdout.strip() == b"ok":
                return launcher, failures
            lines = (out.stderr or out.stdout).decode(errors="replace").strip().splitlines() or ["no output"]
            failures.append(f"{launcher.mode}: exit {out.returncode}: {lines[-1][:200]}")
        except (OSError, subprocess.SubprocessError) as exc:
            failures.append(f"{launcher.mode}: {exc}")
        finally:
            shutil.rmtree(home, ignore_errors=True)
    raise RuntimeError("cannot start a child interpreter: " + "; ".join(failures))


_LAUNCH_LOCK = threading.Lock()
_LAUNCH: tuple | None = None


def _launcher() -> _Launcher:
    global _LAUNCH
    with _LAUNCH_LOCK:
        if _LAUNCH is None:
            _LAUNCH = _probe()
    return _LAUNCH[0]


def isolation_report() -> dict:
    """Which layers are active on this machine (probed once per process), and why the missing ones are missing.

    >>> report = isolation_report()
    >>> report["audit_hook"], report["fresh_interpreter"], isinstance(report["namespaces"], bool)
    (True, True, True)
    """
    launcher = _launcher()
    failures = _LAUNCH[1]
    namespaces = launcher.mode != "none"
    return {
        "mode": launcher.mode,
        "namespaces": namespaces,   # network, PID (+ own /proc), IPC, UTS, mount
        "read_only_filesystem": launcher.mounts,
        "unprivileged_user": bool(launcher.drop) or os.geteuid() != 0,
        "fresh_interpreter": True, "audit_hook": True, "rlimits": True, "scrubbed_env": True,
        "private_dir": True, "nonce_protocol": True,
        "why": "; ".join(failures) if failures else "all layers active",
    }


# ---------------------------------------------------------------------------------------------------------------

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
        self._pending: tuple | None = None   # (nonce, deadline) of the request in flight
        self._outcome = None                 # its reply value, or a SandboxError
        self._buf = bytearray()
        self._dir = tempfile.mkdtemp(prefix="spade-sandbox-")
        try:
            self._spawn()
            self._send({"code": code, "kwargs": dict(init_kwargs or {}), "max_turns": max_turns})
            loaded = self.receive()
            if not (isinstance(loaded, list) and len(loaded) == 2 and isinstance(loaded[0], str)
                    and (loaded[1] is None or type(loaded[1]) is int)):
                raise SandboxError("protocol", f"bad load reply {str(loaded)[:100]!r}")
            self.class_name, self.max_turns = loaded
        except BaseException:
            self.close()
            raise

    def _spawn(self) -> None:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        crash_r, crash_w = os.pipe()
        cfg = {"fds": [req_r, rep_w, crash_w], "cpu_seconds": self.limits.cpu_seconds,
               "memory_mb": self.limits.memory_mb, "file_size_mb": self.limits.file_size_mb,
               "open_files": self.limits.open_files, "max_message_bytes": self.limits.max_message_bytes}
        launcher = _launcher()
        self._launched_by_unshare = bool(launcher.unshare)
        try:
            self._proc = subprocess.Popen(
                launcher.argv(self._dir, self.limits) + [_CHILD_SOURCE, json.dumps(cfg)],
                cwd=self._dir, env=_child_env(self._dir), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, pass_fds=(req_r, rep_w, crash_w), start_new_session=True)
        finally:
            for fd in (req_r, rep_w, crash_w):
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
        deadline = time.monotonic() + self.limits.call_timeout
        self._pending, self._outcome = (nonce, deadline), None
        out = memoryview(b"%s %010d\n" % (nonce, len(body)) + body)
        while out:   # note: a request bigger than the pipe buffer needs the child to be reading
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [self._fds[0]], [], left)[1]:
                self._fail("timeout", "the child did not read its request in time")
                break
            try:
                out = out[os.write(self._fds[0], out):]
            except BlockingIOError:
                continue
            except OSError:   # the child is gone; its reply pipe tells how it died
                break

    def _fail(self, reason: str, detail: str) -> None:
        """Record the outcome of the request in flight as a failure; only survivable ones keep the child."""
        self._outcome = SandboxError(reason, detail)
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
        try:
            reply = json.loads(body)
            ok, reason = reply["ok"], reply.get("reason")
        except (ValueError, TypeError, KeyError) as exc:
            self._fail("protocol", f"malformed reply: {exc}")
            return
        if ok is True and "value" in reply:
            self._outcome = reply["value"]
        elif reason in REASONS:
            self._fail(reason, str(reply.get("detail", "")))
        else:
            self._fail("protocol", f"unknown reply {str(reply)[:200]}")

    def _death(self) -> tuple:
        """(reason, detail) of a child that closed its reply pipe, from what faulthandler left on the crash pipe."""
        self._kill()
        try:
            text = os.read(self._fds[2], 1 << 16).decode(errors="replace")
        except OSError:
            text = ""
        if "Fatal Python error" in text:
            first = text[text.index("Fatal Python error"):].splitlines()[0]
            return "crash", first
        if text.strip():   # SIGXCPU dumped a stack: the CPU limit was reached
            return "timeout", f"CPU time limit of {self.limits.cpu_seconds} s exceeded"
        return "crash", "the child exited without replying"

    def _kill(self) -> None:
        """SIGKILL the interpreter (init of its PID namespace: all it started dies too) and its launcher."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        inner = _children(proc.pid) if self._launched_by_unshare else []
        for pid in inner:
            _signal(pid, signal.SIGKILL)
        if inner:
            try:   # unshare exits once it has reaped the interpreter, so no zombie is left to anyone else
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
        _signal(-proc.pid, signal.SIGKILL)   # the launcher's whole process group
        proc.wait()
        _wait_gone(inner)

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
        _LIVE.discard(self)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig) if pid > 0 else os.killpg(-pid, sig)
    except OSError:   # already gone
        pass


def _children(pid: int) -> list:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _wait_gone(pids: list, timeout: float = 2.0) -> None:
    """Wait until each pid has exited (a zombie counts as exited)."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rpartition(")")[2].split()[0] in ("Z", "X"):
                        break
            except OSError:
                break
            time.sleep(0.001)


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
                p._fail("timeout", f"no reply within {p.limits.call_timeout:g} s")
                poller.unregister(fd)
                del waiting[fd]
        if not waiting:
            break
        wait_ms = 1000 * (min(p._pending[1] for p in waiting.values()) - now)
        for fd, _ in poller.poll(max(1, int(wait_ms) + 1)):
            if waiting[fd]._on_readable():
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

"""The OS isolation of sandbox.py: how a child interpreter is launched, locked down and killed."""
from __future__ import annotations

import inspect


# ---------------------------------------------------------------------------------------------------------------
# The child. These functions are shipped as source text to the fresh interpreter and run only there; they use
# nothing from this module's globals but each other.


def _child_main(cfg: dict) -> None:
    """Lock the interpreter down (own uid, syscall filter, rlimits, crash reports, audit hook), then serve
    requests until EOF. Everything here runs before any generated code is compiled."""
    import _signal
    import _thread
    import faulthandler
    import os
    import resource
    import select
    import sys
    req_fd, rep_fd, crash_fd = cfg["fds"]
    os.environ.pop("PWD", None)   # set by bwrap --chdir; the environment holds only what the parent passed
    uid = cfg["uid"]
    if uid is not None and os.getuid() == 0:   # bwrap as root leaves the change of uid to the child
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)   # from uid 0 to another: every capability is gone with it
    if cfg["seccomp"]:
        _child_seccomp(bytes.fromhex(cfg["seccomp"]))   # before any thread starts: threads inherit it
    mb = 1 << 20
    limits = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_AS, cfg["memory_mb"] * mb),
              (resource.RLIMIT_FSIZE, cfg["file_size_mb"] * mb), (resource.RLIMIT_NOFILE, cfg["open_files"])]
    if cfg["threads"]:   # only where this uid (or user namespace) is the sandbox's own: the count is per uid
        limits.append((resource.RLIMIT_NPROC, cfg["threads"]))
    for limit, value in limits:
        resource.setrlimit(limit, (value, value))
    # subtle: soft < hard, so the kernel sends SIGXCPU (dumped to the crash pipe: "CPU limit") before SIGKILL
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_seconds"], cfg["cpu_seconds"] + 1))
    faulthandler.enable(file=crash_fd)       # segfaults etc. leave "Fatal Python error: ..." for the parent
    faulthandler.register(_signal.SIGXCPU, file=crash_fd)
    _signal.signal(_signal.SIGXFSZ, _signal.SIG_IGN)   # a too-large write raises OSError instead of killing
    _thread.start_new_thread(_child_watchdog, (req_fd, select, os))
    sys.path[:] = [p for p in sys.path if p]   # no '' (the working directory) on the import path
    import random  # noqa: F401  (nearly every environment imports it: load its .pyc while marshal is allowed)
    # note: passed straight in, so no frame of this function holds the hook (see _child_hook)
    sys.addaudithook(_child_hook(os.getcwd(), sys.path, crash_fd, os))
    # subtle: marshal.loads is refused (crafted code objects can corrupt memory), so stdlib modules imported
    # from now on must compile from source: point the .pyc cache at a directory that does not exist.
    sys.pycache_prefix = os.path.join(os.getcwd(), ".no-pycache")
    _child_serve(req_fd, rep_fd, cfg["max_message_bytes"])


def _child_seccomp(program: bytes) -> None:
    """Install a seccomp-bpf program (built by the parent with libseccomp) on this process; nothing removes it.

    subtle: ctypes is imported here, before the audit hook, and dropped from sys.modules afterwards, so env code
    that imports it meets the hook's import check."""
    import ctypes
    import sys

    class Program(ctypes.Structure):   # struct sock_fprog
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    # 38 = PR_SET_NO_NEW_PRIVS, 22 = PR_SET_SECCOMP with 2 = SECCOMP_MODE_FILTER
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(Program(len(program) // 8, program)),
                                                      0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot install the seccomp filter")
    for name in [m for m in sys.modules if m.partition(".")[0] in ("ctypes", "_ctypes")]:
        del sys.modules[name]


def _child_watchdog(req_fd: int, select, os) -> None:
    """Exit when the trainer goes away (the request pipe hangs up), even while env code is running.

    note: a fallback only. Env code can replace the descriptor; what holds is the launcher's parent-death signal."""
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
                     "nntplib.", "telnetlib.", "shutil.chown", "os.startfile",
                     "cpython.PyInterpreterState_New")   # a sub-interpreter would start without this hook
    deny_modules = frozenset({
        "ctypes", "_ctypes", "socket", "_socket", "ssl", "_ssl", "subprocess", "_posixsubprocess",
        "multiprocessing", "_multiprocessing", "_posixshmem", "mmap", "signal", "fcntl", "pty", "termios",
        "asyncio", "_testcapi", "_testinternalcapi", "_xxsubinterpreters", "_xxinterpchannels", "_ctypes_test"})
    # event -> (writes?, positions of path arguments, positions of dir_fd arguments)
    path_events = {"os.listdir": (False, (0,), ()), "os.scandir": (False, (0,), ()),
                   "os.mkdir": (True, (0,), (2,)), "os.rmdir": (True, (0,), (1,)),
                   "os.remove": (True, (0,), (1,)), "os.rename": (True, (0, 1), (2, 3)),
                   "os.truncate": (True, (0,), ()), "os.utime": (True, (0,), (3,)),
                   "tempfile.mkstemp": (True, (0,), ()), "tempfile.mkdtemp": (True, (0,), ())}
    return deny_prefixes, deny_modules, path_events


def _child_hook(home: str, roots: list, crash_fd: int, os):
    """The audit hook, a tripwire under the kernel's layers. A refusal writes why to the crash pipe and ends the
    process at once: no code can catch it, and the call fails as 'forbidden'.

    subtle: env code may monkeypatch any module or builtin and walk frames (namedtuple, typing and dataclasses
    need sys._getframe, so frames stay allowed). So the hook looks nothing up when it runs: everything it uses is
    bound below, once, to C functions and exact builtin types; it calls no method of an object env code made;
    and no Python object refers to it (frames do not reach functions, and none of its callers keep it), so its
    checks cannot be patched, reached or switched off."""
    write, exit_ = os.write, os._exit
    str_, bytes_, int_, type_, repr_, errors = str, bytes, int, type, repr, (OSError, ValueError)
    split, join, replace, startswith, encode, decode = \
        str.split, str.join, str.replace, str.startswith, str.encode, bytes.decode
    deny_prefixes, deny_modules, path_events = _child_rules()
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    realpath, writes = _child_realpath(home, os), [0]

    def inside(path: str, root: str) -> bool:
        return path == root or startswith(path, root + "/")

    read_roots = [realpath(p) for p in roots]
    python_dir = home + "/.python"

    def in_roots(real: str) -> bool:
        for root in read_roots:
            if inside(real, root):
                return True
        return False

    def path_ok(path, write: bool) -> bool:
        if type_(path) is bytes_:
            path = decode(path, "utf-8", "surrogateescape")
        elif type_(path) is not str_:   # descriptors, PathLike objects (whose __fspath__ could lie), subclasses
            return False
        real = realpath(path)
        if inside(real, home) and not inside(real, python_dir):
            return True
        return not write and in_roots(real)

    def import_ok(name, origin) -> bool:
        """Module names compared as the import system uses them (an extension's init function is named after
        the last part of its name with '-' read as '_'), and an extension file by its own name too."""
        if type_(name) is not str_ or (origin is not None and type_(origin) is not str_):
            return False
        for part in split(name, "."):
            if replace(part, "-", "_") in deny_modules:
                return False
        if origin is None:
            return True
        real = realpath(origin)
        return in_roots(real) and split(split(real, "/")[-1], ".")[0] not in deny_modules

    def why_refused(event: str, args: tuple):
        if event == "open":
            write = type_(args[2]) is not int_ or args[2] & write_flags != 0
            if write:
                writes[0] += 1
            if writes[0] > 256:
                return "too many files written"
            return None if path_ok(args[0], write) else "outside the sandbox's files"
        if event in path_events:
            write, paths, dir_fds = path_events[event]
            for i in dir_fds:
                if args[i] is not None and not (type_(args[i]) is int_ and args[i] == -1):
                    return "dir_fd"
            for i in paths:
                if not path_ok("." if args[i] is None else args[i], write):
                    return "outside the sandbox's directory"
            return None
        if event == "import":   # (name, filename or None, ...); _imp.create_dynamic also lands here
            return None if import_ok(args[0], args[1]) else "module or native code not allowed"
        return "not allowed" if startswith(event, deny_prefixes) else None

    def shown(value) -> str:   # repr of exact builtin values only: any other repr would run env code
        kind = type_(value)
        return repr_(value)[:200] if kind is str_ or kind is bytes_ or kind is int_ else "..."

    def hook(event: str, args: tuple) -> None:
        why = why_refused(event, args)
        if why is not None:
            text = "sandbox refused " + event + " " + join(", ", [shown(a) for a in args[:2]]) + ": " + why
            try:
                write(crash_fd, encode(text, "utf-8", "replace"))
            except errors:   # the env closed or replaced the pipe: the death is then reported as a crash
                pass
            exit_(1)

    return hook


def _child_realpath(home: str, os):
    """realpath(path) with '.', '..' and every symlink resolved, for the hook: posixpath.realpath looks its
    helpers up at call time, this one only uses what is bound here (the rule of _child_hook)."""
    lstat, readlink, errors = os.lstat, os.readlink, (OSError, ValueError)   # ValueError: a NUL in the path
    split, join, startswith = str.split, str.join, str.startswith

    def realpath(path: str) -> str:
        todo = split(path if startswith(path, "/") else home + "/" + path, "/")[::-1]   # relative: chdir is refused
        done, hops = [], 0
        while todo:
            part = todo.pop()
            if part == "" or part == ".":
                continue
            if part == "..":
                if done:
                    done.pop()
                continue
            done.append(part)
            candidate = "/" + join("/", done)
            try:
                is_link = lstat(candidate).st_mode & 0o170000 == 0o120000
            except errors:
                is_link = False
            if is_link:
                hops += 1
                if hops > 40:
                    return "/\0loop"   # inside nothing
                done.pop()
                target = readlink(candidate)
                if startswith(target, "/"):
                    done.clear()
                todo.extend(split(target, "/")[::-1])
        return "/" + join("/", done)

    return realpath


def _child_serve(req_fd: int, rep_fd: int, max_bytes: int) -> None:
    """The request loop: the first request loads the environment, each later one calls a method.

    note: env code can swap anything here (this module is __main__) and so forge the reply to its own call; the
    parent decodes every reply as hostile data."""
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
            reply, env = load(request["code"], request["kwargs"], request.get("max_turns"))
        else:
            reply = call(env, request["method"], request["args"], max_bytes)
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


def _child_run(fn, args: tuple, error_reason: str):
    """fn(*args) as (value, failure); failure is (reason, detail) or None."""
    try:
        return fn(*args), None
    except MemoryError:
        return None, ("memory", "MemoryError")
    except BaseException as exc:   # SystemExit / KeyboardInterrupt raised by env code are env errors too
        try:
            text = f"{type(exc).__name__}: {exc}"
        except BaseException:
            text = type(exc).__name__
        return None, (error_reason, text)


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


def _child_load(code: str, kwargs: dict, max_turns_cap):
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
        value, failure = _child_run(__import__, (mod,), "init_error")
        if failure:
            return _child_fail(*failure), None
        module.__dict__[name] = value if attr is None else getattr(value, attr)
    _, failure = _child_run(exec, (module_code, module.__dict__), "init_error")
    if failure:
        return _child_fail(*failure), None
    cls, failure = _child_run(_child_game_class, (module, names), "init_error")
    if failure:
        return _child_fail(*failure), None
    if cls is None:
        return _child_fail("no_env_class", f"{names[0]} is not a class once the module has run"), None
    env, failure = _child_run(lambda: cls(**kwargs), (), "init_error")
    if failure:
        return _child_fail(*failure), None
    turns = None
    if max_turns_cap is not None:     # capped, never raised: min(its own max_turns, the runner's)
        own, failure = _child_run(getattr, (env, "max_turns", None), "init_error")
        turns = min(own, max_turns_cap) if type(own) is int and own > 0 else max_turns_cap
        if not failure and turns != own:
            _, failure = _child_run(setattr, (env, "max_turns", turns), "init_error")
        if failure:
            return _child_fail(*failure), None
    return {"ok": True, "value": [str(type.__dict__["__name__"].__get__(cls)), turns]}, env


def _child_call(env, method: str, args: list, max_bytes: int) -> dict:
    """env.method(*args) as a reply holding a copy of the result made of plain JSON types."""
    if method.startswith("_"):
        return _child_fail("error", f"AttributeError: private method {method!r}")
    value, failure = _child_run(lambda: getattr(env, method)(*args), (), "error")
    if failure:
        return _child_fail(*failure)
    budget = [max_bytes]
    plain, failure = _child_run(_child_plain, (value, budget, 0), "not_serializable")
    if failure and failure[0] == "not_serializable" and budget[0] < 0:
        failure = ("too_large", f"result larger than {max_bytes} bytes")
    return _child_fail(*failure) if failure else {"ok": True, "value": plain}


def _child_plain(value, budget: list, depth: int):
    """A copy of value in exact JSON types (subclasses like namedtuple or IntEnum become what json would write),
    charging its size to budget[0]; raises before building anything huge, deep or not JSON-serializable."""
    budget[0] -= 8
    if budget[0] < 0:
        raise OverflowError("result too large")
    if depth > 100:   # _MAX_DEPTH
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


_CHILD_FUNCTIONS = (_child_main, _child_seccomp, _child_watchdog, _child_rules, _child_hook, _child_realpath,
                    _child_serve, _child_read, _child_fail, _child_run, _child_prelude, _child_game_class, _child_load,
                    _child_call, _child_plain)
_CHILD_SOURCE = "\n".join(inspect.getsource(f) for f in _CHILD_FUNCTIONS) + \
    "\nimport json, sys\n_child_main(json.loads(sys.argv[1]))\n"

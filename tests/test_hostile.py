"""Hostile environments: one test per attack or fault. Each must end as a SandboxError with a clear reason (or a
clean result where that is the right answer) within the deadline + 1 s, with this process alive and bounded in
memory, no process left behind, no file written outside the sandbox, no connection made, no secret leaked.

Tests named `..._past_the_audit_hook` assume an attacker who has defeated the audit hook (a CPython memory bug,
say): the child runs without it, and the OS layers alone must hold. They skip, saying so, on machines where
isolation_report() shows those layers missing.
"""
import errno
import html
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import textwrap
import time
import unicodedata

import pytest

import isolation
import sandbox
from sandbox import EnvProcess, Limits, SandboxError

SECRET = "spade-secret-" + secrets.token_hex(8)
os.environ["SPADE_HOSTILE_SECRET"] = SECRET   # visible to any child that is not scrubbed
TIMEOUT = 1.0


def env(reset: str = "return 'ok', {}", step: str = "return 'ok', 0.0, False, False, {}", init: str = "pass",
        prelude: str = "") -> str:
    """Source of an environment whose methods run the given bodies."""
    body = lambda text: textwrap.indent(textwrap.dedent(text).strip(), " " * 8)
    return (textwrap.dedent(prelude) + "\nclass AttackEnv:\n    def __init__(self, **kwargs):\n" + body(init)
            + "\n    def reset(self, seed=None):\n" + body(reset)
            + "\n    def step(self, action):\n" + body(step) + "\n")


def processes() -> dict:
    """pid -> (parent pid, command line) of every live (non-zombie) process."""
    table = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            table[int(entry)] = (int(fields[1]), cmdline)
    return table


def leftovers(marker: str = "") -> list:
    """Descendants of this process, and any process anywhere whose command line holds marker."""
    table, found, frontier = processes(), set(), {os.getpid()}
    while frontier:
        frontier = {p for p, (pp, _) in table.items() if pp in frontier} - found
        found |= frontier
    found |= {p for p, (_, cmd) in table.items() if marker and marker in cmd and p != os.getpid()}
    return sorted(found)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS")).split()[1]) / 1024


def attack(code: str, calls=(("reset", (0,)),), marker: str = "", **limits):
    """Start code and make calls until one fails; return the last result or the SandboxError. Checks the
    properties every attack must keep: deadline + 1 s per call, nothing left running, nothing leaked."""
    limits = Limits(**{"call_timeout": TIMEOUT, **limits})
    outcome, env, t0 = None, None, time.monotonic()
    try:
        env = EnvProcess(code, {}, limits)
        for method, args in calls:
            assert time.monotonic() - t0 < limits.call_timeout + 1.5
            t0 = time.monotonic()
            outcome = env.call(method, *args)
    except SandboxError as err:
        outcome = err
    finally:
        if env is not None:
            env.close()
    assert time.monotonic() - t0 < limits.call_timeout + 1.0 + 0.5   # + start-up for attacks in __init__
    assert leftovers(marker) == []
    assert SECRET not in repr(outcome)
    return outcome


def reason(outcome) -> str:
    return outcome.reason if isinstance(outcome, SandboxError) else "ok"


def needs(layer: str):
    report = isolation.isolation_report()
    return pytest.mark.skipif(not report[layer], reason=f"{layer} not active here: {report['why']}")


@pytest.fixture
def hook_defeated(monkeypatch):
    """Children started in this test run without the audit hook (the kernel's layers remain)."""
    install = "sys.addaudithook(_child_hook("
    assert isolation._CHILD_SOURCE.count(install) == 1
    without = isolation._CHILD_SOURCE.replace(install, "(lambda hook: None)(_child_hook(")
    monkeypatch.setattr(isolation, "_CHILD_SOURCE", without)


@pytest.fixture
def filter_defeated(monkeypatch):
    """Children started in this test run without the seccomp filter, to test the layers under it alone."""
    monkeypatch.setattr(isolation, "_syscall_filter", lambda program: "")


# Loads _posixsubprocess by hand (extension modules are loaded by _imp.create_dynamic), under a disguised name.
LOAD_BY_HAND = '''
import _imp, os, sys
import importlib.machinery as machinery

def load_by_hand(name, real_name):
    lib = next(p for p in sys.path if p.endswith("lib-dynload"))
    path = os.path.join(lib, next(f for f in os.listdir(lib) if f.startswith(real_name + ".")))
    spec = machinery.ModuleSpec(name, machinery.ExtensionFileLoader(name, path), origin=path)
    return _imp.create_dynamic(spec)
'''


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    with pytest.raises(BlockingIOError):   # nothing ever connected
        server.accept()
    server.close()


# --- time -------------------------------------------------------------------------------------------------------

def test_infinite_loop_in_init_times_out():
    assert reason(attack(env(init="while True: pass"))) == "timeout"


def test_infinite_loop_in_reset_times_out():
    assert reason(attack(env(reset="while True: pass"))) == "timeout"


def test_infinite_loop_in_step():
    assert reason(attack(env(step="while True: pass"), [("reset", ()), ("step", ("x",))])) == "timeout"


def test_sleeping_past_the_deadline():
    assert reason(attack(env(reset="import time\ntime.sleep(30)"))) == "timeout"


def test_a_slow_but_legal_environment_spends_its_wall_budget_and_times_out():
    """Each step sleeps 0.6 s, under the 1 s deadline: the calls' wall budget (4 x 1 s) runs out at the 7th."""
    code = env(step="import time\ntime.sleep(0.6)\nreturn 'ok', 0.0, False, False, {}")
    outcome = attack(code, calls=[("reset", (0,))] + [("step", ("a",))] * 12)
    assert reason(outcome) == "timeout" and "wall budget" in outcome.detail


def test_cpu_limit_ends_a_busy_child():
    """RLIMIT_CPU counts the whole life of the instance: 1 s of CPU, even with a generous wall-clock deadline."""
    outcome = attack(env(reset="while True: pass"), call_timeout=30.0, cpu_seconds=1)
    assert reason(outcome) == "timeout" and "CPU time limit" in outcome.detail   # not the 30 s deadline


def test_infinite_loop_in_module_level_code_times_out():
    assert reason(attack("while True:\n    pass\nclass AttackEnv: pass\n")) == "timeout"


# --- memory and crashes -----------------------------------------------------------------------------------------

def test_memory_bomb():
    before = rss_mb()
    outcome = attack(env(reset="hog = []\nwhile True: hog.append(bytearray(50 << 20))"), memory_mb=300)
    assert reason(outcome) == "memory" and rss_mb() - before < 50


def test_memory_bomb_after_trying_to_raise_the_limits_is_forbidden():
    code = env(reset='''
        import resource
        try:
            resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        except Exception:
            pass
        hog = bytearray(2 << 30)''')
    assert reason(attack(code, memory_mb=300)) == "forbidden"


def test_deep_recursion_to_a_segfault_is_a_crash():
    """The recursion limit lifted, a deeply nested repr overflows the C stack: SIGSEGV -> 'crash'."""
    code = env(reset='''
        import sys
        sys.setrecursionlimit(10 ** 7)
        nested = []
        for _ in range(3 * 10 ** 5):
            nested = [nested]
        return repr(nested)''')
    outcome = attack(code, call_timeout=5.0)
    assert reason(outcome) == "crash" and "Segmentation fault" in outcome.detail


def test_os_exit_is_a_crash():
    outcome = attack(env(reset="import os\nos._exit(3)"))
    assert reason(outcome) == "crash"


def test_huge_observation_is_too_large_and_never_held_by_the_caller():
    before = rss_mb()
    outcome = attack(env(reset="return 'x' * (300 << 20), {}"), memory_mb=1024, call_timeout=5.0)
    assert reason(outcome) == "too_large" and rss_mb() - before < 50


def test_huge_observation_made_of_many_small_pieces_is_too_large():
    outcome = attack(env(reset="return ['ab'] * (10 << 20), {}"), memory_mb=1024)
    assert reason(outcome) == "too_large"


def test_self_referencing_observation_is_not_serializable():
    outcome = attack(env(reset="obs = []\nobs.append(obs)\nreturn obs, {}"))
    assert reason(outcome) == "not_serializable"


def test_an_object_in_the_return_value_is_not_serializable():
    outcome = attack(env(reset="return object(), {}"))
    assert reason(outcome) == "not_serializable" and "object" in outcome.detail


def test_nan_and_inf_rewards_round_trip():
    outcome = attack(env(step="return 'obs', float('nan'), False, False, {'r': float('-inf')}"),
                     [("reset", ()), ("step", ("x",))])
    assert outcome[1] != outcome[1] and outcome[4] == {"r": float("-inf")}


def test_file_size_limit():
    """A write past RLIMIT_FSIZE fails inside the env (an 'error'), it does not kill the child."""
    code = env(reset="open('big.bin', 'wb').write(b'x' * (3 << 20))", step="return 'alive'")
    with EnvProcess(code, {}, Limits(call_timeout=TIMEOUT)) as victim:
        with pytest.raises(SandboxError) as err:
            victim.call("reset")
        assert err.value.reason == "error" and "File too large" in err.value.detail
        assert victim.call("step", "x") == "alive"
    assert leftovers() == []


# --- processes ----------------------------------------------------------------------------------------------------

def test_fork_bomb_is_forbidden():
    assert reason(attack(env(reset="import os\nwhile True:\n    os.fork()"))) == "forbidden"


def test_double_fork_setsid_daemon_is_forbidden():
    code = env(reset='''
        import os
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                import time
                time.sleep(1000)''')
    assert reason(attack(code)) == "forbidden"


@needs("namespaces")
def test_double_fork_setsid_daemon_past_the_audit_hook(hook_defeated, filter_defeated):
    """The daemon escapes the process group but not the PID namespace: it dies when the environment is closed.
    (The syscall filter, defeated here too, would refuse the fork itself.)"""
    marker = "sleep_marker_" + secrets.token_hex(4)
    code = env(reset=f'''
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:   # note: /bin/sleep is not in bwrap's view, the interpreter is
                os.execv(sys.executable, [sys.executable, "-S", "-c", "import time; time.sleep(1000)", "{marker}"])
            os._exit(0)
        time.sleep(0.3)
        return "spawned", {{}}''')
    assert attack(code, marker=marker)[0] == "spawned"   # attack() checked that the daemon is gone


def test_subprocess_run_is_forbidden():
    code = env(reset="import subprocess\nreturn subprocess.run(['id'], capture_output=True).stdout.decode(), {}")
    assert reason(attack(code)) == "forbidden"


def test_os_system_is_forbidden_and_runs_nothing():
    assert reason(attack(env(reset="import os\nos.system('touch /tmp/spade_pwned')"))) == "forbidden"
    assert not os.path.exists("/tmp/spade_pwned")


def test_os_posix_spawn_is_forbidden():
    code = env(reset="import os\nos.posix_spawn('/bin/true', ['true'], {})")
    assert reason(attack(code)) == "forbidden"


def test_kill_the_parent():
    outcome = attack(env(reset="import os\nos.kill(os.getppid() or 1, 9)\nos.kill(1, 9)"))
    assert reason(outcome) == "forbidden"   # and this process is still running this line


def test_killing_the_process_group_is_forbidden():
    assert reason(attack(env(reset="import os\nos.killpg(0, 9)"))) == "forbidden"


@needs("namespaces")
def test_signal_the_trainer_past_the_audit_hook(hook_defeated):
    """This process's pid means nothing inside the child's PID namespace: the signal never arrives here."""
    import signal
    received = []
    previous = signal.signal(signal.SIGUSR2, lambda *a: received.append(a))
    try:
        code = env(reset=f"import os\ntry:\n    os.kill({os.getpid()}, 12)\nexcept OSError as e:\n"
                         f"    return e.errno, {{}}\nreturn 'sent', {{}}")
        attack(code)
        time.sleep(0.1)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert received == []


def test_posixsubprocess_loaded_by_hand_is_forbidden():
    """Native modules load through an audited import event; a disguised name does not hide the module."""
    code = env(prelude=LOAD_BY_HAND, reset="load_by_hand('x._posixsubprocess', '_posixsubprocess')")
    assert reason(attack(code)) == "forbidden"


def test_native_module_from_the_private_directory_is_forbidden():
    """A shared object written by the env (or to a memfd) is not loaded: only the stdlib's extensions are."""
    code = env(prelude=LOAD_BY_HAND, reset='''
        open("evil.so", "wb").write(b"\\x7fELF")
        path = os.path.abspath("evil.so")
        _imp.create_dynamic(machinery.ModuleSpec("evil", machinery.ExtensionFileLoader("evil", path), origin=path))''')
    assert reason(attack(code)) == "forbidden"


def test_native_module_from_a_memfd_is_forbidden():
    code = env(prelude=LOAD_BY_HAND, reset='''
        fd = os.memfd_create("evil")
        os.write(fd, b"\\x7fELF")
        path = f"/proc/self/fd/{fd}"
        _imp.create_dynamic(machinery.ModuleSpec("evil", machinery.ExtensionFileLoader("evil", path), origin=path))''')
    assert reason(attack(code)) == "forbidden"


SITE_EXTENSIONS = [os.path.join(d, f) for d in isolation._site_dirs(os.path.realpath(sys.base_prefix))
                   for f in sorted(os.listdir(d)) if f.endswith(".so")]


@pytest.mark.skipif(not SITE_EXTENSIONS, reason="no native extension in this interpreter's site-packages")
def test_native_module_from_site_packages_is_forbidden():
    """Only the standard library's own extensions (lib-dynload) load: site-packages lies inside the standard
    library's folder, and an extension there (_cffi_backend, say) would call libc past every rule."""
    path = SITE_EXTENSIONS[0]
    code = env(prelude=LOAD_BY_HAND, reset=f'''
        spec = machinery.ModuleSpec("ext", machinery.ExtensionFileLoader("ext", {path!r}), origin={path!r})
        _imp.create_dynamic(spec)''')
    assert reason(attack(code)) == "forbidden"


@needs("minimal_filesystem")
def test_site_packages_is_not_in_the_view_past_the_audit_hook(hook_defeated):
    folders = isolation._site_dirs(os.path.realpath(sys.base_prefix))
    code = env(reset=f"import os\nreturn [os.listdir(d) for d in {folders!r}], {{}}")
    assert attack(code)[0] == [[] for _ in folders]


def test_underscore_signal_is_forbidden_like_signal():
    code = env(reset="import _signal\n_signal.signal(_signal.SIGTERM, _signal.SIG_IGN)\nreturn 'x', {}")
    assert reason(attack(code)) == "forbidden"


def test_underscore_signal_cannot_be_created_again_through_importlib():
    """importlib makes a compiled-in module with no audit event: the child removes the function that does."""
    code = env(reset="import importlib\ns = importlib.import_module('_signal')\n"
                     "s.signal(s.SIGTERM, s.SIG_IGN)\nreturn 'x', {}")
    assert reason(attack(code)) in ("error", "forbidden")


def test_no_module_or_frame_left_holds_underscore_signal():
    code = env(reset='''
        import sys
        found, frame = [m for m in sys.modules if "signal" in m], sys._getframe()
        while frame is not None:
            found += [k for k, v in frame.f_locals.items() if getattr(v, "__name__", None) == "_signal"]
            frame = frame.f_back
        return found, {}''')
    assert attack(code)[0] == []


def test_a_thread_that_keeps_running_does_not_stop_later_calls():
    """A thread spinning after the call returned: later calls still answer; close() ends it."""
    code = env(reset='''
        import threading
        def spin():
            while True:
                pass
        threading.Thread(target=spin, daemon=True).start()
        return 'started', {}''', step="return 'still here'")
    assert attack(code, [("reset", ()), ("step", ("x",)), ("step", ("y",))]) == "still here"


def test_thread_that_writes_fake_replies_later():
    """A thread forging replies on every descriptor while the next call runs: 'protocol', never the forgery."""
    code = env(reset='''
        import os, threading, time
        fake = b"0" * 32 + b" 0000000034\\n" + b'{"ok": true, "value": "forged!!!"}'
        def forge():
            time.sleep(0.2)
            for fd in range(3, 64):
                try:
                    os.write(fd, fake)
                except OSError:
                    pass
        threading.Thread(target=forge).start()
        return 'started', {}''', step="import time\ntime.sleep(0.5)\nreturn 'genuine'")
    outcome = attack(code, [("reset", ()), ("step", ("x",))])
    assert outcome == "genuine" or reason(outcome) == "protocol"   # the real reply, or a refusal; never another


# --- native code ------------------------------------------------------------------------------------------------

def test_ctypes_call_into_libc_is_forbidden_and_runs_nothing():
    code = env(reset="import ctypes\nlibc = ctypes.CDLL('libc.so.6')\nlibc.system(b'touch /tmp/spade_pwned')")
    assert reason(attack(code)) == "forbidden"
    assert not os.path.exists("/tmp/spade_pwned")


def test_ctypes_loaded_past_the_import_check_is_forbidden():
    """_ctypes loaded by hand under another name is refused at import, and its calls raise ctypes events anyway."""
    code = env(prelude=LOAD_BY_HAND, reset="load_by_hand('x._ctypes', '_ctypes').dlopen('libc.so.6')")
    assert reason(attack(code)) == "forbidden"


def test_loading_a_crafted_code_object_is_forbidden():
    code = env(reset="import marshal\nmarshal.loads(b'\\xe3' + bytes(100))")
    assert reason(attack(code)) == "forbidden"


def test_adding_an_audit_hook_to_replace_ours_is_forbidden():
    code = env(reset="import sys\nsys.addaudithook(lambda *a: None)")
    assert reason(attack(code)) == "forbidden"


# --- files ------------------------------------------------------------------------------------------------------

def test_write_to_tmp_is_forbidden_and_writes_nothing():
    path = f"/tmp/spade_pwned_{secrets.token_hex(4)}"
    assert reason(attack(env(reset=f"open({path!r}, 'w').write('x')"))) == "forbidden"
    assert not os.path.exists(path)


def test_write_to_the_home_directory_is_forbidden_and_writes_nothing():
    path = os.path.join(os.path.expanduser("~"), f"spade_pwned_{secrets.token_hex(4)}")
    assert reason(attack(env(reset=f"open({path!r}, 'w').write('x')"))) == "forbidden"
    assert not os.path.exists(path)


def test_refusal_is_sticky_even_when_caught():
    path = f"/tmp/spade_pwned_{secrets.token_hex(4)}"
    code = env(reset=f"try:\n    open({path!r}, 'w')\nexcept Exception:\n    pass\nreturn 'fine', {{}}")
    assert reason(attack(code)) == "forbidden" and not os.path.exists(path)


MKDIRS = '''
    n = 0
    try:
        while n < 5000:
            os.mkdir(f"d{n}")
            n += 1
    except OSError as exc:
        return [n, exc.errno], {}
    return [n, 0], {}'''


def test_making_hundreds_of_folders_is_forbidden():
    """Folders count against the hook's cap on files written (each costs an inode of kernel memory)."""
    assert reason(attack(env(prelude="import os", reset=MKDIRS))) == "forbidden"


@needs("kernel_memory")
def test_the_private_tmpfs_runs_out_of_inodes_past_the_audit_hook(hook_defeated):
    """One environment once held 627 MB of kernel slab in ~500k empty folders, beyond its 1 GB RLIMIT_AS."""
    made, error = attack(env(prelude="import os", reset=MKDIRS))[0]
    assert made < isolation._TMPFS_INODES and error == errno.ENOSPC


@needs("read_only_filesystem")
def test_write_outside_past_the_audit_hook(hook_defeated):
    """Without the hook the child can still write nowhere: / and /dev/shm are read-only, its tmpfs is private."""
    paths = [f"/tmp/spade_pwned_{secrets.token_hex(4)}", f"/dev/shm/spade_pwned_{secrets.token_hex(4)}",
             os.path.join(os.path.expanduser("~"), f"spade_pwned_{secrets.token_hex(4)}"),
             os.path.join(os.path.dirname(os.path.abspath(__file__)), f"spade_pwned_{secrets.token_hex(4)}")]
    code = env(reset=f'''
        errors = []
        for path in {paths!r}:
            try:
                open(path, "w").write("x")
                errors.append(0)
            except OSError as e:
                errors.append(e.errno)
        return errors, {{}}''')
    outcome = attack(code)
    assert 0 not in outcome[0] and not any(os.path.exists(p) for p in paths)


def test_opening_a_descriptor_by_number_is_forbidden():
    assert reason(attack(env(reset="open(5, 'wb', closefd=False).write(b'x')"))) == "forbidden"


def test_symlink_out_of_the_sandbox_is_forbidden():
    assert reason(attack(env(reset="import os\nos.symlink('/etc', 'etc')"))) == "forbidden"


# --- secrets ------------------------------------------------------------------------------------------------------

def test_read_parent_environment_variables():
    outcome = attack(env(reset="import os\nreturn dict(os.environ), {}"))
    assert "SPADE_HOSTILE_SECRET" not in outcome[0]


def test_reading_the_parents_proc_environ_is_forbidden():
    code = env(reset="import os\nreturn open(f'/proc/{os.getppid() or 1}/environ').read(), {}")
    assert reason(attack(code)) == "forbidden"


@needs("namespaces")
def test_read_every_environ_in_proc_past_the_audit_hook(hook_defeated):
    """Without the hook the child sees only its own PID namespace in /proc: no trainer, no secret."""
    code = env(reset='''
        import os
        seen = {}
        for pid in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else []):
            try:
                seen[pid] = open(f"/proc/{pid}/environ", "rb").read().decode()
            except OSError as e:
                seen[pid] = e.errno
        return seen, {}''')
    outcome = attack(code)   # attack() checks that SECRET appears nowhere in it
    assert set(outcome[0]) <= {"1", "2"}   # the interpreter, and bwrap's init as pid 1 where bwrap launches


# --- network ------------------------------------------------------------------------------------------------------

def test_network_connection_to_localhost_is_forbidden(listener):
    port = listener.getsockname()[1]
    code = env(reset=f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=0.5)")
    assert reason(attack(code)) == "forbidden"


@needs("namespaces")
def test_network_connection_past_the_audit_hook(listener, hook_defeated):
    port = listener.getsockname()[1]
    code = env(reset=f'''
        import socket
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=0.5)
        except OSError as e:
            return e.errno, {{}}
        return "CONNECTED", {{}}''')
    assert attack(code)[0] != "CONNECTED"


@needs("unprivileged_user")
def test_memory_bomb_after_raising_the_limits_past_the_audit_hook(hook_defeated):
    code = env(reset='''
        import resource
        try:
            resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        except (ValueError, OSError):
            pass
        hog = bytearray(2 << 30)''')
    assert reason(attack(code, memory_mb=300)) == "memory"


# --- output and protocol ----------------------------------------------------------------------------------------

def test_stdout_and_stderr_floods_do_not_block_the_reply():
    code = env(reset='''
        import sys
        line = "x" * 65536
        for _ in range(800):
            print(line)
            print(line, file=sys.stderr)
        return 'done', {}''')
    assert attack(code)[0] == "done"


def test_fake_protocol_messages_on_every_descriptor():
    """Well-formed frames with a guessed nonce written to descriptors 0..63 are never accepted as the reply."""
    code = env(reset='''
        import os
        fake = b"0" * 32 + b" 0000000034\\n" + b'{"ok": true, "value": "forged!!!"}'
        for fd in range(64):
            try:
                os.write(fd, fake)
            except OSError:
                pass
        return 'genuine', {}''')
    outcome = attack(code)
    assert reason(outcome) == "protocol"


def test_fake_message_on_stdout_is_ignored():
    code = env(reset='''
        import os
        os.write(1, b"0" * 32 + b" 0000000034\\n" + b'{"ok": true, "value": "forged!!!"}')
        print('{"ok": true, "value": "forged!!!"}')
        return 'genuine', {}''')
    assert attack(code) == ["genuine", {}]


def test_closing_the_protocol_descriptors_is_a_crash():
    code = env(reset="import os\nfor fd in range(3, 64):\n    try:\n        os.close(fd)\n    except OSError:\n"
                     "        pass\nreturn 'x', {}")
    assert reason(attack(code)) == "crash"


def test_flood_of_bytes_on_the_reply_pipe_fails_the_call():
    code = env(reset='''
        import os
        junk = b"9" * 65536
        for fd in range(3, 64):
            try:
                for _ in range(100):
                    os.write(fd, junk)
            except OSError:
                pass''')
    assert reason(attack(code)) in ("protocol", "timeout")   # timeout: it blocked on a full pipe first


# --- one class of attack per section; each test is named after the property it proves ------------------------------
# Class 1-2: the caller never crashes on a reply. The child's encoder can be swapped by env code (json.dumps
# builds its encoder from json.JSONEncoder, looked up at each call), so these forge replies through it.

def forged_reply(text: str) -> str:
    """Prelude making every reply the child writes the literal JSON text (a swapped encoder)."""
    return f'''
import json
class Forged(json.JSONEncoder):
    def encode(self, obj):
        return {text!r}
json._default_encoder = Forged()
'''


def test_overflowing_int_reward_fails_the_call_not_the_caller():
    """A reward with 400 digits passes JSON and float() would raise: validate rejects it as reward_range,
    a scripted play ends with return -1, neither raises."""
    import cli
    import envs
    code = env(step="return 'obs', 10 ** 400, True, False, {}")
    verdict = envs.validate(code, Limits(call_timeout=2.0))
    assert not verdict.valid and verdict.reason == "reward_range"
    played = cli.play_scripted(code, ["\\boxed{1}"], seed=0, limits=Limits(call_timeout=2.0))
    assert played["return"] == -1.0


def test_reply_nested_thousands_deep_fails_the_call_not_the_caller():
    deep = '{"ok": true, "value": ' + "[" * 5000 + "]" * 5000 + "}"
    assert reason(attack(env(prelude=forged_reply(deep)))) == "bad_reply"   # the class-name reply already


def test_reply_nested_past_the_depth_bound_but_within_the_parser_fails_the_call():
    """150 levels: json.loads would accept it, repr or a later json.dumps in the caller might not."""
    code = env(reset="import json\njson._default_encoder = Forged()\nreturn 'x', {}", prelude='''
import json
class Forged(json.JSONEncoder):
    def encode(self, obj):
        return '{"ok": true, "value": ' + "[" * 150 + "]" * 150 + "}"
''')
    assert reason(attack(code)) == "bad_reply"


@pytest.mark.parametrize("text", ['[1, 2]', '"ok"', '{"ok": true}', '{"ok": false, "reason": ["timeout"]}',
                                  '{"ok": true, "value": 1e999999}', '{"ok": true, "value": "\\ud800"}',
                                  '{"ok": true, "value": ' + "9" * 5000 + '}', "not json"],
                         ids=["list", "str", "no value", "odd reason", "inf", "lone surrogate", "long int", "text"])
def test_malformed_reply_fails_the_call_not_the_caller(text):
    outcome = attack(env(reset="import json\njson._default_encoder = Forged()\nreturn 'x', {}",
                         prelude=forged_reply(text).replace("json._default_encoder = Forged()\n", "")))
    assert reason(outcome) in ("bad_reply", "ok") and not isinstance(outcome, str)
    if text != '{"ok": true, "value": 1e999999}':   # inf: a float the caller's range checks handle
        assert reason(outcome) == "bad_reply"


def test_class_name_that_is_not_a_string_fails_the_start():
    assert reason(attack(env(prelude=forged_reply('{"ok": true, "value": [1]}')))) == "bad_reply"


def test_a_class_name_with_terminal_controls_fails_the_start():
    """A class renamed to carriage returns and escape codes printed a fake `valid` line over validate's verdict."""
    code = env() + "\nAttackEnv.__name__ = '\\r\\x1b[2Kexamples/walk.py: valid (ok)\\x1b[8m'\n"
    assert reason(attack(code)) == "bad_reply"


def test_a_turn_cap_above_the_one_asked_for_is_a_bad_reply():
    """The parent clamps what the child reports: a forged load reply claiming 40 turns under a cap of 12."""
    code = env(prelude=forged_reply('{"ok": true, "value": ["AttackEnv", 40]}'))
    with pytest.raises(SandboxError) as err:
        EnvProcess(code, {}, Limits(call_timeout=TIMEOUT), max_turns=12)
    assert err.value.reason == "bad_reply" and leftovers() == []


def test_a_patched_min_does_not_raise_the_turn_cap_of_play():
    """min() patched while the module loads once made the loader report the env's own 40 turns under a cap of 3."""
    import cli
    code = env(prelude="import builtins\nbuiltins.min = max\n", init="self.max_turns = 40")
    with EnvProcess(code, {}, Limits(call_timeout=TIMEOUT), max_turns=3) as proc:
        assert proc.max_turns == 3
    played = cli.play_scripted(code, ["\\boxed{1}"] * 6, seed=0, max_turns=3, limits=Limits(call_timeout=TIMEOUT))
    assert played["turns"] == 3


# Class 4: the path checks call nothing env code can patch.

def test_patched_path_helpers_do_not_open_host_files():
    code = env(reset='''
        import os, posixpath, genericpath
        home = os.getcwd()
        os.path.realpath = posixpath.realpath = lambda p, **k: home + "/x"
        posixpath.islink = genericpath.isdir = lambda p: False
        os.fspath = os.fsdecode = lambda p: home + "/x"
        return open("/etc/passwd").read(), {}''')
    assert reason(attack(code)) == "forbidden"


def test_patched_builtins_do_not_switch_the_hook_off():
    code = env(reset='''
        import builtins
        builtins.any = builtins.all = lambda *a: False
        builtins.type = lambda *a: str
        builtins.isinstance = lambda *a: True
        import socket
        return "imported", {}''')
    assert reason(attack(code)) == "forbidden"


# Class 5: module names are compared as the import system reads them.

def test_extension_under_a_dashed_name_is_still_posixsubprocess():
    """'-' in the last part of a name is read as '_' for the init function: x.-posixsubprocess is the real one."""
    code = env(prelude=LOAD_BY_HAND, reset="return repr(load_by_hand('x.-posixsubprocess', '_posixsubprocess')), {}")
    assert reason(attack(code)) == "forbidden"


def test_extension_file_is_judged_by_its_own_name():
    code = env(prelude=LOAD_BY_HAND, reset="return repr(load_by_hand('harmless', '_posixsubprocess')), {}")
    assert reason(attack(code)) == "forbidden"


# Class 6: no sub-interpreter, which would start without the hook.

def test_sub_interpreter_cannot_be_created():
    code = env(prelude=LOAD_BY_HAND, reset='''
        subinterpreters = load_by_hand('x.-xxsubinterpreters', '_xxsubinterpreters')
        return subinterpreters.create(), {}''')
    assert reason(attack(code)) == "forbidden"


# Class 7: frames reach nothing that switches the hook off, and a refusal cannot be caught.

def test_frame_walk_cannot_switch_the_hook_off():
    """Empty every list, set and closure cell reachable from any frame, then try a refused open."""
    code = env(reset='''
        import sys
        frame, cleared = sys._getframe(), 0
        while frame is not None:
            for value in list(frame.f_locals.values()) + list(frame.f_globals.values()):
                for cell in getattr(value, "__closure__", None) or ():
                    try:
                        cell.cell_contents = ()
                        cleared += 1
                    except Exception:
                        pass
                if isinstance(value, (list, set)):
                    try:
                        value.clear()
                    except Exception:
                        pass
            frame = frame.f_back
        return open("/etc/hostname").read(), {}''')
    assert reason(attack(code)) == "forbidden"


def test_refusal_cannot_be_caught_and_the_call_validated():
    code = env(reset='''
        try:
            __import__("socket")
        except BaseException:
            pass
        return "validated", {}''')
    outcome = attack(code)
    assert reason(outcome) == "forbidden" and "socket" in outcome.detail


# Class 8: the filesystem view holds only the libraries, the interpreter and the private directory.

@needs("minimal_filesystem")
def test_host_tmp_home_and_proc_are_not_in_the_view_past_the_audit_hook(hook_defeated, tmp_path):
    planted = f"/tmp/spade_planted_{secrets.token_hex(4)}"
    with open(planted, "w") as f:
        f.write(SECRET)
    try:
        code = env(reset=f'''
            import os
            seen = {{"root": sorted(os.listdir("/")), "proc": os.path.exists("/proc")}}
            for path in ({planted!r}, "/etc/passwd", "/work", "/home", "/root/.bashrc", {str(tmp_path)!r}):
                try:
                    seen[path] = open(path).read()[:100] if os.path.isfile(path) else os.listdir(path)
                except OSError as e:
                    seen[path] = e.errno
            return seen, {{}}''')
        seen = attack(code)[0]   # attack() checks that SECRET appears nowhere in the outcome
    finally:
        os.remove(planted)
    assert set(seen["root"]) <= {"usr", "lib", "lib64", "lib32", "tmp", "proc", "dev", "root", "home", "opt"}
    assert seen["proc"] is False   # no /proc at all: no other process, no host-wide counter
    assert all(isinstance(seen[p], int) for p in (planted, "/etc/passwd", "/work", str(tmp_path)))


# Class 9: no process, and a bounded number of threads.

SYSCALLS = '''
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)

def refused(number, *args):
    """errno of a raw syscall (0 = it ran)."""
    result = libc.syscall(number, *args)
    return ctypes.get_errno() if result == -1 else 0
'''


@needs("syscall_filter")
def test_kernel_refuses_processes_sockets_and_namespaces_past_the_audit_hook(hook_defeated):
    """x86-64 numbers: 57 fork, 58 vfork, 59 execve, 41 socket, 101 ptrace, 165 mount, 272 unshare, 250 keyctl,
    321 bpf, 298 perf_event_open, 425 io_uring_setup, 323 userfaultfd; clone3 (435) answers ENOSYS."""
    import platform
    if platform.machine() != "x86_64":
        pytest.skip("syscall numbers below are x86-64's")
    code = env(prelude=SYSCALLS, reset='''
        out = {name: refused(number) for name, number in (("fork", 57), ("vfork", 58), ("socket", 41),
               ("ptrace", 101), ("mount", 165), ("keyctl", 250), ("bpf", 321), ("perf_event_open", 298),
               ("io_uring_setup", 425), ("userfaultfd", 323), ("clone3", 435))}
        out["unshare"] = refused(272, 0x10000000)   # CLONE_NEWUSER
        out["execve"] = refused(59, b"/usr/bin/true", None, None)
        out["clone_process"] = refused(56, 17, 0, 0, 0, 0)   # SIGCHLD: a fork through clone
        return out, {}''')
    out = attack(code)[0]
    assert out.pop("clone3") == errno.ENOSYS and set(out.values()) == {errno.EPERM}, out


def test_os_lockf_is_forbidden():
    code = env(reset="import os\nos.lockf(os.open(os.__file__, os.O_RDONLY), os.F_TEST, 0)\nreturn 'x', {}")
    assert reason(attack(code)) == "forbidden"


@needs("syscall_filter")
def test_kernel_refuses_file_locks_leases_and_inotify_past_the_audit_hook(hook_defeated):
    """x86-64 numbers: 73 flock, 72 fcntl (5/6/7 F_GETLK/F_SETLK/F_SETLKW, 36/37/38 their OFD forms, 1024
    F_SETLEASE, 1026 F_NOTIFY), 294 inotify_init1: each a way to signal another child through a shared file."""
    import platform
    if platform.machine() != "x86_64":
        pytest.skip("syscall numbers below are x86-64's")
    code = env(prelude=SYSCALLS, reset='''
        fd = os.open(os.__file__, os.O_RDONLY)   # a read-only library file every child shares
        lock = ctypes.create_string_buffer(32)   # struct flock: F_RDLCK over the whole file
        out = {"flock": refused(73, fd, 1 | 4), "inotify_init1": refused(294, 0)}
        out.update({f"fcntl_{cmd}": refused(72, fd, cmd, lock) for cmd in (5, 6, 7, 36, 37, 38, 1024, 1026)})
        # the kernel reads cmd as 32 bits: the same commands with high bits set must be refused too
        out.update({f"fcntl_{cmd}_high": refused(72, fd, ctypes.c_long(cmd | 1 << 32), lock)
                    for cmd in (5, 6, 7, 36, 37, 38, 1024, 1026)})
        return out, {}''')
    out = attack(code)[0]
    assert set(out.values()) == {errno.EPERM}, out


@needs("syscall_filter")
def test_no_lock_channel_between_two_live_environments_past_the_audit_hook(hook_defeated):
    """A holds an exclusive flock on a shared library file; B, running at the same time, cannot see it."""
    code = env(prelude=SYSCALLS, init="self.fd = os.open(os.__file__, os.O_RDONLY)", reset='''
        return refused(73, self.fd, 2 | 4), {}   # LOCK_EX | LOCK_NB: EWOULDBLOCK if the other holds it''')
    limits = Limits(call_timeout=TIMEOUT)
    with EnvProcess(code, {}, limits) as a, EnvProcess(code, {}, limits) as b:
        first, second = a.call("reset", 0)[0], b.call("reset", 0)[0]
    assert first == second == errno.EPERM, (first, second)


@needs("syscall_filter")
def test_threads_still_work_under_the_filter_past_the_audit_hook(hook_defeated):
    code = env(reset='''
        import threading
        done = []
        workers = [threading.Thread(target=done.append, args=(i,)) for i in range(4)]
        for w in workers: w.start()
        for w in workers: w.join()
        return sorted(done), {}''')
    assert attack(code)[0] == [0, 1, 2, 3]


@needs("process_limit")
def test_threads_are_capped_per_environment_past_the_audit_hook(hook_defeated):
    """RLIMIT_NPROC of the environment's own uid: a thread bomb stops at Limits.threads, in every instance at
    once (the count is not shared with the trainer or the other environments)."""
    code = env(reset='''
        import threading, time
        threading.stack_size(1 << 16)
        started = 0
        try:
            for _ in range(2000):
                threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
                started += 1
        except RuntimeError:
            pass
        return started, {}''')
    limits = Limits(call_timeout=5.0, threads=8)
    envs = [EnvProcess(code, {}, limits) for _ in range(3)]
    try:
        counts = [out[0] for out in sandbox.call_many(envs, "reset", [()] * 3)]
    finally:
        for e in envs:
            e.close()
    assert all(0 < n < 8 for n in counts), counts   # the main thread and the watchdog count too


# Class 10: the sandbox dies with its trainer.

def test_environment_outlives_the_thread_that_started_it():
    """A parent-death signal fires when the starting *thread* ends: environments opened from a thread pool
    (as spade_mini does) must keep running after the pool is gone."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as pool:
        envs = list(pool.map(lambda _: EnvProcess(env(), {}, Limits(call_timeout=TIMEOUT)), range(2)))
    time.sleep(0.2)
    try:
        assert [e.call("reset", 0) for e in envs] == [["ok", {}]] * 2
    finally:
        for e in envs:
            e.close()


TRAINER = '''
import sys, time
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, {repo!r})
import isolation, sandbox
# the environment has replaced the watchdog's descriptor (class 10): here the watchdog is simply not started
isolation._CHILD_SOURCE = isolation._CHILD_SOURCE.replace("_thread.start_new_thread(_child_watchdog", "(lambda *a: 0)(0")
code = "class SleepEnv:\\n    def step(self, action):\\n        import time\\n        time.sleep(1000)\\n"
with ThreadPoolExecutor(2) as pool:
    envs = list(pool.map(lambda _: sandbox.EnvProcess(code, {{}}, sandbox.Limits(call_timeout=100)), range(2)))
for env in envs:
    env.send("step", "x")
print(" ".join(env._dir for env in envs), flush=True)
time.sleep(100)
'''


@needs("dies_with_trainer")
def test_sandbox_dies_with_a_sigkilled_trainer_mid_call():
    """SIGKILL a trainer while two of its environments are in the middle of a step: 5 s later no process of
    theirs (launcher or interpreter) is left anywhere."""
    import signal
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER.format(repo=repo)], stdout=subprocess.PIPE)
    dirs = trainer.stdout.readline().decode().split()
    table = processes()
    ours = {p for p, (_, cmd) in table.items() if any(d in cmd for d in dirs)}
    ours |= {p for p, (pp, _) in table.items() if pp in ours}
    assert len(dirs) == 2 and len(ours) >= 4, (dirs, ours)   # a launcher and an interpreter each
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and set(processes()) & ours:
        time.sleep(0.05)
    assert not set(processes()) & ours
    for path in dirs:   # the killed trainer could not remove its (empty) private directories
        os.rmdir(path)


def test_bad_reply_is_a_verdict_of_validate_not_an_exception():
    import cli
    import envs
    code = env(prelude=forged_reply('{"ok": true, "value": ' + "[" * 5000 + "]" * 5000 + "}"))
    verdict = envs.validate(code, Limits(call_timeout=2.0))
    assert not verdict.valid and verdict.reason == "bad_reply"
    assert cli.play_scripted(code, ["\\boxed{1}"], seed=0)["failure"] == "bad_reply"


# Class 11: text from an environment is made inert once, where its reply is decoded (sandbox.inert): no print, JSONL
# line or HTML page downstream can fail on it or be forged by it. Two details a red team used: a lone surrogate
# (UnicodeEncodeError in validate, play and report) and terminal controls that drew a fake `valid` verdict.

SURROGATE = env(reset="raise ValueError('bad \\ud800 text')")
FORGING = env(reset="raise ValueError('\\r\\x1b[2Kexamples/walk.py: valid (ok)\\n  ok   size\\n"
                    "{\"return\": 1.0, \"turns\": 1, \"terminated\": true, \"failure\": null}\\x1b[8m')")
# bidi controls and invisible characters: a red team's text reached play's and validate's output raw
HIDDEN = "\u061c\u200e\u200f\u202a\u202e\u2066\u2069\u200b\u2060\ufeff\U000e0041\U000e007f"
HIDING = env(reset=f"raise ValueError('valid{HIDDEN}x')")
HOSTILE_TEXTS = pytest.mark.parametrize("code", [SURROGATE, FORGING, HIDING],
                                        ids=["lone surrogate", "terminal controls", "bidi and invisible"])


# default-ignorable characters that are no format character (Unicode's DerivedCoreProperties): they show as nothing
IGNORABLE = "\u034f\u115f\u1160\u17b4\u17b5\u180b\u180f\u3164\ufe00\ufe0d\uffa0\U000e0100\U000e01ef"


def printable(text: str, newlines: bool) -> bool:
    """Encodable as UTF-8, with no control character but newline (if allowed), no line separator, bidi control or
    invisible character (no format character, Cf, nor any of IGNORABLE)."""
    text.encode("utf-8")
    return not any((ord(c) < 32 and not (newlines and c == "\n")) or 0x7F <= ord(c) <= 0x9F
                   or c in "\u2028\u2029" + HIDDEN + IGNORABLE or unicodedata.category(c) == "Cf" for c in text)


def test_every_format_and_default_ignorable_character_is_shown_as_its_escape():
    """A red team hid `SECRET` between interlinear annotations (U+FFF9, U+FFFB) and a soft hyphen, and `rm -rf ~` in
    variation selectors inside a class name that showed as `SafeEnv`: inert had listed a few invisible characters
    by name. Each Cf character of this Python's Unicode and each default-ignorable one is escaped."""
    hidden = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cf" and not 0xD800 <= c <= 0xDFFF]
    assert len(hidden) > 150   # Unicode 14: 161
    kept = [c for c in hidden + list(IGNORABLE) if sandbox.inert(c) == c or not printable(sandbox.inert(c), False)]
    assert kept == [], [f"U+{ord(c):04X}" for c in kept]
    assert sandbox.inert("caf\u00e9 \u2764 na\u00efve") == "caf\u00e9 \u2764 na\u00efve"   # visible text stays
    # an emoji's presentation selectors pass: an answer `\boxed{❤️}` is replayed as solution() gave it (a review's)
    assert sandbox.inert("\\boxed{\u2764\ufe0f} \u263a\ufe0e") == "\\boxed{\u2764\ufe0f} \u263a\ufe0e"


@pytest.mark.parametrize("name,shown", [
    ("'HiddenEnv'", "ValueError: ok\\xad\\ufff9SECRET\\ufffb done"),
    ("'Safe' + ''.join(chr(0xE0100 + b) for b in b'rm -rf ~') + '\\u3164Env'",
     "rejected (bad_reply): load reply \"['Safe")], ids=["detail", "class name"])
def test_validate_shows_a_detail_or_a_class_name_that_hides_text_as_escapes(tmp_path, name, shown):
    """A class name whose variation selectors hide a command and Hangul filler a gap (an identifier to Python):
    escaped, it is no identifier, and the program is refused; a detail with hidden text shows it escaped."""
    path = tmp_path / "hidden.py"
    path.write_text("class HiddenEnv:\n    def __init__(self, max_turns=12):\n        self.max_turns = max_turns\n"
                    "    def reset(self, seed=None):\n        raise ValueError('ok\\u00ad\\ufff9SECRET\\ufffb done')\n"
                    f"HiddenEnv.__name__ = {name}\n")
    done = run_cli("validate", str(path), "--timeout", "2")
    out = done.stdout.decode("utf-8")
    assert done.returncode == 1 and printable(out, newlines=True), ascii(out)
    assert shown in out.splitlines()[0] and out.startswith(f"{path}: rejected ("), out
    assert "Safe" not in shown or "U000e0172" in out, out   # `r` in a variation selector, escaped


@HOSTILE_TEXTS
def test_a_failures_detail_is_one_inert_line(code):
    err = attack(code)
    assert reason(err) == "error" and printable(err.detail, newlines=False), repr(err.detail)
    shown = {SURROGATE: "\ufffd", FORGING: "\\r\\x1b[2Kexamples/walk.py",
             HIDING: "valid\\u061c\\u200e\\u200f\\u202a\\u202e\\u2066\\u2069\\u200b\\u2060\\ufeff\\U000e0041"}
    assert shown[code] in err.detail, err.detail


def test_an_observation_keeps_newlines_and_tabs_and_shows_every_other_control_as_its_escape():
    code = env(reset="return 'a\\tb\\nc\\r\\x1b[2K\\x9b\\u202e\\u2028', {'k\\x1b': ['v\\x07']}")
    assert attack(code) == ["a\tb\nc\\r\\x1b[2K\\x9b\\u202e\\u2028", {"k\\x1b": ["v\\x07"]}]


def test_an_observation_shows_bidi_controls_and_invisible_characters_as_their_escape():
    shown = attack(env(reset=f"return 'A{HIDDEN}B', {{'\u200b': 1}}"))
    assert shown == ["A\\u061c\\u200e\\u200f\\u202a\\u202e\\u2066\\u2069\\u200b\\u2060\\ufeff\\U000e0041\\U000e007fB",
                     {"\\u200b": 1}]


def test_play_prints_observations_with_bidi_controls_and_invisible_characters_as_escapes(tmp_path):
    path, moves = tmp_path / "hiding.py", tmp_path / "moves.txt"
    path.write_text(env(reset=f"return 'Pick a door{HIDDEN}', {{}}",
                        step=f"return 'you{HIDDEN}win', 1.0, True, False, {{}}"), encoding="utf-8")
    moves.write_text("1\n")
    done = run_cli("play", str(path), "--actions", str(moves), "--timeout", "2")
    out = done.stdout.decode("utf-8")
    assert done.returncode == 0 and printable(out, newlines=True), out
    assert out.count("\\u200e\\u200f") == 2 and out.count("\\U000e007f") == 2, out


def run_cli(*argv) -> subprocess.CompletedProcess:
    """spade-mini from this checkout, its output on a strict UTF-8 pipe (as a terminal's)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, os.path.join(root, "cli.py"), *argv], capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"})


@HOSTILE_TEXTS
def test_validate_prints_one_verdict_line_and_json_whatever_the_detail(code, tmp_path):
    import envs
    path = tmp_path / "hostile.py"
    path.write_text(code, encoding="utf-8", errors="surrogatepass")
    done = run_cli("validate", str(path), "--json", "--timeout", "2")
    out = done.stdout.decode("utf-8")
    assert done.returncode == 1 and b"Traceback" not in done.stderr, done.stderr.decode(errors="replace")
    lines = out.splitlines()
    assert printable(out, newlines=True) and len(lines) == 1 + len(envs.CHECKS) + 1, out
    assert re.match(rf"{re.escape(str(path))}: rejected \(reset_error\) class AttackEnv: reset\(\d+\): ", lines[0])
    assert json.loads(lines[-1])["reason"] == "reset_error"


@HOSTILE_TEXTS
def test_play_prints_one_failure_line_then_the_one_outcome_line(code, tmp_path):
    path, moves = tmp_path / "hostile.py", tmp_path / "moves.txt"
    path.write_text(code, encoding="utf-8", errors="surrogatepass")
    moves.write_text("1\n")
    done = run_cli("play", str(path), "--actions", str(moves), "--timeout", "2")
    out = done.stdout.decode("utf-8")
    assert done.returncode == 1 and b"Traceback" not in done.stderr, done.stderr.decode(errors="replace")
    lines = out.splitlines()
    assert printable(out, newlines=True) and len(lines) == 2, out
    assert lines[0].startswith("environment failed: error: ValueError: ")
    assert json.loads(lines[1]) == {"return": -1.0, "turns": 0, "terminated": False, "failure": "error"}


def test_a_skipped_files_name_reaches_the_terminal_inert(tmp_path, capsys):
    """The warning escaped the verdict's detail but printed the file's name raw: a name holding ESC and OSC set
    the terminal's colour and title."""
    import envs
    (tmp_path / "n\x1b[31mred\x1b]0;T\x07.py").write_text("class XEnv:\n    def __init__(self, **kw):\n"
                                                        "        raise RuntimeError('no')\n")
    (tmp_path / "walk.py").write_text(open(os.path.join(os.path.dirname(__file__), "..", "examples", "walk.py")).read())
    envs.load_folder(str(tmp_path), "--env-pool", Limits(call_timeout=2.0), 12)
    err = capsys.readouterr().err
    assert "skipping n\\x1b[31mred\\x1b]0;T\\x07.py (init_error" in err and not {"\x1b", "\x07"} & set(err), err


@HOSTILE_TEXTS
def test_an_env_pool_warning_is_one_inert_line(code, tmp_path, capsys):
    """train --env-pool (load_folder) prints why it skips a file: the verdict's detail."""
    import envs
    (tmp_path / "hostile.py").write_text(code, encoding="utf-8", errors="surrogatepass")
    (tmp_path / "walk.py").write_text(open(os.path.join(os.path.dirname(__file__), "..", "examples", "walk.py")).read())
    valid, rejected = envs.load_folder(str(tmp_path), "--env-pool", Limits(call_timeout=2.0), 12)
    assert [name for name, _ in valid] == ["walk"] and rejected == {"hostile": "reset_error"}
    err = capsys.readouterr().err
    assert printable(err, newlines=True) and len(err.splitlines()) == 1, err


@HOSTILE_TEXTS
def test_a_training_episode_logs_and_reports_the_failure_as_inert_text(code, tiny_agent, tmp_path):
    """What train does with an environment that fails at a training seed: the episode's transcript goes to
    samples.jsonl (runs.log_samples), and `spade-mini report` writes envs.html from it."""
    import cli
    import runs
    import spade_mini as sm
    model, tok = tiny_agent
    [ep] = sm.play(model, tok, [sm.EpisodeSpec(code, seed=7, hint=None, key=(0, 0, 0))], max_turns=2,
                   max_new_tokens=8, max_episode_tokens=32, temperature=1.0, top_p=1.0, top_k=0, seed=0,
                   limits=Limits(call_timeout=2.0))
    assert ep.failure == "error"
    run = tmp_path / "run"
    (run / "envs" / "step_00000").mkdir(parents=True)
    (run / "envs" / "step_00000" / "env_00.py").write_text(code, encoding="utf-8", errors="surrogatepass")
    (run / "config.json").write_text(json.dumps({"steps": 1}))
    runs.append_jsonl(run / "metrics.jsonl", {"config": {"steps": 1}})
    runs.append_jsonl(run / "samples.jsonl", dict(step=0, kind="episode", env_id="env_00", hinted=False, seed=7,
                                                  turns=ep.turns, failure=ep.failure, transcript=ep.transcript))
    assert cli.main(["report", str(run)]) == 0
    [logged] = runs.read_jsonl(run / "samples.jsonl")
    error = logged["transcript"][-1]["error"]
    assert printable(error, newlines=False) and error.startswith("error: ValueError: "), repr(error)
    page = (run / "report" / "envs.html").read_text(encoding="utf-8")
    assert "error: " + html.escape(error) in page and "\x1b" not in page and "\r" not in page


@pytest.fixture(scope="module")
def tiny_agent():
    import models
    cache = os.path.expanduser(os.environ.get("SPADE_MINI_CACHE", "~/.cache/spade-mini"))
    model, tok, _ = models.load_model("tiny-random", lora_r=4, lora_alpha=8, lora_dropout=0.0, quantize="none",
                                      gradient_checkpointing=False, cache_dir=cache, seed=0)
    return model, tok


# validate turns every contract failure into a verdict, in both settings: a reply of the wrong shape (a swapped
# encoder) at the probes, at a tool call and while solution() is replayed.

FORGED_TOOL_ENV = '''
import json
class Forged(json.JSONEncoder):
    def encode(self, obj):
        return {reply!r}

class CounterEnv:
    def __init__(self, max_turns=4):
        self.max_turns, self.planned = max_turns, False
        self.tools = {{"add": {{"description": "add one", "parameters": {{"type": "object", "properties": {{}}}}}}}}
    def reset(self, seed=None):
        self.n = 0
        return "call add twice, then answer 2", {{}}
    def tool_add(self):
        if {forge_when}:
            json._default_encoder = Forged()
        self.n += 1
        return str(self.n)
    def step(self, action):
        won = "<answer>2</answer>" in action and self.n == 2
        return ("right" if won else "wrong"), (1.0 if won else 0.0), won, False, {{}}
    def solution(self):
        self.planned = True
        return [{{"name": "add", "arguments": {{}}}}, {{"name": "add", "arguments": {{}}}}, "<answer>2</answer>"]
'''


@pytest.mark.parametrize("value", ["{\"a\": 1}", "1"], ids=["dict", "int"])
@pytest.mark.parametrize("forge_when", ["True", "self.planned"], ids=["at the probes", "at solution()"])
def test_a_forged_tool_reply_is_a_bad_reply_verdict(value, forge_when):
    import envs
    honest = envs.validate(FORGED_TOOL_ENV.format(reply="", forge_when="False"), Limits(call_timeout=2.0),
                           max_turns=4, setting="tool_use")
    assert honest.valid, honest
    code = FORGED_TOOL_ENV.format(reply='{"ok": true, "value": ' + value + "}", forge_when=forge_when)
    verdict = envs.validate(code, Limits(call_timeout=2.0), max_turns=4, setting="tool_use")
    assert not verdict.valid and verdict.reason == "bad_reply", verdict
    assert verdict.checks["reset_other"] is (forge_when == "self.planned")   # the probes passed, solution() not


@pytest.mark.parametrize("method", ["reset", "step", "solution"])
def test_a_forged_game_reply_is_a_verdict(method):
    import envs
    swap = "import json\njson._default_encoder = Forged()\n"
    bodies = {"reset": "return 'go', {}", "step": "return 'x', 0.0, False, False, {}"}
    code = env(prelude=forged_reply('{"ok": true, "value": {"a": 1}}').replace(swap.splitlines()[1] + "\n", ""),
               **{m: (swap if m == method else "") + body for m, body in bodies.items()})
    if method == "solution":
        code += "    def solution(self):\n        import json\n        json._default_encoder = Forged()\n" \
                "        return ['\\\\boxed{1}']\n"
    verdict = envs.validate(code, Limits(call_timeout=2.0))
    assert not verdict.valid or method == "solution", verdict
    # solution() installs the forged encoder in its own process, whose next reset then answers a dict: a verdict
    assert verdict.reason == {"reset": "reset_error", "step": "bad_step_type", "solution": "reset_error"}[method], verdict


# Class 12: no channel between live environments through the page cache of the files they share. A red team sent
# 16 bits every time: one environment dropped standard-library files from the cache (posix_fadvise DONTNEED), a
# concurrent one told cached from cold with preadv2(RWF_NOWAIT). getrusage's block-input count tells them apart too.

@needs("syscall_filter")
def test_kernel_refuses_to_drop_load_or_probe_the_page_cache_past_the_audit_hook(hook_defeated):
    """x86-64 numbers: 221 fadvise64, 187 readahead, 27 mincore, 451 cachestat, 98 getrusage, 206 io_setup,
    209 io_submit, 327/328 preadv2/pwritev2 with RWF_NOWAIT (8), 28 madvise MADV_COLD (20) / MADV_PAGEOUT (21);
    preadv2 without the flag and madvise MADV_DONTNEED (4) still run."""
    import platform
    if platform.machine() != "x86_64":
        pytest.skip("syscall numbers below are x86-64's")
    code = env(prelude=SYSCALLS, reset='''
        fd = os.open(os.__file__, os.O_RDONLY)   # a read-only library file every child shares
        page = ctypes.create_string_buffer(4096)
        iov = (ctypes.c_void_p * 2)(ctypes.addressof(page), 4096)   # struct iovec
        vec, buf = ctypes.create_string_buffer(8), ctypes.create_string_buffer(256)
        memory = ctypes.create_string_buffer(3 * 4096)
        area = ctypes.c_void_p(ctypes.addressof(memory) + 4095 & ~4095)   # a page of our own
        out = {"fadvise64": refused(221, fd, 0, 0, 4), "readahead": refused(187, fd, 0, 1 << 20),
               "mincore": refused(27, area, 4096, vec), "cachestat": refused(451, fd, buf, buf, 0),
               "getrusage": refused(98, 0, buf), "io_setup": refused(206, 8, buf), "io_submit": refused(209, 0, 0, 0),
               "preadv2_nowait": refused(327, fd, iov, 1, 0, 0, 8),
               "preadv2_nowait_high": refused(327, fd, iov, 1, 0, 0, ctypes.c_long(8 | 1 << 32)),
               "pwritev2_nowait": refused(328, fd, iov, 1, 0, 0, 8),
               "madvise_cold": refused(28, area, 4096, 20), "madvise_pageout": refused(28, area, 4096, 21)}
        allowed = {"preadv2": libc.syscall(327, fd, iov, 1, 0, 0, 0), "madvise_dontneed": refused(28, area, 4096, 4)}
        return [out, allowed], {}''')
    out, allowed = attack(code)[0]
    assert set(out.values()) == {errno.EPERM}, out
    assert allowed == {"preadv2": 4096, "madvise_dontneed": 0}, allowed


def test_no_page_cache_channel_between_two_live_environments():
    """A drops a shared file's pages as Python lets it (os.posix_fadvise); B, at the same time, asks whether they are
    cached (os.preadv with RWF_NOWAIT, resource.getrusage around a read): each is refused, with the hook on too."""
    code = env(init="import os\nself.fd = os.open(os.__file__, os.O_RDONLY)", reset='''
        import os, resource
        out = []
        for attempt in (lambda: os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED),
                        lambda: os.preadv(self.fd, [bytearray(4096)], 0, os.RWF_NOWAIT),
                        lambda: resource.getrusage(resource.RUSAGE_SELF)):
            try:
                attempt()
                out.append("ran")
            except OSError as err:
                out.append(err.errno)
        return out, {}''')
    limits = Limits(call_timeout=TIMEOUT)
    with EnvProcess(code, {}, limits) as sender, EnvProcess(code, {}, limits) as receiver:
        sender.send("reset", 0)
        receiver.send("reset", 0)
        first, second = sender.receive()[0], receiver.receive()[0]
    assert first == second == [errno.EPERM] * 3, (first, second)


def test_the_step_line_of_a_step_whose_designs_failed_with_hostile_text_is_one_inert_line(capsys):
    """train's step line names the designer's rejections by reason only (one of VERDICT_REASONS), never a detail."""
    from types import SimpleNamespace
    import envs
    import runs
    verdicts = [envs.validate(code, Limits(call_timeout=2.0)) for code in (SURROGATE, FORGING)]
    window = SimpleNamespace(attempts=[SimpleNamespace(verdict=v) for v in verdicts], skills=["Optimization"],
                             start=0, length=1, envs=[])
    runs.print_step(runs.step_metrics(0, window, [], True, False, {"loss/grad_norm": None, "perf/step_s": 1.0}))
    out = capsys.readouterr().out
    assert printable(out, newlines=True) and len(out.splitlines()) == 1, out
    assert "(2 reset_error)" in out


def test_a_tool_errors_output_is_shown_on_the_verdicts_one_line():
    """A tool's output keeps its newlines (the agent reads it); quoted in a verdict's detail it is one line."""
    import envs
    code = FORGED_TOOL_ENV.format(reply="", forge_when="False").replace(
        "self.n += 1", "raise ValueError('boom\\n  ok   solvable')")
    verdict = envs.validate(code, Limits(call_timeout=2.0), max_turns=4, setting="tool_use")
    assert verdict.reason == "tool_error" and "boom\\n  ok" in verdict.detail and "\n" not in verdict.detail, verdict


# Class 13: no memory outside the child's limits. A red team held 1,280 MB of System V shared memory (5 segments of
# 256 MB, filled and detached) while RLIMIT_AS was 1,024 MB: what an IPC namespace keeps counts against no limit.

def shmem_mb() -> float:
    """The host's shared memory (tmpfs, System V and POSIX shared memory, memfds), from /proc/meminfo."""
    with open("/proc/meminfo") as f:
        return int(next(line for line in f if line.startswith("Shmem:")).split()[1]) / 1024


# Each holds what it can through one mechanism and returns (errno of the refusal or 0, MB held).
OUTSIDE_THE_ADDRESS_SPACE = {
    "system_v_shared_memory": '''
        libc.shmat.restype = ctypes.c_void_p
        held = 0
        for _ in range(4):
            sid = libc.syscall(29, 0, 32 << 20, 0o1000 | 0o600)   # shmget(IPC_PRIVATE, 32 MB, IPC_CREAT)
            if sid < 0:
                return [ctypes.get_errno(), held], {}
            address = libc.shmat(sid, None, 0)
            ctypes.memset(address, 1, 32 << 20)
            libc.shmdt(ctypes.c_void_p(address))   # detached: the segment stays, outside RLIMIT_AS
            held += 32
        return [0, held], {}''',
    "system_v_message_queues": '''
        message = ctypes.create_string_buffer(8 + 8192)
        ctypes.c_long.from_buffer(message).value = 1   # mtype
        held = 0
        for _ in range(32):
            qid = libc.syscall(68, 0, 0o1000 | 0o600)   # msgget(IPC_PRIVATE, IPC_CREAT)
            if qid < 0:
                return [ctypes.get_errno(), held >> 20], {}
            while libc.syscall(69, qid, message, 8192, 0o4000) == 0:   # msgsnd(..., IPC_NOWAIT) until full
                held += 8192
        return [0, held >> 20], {}''',
    "system_v_semaphores": '''
        return [refused(64, 0, 250, 0o1000 | 0o600), 0], {}   # semget(IPC_PRIVATE, 250, IPC_CREAT)''',
    "posix_message_queues": '''
        return [refused(240, b"spade", os.O_CREAT | os.O_RDWR, 0o600, None), 0], {}   # mq_open''',
    "posix_shared_memory": '''
        held = 0
        try:
            for i in range(32):   # shm_open is an open() in /dev/shm
                fd = os.open(f"/dev/shm/spade{i}", os.O_CREAT | os.O_RDWR, 0o600)
                os.write(fd, bytes(1 << 20))
                os.close(fd)
                held += 1
        except OSError as err:
            return [err.errno, held], {}
        return [0, held], {}''',
}
REFUSED_AS = {"posix_shared_memory": (errno.EROFS, errno.EACCES, errno.ENOENT)}


@needs("syscall_filter")
@pytest.mark.parametrize("mechanism", sorted(OUTSIDE_THE_ADDRESS_SPACE))
def test_no_memory_outside_the_address_space_limit_past_the_audit_hook(hook_defeated, mechanism):
    """Refused by the kernel's layers (the filter: System V IPC, POSIX message queues; /dev read-only: POSIX shared
    memory); the host's shared memory does not grow while the child lives and is where it was once it is closed."""
    code = env(prelude=SYSCALLS, reset=OUTSIDE_THE_ADDRESS_SPACE[mechanism])
    before = shmem_mb()
    with EnvProcess(code, {}, Limits(call_timeout=10.0)) as child:
        refusal, held = child.call("reset", 0)[0]
        during = shmem_mb()
    after = shmem_mb()
    assert refusal in REFUSED_AS.get(mechanism, (errno.EPERM,)) and held == 0, (refusal, held)
    assert during - before < 16 and after - before < 16, (before, during, after)


@needs("minimal_filesystem")
def test_dev_and_dev_shm_are_mounted_read_only_whoever_runs_the_trainer(hook_defeated):
    """The POSIX shared-memory case above also holds as root without the remount, because there the child's
    uid owns nothing in /dev; as a plain user bwrap's /dev (and /dev/shm in it) is the child's own writable
    tmpfs. The mount flag itself is what must hold for both."""
    code = env(reset='''
        import os
        return [os.statvfs(path).f_flag & os.ST_RDONLY for path in ("/dev", "/dev/shm")], {}''')
    with EnvProcess(code, {}, Limits(call_timeout=10.0)) as child:
        flags = child.call("reset", 0)[0]
    assert flags == [os.ST_RDONLY, os.ST_RDONLY], flags


@needs("syscall_filter")
def test_memfds_and_the_private_tmpfs_hold_at_most_their_bounds_past_the_audit_hook(hook_defeated):
    """What the child may hold outside RLIMIT_AS, and binds: memfds, at most RLIMIT_NOFILE of RLIMIT_FSIZE each
    (open_files x file_size_mb), and its private tmpfs (4 x file_size_mb); all of it is back once it is closed."""
    code = env(prelude=SYSCALLS, reset='''
        fds, held = [], 0
        try:
            while True:
                fds.append(os.memfd_create("m"))
                os.write(fds[-1], bytes(1 << 20))
                held += 1
        except OSError:
            pass
        for fd in fds[len(fds) // 2:]:   # room for files in the tmpfs
            os.close(fd)
        files = 0
        try:
            while True:
                with open(f"f{files}", "wb") as f:
                    f.write(bytes(1 << 20))
                files += 1
        except OSError:
            pass
        return [held, files], {}''')
    limits = Limits(call_timeout=10.0, open_files=32, file_size_mb=1)
    before = shmem_mb()
    with EnvProcess(code, {}, limits) as child:
        memfds, files = child.call("reset", 0)[0]
        during = shmem_mb()
    after = shmem_mb()
    assert 0 < memfds <= 32 and 0 < files <= 4, (memfds, files)
    assert during - before < 32 / 2 + 4 + 16 and after - before < 16, (before, during, after)


# Class 14: no host-wide counter precise enough to carry a message between two live environments. A red team sent
# 14 of 16 bits through the host's free memory (64 MB steps, read from os.sysconf('SC_AVPHYS_PAGES'), hook on).

@needs("syscall_filter")
@needs("minimal_filesystem")
def test_free_memory_and_load_as_python_reads_them_are_not_the_hosts():
    """os.sysconf reads sysinfo(2), which the filter refuses (glibc then returns what its buffer held);
    os.getloadavg reads /proc/loadavg, which is not in the view."""
    code = env(reset='''
        import os
        out = {"free_pages": os.sysconf("SC_AVPHYS_PAGES")}
        try:
            out["load"] = os.getloadavg()
        except OSError as err:
            out["load"] = str(err)
        return out, {}''')
    out = attack(code)[0]
    host = os.sysconf("SC_AVPHYS_PAGES")
    assert not 0.5 * host < out["free_pages"] < 2 * host, (out, host)
    assert isinstance(out["load"], str), out


@needs("syscall_filter")
@needs("minimal_filesystem")
def test_no_host_wide_memory_or_load_counter_in_view_past_the_audit_hook(hook_defeated):
    """x86-64: 99 sysinfo (free memory, load, process count); no /proc (meminfo, loadavg, stat's CPU times,
    vmstat, pressure, the open-file count)."""
    import platform
    if platform.machine() != "x86_64":
        pytest.skip("syscall numbers below are x86-64's")
    code = env(prelude=SYSCALLS, reset='''
        out = {"sysinfo": refused(99, ctypes.create_string_buffer(128))}
        for path in ("/proc/meminfo", "/proc/loadavg", "/proc/stat", "/proc/vmstat", "/proc/pressure/memory",
                     "/proc/sys/fs/file-nr", "/proc/self/status"):
            try:
                out[path] = open(path).read()[:40]
            except OSError as err:
                out[path] = err.errno
        return out, {}''')
    out = attack(code)[0]
    assert out.pop("sysinfo") == errno.EPERM and set(out.values()) == {errno.ENOENT}, out


def test_the_load_channel_bench_runs_and_decodes(tmp_path):
    """bench/channel_bench.py, which measures what remains (the machine's load, timed: docs/sandbox.md), runs its
    two environments in the sandbox as play does and scores what the receiver's reply decodes to; its doctests
    (the entropy, the median decoder) hold. The capacity itself is the machine's, not asserted."""
    import doctest
    import importlib.util
    import random
    spec = importlib.util.spec_from_file_location(
        "channel_bench", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "channel_bench.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert doctest.testmod(bench).failed == 0
    row = bench.measure(0.05, 8, 1, 1, Limits(), random.Random(0))
    assert row["bits_sent"] == 8 and 0 <= row["bit_errors"] <= 8 and row["capacity_bits_per_s"] >= 0, row


# Class 15: a tripwire cannot be silenced by a thread. A red team filled the crash pipe, then made a refused open()
# in a thread: the hook's write of why blocked that thread, the other served, and the env won saying so.

FULL_CRASH_PIPE = '''
    import json, os, sys, threading, time
    crash = json.loads(sys.argv[1])["fds"][2]   # the child's crash pipe
    os.set_blocking(crash, False)
    try:
        while True:
            os.write(crash, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(crash, True)
    threading.Thread(target=open, args=("/etc/passwd",), daemon=True).start()
    time.sleep(0.5)
    return "tripwire silenced", {}'''


def test_a_refusal_in_a_thread_ends_the_process_even_with_the_crash_pipe_full():
    outcome = attack(env(reset=FULL_CRASH_PIPE))
    assert reason(outcome) in ("forbidden", "crash"), outcome   # the text on the pipe is the env's own


def test_a_refusal_whose_report_blocks_still_ends_the_process_by_the_alarm(monkeypatch):
    """The last resort, for a pipe filled between the hook's check and its write (a race no test can win on
    purpose): with the check taken out, the write blocks, and SIGALRM ends the process 0.1 s later."""
    check = "if select_((), (crash_fd,), (), 0)[1]:"
    assert isolation._CHILD_SOURCE.count(check) == 1
    monkeypatch.setattr(isolation, "_CHILD_SOURCE", isolation._CHILD_SOURCE.replace(check, "if True:"))
    outcome = attack(env(reset=FULL_CRASH_PIPE))
    assert reason(outcome) == "crash", outcome


def test_faulthandler_is_forbidden():
    """faulthandler.register would turn SIGALRM, the hook's last resort, into a traceback."""
    assert reason(attack(env(reset="import faulthandler\nreturn 'x', {}"))) == "forbidden"

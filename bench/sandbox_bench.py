"""Sandbox costs, measured side by side in one run: start-up, per-step overhead over the same environment run
in-process, and throughput of 64 concurrent environments stepped with call_many. Start-up is measured twice:
the launcher this machine uses (`bwrap` + seccomp filter where available) and the previous path
(`unshare` + `setpriv` + mount script, no filter), so the cost of the kernel layers is visible.

    python bench/sandbox_bench.py            # prints `name: value` lines

Targets on 2 cores (docs/benchmarks.md): start_p50_ms <= 100, step_overhead_p50_ms <= 1, steps_per_s_64 >= 500.
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import isolation  # noqa: E402
import sandbox  # noqa: E402

ENV = '''
import random

class LightsEnv:
    """Toggle lights to switch them all on; a typical small generated environment."""
    def __init__(self, max_turns=12, size=8):
        self.max_turns, self.size = max_turns, size

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.lights = [self.rng.random() < 0.5 for _ in range(self.size)]
        self.turn = 0
        return self._render(), {"size": self.size}

    def _render(self):
        row = " ".join("#" if on else "." for on in self.lights)
        return f"Lights: {row}\\nTurn {self.turn}/{self.max_turns}. Toggle one with \\\\boxed{{index}}."

    def step(self, action):
        self.turn += 1
        try:
            i = int(action.split("{")[1].split("}")[0]) % self.size
            self.lights[i] = not self.lights[i]
        except (IndexError, ValueError):
            pass
        done = all(self.lights)
        reward = 1.0 if done else sum(self.lights) / self.size / 2
        return self._render(), reward, done, self.turn >= self.max_turns, {"turn": self.turn}
'''


def pct(values: list, q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def bench_start(n: int = 40) -> list:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        env = sandbox.EnvProcess(ENV, {"max_turns": 10 ** 9})
        times.append(time.perf_counter() - t0)
        env.close()
    return times


def bench_step_overhead(n: int = 3000) -> list:
    """Per step: (sandbox round trip) - (the same step on an in-process copy), interleaved so both see the same
    machine load."""
    namespace: dict = {}
    exec(compile(ENV, "<bench>", "exec"), namespace)   # our own benchmark env, trusted
    local = namespace["LightsEnv"](max_turns=10 ** 9)
    local.reset(0)
    with sandbox.EnvProcess(ENV, {"max_turns": 10 ** 9}) as env:
        env.call("reset", 0)
        diffs = []
        for i in range(n):
            action = f"\\boxed{{{i % 8}}}"
            t0 = time.perf_counter()
            local.step(action)
            t1 = time.perf_counter()
            env.call("step", action)
            t2 = time.perf_counter()
            diffs.append((t2 - t1) - (t1 - t0))
    return diffs


def bench_concurrent(n_envs: int = 64, rounds: int = 60) -> float:
    envs = [sandbox.EnvProcess(ENV, {"max_turns": 10 ** 9}) for _ in range(n_envs)]
    try:
        sandbox.call_many(envs, "reset", [(i,) for i in range(n_envs)])
        t0 = time.perf_counter()
        for r in range(rounds):
            out = sandbox.call_many(envs, "step", [(f"\\boxed{{{(r + i) % 8}}}",) for i in range(n_envs)])
            assert not any(isinstance(o, sandbox.SandboxError) for o in out), out
        return n_envs * rounds / (time.perf_counter() - t0)
    finally:
        for env in envs:
            env.close()


def bench_start_old_path(n: int = 40) -> list | None:
    """Start-up through the unshare launcher without the syscall filter (the path before bwrap)."""
    old = next((launcher for launcher, missing in isolation._candidates()
                if launcher.mode == "namespaces+mounts" and not missing), None)
    if old is None:
        return None
    saved = isolation._launch()
    isolation._LAUNCH = (old, [], b"")
    try:
        return bench_start(n)
    finally:
        isolation._LAUNCH = saved


def main() -> None:
    report = isolation.isolation_report()
    print(f"isolation_mode: {report['mode']}")
    print(f"syscall_filter: {report['syscall_filter']}")
    starts = bench_start()
    print(f"start_p50_ms: {1000 * statistics.median(starts):.1f}")
    print(f"start_p95_ms: {1000 * pct(starts, 95):.1f}")
    old = bench_start_old_path()
    if old is None:
        print("start_p50_ms_unshare_no_filter: unavailable")
    else:
        print(f"start_p50_ms_unshare_no_filter: {1000 * statistics.median(old):.1f}")
        print(f"start_p95_ms_unshare_no_filter: {1000 * pct(old, 95):.1f}")
    diffs = bench_step_overhead()
    print(f"step_overhead_p50_ms: {1000 * statistics.median(diffs):.3f}")
    print(f"step_overhead_p95_ms: {1000 * pct(diffs, 95):.3f}")
    print(f"steps_per_s_64: {bench_concurrent():.0f}")
    print(f"cpu_count: {os.cpu_count()}")


if __name__ == "__main__":
    main()

"""Candidates that misbehave, for the engine's fault tests, and timers that return garbage or report a
busy machine."""

from __future__ import annotations

import math
from typing import Any

from measure.engine import Candidate
from measure.timing import Timing, time_candidate


def _candidate(args: list[Any], task: str) -> Candidate:
    import tvm
    from tvm import te
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    func = te.create_prim_func(args)
    return Candidate(tvm.IRModule({"main": func}), ArgInfo.from_prim_func(func), task)


def good(n: int = 256) -> Candidate:
    from tvm import te

    a = te.placeholder((n, n), name="A")
    return _candidate([a, te.compute((n, n), lambda i, j: a[i, j] * 2.0 + 1.0, name="B")], "good")


def unbuildable() -> Candidate:
    """A loop bound to a GPU thread index, built for the CPU: LLVM refuses it."""
    import tvm

    c = good(64)
    sch = tvm.s_tir.Schedule(c.mod)
    sch.bind(sch.get_loops(sch.get_sblock("B"))[0], "threadIdx.x")
    return Candidate(sch.mod, c.args_info, "unbuildable")


def segfault() -> Candidate:
    """Reads 2**40 floats past a 16-float buffer."""
    from tvm import te

    a = te.placeholder((16,), name="A")
    far = te.const(1 << 40, "int64")
    return _candidate([a, te.compute((16,), lambda i: a[i.astype("int64") + far], name="B")], "segfault")


def endless() -> Candidate:
    """A 2**40-step floating-point reduction: hours of work, never finishes within a timeout."""
    from tvm import te

    a = te.placeholder((4,), name="A")
    k = te.reduce_axis((0, 1 << 40), name="k")
    return _candidate([a, te.compute((4,), lambda i: te.sum(a[i] * 1.0001, axis=k), name="B")], "endless")


def slow() -> Candidate:
    """A dense 1024^3 matmul, naive schedule: about a second per run, long enough to be killed mid-run."""
    from tvm import te

    n = 1024
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    return _candidate([a, b, te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")], "slow")


def nan_timer(*args: Any) -> Timing:
    """A timer that measures, then reports NaN: what a broken clock or counter overflow looks like."""
    real = time_candidate(*args)
    return Timing((math.nan,) * len(real.run_secs), real.stop, real.number)


def flaky_timer(counter_path: str) -> Any:
    """A timer whose calls, in turn, crash the worker, report NaN, and measure for real."""

    def timer(*args: Any) -> Timing:
        import os
        import signal

        with open(counter_path, "a+", encoding="utf-8") as f:
            f.seek(0)
            calls = len(f.read())
            f.write(".")
        if calls % 3 == 0:
            os.kill(os.getpid(), signal.SIGSEGV)
        if calls % 3 == 1:
            return Timing((math.nan,), "confirmed", 1)
        return time_candidate(*args)

    return timer


def busy_machine_timer(counter_path: str, slowdowns: list[float]) -> Any:
    """A timer whose calls, in turn, report the probe slowdowns in ``slowdowns`` (1.0 past the list), each
    with a latency of that many milliseconds: which timing the engine kept shows in the value."""

    def timer(*args: Any) -> Timing:
        with open(counter_path, "a+", encoding="utf-8") as f:
            f.seek(0)
            calls = len(f.read())
            f.write(".")
        slowdown = slowdowns[calls] if calls < len(slowdowns) else 1.0
        return Timing((slowdown * 1e-3,) * 3, "confirmed", 1, slowdown)

    return timer


def contended_timer(parallel_ms: float, alone_ms: float) -> Any:
    """A timer that reports ``parallel_ms`` for a candidate timed beside others and ``alone_ms`` for one timed
    alone (the engine hands the quiet-machine probe to timings alone only)."""

    def timer(path: str, slot: Any, shapes: Any, policy: Any, best: Any, probe: Any, skip_if_busy: bool) -> Timing:
        return Timing(((alone_ms if probe is not None else parallel_ms) * 1e-3,) * 3, "confirmed", 1)

    return timer


def drifting_timer(counter_dir: str, values_ms: dict[int, list[float]]) -> Any:
    """A timer whose n-th timing of a ``good(size)`` candidate reports ``values_ms[size][n]`` (the last one
    past the list): the same kernel, timed while the machine is a few percent slow, then not."""

    def timer(path: str, slot: Any, shapes: Any, *rest: Any) -> Timing:
        import os

        size = shapes[0][1][0]
        with open(os.path.join(counter_dir, str(size)), "a+", encoding="utf-8") as f:
            f.seek(0)
            calls = len(f.read())
            f.write(".")
        series = values_ms[size]
        return Timing((series[min(calls, len(series) - 1)] * 1e-3,) * 3, "confirmed", 1)

    return timer


def spin(cores: tuple[int, ...], spinning: Any) -> None:
    """A neighbour: burn one of ``cores`` until killed, setting the event ``spinning`` once it does."""
    import os

    os.sched_setaffinity(0, cores)
    spinning.set()
    while True:
        pass


def small_matmul() -> Any:
    from tvm import te

    import tvm

    a = te.placeholder((64, 64), name="A")
    b = te.placeholder((64, 64), name="B")
    k = te.reduce_axis((0, 64), name="k")
    c = te.compute((64, 64), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})

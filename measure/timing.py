"""On-device timing with adaptive repeats, run inside a measurement worker.

The runtime's own timer does the timing: on a CPU, ``time_evaluator`` with the
worker pinned to its slot's cores (optionally flushing caches between runs); on a
GPU, the same call on a CUDA device, which TVM times with CUDA events on the
worker's own stream, never host wall clock around a launch.

A candidate's latency is the fastest of its runs (each run long enough to time
well), not their mean or median: on a shared host interference only ever adds
time, in bursts shorter than a second, so the fastest run is the one closest to
the kernel's own time (Chen and Revels, "Robust benchmarking in noisy
environments", 2016). Measured here in a busy hour, two timings of the same
candidates far apart differed by 5.0% (median) with the median of 3-12 runs and
by 2.3% with the fastest, at the same number of runs. Repeats stop as soon as the
fastest run is confirmed (enough runs within a small share of it), or as soon as
the candidate is clearly slower than the best of its task, instead of a fixed
``min_repeat_ms`` for every candidate.

On a CPU slot, when the engine asks (a candidate timed alone), a fixed probe kernel
is timed just before and just after the candidate. On a shared host a neighbour slows a core by 20-100% for seconds at a
time (1.4x for 7 s is common here); every repeat taken in such a spell is slow
alike, so no number of repeats removes it. The probe's slowdown against its fastest
run in this worker says whether the candidate was timed on a quiet machine; the
engine times it again later when not (``TimingPolicy.quiet_*``). The probe lasts a few
milliseconds, less than one of the scheduler's slices, so a neighbour spinning on the same
core slows it about half the time (3.6x or 1.0x here, 25 probes in a row); the kernel's own
count of the time the worker's threads waited for their core (``/proc/self/task/*/schedstat``)
sees that neighbour every time (1.8-2.2x against 1.00 on a quiet core), so the slowdown is
the worse of the two. The probe still sees what the count cannot: a neighbour on another
core that shares the caches or the memory bus.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from measure.slots import DeviceSlot

@dataclass(frozen=True)
class TimingPolicy:
    """When to stop repeating a measurement."""

    min_repeats: int = 3
    max_repeats: int = 12
    agree: float = 0.03  # runs within this share of the fastest one confirm it ...
    confirmations: int = 3  # ... and this many (the fastest included) end the timing
    min_repeat_s: float = 0.002  # each repeat runs the kernel often enough to last this long
    max_seconds: float = 0.5  # timing budget per candidate, warm-up excluded
    slower_than_best: float = 0.2  # stop once even the fastest run is this far behind the task's best
    cache_flush: bool = False
    quiet_tolerance: float = 0.08  # a probe this much slower than its fastest run: the machine is not quiet
    quiet_attempts: int = 4  # timings of one candidate, at most, while waiting for a quiet machine
    quiet_wait_s: float = 0.3  # first wait before timing a disturbed candidate again; grows linearly

    def isolated(self) -> TimingPolicy:
        """The stricter policy for verification and final ranking."""
        return replace(self, min_repeats=5, max_repeats=30, agree=self.agree * 2 / 3,
                       confirmations=self.confirmations + 1, max_seconds=self.max_seconds * 2,
                       slower_than_best=math.inf)


@dataclass(frozen=True)
class Timing:
    run_secs: tuple[float, ...]
    stop: str  # "confirmed", "slower", "repeats", "time", or "busy" (not timed: see ``time_candidate``)
    number: int
    slowdown: float = 1.0  # the worst seen before or after the timing (``_slowdown``; 1.0: quiet)


@dataclass(frozen=True)
class Probe:
    """A built probe kernel (``measure.kernels.probe``) for the slot's target, and its arguments."""

    path: str
    arg_shapes: tuple[tuple[str, tuple[int, ...]], ...]


def fastest(samples: Sequence[float]) -> float:
    """A timing's latency: its fastest run (interference only ever adds time)."""
    return min(samples)


def should_stop(samples: list[float], policy: TimingPolicy, best_s: float | None, spent_s: float) -> str | None:
    """Why to stop now, or None to take more samples."""
    n = len(samples)
    if n >= policy.max_repeats:
        return "repeats"
    if spent_s >= policy.max_seconds and n >= 1:
        return "time"
    if best_s is not None and n >= 2 and min(samples) > best_s * (1 + policy.slower_than_best):
        return "slower"  # even its fastest run is clearly behind the task's best
    if n < policy.min_repeats:
        return None
    if sum(s <= fastest(samples) * (1 + policy.agree) for s in samples) >= policy.confirmations:
        return "confirmed"
    return None


_BATCH = 2  # samples per evaluator call after the first ones: each call adds one untimed run
_ARGS: dict[Any, list[Any]] = {}
_RPC: dict[Any, Any] = {}
_STREAM: list[Any] = []
_PROBES: dict[str, list[Any]] = {}  # probe path -> [evaluator, fastest time seen in this worker]


def time_candidate(artifact_path: str, slot: DeviceSlot, arg_shapes: tuple[tuple[str, tuple[int, ...]], ...],
                   policy: TimingPolicy, best_s: float | None, probe: Probe | None = None,
                   skip_if_busy: bool = False) -> Timing:
    """Load a built candidate on ``slot`` and time it, between two probes when given. Runs in a measurement
    worker. ``skip_if_busy``: when the first probe finds the host busy, return at once, untimed (stop
    "busy"), so that the engine can try again later at the cost of a probe, not of a timing."""
    import time

    if slot.kind == "rpc":
        module, device, cleanup = _load_remote(artifact_path, slot)
    else:
        import tvm

        module, device, cleanup = tvm.runtime.load_module(artifact_path), tvm.runtime.device(slot.device_type, slot.device_id), None
        if slot.kind == "cuda":
            _own_stream(device)
    try:
        args = _arguments(device, arg_shapes, slot)
        flush = "cache_flush_cpu_non_first_arg" if policy.cache_flush and slot.device_type == "cpu" else ""
        timers: dict[tuple[int, int], Any] = {}

        def run(number: int, repeat: int) -> list[float]:
            """``repeat`` samples; TVM's evaluator runs the kernel once more, untimed, before them."""
            if (number, repeat) not in timers:
                timers[number, repeat] = module.time_evaluator(module.entry_name, device, number=number,
                                                               repeat=repeat, f_preproc=flush)
            return [float(x) for x in timers[number, repeat](*args).results]

        core_since = _core_time() if probe else None  # read only where the quiet check runs: a hot path
        before = _slowdown(probe, device, slot, core_since)
        if skip_if_busy and before > 1 + policy.quiet_tolerance:
            return Timing((), "busy", 0, before)
        (first,) = run(1, 1)
        number = max(1, math.ceil(policy.min_repeat_s / max(first, 1e-9)))
        samples = [first] if number == 1 else []
        started = time.perf_counter()
        while (stop := should_stop(samples, policy, best_s, time.perf_counter() - started)) is None:
            want = max(policy.min_repeats - len(samples), _BATCH)
            samples += run(number, min(want, policy.max_repeats - len(samples)))
        after = _slowdown(probe, device, slot, core_since)
        return Timing(tuple(samples), stop, number, max(before, after))
    except Exception:
        if slot.kind == "rpc":  # the session may be gone: reconnect and re-allocate next time
            _RPC.pop(slot.rpc, None)
            for key in [k for k in _ARGS if k[0] == slot.name]:
                del _ARGS[key]
        raise
    finally:
        if cleanup:
            cleanup()


def _arguments(device: Any, arg_shapes: tuple[tuple[str, tuple[int, ...]], ...], slot: DeviceSlot) -> list[Any]:
    """Random inputs per (slot, shapes), allocated once per worker."""
    import numpy as np
    import tvm

    key = (slot.name, arg_shapes)
    if key not in _ARGS:
        rng = np.random.default_rng(0)
        _ARGS[key] = [tvm.runtime.tensor(rng.uniform(-1, 1, shape).astype(dtype), device) for dtype, shape in arg_shapes]
    return _ARGS[key]


def _slowdown(probe: Probe | None, device: Any, slot: DeviceSlot, since: tuple[int, int] | None) -> float:
    """How much slower than a quiet machine: the probe's time now over the fastest it has run in this worker
    (the median of three runs), or the time since ``since`` (a ``_core_time``) over the part of it this
    process's threads ran, whichever is worse; 1.0 where no quiet check runs (no probe)."""
    import tvm

    if probe is None or since is None:
        return 1.0
    if probe.path not in _PROBES:
        module = tvm.runtime.load_module(probe.path)
        _PROBES[probe.path] = [module.time_evaluator(module.entry_name, device, number=1, repeat=3), math.inf]
    entry = _PROBES[probe.path]
    now = statistics.median(entry[0](*_arguments(device, probe.arg_shapes, slot)).results)
    entry[1] = min(entry[1], now)
    ran, waited = (now_ns - then_ns for now_ns, then_ns in zip(_core_time(), since))
    return max(now / entry[1], (ran + waited) / ran if ran > 0 else 1.0)


def _core_time() -> tuple[int, int]:
    """Nanoseconds this process's threads have run on a core and waited, runnable, for one; (0, 0) where the
    kernel keeps no scheduler statistics."""
    ran = waited = 0
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return 0, 0
    for thread in threads:
        try:
            with open(f"/proc/self/task/{thread}/schedstat") as counts:
                on_core, on_queue, _ = counts.read().split()
        except (OSError, ValueError):
            continue  # the thread ended, or no such counts
        ran, waited = ran + int(on_core), waited + int(on_queue)
    return ran, waited


def _own_stream(device: Any) -> None:
    """Give this worker its own CUDA stream, so the event timer measures only its launches."""
    if not _STREAM:
        _STREAM.append(device.create_raw_stream())
        device.set_raw_stream(_STREAM[0])


def _load_remote(artifact_path: str, slot: DeviceSlot) -> tuple[Any, Any, Any]:
    """Upload the candidate to the slot's RPC server (one session per worker, re-made after a failure)."""
    from tvm import rpc

    address = slot.rpc
    session = _RPC.get(address)
    if session is None:
        tracker = rpc.connect_tracker(address.host, address.port)
        session = _RPC[address] = tracker.request(address.key, priority=1, session_timeout=120, max_retry=2)
    name = os.path.basename(artifact_path)
    session.upload(artifact_path)
    module = session.load_module(name)
    return module, session.device(slot.device_type, slot.device_id), lambda: session.remove(name)

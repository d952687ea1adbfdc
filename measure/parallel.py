"""The parallel measurement engine (after DOPpler): warm builds, device slots, pipelined timing.

One round: every candidate goes to the warm build workers at once; each is timed on a
measurement lane as soon as its library exists, while the rest still build. The DoP
controller says how many lanes time at once and whether builds may run meanwhile (at
idle priority) or are paused for each measurement. After a parallel round, outliers,
the contenders for the best and a sample are timed again in isolation; their
isolated values replace the parallel ones, the round's bias is taken off the rest
(or, when the error is past the controller's bound, the rest are timed alone as
well: the level costs the round its speed, never its truth), and the error found
sets the next round's level. Candidates that timed out in a parallel round are timed
alone too: those that finish there were the level's timeouts, which the controller
counts; those that hang alone as well are the kernel's. After an isolated round, the
contenders for each task's best are timed a second time. A candidate timed alone on a
CPU slot is bracketed by a probe kernel; one timed while the probe ran slow (a
neighbour on the host) is tried again after a pause, so that values come from a quiet
machine.

Faults stay with their candidate: a build or a kernel that crashes, hangs or returns
garbage kills only its worker, which is replaced on its next job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import queue
import random
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from measure.build import build_candidate
from measure.dop import DopController, Verification, contenders, pick_for_verification
from measure.engine import Candidate, Measurement, MeasurementEngine, median_turn
from measure.slots import DeviceSlot
from measure.timing import Probe, Timing, TimingPolicy, time_candidate
from measure.workers import CallCost, Worker, WorkerFault, WorkerGroup, WorkerSetup


@dataclass(frozen=True)
class EngineLimits:
    """Timeouts; the run timeout grows with the level, as contention slows everything down."""

    build_timeout_s: float = 60.0
    run_timeout_s: float = 20.0
    gpu_lanes: int = 4  # concurrent measurement processes per GPU

    def run_timeout(self, level: int) -> float:
        return self.run_timeout_s * (1 + level / 4)


class ParallelEngine(MeasurementEngine):
    """Builds on warm idle-priority workers and times on every slot, at a level the controller picks."""

    name = "parallel"

    def __init__(self, slots: Sequence[DeviceSlot], build_workers: int, *, timing: TimingPolicy | None = None,
                 controller: DopController | None = None, limits: EngineLimits | None = None,
                 timer: Callable[..., Timing] = time_candidate, seed: int = 0) -> None:
        if not slots:
            raise ValueError("the parallel engine needs at least one device slot")
        super().__init__()
        self.slots = list(slots)
        self.timing = timing or TimingPolicy()
        self.limits = limits or EngineLimits()
        self.timer = timer
        self._rng = random.Random(seed)
        self._lanes = [
            Worker(f"measure-{slot.name}-{i}", WorkerSetup(cores=slot.cores, env=_thread_env(slot.threads)))
            for i in range(lanes_per_slot(self.slots, self.limits))
            for slot in self.slots
        ]
        self.controller = controller or DopController(max_level=len(self._lanes))
        self.controller.limit(len(self._lanes))
        self._builders = WorkerGroup([
            Worker(f"build-{i}", WorkerSetup(env=_thread_env(1), idle_priority=True, builds=True))
            for i in range(max(1, build_workers))
        ])
        self._free_builders: queue.Queue[Worker] = queue.Queue()
        for w in self._builders.workers:
            self._free_builders.put(w)
        self._build_pool = ThreadPoolExecutor(len(self._builders.workers), thread_name_prefix="build")
        # threads wait for a free lane; a candidate pausing for a quiet host holds a thread, not a lane
        self._lane_pool = ThreadPoolExecutor(MEASURE_THREADS, thread_name_prefix="measure")
        self._dir = tempfile.mkdtemp(prefix="autotune-candidates-")
        self._best: dict[str, float] = {}
        self._probes: dict[str, Probe | None] = {}
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self._starting = self._builders.start() + WorkerGroup(self._lanes).start()

    # -- the engine interface ---------------------------------------------------------------

    def measure(self, target: Any, device_type: str, candidates: Sequence[Candidate]) -> list[Measurement]:
        level = self.controller.level
        results, paths, timed_out = self._round(target, candidates, level)
        probe = self._probe(target)
        error, timeouts = None, 0
        if level > 0:
            error = self._verify(candidates, results, paths, probe)
            timeouts = self._retime_timeouts(candidates, results, paths, timed_out, probe)
        else:
            self._second_look(candidates, results, paths, probe)
        self._remove(paths)
        self.controller.update(error, timeouts, len(paths))
        return results

    def measure_isolated(self, target: Any, device_type: str, candidates: Sequence[Candidate],
                         turns: int = 1) -> list[Measurement]:
        built = self._build_all(target, candidates)
        paths = {i: path for i, (path, _, _) in enumerate(built) if path}
        probe = self._probe(target)
        timed: list[list[Measurement]] = [[] for _ in candidates]
        for _ in range(turns):
            for i, m in self._alone(candidates, paths, paths, probe, self.timing.isolated(), keep_failed=True):
                timed[i].append(m)
        self._remove(paths)
        return [Measurement(error=f"build: {err}") if path is None else median_turn(t)
                for t, (path, err, _) in zip(timed, built)]

    def measure_at(self, level: int, target: Any, candidates: Sequence[Candidate]) -> list[Measurement]:
        """One round at a fixed level, without verification: what calibration compares."""
        results, paths, _ = self._round(target, candidates, level)
        self._remove(paths)
        return results

    def report(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "slots": [{"name": s.name, "kind": s.kind, "cores": list(s.cores), **s.info} for s in self.slots],
            "lanes": len(self._lanes),
            "build_workers": len(self._builders.workers),
            "level": self.controller.level,
            "dop_history": self.controller.history,
            "counts": dict(self.counts),
            "workers_replaced": sum(w.replaced for w in self._lanes + self._builders.workers),
        }

    def close(self) -> None:
        self._build_pool.shutdown(wait=False, cancel_futures=True)
        self._lane_pool.shutdown(wait=False, cancel_futures=True)
        self._builders.close()
        for lane in self._lanes:
            lane.kill()
        shutil.rmtree(self._dir, ignore_errors=True)

    @property
    def lanes(self) -> list[Worker]:
        return list(self._lanes)

    @property
    def builders(self) -> list[Worker]:
        return list(self._builders.workers)

    # -- a round --------------------------------------------------------------------------------

    def _round(self, target: Any, candidates: Sequence[Candidate],
               level: int) -> tuple[list[Measurement], dict[int, str], list[int]]:
        """Build everything at once; time each candidate as soon as it is built, ``max(level, 1)`` at a time.
        Returns the results, the libraries built (index -> path) and the indices of the candidates that timed out."""
        lanes: queue.Queue[Worker] = queue.Queue()
        for lane in self._lanes[:max(1, level)]:
            lanes.put(lane)
        results: list[Measurement | None] = [None] * len(candidates)
        paths: dict[int, str] = {}
        probe = self._probe(target)
        builds = {self._build_pool.submit(self._build, target, c): i for i, c in enumerate(candidates)}
        runs: dict[Future, int] = {}
        build_cpu: dict[int, float] = {}
        for done in as_completed(builds):
            i = builds[done]
            path, err, build_cpu[i] = done.result()
            if path is None:
                results[i] = Measurement(error=f"build: {err}", cpu_s=build_cpu[i])
                continue
            paths[i] = path
            runs[self._lane_pool.submit(self._time, lanes, candidates[i], path, self.timing,
                                        self._best.get(candidates[i].task), isolated=level == 0, level=level,
                                        phase="measure", probe=probe)] = i
        timed_out: list[int] = []
        for done in as_completed(runs):
            measurement, timeout = done.result()
            i = runs[done]
            results[i] = dataclasses.replace(measurement, cpu_s=measurement.cpu_s + build_cpu[i])
            if timeout:
                timed_out.append(i)
        assert all(r is not None for r in results)
        return results, paths, sorted(timed_out)  # type: ignore[return-value]

    def _build(self, target: Any, candidate: Candidate, counted: bool = True) -> tuple[str | None, str | None, float]:
        """(library path or None, build error or None, the build's CPU-seconds); ``counted``: a candidate's build."""
        builder = self._free_builders.get()
        try:
            path = builder.call(build_candidate, (candidate.mod, target, self._dir), self.limits.build_timeout_s)
            self.counts["built"] += counted
            return path, None, builder.last_cost.cpu_s
        except WorkerFault as fault:
            self.counts[f"build_{fault.kind}"] += 1
            return None, str(fault), builder.last_cost.cpu_s
        finally:
            with self._lock:
                self.work["build"].add(builder.last_cost.cpu_s)
            self._free_builders.put(builder)

    def _probe(self, target: Any) -> Probe | None:
        """The quiet-machine probe built for ``target``, once (none where no slot is a CPU, or if it fails)."""
        key = str(target)
        if key not in self._probes:
            self._probes[key] = None
            if any(s.kind == "cpu" for s in self.slots):
                from measure.kernels import probe

                mod, shapes = probe()
                path, _, _ = self._build(target, Candidate(mod, None, "probe"), counted=False)
                self._probes[key] = Probe(path, shapes) if path else None
        return self._probes[key]

    def _build_all(self, target: Any, candidates: Sequence[Candidate]) -> list[tuple[str | None, str | None, float]]:
        return list(self._build_pool.map(lambda c: self._build(target, c), candidates))

    def _first_lane(self) -> queue.Queue[Worker]:
        """The first lane alone: where candidates are timed in isolation."""
        lanes: queue.Queue[Worker] = queue.Queue()
        lanes.put(self._lanes[0])
        return lanes

    def _time(self, lanes: queue.Queue[Worker], candidate: Candidate, path: str, policy: TimingPolicy,
              best: float | None = None, *, isolated: bool, phase: str, level: int = 0,
              probe: Probe | None = None) -> tuple[Measurement, bool]:
        """Time one built candidate on the next free lane (``best``: its task's best so far, for early stops).

        Timed alone on a CPU slot, the candidate is bracketed by the probe. When the probe says the
        host is busy, the lane goes back to the queue (other candidates use it) and the candidate is
        tried again after a growing pause, up to ``policy.quiet_attempts`` times; the least disturbed
        timing is kept. (Alongside other lanes or builds the probe would see those, which no pause
        removes: verification deals with them.) Returns the measurement and whether it timed out;
        the cost of every attempt goes to ``phase``'s work.
        """
        timings: list[Timing] = []
        cost = CallCost(0.0, 0.0)
        slot = self.slots[0]
        try:
            while True:
                lane = lanes.get()
                slot = self._slot_of(lane)
                quiet_check = probe if isolated and slot.kind == "cpu" else None
                last = quiet_check is None or len(timings) + 1 >= policy.quiet_attempts
                try:
                    with self._builders.paused() if isolated else contextlib.nullcontext():
                        timings.append(lane.call(self.timer, (path, slot, candidate.arg_shapes(), policy, best,
                                                              quiet_check, not last),
                                                 self.limits.run_timeout(level) * (2 if isolated else 1)))
                finally:
                    cost = CallCost(cost.wall_s + lane.last_cost.wall_s, cost.cpu_s + lane.last_cost.cpu_s)
                    lanes.put(lane)
                if last or timings[-1].slowdown <= 1 + policy.quiet_tolerance:
                    break
                self.counts["disturbed"] += 1
                time.sleep(policy.quiet_wait_s * len(timings))
        except WorkerFault as fault:
            self.counts[f"run_{fault.kind}"] += 1
            return self._costed(Measurement(error=f"run: {fault}", slot=slot.name), cost, phase), fault.kind == "timeout"
        finally:
            with self._lock:
                self.work[phase].add(cost.cpu_s, cost.wall_s)
        timing = min((t for t in timings if t.run_secs), key=lambda t: t.slowdown)
        m = self._costed(Measurement(run_secs=tuple(timing.run_secs), slot=slot.name, isolated=isolated,
                                     at=time.time(), stop=timing.stop), cost, phase)
        if not m.ok:
            self.counts["run_garbage"] += 1
            return self._costed(Measurement(error=f"run: invalid timings {list(timing.run_secs)[:5]}", slot=slot.name),
                                cost, phase), False
        self.counts["measured"] += 1
        self.counts[f"stop_{timing.stop}"] += 1
        with self._lock:
            if m.latency < self._best.get(candidate.task, math.inf):
                self._best[candidate.task] = m.latency
        return m, False

    @staticmethod
    def _costed(m: Measurement, cost: CallCost, phase: str) -> Measurement:
        """``m`` with the device time and CPU time its timing took (tuning measurements only: a re-timing's
        cost belongs to verification, not to the candidate)."""
        if phase != "measure":
            return m
        return dataclasses.replace(m, device_s=cost.wall_s, cpu_s=cost.cpu_s)

    def _slot_of(self, lane: Worker) -> DeviceSlot:
        return self.slots[self._lanes.index(lane) % len(self.slots)]

    def _verify(self, candidates: Sequence[Candidate], results: list[Measurement], paths: dict[int, str],
                probe: Probe | None) -> float | None:
        """Re-time outliers, the fastest and a sample in isolation; fix the round's values; return its error."""
        parallel = {i: m.latency for i, m in enumerate(results) if m.ok}
        picked = pick_for_verification(parallel, self._rng)
        pairs = []
        for i, iso in self._alone(candidates, paths, picked, probe, self.timing.isolated()):
            pairs.append((parallel[i], iso.latency))
            results[i] = _with_cost_of(results[i], iso)
        self.counts["verified"] += len(pairs)
        if not pairs:
            return None
        check = Verification.compare(pairs)
        rest = sorted(parallel.keys() - set(picked))
        if self.controller.too_far(check.error):
            # the round's parallel values are known wrong: time the rest as a level-0 round would have
            self.counts["rounds_retimed"] += 1
            for i, alone in self._alone(candidates, paths, rest, probe, self.timing, early_stop=True):
                results[i] = _with_cost_of(results[i], alone)
            return check.error
        for i in rest:
            m = results[i]
            results[i] = dataclasses.replace(m, run_secs=tuple(check.corrected(s) for s in m.run_secs or ()))
        return check.error

    def _retime_timeouts(self, candidates: Sequence[Candidate], results: list[Measurement], paths: dict[int, str],
                         timed_out: Sequence[int], probe: Probe | None) -> int:
        """Time the candidates that timed out in a parallel round alone, as a level-0 round would have (with its
        longer timeout); keep the values of those that finish and return how many did: the timeouts that were the
        level's fault. One that times out alone too is the kernel's and says nothing about the level; it costs its
        timeout twice, the price of telling the two apart."""
        finished = 0
        for i, alone in self._alone(candidates, paths, timed_out, probe, self.timing, early_stop=True):
            results[i] = _with_cost_of(results[i], alone)
            finished += 1
        return finished

    def _second_look(self, candidates: Sequence[Candidate], results: list[Measurement], paths: dict[int, str],
                     probe: Probe | None) -> None:
        """After an isolated round, time the contenders for each task's best once more and keep the runs of
        both timings (the fastest counts). A spell a few percent slow, under the probe's tolerance, lasts
        longer than a timing and can hide the best; the contenders are where that changes the result."""
        for task in {c.task for c in candidates}:
            mine = {i: m.latency for i, m in enumerate(results) if m.ok and candidates[i].task == task}
            looks = contenders(mine, self._best.get(task, math.inf), within=SECOND_LOOK_WITHIN)
            for i, again in self._alone(candidates, paths, looks, probe, self.timing):
                self.counts["second_looks"] += 1
                results[i] = dataclasses.replace(results[i], run_secs=results[i].run_secs + again.run_secs)
                with self._lock:
                    self._best[task] = min(self._best[task], results[i].latency)

    def _alone(self, candidates: Sequence[Candidate], paths: Mapping[int, str], indices: Iterable[int],
               probe: Probe | None, policy: TimingPolicy, *, early_stop: bool = False,
               keep_failed: bool = False) -> Iterator[tuple[int, Measurement]]:
        """Time the built candidates (``paths``: index -> library) at ``indices`` one at a time on the first
        lane, as verification work; yield (index, measurement) for each valid timing (every timing with
        ``keep_failed``). ``early_stop``: stop a candidate clearly slower than its task's best."""
        for i in indices:
            m, _ = self._time(self._first_lane(), candidates[i], paths[i], policy,
                              self._best.get(candidates[i].task) if early_stop else None, isolated=True,
                              phase="verification", probe=probe)
            if m.ok or keep_failed:
                yield i, m

    def _remove(self, paths: dict[int, str]) -> None:
        import os

        for path in paths.values():
            with contextlib.suppress(OSError):
                os.remove(path)


SECOND_LOOK_WITHIN = 0.05  # contenders for a task's best, timed twice at level 0: within this share of it
MEASURE_THREADS = 64  # candidates of a round in flight towards the lanes at once


def _with_cost_of(tuned: Measurement, alone: Measurement) -> Measurement:
    """``alone``'s timing in place of ``tuned``'s, with ``tuned``'s cost (re-timing is verification's work)."""
    return dataclasses.replace(alone, device_s=tuned.device_s, cpu_s=tuned.cpu_s)


def lanes_per_slot(slots: Sequence[DeviceSlot], limits: EngineLimits) -> int:
    """Measuring processes per slot: several per GPU (they share it like DOPpler's workers), one per CPU slot."""
    return limits.gpu_lanes if any(s.kind == "cuda" for s in slots) else 1


def _thread_env(threads: int) -> dict[str, str]:
    """The TVM runtime uses exactly the slot's cores, without re-binding threads over our pinning."""
    return {"TVM_NUM_THREADS": str(threads), "TVM_BIND_THREADS": "0", "OMP_NUM_THREADS": str(threads)}

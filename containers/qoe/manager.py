"""The QoE manager's loop: observe every container, classify, allocate, apply, wait as the listener says.

One iteration reads each managed container's CPU usage and response time, classifies them
against their targets, asks the allocation policy for new limits, has the executor apply
them, and asks the listener how long to wait. A container that died since the last
iteration is reported and restarted or dropped, per ``on_exit``; the loop keeps going.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from containers.backends.base import ContainerBackend, ContainerSpec
from containers.errors import ContainerError, ScenarioError
from containers.qoe.algorithm import AllocationPolicy, Classification, QoeClass, Reading, classify
from containers.qoe.analyst import QoeAnalyst, Row
from containers.qoe.executor import Executor
from containers.qoe.listener import Listener
from containers.qoe.monitors import ApplicationMonitor, WorkerMonitor

ON_EXIT = ("restart", "drop")


@dataclass
class QoeManager:
    """DQoES on one worker: the Application and Worker Monitors, the Executor and the QoE Analyst.

    Attributes:
        backend: where the containers run.
        policy: decides limits (DQoES, or a baseline).
        listener: decides when to run it next (adaptive or fixed).
        alpha: tolerance used to classify containers into G, S and B.
        host_cpus: cores the containers share (the hardware ceiling).
        on_exit: ``restart`` or ``drop`` a container that died.
    """

    backend: ContainerBackend
    policy: AllocationPolicy
    listener: Listener
    alpha: float = 0.10
    host_cpus: float = field(default_factory=lambda: float(len(os.sched_getaffinity(0))))
    on_exit: str = "restart"
    monitor: ApplicationMonitor = field(default_factory=ApplicationMonitor)
    analyst: QoeAnalyst = field(default_factory=QoeAnalyst)
    timeline: list[dict[str, Any]] = field(default_factory=list, init=False)
    iterations: int = field(default=0, init=False)
    cpu_s: float = field(default=0.0, init=False)  # the manager's own CPU time, in its iterations
    wake: threading.Event = field(default_factory=threading.Event, init=False)

    def __post_init__(self) -> None:
        if self.on_exit not in ON_EXIT:
            raise ScenarioError(f"on_exit must be one of {', '.join(ON_EXIT)}; got {self.on_exit!r}")
        self.workers = WorkerMonitor(self.backend)
        self.executor = Executor(self.backend)
        self._started = time.monotonic()
        self._last: Classification | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def join(self, spec: ContainerSpec, target_ms: float | None) -> None:
        """Start ``spec`` (limits from the policy's view of the new pool) and manage it from now on."""
        self.analyst.register(spec.name, target_ms)
        self.backend.start(spec)
        self.workers.join(spec)
        self.executor.limits[spec.name] = spec.cpus
        self.analyst.note(self.elapsed(), "joined", spec.name, f"target {target_ms} ms")
        if self.policy.name == "static":  # equal shares change whenever the pool does
            self.executor.apply(self.policy.allocate([], self.host_cpus, self._limits()))
        self.listener.reset()

    def leave(self, name: str) -> None:
        """Stop managing ``name`` and stop its container; a stop that fails is noted, and the loop goes on."""
        if self.workers.leave(name) is None:
            return
        self.monitor.forget(name)
        self.executor.forget(name)
        self.analyst.drop(name)
        try:
            self.backend.stop(name)
        except ContainerError as err:
            self.analyst.note(self.elapsed(), "stop failed", name, str(err))
        self.analyst.note(self.elapsed(), "left", name)

    def step(self) -> float:
        """One iteration; returns the seconds to wait before the next."""
        cpu0 = time.thread_time()
        try:
            return self._iterate()
        finally:
            self.cpu_s += time.thread_time() - cpu0

    def _iterate(self) -> float:
        self._handle_dead()
        readings = []
        for name, spec in list(self.workers.pool.items()):
            try:
                usage = self.executor.usage(name)
            except ContainerError:
                continue  # died between the check and now; the next iteration handles it
            response = self.monitor.response_ms(spec)
            target = self.analyst.target(name)
            limit = self.executor.limit(name)
            if target is not None and response is not None:
                readings.append(Reading(name, target, response, usage, limit))
            self.analyst.record(Row(name, target, response, "-", None, round(usage, 3), limit))
        c = classify(readings, self.alpha)
        changes = self.executor.apply(self.policy.allocate(readings, self.host_cpus, self._limits())) if readings else 0
        for r in readings:
            self.analyst.record(Row(r.name, r.target_ms, round(r.response_ms, 3), c.classes[r.name].value,
                                    round(c.quality[r.name], 3), round(r.usage_cpus, 3), self.executor.limit(r.name)))
        wait = self.listener.observe(c, changes) if readings else self.listener.interval_s
        self.iterations += 1
        self._last = c
        self.timeline.append({
            "t": round(self.elapsed(), 2), "wait_s": wait, "changes": changes,
            "counts": {k.value: len(c.members(k)) for k in QoeClass} if readings else None,
            "quality_sums": {"G": round(c.q_g, 3), "S": c.satisfied, "B": round(c.q_b, 3)},
            "containers": {r.name: {"class": c.classes[r.name].value, "response_ms": round(r.response_ms, 3),
                                    "target_ms": r.target_ms, "usage": round(r.usage_cpus, 3),
                                    "limit": self.executor.limit(r.name)} for r in readings},
        })
        return wait

    def status(self) -> dict[str, Any]:
        """The performance table, class counts and the manager's own cost so far."""
        wall = max(self.elapsed(), 1e-9)
        return {
            **self.analyst.report(self._last),
            "policy": self.policy.name, "listener": self.listener.name, "interval_s": self.listener.interval_s,
            "iterations": self.iterations, "limit_changes": self.executor.updates,
            "manager_cpu_s": round(self.cpu_s, 3), "manager_cpu_share": round(self.cpu_s / wall, 5),
            "elapsed_s": round(wall, 1),
        }

    def _handle_dead(self) -> None:
        """Restart or drop each container that died; one that does not restart is dropped (one container's
        failure must not end the run, whose record the others' results need)."""
        for name in self.workers.dead():
            spec = self.workers.pool[name]
            self.analyst.note(self.elapsed(), "exited", name, "dropping it" if self.on_exit == "drop" else "restarting it")
            self.monitor.forget(name)
            if self.on_exit == "restart":
                try:
                    self.backend.stop(name)
                    self.backend.start(replace(spec, cpus=self.executor.limit(name)))
                except ContainerError as err:
                    self.analyst.note(self.elapsed(), "restart failed", name, f"dropping it: {err}")
                else:
                    self.listener.reset()
                    continue
            self.leave(name)

    def _limits(self) -> dict[str, float | None]:
        """Every managed container's current limit, read this iteration or not: the pool a policy divides."""
        return {name: self.executor.limit(name) for name in self.workers.pool}

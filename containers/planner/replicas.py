"""The containers behind a live pipeline: started and stopped through a backend, routed to by the front end.

The plan's replicas start side by side before any query is sent (all of them, or none:
one that fails to start stops the others). Later changes come from the Tuner as a count per
stage. Going up starts containers in the background (the next ``<pipeline>-<stage>-<k>``
name, the next free port, the stage's planned size) and routes to each once it answers
``/health``; going down first drops containers still starting, then takes the newest
serving ones out of the route, lets their batch in hand finish, and stops them. Every
change is recorded with its time, so a run shows when capacity was asked for and when it
served. Every replica is warmed up before it is routed to: it serves ``WARMUP_REQUESTS``
requests back to back at one item and at its stage's batch size (a started server's first
request of a size runs up to several times slower; its second does not).
A replica added later is pinned like the planned ones, to the cores a
``CorePlacement`` finds least committed then; a stopped one gives its cores back. An ask
for more than the cores can hold starts what fits and records the rest as ``capped``: a
Tuner that scales to a burst's rate must not pile containers onto cores already full.

A stage may keep warm standby replicas: started and warmed up like any other, then paused
(frozen: memory held, no CPU used). An ask for more takes a ready standby first: its cores
are chosen then, its limit set, it is resumed and routed in tens of milliseconds instead of a
container start of seconds, and a new standby starts in its place, under its CPU limit (no
start boost: nothing waits on it, and the stage's neighbours are serving a burst), once none
of the stage's replicas is starting cold: the traffic waits on those, only a later ask on the
replacement (on 2 cores a cold start served 6.2 s after the ask beside one, 3.4 s alone).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial

from containers.backends.base import HOST, ContainerBackend, ContainerSpec
from containers.client import InferenceClient
from containers.errors import ContainerError, PlanError, ScenarioError
from containers.planner.config import check_standby, standby_replicas
from containers.planner.deploy_plan import CorePlacement
from containers.planner.estimator import WARMUP_REQUESTS
from containers.planner.frontend import Frontend


@dataclass(frozen=True)
class ReplicaEvent:
    """A change of a stage's replicas.

    Attributes:
        t_s: on the front end's clock (the trace's; the plan's replicas are at 0); a removal is stamped when the
            replica left the route, before its container was stopped.
        replicas: the count after the change: asked for (``asked``) or serving (the others).
        event: ``planned``, ``asked`` (the Tuner's new count), ``serving`` (a replica added to the route),
            ``removed`` (taken out and stopped), ``failed`` (a start that did not come up), ``capped``
            (an ask the cores could not hold: ``replicas`` is the count serving and starting after it),
            ``standby starting`` (a standby begins to start in the place of one resumed), ``standby`` (it is
            warmed up and paused; for both, ``replicas`` is the stage's ready standbys), or ``standby failed``
            (one that did not come up).
        container: the container it concerns; None for ``planned`` and ``asked``.
        error: why a start failed or an ask was capped, or a stop did not go cleanly.
    """

    t_s: float
    stage: str
    replicas: int
    event: str
    container: str | None = None
    error: str | None = None


class ReplicaSet:
    """Each stage's containers and their routes.

    Args:
        backend: starts and stops the containers.
        frontend: routes queries to the replicas serving.
        specs: stage -> its planned replicas' specs (``plan_specs``, grouped); the first is the
            template for the stage's later replicas.
        placement: where the planned replicas were pinned (``plan_specs``'s); later replicas are
            pinned by it too. None: later replicas copy the first one's cpuset.
        start_timeout_s: how long a container may take to answer ``/health``.
        warmup_requests: how many requests of each size warm a replica up once it answers.
        standby: warm, paused replicas each stage keeps for later asks, per planned replica
            (``standby_replicas``); each runs, until it is resumed, on its stage's first replica's cores.
    """

    def __init__(self, backend: ContainerBackend, frontend: Frontend, specs: dict[str, Sequence[ContainerSpec]],
                 placement: CorePlacement | None = None, start_timeout_s: float = 60.0,
                 warmup_requests: int = WARMUP_REQUESTS, standby: float = 0.0) -> None:
        if not all(specs.values()):
            raise ScenarioError("every stage needs at least one planned replica")
        check_standby(standby)
        self.backend, self.frontend, self.specs, self.start_timeout_s = backend, frontend, specs, start_timeout_s
        self.placement, self.warmup_requests = placement, warmup_requests
        self.serving_: dict[str, list[ContainerSpec]] = {stage: [] for stage in specs}
        self.events_: list[ReplicaEvent] = []
        self._starting: dict[str, list[ContainerSpec]] = {stage: [] for stage in specs}
        self.standby, self._standby = standby, {stage: [] for stage in specs}  # ready ones, paused
        self._closing = False
        self._cancelled: set[str] = set()
        self._next = {stage: len(s) for stage, s in specs.items()}
        self._ports = {spec.port for s in specs.values() for spec in s}
        self._workers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._cold: dict[str, int] = {stage: 0 for stage in specs}  # the stage's cold starts in progress
        self._no_cold_start = threading.Condition(self._lock)

    def start(self) -> None:
        """Start every planned replica and standby side by side and route to the planned ones; on any failure stop
        them all and raise."""
        spares = {stage: [self._new_spec(stage, pinned=False) for _ in range(standby_replicas(self.standby, len(s)))]
                  for stage, s in self.specs.items()}
        stages, everything, spare = zip(*[(stage, spec, group is spares) for group in (self.specs, spares)
                                          for stage, s in group.items() for spec in s])
        with ThreadPoolExecutor(max_workers=len(everything)) as pool:
            outcomes = list(zip(everything, pool.map(self._try_start, stages, everything, spare)))
        errors = [f"{spec.name}: {err}" for spec, err in outcomes if err is not None]
        if errors:
            try:
                self.backend.stop_all(spec.name for spec, err in outcomes if err is None)
            except ContainerError as err:
                errors.append(f"stopping those that started: {err}")
            raise ContainerError(f"the plan's replicas did not all start; {'; '.join(errors)}")
        self._standby = spares
        for stage, specs in self.specs.items():
            for spec in specs:
                self.frontend.add_replica(stage, spec.url)
            self.serving_[stage] = list(specs)
            self.events_.append(ReplicaEvent(0.0, stage, len(specs), "planned"))

    def scale(self, stage: str, replicas: int) -> None:
        """Move ``stage`` towards ``replicas`` (starts and stops happen in the background)."""
        if stage not in self.specs:
            raise ScenarioError(f"no stage {stage!r} among {', '.join(self.specs)}")
        with self._lock:
            self.events_.append(ReplicaEvent(self.frontend.clock(), stage, replicas, "asked"))
            starting = [s for s in self._starting[stage] if s.name not in self._cancelled]
            have = len(self.serving_[stage]) + len(starting)
            for added in range(replicas - have):
                spare = self._standby[stage][0] if self._standby[stage] else None
                try:
                    spec = self._new_spec(stage) if spare is None else replace(spare, cpuset=self._cores(spare))
                except PlanError as err:  # the cores are full: start what fits, say what did not
                    self.events_.append(ReplicaEvent(self.frontend.clock(), stage, have + added, "capped",
                                                     error=str(err)))
                    break
                self._starting[stage].append(spec)
                if spare is None:
                    self._cold[stage] += 1
                    self._spawn(self._grow, stage, spec)
                    continue
                self._standby[stage].pop(0)
                self._spawn(partial(self._grow, resume=True), stage, spec)
                self._spawn(self._fill, stage, self._new_spec(stage, pinned=False))
            for spec in list(reversed(starting))[: max(have - replicas, 0)]:
                self._cancelled.add(spec.name)
            for spec in self.serving_[stage][::-1][: max(have - replicas - len(starting), 0)]:
                self.serving_[stage].remove(spec)
                self._spawn(self._shrink, stage, spec)

    def close(self) -> None:
        """Wait for starts and stops in progress, take every replica out of the route, and stop all containers.

        Raises:
            ContainerError: a container did not stop (every other one was stopped all the same).
        """
        with self._lock:
            self._closing = True
            for specs in self._starting.values():
                self._cancelled.update(s.name for s in specs)
            self._no_cold_start.notify_all()
        for worker in list(self._workers):
            worker.join()
        for stage, specs in self.serving_.items():
            for spec in specs:
                self.frontend.remove_replica(stage, spec.url)
        groups = [*self._standby.values(), *self.serving_.values()]
        names = [spec.name for specs in groups for spec in specs]
        for specs in groups:
            specs.clear()
        self.backend.stop_all(names)

    def _try_start(self, stage: str, spec: ContainerSpec, spare: bool = False) -> str | None:
        """Start ``spec`` and warm it up; a ``spare`` (a standby) starts under its limit and is paused then.
        Why that failed (and what started was stopped), or None."""
        try:
            self.backend.start(spec, self.start_timeout_s, boost=not spare)
        except ContainerError as err:
            return str(err)
        try:
            self._warm_up(stage, spec)
            if spare:
                self.backend.pause(spec.name)
        except ContainerError as err:
            self.backend.stop(spec.name)
            return str(err)
        return None

    def _try_resume(self, spec: ContainerSpec) -> str | None:
        """Give a paused standby ``spec``'s cores and limit and thaw it; why that failed (and it was stopped), or None."""
        try:
            self.backend.resize(spec.name, spec.cpus, spec.cpuset)
            self.backend.resume(spec.name)
        except ContainerError as err:
            self.backend.stop(spec.name)
            return str(err)
        return None

    def _warm_up(self, stage: str, spec: ContainerSpec) -> None:
        """``warmup_requests`` requests of one item and of the stage's batch size, back to back."""
        queue = self.frontend.queues[stage]
        client = InferenceClient(spec.url, self.start_timeout_s)
        try:
            for k in sorted({1, queue.batch_size}):
                request = list(queue.inputs(k))
                for _ in range(self.warmup_requests):
                    client.infer(request)
        finally:
            client.close()

    def _new_spec(self, stage: str, pinned: bool = True) -> ContainerSpec:
        """The stage's next replica: its planned size, the next name and free port (caller holds the lock);
        ``pinned``: on the cores ``placement`` finds least committed (else the stage's first replica's).

        Raises:
            PlanError: ``placement``'s cores cannot hold another replica of the stage's size.
        """
        template = self.specs[stage][0]
        cpuset = self._cores(template) if pinned else template.cpuset
        port = max(self._ports) + 1
        while not port_free(template.host, port):
            port += 1
        self._ports.add(port)
        name = f"{template.name.rsplit('-', 1)[0]}-{self._next[stage]}"
        self._next[stage] += 1
        return replace(template, name=name, port=port, cpuset=cpuset)

    def _cores(self, template: ContainerSpec) -> tuple[int, ...] | None:
        """Cores for another replica of ``template``'s size (caller holds the lock); raises ``PlanError`` when full."""
        return self.placement.take(template.cpus or 1.0) if self.placement else template.cpuset

    def _release(self, spec: ContainerSpec) -> None:
        """``spec``'s cores are free again (caller holds the lock)."""
        if self.placement and spec.cpuset:
            self.placement.give_back(spec.cpuset, spec.cpus or 1.0)

    def _spawn(self, work: Callable[[str, ContainerSpec], None], stage: str, spec: ContainerSpec) -> None:
        thread = threading.Thread(target=work, args=(stage, spec), daemon=True, name=f"replica-{spec.name}")
        self._workers.append(thread)
        thread.start()

    def _grow(self, stage: str, spec: ContainerSpec, resume: bool = False) -> None:
        """Start one replica (``resume``: resume a standby); route to it unless it was cancelled meanwhile."""
        error = self._try_resume(spec) if resume else self._try_start(stage, spec)
        with self._lock:
            self._starting[stage].remove(spec)
            if not resume:
                self._cold[stage] -= 1
                self._no_cold_start.notify_all()
            if error is not None:
                self._release(spec)
                self.events_.append(ReplicaEvent(self.frontend.clock(), stage, len(self.serving_[stage]), "failed",
                                                 spec.name, error))
                return
            if spec.name not in self._cancelled:
                self.frontend.add_replica(stage, spec.url)
                self.serving_[stage].append(spec)
                self.events_.append(ReplicaEvent(self.frontend.clock(), stage, len(self.serving_[stage]), "serving",
                                                 spec.name))
                return
            self._release(spec)
        self.backend.stop(spec.name)

    def _fill(self, stage: str, spec: ContainerSpec) -> None:
        """Start a standby in the place of one resumed, once the stage has no cold start in progress, and keep it
        paused."""
        with self._lock:
            self._no_cold_start.wait_for(lambda: self._closing or not self._cold[stage])
            if self._closing:
                return
            self.events_.append(ReplicaEvent(self.frontend.clock(), stage, len(self._standby[stage]),
                                             "standby starting", spec.name))
        error = self._try_start(stage, spec, spare=True)
        with self._lock:
            if error is None and not self._closing:
                self._standby[stage].append(spec)
                self.events_.append(ReplicaEvent(self.frontend.clock(), stage, len(self._standby[stage]), "standby",
                                                 spec.name))
                return
            if error is not None:
                self.events_.append(ReplicaEvent(self.frontend.clock(), stage, len(self._standby[stage]),
                                                 "standby failed", spec.name, error))
                return
        self.backend.stop(spec.name)

    def _shrink(self, stage: str, spec: ContainerSpec) -> None:
        """Take one replica out of the route (its batch in hand finishes first), then stop it."""
        self.frontend.remove_replica(stage, spec.url)
        with self._lock:  # what serving saw; the stop below can take seconds
            out_of_route, left = self.frontend.clock(), len(self.serving_[stage])
        try:
            self.backend.stop(spec.name)
            error = None
        except ContainerError as err:
            error = f"stopping it failed: {err}"
        with self._lock:
            self._release(spec)
            self.events_.append(ReplicaEvent(out_of_route, stage, left, "removed", spec.name, error))


def port_free(host: str, port: int) -> bool:
    """Whether nothing listens on ``host:port`` now: a bind succeeds, with ``SO_REUSEADDR`` as servers bind
    (so the connections of a server stopped a moment ago, still in TIME_WAIT, do not count)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host or HOST, port))
        except OSError:
            return False
    return True


def group_specs(specs: Sequence[ContainerSpec], counts: dict[str, int]) -> dict[str, list[ContainerSpec]]:
    """``plan_specs``'s flat list (stage by stage, in order) grouped by stage; ``counts`` is replicas per stage."""
    grouped: dict[str, list[ContainerSpec]] = {}
    i = 0
    for stage, n in counts.items():
        grouped[stage] = list(specs[i:i + n])
        i += n
    return grouped

"""The live pipeline's front end: queries of a trace routed through the stages' batched queues, in real time.

It runs in the client process, as InferLine's did on Clipper: one ``StageQueue`` per stage
feeds that stage's replicas. Routing is the Estimator's, query for query: which stages a
query visits comes from ``Estimator.visits_`` (the same seeded draws the prediction used,
so prediction and measurement are over the same queries); a query enters a stage once
every visited parent is done with it, and is complete when every stage it visits is. Its
latency is completion minus arrival, arrival being when the trace said it was due (so a
late submission shows as latency, as in ``containers.load``).

A request that fails fails its queries: each is recorded failed, with the stage and error,
at the time of the failure, and goes no further. Nothing is lost: ``close`` reports the
queries still unfinished as failed too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from containers.errors import ScenarioError
from containers.planner.config import Config, check_config
from containers.planner.pipeline import Pipeline
from containers.planner.stagequeue import Batch, StageQueue
from containers.planner.trace import check_trace

UNFINISHED = "unfinished when the run ended"
Inputs = Callable[[int], Sequence[np.ndarray]]  # a stage's request arrays for a batch of k items


@dataclass(frozen=True)
class LiveQueries:
    """What became of every query of the trace.

    Attributes:
        arrival_s: when each was due, on the trace's clock.
        latency_ms: completion (or failure) minus arrival; NaN for a query that visits no stage.
        errors: per query, why it failed (``"<stage>: <error>"``), or None.
        batches: every request the dispatchers made, in the order their replies came.
    """

    arrival_s: np.ndarray = field(repr=False)
    latency_ms: np.ndarray = field(repr=False)
    errors: tuple[str | None, ...] = field(repr=False)
    batches: tuple[Batch, ...] = field(repr=False)

    @property
    def failed(self) -> np.ndarray:
        return np.array([e is not None for e in self.errors], dtype=bool)

    def summary(self, slo_ms: float) -> dict[str, float | int | None]:
        """p50, p99 and mean of the answered queries; the miss rate counts a failed query as a miss."""
        served = ~np.isnan(self.latency_ms)
        failed = int((served & self.failed).sum())
        ok = self.latency_ms[served & ~self.failed]
        stats = {f"p{q}_ms": round(float(np.percentile(ok, q)), 3) if ok.size else None for q in (50, 99)}
        return {**stats, "mean_ms": round(float(ok.mean()), 3) if ok.size else None,
                "miss_rate": round(float((ok > slo_ms).sum() + failed) / max(int(served.sum()), 1), 5),
                "slo_ms": slo_ms, "queries": int(served.sum()), "failed": failed}


class Frontend:
    """Routes the queries of one trace through a pipeline's live replicas.

    Args:
        pipeline: the stages and their parents.
        config: per stage, the batch size and batching timeout its queue uses (its replicas are URLs
            added with ``add_replica``).
        visits: stage -> which queries of the trace visit it (``Estimator.visits_``).
        inputs: stage -> ``inputs(k)``, the arrays of a request of k items.
        request_timeout_s: the most one inference request may take.
    """

    def __init__(self, pipeline: Pipeline, config: Config, visits: Mapping[str, np.ndarray],
                 inputs: Mapping[str, Inputs], request_timeout_s: float = 30.0) -> None:
        check_config(pipeline, config)
        n = {v.size for v in visits.values()}
        if set(visits) != {s.name for s in pipeline.stages} or len(n) != 1:
            raise ScenarioError(f"visits must give one mask of equal length per stage of {pipeline.name}")
        self.pipeline, self.visits = pipeline, {k: np.asarray(v, dtype=bool) for k, v in visits.items()}
        self.size = n.pop()
        self.children = {s.name: [c.name for c in pipeline.stages if s.name in c.parents] for s in pipeline.stages}
        # per join or child stage: how many of its parents each query visits and has not finished yet
        self._waiting: dict[str, np.ndarray] = {s.name: sum(self.visits[p].astype(int) for p in s.parents)
                                                for s in pipeline.stages if s.parents}
        self._ready = {name: np.full(self.size, np.nan) for name in self._waiting}  # latest visited parent's done
        self._left = sum(v.astype(int) for v in self.visits.values())
        self.queues = {s.name: StageQueue(s.name, config[s.name].batch_size, config[s.name].batch_timeout_ms / 1e3,
                                          inputs[s.name], self.clock, self._on_batch,
                                          request_timeout_s) for s in pipeline.stages}
        self._arrival = np.full(self.size, np.nan)
        self._finish = np.full(self.size, np.nan)
        self._errors: list[str | None] = [None] * self.size
        self._batches: list[Batch] = []
        self._open = 0  # submitted, visiting a stage, not yet finished
        self._lock = threading.Condition()
        self._t0 = time.monotonic()
        self.started = threading.Event()  # set once ``drive`` has started the trace's clock
        self.submitted_ = 0

    def clock(self) -> float:
        """Seconds on the trace's clock: 0 is when ``drive`` started (before that, when the front end was made)."""
        return time.monotonic() - self._t0

    def add_replica(self, stage: str, url: str) -> None:
        self._queue(stage).add_replica(url)

    def remove_replica(self, stage: str, url: str) -> None:
        """Stop routing ``stage``'s queries to ``url``, once its batch in hand is answered."""
        self._queue(stage).remove_replica(url)

    def replicas(self, stage: str) -> tuple[str, ...]:
        return self._queue(stage).replicas

    def drive(self, arrivals: np.ndarray) -> None:
        """Submit query i at ``arrivals[i]`` seconds (open loop, in real time); returns after the last is submitted.

        Raises:
            ScenarioError: ``arrivals`` is not a sorted trace of as many queries as ``visits`` has.
        """
        arrivals = check_trace(arrivals)
        if arrivals.size != self.size:
            raise ScenarioError(f"the trace has {arrivals.size} queries; the routing draws are for {self.size}")
        self._t0 = time.monotonic()
        self.started.set()
        for i, due in enumerate(arrivals.tolist()):
            time.sleep(max(due - self.clock(), 0.0))
            self._submit(i, due)

    def drain(self, timeout_s: float) -> bool:
        """Wait until every submitted query finished, at most ``timeout_s``; whether they all did."""
        with self._lock:
            return self._lock.wait_for(lambda: self._open == 0, timeout_s)

    def close(self) -> LiveQueries:
        """Stop every dispatcher (each after its batch in hand) and account for every query of the trace.

        A query submitted but not finished is failed as ``UNFINISHED``; one never submitted (the
        run was cut short) is left out, as its arrival never came.
        """
        for queue in self.queues.values():
            queue.close()
        with self._lock:
            now = self.clock()
            for i in range(self.submitted_):
                if self._left[i] > 0 and self._errors[i] is None:
                    self._fail(i, UNFINISHED, now)
            n = self.submitted_
            return LiveQueries(self._arrival[:n].copy(), (self._finish[:n] - self._arrival[:n]) * 1e3,
                               tuple(self._errors[:n]), tuple(self._batches))

    def _queue(self, stage: str) -> StageQueue:
        if stage not in self.queues:
            raise ScenarioError(f"pipeline {self.pipeline.name} has no stage {stage!r}")
        return self.queues[stage]

    def _submit(self, i: int, due: float) -> None:
        with self._lock:
            self._arrival[i] = due
            self.submitted_ = i + 1
            if self._left[i] == 0:
                return  # it visits no stage: no latency, as in the Estimator
            self._open += 1
        for stage in self.pipeline.stages:
            if not stage.parents and self.visits[stage.name][i]:
                self.queues[stage.name].put(i, due)

    def _on_batch(self, batch: Batch) -> None:
        """A dispatcher's batch came back: fail its queries, or move each on to the children it is ready for."""
        ready: list[tuple[str, int, float]] = []
        with self._lock:
            self._batches.append(batch)
            for q in batch.queries:
                if self._errors[q] is not None:
                    continue  # failed at another stage already: it goes no further
                if batch.error is not None:
                    self._fail(q, f"{batch.stage}: {batch.error}", batch.done_s)
                    continue
                self._left[q] -= 1
                self._finish[q] = np.fmax(self._finish[q], batch.done_s)  # replies may be handled out of order
                for child in self.children[batch.stage]:
                    if self.visits[child][q]:
                        self._waiting[child][q] -= 1
                        self._ready[child][q] = np.fmax(self._ready[child][q], batch.done_s)
                        if self._waiting[child][q] == 0:
                            ready.append((child, q, float(self._ready[child][q])))
                if self._left[q] == 0:
                    self._open -= 1
            self._lock.notify_all()
        for child, q, at_s in ready:
            self.queues[child].put(q, at_s)

    def _fail(self, q: int, error: str, at_s: float) -> None:
        """Record query ``q`` failed at ``at_s`` (caller holds the lock)."""
        self._errors[q] = error
        self._finish[q] = at_s
        self._open -= 1
        self._lock.notify_all()


def stage_inputs(pipeline: Pipeline, config: Config) -> dict[str, Inputs]:
    """Per stage, ``inputs(k)``: the first k rows of ``request_inputs(artifact, batch_size)``.

    Made once per stage, before any replica starts, which opens (and so checks) every
    artifact; a batch of k is then a view of the first k rows, so no request waits for
    arrays to be made (their values do not change a model's time).
    """
    from containers.qoe.run import request_inputs

    return {s.name: partial(_rows, request_inputs(s.artifact, config[s.name].batch_size)) for s in pipeline.stages}


def _rows(arrays: Sequence[np.ndarray], k: int) -> list[np.ndarray]:
    return [a[:k] for a in arrays]

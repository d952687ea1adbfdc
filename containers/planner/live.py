"""Applying a plan live: its replicas started on a backend, a trace driven through them, the Tuner optionally scaling.

``apply_plan`` checks everything it can before it starts anything (the plan against the
pipeline, every container spec, the ports, the artifacts, the trace), then starts the
plan's replicas, routes the trace's queries through the ``Frontend`` in real time while
``LiveTuner`` (if asked for) applies the Tuner's replica counts, waits for the last queries,
stops every container, and writes ``live.json`` and ``live.png`` into the run folder. The
record holds what was measured next to what the Estimator predicts for the same trace,
plan and routing draws, so the two can be compared query set for query set.
"""

from __future__ import annotations

import gc
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from results.atomic import write_atomically
from containers.backends.base import ContainerBackend
from containers.errors import ScenarioError
from containers.planner.batchqueue import ReplicaChange
from containers.planner.config import check_standby
from containers.planner.deploy_plan import CorePlacement, plan_specs
from containers.planner.estimator import Estimate, Estimator
from containers.planner.frontend import Frontend, LiveQueries, stage_inputs
from containers.planner.pipeline import Pipeline
from containers.planner.plan import Plan
from containers.planner.replicas import ReplicaEvent, ReplicaSet, group_specs, port_free
from containers.planner.trace import check_trace
from containers.planner.tuner import DRAIN, INTERVAL_S, Tuner, simulate_with_tuner

SCHEMA_VERSION = 1
RECORD, PLOT = "live.json", "live.png"
BASE_PORT = 18700
DRAIN_S = 30.0  # after the last arrival, how long queries in flight may take before they count as failed
FRONTEND_MARGIN = 0.1  # cores this process may use past the quota left beside it before a run says so


class LiveTuner:
    """Every ``interval_s`` of the trace's clock, the Tuner looks at the arrivals so far; its counts go to the replicas.

    Args:
        tuner: the policy (``Tuner.for_plan``): it only answers how many replicas.
        frontend: whose clock and submitted arrivals it observes.
        replicas: what carries out the counts.
        arrivals: the trace being driven (only the submitted part is shown to the Tuner).
    """

    def __init__(self, tuner: Tuner, frontend: Frontend, replicas: ReplicaSet, arrivals: np.ndarray,
                 interval_s: float = INTERVAL_S) -> None:
        self.tuner, self.frontend, self.replicas, self.arrivals = tuner, frontend, replicas, arrivals
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="live-tuner")

    def start(self) -> LiveTuner:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self.frontend.started.wait(0.1):
            if self._stop.is_set():
                return
        tick = self.interval_s
        while not self._stop.wait(max(tick - self.frontend.clock(), 0.0)):
            now = self.frontend.clock()
            for stage, replicas in self.tuner.observe(self.arrivals[: self.frontend.submitted_], now).items():
                self.replicas.scale(stage, replicas)
            tick += self.interval_s


def apply_plan(plan: Plan, pipeline: Pipeline, arrivals: np.ndarray, out_dir: Path,
               backend: str | ContainerBackend = "auto", tuner: bool = False, seed: int = 0,
               base_port: int = BASE_PORT, duration_s: float | None = None, drain_s: float = DRAIN_S,
               cores: Sequence[int] | None = None, tuner_drain: float = DRAIN, standby: float = 0.0,
               on_event: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """Serve ``plan`` live over ``arrivals`` and return (and write into ``out_dir``) the run's record.

    Args:
        seed: the routing draws' (as the Estimator's): which queries visit which stage.
        base_port: the plan's replicas listen on consecutive ports from here; the Tuner's on the next free ones.
        duration_s: only the arrivals before this many seconds are sent.
        cores: the cores the replicas are pinned to (``CorePlacement``); default: every core this process may use.
        tuner_drain: with the Tuner, how many times its step again each scale-up adds (``Tuner``).
        standby: warm, paused replicas each stage keeps for the Tuner's scale-ups, per planned replica (``ReplicaSet``).

    Raises:
        PlanError: the plan is not for this pipeline or does not fit it, a stage is not on CPU, or standby
            replicas are asked for without the Tuner.
        ScenarioError: a container spec, port or trace that cannot be used.
        ArtifactError: a stage's artifact does not open. These three are raised before any container starts.
        ContainerError: a replica did not start (those that did are stopped again), or did not stop at the end.
    """
    from containers.backends import check_spec, create_backend

    arrivals = check_trace(arrivals)
    if duration_s is not None:
        arrivals = check_trace(arrivals[arrivals < duration_s])
    placement = CorePlacement(cores)
    specs = plan_specs(plan, pipeline, base_port, placement)
    shared = shared_cores(placement)
    for spec in specs:
        check_spec(spec)
        if not port_free(spec.host, spec.port):
            raise ScenarioError(f"port {spec.port} (for {spec.name}) is in use; give another base port")
    check_standby(standby, tuner)
    estimator = Estimator(pipeline, arrivals, seed=seed, standby=standby)
    policy = Tuner.for_plan(plan, estimator, drain=tuner_drain) if tuner else None  # a bad setting fails before starts
    frontend = Frontend(pipeline, plan.stages, estimator.visits_, stage_inputs(pipeline, plan.stages))
    out_dir.mkdir(parents=True, exist_ok=True)
    engine = create_backend(backend)
    replicas = ReplicaSet(engine, frontend, group_specs(specs, {s.name: plan.stages[s.name].replicas
                                                                for s in pipeline.stages}), placement,
                          standby=standby)
    on_event(f"starting {len(specs)} replicas on the {engine.kind} backend")
    replicas.start()
    live_tuner = LiveTuner(policy, frontend, replicas, arrivals) if policy is not None else None
    on_event(f"driving {arrivals.size} queries over {float(arrivals[-1]):.1f} s" + (" with the Tuner" if tuner else ""))
    started, cpu_started = time.monotonic(), time.process_time()
    try:
        if live_tuner is not None:
            live_tuner.start()
        with _no_full_collections():
            frontend.drive(arrivals)
            drained = frontend.drain(drain_s)
        if not drained:
            on_event(f"queries still unfinished {drain_s:g} s after the last arrival: they count as failed")
    finally:
        if live_tuner is not None:
            live_tuner.stop()
        try:
            replicas.close()
        finally:  # the dispatchers stop even when a container did not
            queries = frontend.close()
    wall_s = time.monotonic() - started
    record = live_record(plan, estimator, queries, replicas.events_, engine.kind, tuner, wall_s, tuner_drain)
    used, left = (time.process_time() - cpu_started) / wall_s, sum(shared.values())
    record["frontend"] = {"cores_used": round(used, 3), "shared_cores": sorted(shared),
                          "quota_left_there": round(left, 3)}
    if shared and used > left + FRONTEND_MARGIN:
        on_event(f"the front end and load generator used {used:.2f} cores, on cores "
                 f"where the plan's replicas left {left:g} of quota: they took CPU the replicas' "
                 "profiles had to themselves; replicas pinned to cores of their own (--cores) keep them apart")
    write_atomically(out_dir / RECORD, json.dumps(record, indent=2) + "\n")
    from containers.planner.liveplot import plot_live

    plot_live(record, out_dir / PLOT)
    on_event(f"done: p99 {record['measured']['p99_ms']} ms measured, {record[record['compared_with']]['p99_ms']} ms "
             f"predicted; {record['measured']['failed']} of {record['measured']['queries']} queries failed")
    return record


def shared_cores(placement: CorePlacement) -> dict[int, float]:
    """The cores this process (front end, load generator, Tuner) shares with the replicas, and the quota left on each.

    Each replica was profiled alone on its cores; the Estimator assumes it still has them, so
    what this process uses beyond the quota left there is time taken from the replicas.
    """
    mine = os.sched_getaffinity(0)
    return {c: max(0.0, 1.0 - held) for c, held in placement.committed.items() if held > 0 and c in mine}


@contextmanager
def _no_full_collections() -> Iterator[None]:
    """Keep the garbage collector off what existed before the run while the trace is driven.

    A full collection in a process that has imported torch and TVM walks ~240,000 objects for
    0.1-0.35 s, holding the interpreter: every dispatcher stalls at once and the queries behind
    them queue (seen live: 25 queries delayed by up to 360 ms). Frozen objects are skipped;
    what the run itself allocates is still collected.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def live_record(plan: Plan, estimator: Estimator, queries: LiveQueries, events: list[ReplicaEvent],
                backend: str, tuner: bool, wall_s: float, tuner_drain: float = DRAIN) -> dict[str, Any]:
    """The run as JSON: per query, per batch stage, the replica changes, and measured next to predicted.

    ``predicted`` is the Estimator over the same trace and draws with the plan's replicas fixed
    (per query of the trace in ``queries.predicted_ms``, so runs can be pooled);
    with the Tuner, ``predicted_with_tuner`` lets the simulated Tuner scale, and
    ``predicted_live_schedule`` replays the replica counts the live Tuner actually asked for,
    each new replica serving the Estimator's start-up after the ask (``modelled_startup_s``, per
    stage), and ``predicted_as_served`` the counts that actually served, when they did
    (``startup_s``: how long each new replica took, ask to route): it holds the Estimator to
    what was served, whatever the start-ups were.
    ``p99_error`` is measured over predicted p99 minus one, against the prediction named by
    ``compared_with`` (the as-served one when the Tuner ran).
    """
    measured = queries.summary(plan.slo_ms)
    estimate = estimator.estimate(plan.stages, plan.slo_ms)
    predicted = _latencies(estimate)
    record: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION, "pipeline": plan.pipeline, "method": plan.method, "slo_ms": plan.slo_ms,
        "backend": backend, "tuner": tuner, "seed": estimator.seed, "wall_s": round(wall_s, 2),
        "trace": {"queries": int(estimator.arrivals.size), "sent": int(queries.arrival_s.size),
                  "seconds": round(float(estimator.arrivals[-1]), 3)},
        "plan": {name: asdict(cfg) for name, cfg in plan.stages.items()},
        "measured": measured, "predicted": predicted,
    }
    record["compared_with"] = "predicted"
    if tuner:
        run = simulate_with_tuner(estimator.pipeline, plan, estimator.arrivals, seed=estimator.seed,
                                  startup_s=estimator.startup_s, drain=tuner_drain, standby=estimator.standby)
        record["tuner_drain"], record["standby"] = tuner_drain, estimator.standby
        record["predicted_with_tuner"] = {**_latencies(run.estimate), "replica_changes": len(run.schedule)}
        schedule = [ReplicaChange(e.t_s, e.stage, e.replicas) for e in events if e.event == "asked"]
        record["predicted_live_schedule"] = _latencies(estimator.estimate(plan.stages, plan.slo_ms, schedule))
        record["predicted_as_served"] = _latencies(estimator.estimate(plan.stages, plan.slo_ms, served_schedule(events),
                                                                      startup_s=0.0))
        record["startup_s"] = start_ups(events)
        record["modelled_startup_s"] = estimator.startups(plan.stages)
        record["compared_with"] = "predicted_as_served"
    if measured["p99_ms"] is not None:
        record["p99_error"] = round(measured["p99_ms"] / record[record["compared_with"]]["p99_ms"] - 1, 4)
    record["replica_changes"] = [asdict(e) for e in events]
    record["batches"] = _batch_summary(queries, list(plan.stages))
    record["errors"] = dict(Counter(e for e in queries.errors if e is not None).most_common(5))
    record["queries"] = {"arrival_s": [round(t, 6) for t in queries.arrival_s.tolist()],
                         "latency_ms": _ms_list(queries.latency_ms), "failed": queries.failed.tolist(),
                         "predicted_ms": _ms_list(estimate.latencies_ms)}
    return record


def served_schedule(events: Sequence[ReplicaEvent]) -> list[ReplicaChange]:
    """The replica counts that served, as they changed: for an Estimator whose new replicas serve at once."""
    return [ReplicaChange(e.t_s, e.stage, e.replicas) for e in events if e.event in ("serving", "removed")]


def start_ups(events: Sequence[ReplicaEvent]) -> dict[str, list[float]]:
    """Per stage, how long each replica the Tuner added took to serve: from the ask it answered to its route.

    An ask for more replicas than a stage serves and is starting starts one per count above;
    an ask for fewer cancels the newest starts first (``ReplicaSet.scale``). Starts are matched
    to asks in order: the k-th replica to serve (or fail) answers the k-th pending ask; an ask
    the cores could not hold (``capped``) leaves only the starts that fit pending.
    """
    asked: dict[str, list[float]] = {}
    out: dict[str, list[float]] = {}
    have: dict[str, int] = {}
    for e in events:
        if e.event == "planned":
            have[e.stage] = e.replicas
        elif e.event == "asked":
            queue = asked.setdefault(e.stage, [])
            wanted = e.replicas - have.get(e.stage, 0) - len(queue)
            if wanted < 0:  # fewer: the newest starts are cancelled, then replicas serving beyond the count leave
                del queue[max(0, len(queue) + wanted):]
                have[e.stage] = min(have.get(e.stage, 0), e.replicas)
            queue.extend([e.t_s] * max(wanted, 0))
        elif e.event == "capped" and asked.get(e.stage):  # what the cores could not hold never starts
            del asked[e.stage][max(0, e.replicas - have.get(e.stage, 0)):]
        elif e.event in ("serving", "failed") and asked.get(e.stage):
            at = asked[e.stage].pop(0)
            if e.event == "serving":
                out.setdefault(e.stage, []).append(round(e.t_s - at, 3))
            have[e.stage] = e.replicas
        elif e.event == "removed":
            have[e.stage] = e.replicas
    return out


def _ms_list(latencies_ms: np.ndarray) -> list[float | None]:
    """Per-query latencies as JSON: to the microsecond, None for a query with none (NaN)."""
    return [None if np.isnan(v) else round(v, 3) for v in latencies_ms.tolist()]


def _latencies(estimate: Estimate) -> dict[str, float]:
    """What a prediction is compared on: p50, p99, mean and miss rate."""
    return {k: round(v, 5) for k, v in estimate.summary().items() if k in ("p50_ms", "p99_ms", "mean_ms", "miss_rate")}


def _batch_summary(queries: LiveQueries, stages: list[str]) -> dict[str, dict[str, float | int]]:
    """Per stage: requests made, how many failed, the batch sizes they carried, and where their time went.

    ``request_ms`` is send to reply (the replica's service time as the front end sees it, to
    compare with the profile), ``server_ms`` the part the replica's server counted itself,
    and ``wait_ms`` the oldest query's wait in the stage's queue.
    """
    out: dict[str, dict[str, float | int]] = {}
    for stage in stages:
        batches = [b for b in queries.batches if b.stage == stage]
        sizes = [len(b.queries) for b in batches]
        out[stage] = {"requests": len(sizes), "failed": sum(b.error is not None for b in batches),
                      "mean_size": round(float(np.mean(sizes)), 3) if sizes else 0, "max_size": max(sizes, default=0)}
        answered = [b for b in batches if b.error is None]
        for name, ms in (("request_ms", [(b.done_s - b.sent_s) * 1e3 for b in answered]),
                         ("server_ms", [b.server_ms for b in answered if b.server_ms is not None]),
                         ("wait_ms", [(b.sent_s - b.oldest_ready_s) * 1e3 for b in answered])):
            if ms:
                out[stage][name] = {f"p{q}": round(float(np.percentile(ms, q)), 3) for q in (50, 99)}
    return out

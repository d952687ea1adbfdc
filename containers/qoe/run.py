"""Run a QoE scenario end to end: containers join on schedule, clients load them, the manager holds targets.

The run leaves ``qoe.json`` (scenario, manager timeline, per-container client windows,
summary figures) and ``timeline.png`` in the run folder, each written to a temporary file
and renamed; ``status.json`` is rewritten after every iteration while it runs.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from results.atomic import write_atomically
from containers.backends.base import ContainerBackend, ContainerSpec
from containers.interrupts import sigterm_as_interrupt
from containers.load import NOT_SENT, LoadClient, RequestRecord, join_times
from containers.qoe.algorithm import create_policy
from containers.qoe.control import ControlServer, write_status
from containers.qoe.listener import create_listener
from containers.qoe.manager import QoeManager
from containers.qoe.monitors import ApplicationMonitor
from containers.scenario import ContainerPlan, Scenario

WINDOW_S = 5.0
RECORD = "qoe.json"


@dataclass
class RunEvents:
    """What a person watching sees; the CLI renders it, tests leave it silent."""

    on_event: Callable[[str], None] = lambda text: None
    on_iteration: Callable[[dict[str, Any]], None] = lambda status: None


def run_scenario(scenario: Scenario, run_dir: Path, events: RunEvents | None = None,
                 backend: ContainerBackend | None = None) -> dict[str, Any]:
    """Run ``scenario`` for its duration on ``backend`` (default: the scenario's) and return its record.

    Ctrl-C, or SIGTERM when it runs in the main thread, ends the run early as its end would: the containers
    it started are stopped (local servers run in sessions of their own and would outlive it, holding their
    ports) and the record is written.
    """
    from containers.backends import create_backend

    events = events or RunEvents()
    backend = backend or create_backend(scenario.backend)
    manager = QoeManager(backend, create_policy(scenario.policy, scenario.alpha, scenario.beta),
                         create_listener(scenario.listener, scenario.interval_s, scenario.alpha), alpha=scenario.alpha,
                         on_exit=scenario.on_exit, monitor=ApplicationMonitor(statistic=scenario.statistic))
    control = ControlServer(manager.analyst, manager.status, manager.wake.set).start()
    run_dir.mkdir(parents=True, exist_ok=True)
    joins = sorted(zip(join_times(scenario.schedule.kind, len(scenario.containers), scenario.schedule.interval_s,
                                  scenario.schedule.window_s, scenario.schedule.seed), scenario.containers),
                   key=lambda j: j[0])
    loads: dict[str, LoadClient] = {}
    joined_at: dict[str, float] = {}
    started = time.monotonic()
    interrupted = False
    with sigterm_as_interrupt():  # as Ctrl-C: the containers are stopped, the record written
        try:
            next_step = 0.0
            while (now := time.monotonic() - started) < scenario.duration_s:
                due = []
                while joins and joins[0][0] <= now:
                    due.append(joins.pop(0)[1])
                if due:
                    _join(manager, scenario, due, events, now)
                    for plan in due:
                        joined_at[plan.name] = time.monotonic() - started
                        if not plan.load.external:
                            inputs = request_inputs(plan.artifact, plan.batch)
                            loads[plan.name] = LoadClient([_spec(plan, scenario).url], inputs, plan.load.arrivals(),
                                                          plan.load.concurrency, plan.load.think_s,
                                                          seed=len(loads)).start()
                    next_step = min(next_step, time.monotonic() - started + manager.listener.interval_s)
                if now >= next_step and manager.workers.pool:
                    wait = manager.step()
                    next_step = time.monotonic() - started + wait
                    status = {**manager.status(), "pid": os.getpid(), "control_url": control.url,
                              "scenario": scenario.name}
                    write_status(run_dir, status)
                    events.on_iteration(status)
                step_at = next_step if manager.workers.pool else math.inf  # an empty pool waits for a join or the end
                until = min(step_at, joins[0][0] if joins else scenario.duration_s, scenario.duration_s)
                if manager.wake.wait(max(until - (time.monotonic() - started), 0.0)):
                    manager.wake.clear()
                    next_step = min(next_step, time.monotonic() - started + 0.5)  # a target changed: look again soon
        except KeyboardInterrupt:
            interrupted = True
            events.on_event("interrupted: stopping the containers")
        finally:
            records = {name: load.stop() for name, load in loads.items()}
            control.stop()
            final = manager.status()
            backend.close()
    record = _record(scenario, manager, final, records, joined_at, time.monotonic() - started)
    record["interrupted"] = interrupted  # cut short before its duration (a serve without one ends so)
    write_atomically(run_dir / RECORD, json.dumps(record, indent=2, default=str))
    from containers.qoe.timeline import plot_timeline

    plot_timeline(record, run_dir / "timeline.png")
    events.on_event(f"done: {record['summary']['satisfied_final']} of {len(scenario.containers)} containers satisfied")
    return record


def _spec(plan: ContainerPlan, scenario: Scenario) -> ContainerSpec:
    port = scenario.base_port + scenario.containers.index(plan)
    return ContainerSpec(plan.name, plan.artifact, port, plan.threads, plan.cpus, plan.cpuset)


def _join(manager: QoeManager, scenario: Scenario, plans: list[ContainerPlan], events: RunEvents, now: float) -> None:
    """Start the containers due now side by side (a burst arrives at once, not one start after another)."""
    for plan in plans:
        events.on_event(f"{now:6.1f}s  {plan.name} joins (target {plan.target_ms} ms)")
    with ThreadPoolExecutor(max_workers=len(plans)) as pool:
        for done in [pool.submit(manager.join, _spec(p, scenario), p.target_ms) for p in plans]:
            done.result()


def request_inputs(artifact: Path, batch: int) -> list[np.ndarray]:
    """Seeded random inputs of the artifact's shapes at ``batch`` items per request."""
    rng = np.random.default_rng(0)
    return [rng.standard_normal((batch, *shape)).astype(dtype) for shape, dtype in _input_spec(Path(artifact))]


@lru_cache(maxsize=64)
def _input_spec(artifact: Path) -> tuple[tuple[tuple[int, ...], str], ...]:
    """Per model input, its shape without the batch axis and its dtype: the artifact is hashed once, not per call."""
    from results.artifact import open_artifact

    return tuple((tuple(s["shape"][1:]), s["dtype"]) for s in open_artifact(artifact).manifest["model"]["inputs"])


def client_windows(records: list[RequestRecord], offset_s: float, window_s: float = WINDOW_S) -> list[dict[str, Any]]:
    """Per window of the run: requests, errors, and the mean server time and client latency of those answered."""
    rows: dict[int, list[RequestRecord]] = {}
    for r in records:
        rows.setdefault(int((r.sent_at + offset_s) // window_s), []).append(r)
    out = []
    for w in sorted(rows):
        ok = [r for r in rows[w] if r.ok]
        out.append({"t": w * window_s, "requests": len(rows[w]), "errors": len(rows[w]) - len(ok),
                    "server_ms": float(np.mean([r.server_ms for r in ok if r.server_ms is not None])) if ok else None,
                    "client_ms": float(np.mean([r.latency_s for r in ok]) * 1e3) if ok else None})
    return out


def summarize(timeline: list[dict[str, Any]], last_join_s: float, duration_s: float) -> dict[str, Any]:
    """S over time, when it settled after the last arrival, and how often the manager acted after that."""
    counted = [t for t in timeline if t["counts"]]
    after = [t for t in counted if t["t"] >= last_join_s]
    if not after:
        return {"satisfied_final": 0, "converged_after_iterations": None}
    tail = after[-max(len(after) // 4, 1):]
    settled = min(t["counts"]["S"] for t in tail)
    first = next(i for i in range(len(after)) if all(t["counts"]["S"] >= settled for t in after[i:]))
    converged_t = after[first]["t"]
    late = after[first:]
    minutes = max((duration_s - converged_t) / 60, 1e-9)
    return {
        "satisfied_final": settled,
        "satisfied_mean": round(float(np.mean([t["counts"]["S"] for t in after])), 2),
        "converged_after_iterations": first, "converged_at_s": converged_t,
        "iterations_after_converged_per_min": round(len(late) / minutes, 2),
        "limit_changes_after_converged_per_min": round(sum(t["changes"] for t in late) / minutes, 2),
        "quality_sums_final": tail[-1]["quality_sums"],
    }


def satisfied_by_window(windows: dict[str, list[dict[str, Any]]], targets: dict[str, float | None],
                        alpha: float) -> list[list[float]]:
    """[window start, containers in S] per client window: the same yardstick for every policy and listener.

    A container counts as satisfied in a window when the mean server time of the requests it
    served there is within alpha of its target, as Algorithm 1 classifies it.
    """
    by_t: dict[float, int] = {}
    for name, rows in windows.items():
        target = targets.get(name)
        for row in rows:
            by_t.setdefault(row["t"], 0)
            if target and row["server_ms"] is not None and abs(target - row["server_ms"]) <= alpha * target:
                by_t[row["t"]] += 1
    return [[t, by_t[t]] for t in sorted(by_t)]


def late_mean(series: list[list[float]], start_s: float, end_s: float) -> float | None:
    """Mean of a [t, value] series over the second half of [start_s, end_s]: after things had time to settle."""
    half = start_s + (end_s - start_s) / 2
    values = [v for t, v in series if half <= t and t + WINDOW_S <= end_s]
    return round(float(np.mean(values)), 2) if values else None


def _request_counts(records: list[RequestRecord]) -> dict[str, Any]:
    """Sent, answered and failed requests, and the arrivals still queued at the end (never sent)."""
    sent = [r for r in records if r.error != NOT_SENT]
    return {"sent": len(sent), "answered": sum(r.ok for r in sent), "failed": sum(not r.ok for r in sent),
            "not_sent": len(records) - len(sent), "errors": sorted({r.error for r in sent if r.error})[:5]}


def _record(scenario: Scenario, manager: QoeManager, final: dict[str, Any], records: dict[str, list[RequestRecord]],
            joined_at: dict[str, float], wall_s: float) -> dict[str, Any]:
    windows = {name: client_windows(rs, joined_at[name]) for name, rs in records.items()}
    satisfied = satisfied_by_window(windows, {c.name: manager.analyst.target(c.name) for c in scenario.containers},
                                    scenario.alpha)
    last_join = max(joined_at.values(), default=0.0)
    requests = {name: _request_counts(rs) for name, rs in records.items()}
    return {
        "scenario": asdict(scenario),
        "wall_s": round(wall_s, 1), "joined_at": joined_at, "status": final, "timeline": manager.timeline,
        "windows": windows, "requests": requests,
        "summary": {**summarize(manager.timeline, last_join, wall_s), "satisfied_by_window": satisfied,
                    "satisfied_late_mean": late_mean(satisfied, last_join, wall_s),
                    "iterations": manager.iterations, "limit_changes": manager.executor.updates,
                    "manager_cpu_s": final["manager_cpu_s"], "manager_cpu_share": final["manager_cpu_share"]},
    }

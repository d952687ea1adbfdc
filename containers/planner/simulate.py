"""Replaying a plan over a trace: what the Estimator predicts for it, with or without the Tuner."""

from __future__ import annotations

from typing import Any

import numpy as np

from containers.errors import PlanError
from containers.planner.config import check_config, check_standby
from containers.planner.estimator import Estimator
from containers.planner.pipeline import Pipeline
from containers.planner.plan import Plan
from containers.planner.tuner import DRAIN, INTERVAL_S, simulate_with_tuner


def simulate_plan(pipeline: Pipeline, plan: Plan, arrivals: np.ndarray, tuner: bool = False, seed: int = 0,
                  startup_s: float | None = None, interval_s: float = INTERVAL_S, drain: float = DRAIN,
                  standby: float = 0.0) -> dict[str, Any]:
    """Latency, SLO misses and cost of ``plan`` over ``arrivals``, as a JSON-ready record.

    Without the Tuner the replicas stay as planned and the cost is the plan's; with it, the
    cost is what the replicas it asks for would be billed over the trace, each serving
    ``startup_s`` after it looks (every ``interval_s``) and asks (None: as each stage's container
    start was profiled, plus the warm-up before it is routed to): on an unforeseen rise most of
    its misses wait on that start-up, which differs by backend (``plan apply`` measures it).
    ``drain``: how many times its step again each of the Tuner's scale-ups adds (``Tuner``); ``standby``:
    warm, paused replicas per planned replica, that serve a scale-up at once (``simulate_with_tuner``).

    Raises:
        PlanError: the plan was made for another pipeline, or does not fit this one's profiles.
    """
    if plan.pipeline != pipeline.name:
        raise PlanError(f"the plan is for pipeline {plan.pipeline!r}, not {pipeline.name!r}")
    check_standby(standby, tuner)
    check_config(pipeline, plan.stages)
    if tuner:
        run = simulate_with_tuner(pipeline, plan, arrivals, seed=seed, startup_s=startup_s, interval_s=interval_s,
                                  drain=drain, standby=standby)
        estimate, cost_per_hour, changes, startups = run.estimate, run.cost_per_hour, len(run.schedule), run.startup_s
        peak = {name: max([cfg.replicas] + [c.replicas for c in run.schedule if c.stage == name])
                for name, cfg in plan.stages.items()}
    else:
        estimate = Estimator(pipeline, arrivals, seed=seed).estimate(plan.stages, plan.slo_ms)
        cost_per_hour, changes, peak = plan.cost_per_hour, 0, {n: c.replicas for n, c in plan.stages.items()}
    return {"pipeline": plan.pipeline, "method": plan.method, "tuner": tuner,
            **({"startup_s": startups, "tuner_interval_s": interval_s, "tuner_drain": drain,
                                 "standby": standby} if tuner else {}),
            **estimate.summary(),
            "cost_per_hour": round(cost_per_hour, 6), "planned_cost_per_hour": round(plan.cost_per_hour, 6),
            "replica_changes": changes, "peak_replicas": peak, "trace_seconds": round(float(np.ptp(arrivals)), 3)}

"""The coarse-grained baselines of InferLine's evaluation: the pipeline provisioned as one black box.

How pipelines are tuned when each model is a separate micro-service and the pipeline is
only seen end to end: one hardware type for everything, one batch size (the largest whose
end-to-end p99, profiled with one batch in flight, meets the SLO), and whole-pipeline
replicas for a rate: the trace's mean (CG-Mean) or its peak (CG-Peak), the most arrivals in
any window as long as the SLO (``trace.peak_rate``), the timescale on which a burst decides
whether queries miss it. Every stage gets that many replicas. The result is evaluated by the
same Estimator as the Planner's, so costs and miss rates compare.
"""

from __future__ import annotations

import math

import numpy as np

from containers.errors import PlanError
from containers.planner.config import StageConfig
from containers.planner.estimator import SHAPE_LEVELS, Estimator


def coarse_grained(estimator: Estimator, slo_ms: float, rate_per_s: float) -> dict[str, StageConfig]:
    """One hardware, one batch size and one replica count for every stage, provisioned for ``rate_per_s``.

    The hardware is the cheapest (summed over stages) on which the black box's batch-1 p99
    meets the SLO; the batch the largest profiled size on it whose black-box p99 still does;
    the replicas ``ceil(rate / black-box throughput)``, the throughput from mean service times.

    Raises:
        PlanError: no hardware is profiled for every stage, or none meets the SLO even at batch 1.
    """
    pipeline = estimator.pipeline
    common = set.intersection(*(set(s.hardware) for s in pipeline.stages))
    if not common:
        raise PlanError(f"pipeline {pipeline.name}: no hardware is profiled for every stage, so it cannot be "
                        "provisioned as one black box")

    def black_box_ms(hardware: str, batch: int) -> float:
        return pipeline.longest_path({s.name: s.profile.service_ms(hardware, batch) for s in pipeline.stages})[0]

    fits = [h for h in common if profile_black_box(estimator, h, 1) <= slo_ms]
    if not fits:
        raise PlanError(f"pipeline {pipeline.name}: on no single hardware ({', '.join(sorted(common))}) does the "
                        f"p99 service time at batch 1 meet the SLO of {slo_ms:g} ms")
    hardware = min(fits, key=lambda h: (sum(s.prices[h] for s in pipeline.stages), black_box_ms(h, 1)))
    largest = min(max(s.profile.batch_sizes(hardware)) for s in pipeline.stages)
    sizes = sorted({b for s in pipeline.stages for b in s.profile.batch_sizes(hardware) if b <= largest})
    batch = max(b for b in sizes if profile_black_box(estimator, hardware, b) <= slo_ms)  # batch 1 fits
    throughput = batch * 1e3 / black_box_ms(hardware, batch)
    replicas = max(1, math.ceil(rate_per_s / throughput))
    return {s.name: StageConfig(hardware, batch, replicas, s.batch_timeout_ms) for s in pipeline.stages}


BLACK_BOX_DRAWS = 4000  # batches sampled when profiling the black box


def profile_black_box(estimator: Estimator, hardware: str, batch: int) -> float:
    """The pipeline's end-to-end p99 (ms) at ``batch`` with every stage on ``hardware``, as a closed-loop
    profile of the whole black box would measure it: each stage's service time drawn from its profiled
    (closed-loop) percentiles, a conditional stage visited at its scale factor, times summed along each
    draw's slowest visited path.
    """
    rng = np.random.default_rng(estimator.seed)
    end: dict[str, np.ndarray] = {}
    visited: dict[str, np.ndarray] = {}
    for stage in estimator.pipeline.stages:
        point = stage.profile.point(hardware, batch)
        times = point.mean_ms * point.shape(SHAPE_LEVELS)[rng.integers(0, SHAPE_LEVELS, BLACK_BOX_DRAWS)]
        reached = (np.logical_or.reduce([visited[p] for p in stage.parents]) if stage.parents
                   else np.ones(BLACK_BOX_DRAWS, dtype=bool))
        visited[stage.name] = reached & (rng.random(BLACK_BOX_DRAWS) < stage.scale_factor)
        before = np.maximum.reduce([end[p] for p in stage.parents]) if stage.parents else 0.0
        end[stage.name] = before + np.where(visited[stage.name], times, 0.0)
    return float(np.percentile(np.maximum.reduce(list(end.values())), 99))

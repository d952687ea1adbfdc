"""From a plan to the containers that serve it: one ``ContainerSpec`` per replica.

Only the mapping; starting the containers, routing queries between stages and applying
the Tuner's changes belong to whoever holds the backend.
"""

from __future__ import annotations

import math

from containers.backends.base import ContainerSpec
from containers.errors import PlanError
from containers.planner.config import check_config
from containers.planner.hardware import cpu_cores
from containers.planner.pipeline import Pipeline
from containers.planner.plan import Plan


def plan_specs(plan: Plan, pipeline: Pipeline, base_port: int) -> list[ContainerSpec]:
    """Container specs for every replica of ``plan``, stage by stage, on consecutive ports from ``base_port``.

    A ``cpu-<x>`` replica gets a quota of x cores and ``max(1, ceil(x))`` TVM threads. Names are
    ``<pipeline>-<stage>-<replica>``.

    Raises:
        PlanError: the plan is for another pipeline or does not fit it, or a stage is on a GPU,
            which ``ContainerSpec`` cannot express yet.
    """
    if plan.pipeline != pipeline.name:
        raise PlanError(f"the plan is for pipeline {plan.pipeline!r}, not {pipeline.name!r}")
    check_config(pipeline, plan.stages)
    specs = []
    for stage in pipeline.stages:
        cfg = plan.stages[stage.name]
        cores = cpu_cores(cfg.hardware)
        if cores is None:
            raise PlanError(f"stage {stage.name} is planned on {cfg.hardware}; only cpu-<cores> replicas can be "
                            "deployed as containers")
        for i in range(cfg.replicas):
            specs.append(ContainerSpec(f"{plan.pipeline}-{stage.name}-{i}", stage.artifact, base_port + len(specs),
                                       threads=max(1, math.ceil(cores)), cpus=cores))
    return specs

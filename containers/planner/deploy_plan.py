"""From a plan to the containers that serve it: one ``ContainerSpec`` per replica, pinned to cores.

Replicas are pinned because they were profiled pinned (``containers.profiling``), and a
quota'd container left free to migrate runs slower than its profile: its CFS runtime is
handed out per core in slices, and a thread that moves strands what it left behind.
``CorePlacement`` packs replicas onto the least-committed cores, by quota, largest first (so
fractional replicas share a core only up to its one core of quota, and the largest replica
gets the first cores, where ``autotune profile`` measures), and refuses a replica that would
take a core past one core of quota: a plan, or a Tuner's addition, that the cores cannot hold.

Only the mapping; starting the containers, routing queries between stages and applying
the Tuner's changes belong to whoever holds the backend.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from containers.backends import cores_text
from containers.backends.base import ContainerSpec
from containers.errors import PlanError
from containers.planner.config import check_config
from containers.planner.hardware import cpu_cores
from containers.planner.pipeline import Pipeline
from containers.planner.plan import Plan


class CorePlacement:
    """Which cores each replica is pinned to: the ``ceil(cpus)`` cores with the least quota committed so far.

    Args:
        cores: the cores replicas may use (default: those this process may run on).
    """

    def __init__(self, cores: Sequence[int] | None = None) -> None:
        self.committed = {c: 0.0 for c in (sorted(os.sched_getaffinity(0)) if cores is None else cores)}
        if not self.committed:
            raise PlanError("no cores to place replicas on")

    @property
    def free(self) -> float:
        """Cores of quota not yet committed (each core holds one)."""
        return sum(max(0.0, 1.0 - held) for held in self.committed.values())

    def take(self, cpus: float) -> tuple[int, ...]:
        """Cores for a replica of ``cpus`` cores of quota, now committed to it.

        Raises:
            PlanError: it does not fit: a core would hold more than one core of quota, and its
                replicas would slow each other down past anything their profiles measured.
        """
        n = max(1, math.ceil(cpus))
        if n > len(self.committed):
            raise PlanError(f"a replica of {cpus:g} cores needs {n} cores; only {len(self.committed)} are available")
        chosen = tuple(sorted(sorted(self.committed, key=lambda c: (self.committed[c], c))[:n]))
        if any(self.committed[c] + cpus / n > 1.0 + 1e-9 for c in chosen):
            raise PlanError(f"a replica of {cpus:g} cores does not fit on cores {cores_text(tuple(self.committed))}: "
                            f"{self.free:g} cores of quota are left")
        for c in chosen:
            self.committed[c] += cpus / n
        return chosen

    def give_back(self, cores: Sequence[int], cpus: float) -> None:
        """A replica on ``cores`` is gone: its quota no longer counts against them."""
        for c in cores:
            self.committed[c] -= cpus / len(cores)


def plan_specs(plan: Plan, pipeline: Pipeline, base_port: int, placement: CorePlacement | None = None
               ) -> list[ContainerSpec]:
    """Container specs for every replica of ``plan``, stage by stage, on consecutive ports from ``base_port``.

    A ``cpu-<x>`` replica gets a quota of x cores, ``max(1, ceil(x))`` TVM threads, and as many
    cores from ``placement`` (a fresh one over this process's cores by default), placed largest
    quota first. Names are ``<pipeline>-<stage>-<replica>``.

    Raises:
        PlanError: the plan is for another pipeline or does not fit it, a stage is on a GPU
            (which ``ContainerSpec`` cannot express yet), or its replicas need more quota than
            ``placement``'s cores have left.
    """
    if plan.pipeline != pipeline.name:
        raise PlanError(f"the plan is for pipeline {plan.pipeline!r}, not {pipeline.name!r}")
    check_config(pipeline, plan.stages)
    placement = placement or CorePlacement()
    replicas = []
    for stage in pipeline.stages:
        cfg = plan.stages[stage.name]
        cores = cpu_cores(cfg.hardware)
        if cores is None:
            raise PlanError(f"stage {stage.name} is planned on {cfg.hardware}; only cpu-<cores> replicas can be "
                            "deployed as containers")
        replicas += [(stage, i, cores) for i in range(cfg.replicas)]
    need = sum(cores for _, _, cores in replicas)
    if need > placement.free + 1e-9:
        raise PlanError(f"the plan's replicas need {need:g} cores of quota; cores "
                        f"{cores_text(tuple(placement.committed))} have {placement.free:g} left: give them more "
                        "cores, or plan for less traffic")
    cpusets = {n: placement.take(replicas[n][2]) for n in sorted(range(len(replicas)), key=lambda n: -replicas[n][2])}
    return [ContainerSpec(f"{plan.pipeline}-{stage.name}-{i}", stage.artifact, base_port + n,
                          threads=max(1, math.ceil(cores)), cpus=cores, cpuset=cpusets[n])
            for n, (stage, i, cores) in enumerate(replicas)]

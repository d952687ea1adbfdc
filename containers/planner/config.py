"""A pipeline configuration: per stage, the hardware, batch size, batching timeout and replicas.

The Estimator simulates a configuration, the Planner searches over them, a Plan records
one. A configuration is a plain mapping of stage name to ``StageConfig``; stage configs
are frozen and hashable, so the Estimator can cache what it simulated for them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from containers.errors import PlanError
from containers.planner.pipeline import Pipeline

Config = Mapping[str, "StageConfig"]


@dataclass(frozen=True)
class StageConfig:
    """How one stage is served.

    Attributes:
        hardware: a hardware key the stage is profiled and priced on (``cpu-1``, ``gpu-NVIDIAH200``).
        batch_size: the most queries a replica takes at once.
        replicas: identical servers sharing the stage's queue.
        batch_timeout_ms: how long a replica that is free waits for a partial batch to fill (0: it takes
            what is queued at once).
    """

    hardware: str
    batch_size: int
    replicas: int
    batch_timeout_ms: float = 0.0

    def __post_init__(self) -> None:
        for name in ("batch_size", "replicas"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError(f"a stage's {name} must be an integer of at least 1; got {value!r}")
        if not (isinstance(self.batch_timeout_ms, (int, float)) and self.batch_timeout_ms >= 0):
            raise PlanError(f"a stage's batch_timeout_ms must be a number >= 0; got {self.batch_timeout_ms!r}")


def check_config(pipeline: Pipeline, config: Config) -> None:
    """Refuse a configuration that does not fit ``pipeline``: a stage missing or extra, hardware or batch not profiled."""
    names = {s.name for s in pipeline.stages}
    if set(config) != names:
        raise PlanError(f"the configuration's stages {sorted(config)} are not the pipeline's {sorted(names)}")
    for stage in pipeline.stages:
        stage.profile.point(config[stage.name].hardware, config[stage.name].batch_size)


def check_standby(standby: float, tuner: bool = True) -> None:
    """Refuse a standby share (warm, paused replicas per planned replica) that is not a number of at least 0, or
    any without the ``tuner`` (only its scale-ups use them)."""
    if isinstance(standby, bool) or not isinstance(standby, (int, float)) or not 0 <= standby < math.inf:
        raise PlanError(f"standby replicas per planned replica must be a number of at least 0; got {standby!r}")
    if standby and not tuner:
        raise PlanError(f"standby replicas ({standby:g} per planned replica) serve only the Tuner's scale-ups; "
                        "turn the Tuner on, or keep none")


def standby_replicas(standby: float, planned: int) -> int:
    """The warm standbys a stage of ``planned`` replicas keeps at ``standby`` per planned replica (rounded up)."""
    return math.ceil(standby * planned - 1e-9)


def stage_cost(pipeline: Pipeline, name: str, config: StageConfig) -> float:
    """Dollars per hour for one stage's replicas."""
    return config.replicas * pipeline.stage(name).prices[config.hardware]


def config_cost(pipeline: Pipeline, config: Config) -> float:
    """Dollars per hour for the whole configuration: replicas times price, summed over stages."""
    return sum(stage_cost(pipeline, s.name, config[s.name]) for s in pipeline.stages)


def with_stage(config: Config, name: str, stage: StageConfig) -> dict[str, StageConfig]:
    """A new configuration with ``name`` served as ``stage`` and the others unchanged."""
    return {**config, name: stage}

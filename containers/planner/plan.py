"""A placement plan: how each stage is served, what that costs, and what the Estimator predicts for it.

Written as versioned JSON (``schema_version`` 1)::

    {
      "schema_version": 1,
      "pipeline": "video",
      "slo_ms": 250.0,                       # p99, end to end
      "method": "inferline",                 # inferline | cg-mean | cg-peak
      "stages": {
        "detect": {"hardware": "cpu-2", "batch_size": 4, "batch_timeout_ms": 0.0, "replicas": 3,
                   "price_per_hour": 0.085, "cost_per_hour": 0.255}
      },
      "cost_per_hour": 0.255,
      "predicted": {"p50_ms": 31.2, "p99_ms": 240.1, "mean_ms": 40.3, "miss_rate": 0.004},
      "envelope": {"0.01": 4, "0.02": 6, ...},   # planning trace: window seconds -> most arrivals
      "search": {"estimator_calls": 212, "seconds": 3.1, "trace_queries": 12000, "trace_seconds": 60.0, "seed": 0},
      "pipeline_file": "/abs/path/video.toml"   # or null
    }
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from containers.errors import PlanError
from results.atomic import write_atomically
from containers.planner.config import StageConfig

SCHEMA_VERSION = 1
METHODS = ("inferline", "cg-mean", "cg-peak")


@dataclass(frozen=True)
class Prediction:
    """The Estimator's view of a configuration over the planning trace."""

    p50_ms: float
    p99_ms: float
    mean_ms: float
    miss_rate: float


@dataclass(frozen=True)
class Plan:
    """A configuration chosen for a pipeline, its cost, and how it was found.

    Attributes:
        stages: stage name -> how it is served, in the pipeline's topological order.
        prices: stage name -> dollars per replica-hour on its hardware.
        envelope: the planning trace's traffic envelope (window seconds -> most arrivals), which the
            Tuner compares live traffic with.
        search: how it was found: estimator calls, seconds, the trace's queries and length, the seed.
        pipeline_file: the pipeline file planned, when it came from one (simulating needs its profiles).
    """

    pipeline: str
    slo_ms: float
    method: str
    stages: Mapping[str, StageConfig]
    prices: Mapping[str, float]
    predicted: Prediction
    envelope: Mapping[float, int]
    search: Mapping[str, Any]
    pipeline_file: str | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise PlanError(f"a plan's method must be one of {', '.join(METHODS)}; got {self.method!r}")
        if not self.slo_ms > 0:
            raise PlanError(f"a plan's slo_ms must be positive; got {self.slo_ms!r}")
        if not self.stages or set(self.stages) != set(self.prices):
            raise PlanError("a plan needs at least one stage, and a price for each")
        for window_s, most in self.envelope.items():  # the Tuner divides by both
            if not (0 < window_s < math.inf and most >= 1):
                raise PlanError(f"a plan's envelope must give at least 1 arrival per window of more than 0 s; "
                                f"got {most!r} in {window_s!r} s")

    def stage_cost(self, name: str) -> float:
        return self.stages[name].replicas * self.prices[name]

    @property
    def cost_per_hour(self) -> float:
        """Dollars per hour: replicas times price, summed over stages."""
        return sum(self.stage_cost(name) for name in self.stages)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION, "pipeline": self.pipeline, "slo_ms": self.slo_ms, "method": self.method,
            "stages": {name: {**asdict(cfg), "price_per_hour": self.prices[name],
                              "cost_per_hour": round(self.stage_cost(name), 6)} for name, cfg in self.stages.items()},
            "cost_per_hour": round(self.cost_per_hour, 6), "predicted": asdict(self.predicted),
            "envelope": {str(w): n for w, n in self.envelope.items()}, "search": dict(self.search),
            "pipeline_file": self.pipeline_file,
        }

    def write(self, path: str | Path) -> None:
        """Write the plan as JSON, atomically (a reader never sees half a plan)."""
        write_atomically(path, json.dumps(self.to_json(), indent=2) + "\n")


def read_plan(path: str | Path) -> Plan:
    """Read and check a plan file; ``PlanError`` names the file and what is wrong."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise PlanError(f"cannot read plan {path}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise PlanError(f"{path} is not JSON: {err}") from None
    if not isinstance(raw, dict) or raw.get("schema_version") != SCHEMA_VERSION:
        version = raw.get("schema_version") if isinstance(raw, dict) else None
        raise PlanError(f"{path} has schema_version {version!r}; expected {SCHEMA_VERSION}")
    try:
        stages = {name: StageConfig(s["hardware"], s["batch_size"], s["replicas"], s["batch_timeout_ms"])
                  for name, s in raw["stages"].items()}
        return Plan(raw["pipeline"], float(raw["slo_ms"]), raw["method"], stages,
                    {name: float(s["price_per_hour"]) for name, s in raw["stages"].items()},
                    Prediction(**raw["predicted"]), {float(w): int(n) for w, n in raw["envelope"].items()},
                    dict(raw["search"]), raw.get("pipeline_file"))
    except PlanError as err:
        raise PlanError(f"{path}: {err}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise PlanError(f"{path} is not a valid plan: {type(err).__name__}: {err}") from None

"""The measurement engine interface: build candidates and time them, errors carried as data.

A tuning session hands the engine one round of candidates (from any number of
tasks) and gets one result per candidate back, in order. How the engine builds and
where it measures (a pool of warm workers, pinned cores, a GPU, a remote device) is
its own business; the session holds no policy about it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Candidate:
    """A scheduled kernel to build and time: its IRModule and MetaSchedule's argument info."""

    mod: Any
    args_info: Any


@dataclass(frozen=True)
class Measurement:
    """Timings of one candidate in seconds, or why there are none."""

    run_secs: tuple[float, ...] | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.run_secs) and all(math.isfinite(s) and s > 0 for s in self.run_secs)

    @property
    def latency(self) -> float:
        """Mean of the timings; infinity for a failed candidate."""
        return sum(self.run_secs) / len(self.run_secs) if self.ok and self.run_secs else math.inf


class MeasurementEngine(ABC):
    """Builds and times candidates for one target."""

    name: str = "engine"

    @abstractmethod
    def measure(self, target: Any, device_type: str, candidates: Sequence[Candidate]) -> list[Measurement]:
        """One ``Measurement`` per candidate, in order; never raises for a bad candidate."""

    def close(self) -> None:
        """Release workers; the default engine holds none."""


def create(kind: str | MeasurementEngine, num_cores: int) -> MeasurementEngine:
    """An engine by CLI name ("stock"), or the instance itself."""
    if isinstance(kind, MeasurementEngine):
        return kind
    if kind == "stock":
        from measure.stock import StockEngine

        return StockEngine(max_build_workers=num_cores)
    raise ValueError(f"unknown measurement engine {kind!r}; expected one of: stock")

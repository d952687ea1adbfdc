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

from measure.timing import fastest


@dataclass(frozen=True)
class Candidate:
    """A scheduled kernel to build and time: its IRModule, MetaSchedule's argument info, its task."""

    mod: Any
    args_info: Any
    task: str = ""

    def arg_shapes(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """(dtype, shape) per argument: what a measurement worker needs to allocate inputs."""
        return tuple((str(a.dtype), tuple(int(x) for x in a.shape)) for a in self.args_info)


@dataclass(frozen=True)
class Measurement:
    """Timings of one candidate in seconds, or why there are none."""

    run_secs: tuple[float, ...] | None = None
    error: str | None = None
    slot: str = ""  # where it was timed
    isolated: bool = False  # timed alone (or re-timed alone to verify a parallel value)
    at: float | None = None  # wall-clock time (time.time()) the value was known
    stop: str = ""  # why timing stopped (see ``measure.timing.Timing``)
    device_s: float = 0.0  # seconds the device slot was busy with this candidate (load and timing)
    cpu_s: float = 0.0  # CPU-seconds its build and its timing cost on the host

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.run_secs) and all(math.isfinite(s) and s > 0 for s in self.run_secs)

    @property
    def latency(self) -> float:
        """The fastest of the timings (``measure.timing.fastest``; one value for stock's runner); infinity for a
        failed candidate."""
        return fastest(self.run_secs) if self.ok and self.run_secs else math.inf


def median_turn(turns: Sequence[Measurement]) -> Measurement:
    """Of one candidate's timings in turns, the valid one with the median latency (the lower of two middles),
    or the first if none is valid."""
    valid = sorted((m for m in turns if m.ok), key=lambda m: m.latency)
    return valid[(len(valid) - 1) // 2] if valid else turns[0]


PHASES = ("build", "measure", "verification")


@dataclass
class PhaseWork:
    """Work done in one phase: host CPU-seconds, seconds a device was busy, and how many jobs."""

    cpu_s: float = 0.0
    device_s: float = 0.0
    jobs: int = 0

    def add(self, cpu_s: float, device_s: float = 0.0) -> None:
        self.cpu_s += cpu_s
        self.device_s += device_s
        self.jobs += 1


class MeasurementEngine(ABC):
    """Builds and times candidates for one target.

    ``work`` counts what building, measuring and verification (re-timing alone, final
    ranking included) cost, for the tuning job's energy bill.
    """

    name: str = "engine"

    def __init__(self) -> None:
        self.work: dict[str, PhaseWork] = {phase: PhaseWork() for phase in PHASES}

    @abstractmethod
    def measure(self, target: Any, device_type: str, candidates: Sequence[Candidate]) -> list[Measurement]:
        """One ``Measurement`` per candidate, in order; never raises for a bad candidate."""

    def measure_isolated(self, target: Any, device_type: str, candidates: Sequence[Candidate],
                         turns: int = 1) -> list[Measurement]:
        """Like ``measure``, one candidate at a time with nothing else running: for the final ranking.

        With ``turns`` > 1 every candidate is timed once per turn, in order, so that the host's slow
        drifts hit them all alike, and keeps its median turn (``median_turn``): near-ties are decided
        by more than one spell of the host.
        """
        passes = [self.measure(target, device_type, candidates) for _ in range(turns)]
        return [median_turn(list(timed)) for timed in zip(*passes)]

    def report(self) -> dict[str, Any]:
        """What the engine did, for the run's manifest."""
        return {"engine": self.name}

    def close(self) -> None:
        """Release workers; the default engine holds none."""


ENGINES = ("parallel", "stock")

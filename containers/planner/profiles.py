"""A stage's service times per (hardware key, batch size), looked up the way the planner needs them.

The profile (``results.profile``) lists what was measured; the planner asks "how long does
a batch of k take on h", including sizes that were not profiled. A batch of k is served
as the smallest profiled batch of at least k (a server pads or compiles to that size), so
its time is that entry's; a k above every profiled size has no answer and is refused.

A CPU container whose quota is below its threads (0.5 cores for one thread) is throttled by
the kernel: it runs at full speed until its share of each CFS period is spent, then waits
for the next period. Its closed-loop profile measures that at saturation (a bimodal mix of
throttled and unthrottled runs), which overstates what a lightly loaded replica sees. Where
the same threads were also profiled without throttling (its *twin*: 1 core for 1 thread),
the stage records the pair, and the Estimator serves from the twin's service times under
the quota instead (``batchqueue.CfsBandwidth``), so throttling follows the load.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from containers.errors import PlanError
from containers.planner.hardware import hardware_key
from results.profile import Persistence, Profile


@dataclass(frozen=True)
class ServicePoint:
    """One profiled batch size on one hardware key."""

    batch_size: int
    mean_ms: float
    p99_ms: float
    quantiles_ms: tuple[float, ...] | None = None  # 0th..100th percentile, when the profile kept them
    persistence: Persistence | None = None  # how long slow spells last, when the profile kept the runs' order
    idle: ServicePoint | None = None  # the same batch on a replica that rested before it, when profiled

    def shape(self, levels: int) -> np.ndarray:
        """Service time over its mean at ``levels`` evenly spaced quantiles (mean 1); all ones without quantiles."""
        if not self.quantiles_ms:
            return np.ones(levels)
        q = np.asarray(self.quantiles_ms)
        table = np.interp((np.arange(levels) + 0.5) / levels, np.linspace(0, 1, q.size), q)
        return table / table.mean()


@dataclass(frozen=True)
class Throttled:
    """A CPU key whose quota is below its threads: its runs take as long as ``twin``'s, cut to ``share`` of every CFS period."""

    points: tuple[ServicePoint, ...]
    share: float


@dataclass(frozen=True)
class StageProfile:
    """Profiled service times of one stage: hardware key -> points sorted by batch size.

    Attributes:
        stage: the stage's name, for errors.
        points: for each hardware key, at least one point, batch sizes strictly increasing.
        throttled: the keys served as an unthrottled twin under a CPU quota.
        startups: for each key whose container start was profiled, the slowest start, in seconds.
    """

    stage: str
    points: Mapping[str, tuple[ServicePoint, ...]]
    throttled: Mapping[str, Throttled] = field(default_factory=dict)
    startups: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key, points in self.points.items():
            sizes = [p.batch_size for p in points]
            if not points or sizes != sorted(set(sizes)) or any(p.mean_ms <= 0 for p in points):
                raise PlanError(f"stage {self.stage}: hardware {key} needs increasing batch sizes with positive times")

    @classmethod
    def from_profile(cls, stage: str, profile: Profile) -> StageProfile:
        """Group a profile's entries by hardware key.

        Where two entries share a key and batch size, one measured in a container (it has a
        ``cpu_limit``) wins, as it includes the serving path a replica will have; between
        equals, the faster one.
        """
        best: dict[tuple[str, int], tuple[tuple[bool, float], ServicePoint]] = {}
        quotas: dict[str, tuple[float, int]] = {}  # container keys: (CPU limit, threads)
        startups: dict[str, float] = {}
        for e in profile.entries:
            try:
                key = hardware_key(e.hardware)
            except ValueError as err:
                raise PlanError(f"stage {stage}: profile entry {e.hardware}: {err}") from None
            if e.hardware.get("cpu_limit") is not None:
                quotas[key] = (float(e.hardware["cpu_limit"]), len(e.hardware.get("cores") or ())
                               or int(e.hardware.get("threads") or 1))
            if e.startup_s is not None:
                startups[key] = max(startups.get(key, 0.0), e.startup_s)
            rank = (e.hardware.get("cpu_limit") is None, e.latency_ms.mean)
            idle = e.idle_latency_ms
            point = ServicePoint(e.batch_size, e.latency_ms.mean, e.latency_ms.p99, e.latency_ms.quantiles,
                                 e.latency_ms.persistence,
                                 ServicePoint(e.batch_size, idle.mean, idle.p99, idle.quantiles) if idle else None)
            if (key, e.batch_size) not in best or rank < best[key, e.batch_size][0]:
                best[key, e.batch_size] = (rank, point)
        grouped: dict[str, list[ServicePoint]] = {}
        for (key, _), (_, point) in best.items():
            grouped.setdefault(key, []).append(point)
        points = {k: tuple(sorted(v, key=lambda p: p.batch_size)) for k, v in grouped.items()}
        return cls(stage, points, _throttled(points, quotas), startups)

    def restrict(self, keys: Iterable[str]) -> StageProfile:
        """Only the hardware in ``keys`` (those not profiled are left out); a throttled key keeps its twin's runs."""
        wanted = set(keys)
        return StageProfile(self.stage, {k: v for k, v in self.points.items() if k in wanted},
                            {k: t for k, t in self.throttled.items() if k in wanted},
                            {k: s for k, s in self.startups.items() if k in wanted})

    def quota_share(self, hardware: str) -> float | None:
        """The share of each CFS period a replica on ``hardware`` may run; None where no quota cuts in."""
        t = self.throttled.get(hardware)
        return t.share if t else None

    def startup_s(self, hardware: str) -> float | None:
        """How long a container on ``hardware`` took to start serving when it was profiled; None if not measured."""
        return self.startups.get(hardware)

    def run_point(self, hardware: str, batch: int) -> ServicePoint:
        """How long one run of a batch takes before any quota cuts in: the twin's point on a throttled key."""
        t = self.throttled.get(hardware)
        return _smallest_fitting(self.stage, hardware, t.points, batch) if t else self.point(hardware, batch)

    @property
    def hardware(self) -> tuple[str, ...]:
        return tuple(sorted(self.points))

    def batch_sizes(self, hardware: str) -> tuple[int, ...]:
        return tuple(p.batch_size for p in self._points(hardware))

    def point(self, hardware: str, batch: int) -> ServicePoint:
        """The profiled point that serves a batch of ``batch``: the smallest profiled size of at least ``batch``."""
        return _smallest_fitting(self.stage, hardware, self._points(hardware), batch)

    def service_ms(self, hardware: str, batch: int) -> float:
        """Mean time to serve a batch of ``batch`` on one replica."""
        return self.point(hardware, batch).mean_ms

    def p99_ms(self, hardware: str, batch: int) -> float:
        return self.point(hardware, batch).p99_ms

    def throughput_per_s(self, hardware: str, batch: int) -> float:
        """Queries per second one replica serves when every batch is full."""
        return batch * 1e3 / self.service_ms(hardware, batch)

    def _points(self, hardware: str) -> tuple[ServicePoint, ...]:
        if hardware not in self.points:
            raise PlanError(f"stage {self.stage} has no profile for hardware {hardware}; profiled: "
                            f"{', '.join(self.hardware) or 'none'}")
        return self.points[hardware]


def _throttled(points: Mapping[str, tuple[ServicePoint, ...]], quotas: Mapping[str, tuple[float, int]]
               ) -> dict[str, Throttled]:
    """Each container key whose limit is below its threads, paired with the key that ran as many threads unthrottled.

    The twin must have profiled every batch size the key did, so each batch is drawn from
    a measurement of its own size.
    """
    out = {}
    for key, (limit, threads) in quotas.items():
        twin = hardware_key({"kind": "cpu", "cpu_limit": threads})
        if limit < threads and quotas.get(twin) == (float(threads), threads) and \
                {p.batch_size for p in points[key]} <= {p.batch_size for p in points[twin]}:
            out[key] = Throttled(points[twin], limit / threads)
    return out


def _smallest_fitting(stage: str, hardware: str, points: tuple[ServicePoint, ...], batch: int) -> ServicePoint:
    i = bisect.bisect_left([p.batch_size for p in points], batch)
    if batch < 1 or i == len(points):
        raise PlanError(f"stage {stage}: batch {batch} on {hardware} is outside the profiled sizes "
                        f"{', '.join(str(p.batch_size) for p in points)}")
    return points[i]

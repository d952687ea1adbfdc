"""The worker side's two monitors.

Application Monitor: each container's response time over the last interval, as the mean or
a percentile of the server's request-time histogram between two scrapes of ``/metrics``
(the server measures it; the manager adds no probe traffic). Worker Monitor: the pool of
containers under management, and which of them have died since the last look.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from containers.backends.base import ContainerBackend, ContainerSpec
from containers.errors import ScenarioError

REQUEST_METRIC = "autotune_request_seconds"
STATISTICS = ("mean", "p50", "p90", "p95", "p99")


@dataclass(frozen=True)
class HistogramSnapshot:
    """A Prometheus histogram at one moment: cumulative counts per upper bound, sum and count."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    total_s: float
    count: float

    def since(self, earlier: HistogramSnapshot) -> HistogramSnapshot:
        if earlier.bounds != self.bounds or earlier.count > self.count:  # a restarted server starts from zero
            return self
        return HistogramSnapshot(self.bounds, tuple(a - b for a, b in zip(self.cumulative, earlier.cumulative)),
                                 self.total_s - earlier.total_s, self.count - earlier.count)

    def statistic_s(self, statistic: str) -> float | None:
        """The mean, or the percentile (linear within its bucket), of what was observed; None if nothing was."""
        if self.count <= 0:
            return None
        if statistic == "mean":
            return self.total_s / self.count
        rank = float(statistic[1:]) / 100 * self.count
        i = min(bisect.bisect_left(self.cumulative, rank), len(self.bounds) - 1)
        lower = self.bounds[i - 1] if i else 0.0
        upper = self.bounds[i] if math.isfinite(self.bounds[i]) else lower
        below = self.cumulative[i - 1] if i else 0.0
        inside = self.cumulative[i] - below
        return lower + (upper - lower) * ((rank - below) / inside if inside > 0 else 1.0)


def scrape(url: str, metric: str = REQUEST_METRIC, timeout_s: float = 2.0) -> HistogramSnapshot | None:
    """The ``metric`` histogram from a server's ``/metrics``; None when the server does not answer."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    try:
        reply = requests.get(f"{url}/metrics", timeout=timeout_s)
        reply.raise_for_status()
    except requests.RequestException:
        return None
    buckets: list[tuple[float, float]] = []
    total = count = 0.0
    for family in text_string_to_metric_families(reply.text):
        if family.name != metric:
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                buckets.append((float(sample.labels["le"]), sample.value))
            elif sample.name.endswith("_sum"):
                total = sample.value
            elif sample.name.endswith("_count"):
                count = sample.value
    if not buckets:
        return None
    buckets.sort()
    return HistogramSnapshot(tuple(b for b, _ in buckets), tuple(c for _, c in buckets), total, count)


@dataclass
class ApplicationMonitor:
    """Response time per container over each interval, against its target.

    Attributes:
        statistic: ``mean`` or a percentile ``p50``/``p90``/``p95``/``p99`` of request time.
        scraper: reads a container's histogram from its URL (``scrape``; tests pass a simulated one).
    """

    statistic: str = "mean"
    scraper: Callable[[str], HistogramSnapshot | None] = scrape
    _last: dict[str, HistogramSnapshot] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if self.statistic not in STATISTICS:
            raise ScenarioError(f"unknown response-time statistic {self.statistic!r}; expected one of {', '.join(STATISTICS)}")

    def response_ms(self, spec: ContainerSpec) -> float | None:
        """The statistic over requests served since the previous call; None if none were (or no answer)."""
        now = self.scraper(spec.url)
        if now is None:
            return None
        earlier = self._last.get(spec.name)
        self._last[spec.name] = now
        if earlier is None:
            return None
        value = now.since(earlier).statistic_s(self.statistic)
        return None if value is None else value * 1e3

    def forget(self, name: str) -> None:
        self._last.pop(name, None)


@dataclass
class WorkerMonitor:
    """The container pool under management, and what happened to it."""

    backend: ContainerBackend
    pool: dict[str, ContainerSpec] = field(default_factory=dict)

    def join(self, spec: ContainerSpec) -> None:
        self.pool[spec.name] = spec

    def leave(self, name: str) -> ContainerSpec | None:
        return self.pool.pop(name, None)

    def dead(self) -> list[str]:
        """Containers in the pool that the backend no longer reports running."""
        running = {i.spec.name for i in self.backend.list() if i.running}
        return [name for name in self.pool if name not in running]

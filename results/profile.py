"""``profile.json``: what the serving planner reads about an artifact.

Format (``schema_version`` 1)::

    {
      "schema_version": 1,
      "model": "zoo:mlp",
      "target": "llvm",
      "entries": [
        {
          "hardware": {"kind": "cpu", "device": "znver3", "threads": 2, "cores": [0, 1], "cpu_limit": null},
          "batch_size": 4,
          "latency_ms": {"p50": 0.21, "p99": 0.35, "mean": 0.22, "min": 0.20,
                         "quantiles": [0.20, ..., 0.41],    # 0th..100th percentile; optional
                         "persistence": {"share": 0.6, "time_s": 1.2}},   # optional, see Persistence
          "throughput_per_s": 18867.9,        # items (not batches) per second, batch_size / mean latency
          "samples": 200,
          "torch_eager_latency_ms": {"p50": 0.30, "p99": 0.41, "mean": 0.31, "min": 0.29},  # or null
          "idle_latency_ms": {"p50": 0.24, ...},   # optional: requests that find the server idle, see below
          "idle_gap_ms": 0.66,                     # how long it idled before each of them
          "startup_s": 2.3                         # optional: from asking for the container to its answer
        }
      ]
    }

One entry per (hardware configuration, batch size), measured one replica at a time.
``hardware.cpu_limit`` is a container CPU quota in cores when the entry was measured
in a container (null: whole cores, no quota). ``latency_ms`` is measured closed loop,
each request sent as the last is answered, so the server never rests; ``idle_latency_ms``
is measured with ``idle_gap_ms`` of rest before each request, as a lightly loaded replica
sees them (on a shared VM, 10% slower at the median: caches and the idle vCPU go cold).
``startup_s`` is how long the container took from the backend's start to its server answering,
artifact loaded and warmed up: what a replica added under load keeps its stage waiting.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from results.errors import ArtifactError

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Persistence:
    """How long slow and fast runs last: on a shared host, a run is slow when its neighbours are busy, and they
    stay busy for a while, so consecutive runs are alike. A queue feels that as bursts of slow service that
    independent draws from the same distribution never make: a steady 9.7 q/s replay of a live two-stage run
    gave a p99 14% above the same service times shuffled.

    Model: a run's latency, as a normal score of its rank, has a part that persists (``share`` of its
    variance, an Ornstein-Uhlenbeck process with time constant ``time_s``) and a part new to each run; two
    runs ``t`` apart then correlate as ``share * exp(-t / time_s)``.
    """

    share: float
    time_s: float

    MIN_SAMPLES = 30

    @classmethod
    def fit(cls, times_s: Sequence[float], samples: Sequence[float]) -> Persistence | None:
        """The model that best fits the rank autocorrelation of a closed-loop series of runs (started at
        ``times_s``) at lags from one run to a quarter of the series; None for too short a series. A
        correlation between neighbouring runs within noise (three standard errors) counts as none."""
        from scipy.special import ndtri
        from scipy.stats import rankdata

        n = len(samples)
        if n < cls.MIN_SAMPLES or len(times_s) != n:
            return None
        z = ndtri((rankdata(samples) - 0.5) / n)
        gap = (float(times_s[-1]) - float(times_s[0])) / (n - 1)
        if not gap > 0:
            return None
        lags = np.unique(np.geomspace(1, n // 4, 12).astype(int))
        rho = np.array([np.corrcoef(z[:-k], z[k:])[0, 1] for k in lags])
        best = (math.inf, 0.0, 1.0)
        for time_s in np.geomspace(gap, 100 * gap * lags[-1], 160):
            decay = np.exp(-lags * gap / time_s)
            share = float(np.clip(rho @ decay / (decay @ decay), 0.0, 0.95))
            err = float(((rho - share * decay) ** 2).sum())
            if err < best[0]:
                best = (err, share, float(time_s))
        _, share, time_s = best
        if share * math.exp(-gap / time_s) < 3 / math.sqrt(n):
            share = 0.0
        return cls(round(share, 4), round(time_s, 4))


@dataclass(frozen=True)
class LatencyStats:
    """Summary of measured latencies; ``quantiles`` (the 0th to 100th percentiles) keep the
    distribution's shape, which the planner's Estimator draws service times from: a CPU quota
    makes it bimodal (runs that are throttled and runs that are not), which no mean shows."""

    p50: float
    p99: float
    mean: float
    min: float
    quantiles: tuple[float, ...] | None = None
    persistence: Persistence | None = None

    def __post_init__(self) -> None:
        if self.quantiles is not None:
            object.__setattr__(self, "quantiles", tuple(float(q) for q in self.quantiles))
        if isinstance(self.persistence, dict):
            object.__setattr__(self, "persistence", Persistence(float(self.persistence["share"]),
                                                                float(self.persistence["time_s"])))

    @classmethod
    def from_seconds(cls, samples: Sequence[float], started_s: Sequence[float] | None = None) -> LatencyStats:
        """From latencies in seconds; with the times they started (a closed loop's runs, in order), their persistence."""
        ms = np.asarray(samples, dtype=float) * 1e3
        q = np.percentile(ms, np.arange(101))
        return cls(float(q[50]), float(q[99]), float(ms.mean()), float(ms.min()), tuple(round(float(v), 4) for v in q),
                   Persistence.fit(started_s, ms) if started_s is not None else None)


@dataclass(frozen=True)
class ProfileEntry:
    hardware: dict[str, Any]
    batch_size: int
    latency_ms: LatencyStats
    throughput_per_s: float
    samples: int
    torch_eager_latency_ms: LatencyStats | None = None
    idle_latency_ms: LatencyStats | None = None
    idle_gap_ms: float | None = None
    startup_s: float | None = None


@dataclass(frozen=True)
class Profile:
    model: str
    target: str
    entries: tuple[ProfileEntry, ...]

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **asdict(self), "entries": [asdict(e) for e in self.entries]}

    def write(self, path: str | Path) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=2)


def read_profile(path: str | Path) -> Profile:
    """Read and check a ``profile.json``; raises ``ArtifactError`` naming what is wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        if not isinstance(raw, dict):
            raise ArtifactError(f"{path} holds a JSON {type(raw).__name__}; expected an object (a profile)")
        if raw.get("schema_version") != SCHEMA_VERSION:
            raise ArtifactError(f"{path} has schema_version {raw.get('schema_version')!r}; expected {SCHEMA_VERSION}")
        entries = tuple(
            ProfileEntry(
                hardware=e["hardware"],
                batch_size=int(e["batch_size"]),
                latency_ms=LatencyStats(**e["latency_ms"]),
                throughput_per_s=float(e["throughput_per_s"]),
                samples=int(e["samples"]),
                torch_eager_latency_ms=LatencyStats(**e["torch_eager_latency_ms"]) if e.get("torch_eager_latency_ms") else None,
                idle_latency_ms=LatencyStats(**e["idle_latency_ms"]) if e.get("idle_latency_ms") else None,
                idle_gap_ms=float(e["idle_gap_ms"]) if e.get("idle_gap_ms") is not None else None,
                startup_s=float(e["startup_s"]) if e.get("startup_s") is not None else None,
            )
            for e in raw["entries"]
        )
        return Profile(raw["model"], raw["target"], entries)
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as err:
        raise ArtifactError(f"cannot read profile {path}: {type(err).__name__}: {err}") from None

"""Degree of parallelism: how many candidates to time at once, chosen from measured error.

After DOPpler (TPDS 2023). Parallel timings are checked after every round: outliers
(modified z-score over the round's log latencies, MAD constant 0.6745, threshold 3),
the contenders for the round's best (its fastest and up to three within 15% of it)
and a random sample (at least 20% of the round) are timed again in isolation. The
mean relative difference is the round's error. The controller works like
congestion control: it starts low, grows while the error stays under the bound
(5%) and few measurements time out because of the level (they finish when timed
alone), and on a bad round remembers a ceiling and cuts the level multiplicatively
(b = 0.2). A round above level 0 that verified nothing holds the level.

Levels: 0 is isolation (one measurement at a time, build workers paused while it
runs); level k >= 1 is k measurements at once, on k lanes, while builds go on at idle
priority on the same host.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class DopController:
    """Picks the level for the next round from the last round's verified error."""

    max_level: int
    level: int = 0
    error_bound: float = 0.05
    timeout_bound: float = 0.05
    backoff: float = 0.2
    hold_rounds: int = 4
    fixed: bool = False  # a level set by hand: record rounds, never move
    ceiling: float | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    _good_since_cut: int = 0

    def __post_init__(self) -> None:
        self.limit(self.max_level)

    @property
    def concurrency(self) -> int:
        return max(1, self.level)

    @property
    def overlap_builds(self) -> bool:
        return self.level > 0

    def limit(self, max_level: int) -> None:
        """Never go past ``max_level`` (the lanes an engine has), a level set by hand included."""
        self.max_level = min(self.max_level, max_level)
        self.level = max(0, min(self.level, self.max_level))

    def update(self, error: float | None, timeouts: int, measured: int) -> int:
        """Record a round and return the next level.

        ``error``: the round's verified error; None where nothing was verified (at level 0 nothing runs in
        parallel, so such a round is good by definition; above it, the round holds the level and does not
        count as good). ``timeouts``: measurements that timed out at this level but finished when timed
        alone; a kernel that hangs alone too says nothing about the level. ``measured``: candidates built.
        """
        level = self.level
        if not self.fixed:
            self._step(error, timeouts, measured)
        self.history.append({"level": level, "error": error, "timeouts": timeouts, "measured": measured,
                             "next_level": self.level})
        return self.level

    def _step(self, error: float | None, timeouts: int, measured: int) -> None:
        level = self.level
        if level > 0 and (self.too_far(error) or timeouts > self.timeout_bound * max(measured, 1)):
            self.ceiling = level * (2 - self.backoff) / 2
            self.level = math.floor(level * (1 - self.backoff))
            self._good_since_cut = 0
        elif level == 0 or error is not None:  # above level 0, a round that verified nothing holds the level
            self._good_since_cut += 1
            self.level = min(self.max_level, self._grow(level))

    def too_far(self, error: float | None) -> bool:
        """A verified error past the bound: the round's parallel values cannot be kept."""
        return error is not None and error > self.error_bound

    def _grow(self, level: int) -> int:
        if self.ceiling is None:  # slow start: double
            return max(level + 1, 2 * level)
        if level + 1 <= self.ceiling:
            return level + max(1, math.floor((self.ceiling - level) / 2))
        # at the ceiling: probe one step past it only after a few good rounds, waiting longer each time
        if self._good_since_cut >= self.hold_rounds:
            self.hold_rounds *= 2
            return level + 1
        return level

    @classmethod
    def from_calibration(cls, curve: Sequence[dict[str, Any]], max_level: int, error_bound: float = 0.05) -> "DopController":
        """Start at the highest calibrated level whose error was within the bound."""
        good = [p["level"] for p in curve if p["level"] <= max_level and p["error"] is not None and p["error"] <= error_bound]
        bad = [p["level"] for p in curve if p["level"] <= max_level and p["error"] is not None and p["error"] > error_bound]
        start = max(good, default=0)
        ceiling = (min(b for b in bad if b > start) - 1) if any(b > start for b in bad) else None
        return cls(max_level=max_level, level=start, error_bound=error_bound, ceiling=ceiling)


def modified_z_scores(values: Sequence[float]) -> list[float]:
    """0.6745 (x - median) / MAD; all zeros when the MAD is zero."""
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return [0.0 if mad == 0 else 0.6745 * (v - med) / mad for v in values]


def pick_for_verification(latencies: dict[int, float], rng: random.Random, share: float = 0.2,
                          threshold: float = 3.0, near_best: float = 0.15, max_contenders: int = 4) -> list[int]:
    """Candidates (by index) to time again in isolation: outliers, the contenders for the round's best
    (the fastest and, up to ``max_contenders`` in all, those within ``near_best`` of it: a parallel
    value that far off can hide the true best), and a random sample up to ``share`` of the round."""
    keys = list(latencies)
    if not keys:
        return []
    logs = [math.log(latencies[k]) for k in keys]
    chosen = {k for k, z in zip(keys, modified_z_scores(logs)) if abs(z) > threshold}
    chosen.update(contenders(latencies, min(latencies.values()), within=near_best, at_most=max_contenders))
    want = max(len(chosen), math.ceil(share * len(keys)))
    rest = [k for k in keys if k not in chosen]
    chosen.update(rng.sample(rest, min(len(rest), want - len(chosen))))
    return sorted(chosen)


def contenders(latencies: dict[int, float], best: float, within: float, at_most: int = 4) -> list[int]:
    """The fastest candidates (by index, at most ``at_most``) within ``within`` of ``best``."""
    ranked = sorted(latencies, key=latencies.__getitem__)
    return [k for k in ranked[:at_most] if latencies[k] <= best * (1 + within)]


@dataclass(frozen=True)
class Verification:
    """What re-measuring in isolation showed about a round's parallel timings."""

    error: float  # mean |parallel - isolated| / isolated
    bias: float  # mean (parallel - isolated) / parallel: the share to take off unverified values
    checked: int

    @classmethod
    def compare(cls, pairs: Sequence[tuple[float, float]]) -> "Verification":
        """``pairs`` of (parallel, isolated) latencies."""
        errors = [abs(p - i) / i for p, i in pairs]
        return cls(statistics.fmean(errors), statistics.fmean((p - i) / p for p, i in pairs), len(pairs))

    def corrected(self, parallel_s: float, max_bias: float = 0.25) -> float:
        """An unverified parallel latency with the round's bias taken off (only when the bias is modest)."""
        return parallel_s * (1 - self.bias) if abs(self.bias) < max_bias else parallel_s

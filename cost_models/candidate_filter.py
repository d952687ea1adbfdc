"""The candidate filter: measure what the latency model says can beat the task's best (Trimmer).

The search proposes a round of candidates; the filter, before anything is built,
keeps those the model scores at or above ``threshold`` (1.0 = as fast as the task's
best so far), fills the round up to ``keep_share`` of its proposals with the
next-best scores, and adds an exploration share drawn at random from what it would
drop. The random draw does double duty: it stops a wrong model from starving the
search, and, being an unbiased sample of the dropped candidates, it estimates how
often the filter drops a candidate that would have become the task's best.

The filter only drops while the model has earned it: trained on real data and
ranking recent rounds with a Kendall tau of at least ``min_tau``.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Selection:
    """Indices into a round's proposals: what to measure (``explore`` among them) and what to drop."""

    measure: list[int]
    explore: list[int]
    dropped: list[int]


class CandidateFilter(ABC):
    """Chooses which of a round's proposals are built and measured."""

    name = "filter"

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    @abstractmethod
    def select(self, scores: Sequence[float], trained: bool, recent_tau: float | None) -> Selection:
        """``scores``: the model's normalised predictions; ``trained``/``recent_tau``: how far to trust them."""

    def record_explored(self, would_be_best: bool) -> None:
        """An explored candidate was measured: did it beat its task's best?"""
        self.counts["explored_measured"] += 1
        self.counts["explored_would_be_best"] += would_be_best

    def report(self) -> dict[str, Any]:
        measured = self.counts["explored_measured"]
        return {
            "filter": self.name,
            **dict(self.counts),
            "would_be_best_drop_rate": self.counts["explored_would_be_best"] / measured if measured else None,
        }


class MeasureAll(CandidateFilter):
    """No filtering: every proposal is measured (the engine alone, or stock)."""

    name = "off"

    def select(self, scores: Sequence[float], trained: bool, recent_tau: float | None) -> Selection:
        self.counts["proposed"] += len(scores)
        self.counts["measured"] += len(scores)
        return Selection(list(range(len(scores))), [], [])


@dataclass
class TrimmerFilter(CandidateFilter):
    """Keep the likely winners, fill to a minimum with the next best, explore a random share of the rest."""

    threshold: float = 0.9
    keep_share: float = 0.25
    explore_share: float = 0.1
    min_tau: float = 0.3
    seed: int = 0
    name: str = field(default="trimmer", init=False)

    def __post_init__(self) -> None:
        super().__init__()
        for flag, value, low, high in (("--filter-threshold", self.threshold, 0.0, 2.0),
                                       ("--filter-keep", self.keep_share, 0.0, 1.0),
                                       ("--filter-explore", self.explore_share, 0.0, 1.0),
                                       ("--filter-min-tau", self.min_tau, -1.0, 1.0)):
            if not low <= value <= high:
                raise ValueError(f"{flag} must be between {low:g} and {high:g}; got {value}")
        self._rng = random.Random(self.seed)

    def trusts(self, trained: bool, recent_tau: float | None) -> bool:
        return trained and recent_tau is not None and recent_tau >= self.min_tau

    def select(self, scores: Sequence[float], trained: bool, recent_tau: float | None) -> Selection:
        n = len(scores)
        self.counts["proposed"] += n
        if not self.trusts(trained, recent_tau):
            self.counts["rounds_untrusted"] += 1
            self.counts["measured"] += n
            return Selection(list(range(n)), [], [])
        self.counts["rounds_filtered"] += 1
        order = sorted(range(n), key=lambda i: scores[i], reverse=True)
        likely = [i for i in order if scores[i] >= self.threshold]
        keep = order[:max(len(likely), math.ceil(self.keep_share * n), 1)]
        rest = order[len(keep):]
        explore = self._rng.sample(rest, min(len(rest), math.ceil(self.explore_share * n))) if rest else []
        dropped = [i for i in rest if i not in set(explore)]
        self.counts["measured"] += len(keep) + len(explore)
        self.counts["explored"] += len(explore)
        self.counts["dropped"] += len(dropped)
        return Selection(keep + explore, explore, dropped)

"""The candidate filter: measure what the latency model says can beat the task's best (Trimmer).

The search proposes a round of candidates; the filter, before anything is built,
keeps those the model scores at or above ``threshold`` (1.0 = as fast as the task's
best so far), fills the round up to ``keep_share`` of its proposals with the
next-best scores, and adds an exploration share drawn at random from what it would
drop. The random draw does double duty: it stops a wrong model from starving the
search, and, being an unbiased sample of the dropped candidates, it estimates how
often the filter drops a candidate that would have become the task's best.

The filter only drops while the model has earned it. Until then every proposal is
measured, and each such round is also a full census of what the filter *would* have
dropped: the filter is trusted once, over its last ``trust_rounds`` rounds with a
trained model, it would not have dropped a single candidate that went on to beat its
task's best, and the model ranks those rounds better than chance (mean Kendall tau at
least ``min_tau``). While trusted, its exploration sample keeps the same watch: one
dropped-then-explored candidate that beats the best revokes the trust.

A round of MetaSchedule's model-guided search costs the same whatever it returns: on 2 cores a
ResNet-18 convolution's costs 9 s of CPU, as much as building and timing 20-25 of its
candidates, and its population holds far more than one round. So the filter may ask such a
round for ``guided_pool`` rounds' worth of proposals to choose from: what it drops then saves
search as well as measurement, each proposal still counting against the task's budget. And
after its first generation the search adds little to what the model thinks of its population
(a convolution's mean score 0.84 after one, 0.86 after two, 0.87 after four, for 2.9, 5.0 and
9.4 s), so ``guided_generations`` can cut the round's cost where the model ranks as it does;
so can ``guided_population``, the schedules it evolves per candidate it brings (half the
population: 3.9 s, mean score 0.86).

Two rates are reported from that sample. "Beat the best at the time" is the watch that
trust rests on, and the stricter: early in a task almost any candidate beats its young
best. "Would have been the best" is what a drop can cost: the share of the sample that
ended as its task's fastest candidate of the job.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Selection:
    """Indices into a round's proposals: what to measure (``explore`` among them) and what to drop."""

    measure: list[int]
    explore: list[int]
    dropped: list[int]


GENERATIONS = 4  # MetaSchedule's own for its evolutionary search
POPULATION = 8  # schedules the model-guided search evolves per candidate a round wants (at least 16 wanted)


class CandidateFilter(ABC):
    """Chooses which of a round's proposals are built and measured."""

    name = "filter"
    guided_generations: int = GENERATIONS  # how many generations a round of the model-guided search evolves
    guided_population: int = POPULATION

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._sample: list[tuple[str, float]] = []  # (task, latency) of each dropped or would-be-dropped measured

    @abstractmethod
    def select(self, scores: Sequence[float], trained: bool, recent_tau: float | None) -> Selection:
        """``scores``: the model's normalised predictions; ``trained``/``recent_tau``: how far to trust them."""

    def observe(self, scores: Sequence[float], selection: Selection, improved: dict[int, bool], trained: bool,
                latencies: Mapping[int, float] | None = None, task: str = "") -> None:
        """After measurement: ``improved[i]`` says whether measured proposal ``i`` beat its task's best;
        ``latencies[i]`` is its latency, for the "would have been the best" rate of ``report``."""

    def trusts(self, trained: bool, recent_tau: float | None) -> bool:
        """Whether the next round would be filtered."""
        return False

    def guided_batch(self, round_size: int) -> int:
        """How many proposals a round of the model-guided search should bring, for a round of ``round_size``."""
        return round_size

    def report(self, final_best_s: Mapping[str, float] | None = None) -> dict[str, Any]:
        """``final_best_s``: each task's fastest latency of the job, on the scale ``observe`` was given."""
        c = self.counts
        seen = c["explored_measured"] + c["shadow_dropped"]
        out = {
            "filter": self.name,
            **dict(c),
            # of the candidates it dropped or would have dropped and that were measured all the same
            # (its exploration sample, and every proposal of the rounds it did not filter), the share
            # that beat their task's best at the time ...
            "would_be_best_drop_rate": (c["explored_would_be_best"] + c["shadow_would_be_best"]) / seen if seen else None,
        }
        if final_best_s is not None and self._sample:
            # ... and the share that ended as their task's fastest of the job (a failed candidate never did,
            # though its inf equals the best of a task where every candidate failed)
            ended_best = sum(1 for task, latency in self._sample
                             if math.isfinite(latency) and latency <= final_best_s.get(task, math.inf))
            out.update(final_best_sampled=len(self._sample), final_best_hits=ended_best,
                       final_best_drop_rate=ended_best / len(self._sample))
        return out

    def _watch(self, indices: Sequence[int], latencies: Mapping[int, float] | None, task: str) -> None:
        if latencies is not None:
            self._sample += [(task, latencies[i]) for i in indices if i in latencies]


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
    min_tau: float = 0.0
    trust_rounds: int = 3
    seed: int = 0
    guided_pool: float = 1.0
    guided_generations: int = GENERATIONS
    guided_population: int = POPULATION
    name: str = field(default="trimmer", init=False)

    def __post_init__(self) -> None:
        super().__init__()
        for flag, value, low, high in (("--filter-threshold", self.threshold, 0.0, 2.0),
                                       ("--filter-keep", self.keep_share, 0.0, 1.0),
                                       ("--filter-explore", self.explore_share, 0.0, 1.0),
                                       ("--filter-min-tau", self.min_tau, -1.0, 1.0),
                                       ("--filter-guided-pool", self.guided_pool, 1.0, 8.0)):
            if not low <= value <= high:
                raise ValueError(f"{flag} must be between {low:g} and {high:g}; got {value}")
        if self.trust_rounds < 1:
            raise ValueError(f"--filter-trust-rounds must be an integer of at least 1; got {self.trust_rounds}")
        if not 1 <= self.guided_generations <= 2 * GENERATIONS:
            raise ValueError(f"--filter-guided-generations must be an integer between 1 and {2 * GENERATIONS}; "
                             f"got {self.guided_generations}")
        if not 1 <= self.guided_population <= 2 * POPULATION:
            raise ValueError(f"--filter-guided-population must be an integer between 1 and {2 * POPULATION}; "
                             f"got {self.guided_population}")
        self._rng = random.Random(self.seed)
        self._evidence: deque[bool] = deque(maxlen=self.trust_rounds)  # per observed round: did it miss a best?

    def trusts(self, trained: bool, recent_tau: float | None) -> bool:
        return (trained and recent_tau is not None and recent_tau >= self.min_tau
                and len(self._evidence) == self.trust_rounds and not any(self._evidence))

    def guided_batch(self, round_size: int) -> int:
        return math.ceil(round_size * self.guided_pool)

    def report(self, final_best_s: Mapping[str, float] | None = None) -> dict[str, Any]:
        return {**super().report(final_best_s), "guided_pool": self.guided_pool,
                "guided_generations": self.guided_generations,
                "guided_population": self.guided_population}

    def select(self, scores: Sequence[float], trained: bool, recent_tau: float | None) -> Selection:
        n = len(scores)
        self.counts["proposed"] += n
        if not self.trusts(trained, recent_tau):
            self.counts["rounds_unfiltered"] += 1
            self.counts["measured"] += n
            return Selection(list(range(n)), [], [])
        self.counts["rounds_filtered"] += 1
        keep, rest = self.partition(scores)
        explore = self._rng.sample(rest, min(len(rest), math.ceil(self.explore_share * n))) if rest else []
        dropped = [i for i in rest if i not in set(explore)]
        self.counts["measured"] += len(keep) + len(explore)
        self.counts["explored"] += len(explore)
        self.counts["dropped"] += len(dropped)
        return Selection(keep + explore, explore, dropped)

    def observe(self, scores: Sequence[float], selection: Selection, improved: dict[int, bool], trained: bool,
                latencies: Mapping[int, float] | None = None, task: str = "") -> None:
        if not trained:
            return  # random scores say nothing about the model
        if selection.dropped or selection.explore:  # a filtered round: its exploration sample is the evidence
            watched = selection.explore
            hits = sum(improved.get(i, False) for i in watched)
            self.counts["explored_measured"] += len(watched)
            self.counts["explored_would_be_best"] += hits
        else:  # an unfiltered round: every proposal was measured, so what the rule would drop is known
            _, watched = self.partition(scores)
            hits = sum(improved.get(i, False) for i in watched)
            self.counts["shadow_dropped"] += len(watched)
            self.counts["shadow_would_be_best"] += hits
        self._watch(watched, latencies, task)
        self._evidence.append(hits > 0)

    def partition(self, scores: Sequence[float]) -> tuple[list[int], list[int]]:
        """The rule before exploration: (kept: likely winners, filled up to the floor; the rest), best first."""
        n = len(scores)
        order = sorted(range(n), key=lambda i: scores[i], reverse=True)
        likely = sum(1 for s in scores if s >= self.threshold)
        cut = max(likely, math.ceil(self.keep_share * n), 1)
        return order[:cut], order[cut:]

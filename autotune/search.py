"""Where a task's candidates come from each round: random draws, measured-fitness evolution, or the model's search.

MetaSchedule's evolutionary search evolves a population of hundreds of schedules for four
generations, ranked by the latency model. That pays once the model ranks well. Before, its
generations are ranked by noise, and on 2 cores they cost a convolution 6-20 s a round, as long
as building and timing the round. So a task's rounds go:

- ``sampled``: its first round, random draws from the design space (where the search starts anyway);
  a model that starts warm (trained by an earlier job) picks the round's draws from a pool four
  times its size, so a second job's first measurements are not random guesses;
- ``seeded``: a first round that leads with the best schedules an earlier job's database holds for
  the same workload (up to half the round, re-measured here), the rest drawn as above: a job
  warm-started from an earlier run starts where that run ended, and evolves from there;
- ``evolved``: mutants of the task's best measured schedules (measured latency is the fitness),
  from a pool four times what the round needs, ordered by the model's score once it is trained
  (at random before), plus a share of fresh random draws so the search can leave a basin;
- ``guided`` (unless the session turns it off, ``--no-guided-search``): once the model's rank
  correlation on candidates it had not seen holds at ``GUIDE_TAU``, MetaSchedule's evolutionary
  search under the model.

What guided rounds buy depends on the candidate filter. In the engine's own searches of the
ResNet-18 convolution at 1000 trials (two seeds, 2 cores), a guided round cost about 10 s of
search CPU against 1.6 s for an evolved one, and its candidates improved the task's best by more
than 1% three times less often (5 in 767 against 24 in 1201); without guided rounds the engine
found as fast a kernel or faster there and on the matmul, for a quarter to a third of the search
CPU. With the filter, evolved rounds alone did worse (the filtered search ended 26-68% above the
engine's, re-timed side by side): the filter keeps what the model favours among mutants the
model already ordered, and a guided round's population is the filtered search's way onto new
ground. Measuring every fresh random draw of an evolved round whatever the filter says recovered
part of it on one seed (1.23x instead of 1.54x), for less saved. So guided rounds stay on by
default (README, Search; findings, Trimmer).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

GUIDE_TAU = 0.3  # Kendall tau on fresh candidates from which the model's search is worth its cost
PARENTS = 8  # best measured schedules of the task that evolved rounds mutate
POOL_FACTOR = 4  # mutants drawn per mutant measured, for the model to choose from
EXPLORE_SHARE = 0.25  # of an evolved round: fresh random draws
DRAW_TRIES = 8  # repeats of seen schedules per wanted candidate before a round is left short (a small space runs dry)
# Draws the target rejects, per wanted candidate, before a round is left short: on a GPU most random draws
# break its thread and memory limits (6-7% of a matmul's and a convolution's pass for sm_90), on a CPU few do.
REJECT_TRIES = 128
DIRECTED = ("evolved", "guided")  # proposals that follow from this job's measurements (preemption counts them)

Scorer = Callable[[list[Any]], list[float]]


@dataclass
class Proposal:
    candidates: list[Any]  # MeasureCandidates
    kind: str  # the round's: "sampled", "seeded", "evolved" or "guided"
    origins: list[str]  # each candidate's: "seed" (an earlier job's), "draw" (random), "mutant" or "guided"


class TaskSearch:
    """One task's proposals. ``ctx`` is its TuneContext, already ``pre_tuning``'d with an evolutionary search.

    ``seeds``: traces of the best schedules earlier jobs found for this workload, best first; the
    first round leads with them.
    """

    def __init__(self, ctx: Any, design_spaces: Sequence[Any], seed: int, seeds: Sequence[Any] = ()) -> None:
        from tvm.s_tir import Trace

        self.ctx = ctx
        self._seeds = list(seeds)
        self._spaces = [Trace(s.trace.simplified(remove_postproc=True).insts, {}) for s in design_spaces]
        mutators = list(ctx.space_generator.mutator_probs.items())  # Mutator -> FloatImm
        self._mutators = [m for m, _ in mutators]
        self._mutator_p = np.array([float(p.value) for _, p in mutators])
        self._mutator_p /= self._mutator_p.sum()
        self._postprocs = list(ctx.space_generator.postprocs)
        self._rng = np.random.default_rng(seed)

    def propose(self, n: int, parents: Sequence[tuple[Any, float]], seen: set[int], scorer: Scorer | None,
                guided: bool, guided_n: int | None = None) -> Proposal:
        """Up to ``n`` candidates not in ``seen`` (structural hashes).

        Args:
            parents: the task's best measured (trace, latency in seconds), best first.
            scorer: the trained model's scores, higher is faster; None while it is untrained.
            guided: the model is trusted: hand the round to MetaSchedule's search.
            guided_n: how many a guided round proposes (``n`` if None): its search costs the same whatever
                it returns, so a filter may ask for more to choose from.
        """
        if guided:  # the search does not know what evolved rounds measured; if it brings nothing new, evolve
            fresh = [c for c in self.ctx.generate_measure_candidates() or [] if _hash(c) not in seen]
            if fresh:
                fresh = fresh[: guided_n or n]
                return Proposal(fresh, "guided", ["guided"] * len(fresh))
        if not parents:
            replays = self._draw(min(len(self._seeds), max(1, n // 2)), seen, self._replay)
            taken = seen | {_hash(c) for c in replays}
            if scorer is None:
                draws = self._draw(n - len(replays), taken, self._sample)
            else:  # a warm model picks the round's draws from a pool of them
                favourites, more = self._favourites(n - len(replays), taken, self._sample, scorer)
                draws = favourites + more
            return Proposal(replays + draws, "seeded" if replays else "sampled",
                            ["seed"] * len(replays) + ["draw"] * len(draws))
        weights = np.array([parents[0][1] / latency for _, latency in parents])
        traces = [trace for trace, _ in parents]
        mutants, draws = self._favourites(
            n, seen, lambda: self._mutant(traces[self._rng.choice(len(traces), p=weights / weights.sum())]), scorer)
        return Proposal(mutants + draws, "evolved", ["mutant"] * len(mutants) + ["draw"] * len(draws))

    def _favourites(self, n: int, seen: set[int], make: Callable[[], Any | None],
                    scorer: Scorer | None) -> tuple[list[Any], list[Any]]:
        """(The model's favourites of a pool from ``make``, a random pick while it is untrained; a share
        of fresh random draws, so that the search can leave the pool's basin)."""
        explore = max(1, round(n * EXPLORE_SHARE)) if n > 1 else 0
        pool = self._draw(POOL_FACTOR * (n - explore), seen, make)
        if scorer and pool:
            order = np.argsort(-np.asarray(scorer(pool)), kind="stable")
        else:
            order = self._rng.permutation(len(pool))
        picks = [pool[i] for i in order[: n - explore]]
        taken = seen | {_hash(c) for c in picks}
        return picks, self._draw(n - len(picks), taken, self._sample)

    def _draw(self, n: int, seen: set[int], make: Callable[[], Any | None]) -> list[Any]:
        """``n`` new candidates from ``make`` (None: a draw the target rejected), unless the tries run out first.

        Repeats and rejects are counted apart: repeats say the design space is running dry (and a
        task whose round comes back empty ends), rejects only that the target is strict.
        """
        out: list[Any] = []
        taken = set(seen)
        repeats = rejects = 0
        while len(out) < n and repeats < DRAW_TRIES * n and rejects < REJECT_TRIES * n:
            candidate = make()
            if candidate is None:
                rejects += 1
            elif (h := _hash(candidate)) in taken:
                repeats += 1
            else:
                taken.add(h)
                out.append(candidate)
        return out

    def _replay(self) -> Any | None:
        """The next earlier job's schedule (its decisions kept), or None once they have all been tried."""
        return self._realize(self._seeds.pop(0)) if self._seeds else None

    def _sample(self) -> Any | None:
        return self._realize(self._spaces[self._rng.integers(len(self._spaces))])

    def _mutant(self, trace: Any) -> Any | None:
        from tvm.s_tir.meta_schedule import _ffi_api

        mutator = self._mutators[self._rng.choice(len(self._mutators), p=self._mutator_p)]
        mutated = _ffi_api.MutatorApply(mutator, trace, self._seed())
        return None if mutated is None else self._realize(mutated)

    def _realize(self, trace: Any) -> Any | None:
        """The candidate ``trace`` schedules (its free decisions drawn), post-processed; None if it does not apply.

        As MetaSchedule's own sampler: replay without the old post-processing, then run the
        post-processors, which reject schedules the target cannot run.
        """
        from tvm.s_tir import Schedule
        from tvm.s_tir.meta_schedule.arg_info import ArgInfo
        from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

        sch = Schedule(self.ctx.mod, seed=self._seed(), error_render_level="none")
        try:
            trace.apply_to_schedule(sch, remove_postproc=True)
            sch.enter_postproc()
            if not all(p.apply(sch) for p in self._postprocs):
                return None
        except (RuntimeError, ValueError):  # TVM's schedule and check errors: a draw that failed
            return None
        return MeasureCandidate(sch, ArgInfo.from_entry_func(sch.mod, remove_preproc=True))

    def _seed(self) -> int:
        return int(self._rng.integers(1, 2**31 - 1))


def trusts_model(recent_tau: float | None) -> bool:
    """Whether the model has ranked fresh candidates well enough to guide the search."""
    return recent_tau is not None and not math.isnan(recent_tau) and recent_tau >= GUIDE_TAU


def _hash(candidate: Any) -> int:
    import tvm_ffi

    return tvm_ffi.structural_hash(candidate.sch.mod)

"""Where a task's candidates come from: random draws, mutants of the measured best, the model's search."""

from __future__ import annotations

import math

import pytest

from autotune.search import EXPLORE_SHARE, GUIDE_TAU, POOL_FACTOR, TaskSearch, trusts_model
from tests.conftest import schedule_hash as _hash


@pytest.fixture(scope="module")
def task(matmul_task):
    return matmul_task


@pytest.fixture(scope="module")
def search(task):
    return TaskSearch(*task, seed=0)


def _decisions(c) -> set[str]:
    """The sampling lines of a candidate's trace, decisions included."""
    return {line for line in c.sch.trace.as_python() if "sample" in line}


def test_a_first_round_is_distinct_random_draws_none_already_seen(search):
    first = search.propose(8, [], set(), None, guided=False)
    assert first.kind == "sampled" and len(first.candidates) == 8
    seen = {_hash(c) for c in first.candidates}
    assert len(seen) == 8
    again = search.propose(8, [], seen, None, guided=False)
    assert not seen & {_hash(c) for c in again.candidates}


def _score(c) -> float:
    """A stand-in model's score: a fixed function of the candidate, so its favourites are known."""
    return float(_hash(c) % 1000)


def _takes_favourites(search, n: int, parents, seen: set[int]):
    """Propose ``n`` with the stand-in model; check the round leads with its favourites of one pool."""
    pools = []

    def scorer(candidates):
        pools.append(candidates)
        return [_score(c) for c in candidates]

    proposal = search.propose(n, parents, seen, scorer, guided=False)
    explore = round(n * EXPLORE_SHARE)
    (pool,) = pools
    assert len(pool) == POOL_FACTOR * (n - explore) and len({_hash(c) for c in proposal.candidates}) == n
    favourites = sorted(pool, key=lambda c: -_score(c))[: n - explore]
    assert [_hash(c) for c in proposal.candidates[: n - explore]] == [_hash(c) for c in favourites]
    return proposal, explore


def test_a_warm_models_first_round_takes_its_favourites_of_a_larger_random_pool(search):
    first, _ = _takes_favourites(search, 8, [], set())
    assert first.kind == "sampled" and first.origins == ["draw"] * 8


def test_an_evolved_round_mutates_the_best_and_takes_the_models_favourites(search):
    parent = search.propose(1, [], set(), None, guided=False).candidates[0]
    n = 8
    evolved, explore = _takes_favourites(search, n, [(parent.sch.trace, 1e-3)], {_hash(parent)})
    assert evolved.kind == "evolved" and evolved.origins == ["mutant"] * (n - explore) + ["draw"] * explore
    assert _hash(parent) not in {_hash(c) for c in evolved.candidates}
    # a mutant keeps most of its parent's decisions; a fresh draw (the exploration share) keeps fewer
    kept = [len(_decisions(c) & _decisions(parent)) / len(_decisions(parent)) for c in evolved.candidates]
    assert min(kept[: n - explore]) >= 0.5 and sum(kept[: n - explore]) / (n - explore) > max(kept[n - explore:])


def test_a_trusted_model_hands_the_round_to_metaschedules_search(search):
    guided = search.propose(8, [], set(), None, guided=True)
    assert guided.kind == "guided" and 0 < len(guided.candidates) <= 8
    assert guided.origins == ["guided"] * len(guided.candidates)


def test_a_guided_round_brings_what_a_filter_asks_for_and_otherwise_one_round(search):
    pooled = search.propose(2, [], set(), None, guided=True, guided_n=6)
    assert pooled.kind == "guided" and 2 < len(pooled.candidates) <= 6
    assert 0 < len(search.propose(2, [], set(), None, guided=True).candidates) <= 2


@pytest.mark.parametrize("tau, trusted", [(None, False), (math.nan, False), (GUIDE_TAU - 0.01, False),
                                          (GUIDE_TAU, True), (0.9, True)])
def test_the_model_is_trusted_from_its_rank_correlation_on_fresh_candidates(tau, trusted):
    assert trusts_model(tau) is trusted


def test_a_seeded_first_round_leads_with_the_earlier_jobs_schedules_then_draws(task, search):
    earlier = search.propose(3, [], set(), None, guided=False).candidates
    seeded = TaskSearch(*task, seed=1, seeds=[c.sch.trace for c in earlier])
    first = seeded.propose(4, [], set(), None, guided=False)
    # at most half the round replays (decisions kept, so the same programs); the rest is fresh draws
    assert first.kind == "seeded" and len(first.candidates) == 4 and first.origins == ["seed"] * 2 + ["draw"] * 2
    assert [_hash(c) for c in first.candidates[:2]] == [_hash(c) for c in earlier[:2]]
    assert not {_hash(c) for c in first.candidates[2:]} & {_hash(c) for c in earlier}
    # a seed measured already is not proposed again; once the seeds are used, first rounds are draws
    again = seeded.propose(4, [], {_hash(earlier[2])}, None, guided=False)
    assert again.kind == "sampled" and _hash(earlier[2]) not in {_hash(c) for c in again.candidates}

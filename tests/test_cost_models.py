"""The Trimmer policies: candidate filter, preemption, energy bill, and the saved latency model."""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
from pathlib import Path

import pytest

from autotune.errors import UsageError
from autotune.policies import PolicySettings, start_latency_model
from cost_models.candidate_filter import MeasureAll, TrimmerFilter
from cost_models.energy import EnergyLedger, RaplMeter, cpu_meter, gpu_meter
from cost_models.preemption import COUNTS, NeverPreempt, PlateauPreemption, TaskRound
from cost_models.quality import RankQuality

# -- candidate filter ---------------------------------------------------------------------------


def _earn_trust(f: TrimmerFilter, n: int = 20) -> None:
    """Unfiltered rounds with a trained model in which no proposal the rule would drop beat the best."""
    scores = [0.05 * i for i in range(n)]
    for _ in range(f.trust_rounds):
        s = f.select(scores, trained=True, recent_tau=0.5)
        assert s.dropped == [] and s.measure == list(range(n))
        f.observe(scores, s, {i: i == n - 1 for i in range(n)}, trained=True)  # only the top score improved


def test_filter_measures_everything_until_the_model_has_earned_trust():
    f = TrimmerFilter(min_tau=0.0, trust_rounds=2)
    scores = [0.1 * i for i in range(10)]
    for trained, tau in ((False, 0.9), (True, None), (True, -0.2), (True, 0.5)):  # the last: no evidence yet
        assert f.select(scores, trained, tau).measure == list(range(10))
    _earn_trust(f)
    assert not f.trusts(True, -0.2) and f.trusts(True, 0.0)
    assert f.counts["dropped"] == 0 and f.counts["shadow_dropped"] == 2 * 15  # 25% of 20 kept, 15 would go


def test_a_would_be_best_the_rule_would_have_dropped_withholds_trust():
    f = TrimmerFilter(trust_rounds=1)
    scores = [0.1, 0.2, 0.3, 0.4]
    f.observe(scores, f.select(scores, True, 0.5), {0: True, 1: False, 2: False, 3: False}, trained=True)
    assert not f.trusts(True, 0.5) and f.report()["would_be_best_drop_rate"] == pytest.approx(1 / 3)


def test_the_drop_rate_that_counts_is_the_share_of_the_sample_that_ended_as_its_task_s_best():
    f = TrimmerFilter(trust_rounds=1)
    scores = [0.1, 0.2, 0.3, 0.4]  # the rule keeps the top one and would drop 0, 1, 2
    first = {0: 5.0, 1: 4.0, 2: 9.0, 3: 3.0}  # 1 beats the best then (4 < 5) but not the job's best (2.0, below)
    f.observe(scores, f.select(scores, True, 0.5), {0: True, 1: True, 2: False, 3: True}, True, first, "a")
    then = {0: 2.0, 1: 6.0, 2: 7.0, 3: 8.0}  # 0 beats the best and ends as the task's fastest
    f.observe(scores, f.select(scores, True, 0.5), {0: True, 1: False, 2: False, 3: False}, True, then, "a")
    report = f.report({"a": 2.0})
    assert report["would_be_best_drop_rate"] == pytest.approx(3 / 6)
    assert (report["final_best_sampled"], report["final_best_hits"]) == (6, 1)
    assert report["final_best_drop_rate"] == pytest.approx(1 / 6)
    assert "final_best_drop_rate" not in f.report()  # without the job's bests there is nothing to compare with


def test_a_failed_candidate_never_ended_as_its_task_s_best():
    f = TrimmerFilter(trust_rounds=1)
    scores = [0.1, 0.2, 0.3, 0.4]  # the rule keeps the top one and would drop 0, 1, 2
    failed = {i: math.inf for i in range(4)}
    f.observe(scores, f.select(scores, True, 0.5), {i: False for i in range(4)}, True, failed, "a")
    report = f.report({"a": math.inf})  # every candidate of the task failed: its best is inf too
    assert (report["final_best_sampled"], report["final_best_hits"], report["final_best_drop_rate"]) == (3, 0, 0.0)


def test_filter_keeps_likely_winners_fills_to_the_floor_and_explores_what_it_drops():
    f = TrimmerFilter(threshold=0.9, keep_share=0.25, explore_share=0.1, seed=1)
    _earn_trust(f)
    scores = [1.2, 0.95, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05, 0.02, 0.01, 0.3, 0.2, 0.1, 0.1, 0.0, 0.0,
              0.6, 0.7, 0.1, 0.2]
    s = f.select(scores, trained=True, recent_tau=0.5)
    kept = [i for i in s.measure if i not in s.explore]
    assert len(kept) == 5  # the floor: 25% of 20 proposals, the two likely winners first, then the next-best
    assert kept == [0, 1, 17, 16, 2]
    assert len(s.explore) == 2 and not set(s.explore) & set(kept)
    assert sorted(s.measure + s.dropped) == list(range(20)) and not set(s.measure) & set(s.dropped)
    # one explored candidate beats the best: the estimate says so, and the filter stops filtering
    f.observe(scores, s, {i: i == s.explore[0] for i in s.measure}, trained=True)
    assert not f.trusts(True, 0.5)
    report = f.report()
    assert report["dropped"] == 13 and report["explored_would_be_best"] == 1
    assert report["would_be_best_drop_rate"] == pytest.approx(1 / (3 * 15 + 2))


def test_filter_keeps_every_proposal_that_may_beat_the_best():
    f = TrimmerFilter(threshold=0.9, keep_share=0.0, explore_share=0.0, trust_rounds=1)
    f.observe([0.0, 1.0], f.select([0.0, 1.0], True, 0.5), {0: False, 1: True}, trained=True)
    s = f.select([1.5, 0.91, 0.89, 2.0], trained=True, recent_tau=0.2)
    assert sorted(s.measure) == [0, 1, 3] and s.dropped == [2]


def test_measure_all_drops_nothing():
    assert MeasureAll().select([0.0, 5.0], False, None).dropped == []


@pytest.mark.parametrize("kwargs, flag", [({"filter_threshold": 3.0}, "--filter-threshold"),
                                          ({"filter_explore": -0.1}, "--filter-explore"),
                                          ({"filter_keep": 1.5}, "--filter-keep"),
                                          ({"filter_guided_pool": 0.5}, "--filter-guided-pool"),
                                          ({"filter_guided_generations": 0}, "--filter-guided-generations"),
                                          ({"filter_guided_population": 17}, "--filter-guided-population"),
                                          ({"task_patience": -1}, "--task-patience"),
                                          ({"model_window": 0}, "--model-window"),
                                          ({"min_improvement": 1.0}, "--min-improvement"),
                                          ({"patience_share": -0.1}, "--patience-share"),
                                          ({"solo_patience_share": 1.0}, "--solo-patience-share"),
                                          ({"watts_per_core": 0.0}, "--watts-per-core"),
                                          ({"price_per_hour": -1.0}, "--price-per-hour")])
def test_thresholds_out_of_range_are_usage_errors(kwargs, flag):
    with pytest.raises(UsageError, match=flag):
        PolicySettings(**kwargs)


def test_rank_quality_is_kendall_tau_against_throughput():
    q = RankQuality()
    # scores rank 1 > 2 > 3, latencies rank the same way (shorter is better): perfect agreement
    assert q.record("t", [3.0, 2.0, 1.0], [1e-3, 2e-3, 3e-3], trained=True) == pytest.approx(1.0)
    assert q.record("t", [1.0, 2.0, 9.0, 3.0], [1e-3, 2e-3, math.inf, 3e-3], trained=True) == pytest.approx(-1.0)
    assert q.record("t", [1.0, 2.0], [1e-3, 2e-3], trained=True) is None  # too few to rank
    assert q.recent_tau() == pytest.approx(0.0)

# -- preemption ----------------------------------------------------------------------------------


def test_task_stops_after_patience_proposals_without_gain_and_only_after_its_minimum():
    p = PlateauPreemption(task_patience=32, min_task_trials=56, model_window=10**6)
    rounds = [(math.inf, 10.0, 16), (10.0, 10.0, 24), (10.0, 9.95, 32), (9.95, 9.95, 40), (9.95, 9.91, 48),
              (9.91, 9.91, 56)]
    stops = [p.after_round([TaskRound("a", before, after, proposed)], after).stop_tasks
             for before, after, proposed in rounds]
    # 9.95, then 9.91, are within the 1% minimum gain of 10.0: 8 proposals a round without gain from the
    # second round on. The patience of 32 is reached at 48 proposals, but the task's minimum only at 56.
    assert stops[:5] == [{}, {}, {}, {}, {}]
    assert "a" in stops[5] and "40 proposals" in stops[5]["a"]


def test_small_gains_that_add_up_to_the_minimum_reset_the_patience():
    p = PlateauPreemption(task_patience=24, min_task_trials=0, model_window=10**6)
    best, stops = 10.0, []
    for proposed in range(16, 16 * 8, 16):  # 0.6% a round: no single round gains 1%, every second round has since
        stops.append(p.after_round([TaskRound("a", best, best * 0.994, proposed)], best * 0.994).stop_tasks)
        best *= 0.994
    assert stops == [{}] * len(stops)


def test_the_patience_counts_proposals_not_rounds():
    """The same 64 flat proposals stop a task in rounds of 8 and in rounds of 32."""
    for size in (8, 32):
        p = PlateauPreemption(task_patience=64, min_task_trials=0, model_window=10**6)
        p.after_round([TaskRound("a", math.inf, 1.0, size, directed=False)], 1.0)
        stopped_at = next(n for n in range(2 * size, 10**4, size)
                          if p.after_round([TaskRound("a", 1.0, 1.0, n)], 1.0).stop_tasks)
        assert stopped_at == size + 64


def test_counted_in_measurements_the_patience_skips_what_the_filter_dropped():
    """Rounds of 16 proposals, 8 of them dropped unbuilt: 64 flat proposals are 32 flat measurements."""
    stopped_at = {}
    for counts in COUNTS:
        p = PlateauPreemption(task_patience=64, min_task_trials=0, model_window=10**6, counts=counts)
        p.after_round([TaskRound("a", math.inf, 1.0, 16, directed=False, measured=16)], 1.0)
        stopped_at[counts] = next(n for n in range(32, 10**4, 16)
                                  if p.after_round([TaskRound("a", 1.0, 1.0, n, measured=16 + (n - 16) // 2)],
                                                   1.0).stop_tasks)
        assert f"64 {counts}" in p.rule
    assert stopped_at == {"proposals": 16 + 64, "measurements": 16 + 128}
    with pytest.raises(ValueError, match="--patience-counts must be one of proposals, measurements; got 'rounds'"):
        PlateauPreemption(counts="rounds")


def test_the_patience_grows_to_its_share_of_a_large_budget():
    """96 flat proposals stop a task of 320 trials; one of 1000 gets a quarter of them, 250."""
    for budget, stopped_at in ((320, 16 + 96), (1000, 16 + 256)):
        p = PlateauPreemption(task_patience=96, min_task_trials=0, model_window=10**6, patience_share=0.25,
                              solo_patience_share=0.25)
        p.after_round([TaskRound("a", math.inf, 1.0, 16, directed=False, budget=budget)], 1.0)
        assert next(n for n in range(32, budget, 16)
                    if p.after_round([TaskRound("a", 1.0, 1.0, n, budget=budget)], 1.0).stop_tasks) == stopped_at
    assert "at least 25% of the planned budget" in p.rule


def test_a_job_of_one_task_waits_its_own_longer_share_and_says_so():
    """At 1000 trials a lone task waits 400 flat proposals; beside another task, 250."""
    for tasks, stopped_at in (("a", 16 + 400), ("ab", 16 + 256)):
        p = PlateauPreemption(task_patience=96, min_task_trials=0, model_window=10**6, patience_share=0.25,
                              solo_patience_share=0.4)
        p.after_round([TaskRound(t, math.inf, 1.0, 16, directed=False, budget=1000) for t in tasks], 1.0)
        assert next(n for n in range(32, 1000, 16) if p.after_round(
            [TaskRound(t, 1.0, 1.0, n, budget=1000) for t in tasks], 1.0).stop_tasks) == stopped_at
        assert p.rule == p.rule_for(len(tasks))
    assert p.rule_for(1).endswith("at least 40% of the planned budget (a job of one task)")
    assert p.rule_for(2).endswith("at least 25% of the planned budget")


def test_the_job_window_grows_to_its_share_of_the_live_tasks_mean_budget():
    # rounds of 16 a task: a window of 64 proposals closes at the 4th flat round, one of 200 (a quarter of 800) at the 13th
    for budgets, stop in (((200, 200), 16 + 64), ((1000, 600), 16 + 208)):
        p = PlateauPreemption(task_patience=10**6, min_task_trials=0, model_window=64, patience_share=0.25)
        p.after_round([TaskRound(t, math.inf, 1.0, 16, budget=b) for t, b in zip("ab", budgets)], 2.0)
        stopped_at = next(n for n in range(32, 10**4, 16)
                          if p.after_round([TaskRound(t, 1.0, 1.0, n, budget=b) for t, b in zip("ab", budgets)],
                                           2.0).stop_job)
        assert stopped_at == stop


def test_improving_task_is_never_stopped():
    p = PlateauPreemption(task_patience=1, min_task_trials=0, model_window=1)
    best = 10.0
    for proposed in range(16, 120, 16):
        decision = p.after_round([TaskRound("a", best, best * 0.9, proposed)], best * 0.9)
        best *= 0.9
        assert decision.stop_tasks == {} and not decision.stop_job


def test_a_task_that_used_its_whole_budget_is_not_counted_as_stopped():
    """Flat as long as its neighbour, but its round used its last trial: it ended, there was nothing to stop."""
    p = PlateauPreemption(task_patience=16, min_task_trials=0, model_window=10**6)
    p.after_round([TaskRound(t, math.inf, 1.0, 16, directed=False) for t in "ab"], 2.0)
    decision = p.after_round([TaskRound("a", 1.0, 1.0, 32), TaskRound("b", 1.0, 1.0, 32, budget_left=False)], 2.0)
    assert list(decision.stop_tasks) == ["a"] and list(p.report()["stopped_tasks"]) == ["a"]


def test_job_stops_when_the_model_latency_is_flat_over_its_window_of_proposals_per_task():
    p = PlateauPreemption(task_patience=10**6, min_task_trials=0, model_window=32)
    # two tasks, 16 proposals each a round; task a gains in the first three rounds only
    bests, reasons = [10.0, 10.0, 8.0, 7.0, 7.0, 7.0, 7.0], []
    for i, n in enumerate(range(16, 16 * 7, 16)):
        rounds = [TaskRound("a", bests[i], bests[i + 1], n), TaskRound("b", 1.0, 1.0, n)]
        reasons.append(p.after_round(rounds, bests[i + 1] + 1.0).stop_job)
    assert not any(reasons[:4]) and "flat over the last 32 proposals per live task" in reasons[4]
    assert not NeverPreempt().after_round([TaskRound("a", 1.0, 1.0, 10**6)], 1.0).stop_tasks


def test_the_job_window_counts_gains_on_the_live_tasks_part_of_the_estimate():
    """A heavy task has stopped; a light one still gains 1.5% every 32 proposals. That is 0.15% of the
    estimate, under the 1% minimum, but the job goes on: the live part (the light task) is still gaining.
    The stopped task leaving the sum is not a gain either: the job stops once the light one is flat."""
    p = PlateauPreemption(task_patience=10**6, min_task_trials=0, model_window=64)
    heavy, light, reasons = 9.0, 1.0, []
    p.after_round([TaskRound("heavy", math.inf, heavy, 16, weight=1), TaskRound("light", math.inf, light, 16)],
                  heavy + light)
    for n in range(48, 48 + 32 * 10, 32):
        reasons.append(p.after_round([TaskRound("light", light, light * 0.985, n)], heavy + light * 0.985).stop_job)
        light *= 0.985
    assert not any(reasons)
    flat = [p.after_round([TaskRound("light", light, light, n)], heavy + light).stop_job
            for n in range(368, 368 + 32 * 3, 32)]
    assert flat[:1] == [""] and "flat over the last 64 proposals" in flat[1]

# -- energy --------------------------------------------------------------------------------------


WORK = {"search": {"cpu_s": 30.0, "device_s": 0.0}, "build": {"cpu_s": 60.0, "device_s": 0.0},
        "measure": {"cpu_s": 10.0, "device_s": 5.0}}
WASTED = {"measurements": 3, "of": 4, "cpu_s": 20.0, "device_s": 2.0}


def test_estimated_bill_is_cpu_seconds_times_watts_and_says_so():
    ledger = EnergyLedger(watts_per_core=10.0, price_per_device_hour=3.6)
    bill = ledger.bill(WORK, wall_s=100.0, devices=1, wasted=WASTED)
    assert bill["estimated"] and "estimated" in bill["method"]["cpu"]
    assert bill["energy_j"] == pytest.approx(1000.0)
    assert bill["phases"]["build"]["energy_j"] == pytest.approx(600.0)
    assert bill["device_s_measuring"] == 5.0 and bill["wasted"]["energy_j"] == pytest.approx(200.0)
    assert bill["cost"] == pytest.approx(0.1)


def _rapl_tree(root: Path, energy_uj: int, package: int = 0) -> None:
    """A package zone whose counter wraps at 1000 J."""
    zone = root / f"intel-rapl:{package}"
    (zone / f"intel-rapl:{package}:0").mkdir(parents=True, exist_ok=True)  # a sub-zone (core): not summed
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text("1000000000\n")
    (zone / f"intel-rapl:{package}:0" / "energy_uj").write_text("5\n")


def test_rapl_counter_is_read_split_by_cpu_seconds_and_survives_wraparound(tmp_path):
    _rapl_tree(tmp_path, 999_000_000)  # 1 kJ before the counter wraps at 1000 J
    ledger = EnergyLedger(cpu=RaplMeter(str(tmp_path)))
    _rapl_tree(tmp_path, 99_000_000)  # wrapped: 1 J + 99 J = 100 J since start
    bill = ledger.bill(WORK, wall_s=10.0, devices=1, wasted=WASTED)
    assert not bill["estimated"] and "RAPL" in bill["method"]["cpu"]
    assert bill["energy_j"] == pytest.approx(100.0)
    assert bill["phases"]["search"]["energy_j"] == pytest.approx(30.0)


def test_each_rapl_package_wraps_on_its_own(tmp_path):
    _rapl_tree(tmp_path, 999_000_000, package=0)
    _rapl_tree(tmp_path, 100_000_000, package=1)
    ledger = EnergyLedger(cpu=RaplMeter(str(tmp_path)))
    _rapl_tree(tmp_path, 2_000_000, package=0)  # wrapped: 1 J + 2 J
    _rapl_tree(tmp_path, 102_000_000, package=1)  # 2 J
    assert ledger.bill(WORK, wall_s=10.0, devices=1, wasted=WASTED)["energy_j"] == pytest.approx(5.0)


def test_a_rapl_counter_sampled_as_the_job_goes_bills_more_than_one_wrap(tmp_path):
    _rapl_tree(tmp_path, 100_000_000)
    ledger = EnergyLedger(cpu=RaplMeter(str(tmp_path)))
    for energy_uj in (900_000_000, 600_000_000):  # 800 J, then 700 J across a wrap
        _rapl_tree(tmp_path, energy_uj)
        ledger.sample()
    _rapl_tree(tmp_path, 200_000_000)  # 600 J across another wrap
    assert ledger.bill(WORK, wall_s=10.0, devices=1, wasted=WASTED)["energy_j"] == pytest.approx(2100.0)


def test_no_rapl_zones_is_an_error_the_ledger_turns_into_an_estimate(tmp_path, monkeypatch):
    with pytest.raises(OSError, match="no RAPL package zones"):
        RaplMeter(str(tmp_path))
    # cpu_meter reads the powercap tree at RaplMeter's default root: point that at a folder of our own
    monkeypatch.setattr(RaplMeter.__init__, "__defaults__", (str(tmp_path / "powercap"),))
    (tmp_path / "powercap").mkdir()
    assert cpu_meter() is None  # no zones
    (tmp_path / "powercap" / "intel-rapl:0").mkdir()
    assert cpu_meter() is None  # a zone whose counters cannot be read (as for a non-root user on recent kernels)
    _rapl_tree(tmp_path / "powercap", 5_000_000)
    assert isinstance(cpu_meter(), RaplMeter)  # the same root with a readable counter is measured
    shutil.rmtree(tmp_path / "powercap" / "intel-rapl:0")
    ledger = EnergyLedger(cpu=cpu_meter(), gpu=gpu_meter([]), watts_per_core=10.0)
    bill = ledger.bill(WORK, wall_s=100.0, devices=1, wasted=WASTED)
    assert bill["estimated"] is True and bill["method"] == {"cpu": "estimated: 10 W per busy core x CPU-seconds",
                                                           "gpu": None}
    assert bill["energy_j"] == pytest.approx(1000.0) and bill["gpu_energy_j"] is None  # 100 CPU-seconds x 10 W

# -- the saved latency model ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained_model(tuned_run):
    from autotune.target import resolve_target
    from cost_models.latency_model import create_latency_model, warm_start_from_databases

    target = resolve_target("cpu").tvm_target()
    model = create_latency_model(2, warmup_samples=1)
    learned = warm_start_from_databases(model, [tuned_run.artifact / "database"], target, 2)
    return model, target, learned


def test_a_schedule_is_featurised_once_and_its_features_are_the_extractor_s_own(matmul_task):
    import numpy as np
    from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

    from autotune.search import TaskSearch
    from cost_models.latency_model import remembered_features

    ctx, spaces = matmul_task
    drawn = TaskSearch(ctx, spaces, seed=0).propose(6, [], set(), None, False).candidates
    copies = [MeasureCandidate(c.sch.copy(), c.args_info) for c in drawn[:3]]  # the same schedules, new objects
    fresh = [f.numpy() for f in PerStoreFeature().extract_from(ctx, drawn)]
    features = remembered_features()
    first = features.extract_from(ctx, drawn[:4])
    second = features.extract_from(ctx, copies + drawn[4:])
    assert (features._inst.misses, features._inst.hits) == (6, 3)
    for got, want in zip([f.numpy() for f in first + second[3:]] + [f.numpy() for f in second[:3]],
                         fresh + fresh[:3]):
        assert np.array_equal(got, want)
    small = remembered_features(kept=2)
    small.extract_from(ctx, drawn[:4])
    small.extract_from(ctx, drawn[:1])  # forgotten: only the last two are kept
    assert (small._inst.misses, small._inst.hits, len(small._inst._features)) == (5, 0, 2)


def test_a_database_warm_starts_the_model(trained_model, tuned_run):
    from cost_models.latency_model import is_trained, samples

    model, _, learned = trained_model
    assert learned == tuned_run.manifest["tuning"]["trials"] == samples(model) and is_trained(model)


def test_saved_model_round_trips_without_pickle(trained_model, tmp_path):
    import numpy as np

    from cost_models.latency_model import load_latency_model, samples, save_latency_model

    model, target, _ = trained_model
    old = os.umask(0o022)
    try:
        save_latency_model(model, tmp_path / "m", target)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m").stat().st_mode) == 0o755, "another user could not warm-start from it"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"], "a staging folder was left behind"
    with np.load(tmp_path / "m" / "data.npz", allow_pickle=False) as data:
        assert data["features"].shape[1] == 164
    again = load_latency_model(tmp_path / "m", target, 2)
    assert samples(again) == samples(model)
    assert again._inst.booster.save_raw("json") == model._inst.booster.save_raw("json")


@pytest.mark.parametrize("damage, phrase", [
    (lambda m: (m / "meta.json").write_text("{not json"), "not a saved latency model"),
    (lambda m: _edit_meta(m, target="llvm:skylake"), "trained for llvm:skylake"),
    (lambda m: _edit_meta(m, feature_length=100), "100 features per store"),
    (lambda m: (m / "data.npz").write_bytes(b"\0" * 64), "corrupt"),
])
def test_mismatched_or_corrupt_model_is_refused_and_tuning_starts_fresh(trained_model, tmp_path, damage, phrase):
    from cost_models.latency_model import save_latency_model, samples

    model, target, _ = trained_model
    save_latency_model(model, tmp_path / "m", target)
    damage(tmp_path / "m")
    said = []
    fresh = start_latency_model([str(tmp_path / "m")], target, 2, 0, said.append)
    assert samples(fresh) == 0
    assert len(said) == 1 and phrase in said[0] and "fresh latency model" in said[0]


def _best_schedule_hash(database, mod) -> int:
    """The structural hash of the best schedule ``database`` holds for workload ``mod``."""
    import tvm_ffi
    from tvm.s_tir import Schedule

    (record,) = database.get_top_k(database.commit_workload(mod), 1)
    sch = Schedule(mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return tvm_ffi.structural_hash(sch.mod)


def test_a_warm_start_from_an_earlier_run_measures_its_best_schedules_first(tuned_run, tmp_path):
    """Started from an artifact, a job's first round of each task replays the earlier job's best (its model too)."""
    import tvm_ffi
    from tvm.s_tir import Schedule

    from autotune.config import TuneConfig
    from autotune.pipeline import prepare_model, run_tuning
    from autotune.policies import build_policies
    from autotune.progress import SilentProgress
    from cost_models.latency_model import open_database, samples

    config = TuneConfig(model="zoo:mlp", out_dir=tmp_path, trials=6, batch_sizes=(1,), round_size=2, trial_floor=2)
    prepared = prepare_model(config, SilentProgress())
    said = []
    policies = build_policies(PolicySettings(warm_start=(str(tuned_run.artifact),), filter=False, preemption=False),
                              prepared.target, 2, 0, [], said.append)
    assert said == [] and samples(policies.latency_model) == tuned_run.manifest["tuning"]["trials"]
    session, ranked = run_tuning(prepared.tasks, prepared.plan, prepared.target_spec, prepared.target,
                                 tmp_path / "tuning", round_size=2, policies=policies)
    earlier = open_database(tuned_run.artifact / "database")
    assert session.policies_report()["seeded_from_earlier_jobs"] == {t.name: 2 for t in prepared.tasks}
    log = [json.loads(line) for line in (tmp_path / "tuning" / "measurements.jsonl").read_text().splitlines()]
    for task in prepared.tasks:
        first = next(m for m in log if m["task"] == task.name)
        assert first["proposed_by"] == "seeded"  # a round of two: the earlier best, then a fresh draw
        measured = set()
        for record in ranked.get_all_tuning_records():
            if tvm_ffi.structural_equal(record.workload.mod, task.mod):
                sch = Schedule(task.mod)
                record.trace.apply_to_schedule(sch, remove_postproc=False)
                measured.add(tvm_ffi.structural_hash(sch.mod))
        assert _best_schedule_hash(earlier, task.mod) in measured
    assert {m["proposed_by"] for m in log} <= {"seeded", "evolved", "guided"}  # no task started from draws alone


def test_a_damaged_earlier_database_is_refused_and_the_job_starts_from_draws(tmp_path):
    from autotune.policies import build_policies
    from autotune.target import resolve_target
    from cost_models.latency_model import samples

    (tmp_path / "database_workload.json").write_text("{not json\n")
    (tmp_path / "database_tuning_record.json").write_text("[1, 2\n")
    said = []
    policies = build_policies(PolicySettings(warm_start=(str(tmp_path),)), resolve_target("cpu").tvm_target(), 2, 0,
                              [], said.append)
    assert policies.warm_databases == () and samples(policies.latency_model) == 0
    assert len(said) == 2 and all("tuning database is corrupt" in line for line in said)
    assert said[0].startswith("warm start refused") and said[1].startswith("earlier schedules not used")


def _edit_meta(folder: Path, **changes) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, **changes}))


def _save_made_up_model(path: Path, target, samples: int) -> None:
    """A saved latency model that learned ``samples`` made-up measurements of a made-up kernel."""
    import numpy as np

    from cost_models.latency_model import FEATURE_LENGTH, _restore, create_latency_model, save_latency_model

    rng = np.random.default_rng(samples)
    model = create_latency_model(2)
    _restore(model, {"group_hashes": np.array(["made-up"]), "group_sizes": np.array([samples]),
                     "costs": rng.uniform(1e-3, 2e-3, samples).astype(np.float32),
                     "store_counts": np.ones(samples, dtype=np.int64),
                     "features": rng.random((samples, FEATURE_LENGTH), dtype=np.float32)})
    save_latency_model(model, path, target)


def _commit_records(folder: Path, task, target, latencies, seed: int = 0) -> list[int]:
    """Commit one tuning record of a fresh draw for ``task`` (its context and spaces) per latency to the
    database in ``folder``; return their schedules' hashes."""
    from tvm.s_tir.meta_schedule.database import JSONDatabase, TuningRecord

    from autotune.search import TaskSearch
    from tests.conftest import schedule_hash

    ctx, spaces = task
    folder.mkdir(parents=True, exist_ok=True)
    database = JSONDatabase(work_dir=str(folder))
    workload = database.commit_workload(ctx.mod)
    drawn = TaskSearch(ctx, spaces, seed=seed).propose(len(latencies), [], set(), None, False).candidates
    for candidate, latency in zip(drawn, latencies):
        database.commit_tuning_record(TuningRecord(candidate.sch.trace, workload, [latency], target,
                                                   candidate.args_info))
    return [schedule_hash(c) for c in drawn]


def test_a_loaded_model_retrains_on_the_session_s_first_measurements_then_at_a_fresh_model_s_pace(
        matmul_task, tmp_path, monkeypatch):
    """MetaSchedule retrains once its data grew by a fifth: counted on the 100 loaded samples, 16 new ones
    would not retrain it at all."""
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    from autotune.search import TaskSearch
    from cost_models.latency_model import load_latency_model

    ctx, spaces = matmul_task
    _save_made_up_model(tmp_path / "m", ctx.target, samples=100)
    model = load_latency_model(tmp_path / "m", ctx.target, 2)
    trained_on = []
    monkeypatch.setattr(model._inst, "_train", lambda xs, ys: trained_on.append(len(xs)))
    drawn = TaskSearch(ctx, spaces, seed=3).propose(16, [], set(), None, False).candidates
    for measured in (drawn[:8], drawn[8:]):
        model.update(ctx, measured, [RunnerResult([1e-3], None)] * len(measured))
    assert trained_on == [108, 116]  # each time on all it holds


def test_saved_models_load_first_whatever_the_order_and_a_refused_one_falls_back_to_its_database(matmul_task,
                                                                                                tmp_path):
    import tvm

    from cost_models.latency_model import samples

    ctx, _ = matmul_task
    _save_made_up_model(tmp_path / "model", ctx.target, samples=40)
    _save_made_up_model(tmp_path / "other-model", ctx.target, samples=10)
    _commit_records(tmp_path / "database", matmul_task, ctx.target, [1e-3, 2e-3, 3e-3])
    _commit_records(tmp_path / "run", matmul_task, ctx.target, [1e-3, 2e-3, 3e-3])  # a run folder, whose model
    _save_made_up_model(tmp_path / "run" / "cost_model", tvm.target.Target({"kind": "llvm", "mcpu": "skylake"}), 10)
    for sources, learned, warned in (
            (["database", "model"], 40 + 3, []),
            (["run", "model"], 40 + 3, ["trained for llvm:skylake", "learning from the tuning database beside it"]),
            (["model", "other-model"], 40, [f"{tmp_path / 'other-model'} skipped", "going on with"])):
        said = []
        model = start_latency_model([str(tmp_path / s) for s in sources], ctx.target, 2, 0, said.append)
        assert samples(model) == learned, sources
        assert len(said) == len(warned[:1]) and all(phrase in said[0] for phrase in warned), said


# -- a resumed run folder ---------------------------------------------------------------------------


def _resumed(work_dir: Path, task, budgets: dict[str, int], preemption=None):
    """A session over ``work_dir`` for tasks "mm" (the matmul of ``task``) and "dense", with ``budgets``
    (and ``preemption``, if given), that has loaded what the folder holds."""
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    from autotune.session import TaskState, TuningSession
    from autotune.tasks import Task
    from cost_models.latency_model import create_latency_model
    from measure.kernels import kernel

    ctx, _ = task
    mods = {"mm": ctx.mod, "dense": kernel("dense_bert")}
    session = TuningSession([TaskState(Task(name, mods[name], 1, 1.0), budget) for name, budget in budgets.items()],
                            ctx.target, "cpu", engine=None, cost_model=create_latency_model(2), work_dir=str(work_dir),
                            **({"preemption": preemption} if preemption else {}))
    work_dir.mkdir(parents=True, exist_ok=True)
    database = JSONDatabase(work_dir=str(work_dir))
    session._load_known(database)
    return session, database


def test_a_run_folder_tuned_for_another_target_lends_a_resumed_run_nothing(matmul_task, tmp_path):
    import tvm

    ctx, _ = matmul_task
    here = _commit_records(tmp_path, matmul_task, ctx.target, [3e-3, 4e-3])
    elsewhere = tvm.target.Target({"kind": "llvm", "mcpu": "skylake", "num-cores": 2})
    _commit_records(tmp_path, matmul_task, elsewhere, [1e-6, 2e-6, 3e-6], seed=5)
    session, database = _resumed(tmp_path, matmul_task, {"mm": 8})
    (state,) = session.states
    assert set(session._known["mm"]) == set(here) and (state.trials, state.best_s) == (2, 3e-3)
    assert [latency for _, latency in session._parents(state, database)] == [3e-3, 4e-3]


def test_a_resumed_run_s_model_learns_the_records_already_there(matmul_task, tmp_path):
    from cost_models.latency_model import samples

    ctx, _ = matmul_task
    _commit_records(tmp_path, matmul_task, ctx.target, [3e-3, 4e-3, 5e-3])
    session, _ = _resumed(tmp_path, matmul_task, {"mm": 8})
    assert samples(session.cost_model) == 3


def test_a_resumed_run_keeps_its_stops_hand_overs_and_screened_proposals(matmul_task, tmp_path):
    ctx, _ = matmul_task
    _commit_records(tmp_path, matmul_task, ctx.target, [3e-3, 4e-3])
    killed, _ = _resumed(tmp_path, matmul_task, {"mm": 8, "dense": 8})
    mm, dense = killed.states  # mm stopped at 4 proposals (2 of them screened), its 4 left went to dense
    mm.screened, mm.budget, mm.stopped = 2, 4, "no gain in its last 2 proposals"
    dense.screened, dense.budget = 3, 12
    killed._save_progress()
    again, _ = _resumed(tmp_path, matmul_task, {"mm": 8, "dense": 8})
    mm, dense = again.states
    assert (mm.trials, mm.screened, mm.remaining, mm.stopped) == (2, 2, 0, "no gain in its last 2 proposals")
    assert (dense.budget, dense.screened, dense.remaining) == (12, 3, 9)
    # planned otherwise (another --trials), a job keeps its own budgets: the stop was counted on the old ones
    more, _ = _resumed(tmp_path, matmul_task, {"mm": 10, "dense": 10})
    mm, dense = more.states
    assert (mm.budget, mm.screened, mm.stopped, dense.budget, dense.screened) == (10, 2, "", 10, 3)


def test_a_resumed_job_goes_on_counting_its_preemption_patience(matmul_task, tmp_path):
    """Counts since the last gain survive a kill: a job killed more often than its patience would never stop."""
    ctx, _ = matmul_task
    _commit_records(tmp_path, matmul_task, ctx.target, [3e-3])
    killed, _ = _resumed(tmp_path, matmul_task, {"mm": 400, "dense": 400}, PlateauPreemption(task_patience=96))
    for proposed in (40, 80, 120):  # mm gains once, then 80 flat; dense keeps gaining
        killed.preemption.after_round([TaskRound("mm", 2e-3 if proposed > 40 else 3e-3, 2e-3, proposed, budget=400),
                                       TaskRound("dense", 1.0 / proposed, 0.9 / proposed, proposed, budget=400)], 1.0)
    killed._save_progress()
    again, _ = _resumed(tmp_path, matmul_task, {"mm": 400, "dense": 400}, PlateauPreemption(task_patience=96))
    assert again.preemption.state() == killed.preemption.state() and not again.warning
    decision = again.preemption.after_round([TaskRound("mm", 2e-3, 2e-3, 140, budget=400),
                                             TaskRound("dense", 1e-3, 0.9e-3, 140, budget=400)], 1.0)
    assert decision.stop_tasks == {"mm": "no gain in its last 100 proposals"}  # 80 before the kill, 20 after
    counted_otherwise = PlateauPreemption(task_patience=96, counts="measurements")
    fresh, _ = _resumed(tmp_path, matmul_task, {"mm": 400, "dense": 400}, counted_otherwise)
    assert fresh.preemption.state()["tasks"] == {} and "preemption state not used" in fresh.warning


def test_the_artifact_carries_the_model_and_the_bill(tuned_run):
    from autotune.target import resolve_target
    from cost_models.latency_model import load_latency_model, samples

    manifest = tuned_run.manifest["tuning"]
    model = load_latency_model(tuned_run.artifact / "cost_model", resolve_target("cpu").tvm_target(), 2)
    assert samples(model) == manifest["trials"]
    bill = manifest["energy"]
    assert set(bill["phases"]) == {"search", "build", "measure", "verification"}
    assert all(bill["phases"][p]["cpu_s"] > 0 for p in ("search", "build", "measure"))
    # a task's first valid measurement always improves its best: at most trials - tasks are wasted
    assert bill["wasted"]["of"] == manifest["new_trials"]
    assert 0 <= bill["wasted"]["measurements"] <= bill["wasted"]["of"] - len(manifest["tasks"])
    summary = tuned_run.summary()
    assert summary["energy_j"] == bill["energy_j"] > 0 and summary["energy_estimated"] is True
    assert summary["gpu_energy_j"] is None and bill["cpu_energy_j"] == bill["energy_j"]  # a CPU job: no NVML part
    assert "Tuning energy" in (tuned_run.artifact / "report.md").read_text()


def test_filter_and_preemption_in_a_real_session(tmp_path):
    """A real tuning run where the model is trusted early: proposals get dropped, tasks get stopped."""
    from autotune.config import TuneConfig
    from autotune.pipeline import prepare_model, run_tuning
    from autotune.policies import Policies
    from autotune.progress import SilentProgress
    from cost_models.latency_model import create_latency_model

    # ~7 rounds a task. A round in which nothing the rule would drop beat its task's best earns the filter its
    # trust; four directed rounds without a 20% gain stop a task. Every task proposes before any is measured, so
    # each round's trust rests on the last task measured in the round before: keeping half a round (4 watched
    # of 8, not 6) and four rounds of patience (not three) give it enough chances on a noisy 2-core machine.
    # Only a gain of 20% resets the patience, so timing noise on a busy machine cannot keep every task alive
    config = TuneConfig(model="zoo:mlp", out_dir=tmp_path, trials=160, batch_sizes=(1,), round_size=8, trial_floor=8)
    prepared = prepare_model(config, SilentProgress())
    policies = Policies(create_latency_model(2, warmup_samples=8),
                        TrimmerFilter(threshold=2.0, keep_share=0.5, explore_share=0.25, min_tau=-1.0,
                                      trust_rounds=1),
                        PlateauPreemption(task_patience=32, min_task_trials=8, model_window=10**6,
                                          min_improvement=0.2),
                        EnergyLedger())
    session, ranked = run_tuning(prepared.tasks, prepared.plan, prepared.target_spec, prepared.target,
                                 tmp_path / "tuning", round_size=8, policies=policies)
    report = session.policies_report()
    assert report["filter"]["rounds_filtered"] >= 1 and report["filter"]["dropped"] > 0
    assert report["filter"]["explored_measured"] > 0 and report["filter"]["shadow_dropped"] > 0
    sampled = report["filter"]["explored_measured"] + report["filter"]["shadow_dropped"]
    assert report["filter"]["final_best_sampled"] == sampled  # every sampled candidate was measured
    assert report["filter"]["final_best_hits"] <= len(session.states)  # a task has one fastest candidate
    assert any(s.stopped.startswith("no gain") for s in session.states)
    # patience is counted on the budget each task was planned with; stopped tasks' trials went to the others
    assert all(s.planned == prepared.plan.trials[s.task.name] for s in session.states)
    assert sum(s.budget for s in session.states if s.stopped) < sum(s.planned for s in session.states if s.stopped)
    # each task starts from random draws and evolves from what it measured; its second round always
    # evolves (the model's rank correlation is only known once that round is measured)
    rounds = report["search_rounds"]
    assert rounds["sampled"] >= len(session.states) and rounds["evolved"] >= 1
    assert sum(s.screened for s in session.states) == report["filter"]["dropped"]
    # a measured proposal was featurised when it was scored, and is not featurised again to train on
    features = report["latency_model"]["features"]
    assert features["reused"] > 0 and features["computed"] >= report["filter"]["measured"]
    log = [json.loads(line) for line in (tmp_path / "tuning" / "measurements.jsonl").read_text().splitlines()]
    assert len(log) == sum(s.trials for s in session.states) == report["filter"]["measured"]
    assert len(ranked.get_all_tuning_records()) == len(log)
    assert sum(not m["improved"] for m in log) == session.bill["wasted"]["measurements"]
    assert log[0]["proposed_by"] == "sampled" and {m["proposed_by"] for m in log} <= {"sampled", "evolved", "guided"}
    # each measurement carries the model's prediction from before it was measured, once the model was trained
    assert log[0]["score"] is None and any(isinstance(m["score"], float) for m in log)
    # and where it came from: the first rounds draw, evolved rounds mutate (and draw a share); the filter's
    # random sample of what it would drop is marked, one log line per candidate it explored
    assert {m["origin"] for m in log if m["proposed_by"] == "sampled"} == {"draw"}
    evolved = {m["origin"] for m in log if m["proposed_by"] == "evolved"}
    assert "mutant" in evolved and evolved <= {"mutant", "draw"}
    assert sum(m["explored"] for m in log) == report["filter"]["explored_measured"]
    assert (tmp_path / "tuning" / "cost_model" / "meta.json").exists()


def test_guided_search_takes_rounds_only_when_asked_and_brings_the_filter_s_pool(tmp_path, monkeypatch):
    """With a model that ranks well, MetaSchedule's search takes the directed rounds of a session that asks for
    it, and none of one that does not. A guided round costs the same whatever it returns, so with a filter
    it proposes ``guided_pool`` rounds' worth for the filter to choose from; other rounds propose one round,
    and every proposal counts against the budget."""
    from autotune.config import TuneConfig
    from autotune.pipeline import prepare_model, run_tuning
    from autotune.policies import Policies
    from autotune.progress import SilentProgress
    from autotune.search import TaskSearch
    from cost_models.latency_model import create_latency_model

    monkeypatch.setattr(RankQuality, "recent_tau", lambda self, last=4: 0.9)  # the model ranks fresh candidates well
    proposed: list[tuple[str, int]] = []  # (kind, proposals) of each round
    propose = TaskSearch.propose

    def recording(self, *args, **kwargs):
        proposal = propose(self, *args, **kwargs)
        proposed.append((proposal.kind, len(proposal.candidates)))
        return proposal

    monkeypatch.setattr(TaskSearch, "propose", recording)
    config = TuneConfig(model="zoo:mlp", out_dir=tmp_path, trials=36, batch_sizes=(1,), round_size=4, trial_floor=4)
    prepared = prepare_model(config, SilentProgress())
    for guided in (False, True):
        proposed.clear()
        candidate_filter = TrimmerFilter(guided_pool=3.0) if guided else MeasureAll()
        policies = Policies(create_latency_model(2, warmup_samples=8), candidate_filter, NeverPreempt(), EnergyLedger())
        session, _ = run_tuning(prepared.tasks, prepared.plan, prepared.target_spec, prepared.target,
                                tmp_path / f"tuning-{guided}", round_size=4, policies=policies, guided_search=guided)
        rounds = session.policies_report()["search_rounds"]
        assert (rounds["guided"] > 0) is guided, rounds
        assert rounds["evolved"] > 0 or guided  # unguided, the directed rounds evolve
        log = (tmp_path / f"tuning-{guided}" / "measurements.jsonl").read_text().splitlines()
        assert ("guided" in {json.loads(line)["proposed_by"] for line in log}) is guided
        pooled = [n for kind, n in proposed if kind == "guided"]
        assert not guided or 4 < max(pooled) <= 12, proposed
        assert max(n for kind, n in proposed if kind != "guided") <= 4
        assert sum(n for _, n in proposed) == sum(s.proposed for s in session.states)


def test_policies_and_bill_work_with_the_stock_engine(tmp_path):
    """The policies are the session's, not the engine's: MetaSchedule's own builder and runner get a bill too."""
    from autotune.config import TuneConfig
    from autotune.pipeline import prepare_model, run_tuning
    from autotune.policies import PolicySettings, build_policies
    from autotune.progress import SilentProgress

    config = TuneConfig(model="zoo:mlp", out_dir=tmp_path, trials=6, batch_sizes=(1,), round_size=2, trial_floor=2)
    prepared = prepare_model(config, SilentProgress())
    policies = build_policies(PolicySettings(price_per_hour=2.0), prepared.target, 2, 0, [], print)
    session, _ = run_tuning(prepared.tasks, prepared.plan, prepared.target_spec, prepared.target,
                            tmp_path / "tuning", engine="stock", round_size=2, policies=policies)
    bill = session.bill
    assert session.engine_report["engine"] == "stock"
    assert bill["phases"]["build"]["cpu_s"] > 0 and bill["phases"]["measure"]["device_s"] > 0
    assert bill["cost"] == pytest.approx(2.0 * bill["wall_s"] / 3600, rel=1e-3)
    assert session.policies_report()["filter"]["filter"] == "trimmer"


def test_rounds_of_random_draws_do_not_count_toward_a_plateau():
    p = PlateauPreemption(task_patience=16, min_task_trials=0, model_window=10**6)
    assert p.after_round([TaskRound("a", 1.0, 1.0, 16, directed=False)], 1.0).stop_tasks == {}
    assert p.after_round([TaskRound("a", 1.0, 1.0, 32, directed=False)], 1.0).stop_tasks == {}
    assert "a" in p.after_round([TaskRound("a", 1.0, 1.0, 48, directed=True)], 1.0).stop_tasks

"""The placement planner's inputs and its Estimator: hardware keys, profiles, pipeline files, traces, the batched queue.

Pure Python and numpy on synthetic profiles (``tests.planner_profiles``); runs in about a second.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from containers.errors import PlanError, ScenarioError
from containers.planner.batchqueue import CfsBandwidth, ReplicaChange, replica_windows, serve
from containers.planner.config import StageConfig, standby_replicas
from containers.planner.estimator import Estimator
from containers.planner.hardware import PriceTable, hardware_key
from containers.planner.pipeline import read_pipeline
from containers.planner.plan import Plan, Prediction, read_plan
from containers.planner.trace import (check_trace, envelope, gamma_trace, peak_rate, read_trace, resampled,
                                      spike_trace, write_trace)
from results.profile import LatencyStats, Persistence, read_profile
from tests.planner_profiles import CHAIN, CNN, PRE, bimodal, chain, one_stage, write_pipeline, write_profile  # noqa: F401

# -- hardware, prices, profiles ------------------------------------------------------------------------------------

def test_hardware_keys_and_default_prices() -> None:
    assert hardware_key({"kind": "cpu", "cpu_limit": 0.5, "cores": [0]}) == "cpu-0.5"
    assert hardware_key({"kind": "cpu", "cpu_limit": 2.0, "cores": [0, 1]}) == "cpu-2"
    assert hardware_key({"kind": "cpu", "cpu_limit": None, "cores": [0, 1], "threads": 2}) == "cpu-2"
    assert hardware_key({"kind": "cpu", "threads": 4}) == "cpu-4"
    assert hardware_key({"kind": "cuda", "device": "NVIDIA H200"}) == "gpu-NVIDIAH200"
    prices = PriceTable({"gpu-Mystery": 1.5})
    assert prices.price("cpu-0.5") == pytest.approx(0.02125) and prices.price("cpu-2") == pytest.approx(0.085)
    assert prices.price("gpu-NVIDIAH200") == 13.52 and prices.price("gpu-TeslaT4") == 0.526
    assert prices.price("gpu-Mystery") == 1.5 and prices.price("gpu-NVIDIAB200") is None


def test_profile_lookup_serves_a_batch_as_the_next_profiled_size(chain) -> None:
    cnn = chain.stage("cnn").profile
    assert cnn.hardware == ("cpu-0.5", "cpu-1", "cpu-2")
    assert cnn.service_ms("cpu-1", 3) == 68.0 and cnn.p99_ms("cpu-1", 1) == pytest.approx(26.0)
    assert cnn.throughput_per_s("cpu-2", 8) == pytest.approx(8e3 / 68)
    with pytest.raises(PlanError, match="batch 9 on cpu-1 is outside the profiled sizes 1, 2, 4, 8"):
        cnn.service_ms("cpu-1", 9)


# -- pipeline files ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("edit", "message"), [
    (('parents = ["pre"]', 'parents = ["post"]'),
     r"line 11: stages\[1\].parents \(stage cnn\) the parents form a cycle: cnn -> post -> cnn"),
    (('parents = ["pre"]', 'parents = ["pree"]'), r"line 11: stages\[1\].parents \(stage cnn\) parent 'pree' is not a stage"),
    (('artifact = "cnn"', 'artifact = "cnn"\nhardware = ["cpu-4"]'),
     r"line 11: stages\[1\].hardware \(stage cnn\) allows cpu-4, but the profile has only cpu-0.5, cpu-1, cpu-2"),
    (("scale_factor = 0.5", "scale_factor = 1.5"), r"line 17: stages\[2\].scale_factor \(stage post\) must be in \(0, 1\]"),
    (('name = "post"', 'name = "post"\nreplicas = 2'), r"line 15: stages\[2\].replicas is not a known field"),
])
def test_pipeline_errors_name_the_line_and_stage(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    path = write_pipeline(tmp_path, CHAIN.replace(*edit, 1), {"pre": PRE, "cnn": CNN})
    with pytest.raises(ScenarioError, match=message):
        read_pipeline(path)


def test_a_stage_without_a_price_is_refused(tmp_path: Path) -> None:
    write_profile(tmp_path / "gpu", {1: {1: 2.0}}, gpu="NVIDIA B200")
    path = tmp_path / "p.toml"
    path.write_text('name = "g"\n[[stages]]\nname = "det"\nartifact = "gpu"\n')
    with pytest.raises(ScenarioError, match=r"line 4: stages\[0\].artifact \(stage det\) has no price for hardware "
                                            r"gpu-NVIDIAB200; add it to \[prices\]"):
        read_pipeline(path)
    path.write_text('name = "g"\n[prices]\n"gpu-NVIDIAB200" = 9.0\n[[stages]]\nname = "det"\nartifact = "gpu"\n')
    assert read_pipeline(path).stage("det").prices == {"gpu-NVIDIAB200": 9.0}


def test_a_run_folder_stands_for_its_artifact(tmp_path: Path) -> None:
    write_profile(tmp_path / "run" / "artifact", PRE)
    path = tmp_path / "p.toml"
    path.write_text('slo_ms = 50\n[[stages]]\nname = "a"\nartifact = "run"\nhardware = ["cpu-1"]\n')
    pipeline = read_pipeline(path)
    assert pipeline.name == "p" and pipeline.slo_ms == 50 and pipeline.stage("a").artifact == tmp_path / "run" / "artifact"
    assert pipeline.stage("a").hardware == ("cpu-1",) and pipeline.stage("a").prices == {"cpu-1": 0.0425}


def test_a_stage_without_a_profile_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    path = tmp_path / "p.toml"
    path.write_text('[[stages]]\nname = "a"\nartifact = "empty"\n')
    with pytest.raises(ScenarioError, match=r"line 3: stages\[0\].artifact \(stage a\) .*empty has no profile.json"):
        read_pipeline(path)


# -- traces --------------------------------------------------------------------------------------------------------

def test_traces_round_trip_and_bad_ones_name_the_line(tmp_path: Path) -> None:
    times = gamma_trace(100, 2.0, 10, seed=1)
    assert 800 < times.size < 1200 and np.all(np.diff(times) >= 0)
    write_trace(tmp_path / "t.txt", times)
    assert np.allclose(read_trace(tmp_path / "t.txt"), times, atol=1e-6)
    (tmp_path / "bad.txt").write_text("0.1\n0.3\n0.2\n")
    with pytest.raises(ScenarioError, match="bad.txt, line 3: times must be non-negative and sorted"):
        read_trace(tmp_path / "bad.txt")
    (tmp_path / "empty.txt").write_text("# nothing\n")
    with pytest.raises(ScenarioError, match="holds no arrival times"):
        read_trace(tmp_path / "empty.txt")


def test_traces_refuse_times_that_are_not_finite(tmp_path: Path) -> None:
    for bad in (np.nan, np.inf):
        with pytest.raises(ScenarioError, match=f"must be finite, non-negative and sorted; arrival 2 is at {bad:g} s"):
            check_trace([0.0, 1.0, bad])
    (tmp_path / "t.txt").write_text("0.1\ninf\n")
    with pytest.raises(ScenarioError, match="t.txt, line 2: expected a time in seconds; got 'inf'"):
        read_trace(tmp_path / "t.txt")


def test_a_spike_too_short_for_an_arrival_still_makes_a_trace() -> None:
    times = spike_trace(50, 2, 10, 0.2, 60)  # two a second for 0.2 s: no arrival in the spike
    assert np.array_equal(times, check_trace(times)) and 2500 < times.size < 3500
    assert not ((times >= 10) & (times < 10.2)).any()
    with pytest.raises(ScenarioError, match="at least one arrival"):
        spike_trace(0.001, 0.001, 1, 1, 3)  # no arrival anywhere: no trace


def test_envelope_counts_the_busiest_window_of_each_size() -> None:
    env = envelope(np.array([0.0, 0.1, 0.2, 5.0, 5.05, 30.0]), 0.25)
    assert env[0.25] == 3 and env[4.0] == 3 and env[8.0] == 5 and env[32.0] == 6
    assert max(env) <= 60 and sorted(env) == list(env)
    spike = spike_trace(20, 200, 10, 5, 30, seed=2)
    assert 700 < ((spike >= 10) & (spike < 15)).sum() < 1300


def test_a_resampled_trace_keeps_the_span_the_rate_and_the_bursts_but_not_their_places() -> None:
    times = gamma_trace(50, 4.0, 60, seed=3)
    again, other = resampled(times, 1), resampled(times, 2)
    assert np.array_equal(again, resampled(times, 1)) and not np.array_equal(again, other)
    for trace in (again, other):
        check_trace(trace)
        assert trace[0] == times[0] and trace[-1] <= times[-1] and 0.7 < trace.size / times.size < 1.3
        gaps = np.sort(np.diff(times))  # each gap is one of the original's, redrawn (up to the sums' rounding)
        near = gaps[np.clip(np.searchsorted(gaps, np.diff(trace)), 0, gaps.size - 1)]
        below = gaps[np.clip(np.searchsorted(gaps, np.diff(trace)) - 1, 0, gaps.size - 1)]
        assert (np.minimum(abs(near - np.diff(trace)), abs(below - np.diff(trace))) < 1e-9).all()
    busiest = lambda t: int(np.argmax(np.searchsorted(t, t + 1.0) - np.arange(t.size)))  # noqa: E731
    assert abs(again[busiest(again)] - times[busiest(times)]) > 1.0 or abs(other[busiest(other)] - times[busiest(times)]) > 1.0
    assert np.array_equal(resampled(np.array([2.0]), 5), [2.0])


def test_the_peak_rate_is_the_busiest_window_of_the_given_length() -> None:
    """Ten queries within 45 ms in a trace of one a second: a 100 ms window sees the burst, a second dilutes it."""
    times = np.sort(np.concatenate([np.arange(0.0, 30.0, 1.0) + 0.5, 10.0 + np.arange(10) * 0.005]))
    assert peak_rate(times, 0.1) == pytest.approx(100.0)
    assert peak_rate(times, 1.0) == pytest.approx(11.0)
    with pytest.raises(ScenarioError, match="positive window"):
        peak_rate(times, 0.0)


@pytest.mark.parametrize(("window", "most"), [("1.0", 0), ("1.0", -2), ("0.0", 3), ("-1.0", 3)])
def test_a_plan_whose_envelope_the_tuner_cannot_divide_by_is_refused(tmp_path: Path, window: str, most: int) -> None:
    plan = Plan("one", 100.0, "inferline", {"m": StageConfig("cpu-1", 1, 1)}, {"m": 0.0425},
                Prediction(10.0, 20.0, 12.0, 0.0), {0.5: 3, 1.0: 4}, {})
    plan.write(tmp_path / "plan.json")
    assert read_plan(tmp_path / "plan.json") == plan
    raw = plan.to_json()
    raw["envelope"] = {"0.5": 3, window: most}
    (tmp_path / "plan.json").write_text(json.dumps(raw))
    with pytest.raises(PlanError, match=rf"plan.json: a plan's envelope must give at least 1 arrival per window of "
                                        rf"more than 0 s; got {most} in {window} s"):
        read_plan(tmp_path / "plan.json")


# -- the batched queue and the Estimator ---------------------------------------------------------------------------

def test_a_tiny_trace_by_hand() -> None:
    ready = [0.0, 0.001, 0.002, 0.050]
    assert serve(ready, [0, 0.010], 1, 0.0, replica_windows(1, [], 5)) == pytest.approx([0.010, 0.020, 0.030, 0.060])
    assert serve(ready, [0, 0.010], 1, 0.0, replica_windows(2, [], 5)) == pytest.approx([0.010, 0.011, 0.020, 0.060])


def test_batching_takes_what_waits_and_the_timeout_waits_for_more() -> None:
    ready, times = [0.0, 0.001, 0.002, 0.003, 0.004], [0, 0.010, 0.012, 0.016, 0.016]
    # no timeout: the first query goes alone; the next four wait for the replica and go together
    assert serve(ready, times, 4, 0.0, replica_windows(1, [], 5)) == pytest.approx([0.010] + [0.026] * 4)
    # 5 ms timeout: the batch fills at 3 ms (4 queries) before the timeout; the fifth waits for the replica
    assert serve(ready, times, 4, 0.005, replica_windows(1, [], 5)) == pytest.approx([0.019] * 4 + [0.029])
    # two queries only: the replica waits out the timeout, then takes both
    assert serve(ready[:2], times, 4, 0.005, replica_windows(1, [], 5)) == pytest.approx([0.017, 0.017])


def test_replica_windows_start_after_the_delay_and_retire_at_once() -> None:
    assert replica_windows(1, [(10, 3), (20, 1)], 5) == [[(0, math.inf)], [(15, 20)], [(15, 20)]]
    assert replica_windows(1, [(10, 3), (12, 1)], 5) == [[(0, math.inf)], [], []]


def test_the_estimator_agrees_with_md1(tmp_path: Path) -> None:
    """Poisson arrivals at 50/s, deterministic 10 ms service: M/D/1 waits rho*D / (2(1-rho)) = 5 ms on average."""
    pipeline = one_stage(tmp_path, {1: {1: 10.0}})
    est = Estimator(pipeline, gamma_trace(50, 1.0, 400, seed=3)).estimate({"m": StageConfig("cpu-1", 1, 1)}, 100)
    assert est.mean_ms == pytest.approx(15.0, rel=0.08)
    assert est.visits_per_s > 50_000


def test_service_times_are_drawn_from_the_profiled_distribution(tmp_path: Path) -> None:
    """Service times vary run to run: the Estimator draws them from the profiled percentiles, so its tail is
    the measured one, not the mean's; without percentiles every batch takes the mean."""
    pipeline = one_stage(tmp_path, {1: {1: bimodal(10.0, 30.0, 0.5)}})
    sparse = np.arange(0, 2000, 1.0)  # no queueing: each latency is one service time
    lat = Estimator(pipeline, sparse, seed=2).estimate(
        {"m": StageConfig("cpu-1", 1, 1)}, 100).latencies_ms
    assert lat.mean() == pytest.approx(20.0, rel=0.05)
    assert np.percentile(lat, 99) == pytest.approx(30.0, rel=0.03) and (lat < 15).mean() == pytest.approx(0.5, abs=0.05)
    flat = Estimator(one_stage(tmp_path / "flat", {1: {1: 20.0}}), sparse).estimate({"m": StageConfig("cpu-1", 1, 1)}, 100)
    assert np.allclose(flat.latencies_ms, 20.0)


def _spells_series(share: float, time_s: float, gap_s: float, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(start times, latencies) of a closed loop whose runs' normal scores persist as ``Persistence`` says."""
    from scipy.signal import lfilter

    rng = np.random.default_rng(seed)
    phi = math.exp(-gap_s / time_s)
    spell = lfilter([math.sqrt(1 - phi ** 2)], [1.0, -phi], rng.standard_normal(n))
    z = math.sqrt(share) * spell + math.sqrt(1 - share) * rng.standard_normal(n)
    return np.arange(n) * gap_s, 0.030 * np.exp(0.2 * z)


def test_persistence_is_fitted_from_a_closed_loop_series_and_kept_in_the_profile(tmp_path: Path) -> None:
    """Slow spells of about a second on a 30 ms closed loop are found from 20 s of runs; runs independent
    of each other are found to have none worth the name; a series too short gives no estimate."""
    times, lat = _spells_series(0.6, 1.0, 0.030, 660, seed=4)
    fit = Persistence.fit(times, lat)
    assert fit is not None and fit.share == pytest.approx(0.6, abs=0.15) and 0.5 < fit.time_s < 2.0
    times, lat = _spells_series(0.0, 1.0, 0.030, 660, seed=5)
    assert Persistence.fit(times, lat).share < 0.1
    assert Persistence.fit(times[:20], lat[:20]) is None
    stats = LatencyStats.from_seconds(lat, times)
    write_profile(tmp_path, {1: {1: stats}})
    assert read_profile(tmp_path / "profile.json").entries[0].latency_ms.persistence == stats.persistence


def test_slow_spells_lengthen_the_queueing_tail_but_not_the_service_times(tmp_path: Path) -> None:
    """The same profiled distribution with and without persistence: alone, a query's time is drawn from it
    either way; queued at 60% load, spells of slow runs build queues that independent draws do not."""
    quantiles = tuple(np.percentile(0.030e3 * np.exp(0.2 * np.random.default_rng(1).standard_normal(5000)),
                                    np.arange(101)))
    plain = LatencyStats(quantiles[50], quantiles[99], float(np.mean(quantiles)), quantiles[0], quantiles)
    spelled = LatencyStats(*plain.__dict__.values())
    object.__setattr__(spelled, "persistence", Persistence(0.8, 2.0))
    cfg = {"m": StageConfig("cpu-1", 1, 1)}
    sparse, busy = np.arange(0, 3000, 0.5), gamma_trace(20, 1.0, 600, seed=3)
    lat = {name: [Estimator(one_stage(tmp_path / name, {1: {1: stats}}), trace, seed=2).estimate(cfg, 1e3)
                  for trace in (sparse, busy)] for name, stats in (("plain", plain), ("spelled", spelled))}
    assert lat["spelled"][0].mean_ms == pytest.approx(lat["plain"][0].mean_ms, rel=0.02)
    assert lat["spelled"][0].p99_ms == pytest.approx(lat["plain"][0].p99_ms, rel=0.08)
    assert lat["spelled"][1].p99_ms > 1.2 * lat["plain"][1].p99_ms


def test_a_replica_that_rested_serves_at_its_idle_profile(tmp_path: Path) -> None:
    """Profiled 10 ms kept busy and 13 ms after a rest: a sparse trace finds the replica rested before every
    query, a saturating one never (each batch starts as the last ends), and one in between some of the time."""
    folder = write_profile(tmp_path / "m", {1: {1: 10.0}})
    profile = read_profile(folder / "profile.json")
    rested = LatencyStats(13.0, 13.0, 13.0, 13.0, (13.0,) * 101)
    entry = replace(profile.entries[0], idle_latency_ms=rested, idle_gap_ms=30.0)
    replace(profile, entries=(entry,)).write(folder / "profile.json")
    assert read_profile(folder / "profile.json").entries[0] == entry
    pipeline = read_pipeline(write_pipeline(tmp_path, 'name = "one"\n[[stages]]\nname = "m"\nartifact = "m"\n', {}))
    cfg = {"m": StageConfig("cpu-1", 1, 1)}
    sparse = Estimator(pipeline, np.arange(0, 100, 0.5)).estimate(cfg, 1e3)
    assert np.allclose(sparse.latencies_ms, 13.0)
    closed = np.cumsum(np.full(2000, 0.0005))
    done = np.sort(Estimator(pipeline, closed).estimate(cfg, 1e9).latencies_ms / 1e3 + closed)
    assert np.diff(done).mean() * 1e3 == pytest.approx(10.0, rel=0.01)
    between = Estimator(pipeline, gamma_trace(50, 1.0, 200, seed=1)).estimate(cfg, 1e3).latencies_ms
    assert 0.3 < np.isclose(between, 13.0).mean() < 0.9


def test_cfs_bandwidth_runs_a_share_of_each_period_then_waits() -> None:
    cfs = CfsBandwidth(0.5, 0.100, 1)  # half a core: 50 ms of every 100 ms (replica 0's periods start at 0)
    assert cfs.finish(0, 0.000, 0.030) == pytest.approx(0.030)
    assert cfs.finish(0, 0.030, 0.030) == pytest.approx(0.110)  # 20 ms left in the period, 10 ms after the wait
    assert cfs.finish(0, 0.110, 0.120) == pytest.approx(0.330)  # 40 ms now, 50 ms next period, 30 ms the one after
    assert cfs.finish(0, 0.500, 0.030) == pytest.approx(0.530)  # a new period: the full share again
    with pytest.raises(PlanError, match="share in"):
        CfsBandwidth(1.0, 0.1, 1)


def test_a_quota_throttles_by_load_from_the_unthrottled_twin(tmp_path: Path) -> None:
    """Half a core for one thread: profiled closed loop, it is throttled (the bimodal 0.5 entry); the Estimator
    runs the 1-core twin's 30 ms under a 50%-of-100 ms quota, so a sparse trace sees 30 ms and a saturating one
    the profiled throttled mix. A quota'd key without a twin keeps its own profiled times."""
    table = {0.5: {1: bimodal(30.0, 80.0, 0.65)}, 1: {1: 30.0}}
    pipeline = one_stage(tmp_path, table)
    assert pipeline.stage("m").profile.quota_share("cpu-0.5") == 0.5
    cfg = {"m": StageConfig("cpu-0.5", 1, 1)}
    sparse = Estimator(pipeline, np.arange(0, 300, 0.5)).estimate(cfg, 1000)
    assert np.allclose(sparse.latencies_ms, 30.0)
    closed = np.cumsum(np.full(2000, 0.0005))  # far more than one replica serves: every run back to back
    service = np.diff(np.concatenate([[0.0], np.sort(Estimator(pipeline, closed).estimate(cfg, 1e9).latencies_ms
                                                     / 1e3 + closed)]))
    assert service.mean() * 1e3 == pytest.approx(60.0, rel=0.05)  # 30 ms of work per 50 ms of runtime per 100 ms
    alone = one_stage(tmp_path / "alone", {0.5: table[0.5]})
    assert alone.stage("m").profile.quota_share("cpu-0.5") is None
    lat = Estimator(alone, np.arange(0, 300, 0.5)).estimate(cfg, 1000).latencies_ms
    assert (lat > 50).mean() == pytest.approx(0.65, abs=0.06)


def test_scale_factors_send_a_share_of_queries_on(chain) -> None:
    arrivals = np.arange(0, 200, 0.05)  # sparse: no queueing
    est = Estimator(chain, arrivals, seed=1)
    assert est.share("post") == pytest.approx(0.5, abs=0.03) and est.share("cnn") == 1.0
    cfg = {"pre": StageConfig("cpu-1", 1, 1), "cnn": StageConfig("cpu-2", 1, 1), "post": StageConfig("cpu-1", 1, 1)}
    lat = est.estimate(cfg, 100).latencies_ms
    assert set(np.round(lat, 6)) == {13.0, 15.0}  # pre 2 + cnn 11 (+ post 2 for half the queries)
    assert np.isclose(lat[est.visits_["post"]], 15.0).all()


def test_a_join_waits_for_every_parent_the_query_visited(tmp_path: Path) -> None:
    body = """\
        name = "diamond"
        [[stages]]
        name = "a"
        artifact = "pre"
        [[stages]]
        name = "slow"
        artifact = "cnn"
        parents = ["a"]
        scale_factor = 0.5
        [[stages]]
        name = "fast"
        artifact = "pre"
        parents = ["a"]
        [[stages]]
        name = "join"
        artifact = "pre"
        parents = ["slow", "fast"]
    """
    pipeline = read_pipeline(write_pipeline(tmp_path, body, {"pre": PRE, "cnn": CNN}))
    est = Estimator(pipeline, np.arange(0, 50, 0.5), seed=4)
    cfg = {n: StageConfig("cpu-1", 1, 1) for n in ("a", "slow", "fast", "join")}
    lat = est.estimate(cfg, 100).latencies_ms
    slow = est.visits_["slow"]
    assert np.allclose(lat[slow], 2 + 20 + 2) and np.allclose(lat[~slow], 2 + 2 + 2)


def test_added_replicas_serve_only_after_their_start_up(tmp_path: Path) -> None:
    pipeline = one_stage(tmp_path, {1: {1: 10.0}})
    arrivals = np.arange(0, 20, 0.008)  # 125/s against one replica's 100/s
    est = Estimator(pipeline, arrivals, startup_s=5)
    cfg = {"m": StageConfig("cpu-1", 1, 1)}
    lat = est.estimate(cfg, 50, [ReplicaChange(5.0, "m", 2)]).latencies_ms
    assert lat[arrivals < 10].max() > 400 and lat[arrivals > 15].max() == pytest.approx(10.0)


def test_added_replicas_wait_for_their_profiled_container_start_and_warm_up(tmp_path: Path) -> None:
    arrivals = np.arange(0, 40, 0.008)  # 125/s against one replica's 100/s
    cfg, added = {"m": StageConfig("cpu-1", 1, 1)}, [ReplicaChange(5.0, "m", 2)]
    quick, slow, unprofiled = (Estimator(one_stage(tmp_path / name, {1: {1: 10.0}}, startup_s=s), arrivals)
                               for name, s in (("quick", 1.5), ("slow", 12.0), ("unprofiled", None)))
    warmup_s = 0.02  # the warm-up: two requests of one item, 10 ms each, before the replica is routed to
    assert quick.replica_startup_s("m", "cpu-1", 1) == pytest.approx(1.52)
    assert slow.replica_startup_s("m", "cpu-1", 1) == pytest.approx(12.02)
    assert unprofiled.replica_startup_s("m", "cpu-1", 1) == 5.0  # the documented default where none was profiled
    batched = Estimator(one_stage(tmp_path / "batched", {1: {1: 10.0, 4: 30.0}}, startup_s=1.5), arrivals)
    # two requests of one item (10 ms) and two of the batch of 4 (30 ms): 80 ms on top of the container's 1.5 s
    assert batched.replica_startup_s("m", "cpu-1", 4) == pytest.approx(1.58)
    # the second replica serves from 6.5 s on one, from 17 s on the other: the backlog of the first drains first
    settled = (arrivals > 12) & (arrivals < 17)
    assert quick.estimate(cfg, 50, added).latencies_ms[settled].max() == pytest.approx(10.0)
    assert slow.estimate(cfg, 50, added).latencies_ms[settled].min() > 300
    # a start-up given for every stage wins over the profiled ones, on the Estimator or on one call
    assert Estimator(slow.pipeline, arrivals, startup_s=1.0).replica_startup_s("m", "cpu-1", 1) == 1.0
    np.testing.assert_allclose(slow.estimate(cfg, 50, added, startup_s=1.5 + warmup_s).latencies_ms,
                               quick.estimate(cfg, 50, added).latencies_ms)


def test_a_ready_standby_serves_at_once_and_another_starts_in_its_place() -> None:
    # one standby: the first added replica resumes (0.05 s), the second starts (5 s); the standby taken at 10 s
    # is ready again at 15 s, so the ask at 12 s starts cold and the one at 16 s resumes
    assert replica_windows(1, [(10, 3)], 5, standby=1, resume_s=0.05) == [
        [(0, math.inf)], [(10.05, math.inf)], [(15, math.inf)]]
    assert replica_windows(1, [(10, 2), (11, 1), (12, 2), (16, 1), (17, 2)], 5, standby=1, resume_s=0.05) == [
        [(0, math.inf)], [(10.05, 11), (17.05, math.inf)]]
    # the standby taken at 10 s is replaced once the cold start beside it has served (15 s): ready at 20 s, so
    # an ask at 16 s starts cold; one at 20 s resumes it
    assert replica_windows(1, [(10, 3), (16, 4)], 5, standby=1, resume_s=0.05)[3] == [(21, math.inf)]
    assert replica_windows(1, [(10, 3), (20, 4)], 5, standby=1, resume_s=0.05)[3] == [(20.05, math.inf)]
    # a cold start asked for while the replacement waits makes it wait longer (until 17 s, ready at 22 s)
    assert replica_windows(1, [(10, 3), (12, 4), (21, 5)], 5, standby=1, resume_s=0.05)[4] == [(26, math.inf)]
    assert replica_windows(1, [(10, 3), (12, 4), (22, 5)], 5, standby=1, resume_s=0.05)[4] == [(22.05, math.inf)]
    with pytest.raises(PlanError, match="at least 0 s"):
        replica_windows(1, [], 5, resume_s=-1)


def test_standby_replicas_take_the_start_up_out_of_a_scale_up(tmp_path: Path) -> None:
    pipeline = one_stage(tmp_path, {1: {1: 10.0}})
    arrivals = np.arange(0, 20, 0.008)  # 125/s against one replica's 100/s
    cfg, added = {"m": StageConfig("cpu-1", 1, 1)}, [ReplicaChange(5.0, "m", 2)]
    cold = Estimator(pipeline, arrivals, startup_s=5).estimate(cfg, 50, added)
    warm = Estimator(pipeline, arrivals, startup_s=5, standby=1).estimate(cfg, 50, added)
    assert cold.latencies_ms[(arrivals > 5) & (arrivals < 10)].max() > 400  # the backlog grows until 10 s
    assert warm.latencies_ms[arrivals > 8].max() < 30  # the 5 s backlog drained at 75/s within 2 s of the ask
    for bad in (-1, float("nan"), "1"):
        with pytest.raises(PlanError, match="standby replicas per planned replica must be a number of at least 0"):
            Estimator(pipeline, arrivals, standby=bad)
    assert [standby_replicas(share, 3) for share in (0, 0.2, 1 / 3, 1, 1.5)] == [0, 1, 1, 3, 5]

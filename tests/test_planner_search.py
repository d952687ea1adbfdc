"""The placement planner's searches and policies: Algorithms 1-4, the coarse-grained baselines, plans, the CLI.

Pure Python and numpy on synthetic profiles (``tests.planner_profiles``); runs in a few seconds.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from containers.errors import PlanError
from containers.planner.config import StageConfig, config_cost
from containers.planner.deploy_plan import CorePlacement, plan_specs
from containers.planner.estimator import Estimator
from containers.planner.hardware import standby_price
from containers.planner.live import shared_cores
from containers.planner.pipeline import read_pipeline
from containers.planner.plan import read_plan
from containers.planner.planner import hold_out, initialize, minimize_cost, plan_methods, plan_pipeline
from containers.planner.trace import envelope, gamma_trace, read_trace, resampled, spike_trace, write_trace
from containers.planner.tuner import TunedStage, Tuner, simulate_with_tuner
from tests.planner_profiles import CHAIN, CNN, PRE, bimodal, chain, write_pipeline  # noqa: F401

# -- the Planner and the baselines ---------------------------------------------------------------------------------

def test_an_slo_below_the_service_time_is_refused_with_the_gap(chain) -> None:
    est = Estimator(chain, gamma_trace(10, 1.0, 10))
    with pytest.raises(PlanError, match=r"service time along pre -> cnn -> post alone is 15.00 ms, 3.00 ms over"):
        initialize(est, 12)


def test_algorithm_1_stops_at_the_replica_cap(chain) -> None:
    est = Estimator(chain, gamma_trace(400, 1.0, 10, seed=12))
    with pytest.raises(PlanError, match=r"no configuration with at most 2 replicas per stage meets the SLO of 150 ms; "
                                        r"with stage cnn at the cap the p99 is \d+"):
        initialize(est, 150, max_replicas=2)


def test_minimize_cost_lowers_the_cost_and_stays_feasible(chain) -> None:
    est = Estimator(chain, gamma_trace(150, 1.0, 30, seed=5))
    first = initialize(est, 150)
    best = minimize_cost(est, 150, first)
    assert config_cost(chain, best) < config_cost(chain, first)
    assert est.feasible(best, 150) and est.estimate(best, 150).p99_ms <= 150
    assert best["cnn"].batch_size > 1  # batching is what makes the CNN cheap


def test_the_planner_beats_the_coarse_grained_baselines(chain, tmp_path: Path) -> None:
    est = Estimator(chain, gamma_trace(150, 4.0, 60, seed=6))
    plans = plan_methods(est, 150)
    inferline, mean, peak = (plans[m] for m in ("inferline", "cg-mean", "cg-peak"))
    assert not isinstance(inferline, PlanError) and not isinstance(peak, PlanError) and not isinstance(mean, PlanError)
    assert inferline.predicted.p99_ms <= 150
    assert peak.cost_per_hour > 2 * inferline.cost_per_hour and peak.cost_per_hour > mean.cost_per_hour
    assert {c.hardware for c in peak.stages.values()} == {"cpu-0.5"} and len({c.replicas for c in peak.stages.values()}) == 1
    fresh = Estimator(chain, gamma_trace(150, 4.0, 60, seed=7), seed=1000)  # CG-Peak absorbs SLO-long bursts (1 s: 0.6%)
    assert fresh.estimate(peak.stages, 150).miss_rate < 0.001 and fresh.estimate(mean.stages, 150).miss_rate > 0.01
    inferline.write(tmp_path / "plan.json")
    again = read_plan(tmp_path / "plan.json")
    assert again == inferline and json.loads((tmp_path / "plan.json").read_text())["schema_version"] == 1
    assert again.pipeline_file == str((tmp_path / "pipeline.toml").resolve())


def test_the_black_box_is_sized_by_its_profiled_tail_not_its_mean(tmp_path: Path) -> None:
    """Half-core replicas average 20 ms but a throttled half of runs take 30: a 25 ms SLO rules them out for CG."""
    from containers.planner.baselines import coarse_grained, profile_black_box

    body = 'name = "one"\n[[stages]]\nname = "m"\nartifact = "m"\n'
    pipeline = read_pipeline(write_pipeline(tmp_path, body, {"m": {0.5: {1: bimodal(10.0, 30.0, 0.5)}, 1: {1: 12.0}}}))
    est = Estimator(pipeline, gamma_trace(20, 1.0, 30))
    assert profile_black_box(est, "cpu-0.5", 1) == pytest.approx(30.0, rel=0.03)
    assert coarse_grained(est, 25, 20)["m"].hardware == "cpu-1"
    assert coarse_grained(est, 35, 20)["m"].hardware == "cpu-0.5"


def test_a_stricter_planning_percentile_buys_headroom(chain) -> None:
    trace = gamma_trace(150, 4.0, 60, seed=6)
    p99, p999 = (plan_pipeline(Estimator(chain, trace, slo_percentile=q), 150) for q in (99, 99.9))
    assert p999.cost_per_hour >= p99.cost_per_hour and p999.predicted.miss_rate <= p99.predicted.miss_rate
    assert p999.predicted.miss_rate <= 0.001 < p99.predicted.miss_rate <= 0.01
    assert p999.search["plan_percentile"] == 99.9
    with pytest.raises(PlanError, match=r"SLO percentile must be in \[50, 100\); got 100"):
        Estimator(chain, trace, slo_percentile=100)


def test_bad_plan_files_are_refused(tmp_path: Path, chain) -> None:
    plan = plan_pipeline(Estimator(chain, gamma_trace(20, 1.0, 10)), 150)
    raw = plan.to_json()
    (tmp_path / "v2.json").write_text(json.dumps({**raw, "schema_version": 2}))
    with pytest.raises(PlanError, match="schema_version 2; expected 1"):
        read_plan(tmp_path / "v2.json")
    raw["stages"]["cnn"]["replicas"] = 0
    (tmp_path / "zero.json").write_text(json.dumps(raw))
    with pytest.raises(PlanError, match="replicas must be an integer of at least 1; got 0"):
        read_plan(tmp_path / "zero.json")


def test_a_plan_that_fits_its_own_draws_is_grown_until_other_draws_meet_the_slo_too(tmp_path: Path) -> None:
    """An SLO set to exactly one seed's p99.9: the plan meets it on those draws and misses on other draws over
    other traces like it, so the hold-out adds a replica; a plan with room to spare is left as it is."""
    pipeline = read_pipeline(write_pipeline(tmp_path, 'name = "one"\n[[stages]]\nname = "m"\nartifact = "m"\n',
                                            {"m": {1: {1: bimodal(10.0, 100.0, 0.01)}}}))
    est = Estimator(pipeline, gamma_trace(20, 1.0, 60, seed=4), slo_percentile=99.9)
    tight = {"m": StageConfig("cpu-1", 1, 1)}
    slo = float(np.percentile(est.estimate(tight, 1e3).latencies_ms, 99.9))
    assert est.feasible(tight, slo)
    held = hold_out(est, slo, tight)
    assert held["m"].replicas > 1
    assert all(Estimator(pipeline, resampled(est.arrivals, k), seed=k, slo_percentile=99.9).feasible(held, slo)
               for k in (1, 2, 3))
    roomy = {"m": StageConfig("cpu-1", 1, 3)}
    assert hold_out(est, 1e3, roomy) == roomy


def test_plan_specs_give_each_replica_a_container(chain) -> None:
    plan = plan_pipeline(Estimator(chain, gamma_trace(150, 1.0, 20, seed=7)), 150)
    specs = plan_specs(plan, chain, 19000, CorePlacement(range(8)))  # more cores than this host may have
    assert len(specs) == sum(c.replicas for c in plan.stages.values())
    assert [s.port for s in specs] == list(range(19000, 19000 + len(specs)))
    cnn = [s for s in specs if s.name.startswith("chain-cnn-")]
    cores = float(plan.stages["cnn"].hardware.removeprefix("cpu-"))
    assert cnn and all(s.cpus == cores and s.threads == max(1, math.ceil(cores)) for s in cnn)
    assert all(s.cpuset and len(s.cpuset) == s.threads for s in specs)
    # placed largest quota first: the first cores (where ``autotune profile`` measures) go to the biggest replica
    small_first = replace(plan, stages={"pre": StageConfig("cpu-0.5", 1, 1), "cnn": StageConfig("cpu-1", 1, 1),
                                        "post": StageConfig("cpu-0.5", 1, 1)})
    placed = {s.name: s.cpuset for s in plan_specs(small_first, chain, 19000, CorePlacement([4, 5]))}
    assert placed == {"chain-pre-0": (5,), "chain-cnn-0": (4,), "chain-post-0": (5,)}
    too_big = replace(small_first, stages={**small_first.stages, "cnn": StageConfig("cpu-1", 1, 3)})
    with pytest.raises(PlanError, match="need 4 cores of quota; cores 4,5 have 2 left"):
        plan_specs(too_big, chain, 19000, CorePlacement([4, 5]))


def test_core_placement_packs_quota_onto_the_least_committed_cores_and_no_core_past_one() -> None:
    placement = CorePlacement([4, 5])
    assert [placement.take(0.5) for _ in range(3)] == [(4,), (5,), (4,)] and placement.free == 0.5
    with pytest.raises(PlanError, match="does not fit on cores 4,5: 0.5 cores of quota are left"):
        placement.take(1)
    assert placement.take(0.5) == (5,) and placement.committed == {4: 1.0, 5: 1.0}
    placement.give_back((4,), 0.5)
    placement.give_back((5,), 0.5)
    for cpus in (1, 2):  # half a core is left on each: enough in all, but a core of quota fits on neither
        with pytest.raises(PlanError, match="does not fit"):
            placement.take(cpus)
    assert placement.take(0.5) == (4,) and placement.committed == {4: 1.0, 5: 0.5}
    with pytest.raises(PlanError, match="needs 3 cores; only 2"):
        placement.take(2.5)


def test_a_live_run_knows_which_cores_its_front_end_shares_with_replicas_and_the_quota_left_there() -> None:
    mine = sorted(os.sched_getaffinity(0))
    placement = CorePlacement(mine)
    assert shared_cores(placement) == {}  # no replica yet
    placement.take(0.5)
    assert shared_cores(placement) == {mine[0]: 0.5}
    assert shared_cores(CorePlacement([max(mine) + 1])) == {}  # cores this process does not run on are not shared


# -- the Tuner -----------------------------------------------------------------------------------------------------

def test_the_tuner_scales_up_on_a_spike_and_down_after_it(chain) -> None:
    plan = plan_pipeline(Estimator(chain, gamma_trace(60, 1.0, 60, seed=8)), 150)
    spike = spike_trace(60, 240, 30, 20, 150, seed=9)
    run = simulate_with_tuner(chain, plan, spike)
    def cnn_at(t: float) -> int:
        return ([plan.stages["cnn"].replicas] + [c.replicas for c in run.schedule if c.stage == "cnn" and c.at_s <= t])[-1]

    assert cnn_at(33) > max(cnn_at(t) for t in range(30))  # reacts within a few seconds of the spike
    current = {name: cfg.replicas for name, cfg in plan.stages.items()}
    last = -math.inf
    for at in sorted({c.at_s for c in run.schedule}):
        changes = [c for c in run.schedule if c.at_s == at]
        if any(c.replicas < current[c.stage] for c in changes):
            assert at - last >= 15, f"scaled down at {at} s, {at - last} s after the last change"
        current.update({c.stage: c.replicas for c in changes})
        last = at
    assert current == {name: cfg.replicas for name, cfg in plan.stages.items()}  # back to the plan after the spike
    static = Estimator(chain, spike).estimate(plan.stages, 150)
    assert run.estimate.miss_rate < static.miss_rate / 2
    assert plan.cost_per_hour < run.cost_per_hour < 4 * plan.cost_per_hour


def test_standby_replicas_cut_the_misses_of_a_spike_and_are_billed_at_their_memory_share(chain) -> None:
    plan = plan_pipeline(Estimator(chain, gamma_trace(60, 1.0, 60, seed=8)), 150)
    spike = spike_trace(60, 240, 30, 20, 150, seed=9)
    cold, warm = (simulate_with_tuner(chain, plan, spike, standby=n) for n in (0, 1))
    assert warm.schedule == cold.schedule  # the Tuner reads arrivals, not latencies: the same asks
    assert warm.estimate.miss_rate < cold.estimate.miss_rate
    # one replica per stage, so one standby each: pre and post on half a core ($0.02125/h), the CNN on two ($0.085/h);
    # paused, each is billed the 18% of its price that its memory is: 0.18 x $0.1275/h = $0.02295/h held
    assert {name: cfg.replicas for name, cfg in plan.stages.items()} == {"pre": 1, "cnn": 1, "post": 1}
    assert sum(plan.prices.values()) == pytest.approx(0.1275)
    assert warm.cost - cold.cost == pytest.approx(0.02295 * float(spike[-1]) / 3600)
    assert standby_price("cpu-1", 0.0425) == pytest.approx(0.00765)
    assert standby_price("cpu-0.5", 0.02125) == pytest.approx(0.003825)
    assert standby_price("gpu-NVIDIAH200", 13.52) == 13.52  # a paused GPU replica still holds its GPU


@pytest.mark.parametrize("drain", [0.0, 1.0])
def test_the_tuner_waits_15_s_before_scaling_down(drain: float) -> None:
    tuner = Tuner({1.0: 10, 8.0: 60}, [TunedStage("m", 1.0, 10.0, 1)], drain=drain)
    burst = np.linspace(0, 1, 100, endpoint=False)
    # the rate formula, 100/s * share 1 / (10/s * rho 0.8) = 13, beats the envelope's 1 * 100 / (10 + sqrt 10) = 8;
    # the drain adds the step from 1 again
    assert tuner.observe(burst, 1.0) == {"m": 13 + int(drain * 12)}
    quiet = np.concatenate([burst, np.arange(1, 60, 0.5)])
    changed = [t for t in range(2, 60) if tuner.observe(quiet, float(t))]
    assert changed and changed[0] >= 16 and all(b - a >= 15 for a, b in zip(changed, changed[1:]))
    assert tuner.replicas_["m"] == 1


def _replicas_over_time(tuner: Tuner, live: np.ndarray, end_s: float = 120.0) -> list[tuple[float, int]]:
    """(time, replicas) at the start and after each change, the Tuner looking every 0.25 s."""
    stage = tuner.stages[0].name
    return [(0.0, tuner.replicas_[stage])] + [(float(t), tuner.replicas_[stage]) for t in np.arange(0.25, end_s, 0.25)
                                              if tuner.observe(live, float(t))]


def test_a_stage_above_its_plan_for_good_is_not_scaled_down_only_to_be_scaled_up_again() -> None:
    """After a lasting rate step the Tuner settles above the plan rather than flapping (InferLine's Algorithm 4
    scaled down to what 5 s windows need, and a short window above the planned envelope undid it 2-3 s later:
    13 times in these four runs)."""
    undone = 0
    for seed in range(4):
        live = np.concatenate([gamma_trace(20, 1.0, 30, seed=seed + 1), 30 + gamma_trace(30, 1.0, 90, seed=seed + 2)])
        tuner = Tuner(envelope(gamma_trace(20, 1.0, 60, seed=seed), 0.05), [TunedStage("m", 1.0, 10.0, 3)])
        counts = _replicas_over_time(tuner, live)
        undone += sum(n1 < n0 and n2 > n1 and t2 - t1 < 10 for (_, n0), (t1, n1), (t2, n2) in zip(counts, counts[1:],
                                                                                                 counts[2:]))
        assert counts[-1][1] > 3  # 1.5x the planned rate still needs more than the plan
    assert undone <= 2


def test_the_tuner_mostly_holds_the_plan_on_the_traffic_it_was_planned_for() -> None:
    """A live trace of the planned process exceeds the sample's busiest windows by a few arrivals: not a change.

    (Judged against the planned envelope as it is, the Tuner held 1.83x the plan's replicas on these traces.)
    """
    held = []
    for seed in range(8):
        tuner = Tuner(envelope(gamma_trace(20, 1.0, 60, seed=seed), 0.05), [TunedStage("m", 1.0, 10.0, 3)])
        counts = _replicas_over_time(tuner, gamma_trace(20, 1.0, 120, seed=seed + 100)) + [(120.0, 0)]
        held.append(sum(n * (t1 - t0) for (t0, n), (t1, _) in zip(counts, counts[1:])) / 120.0)
    assert float(np.mean(held)) < 1.5 * 3


def test_the_tuner_refuses_a_negative_drain() -> None:
    with pytest.raises(PlanError, match="drain must be at least 0; got -1"):
        Tuner({1.0: 10}, [TunedStage("m", 1.0, 10.0, 1)], drain=-1)


def test_stage_configs_are_validated() -> None:
    with pytest.raises(PlanError, match="batch_size must be an integer of at least 1; got 0"):
        StageConfig("cpu-1", 0, 1)
    assert replace(StageConfig("cpu-1", 1, 1), replicas=3).replicas == 3


# -- the CLI -------------------------------------------------------------------------------------------------------

def test_the_plan_commands(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from autotune.cli import app

    path = write_pipeline(tmp_path, CHAIN, {"pre": PRE, "cnn": CNN})
    write_trace(tmp_path / "trace.txt", gamma_trace(100, 1.0, 20, seed=10))
    write_trace(tmp_path / "spike.txt", spike_trace(100, 300, 10, 10, 40, seed=11))
    runner = CliRunner()
    made = runner.invoke(app, ["plan", str(path), "--trace", str(tmp_path / "trace.txt"), "--slo-ms", "150",
                               "--out", str(tmp_path / "plan.json"), "--json"])
    assert made.exit_code == 0, made.output
    record = json.loads(made.output)
    assert record["inferline"]["cost_per_hour"] < record["cg-peak"]["cost_per_hour"]
    assert read_plan(tmp_path / "plan.json").method == "inferline"
    sim = runner.invoke(app, ["plan", "simulate", str(tmp_path / "plan.json"), "--trace", str(tmp_path / "spike.txt"),
                              "--tuner", "--json"])
    assert sim.exit_code == 0, sim.output
    assert json.loads(sim.output)["replica_changes"] > 0
    warm = runner.invoke(app, ["plan", "simulate", str(tmp_path / "plan.json"), "--trace", str(tmp_path / "spike.txt"),
                               "--tuner", "--standby", "2", "--json"])
    assert warm.exit_code == 0, warm.output
    cold, held = json.loads(sim.output), json.loads(warm.output)
    assert held["standby"] == 2 and held["miss_rate"] < cold["miss_rate"] and held["cost_per_hour"] > cold["cost_per_hour"]
    idle = runner.invoke(app, ["plan", "simulate", str(tmp_path / "plan.json"), "--trace", str(tmp_path / "spike.txt"),
                               "--standby", "2"])
    assert idle.exit_code == 2 and "serve only the Tuner's scale-ups" in idle.output, idle.output
    slow = runner.invoke(app, ["plan", "simulate", str(tmp_path / "plan.json"), "--trace", str(tmp_path / "spike.txt"),
                               "--tuner", "--startup-s", "30", "--tuner-interval", "2", "--json"])
    assert slow.exit_code == 0, slow.output
    assert json.loads(slow.output)["miss_rate"] > json.loads(sim.output)["miss_rate"]  # a spike shorter than the start-up is over before help comes
    for flag, value, says in (("--startup-s", "-1", "start-up must be at least 0 s"),
                              ("--tuner-interval", "0", "intervals of more than 0 s"),
                              ("--tuner-drain", "-1", "drain must be at least 0"),
                              ("--standby", "-0.5", "standby replicas per planned replica must be a number")):
        wrong = runner.invoke(app, ["plan", "simulate", str(tmp_path / "plan.json"), "--trace",
                                    str(tmp_path / "spike.txt"), "--tuner", flag, value])
        assert wrong.exit_code == 2 and says in wrong.output, wrong.output
    bad = runner.invoke(app, ["plan", "make", str(path), "--trace", str(tmp_path / "trace.txt"), "--slo-ms", "10"])
    assert bad.exit_code == 2 and "5.00 ms over" in bad.output
    made_trace = runner.invoke(app, ["plan", "trace", str(tmp_path / "made.txt"), "--rate", "50", "--cv", "2",
                                     "--seconds", "10", "--spike-rate", "250", "--spike-at", "4", "--spike-s", "2"])
    assert made_trace.exit_code == 0, made_trace.output
    times = read_trace(tmp_path / "made.txt")
    assert times[-1] < 10 and ((times >= 4) & (times < 6)).sum() / 2 > 3 * ((times < 4) | (times >= 6)).sum() / 8
    for args, says in ((["--rate", "0"], "--rate must be a positive number"),
                       (["--rate", "5", "--spike-rate", "9", "--spike-at", "55"], "must lie within the 60 s trace")):
        wrong = runner.invoke(app, ["plan", "trace", str(tmp_path / "bad.txt"), *args])
        assert wrong.exit_code == 2 and says in wrong.output and not (tmp_path / "bad.txt").exists(), wrong.output

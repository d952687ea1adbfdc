"""Benchmark helpers: the preemption and filter replays, arms kept for a resumed Trimmer benchmark, the re-timing
interval, the seed spread's pairs, the planner benchmark's search gap."""

from __future__ import annotations

import json

import numpy as np
import pytest

import bench.planner
from bench.remeasure import ratio_interval
from bench.replay_filter import load_run, metaschedule_scorer
from bench.replay_filter import replay as replay_filter
from bench.replay_preemption import replay
from bench.seed_spread import compare_pairs
from bench.trimmer import ARM_RESULT, GuidedRounds, _ablation_table, _compare, _saved_arm, _spread_table, arm_command
from autotune.policies import PolicySettings
from containers.planner.config import StageConfig, config_cost
from containers.planner.estimator import STARTUP_S, Estimator
from containers.planner.planner import initialize, minimize_cost
from containers.planner.trace import gamma_trace
from cost_models.candidate_filter import TrimmerFilter
from cost_models.latency_model import FEATURE_LENGTH
from cost_models.preemption import PlateauPreemption
from tests.planner_profiles import chain  # noqa: F401


def _log(task: str, latencies: list[float]) -> list[dict]:
    return [{"task": task, "latency_s": v, "proposed_by": "sampled" if i < 8 else "evolved"}
            for i, v in enumerate(latencies)]


def test_a_replay_stops_a_flat_task_where_the_policy_would_and_keeps_its_best_at_the_stop():
    # task a gains in its first 3 rounds of 8 and never again; task b gains 2% every round to the end
    a = _log("a", [10.0 - i * 0.1 for i in range(24)] + [9.0] * 56)  # best 7.7
    b = _log("b", [5.0 * 0.98 ** (i // 8) for i in range(80)])
    log = [m for pair in zip(a, b) for m in pair]
    r = replay(log, {"a": 2, "b": 1}, 8, PlateauPreemption(task_patience=32, min_task_trials=0, model_window=10**6),
               {})
    assert r.stopped == {"a": 24 + 32}  # 32 flat proposals after its last gain
    assert r.job_stopped_at is None and r.kept == 56 + 80 and r.of == 160
    full_b = 5.0 * 0.98 ** 9
    assert r.full_latency_s == pytest.approx(2 * 7.7 + full_b) and r.latency_s == r.full_latency_s  # a's best came before its stop


def _saved_run(folder, costs, logged=None, groups=1):
    """A run folder as a single-task job leaves it: its model's data (one store per candidate) and its log."""
    rng = np.random.default_rng(0)
    features = rng.uniform(size=(len(costs), FEATURE_LENGTH)).astype(np.float32)
    features[:, 0] = costs  # the first feature is the cost itself: a model can learn the ranking
    (folder / "cost_model").mkdir()
    sizes = [len(costs) - len(costs) // 2, len(costs) // 2] if groups == 2 else [len(costs)]
    np.savez(folder / "cost_model" / "data.npz", group_hashes=np.array([str(g) for g in range(groups)]),
             group_sizes=np.array(sizes), costs=np.array(costs, dtype=np.float32),
             store_counts=np.ones(len(costs), dtype=np.int64), features=features)
    (folder / "measurements.jsonl").write_text("".join(
        json.dumps({"task": "t", "latency_s": float(c)}) + "\n" for c in (costs if logged is None else logged)))


def test_the_filter_replay_scores_each_round_before_it_is_measured_and_counts_what_the_rule_keeps(tmp_path):
    costs = np.random.default_rng(1).uniform(1e-3, 2e-3, size=96)
    _saved_run(tmp_path, costs)
    xs, loaded = load_run(tmp_path)
    r = replay_filter(xs, loaded, 16, metaschedule_scorer, TrimmerFilter(threshold=2.0, keep_share=0.25))
    assert r.rounds == 4 and r.proposals == 64 and r.kept == 16  # trained on the first 32; the rule at its floor
    assert r.winners == sum(c < loaded[:i - i % 16].min() * 0.99 for i, c in enumerate(loaded) if i >= 32)
    assert r.winners_kept == r.winners_in_top_quarter  # at its floor the rule keeps the top quarter
    assert r.fastest_in_top_quarter >= 3 and r.mean_tau > 0.6  # the cost is a feature: the model ranks by it


@pytest.mark.parametrize("logged, groups, message", [
    ([5e-3] * 48, 1, "does not hold"), (None, 2, "learned from 2 tasks")])
def test_the_filter_replay_refuses_a_model_that_does_not_follow_its_log(tmp_path, logged, groups, message):
    _saved_run(tmp_path, list(np.linspace(1e-3, 2e-3, 48)), logged, groups)
    with pytest.raises(SystemExit, match=message):
        load_run(tmp_path)


def test_a_resumed_benchmark_keeps_only_an_arm_the_same_command_finished(tmp_path):
    command = ["bench.arms", "autotune", "mlp", "384", str(tmp_path), "--policies", "off"]
    assert _saved_arm(tmp_path, command) is None  # nothing saved: the arm runs
    (tmp_path / ARM_RESULT).write_text(json.dumps({"command": command, "result": {"wall_s": 1.0}}))
    assert _saved_arm(tmp_path, command) == {"wall_s": 1.0}
    assert _saved_arm(tmp_path, [*command[:3], "320", *command[4:]]) is None  # another budget: run again
    for policies in ("trimmer", "preemption"):  # the arms that preempt
        preempting = [*command[:-1], policies]
        for tasks in (1, 3):  # the default rule, as a job of one task and one of several apply it
            rule = {"policies": {"preemption": {"rule": PolicySettings().preemption_policy().rule_for(tasks)}}}
            (tmp_path / ARM_RESULT).write_text(json.dumps({"command": preempting, "result": rule}))
            assert _saved_arm(tmp_path, preempting) == rule
        (tmp_path / ARM_RESULT).write_text(json.dumps({"command": preempting, "result": {"policies": {"preemption": {
            "rule": "task patience 96 proposals (after 32)"}}}}))
        assert _saved_arm(tmp_path, preempting) is None  # an arm that preempted under another rule: run again
        by_measurements = [*preempting, "--patience-counts", "measurements"]
        rule = {"policies": {"preemption": {"rule": PolicySettings(
            patience_counts="measurements").preemption_policy().rule_for(1)}}}
        (tmp_path / ARM_RESULT).write_text(json.dumps({"command": by_measurements, "result": rule}))
        assert _saved_arm(tmp_path, by_measurements) == rule  # the rule its command names
    (tmp_path / ARM_RESULT).write_text('{"command": ')  # cut short as it was written
    assert _saved_arm(tmp_path, command) is None


def _paired_run(ratio: float, saving: float, seed: int, rule: str = "task patience 96 proposals",
                **guided: float) -> dict:
    met = {"device_s_saving": saving >= 0.4, "energy_saving": saving >= 0.4, "latency_ratio": ratio <= 1.02,
           "drop_rate": True}
    trimmer = {"preemption": {"rule": rule}, **({"filter": guided} if guided else {})}
    return {"trials": 320, "seed": seed, "arms": {"trimmer": trimmer},
            "trimmer_vs_engine": {"latency_ratio": ratio, "device_s_saving": saving, "energy_saving": saving,
                                  "targets_met": met}}


def test_guided_rounds_other_than_the_default_reach_the_filtering_arms_and_their_search(tmp_path):
    from autotune.session import evolutionary_search
    from measure.tvm_import import import_meta_schedule

    guided = GuidedRounds(generations=2, population=4)
    commands = {arm: arm_command("conv3x3_resnet18", arm, tmp_path, tmp_path / arm, 64, "cpu", 0, guided=guided)
                for arm in ("engine", "trimmer")}
    assert "--guided-generations" not in commands["engine"] and "--guided-pool" not in commands["trimmer"]
    given = dict(zip(commands["trimmer"], commands["trimmer"][1:]))
    chosen = PolicySettings(filter_guided_generations=int(given["--guided-generations"]),
                            filter_guided_population=int(given["--guided-population"])).candidate_filter(0)
    assert GuidedRounds.of(chosen.report()) == guided
    import_meta_schedule()
    search = evolutionary_search(16, chosen.guided_generations, chosen.guided_population)
    assert (search.genetic_num_iters, search.population_size) == (2, 64)
    assert evolutionary_search(16, 4).population_size == 128  # MetaSchedule's 512 cut to 8 per candidate wanted
    assert arm_command("conv3x3_resnet18", "trimmer", tmp_path, tmp_path, 64, "cpu", 0) == \
        arm_command("conv3x3_resnet18", "trimmer", tmp_path, tmp_path, 64, "cpu", 0, guided=GuidedRounds())


def test_the_pooled_table_spans_the_runs_under_one_rule_and_their_seeds():
    report = {"workloads": {"matmul512": _paired_run(1.04, 0.5, 0)},
              "reruns": {"matmul512": [_paired_run(0.98, 0.6, 0), _paired_run(1.01, 0.3, 2, guided_pool=1.0),
                                       _paired_run(0.90, 0.9, 1, rule="task patience 96 proposals, at least 40%"),
                                       _paired_run(0.99, 0.7, 3, guided_pool=2.0),
                                       _paired_run(0.95, 0.5, 4, guided_pool=1.0, guided_generations=2)]}}
    rows = [line for line in _spread_table(report) if line.startswith("| matmul512")]
    # a run under another rule (preemption's, or the filter's guided rounds where they are not the default; runs
    # before a setting was recorded ran its default) is pooled apart, labelled by the clause it adds; the median of
    # three is the middle
    assert rows == ["| matmul512 | 3 (0, 2) | 1.010 (0.980-1.040) | 50% | 50% | 1 of 3 |",
                    "| matmul512 (at least 40%) | 1 (1) | 0.900 (0.900-0.900) | 90% | 90% | 1 of 1 |",
                    "| matmul512 (guided rounds of 2 rounds' proposals) | 1 (3) | 0.990 (0.990-0.990) | 70% | 70% "
                    "| 1 of 1 |",
                    "| matmul512 (guided rounds of 2 generations) | 1 (4) | 0.950 (0.950-0.950) | 50% | 50% | 1 of 1 |"]


def test_the_ablation_sets_preemption_alone_beside_filter_and_preemption_against_the_same_engine_arm():
    def arm(device_s: float, energy_j: float, latency_s: float, drop: float | None) -> dict:
        return {"device_s_measuring": device_s, "energy_j": energy_j, "wall_s": 100.0, "measured": 1000,
                "final_latency_s": latency_s, "fastest_latency_s": latency_s, "drop_rate": drop,
                "final_best_drop_rate": drop}

    engine = arm(80.0, 3000.0, 1.0e-3, None)
    alone = _compare(engine, arm(40.0, 1500.0, 1.01e-3, None))  # half of each, 1% slower: all four
    both = _compare(engine, arm(24.0, 1200.0, 1.03e-3, 0.01), (1.01, 1.05))  # 70% and 60%, but 3% slower
    assert alone["targets_met"] == dict.fromkeys(("device_s_saving", "energy_saving", "latency_ratio", "drop_rate"),
                                                 True)
    assert both["device_s_saving"] == 0.7 and not both["targets_met"]["latency_ratio"]
    runs = [("matmul512 (rerun, seed 12)", {"preemption_vs_engine": alone, "trimmer_vs_engine": both}),
            ("mlp", {"trimmer_vs_engine": both})]  # a run without the ablation arm has no row
    rows = [line for line in _ablation_table(runs) if line.startswith("| matmul512") or line.startswith("| mlp")]
    assert rows == ["| matmul512 (rerun, seed 12) | 50% | 50% | 1.010 | all four | "
                    "70% | 60% | 1.030 (1.010-1.050) | missed latency_ratio |"]
    assert _ablation_table(runs[1:]) == []


def test_the_re_timing_interval_follows_the_paired_turns_not_the_drift_between_them():
    # the host drifts 2x between turns; within each turn b is 10% slower than a
    drift = [1.0, 2.0, 1.2, 1.8, 1.0, 1.5, 2.0, 1.1, 1.3, 1.6]
    a = [[d, d * 1.01, d * 0.99] for d in drift]
    b = [[1.1 * x for x in turn] for turn in a]
    lo, hi = ratio_interval(b, a)
    assert lo <= 1.1 <= hi and hi - lo < 0.3  # 10% slower, and the interval does not reach 1
    assert lo > 1.0
    # the same timings in a new order each (no pairing left): noisy turns give a wide interval that holds 1
    lo, hi = ratio_interval(b, a[::-1])
    assert lo < 1.0 < hi
    with pytest.raises(ValueError, match="same number of turns"):
        ratio_interval(b, a[:5])


def test_blocks_of_turns_that_shared_a_host_state_widen_the_interval_to_what_the_states_allow():
    # six host states of ten turns each: in four of them b is 10% slower than a, in two as fast
    a = [[1.0, 1.0, 1.0] for _ in range(60)]
    b = [[1.1 if t // 10 < 4 else 1.0] * 3 for t in range(60)]
    assert ratio_interval(b, a) == (1.1, 1.1)  # sixty turns taken as independent: sure it is 10% slower
    lo, hi = ratio_interval(b, a, block=10)
    assert lo < 1.1 == hi  # six states are too few to be sure
    assert ratio_interval(b[:10], a[:10], block=10) == (1.1, 1.1)  # one state: one value


def test_the_seed_spread_compares_every_ordered_pair_and_counts_those_within_the_latency_target():
    # three engine runs re-timed in 20 turns: seed 2 is 5% slower than seed 1, seed 3 1% slower
    turns = {"1": [[1.0, 1.0, 1.0]] * 20, "2": [[1.05, 1.05, 1.05]] * 20, "3": [[1.01, 1.01, 1.01]] * 20}
    out = compare_pairs(turns)
    ratios = {(p["seed"], p["against"]): p["latency_ratio"] for p in out["pairs"]}
    assert len(ratios) == 6 and ratios[(2, 1)] == pytest.approx(1.05)
    assert ratios[(1, 2)] == pytest.approx(1 / 1.05, abs=1e-4)
    # within 1.02: 1/2, 1/3, 3/1, 3/2; not 2/1 (1.05) nor 2/3 (1.04)
    assert out["summary"]["within_target"] == 4 and out["summary"]["share_within_target"] == pytest.approx(0.667)
    assert out["summary"]["max"] == pytest.approx(1.05)
    assert all(p["interval"][0] <= p["latency_ratio"] <= p["interval"][1] for p in out["pairs"])
    with pytest.raises(SystemExit, match="fewer than two runs"):
        compare_pairs({"1": turns["1"]})


def test_the_search_gap_finds_a_feasible_plan_no_dearer_than_the_greedy_descent(chain, monkeypatch):
    est = Estimator(chain, gamma_trace(60, 1.0, 10, seed=5))  # a load where the descent stops above the cheapest
    gap = bench.planner.search_gap(est, 150)
    found = {n: StageConfig(h, b, r, chain.stage(n).batch_timeout_ms) for n, (h, b, r) in gap["enumerated"].items()}
    assert est.feasible(found, 150) and config_cost(chain, found) == pytest.approx(gap["enumerated_cost_per_hour"], abs=1e-5)
    greedy = minimize_cost(est, 150, initialize(est, 150))
    assert gap["greedy_cost_per_hour"] == pytest.approx(config_cost(chain, greedy), abs=1e-5)
    assert gap["combinations"] == 8 * 12 * 8  # pre and post: 2 sizes x 4 batches; cnn: 3 x 4
    # the descent stops at $0.1275/h (six half-cores' worth); the enumeration finds five half-core replicas at batch 1,
    # three of them on the CNN: 5 x $0.02125 = $0.10625/h, 1.2 times cheaper
    assert gap["greedy_cost_per_hour"] == pytest.approx(0.1275)
    assert gap["enumerated"] == {"pre": ["cpu-0.5", 1, 1], "cnn": ["cpu-0.5", 1, 3], "post": ["cpu-0.5", 1, 1]}
    assert gap["enumerated_cost_per_hour"] == pytest.approx(0.10625) and gap["gap"] == pytest.approx(1.2)
    monkeypatch.setattr(bench.planner, "ENUMERATE_MAX", gap["combinations"] - 1)
    assert bench.planner.search_gap(est, 150) is None


def test_a_spike_row_says_how_many_of_the_tuners_misses_its_replicas_start_up_costs(chain, monkeypatch):
    monkeypatch.setattr(bench.planner, "ENUMERATE_MAX", 0)  # the search gap is tested above
    row = bench.planner.run_case(chain, load=2.0, cv=1.0, spike=True, seed=8, plan_s=20.0, live_s=70.0)
    tuned = row["methods"]["inferline+tuner"]
    # the same schedule with replicas serving at once misses fewer: the spike's misses wait on the start-up
    assert tuned["miss_rate"] > 0.1 and tuned["miss_rate_instant_start"] < tuned["miss_rate"] / 2
    assert tuned["startup_s"] == {s.name: STARTUP_S for s in chain.stages}  # no container start profiled here
    summary = bench.planner.summarize([row])
    line = bench.planner._spike_line(summary["spike_miss_rates"], summary["spike_startup_s"])
    assert f"{tuned['miss_rate_instant_start']:.1%}" in line and "start in 5 s" in line


def _row(stages: int, peak: tuple[float, float], **ours: tuple[float, float]) -> dict:
    """A simulated row: each method's (cost per hour, miss rate)."""
    methods = {"cg-peak": {"cost_per_hour": peak[0], "miss_rate": peak[1]}}
    methods.update({m.replace("_", "+"): {"cost_per_hour": c, "miss_rate": r} for m, (c, r) in ours.items()})
    return {"stages": stages, "spike": False, "methods": methods, "estimator_visits_per_s": None,
            "cost_ratio_vs_cg_peak": round(peak[0] / methods["inferline"]["cost_per_hour"], 2)}


def test_the_planner_target_compares_costs_only_at_no_more_misses_than_cg_peak():
    steady = _row(5, (10.0, 0.0), inferline=(1.0, 0.004))  # within the p99 SLO's 1%: the plan counts
    spike = _row(5, (10.0, 0.0), inferline=(0.5, 0.7), inferline_tuner=(1.5, 0.03), inferline_tuner_standby=(4.0, 0.0))
    broken = _row(5, (10.0, 0.0), inferline=(0.5, 0.7), inferline_tuner=(1.0, 0.2))  # none of ours keeps to it
    assert bench.planner.ratio_at_no_more_misses(steady) == 10.0
    assert bench.planner.ratio_at_no_more_misses(spike) == 2.5  # the plan alone would say 20x at 70% misses
    assert bench.planner.ratio_at_no_more_misses(broken) is None
    fair = bench.planner.summarize([steady, spike, broken])["cost_ratio_at_no_more_misses_by_stages"][5]
    assert fair == {"rows": "2/3", "rows_at_target": "1/3", "min": 2.5, "median": 6.25, "max": 10.0}
    assert not bench.planner.summarize([steady, spike, broken])["met"]["cost_ratio_at_no_more_misses_by_stages"][5]
    assert bench.planner.summarize([steady, steady, spike])["met"]["cost_ratio_at_no_more_misses_by_stages"][5]


def test_a_dqoes_run_that_never_converged_does_not_meet_the_convergence_target():
    import bench.qoe

    run = {"satisfied_late_mean": 4.0, "converged_after_iterations": 3, "iterations_after_converged_per_min": 1.0}
    runs = {"burst-default": {**run, "satisfied_late_mean": 1.0}, "burst-dqoes": run, "burst-dqoes_fixed": run}
    assert "converge_iterations" in bench.qoe.verdict(runs)["targets_met"]
    never = {**runs, "burst-dqoes": {**run, "converged_after_iterations": None}}
    assert bench.qoe.verdict(never)["converge_iterations"] is None
    assert "converge_iterations" not in bench.qoe.verdict(never)["targets_met"]


def test_the_qoe_table_prints_each_runs_own_targets(tmp_path):
    import bench.qoe

    first, rerun = {"mlp": 2.0, "bert_ffn": 20.0}, {"mlp": 3.0, "bert_ffn": 30.0}
    verdict = {"targets_met": []}
    report = {"machine": {"cpus": 2, "docker": "test"}, "fastest_ms": first, "runs": {}, "verdict": verdict,
              "reruns": [{"fastest_ms": rerun, "runs": {}, "verdict": verdict}]}
    bench.qoe.write_markdown(report, tmp_path / "qoe.md")
    text = (tmp_path / "qoe.md").read_text()
    assert "First run: fastest mean server time alone mlp 2.00 ms, bert_ffn 20.00 ms; targets (ms) mlp-0 1.6," in text
    assert "Rerun: fastest mean server time alone mlp 3.00 ms, bert_ffn 30.00 ms; targets (ms) mlp-0 2.4," in text
    assert "bert_ffn-5 180.0." in text


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_benchmark_arm_dies_with_the_benchmark_however_it_is_killed():
    """An arm left running would tune on beside the resumed benchmark's new arm, in the same folder."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    arm = "['http.server', '--bind', '127.0.0.1', '0']"  # any module that runs until it is killed
    benchmark = subprocess.Popen([sys.executable, "-c", f"from bench.tuning import _run_json; _run_json({arm}, None)"],
                                 cwd=Path(__file__).resolve().parents[1])
    children = Path(f"/proc/{benchmark.pid}/task/{benchmark.pid}/children")
    deadline = time.monotonic() + 30
    while not children.read_text().split() and time.monotonic() < deadline:
        time.sleep(0.05)
    (child,) = map(int, children.read_text().split())
    benchmark.kill()
    benchmark.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the arm outlived the benchmark"


def test_a_resumed_rerun_is_told_from_another_run_by_what_its_arms_spent_not_by_its_re_timing():
    from bench.trimmer import _arm_runs

    run = {"arms": {"engine": {"wall_s": 475.2, "cpu_s": 403.4, "measured": 1000, "final_latency_s": 1.1e-3},
                    "trimmer": {"wall_s": 214.0, "cpu_s": 132.0, "measured": 307, "final_latency_s": 0.9e-3}}}
    retimed = {"arms": {arm: {**r, "final_latency_s": r["final_latency_s"] * 1.01} for arm, r in run["arms"].items()}}
    another = {"arms": {**run["arms"], "trimmer": {**run["arms"]["trimmer"], "wall_s": 230.5}}}
    assert _arm_runs(retimed) == _arm_runs(run) and _arm_runs(another) != _arm_runs(run)


def test_a_benchmark_arm_runs_once_and_a_resumed_benchmark_keeps_it(tmp_path):
    """bench.tuning and bench.trimmer run each arm in its own process; a killed benchmark's finished arms are
    kept on --resume, not run again, and a failed arm leaves nothing to keep."""
    from bench.tuning import run_arm

    given, work = tmp_path / "result.json", tmp_path / "arm"
    command = ["json.tool", "--compact", str(given)]  # an arm whose JSON result is the file's
    given.write_text('{"wall_s": 1.0}')
    assert run_arm(work, command, resume=True) == {"wall_s": 1.0}
    given.write_text('{"wall_s": 2.0}')
    assert run_arm(work, command, resume=True) == {"wall_s": 1.0}  # kept, not run
    assert run_arm(work, command, resume=False) == {"wall_s": 2.0}
    given.unlink()
    assert "failure" in run_arm(work, command, resume=False) and not (work / ARM_RESULT).exists()

"""Placement planner benchmark (InferLine), simulated part: cost and SLO misses by planning method.

    python -m bench.planner [--profiles DIR] [--quick] [--rerun]

Pipelines of 1, 3 and 5 stages (the 5-stage one a DAG with a conditional branch and a join)
built from real artifact profiles: every folder under ``--profiles`` holding a
``profile.json`` (or ``artifact/profile.json``), used in turn. Nothing synthetic: without
``--profiles`` the artifacts tuned by ``bench.qoe`` (results/bench/work/qoe/artifacts) are
used, and the output says so.

Each pipeline is planned on a 60 s sample trace (gamma arrivals) by CG-Mean, CG-Peak and the
Planner, and each plan is then replayed by the Estimator on a fresh 120 s trace of the same
process (and, for the spike case, on a trace whose rate triples for 20 s), the Planner's also
with the Tuner, and with the Tuner and ``STANDBY`` warm standby replicas per planned replica
(paused, billed at their memory share, ``containers.planner.hardware``). Rates are multiples of the slowest stage's single-replica throughput at
batch 1, so the load means the same whatever the profiles; the SLO is 4x the pipeline's
batch-1 service time. CG-Peak is provisioned for the busiest SLO-long window of the sample.
On pipelines of up to ``ENUMERATE_MAX`` hardware x batch combinations a row also gets the
search gap: how far the greedy descent ends above the cheapest plan an enumeration finds.
Writes results/bench/planner.{json,md}, merging: keys other than ``simulated`` (the ``live``
section) are kept. ``--rerun`` keeps the recorded run and adds one beside it on other traces
and other service-time draws (seeded further on).

``--live`` runs the live part on Docker instead (``bench.planner_live``); ``--live --rerun`` keeps
the recorded live run and adds this one as a rerun.

From a clean checkout: ``python -m bench.qoe`` (tunes the two artifacts), then
``python -m bench.planner --profile-containers`` (measures them in containers of 0.5, 1 and
2 cores on Docker, through ``autotune profile``, before planning), then ``--live``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from results.atomic import write_atomically

OUT_DIR = Path("results/bench")
WORK = OUT_DIR / "work" / "planner"
QOE_ARTIFACTS = OUT_DIR / "work" / "qoe" / "artifacts"
PLAN_S, LIVE_S = 60.0, 120.0
LOADS = [(2.0, 1.0), (2.0, 4.0), (8.0, 1.0), (8.0, 4.0)]  # (x slowest stage's throughput, CV)
SPIKE = (2.0, 3.0, 40.0, 20.0)  # base load (x throughput), spike factor, spike start s, spike length s
SLO_FACTOR = 4.0
REPLAY_DRAWS = 1000  # the replay's draw seed, past the planning draws and the Planner's hold-out seeds
RERUN_SEEDS = 10_000  # a rerun k plans and replays on traces and draws seeded k * this further on
SLO_MISS_RATE = 0.01  # a p99 SLO is kept while at most 1% of queries miss it
TARGETS = {"cost_ratio_vs_cg_peak": 5.0, "planning_s_5_stages": 10.0}
ENUMERATE_MAX = 2000  # hardware x batch combinations (over all stages) up to which a row also gets the search gap
METHODS = ("cg-mean", "cg-peak", "inferline")
STANDBY = 2.0  # the Tuner's warm standby replicas per planned replica in the standby arm: capacity for a rise to 3x
# the plan (the spike injected here) that serves in milliseconds; 0.5 and 1.0 cut fewer misses (FINDINGS)
# stage i: (parents, scale factor); the 5-stage DAG branches after s0 (s2 sees half the queries) and joins at s3
LAYOUTS = {1: [((), 1.0)], 3: [((), 1.0), (("s0",), 1.0), (("s1",), 1.0)],
           5: [((), 1.0), (("s0",), 1.0), (("s0",), 0.5), (("s1", "s2"), 1.0), (("s3",), 0.7)]}


# request batch sizes to profile in containers, per default artifact (mlp is compiled for 64 items)
CONTAINER_BATCHES = {"mlp": "16,32,64,128", "bert_ffn": "1,2,4,8"}


def profile_containers(artifacts: list[Path], sizes: str = "0.5,1,2") -> None:
    """Measure the default artifacts in containers of ``sizes`` cores (``autotune profile``, Docker)."""
    from containers.backends.engine import ensure_engine

    unknown = [str(a) for a in artifacts if a.parent.name not in CONTAINER_BATCHES]
    if unknown:
        sys.exit(f"--profile-containers knows the batch sizes of {', '.join(CONTAINER_BATCHES)} only; "
                 f"profile {', '.join(unknown)} with autotune profile")
    autotune = Path(sys.executable).with_name("autotune")
    with ensure_engine(WORK / "dockerd.log"):
        for art in artifacts:
            subprocess.run([str(autotune), "profile", str(art), "--configs", sizes, "--batch-sizes",
                            CONTAINER_BATCHES[art.parent.name], "--backend", "docker"], check=True)


def find_artifacts(root: Path) -> list[Path]:
    """Folders under ``root`` (or ``root`` itself) whose profile.json exists, sorted by name."""
    found = [p.parent for p in sorted(root.glob("*/profile.json")) + sorted(root.glob("*/artifact/profile.json"))]
    if (root / "profile.json").is_file():
        found.insert(0, root)
    return found


def write_pipeline(stages: int, artifacts: list[Path], folder: Path) -> Path:
    """A pipeline file of ``stages`` stages, stage i served by artifact i modulo how many there are."""
    lines = [f'name = "bench-{stages}"']
    for i, (parents, scale) in enumerate(LAYOUTS[stages]):
        art = artifacts[i % len(artifacts)].resolve()
        lines += ["", "[[stages]]", f'name = "s{i}"', f'artifact = "{art}"',
                  f"parents = {json.dumps(list(parents))}", f"scale_factor = {scale}"]
    path = folder / f"bench-{stages}.toml"
    write_atomically(path, "\n".join(lines) + "\n")
    return path


def run_case(pipeline: Any, load: float, cv: float, spike: bool, seed: int, plan_s: float, live_s: float,
             draws: int = 0) -> dict[str, Any]:
    """Plan by every method on a sample trace, replay each plan on a fresh trace; one row.

    ``seed`` picks the traces, ``draws`` the Estimators' routing and service-time draws.
    """
    from containers.errors import PlanError
    from containers.planner.estimator import Estimator
    from containers.planner.planner import PLAN_PERCENTILE, fastest, plan_methods, service_path
    from containers.planner.trace import gamma_trace, spike_trace
    from containers.planner.tuner import schedule_cost, simulate_with_tuner

    first = fastest(pipeline)
    mu = min(s.profile.throughput_per_s(first[s.name].hardware, 1) for s in pipeline.stages)
    slo = round(SLO_FACTOR * service_path(pipeline, first)[0], 1)
    rate = load * mu
    sample = gamma_trace(rate, cv, plan_s, seed)
    if spike:
        _, factor, at, span = SPIKE
        live = spike_trace(rate, factor * rate, at, span, live_s, cv, seed + 1)
    else:
        live = gamma_trace(rate, cv, live_s, seed + 1)
    planning = Estimator(pipeline, sample, seed=draws, slo_percentile=PLAN_PERCENTILE)
    plans = plan_methods(planning, slo)
    replay = Estimator(pipeline, live, seed=draws + REPLAY_DRAWS)
    row: dict[str, Any] = {"pipeline": pipeline.name, "stages": len(pipeline.stages), "rate_per_s": round(rate, 2),
                           "load": load, "cv": cv, "spike": spike, "slo_ms": slo, "methods": {}}
    visits = []
    for method, plan in plans.items():
        if isinstance(plan, PlanError):
            row["methods"][method] = {"error": str(plan)}
            continue
        est = replay.estimate(plan.stages, slo)
        visits.append(est.visits_per_s)
        row["methods"][method] = {"cost_per_hour": round(plan.cost_per_hour, 5), "miss_rate": round(est.miss_rate, 5),
                                  "p99_ms": round(est.p99_ms, 2), "planned_p99_ms": plan.predicted.p99_ms,
                                  "replicas": {n: c.replicas for n, c in plan.stages.items()},
                                  "planning_s": plan.search["seconds"]}
    planned = plans["inferline"]
    if not isinstance(planned, PlanError):
        tuned = simulate_with_tuner(pipeline, planned, live, seed=draws + REPLAY_DRAWS)
        row["methods"]["inferline+tuner"] = {"cost_per_hour": round(tuned.cost_per_hour, 5),
                                             "miss_rate": round(tuned.estimate.miss_rate, 5),
                                             "p99_ms": round(tuned.estimate.p99_ms, 2),
                                             "replica_changes": len(tuned.schedule),
                                             "startup_s": {n: round(s, 3) for n, s in tuned.startup_s.items()}}
        if spike:  # what the Tuner's misses owe to its replicas' start-up: the same run with replicas serving at once
            instant = replay.estimate(planned.stages, planned.slo_ms, tuned.schedule, startup_s=0.0)
            row["methods"]["inferline+tuner"]["miss_rate_instant_start"] = round(instant.miss_rate, 5)
        # the Tuner reads arrivals, not latencies: with standby replicas it asks the same, served sooner
        warm = Estimator(pipeline, live, seed=draws + REPLAY_DRAWS, standby=STANDBY).estimate(
            planned.stages, slo, tuned.schedule)
        end = float(live[-1])
        row["methods"]["inferline+tuner+standby"] = {
            "cost_per_hour": round(schedule_cost(planned, tuned.schedule, end, STANDBY) / max(end, 1e-9) * 3600, 5),
            "miss_rate": round(warm.miss_rate, 5), "p99_ms": round(warm.p99_ms, 2), "standby": STANDBY}
        if "cost_per_hour" in row["methods"].get("cg-peak", {}):
            row["cost_ratio_vs_cg_peak"] = round(row["methods"]["cg-peak"]["cost_per_hour"]
                                                 / row["methods"]["inferline"]["cost_per_hour"], 2)
            gap = search_gap(planning, slo)
            if gap:  # the ratio had the descent ended on the enumeration's cheapest
                row["search"] = {**gap, "cost_ratio_at_enumerated": round(row["cost_ratio_vs_cg_peak"] * gap["gap"], 2)}
    row["estimator_visits_per_s"] = round(statistics.median(visits)) if visits else None
    return row


def search_gap(estimator: Any, slo_ms: float) -> dict[str, Any] | None:
    """How much cheaper than the greedy descent (Algorithm 2) an enumeration finds, both before the hold-out.

    A CG-Peak/Planner ratio short of target says either that the greedy search stops high or
    that no configuration on these profiles is much cheaper; this tells the two apart. Every
    hardware and batch size per stage is enumerated, each combination starting at the fewest
    replicas that serve its stage's load and growing the bottleneck (as Algorithm 1 does) until
    the Estimator says the SLO holds or it costs no less than the cheapest found. None where
    there are more than ``ENUMERATE_MAX`` combinations.
    """
    from containers.planner.config import StageConfig, config_cost
    from containers.planner.planner import add_replica, bottleneck, fewest_serving, initialize, minimize_cost

    pipeline = estimator.pipeline
    choices = [[(h, b) for h in s.hardware for b in s.profile.batch_sizes(h)] for s in pipeline.stages]
    combinations = math.prod(len(c) for c in choices)
    if combinations > ENUMERATE_MAX:
        return None
    t0 = time.perf_counter()
    # the descent before the hold-out, again: the plan keeps only its end; the Estimator's stage cache makes it cheap
    greedy = minimize_cost(estimator, slo_ms, initialize(estimator, slo_ms))
    greedy_cost = config_cost(pipeline, greedy)
    best, bar = greedy, greedy_cost
    for combo in itertools.product(*choices):
        config = {s.name: StageConfig(h, b, fewest_serving(estimator, s, h, b), s.batch_timeout_ms)
                  for s, (h, b) in zip(pipeline.stages, combo)}
        while config_cost(pipeline, config) < bar - 1e-12:
            if estimator.feasible(config, slo_ms):
                best, bar = config, config_cost(pipeline, config)
                break
            config = add_replica(config, bottleneck(estimator, config, config))
    return {"greedy_cost_per_hour": round(greedy_cost, 5), "enumerated_cost_per_hour": round(bar, 5),
            "gap": round(greedy_cost / bar, 3), "combinations": combinations,
            "enumerated": {n: [c.hardware, c.batch_size, c.replicas] for n, c in best.items()},
            "seconds": round(time.perf_counter() - t0, 1)}


def batch1_ms(artifacts: list[Path]) -> dict[str, dict[str, float]]:
    """Each artifact's mean service time at batch 1 per hardware: what a run's profiles were, since they are re-measured."""
    from containers.planner.profiles import StageProfile
    from results.profile import read_profile

    out = {}
    for art in artifacts:
        profile = StageProfile.from_profile(art.parent.name, read_profile(art / "profile.json"))
        out[art.parent.name] = {h: round(profile.service_ms(h, 1), 2) for h in profile.hardware}
    return out


OURS = ("inferline", "inferline+tuner", "inferline+tuner+standby")  # cheapest first: the plan, then what it adds


def ratio_at_no_more_misses(row: dict[str, Any]) -> float | None:
    """The target's comparison: CG-Peak's cost over that of the first of ours (the Planner, with the Tuner, with
    standby replicas) whose misses are no more than CG-Peak's or within the p99 SLO's 1%; None where none is."""
    peak = row["methods"].get("cg-peak", {})
    if "cost_per_hour" not in peak:
        return None
    bound = max(peak["miss_rate"], SLO_MISS_RATE)
    for method in OURS:
        ours = row["methods"].get(method, {})
        if "miss_rate" in ours and ours["miss_rate"] <= bound:
            return round(peak["cost_per_hour"] / ours["cost_per_hour"], 2)
    return None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Cost ratios overall and by pipeline size, and how often each side keeps its misses within the p99 SLO's 1%.

    The plain ratio sets CG-Peak against the Planner's plan alone, whatever either misses (a 3x
    spike breaks the plan and not CG-Peak). The target's ratio is taken at no more misses
    (``ratio_at_no_more_misses``; a row where none of ours keeps to that counts as 0), and the
    target is met for a pipeline size when the median of its rows' is at least 5x. A one-stage pipeline leaves nothing to place stage by stage:
    there CG is the Planner's own search space minus the batch and replica trade-offs, so the
    ratio is about 1 by construction.
    """
    ratios = [r["cost_ratio_vs_cg_peak"] for r in rows if "cost_ratio_vs_cg_peak" in r]
    sizes = sorted({r["stages"] for r in rows})
    by_size = {n: [r["cost_ratio_vs_cg_peak"] for r in rows if r["stages"] == n and "cost_ratio_vs_cg_peak" in r]
               for n in sizes}
    fair = {n: [ratio_at_no_more_misses(r) for r in rows if r["stages"] == n] for n in sizes}
    no_worse = [r for r in rows if "cost_ratio_vs_cg_peak" in r
                and r["methods"]["inferline"]["miss_rate"] <= r["methods"]["cg-peak"]["miss_rate"]]
    # a p99 SLO is kept or not: misses within its 1% count as no more than CG-Peak's, whatever CG-Peak's are
    slo_no_worse = {m: sum(r["methods"][m]["miss_rate"] <= max(r["methods"]["cg-peak"]["miss_rate"], SLO_MISS_RATE)
                           for r in rows if "cost_ratio_vs_cg_peak" in r and m in r["methods"])
                    for m in OURS if any(m in r["methods"] for r in rows)}
    steady = [r for r in rows if "cost_ratio_vs_cg_peak" in r and not r["spike"]]
    within = {m: sum(r["methods"][m]["miss_rate"] <= SLO_MISS_RATE for r in steady) for m in ("cg-peak", "inferline")}
    five = [r["methods"]["inferline"]["planning_s"] for r in rows if r["stages"] == 5 and "planning_s" in
            r["methods"].get("inferline", {})]
    rates = [r["estimator_visits_per_s"] for r in rows if r["estimator_visits_per_s"]]
    searched = {n: [r["search"] for r in rows if r["stages"] == n and "search" in r] for n in sorted(by_size)}
    spikes = [r for r in rows if r["spike"] and "miss_rate_instant_start" in r["methods"].get("inferline+tuner", {})]

    def spike_span(method: str, key: str = "miss_rate") -> dict[str, float] | None:
        return _span([r["methods"][method][key] for r in spikes if method in r["methods"]])
    return {
        "cost_ratio_vs_cg_peak": {"min": min(ratios, default=None), "median": statistics.median(ratios) if ratios else None,
                                  "max": max(ratios, default=None)},
        "cost_ratio_vs_cg_peak_by_stages": {n: {"min": min(v), "median": statistics.median(v), "max": max(v)}
                                            for n, v in by_size.items() if v},
        "cost_ratio_at_no_more_misses_by_stages": {
            n: {"rows": f"{sum(x is not None for x in v)}/{len(v)}",
                "rows_at_target": f"{sum(x is not None and x >= TARGETS['cost_ratio_vs_cg_peak'] for x in v)}/{len(v)}",
                **({"min": min(k), "median": statistics.median(k), "max": max(k)} if (k := [x for x in v if x]) else {})}
            for n, v in fair.items()},
        "rows_planner_miss_rate_no_higher_than_cg_peak": f"{len(no_worse)}/{len(ratios)}",
        "rows_miss_rate_no_higher_than_cg_peak_or_within_slo": {m: f"{n}/{len(ratios)}" for m, n in slo_no_worse.items()},
        "steady_rows_within_slo_miss_rate": {m: f"{n}/{len(steady)}" for m, n in within.items()},
        "search_gap_by_stages": {n: {"gap_max": max(g["gap"] for g in v),
                                     "cost_ratio_at_enumerated_max": max(g["cost_ratio_at_enumerated"] for g in v)}
                                 for n, v in searched.items() if v},
        "spike_miss_rates": {"cg-peak": spike_span("cg-peak"), "inferline+tuner": spike_span("inferline+tuner"),
                             "inferline+tuner_instant_start": spike_span("inferline+tuner", "miss_rate_instant_start"),
                             "inferline+tuner+standby": spike_span("inferline+tuner+standby")} if spikes else None,
        "spike_cost_ratio_vs_cg_peak_with_standby": _span([
            round(r["methods"]["cg-peak"]["cost_per_hour"] / r["methods"]["inferline+tuner+standby"]["cost_per_hour"], 2)
            for r in spikes if "inferline+tuner+standby" in r["methods"] and "cost_per_hour" in r["methods"]["cg-peak"]]),
        "spike_startup_s": _span([s for r in spikes for s in r["methods"]["inferline+tuner"].get("startup_s", {}).values()]),
        "planning_s_5_stages_max": max(five, default=None),
        "estimator_visits_per_s_median": round(statistics.median(rates)) if rates else None,
        "targets": TARGETS,
        "met": {"cost_ratio_at_no_more_misses_by_stages": {
                    n: bool(v) and statistics.median(x or 0.0 for x in v) >= TARGETS["cost_ratio_vs_cg_peak"]
                    for n, v in fair.items()},
                "planning_s_5_stages": bool(five) and max(five) < TARGETS["planning_s_5_stages"]},
    }


def markdown(sim: dict[str, Any]) -> str:
    """The Simulated section: the run's table and summary, then each rerun's."""
    lines = ["## Simulated (Estimator)", "", f"Profiles: {', '.join(sim['profiles'])}{' (' + sim['note'] + ')' if sim['note'] else ''}.",
             f"Sample trace {sim['plan_s']:g} s, replay {sim['live_s']:g} s (other arrivals and other service-time "
             f"draws); SLO = {SLO_FACTOR:g}x batch-1 service time; CG-Peak provisioned for the busiest SLO-long window "
             "of the sample trace.", ""]
    lines += ([profiled(sim["batch1_ms"]), ""] if "batch1_ms" in sim else []) + run_markdown(sim, sim.get("plan_percentile", 99))
    for k, rerun in enumerate(sim.get("reruns", []), 1):
        lines += [f"### Rerun {k} ({rerun['date']}: traces and draws seeded {rerun['seed_offset']} further on)", ""]
        if "batch1_ms" in rerun:
            lines += [profiled(rerun["batch1_ms"]), ""]
        lines += run_markdown(rerun, sim.get("plan_percentile", 99))
    return "\n".join(lines)


def profiled(batch1: dict[str, dict[str, float]]) -> str:
    """A run's profiles in a line: each re-tuned and re-profiled run plans on its own."""
    return "Profiles as measured for this run, mean ms at batch 1: " + "; ".join(
        f"{name} " + ", ".join(f"{ms:g} on {h}" for h, ms in by_hw.items()) for name, by_hw in batch1.items()) + "."


def run_markdown(run: dict[str, Any], plan_percentile: float) -> list[str]:
    """One run's table of rows and its summary lines."""
    lines = ["| pipeline | load (x mu, CV) | SLO ms | CG-Mean $/h (miss) | CG-Peak $/h (miss) | Planner $/h (miss) "
             "| Planner+Tuner $/h (miss) | Planner+Tuner+standby $/h (miss) | CG-Peak / Planner |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in run["rows"]:
        cell = lambda m: ("-" if m not in r["methods"] else "error" if "error" in r["methods"][m] else  # noqa: E731
                          f"{r['methods'][m]['cost_per_hour']:.4f} ({r['methods'][m]['miss_rate']:.2%})")
        load = f"{r['load']:g}, CV {r['cv']:g}" + (", spike x3" if r["spike"] else "")
        lines.append(f"| {r['pipeline']} | {load} | {r['slo_ms']:g} | {cell('cg-mean')} | {cell('cg-peak')} | "
                     f"{cell('inferline')} | {cell('inferline+tuner')} | {cell('inferline+tuner+standby')} | "
                     f"{r.get('cost_ratio_vs_cg_peak', '-')} |")
    s = run["summary"]
    gaps = list(s.get("search_gap_by_stages", {}).items())
    by_size = "; ".join(f"{n} stages: {v['min']}-{v['max']} (median {v['median']})"
                        for n, v in s["cost_ratio_vs_cg_peak_by_stages"].items())
    fair = "; ".join(f"{n} stages: " + (f"{v['min']}-{v['max']}, " if "min" in v else "")
                     + f"{v['rows']} rows at no more misses, {v['rows_at_target']} at "
                     f">= {TARGETS['cost_ratio_vs_cg_peak']:g}x, met: {s['met']['cost_ratio_at_no_more_misses_by_stages'][n]}"
                     for n, v in s["cost_ratio_at_no_more_misses_by_stages"].items())
    lines += ["", f"CG-Peak / Planner cost, the plan alone whatever either misses: {s['cost_ratio_vs_cg_peak']}; by "
              f"pipeline: {by_size}.",
              f"At no more misses (the target: CG-Peak against the first of the Planner, Planner+Tuner, "
              f"Planner+Tuner+standby that misses no more than CG-Peak or keeps within the p99 SLO's {SLO_MISS_RATE:.0%}; "
              f"met where a size's median row, a row without one counting 0, is >= "
              f"{TARGETS['cost_ratio_vs_cg_peak']:g}x): {fair}.",
              f"Rows where the Planner misses no more than CG-Peak: {s['rows_planner_miss_rate_no_higher_than_cg_peak']}; "
              f"no more than CG-Peak or within the p99 SLO's {SLO_MISS_RATE:.0%}: Planner "
              f"{s['rows_miss_rate_no_higher_than_cg_peak_or_within_slo']['inferline']}, Planner+Tuner "
              f"{s['rows_miss_rate_no_higher_than_cg_peak_or_within_slo']['inferline+tuner']}"
              + (f", Planner+Tuner+standby {s['rows_miss_rate_no_higher_than_cg_peak_or_within_slo']['inferline+tuner+standby']}"
                 if "inferline+tuner+standby" in s["rows_miss_rate_no_higher_than_cg_peak_or_within_slo"] else "") + "; "
              f"steady-traffic rows whose replay keeps the p99 SLO (misses <= {SLO_MISS_RATE:.0%}): "
              f"CG-Peak {s['steady_rows_within_slo_miss_rate']['cg-peak']}, "
              f"Planner {s['steady_rows_within_slo_miss_rate']['inferline']}. The Planner holds the sample's "
              f"p{plan_percentile} to the SLO.",
              *([] if not s.get("search_gap_by_stages") else [
                  f"Search gap (pipelines of up to {ENUMERATE_MAX} hardware x batch combinations, before the "
                  "hold-out): the greedy descent's plan costs at most " + ", ".join(
                      f"{v['gap_max']:g}x ({n} stage{'s' if str(n) != '1' else ''})" for n, v in gaps)
                  + " the cheapest an enumeration of every hardware and batch per stage finds; at that cheapest, "
                  "CG-Peak / Planner would reach at most "
                  + ", ".join(f"{v['cost_ratio_at_enumerated_max']:g}" for _, v in gaps) + " respectively."]),
              *([] if not s.get("spike_miss_rates") else [_spike_line(s["spike_miss_rates"], s.get("spike_startup_s"),
                                                                      s.get("spike_cost_ratio_vs_cg_peak_with_standby"))]),
              f"5-stage planning: {s['planning_s_5_stages_max']} s at most (target < {TARGETS['planning_s_5_stages']:g} s; "
              f"met: {s['met']['planning_s_5_stages']}). Estimator: {s['estimator_visits_per_s_median']} query-stage "
              "visits/s (median).", ""]
    return lines


def _span(values: list[float]) -> dict[str, float] | None:
    return {"min": min(values), "max": max(values)} if values else None


def _spike_line(misses: dict[str, dict[str, float]], startup_s: dict[str, float] | None,
                standby_ratio: dict[str, float] | None = None) -> str:
    """What the Tuner loses to CG-Peak on an unforeseen spike, how much of it is its replicas' start-up
    (``startup_s``: the span of the stages' start-ups, ask to serving; None: the runs before they were profiled),
    and what standby replicas win back at what cost (``standby_ratio``: CG-Peak's cost over that arm's)."""
    from containers.planner.estimator import STARTUP_S

    span = lambda m: f"{misses[m]['min']:.1%}-{misses[m]['max']:.1%}"  # noqa: E731
    lo, hi = (startup_s["min"], startup_s["max"]) if startup_s else (STARTUP_S, STARTUP_S)
    start = f"{lo:.1f}-{hi:.1f} s" if hi > lo else f"{lo:g} s"
    return (f"Spike rows: Planner+Tuner misses {span('inferline+tuner')} (its replicas start in {start}), "
            f"CG-Peak {span('cg-peak')}; had the Tuner's replicas served the moment it asked for them, "
            f"{span('inferline+tuner_instant_start')}"
            + (f"; with {STANDBY:g} standby replicas per planned replica, {span('inferline+tuner+standby')} at "
               f"{standby_ratio['min']:g}-{standby_ratio['max']:g}x less than CG-Peak's cost"
               if misses.get("inferline+tuner+standby") and standby_ratio else "") + ".")


def write_results(sim: dict[str, Any], out_dir: Path) -> None:
    """Merge ``simulated`` into planner.json and its section into planner.md, keeping what others wrote."""
    merge_section(out_dir, "simulated", sim, "Simulated", markdown(sim))


def merge_section(out_dir: Path, key: str, value: dict[str, Any], title: str, text: str) -> None:
    """Set ``key`` in planner.json and replace the ``## <title>`` section of planner.md, keeping everything else."""
    path = out_dir / "planner.json"
    record = json.loads(path.read_text()) if path.is_file() else {}
    record[key] = value
    write_atomically(path, json.dumps(record, indent=2) + "\n")
    md = out_dir / "planner.md"
    sections = md.read_text().split("\n## ") if md.is_file() else ["# Placement planner benchmark\n"]
    parts = [sections[0]] + ["## " + s.rstrip("\n") + "\n" for s in sections[1:]]
    at = next((i for i, s in enumerate(parts) if s.startswith(f"## {title}")), None)
    parts = parts[:at] + [text] + parts[at + 1:] if at is not None else parts + [text]  # a section keeps its place
    write_atomically(md, "\n".join(parts).rstrip() + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profiles", type=Path, default=None, help="folder of artifacts with real profile.json files")
    parser.add_argument("--quick", action="store_true", help="smoke run: the 3-stage pipeline, one load, short traces")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where planner.json and planner.md go")
    parser.add_argument("--live", action="store_true", help="the live part on Docker (bench.planner_live) instead")
    parser.add_argument("--rerun", action="store_true",
                        help="keep the recorded run (simulated, or with --live the live one) and add this one beside it")
    parser.add_argument("--profile-containers", action="store_true",
                        help="first measure the default artifacts in containers (Docker), as the committed run did")
    parser.add_argument("--resummarize", action="store_true",
                        help="recompute the recorded simulated runs' summaries from their rows (no new run)")
    args = parser.parse_args()
    if args.resummarize:
        recorded = json.loads((args.out / "planner.json").read_text())["simulated"]
        for run in [recorded, *recorded.get("reruns", [])]:
            run["summary"] = summarize(run["rows"])
        write_results(recorded, args.out)
        return
    if args.live:
        from bench.planner_live import run_live

        live = run_live(args.out, rerun=args.rerun)
        print(json.dumps({k: v for k, v in live.items() if k in ("steady", "step")}, indent=2))
        return
    from containers.planner.pipeline import read_pipeline

    root = args.profiles or QOE_ARTIFACTS
    artifacts = find_artifacts(root)
    if not artifacts:
        sys.exit(f"no artifact with a profile.json under {root}; tune some (python -m bench.qoe) or give --profiles")
    note = "" if args.profiles else f"no --profiles given: the artifacts bench.qoe tuned under {QOE_ARTIFACTS}"
    if args.profile_containers:
        profile_containers(artifacts)
    print(f"[planner] profiles: {', '.join(str(a) for a in artifacts)}" + (f" ({note})" if note else ""), flush=True)
    WORK.mkdir(parents=True, exist_ok=True)
    plan_s, live_s = (20.0, 30.0) if args.quick else (PLAN_S, LIVE_S)
    recorded = json.loads((args.out / "planner.json").read_text()).get("simulated") if (
        args.out / "planner.json").is_file() else None
    if args.rerun and not recorded:
        sys.exit(f"--rerun adds to a recorded simulated run, and {args.out / 'planner.json'} has none; run without --rerun")
    offset = RERUN_SEEDS * (len(recorded.get("reruns", [])) + 1) if args.rerun else 0
    cases = [(load, cv, False) for load, cv in LOADS] + [(SPIKE[0], 1.0, True)]
    rows = []
    for stages in ([3] if args.quick else [1, 3, 5]):
        pipeline = read_pipeline(write_pipeline(stages, artifacts, WORK))
        for i, (load, cv, spike) in enumerate(cases[:1] if args.quick else cases):
            t0 = time.perf_counter()
            rows.append(run_case(pipeline, load, cv, spike, seed=offset + 100 * stages + i, plan_s=plan_s,
                                 live_s=max(live_s, SPIKE[2] + SPIKE[3] + 10) if spike else live_s, draws=offset))
            print(f"[planner] {pipeline.name} load {load:g} CV {cv:g}{' spike' if spike else ''}: "
                  f"ratio {rows[-1].get('cost_ratio_vs_cg_peak')}, {time.perf_counter() - t0:.1f} s", flush=True)
    from containers.planner.planner import PLAN_PERCENTILE

    run = {"date": time.strftime("%Y-%m-%d"), "batch1_ms": batch1_ms(artifacts), "rows": rows, "summary": summarize(rows)}
    if args.rerun:
        sim = {**recorded, "reruns": recorded.get("reruns", []) + [{**run, "seed_offset": offset}]}
    else:  # a fresh run replaces the reruns of the one before it
        sim = {"profiles": [str(a) for a in artifacts], "note": note, "quick": args.quick, "plan_s": plan_s,
               "plan_percentile": PLAN_PERCENTILE, "live_s": live_s, "host": platform.node(), **run}
    write_results(sim, args.out)
    print(json.dumps(run["summary"], indent=2))


if __name__ == "__main__":
    main()

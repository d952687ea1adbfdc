"""Placement planner benchmark, live part: a plan served on Docker, measured against the Estimator's prediction.

    python -m bench.planner --live

A two-stage pipeline (mlp -> bert_ffn, the artifacts bench.qoe tuned, on their
container-measured profile entries of at most one core) is profiled again in containers
first (a shared host's speed drifts by 20% between hours; the prediction should be about
the plan, not the drift), then planned for a Poisson trace sized so that each replica has a
core of its own, as the Estimator assumes, and served three times
(``containers.planner.live.apply_plan``), each time just after the plan's own
configurations are profiled again (the host also drifts within the half hour the three take):
the p99 of all their queries against the p99 of the Estimator's per-query predictions for
the same trace and routing draws, each on the profile taken just before its run (target:
within 10%). The load generator and front end are pinned to the last core, which the placement (largest replica first, on
the first core, where it was profiled) gives to the lightest stage. A second run steps the rate up mid-trace with the Tuner on; its replicas
are the half-core ones, on every core, and the load and step are sized so that the replicas
the simulated Tuner would add still fit. It reports the replica changes and
the p99 before and after; then the same again with ``LIVE_STANDBY`` warm standby replicas
per planned replica, to show how much sooner a resumed one serves. Writes the ``live`` key of
results/bench/planner.json and its section of planner.md, keeping the ``simulated`` ones;
each run's live.json and live.png go to results/bench/planner/.
"""

from __future__ import annotations

import json
import math
import platform
import shutil
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.planner import QOE_ARTIFACTS, SLO_FACTOR, WORK, merge_section, profile_containers
from results.atomic import write_atomically

LIVE_STAGES = ("mlp", "bert_ffn")  # stage i runs QOE_ARTIFACTS/<name>/artifact; bert_ffn follows mlp
LIVE_MAX_CORES = 1.0  # per replica: container-measured entries above this are left out, so replicas fit 2 cores
LIVE_STEP_MAX_CORES = 0.5  # the step run's replicas: small, so the Tuner's additions still fit
LIVE_LOADS = (0.6, 0.5, 0.4, 0.3, 0.2, 0.15, 0.1)  # x the slowest stage's batch-1 throughput, tried until the plan fits
LIVE_STEPS = (2.0, 1.5, 1.25)  # rate factors for the step run, tried until the simulated Tuner's replicas fit
LIVE_PLAN_S, LIVE_RUN_S, LIVE_STEP_AT_S, LIVE_STEP_RUN_S = 60.0, 150.0, 25.0, 75.0
LIVE_QUERIES = 1500  # a steady run lasts at least LIVE_RUN_S and long enough for this many queries: its p99 rests on 15
CLIENT_CORES = 1  # the load generator and front end are pinned to the last core
LIVE_TARGET_P99_ERROR = 0.10
LIVE_STEADY_REPEATS = 3  # one live run's p99 moved by 25% between two runs of the same plan and trace
LIVE_STANDBY = 1.0  # the step run again, each stage keeping this many paused standby replicas per planned replica


def write_live_pipeline(folder: Path, max_cores: float, min_cores: float = 0.0) -> Path:
    """The two-stage pipeline file; each stage limited to its container-measured sizes from ``min_cores`` to
    ``max_cores``, if any."""
    lines = ['name = "bench-live"']
    for i, name in enumerate(LIVE_STAGES):
        art = (QOE_ARTIFACTS / name / "artifact").resolve()
        entries = json.loads((art / "profile.json").read_text())["entries"]
        limits = sorted({e["hardware"]["cpu_limit"] for e in entries
                         if e["hardware"].get("cpu_limit") is not None
                         and min_cores <= e["hardware"]["cpu_limit"] <= max_cores})
        lines += ["", "[[stages]]", f'name = "{name}"', f'artifact = "{art}"',
                  f"parents = {json.dumps([LIVE_STAGES[i - 1]] if i else [])}"]
        if limits:
            lines.append(f"hardware = {json.dumps([f'cpu-{c:g}' for c in limits])}")
    path = folder / (f"bench-live-{max_cores:g}.toml" if not min_cores else f"bench-live-{min_cores:g}-{max_cores:g}.toml")
    write_atomically(path, "\n".join(lines) + "\n")
    return path


def profiled_now(plan: Any, max_cores: float, cores: list[int]) -> Any:
    """The live pipeline, read after the plan's own configurations are measured again, just before it is served.

    Profiles taken 40 minutes before a run predicted its p99 18% low once the host had slowed
    (the rerun of 2026-12-01: its three repeats' means moved from +0.2% to +17.9%); the
    prediction a run is held to should be of the host as it is when the run starts. The
    containers are profiled on ``cores``, where the plan's replicas run, not on the client's.
    """
    import os

    from containers.planner.hardware import cpu_cores
    from containers.planner.pipeline import read_pipeline

    client = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cores)
    try:
        for name, cfg in plan.stages.items():
            profile_containers([QOE_ARTIFACTS / name / "artifact"], f"{cpu_cores(cfg.hardware):g}")
    finally:
        os.sched_setaffinity(0, client)
    return read_pipeline(write_live_pipeline(WORK, max_cores))


def plan_cores(plan: Any, replicas: dict[str, int] | None = None, whole: bool = False) -> float:
    """CPU cores the plan's replicas (or ``replicas`` per stage, on the planned hardware) are limited to;
    ``whole``: the cores they are pinned to, a core of its own for each (a half-core replica counts one)."""
    from containers.planner.hardware import cpu_cores

    counts = replicas or {n: c.replicas for n, c in plan.stages.items()}
    size = lambda c: math.ceil(cpu_cores(c.hardware) or 0.0) if whole else (cpu_cores(c.hardware) or 0.0)  # noqa: E731
    return sum(counts[n] * size(c) for n, c in plan.stages.items())


def _planned(pipeline: Any, load: float, seed: int) -> tuple[float, float, Any] | None:
    """(rate, SLO, plan) for ``load`` x the slowest stage's batch-1 throughput; None when no plan meets the SLO."""
    from containers.errors import PlanError
    from containers.planner.estimator import Estimator
    from containers.planner.planner import PLAN_PERCENTILE, fastest, plan_pipeline, service_path
    from containers.planner.trace import gamma_trace

    first = fastest(pipeline)
    rate = load * min(s.profile.throughput_per_s(first[s.name].hardware, 1) for s in pipeline.stages)
    slo = round(SLO_FACTOR * service_path(pipeline, first)[0], 1)
    try:
        sample = Estimator(pipeline, gamma_trace(rate, 1.0, LIVE_PLAN_S, seed), slo_percentile=PLAN_PERCENTILE)
        return rate, slo, plan_pipeline(sample, slo)
    except PlanError:
        return None


def size_steady(pipelines: Sequence[Any], cores: float, seed: int) -> dict[str, Any]:
    """The highest load whose plan gives every replica a core of its own within ``cores``, with its plan and a
    fresh trace of it: the Estimator, as InferLine's, gives each replica its own hardware, and replicas packed
    onto one core slow each other down. At each load the pipelines are tried in order: where half-core replicas
    serve as much per core as whole ones, the planner takes them, and then needs more cores than it pays for."""
    from containers.planner.trace import gamma_trace

    for load in LIVE_LOADS:
        for pipeline in pipelines:
            if (found := _planned(pipeline, load, seed)) and plan_cores(found[2], whole=True) <= cores:
                rate, slo, plan = found
                return {"load": load, "rate_per_s": round(rate, 3), "slo_ms": slo, "plan": plan,
                        "hardware": {s.name: list(s.hardware) for s in pipeline.stages},
                        "trace": gamma_trace(rate, 1.0, max(LIVE_RUN_S, LIVE_QUERIES / rate), seed + 1)}
    raise SystemExit(f"no load in {LIVE_LOADS} gives a plan within {cores:g} cores for {pipelines[0].name}")


def size_step(pipeline: Any, cores: float, seed: int) -> dict[str, Any] | None:
    """The highest (load, step) whose plan, and the replicas the simulated Tuner adds after the step, fit in ``cores``."""
    from containers.planner.trace import spike_trace
    from containers.planner.tuner import simulate_with_tuner

    for load in LIVE_LOADS:
        if not (found := _planned(pipeline, load, seed)) or plan_cores(found[2]) > cores:
            continue
        rate, slo, plan = found
        for factor in LIVE_STEPS:
            trace = spike_trace(rate, factor * rate, LIVE_STEP_AT_S, LIVE_STEP_RUN_S - LIVE_STEP_AT_S, LIVE_STEP_RUN_S,
                                1.0, seed + 2)
            schedule = simulate_with_tuner(pipeline, plan, trace).schedule
            peak = {n: max([c.replicas] + [ch.replicas for ch in schedule if ch.stage == n])
                    for n, c in plan.stages.items()}
            if schedule and plan_cores(plan, peak) <= cores:
                return {"load": load, "rate_per_s": round(rate, 3), "slo_ms": slo, "plan": plan, "trace": trace,
                        "step_factor": factor, "simulated_peak_replicas": peak}
    return None


def answered_ms(record: dict[str, Any], start_s: float = 0.0, end_s: float = float("inf")) -> list[float]:
    """Latencies (ms) of the answered queries that arrived in ``[start_s, end_s)`` of a live run."""
    q = record["queries"]
    return [v for t, v, bad in zip(q["arrival_s"], q["latency_ms"], q["failed"])
            if start_s <= t < end_s and v is not None and not bad]


def p99(latencies_ms: list[float]) -> float | None:
    return round(float(np.percentile(latencies_ms, 99)), 3) if latencies_ms else None


def live_summary(record: dict[str, Any], folder: Path) -> dict[str, Any]:
    """What the bench keeps of a live run (the per-query lists stay in its live.json)."""
    keep = ("measured", "predicted", "predicted_with_tuner", "predicted_live_schedule", "predicted_as_served",
            "startup_s", "modelled_startup_s", "compared_with", "p99_error", "batches", "errors", "wall_s", "trace")
    changes = [c for c in record["replica_changes"] if c["event"] != "planned"]
    return {**{k: record[k] for k in keep if k in record}, "replica_changes": changes, "record": str(folder / "live.json"),
            "plot": str(folder / "live.png"),
            "met_p99_error": record.get("p99_error") is not None and abs(record["p99_error"]) <= LIVE_TARGET_P99_ERROR}


def step_summary(record: dict[str, Any], step: dict[str, Any], folder: Path) -> dict[str, Any]:
    """What the bench keeps of a step run: the live summary, the step, and the p99 before it, after it, and after
    the last replica joined."""
    serving = [c["t_s"] for c in record["replica_changes"] if c["event"] == "serving"]
    return {**_setting(step), **live_summary(record, folder), "standby": record.get("standby", 0.0),
            "step_at_s": LIVE_STEP_AT_S, "step_factor": step["step_factor"],
            "simulated_peak_replicas": step["simulated_peak_replicas"],
            "p99_before_ms": p99(answered_ms(record, 0.0, LIVE_STEP_AT_S)),
            "p99_after_ms": p99(answered_ms(record, LIVE_STEP_AT_S)),
            "scaled_at_s": round(max(serving), 2) if serving else None,
            "p99_after_scaled_ms": p99(answered_ms(record, max(serving))) if serving else None}


def _setting(sized: dict[str, Any]) -> dict[str, Any]:
    """The JSON-ready part of a sized run: its load, rate, SLO and plan."""
    return {"load": sized["load"], "rate_per_s": sized["rate_per_s"], "slo_ms": sized["slo_ms"],
            "plan": sized["plan"].to_json()["stages"], "predicted_at_planning": sized["plan"].to_json()["predicted"]}


def run_live(out_dir: Path, seed: int = 7, rerun: bool = False) -> dict[str, Any]:
    """Plan and serve the two-stage pipeline on Docker: a steady run, then a step-up run with the Tuner.

    ``rerun``: keep the recorded live run and add this one to its ``reruns`` (its records and
    plots in folders of their own), so the committed figures show both.
    """
    import os

    from containers.backends.docker import DockerBackend
    from containers.backends.engine import ensure_engine
    from containers.planner.live import apply_plan
    from containers.planner.pipeline import read_pipeline

    WORK.mkdir(parents=True, exist_ok=True)
    # this host as it is now, in the sizes the live pipelines allow
    profile_containers([QOE_ARTIFACTS / name / "artifact" for name in LIVE_STAGES],
                       f"{LIVE_STEP_MAX_CORES:g},{LIVE_MAX_CORES:g}")
    pipeline = read_pipeline(write_live_pipeline(WORK, LIVE_MAX_CORES))
    small = read_pipeline(write_live_pipeline(WORK, LIVE_STEP_MAX_CORES))
    every = sorted(os.sched_getaffinity(0))
    client, cores = every[-CLIENT_CORES:], float(len(every))
    whole = read_pipeline(write_live_pipeline(WORK, LIVE_MAX_CORES, min_cores=1.0))
    steady, step = size_steady([pipeline, whole], cores, seed), size_step(small, cores, seed)
    live: dict[str, Any] = {"pipeline": {s.name: str(s.artifact) for s in pipeline.stages},
                            "hardware": {s.name: list(s.hardware) for s in pipeline.stages},
                            "steady_hardware": steady["hardware"],
                            "step_hardware": {s.name: list(s.hardware) for s in small.stages}, "cores": cores,
                            "client_cores": client,
                            "targets": {"p99_error": LIVE_TARGET_P99_ERROR}, "host": platform.node(),
                            "steady": _setting(steady)}
    recorded = out_dir / "planner.json"
    earlier = json.loads(recorded.read_text()).get("live") if rerun and recorded.is_file() else None
    tag = f"-rerun{len(earlier.get('reruns', [])) + 1}" if earlier else ""
    steady_dir, step_dir = out_dir / "planner" / f"live-steady{tag}", out_dir / "planner" / f"live-step{tag}"
    if not rerun:  # a fresh run replaces the recorded one and its reruns: their plots go with them
        for stale in (out_dir / "planner").glob("live-*-rerun*"):
            shutil.rmtree(stale)
    with ensure_engine(WORK / "dockerd.log") as engine:
        backend = DockerBackend(engine)
        os.sched_setaffinity(0, client)
        try:
            say("steady")(f"{steady['rate_per_s']} q/s, SLO {steady['slo_ms']} ms, plan {live['steady']['plan']}")
            repeats, answered, predicted = [], [], []  # the same plan and trace served again, each on a fresh profile
            for _ in range(LIVE_STEADY_REPEATS):
                now = profiled_now(steady["plan"], LIVE_MAX_CORES, every)
                record = apply_plan(steady["plan"], now, steady["trace"], steady_dir, backend=backend,
                                    cores=every, on_event=say("steady"))
                repeats.append({**live_summary(record, steady_dir), "service_ms": service_ms(now, steady["plan"])})
                answered += answered_ms(record)
                predicted += [v for v in record["queries"]["predicted_ms"] if v is not None]
            errors = sorted(r["p99_error"] for r in repeats if r.get("p99_error") is not None)
            pooled, pooled_predicted = p99(answered), p99(predicted)
            pooled_error = round(pooled / pooled_predicted - 1, 4) if pooled else None
            live["steady"].update(repeats[-1])
            live["steady"].update({
                "repeats": [{"measured_p99_ms": r["measured"]["p99_ms"], "predicted_p99_ms": r["predicted"]["p99_ms"],
                             "p99_error": r.get("p99_error"), "service_ms": r["service_ms"]} for r in repeats],
                "median_p99_error": statistics.median(errors) if errors else None,
                "pooled_queries": len(answered), "pooled_p99_ms": pooled, "pooled_predicted_p99_ms": pooled_predicted,
                "pooled_p99_error": pooled_error,
                "met_p99_error": pooled_error is not None and abs(pooled_error) <= LIVE_TARGET_P99_ERROR})
            if step is None:
                live["step"] = {"skipped": f"no load and step in {LIVE_LOADS} x {LIVE_STEPS} keep the plan and the "
                                           f"simulated Tuner's replicas within {cores:g} cores"}
            else:
                for key, folder, standby in (("step", step_dir, 0.0),
                                             ("step_standby", step_dir.with_name(step_dir.name + "-standby"),
                                              LIVE_STANDBY)):
                    say(key)(f"{step['rate_per_s']} q/s x{step['step_factor']:g} from {LIVE_STEP_AT_S:g} s, Tuner on, "
                             f"{standby:g} standby per planned replica")
                    now = profiled_now(step["plan"], LIVE_STEP_MAX_CORES, every)
                    record = apply_plan(step["plan"], now, step["trace"], folder, backend=backend,
                                        tuner=True, cores=every, standby=standby, on_event=say(key))
                    live[key] = step_summary(record, step, folder)
        finally:
            os.sched_setaffinity(0, every)
            backend.close()
    if earlier:
        earlier.setdefault("reruns", []).append(live)
    write_live(earlier or live, out_dir)
    return live


def service_ms(pipeline: Any, plan: Any) -> dict[str, float]:
    """Each stage's profiled batch-1 mean service time (ms) on its planned hardware: how fast the host was."""
    return {n: round(pipeline.stage(n).profile.service_ms(c.hardware, 1), 3) for n, c in plan.stages.items()}


def say(run: str) -> Callable[[str], None]:
    """A progress printer for one run."""
    return lambda text: print(f"[planner] live {run}: {text}", flush=True)


def live_markdown(live: dict[str, Any]) -> str:
    """The live section: one table row per run and block (the recorded run, then each rerun), then what each saw."""
    plan = lambda run: ", ".join(f"{n}: {c['hardware']} x{c['replicas']} batch {c['batch_size']}"  # noqa: E731
                                 for n, c in run["plan"].items())
    blocks = [("", live)] + [(f" (rerun {i})", r) for i, r in enumerate(live.get("reruns", []), 1)]
    lines = ["## Live (Docker)", "",
             f"Pipeline {' -> '.join(live['pipeline'])} on {live['host']} ({live['cores']:g} cores; load generator and "
             f"front end pinned to core {live['client_cores']}, the steady run's replicas a core each); "
             "hardware allowed: "
             f"{live['hardware']} (step run: {live['step_hardware']}). Poisson arrivals; SLO = {SLO_FACTOR:g}x the "
             "batch-1 service path.", "",
             "| run | rate q/s | SLO ms | plan | queries | failed | measured p50 / p99 ms | predicted p99 ms (which) "
             "| p99 error | miss rate |", "|---|---|---|---|---|---|---|---|---|---|"]
    for tag, block in blocks:
        runs = [(f"steady, plan as is{tag}", block["steady"]), (f"rate step, Tuner on{tag}", block["step"])]
        if "step_standby" in block:
            runs.append((f"rate step, Tuner on, {block['step_standby']['standby']:g} standby per replica{tag}",
                         block["step_standby"]))
        for name, run in runs:
            if "skipped" in run:
                lines.append(f"| {name} | - | - | - | - | - | - | - | - | {run['skipped']} |")
                continue
            m, which = run["measured"], run["compared_with"]
            lines.append(f"| {name} | {run['rate_per_s']} | {run['slo_ms']:g} | {plan(run)} | {m['queries']} | "
                         f"{m['failed']} | {m['p50_ms']} / {m['p99_ms']} | {run[which]['p99_ms']} "
                         f"({which.replace('_', ' ')}) | {run.get('p99_error', 0):+.1%} | {m['miss_rate']:.2%} |")
    for tag, block in blocks:
        steady, step = block["steady"], block["step"]
        reps = steady.get("repeats", [])
        each = ", ".join(f"{r['measured_p99_ms']} ms against {r['predicted_p99_ms']} ({r['p99_error']:+.1%})"
                         for r in reps)
        speeds = "; ".join(", ".join(f"{n} {v} ms" for n, v in r["service_ms"].items()) for r in reps)
        lines += ["", f"Steady run{tag}, served {len(reps)} times (the row: the last): measured p99 {each}; median "
                  f"error {steady['median_p99_error']:+.1%}. Each repeat predicted on the plan's configurations "
                  f"profiled just before it (batch-1 mean service: {speeds}). All {steady['pooled_queries']} answered "
                  f"queries of the repeats pooled (one run's p99 rests on its "
                  f"{max(1, steady['measured']['queries'] // 100)} slowest queries): p99 {steady['pooled_p99_ms']} ms "
                  f"against {steady['pooled_predicted_p99_ms']} ms, the p99 of the repeats' per-query predictions, "
                  f"error {steady['pooled_p99_error']:+.1%}; within {LIVE_TARGET_P99_ERROR:.0%}: "
                  f"{steady['met_p99_error']}."]
        if "skipped" not in step:
            steps = [step] + ([block["step_standby"]] if "step_standby" in block else [])
            lines += [_step_line(run, tag) for run in steps]
            lines.append(f"Plots: {', '.join([steady['plot']] + [run['plot'] for run in steps])}.")
    return "\n".join(lines + [""])


def _step_line(step: dict[str, Any], tag: str) -> str:
    """What the Tuner asked for in a step run, when the replicas joined, and the p99 around the step."""
    asked = [f"{c['t_s']:.1f} s {c['stage']} -> {c['replicas']}" for c in step["replica_changes"]
             if c["event"] == "asked"]
    standby = f" with {step['standby']:g} standby per planned replica" if step.get("standby") else ""
    return (f"Step run{standby}{tag}: rate x{step['step_factor']:g} from {step['step_at_s']:g} s; the Tuner asked "
            f"{'; '.join(asked) or 'nothing'}; the last replica joined at {step['scaled_at_s']} s. p99 "
            f"before the step {step['p99_before_ms']} ms, after it {step['p99_after_ms']} ms, after the "
            f"last replica joined {step['p99_after_scaled_ms']} ms." + _start_up_line(step))


def _start_up_line(step: dict[str, Any]) -> str:
    """How long the Tuner's replicas took to serve, and the p99 predicted with the Estimator's start-up instead."""
    took = [t for ts in step.get("startup_s", {}).values() for t in ts]
    if not took or "predicted_live_schedule" not in step:
        return ""
    from containers.planner.estimator import STARTUP_S

    modelled = step.get("modelled_startup_s")  # the runs before start-ups were profiled assumed STARTUP_S
    assumed = (", ".join(f"{s:.1f} s for {n}" for n, s in modelled.items()) + " (as profiled, with the warm-up)"
               if modelled else f"{STARTUP_S:g} s")
    return (f" Its new replicas served {', '.join(f'{t:.2f}' for t in took)} s after the ask (the Estimator assumes "
            f"{assumed}: with that, predicted p99 {step['predicted_live_schedule']['p99_ms']} ms).")


def write_live(live: dict[str, Any], out_dir: Path) -> None:
    merge_section(out_dir, "live", live, "Live", live_markdown(live))


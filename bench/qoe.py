"""QoE benchmark (DQoES): how many containers meet their latency targets, by allocation policy and schedule.

    python -m bench.qoe [--schedules burst,fixed,random] [--rerun]

On a real Docker engine (started here if none runs): six containers serving two tuned models
(zoo:mlp at 64 items per request, zoo:bert_ffn at one sequence), one closed-loop client each,
sharing this machine's cores. Each model's fastest latency is measured first, alone with the
whole machine; targets are drawn around it as in the paper (some below it: unachievable).
Arms, same targets and schedule: default Docker (no limits), static equal limits, DQoES
(adaptive listener) and, on the burst schedule, DQoES with a fixed interval. Then the
deployment schemes 1x2, 2x1 pinned and 2x1 unpinned under the same load.
Writes results/bench/qoe.{json,md} and one timeline plot per run (results/bench/qoe/).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from results.atomic import write_atomically

OUT_DIR = Path("results/bench")
WORK = OUT_DIR / "work" / "qoe"
MODELS = {"mlp": ("zoo:mlp", 64), "bert_ffn": ("zoo:bert_ffn", 1)}  # model, items per request
LAYOUT = ["mlp", "bert_ffn", "mlp", "bert_ffn", "mlp", "bert_ffn"]
# target = factor x the model's fastest latency alone (one container, the whole machine). Six
# single-threaded containers on two cores, with the load clients on the same cores, answer in about
# 4x that under default Docker (each gets ~0.27 cores). The factors are a realistic mix, fixed so every
# arm and the rerun see the same targets: one unachievable (0.8), two that need a little more than a
# fair share (3.0, 3.4), one at about the fair share (4.0), two that need less (5.0, 6.0).
TARGET_FACTORS = [0.8, 3.0, 3.4, 4.0, 5.0, 6.0]
DURATIONS = {"burst": 200.0, "fixed": 220.0, "random": 220.0}
ARMS = {"default": ("none", "fixed"), "static": ("static", "fixed"), "dqoes": ("dqoes", "adaptive"),
        "dqoes_fixed": ("dqoes", "fixed")}
TARGETS = {"satisfied_ratio_vs_default": 2.0, "converge_iterations": 10, "adaptive_fewer_adjustments": 0.5}


def prepare_artifacts() -> dict[str, Path]:
    """Tune each model briefly (once; later runs reuse the artifacts): serving needs real, verified artifacts."""
    from autotune.config import TuneConfig
    from autotune.pipeline import tune_model
    from autotune.progress import SilentProgress

    paths = {}
    for name, (model, batch) in MODELS.items():
        out = WORK / "artifacts" / name
        if not (out / "artifact" / "manifest.json").is_file():
            print(f"[qoe] tuning {model} (batch {batch}) ...", file=sys.stderr, flush=True)
            tune_model(TuneConfig(model=model, out_dir=out, trials=32, batch_sizes=(batch,), round_size=8, threads=1,
                                  profile_seconds=0.5), SilentProgress())
        paths[name] = out / "artifact"
    return paths


def fastest_alone(backend: Any, artifacts: dict[str, Path]) -> dict[str, float]:
    """Each model's mean server time alone on the machine, no limit: the fastest a target can be met."""
    from containers.backends.base import ContainerSpec
    from containers.load import LoadClient
    from containers.qoe.run import request_inputs

    fastest = {}
    for i, (name, path) in enumerate(artifacts.items()):
        spec = ContainerSpec(f"alone-{name}", path, 18490 + i)
        backend.start(spec)
        try:
            inputs = request_inputs(path, MODELS[name][1])
            LoadClient([spec.url], inputs).run_for(3.0)
            records = LoadClient([spec.url], inputs).run_for(10.0)
        finally:
            backend.stop(spec.name)
        fastest[name] = float(np.mean([r.server_ms for r in records if r.ok]))
    return fastest


def targets_ms(fastest: dict[str, float]) -> dict[str, float]:
    """Each container's QoE target (ms, by container name): a factor of its model's fastest time alone."""
    return {f"{model}-{i}": round(TARGET_FACTORS[i] * fastest[model], 2) for i, model in enumerate(LAYOUT)}


def scenario_for(schedule: str, arm: str, artifacts: dict[str, Path], fastest: dict[str, float],
                 duration_s: float | None = None) -> Any:
    from containers.scenario import ContainerPlan, Scenario, Schedule

    policy, listener = ARMS[arm]
    plans = tuple(ContainerPlan(name, artifacts[model], target, batch=MODELS[model][1])
                  for (name, target), model in zip(targets_ms(fastest).items(), LAYOUT))
    return Scenario(f"{schedule}-{arm}", duration_s or DURATIONS[schedule], plans, backend="docker", policy=policy, listener=listener,
                    schedule=Schedule(schedule, interval_s=10.0, window_s=60.0, seed=7))


def run_arm(backend: Any, scenario: Any, runs_dir: Path) -> dict[str, Any]:
    from containers.qoe.run import run_scenario

    run_dir = runs_dir / scenario.name
    shutil.rmtree(run_dir, ignore_errors=True)
    print(f"[qoe] {scenario.name} ({scenario.duration_s:.0f} s) ...", file=sys.stderr, flush=True)
    record = run_scenario(scenario, run_dir, backend=backend)
    if record["interrupted"]:  # a run cut short is no row of the table: the benchmark stops with it
        raise KeyboardInterrupt
    return row_from_record(record, runs_dir)


def row_from_record(record: dict[str, Any], runs_dir: Path) -> dict[str, Any]:
    """The figures the issue asks for, from one run's ``qoe.json`` (so tables can be rebuilt from records)."""
    from containers.qoe.run import late_mean, satisfied_by_window, summarize

    scenario = record["scenario"]
    name = scenario["name"]
    plots = OUT_DIR / "qoe"
    plots.mkdir(parents=True, exist_ok=True)
    tag = "" if runs_dir.name == "runs" else f"-rerun{runs_dir.name}"
    shutil.copy(runs_dir / name / "timeline.png", plots / f"{name}{tag}.png")
    last_join = max(record["joined_at"].values())
    s = summarize(record["timeline"], last_join, record["wall_s"])
    targets = {c["name"]: c["target_ms"] for c in scenario["containers"]}
    satisfied = satisfied_by_window(record["windows"], targets, scenario["alpha"])
    requests = record["requests"]
    return {
        "satisfied_late_mean": late_mean(satisfied, last_join, record["wall_s"]),
        "satisfied_by_window": satisfied,
        "satisfied_at_iterations": [[t["t"], t["counts"]["S"]] for t in record["timeline"] if t["counts"]],
        "converged_after_iterations": s["converged_after_iterations"], "converged_at_s": s.get("converged_at_s"),
        "last_join_s": round(last_join, 1), "quality_sums_final": s.get("quality_sums_final"),
        "iterations": record["status"]["iterations"], "limit_changes": record["status"]["limit_changes"],
        "iterations_after_converged_per_min": s.get("iterations_after_converged_per_min"),
        "manager_cpu_s": record["status"]["manager_cpu_s"], "manager_cpu_share": record["status"]["manager_cpu_share"],
        "requests_sent": sum(r["sent"] for r in requests.values()),
        "requests_failed": sum(r["failed"] for r in requests.values()),
        "final_table": record["status"]["containers"], "plot": f"qoe/{name}{tag}.png",
    }


def schemes(backend: Any, artifacts: dict[str, Path]) -> list[dict[str, Any]]:
    from containers.deploy import Scheme, compare_schemes
    from containers.qoe.run import request_inputs

    inputs = request_inputs(artifacts["mlp"], MODELS["mlp"][1])
    return compare_schemes(backend, artifacts["mlp"], [Scheme.parse(s, 2) for s in ("1x2", "2x1", "2x1u")], inputs,
                           duration_s=30.0, concurrency=4)


def verdict(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets, from the burst runs."""
    default, dqoes, fixed = (runs.get(f"burst-{a}") for a in ("default", "dqoes", "dqoes_fixed"))
    out: dict[str, Any] = {}
    if default and dqoes:
        d, q = default["satisfied_late_mean"], dqoes["satisfied_late_mean"]
        out["satisfied"] = {"default": d, "dqoes": q}
        out["satisfied_ratio_vs_default"] = round(q / d, 2) if d else None
        iterations = [r["converged_after_iterations"] for k, r in runs.items() if "dqoes" in k]
        out["converge_iterations"] = None if None in iterations else max(iterations)  # None: a run never converged
    if dqoes and fixed:
        a, f = dqoes["iterations_after_converged_per_min"], fixed["iterations_after_converged_per_min"]
        out["adaptive_fewer_adjustments"] = round(1 - a / f, 3) if f else None
        out["adaptive_keeps_satisfied"] = dqoes["satisfied_late_mean"] >= fixed["satisfied_late_mean"] - 0.25
    met = []
    if (out.get("satisfied_ratio_vs_default") or 0) >= TARGETS["satisfied_ratio_vs_default"]:
        met.append("satisfied_ratio_vs_default")
    if out.get("converge_iterations") is not None and out["converge_iterations"] <= TARGETS["converge_iterations"]:
        met.append("converge_iterations")
    if (out.get("adaptive_fewer_adjustments") or 0) >= TARGETS["adaptive_fewer_adjustments"] and out.get(
            "adaptive_keeps_satisfied"):
        met.append("adaptive_fewer_adjustments")
    out["targets_met"] = met
    return out


def write_markdown(report: dict[str, Any], path: Path) -> None:
    lines = [f"# QoE benchmark (DQoES), {report['machine']['cpus']} cores, Docker {report['machine']['docker']}", ""]
    for block in [report, *report.get("reruns", [])]:  # each run sets its targets from its own fastest times
        lines.append(f"{'Rerun' if block is not report else 'First run'}: fastest mean server time alone "
                     + ", ".join(f"{k} {v:.2f} ms" for k, v in block["fastest_ms"].items()) + "; targets (ms) "
                     + ", ".join(f"{k} {v}" for k, v in targets_ms(block["fastest_ms"]).items()) + ".")
    lines += ["",
             "| run | satisfied (2nd half, mean) | converged after (iterations) | iterations | limit changes "
             "| iterations/min once converged | manager CPU | requests (failed) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for block in [report, *report.get("reruns", [])]:
        tag = " (rerun)" if block is not report else ""
        for name, r in block["runs"].items():
            lines.append(f"| {name}{tag} | {r['satisfied_late_mean']} of 6 | "
                         f"{r['converged_after_iterations']} | {r['iterations']} | {r['limit_changes']} | "
                         f"{r['iterations_after_converged_per_min']} | {r['manager_cpu_share']:.2%} | "
                         f"{r['requests_sent']} ({r['requests_failed']}) |")
    lines += ["", "| verdict | ratio vs default | converge iterations | fewer adjustments (adaptive vs fixed) | targets met |",
              "| --- | ---: | ---: | ---: | --- |"]
    for block in [report, *report.get("reruns", [])]:
        v = block["verdict"]
        lines.append(f"| {'rerun' if block is not report else 'first run'} | {v.get('satisfied_ratio_vs_default')} | "
                     f"{v.get('converge_iterations')} | {v.get('adaptive_fewer_adjustments')} | "
                     f"{', '.join(v['targets_met']) or 'none'} |")
    if report.get("schemes"):
        lines += ["", "Deployment schemes (zoo:mlp, 64 items per request, 4 closed-loop clients, 30 s each):", "",
                  "| scheme | pinned | items/s | p50 ms | p99 ms | requests (failed) |", "| --- | --- | ---: | ---: | ---: | ---: |"]
        for r in report["schemes"]:
            lines.append(f"| {r['scheme']} | {'yes' if r['pinned'] else 'no'} | {r['throughput_per_s']:,.0f} | {r['p50_ms']} "
                         f"| {r['p99_ms']} | {r['requests']} ({r['failed']}) |")
    lines += ["", "Satisfied: containers in S (mean server time of the requests served in a 5 s window within alpha = 10% "
              "of the target), averaged over the windows of the second half of the time after the last arrival; the same "
              "yardstick for every arm. Converged: manager iterations after the last arrival until the count of S at its "
              "iterations reached, for good, the lowest count of the run's last quarter. Iterations/min once converged: "
              "how often the manager observed and ran Algorithm 1 after that. Timelines: results/bench/qoe/*.png."]
    write_atomically(path, "\n".join(lines) + "\n")


def rebuild(report: dict[str, Any]) -> None:
    """Recompute every block's rows and verdict from its runs' records (first run: runs/, reruns: reruns/N/)."""
    for i, block in enumerate([report, *report.get("reruns", [])]):
        runs_dir = WORK / "runs" if i == 0 else WORK / "reruns" / str(i)
        records = {name: json.loads((runs_dir / name / "qoe.json").read_text())
                   for name in block["runs"] if (runs_dir / name / "qoe.json").is_file()}
        block["runs"] = {name: row_from_record(record, runs_dir) for name, record in records.items()
                         if not record.get("interrupted")}
        block["verdict"] = verdict(block["runs"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", default="burst,fixed,random")
    parser.add_argument("--rerun", action="store_true", help="keep the recorded results and add this run as a rerun")
    parser.add_argument("--from-records", action="store_true", help="rebuild the tables from the runs' records only")
    parser.add_argument("--no-schemes", action="store_true")
    parser.add_argument("--duration", type=float, help="seconds per run (default: per schedule, 200-220)")
    args = parser.parse_args()
    path = OUT_DIR / "qoe.json"
    report = json.loads(path.read_text()) if (args.rerun or args.from_records) and path.exists() else None
    if not args.from_records:
        runs_dir = WORK / "reruns" / str(len(report.get("reruns", [])) + 1) if report else WORK / "runs"
        block, docker_version = measure(args, runs_dir)
        if report is None:
            fastest = block["fastest_ms"]
            report = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "docker": docker_version},
                      "targets": TARGETS, "targets_ms": targets_ms(fastest), **block}
        else:
            report.setdefault("reruns", []).append(block)
        report["recorded_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
    rebuild(report)
    write_atomically(path, json.dumps(report, indent=2))
    write_markdown(report, OUT_DIR / "qoe.md")
    print(json.dumps([b["verdict"] for b in [report, *report.get("reruns", [])]], indent=2))


def measure(args: argparse.Namespace, runs_dir: Path) -> tuple[dict[str, Any], str]:
    """Every arm of every schedule, then the deployment schemes, on a Docker engine."""
    from containers.backends.docker import DockerBackend
    from containers.backends.engine import ensure_engine

    artifacts = prepare_artifacts()
    with ensure_engine(WORK / "dockerd.log") as client:
        backend = DockerBackend(client)
        try:
            fastest = fastest_alone(backend, artifacts)
            print(f"[qoe] fastest alone: {fastest}", file=sys.stderr, flush=True)
            runs = {}
            for schedule in args.schedules.split(","):
                for arm in ARMS:
                    if arm == "dqoes_fixed" and schedule != "burst":
                        continue
                    scenario = scenario_for(schedule, arm, artifacts, fastest, args.duration)
                    runs[scenario.name] = run_arm(backend, scenario, runs_dir)
            block = {"fastest_ms": fastest, "runs": runs, "verdict": verdict(runs),
                     "schemes": None if args.no_schemes else schemes(backend, artifacts)}
        finally:
            backend.close()
        return block, client.version().get("Version")


if __name__ == "__main__":
    main()

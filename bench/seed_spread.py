"""Seed spread: the engine alone against itself on other search seeds (an A/A run).

    python -m bench.seed_spread [--workload matmul512] [--seeds 100,101,102,103,104] [--trials N] [--resume]
    python -m bench.seed_spread --resummarize   # tables again from the recorded runs

The Trimmer benchmark holds engine + Trimmer to a final latency within 2% of the engine
alone, run by run. Two searches of one kernel differ by their luck as well as their policy,
and a paired run shares only the seed: the filter changes what is measured from the first
filtered round on. This runs the same engine arm (no filter, no preemption), at the
Trimmer benchmark's budget, on several seeds, each in its own process, re-times every
run's best side by side in turns (``bench.remeasure``), and reports the latency ratio of
every ordered pair of seeds, as the Trimmer benchmark reports trimmer over engine: the
share of pairs within 2% is how often an arm that *is* the engine meets that target.
Results in results/bench/seed_spread.{json,md}; each run's result is saved in its work
folder, and ``--resume`` keeps the runs the same command finished.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.remeasure import BLOCK, ratio_interval
from bench.trimmer import BUDGETS, OUT_DIR, TARGETS, _us, arm_command, pooled_runs, run_arm
from bench.tuning import _run_json
from results.atomic import write_atomically

STEM = "seed_spread"


def spread(name: str, seeds: list[int], work_root: Path, target: str, resume: bool,
           trials: int | None = None) -> dict[str, Any]:
    """Run the engine arm on each of ``seeds``, re-time their bests side by side, and compare every pair."""
    trials = trials or BUDGETS[name][0]
    dirs = {str(seed): work_root / name / f"engine-seed{seed}" for seed in seeds}
    runs = {s: run_arm(d, arm_command(name, "engine", work_root, d, trials, target, int(s)), resume)
            for s, d in dirs.items()}
    retimed, failure = _run_json(["bench.remeasure", "--target", target, name,
                                  *(f"{s}={dirs[s] / 'ranked'}" for s, r in runs.items() if "failure" not in r)], None)
    if not retimed:
        raise SystemExit(f"re-timing failed: {failure}")
    turns = {s: t for s, t in retimed["turns"].items() if t}
    return {"description": f"{name}, engine alone, {trials} trials, rounds of {BUDGETS[name][1]}",
            "date": time.strftime("%Y-%m-%d"),
            "trials": trials, "seeds": seeds, "retiming_turns": len(next(iter(turns.values()), [])),
            "runs": {s: {"final_latency_s": retimed["median"].get(s), "wall_s": r.get("wall_s"),
                         "logged_best_s": (r.get("curve") or [[None, None]])[-1][1],
                         "failure": r.get("failure")} for s, r in runs.items()},
            **compare_pairs(turns)}


def compare_pairs(turns: dict[str, list[list[float]]]) -> dict[str, Any]:
    """Every ordered pair of runs: the ratio of their median re-timings, its 95% interval, and how many pairs
    keep within the Trimmer's latency target (an A/A run's rate of meeting it)."""
    median = {s: float(np.median(t)) for s, t in turns.items()}
    pairs = []
    for a, b in itertools.permutations(sorted(turns, key=int), 2):
        lo, hi = ratio_interval(turns[a], turns[b], block=BLOCK)
        pairs.append({"seed": int(a), "against": int(b), "latency_ratio": round(median[a] / median[b], 4),
                      "interval": [round(lo, 4), round(hi, 4)]})
    ratios = sorted(p["latency_ratio"] for p in pairs)
    if not ratios:
        raise SystemExit("fewer than two runs left a record to re-time; nothing to compare")
    within = sum(r <= TARGETS["latency_ratio"] for r in ratios)
    return {"pairs": pairs, "summary": {"pairs": len(pairs), "within_target": within,
                                        "share_within_target": round(within / len(ratios), 3),
                                        "median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1]}}


def trimmer_pairs(name: str) -> list[float]:
    """The latency ratios of the Trimmer benchmark's paired runs of ``name`` under the budget and rule it ran most
    often (a trial of another rule on a few seeds is not the sample to set beside), to set beside."""
    path = OUT_DIR / "trimmer.json"
    report = json.loads(path.read_text()) if path.exists() else {"workloads": {}}
    groups = [runs for (workload, _), runs in pooled_runs(report).items() if workload == name]
    largest = max(groups, key=len, default=[])
    return sorted(w["trimmer_vs_engine"]["latency_ratio"] for w in largest)


def write_tables(report: dict[str, Any]) -> None:
    write_atomically(OUT_DIR / f"{STEM}.json", json.dumps(report, indent=2))
    limit = TARGETS["latency_ratio"]
    lines = [f"# Seed spread: the engine against itself ({report['machine']})", ""]
    for name, w in report["workloads"].items():
        s = w["summary"]
        lines += [f"## {w['description']} ({w.get('date', report['date'])})", "",
                  "| seed | final latency (us, re-timed) | logged best (us) | wall (s) |",
                  "| ---: | ---: | ---: | ---: |"]
        for seed, r in w["runs"].items():
            lines.append(f"| {seed} | {_us(r['final_latency_s'])} | {_us(r['logged_best_s'])} | "
                         f"{'-' if r['wall_s'] is None else round(r['wall_s'])} |")
        lines += ["", f"Every ordered pair of seeds (seed / against), re-timed side by side over {w['retiming_turns']} "
                  f"turns: {s['within_target']} of {s['pairs']} within {limit} "
                  f"({s['share_within_target']:.0%}); median {s['median']:.3f}, range {s['min']:.3f}-{s['max']:.3f}.",
                  "", "| seed / against | latency ratio (95% re-timing interval) |", "| --- | ---: |"]
        lines += [f"| {p['seed']} / {p['against']} | {p['latency_ratio']:.3f} ({p['interval'][0]:.3f}-"
                  f"{p['interval'][1]:.3f}) |" for p in w["pairs"] if p["seed"] < p["against"]]
        lines.append("")
        lines.append("(The reverse pairs are the reciprocals; the share within the target counts both orders.)")
        trimmed = trimmer_pairs(name)
        if trimmed:
            within = sum(r <= limit for r in trimmed)
            lines += ["", "Beside it, engine + Trimmer against the engine on one seed (results/bench/trimmer.json, "
                      f"the paired runs under the rule it ran most): {within} of {len(trimmed)} within {limit} "
                      f"({within / len(trimmed):.0%}); "
                      f"median {statistics.median(trimmed):.3f}, range {trimmed[0]:.3f}-{trimmed[-1]:.3f}.", ""]
    write_atomically(OUT_DIR / f"{STEM}.md", "\n".join(lines).rstrip() + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="matmul512")
    parser.add_argument("--seeds", default="100,101,102,103,104", help="comma-separated search seeds, two or more")
    parser.add_argument("--work-root", type=Path, default=Path("results/bench/work/seed_spread"))
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--trials", type=int, help="override the workload's budget (the Trimmer benchmark's)")
    parser.add_argument("--resume", action="store_true", help="keep the runs an earlier run of this command finished")
    parser.add_argument("--resummarize", action="store_true",
                        help="run nothing: rewrite the tables from the recorded runs and today's trimmer.json")
    args = parser.parse_args()
    path = OUT_DIR / f"{STEM}.json"
    if args.resummarize:
        write_tables(json.loads(path.read_text()))
        print((OUT_DIR / f"{STEM}.md").read_text())
        return
    if args.workload not in BUDGETS:
        raise SystemExit(f"unknown workload {args.workload!r}; expected one of {', '.join(BUDGETS)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise SystemExit(f"--seeds must be comma-separated integers; got {args.seeds!r}") from None
    if len(set(seeds)) < 2 or min(seeds) < 1:
        raise SystemExit(f"--seeds needs two or more distinct seeds >= 1; got {args.seeds!r}")
    from autotune.target import host_cores

    report = json.loads(path.read_text()) if path.exists() else {"workloads": {}}
    report.update({"machine": f"{platform.processor() or platform.machine()}, {host_cores()} cores",
                   "date": time.strftime("%Y-%m-%d")})
    report["workloads"][args.workload] = spread(args.workload, seeds, args.work_root / args.target, args.target,
                                                args.resume, args.trials)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    write_tables(report)
    print((OUT_DIR / f"{STEM}.md").read_text())


if __name__ == "__main__":
    main()

"""Tuning benchmark: stock MetaSchedule and autotune side by side, same workloads, same budget.

    python -m bench.tuning [--trials 64] [--stock-cap-s 300] [--workloads matmul512,conv3x3_resnet18,mlp]

Arms, each in its own process, one after another on the same machine:
  stock              tune_tir / tune_relax with default builder and runner, as a new user runs them
                     (capped at --stock-cap-s: on a machine with torch installed every default build
                     worker spends ~95 s importing TVM's tensor intrinsics, past the 30 s build timeout)
  stock_fast_import  the same, with only that import fixed (LocalBuilder initializer)
  autotune           our session: every task gets trials, one build call per round
Both final bests are then re-measured in isolation. Writes results/bench/tuning.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.workloads import WORKLOADS

ARMS = ("stock", "stock_fast_import", "autotune")
OUT_DIR = Path("results/bench")


def _run_json(args: list[str], timeout_s: float | None) -> tuple[dict[str, Any] | None, str]:
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        return None, f"no result within {time.monotonic() - started:.0f} s (killed)"
    if proc.returncode != 0:
        return None, (err.strip().splitlines() or ["exit %d" % proc.returncode])[-1]
    return json.loads(out.strip().splitlines()[-1]), ""


def _time_to_reach(curve: list[list[float]], target_s: float) -> float | None:
    return next((t for t, best in curve if best <= target_s), None)


def bench_workload(name: str, trials: int, stock_cap_s: float, work_root: Path) -> dict[str, Any]:
    arms: dict[str, Any] = {}
    for arm in ARMS:
        work_dir = work_root / name / arm
        shutil.rmtree(work_dir, ignore_errors=True)
        work_dir.mkdir(parents=True)
        print(f"[{name}] {arm} ...", file=sys.stderr, flush=True)
        cap = stock_cap_s if arm == "stock" else None
        result, failure = _run_json(["bench.arms", arm, name, str(trials), str(work_dir)], cap)
        if result is None:
            result = {"wall_s": stock_cap_s if cap else None, "valid_trials": 0, "best_logged_s": None,
                      "failure": failure}
        iso, failure = _run_json(["bench.remeasure", name, str(work_dir)], None)
        result["best_isolated_s"] = iso["isolated_s"] if iso else None
        arms[arm] = result
        print(f"[{name}] {arm}: {json.dumps({k: v for k, v in result.items() if k != 'curve'})}", file=sys.stderr)
    ours = arms["autotune"]
    for base in ("stock", "stock_fast_import"):
        ours[f"speedup_vs_{base}"] = _speedup(WORKLOADS[name].kind, arms[base], ours)
    return {"description": WORKLOADS[name].description, "kind": WORKLOADS[name].kind, "arms": arms}


def _speedup(kind: str, base: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """Base wall time over ours to reach base's final best.

    Kernels: base's best logged latency against our best-so-far. Models: base's compiled
    model latency against our estimated model latency (sum of weight x task best).
    A capped base (killed at its time limit) makes the ratio a lower bound.
    """
    goal = base.get("best_isolated_s") if kind == "model" else base.get("best_logged_s")
    if goal is None:
        return {"ratio": None, "note": "the stock arm produced no valid candidate: " + base.get("failure", "")}
    reach = _time_to_reach(ours.get("curve", []), goal)
    reached = reach is not None
    ratio = base["wall_s"] / (reach if reached else ours["wall_s"])
    latency = None
    if base.get("best_isolated_s") and ours.get("best_isolated_s"):
        latency = ours["best_isolated_s"] / base["best_isolated_s"]
    return {"ratio": round(ratio, 2), "reached_base_best": reached, "latency_ours_over_base": latency,
            "base_capped": bool(base.get("failure"))}


def write_tables(report: dict[str, Any]) -> None:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "tuning.json").write_text(json.dumps(report, indent=2))
    lines = [f"# Tuning benchmark ({report['trials']} trials per workload, {report['machine']})", "",
             "| workload | arm | wall (s) | valid trials | best logged (us) | best isolated (us) | speedup_vs_stock | speedup_vs_stock_fast_import |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, w in report["workloads"].items():
        for arm, r in w["arms"].items():
            us = lambda v: "-" if v is None else f"{v * 1e6:.1f}"  # noqa: E731
            sp = [r.get(f"speedup_vs_{b}", {}) for b in ("stock", "stock_fast_import")]
            sp_txt = ["-" if not s else ("n/a" if s.get("ratio") is None else f"{s['ratio']:.2f}x") for s in sp]
            wall = "-" if r["wall_s"] is None else f"{r['wall_s']:.0f}" + (" (cap)" if r.get("failure") else "")
            lines.append(f"| {name} | {arm} | {wall} | {r['valid_trials']} | {us(r['best_logged_s'])} | "
                         f"{us(r['best_isolated_s'])} | {sp_txt[0]} | {sp_txt[1]} |")
    lines += ["", "speedup = stock wall time / autotune's time to reach stock's final best (kernels: best logged "
              "latency; model: stock's compiled-model latency, against autotune's estimated model latency, "
              "the sum of weight x task best). The model's best columns are compiled-model latencies. "
              "A capped stock run makes its ratio a lower bound."]
    failures = {n: w["arms"]["stock"]["failure"] for n, w in report["workloads"].items() if w["arms"]["stock"].get("failure")}
    if failures:
        lines += ["", "Stock with defaults: " + "; ".join(f"{n}: {f}" for n, f in failures.items())]
    (OUT_DIR / "tuning.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--stock-cap-s", type=float, default=300.0)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--work-root", type=Path, default=Path("results/bench/work"))
    args = parser.parse_args()
    import torch
    import tvm

    from autotune.target import host_cores

    report = {
        "trials": args.trials,
        "machine": f"{platform.processor() or platform.machine()}, {host_cores()} cores",
        "versions": {"tvm": tvm.__version__, "torch": torch.__version__},
        "date": time.strftime("%Y-%m-%d"),
        "workloads": {n: bench_workload(n, args.trials, args.stock_cap_s, args.work_root) for n in args.workloads.split(",")},
    }
    write_tables(report)
    print((OUT_DIR / "tuning.md").read_text())


if __name__ == "__main__":
    main()

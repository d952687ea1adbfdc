"""Tuning benchmark: stock MetaSchedule and autotune side by side, same workloads, same budget.

    python -m bench.tuning [--trials 64] [--stock-cap-s 240] [--workloads matmul512,conv3x3_resnet18,mlp] [--resume]

Arms, each in its own process, one after another on the same machine:
  stock       tune_tir / tune_relax with default builder and runner, as a new user runs them
              (capped at --stock-cap-s: on a machine with torch installed every default build
              worker spends ~95 s importing TVM's tensor intrinsics, past the 30 s build timeout)
  warm_stock  the same with a persistent, fast-importing build pool: only measurement differs
  autotune    our session with the parallel engine (warm builds, pipelined adaptive timing,
              DoP control and verification, final isolated ranking)
The final bests are then re-measured side by side, in turns. Writes results/bench/tuning.{json,md}.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.workloads import WORKLOADS
from results.atomic import write_atomically

ARMS = ("stock", "warm_stock", "autotune")
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
REACH_TOLERANCE = 0.03  # "equal quality": within the 3% the issue allows for the final best
OUT_DIR = Path("results/bench")
ARM_RESULT = "arm.json"  # an arm's command and result, in its work folder (what --resume keeps)


def _die_with_parent() -> None:
    """Run in the arm's process before it starts: the kernel kills it when the benchmark dies, however it dies
    (an arm left running would tune on beside a resumed benchmark's new arm, in the folder it was given)."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _run_json(args: list[str], timeout_s: float | None) -> tuple[dict[str, Any] | None, str]:
    """Run ``python -m args`` in a session of its own; its last stdout line is its JSON result."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=_die_with_parent)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, f"no result within {time.monotonic() - started:.0f} s (killed)"
    except BaseException:  # Ctrl-C: the arm and its workers go with the benchmark
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if proc.returncode != 0:
        return None, (err.strip().splitlines() or ["exit %d" % proc.returncode])[-1]
    return json.loads(out.strip().splitlines()[-1]), ""


def saved_arm(work_dir: Path, command: list[str]) -> dict[str, Any] | None:
    """The result an earlier run of the same ``command`` left in ``work_dir``, or None."""
    try:
        saved = json.loads((work_dir / ARM_RESULT).read_text())
    except (OSError, ValueError):
        return None
    return saved["result"] if isinstance(saved, dict) and saved.get("command") == command else None


def run_arm(work_dir: Path, command: list[str], resume: bool, timeout_s: float | None = None,
            saved: Callable[[Path, list[str]], dict[str, Any] | None] = saved_arm) -> dict[str, Any]:
    """Run one arm (``python -m command``) in its own process and save its result in ``work_dir``; ``resume``
    keeps the one ``saved`` (default: ``saved_arm``) finds there. Returns the arm's result, or {"failure": why}."""
    label = f"[{command[2]}] {work_dir.name}"
    kept = saved(work_dir, command) if resume else None
    if kept:
        print(f"{label}: kept from {work_dir / ARM_RESULT}", file=sys.stderr, flush=True)
        return kept
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    print(f"{label} ...", file=sys.stderr, flush=True)
    result, failure = _run_json(command, timeout_s)
    if result:
        write_atomically(work_dir / ARM_RESULT, json.dumps({"command": command, "result": result}))
    print(f"{label}: wall {(result or {}).get('wall_s')}", file=sys.stderr, flush=True)
    return result or {"failure": failure}


def _time_to_reach(curve: list[list[float]], goal_s: float) -> float | None:
    return next((t for t, best in curve if best <= goal_s * (1 + REACH_TOLERANCE)), None)


def bench_workload(name: str, trials: int, stock_cap_s: float, work_root: Path,
                   reuse: dict[str, Any] | None = None, resume: bool = False) -> dict[str, Any]:
    """Run the arms (or take ``reuse``'s results and work folders; ``resume``: keep arms a run of the same
    command finished), then re-time and compare."""
    arms: dict[str, Any] = {}
    for arm in ARMS:
        if reuse is not None:
            arms[arm] = {k: v for k, v in reuse["arms"][arm].items() if not k.startswith(("speedup", "best_isolated"))}
            continue
        cap = stock_cap_s if arm == "stock" else None
        work_dir = work_root / name / arm
        result = run_arm(work_dir, ["bench.arms", arm, name, str(trials), str(work_dir)], resume, cap)
        if "failure" in result:
            result = {"wall_s": stock_cap_s if cap else None, "valid_trials": 0, "best_logged_s": None, **result}
        arms[arm] = result
        print(f"[{name}] {arm}: {json.dumps({k: v for k, v in result.items() if k not in ('curve', 'engine')})}",
              file=sys.stderr)
    kind = WORKLOADS[name].kind
    ours = arms["autotune"]
    to_time = {arm: str(work_root / name / arm / ("ranked" if arm == "autotune" else "")) for arm in ARMS}
    improving = _improving_points(work_root / name / "autotune", ours.get("curve", [])) if kind == "kernel" else []
    to_time.update({f"autotune@{i}": f"{work_root / name / 'autotune'}@{i}" for _, i in improving})
    isolated, _ = _run_json(["bench.remeasure", name, *(f"{k}={v}" for k, v in to_time.items())], None)
    isolated = (isolated or {}).get("median", {})
    for arm in ARMS:
        arms[arm]["best_isolated_s"] = isolated.get(arm)
    if improving:  # our best-so-far over time, each point re-timed side by side with the stock arms' bests
        ours["curve_isolated"] = [(t, isolated[f"autotune@{i}"]) for t, i in improving
                                  if isolated.get(f"autotune@{i}") is not None]
    ours["speedup_vs_warm_stock"] = _speedup(kind, arms["warm_stock"], arms["warm_stock"], ours)
    ours["speedup_vs_stock"] = _speedup(kind, arms["stock"], arms["warm_stock"], ours)
    return {"description": WORKLOADS[name].description, "kind": kind, "arms": arms}


def _improving_points(work_dir: Path, curve: list[list[float]]) -> list[tuple[float, int]]:
    """(seconds since the arm's start, record index) of each candidate that improved our best, as logged.

    A single-task run commits its records in the order it logs them, so log line i is record i.
    """
    log = [json.loads(line) for line in (work_dir / "measurements.jsonl").read_text().splitlines()]
    valid = [(m["at"], i, m["latency_s"]) for i, m in enumerate(log) if m["latency_s"] is not None]
    if not valid or not curve:
        return []
    offset = min(valid)[0] - curve[0][0]
    points, best = [], float("inf")
    for at, i, latency in sorted(valid):
        if latency < best:
            best = latency
            points.append((at - offset, i))
    return points


def _speedup(kind: str, base: dict[str, Any], same_search: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """Base wall time over our time to reach base's final best, within REACH_TOLERANCE.

    Kernels: every candidate that improved our best is re-timed side by side with base's best,
    and we reach base's best when one of them is within the tolerance of it. Models: base's
    compiled-model latency against our estimated model latency (sum of weight x task best).
    A base that produced no valid candidate within its cap is given the best the same search
    reaches when its builds work (``same_search``, warm stock), and its cap as wall time: the
    ratio is then a lower bound.
    """
    produced = base.get("valid_trials", 0) > 0
    goal = (base if produced else same_search).get("best_isolated_s")
    if goal is None:
        return {"ratio": None, "note": "no stock arm produced a valid candidate"}
    reach = _time_to_reach(ours.get("curve_isolated") or ours.get("curve", []), goal)
    latency = ours["best_isolated_s"] / goal if ours.get("best_isolated_s") else None
    return {"ratio": round(base["wall_s"] / reach, 2) if reach else None, "reached_base_best": reach is not None,
            "time_to_reach_s": reach, "latency_ours_over_base": latency, "lower_bound": bool(base.get("failure"))}


def write_tables(report: dict[str, Any]) -> None:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    write_atomically(OUT_DIR / "tuning.json", json.dumps(report, indent=2))
    lines = [f"# Tuning benchmark ({report['trials']} trials per workload, {report['machine']})", "",
             "| workload | arm | wall (s) | valid trials | best logged (us) | best isolated (us) | speedup_vs_stock | speedup_vs_warm_stock | latency vs warm stock |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, w in report["workloads"].items():
        for arm, r in w["arms"].items():
            us = lambda v: "-" if v is None else f"{v * 1e6:.1f}"  # noqa: E731
            sp = [r.get(f"speedup_vs_{b}", {}) for b in ("stock", "warm_stock")]
            sp_txt = ["-" if not s else ("not reached" if s.get("ratio") is None else
                                         ("≥ " if s.get("lower_bound") else "") + f"{s['ratio']:.2f}x") for s in sp]
            lat = sp[1].get("latency_ours_over_base") if sp[1] else None
            wall = "-" if r["wall_s"] is None else f"{r['wall_s']:.0f}" + (" (cap)" if r.get("failure") else "")
            lines.append(f"| {name} | {arm} | {wall} | {r['valid_trials']} | {us(r['best_logged_s'])} | "
                         f"{us(r['best_isolated_s'])} | {sp_txt[0]} | {sp_txt[1]} | "
                         f"{'-' if lat is None else f'{lat:.3f}'} |")
    lines += ["", "speedup = the stock arm's wall time / autotune's time to reach that arm's final best, re-measured "
              "in isolation, within 3% (kernels: each candidate that improved autotune's best is re-timed side by "
              "side with the stock arm's best; model: against autotune's estimated model latency, the sum of "
              "weight x task best). The model's best columns are compiled-model "
              "latencies. latency vs warm stock = autotune's final best / warm stock's, timed side by side in turns."]
    failures = {n: w["arms"]["stock"]["failure"] for n, w in report["workloads"].items() if w["arms"]["stock"].get("failure")}
    if failures:
        lines += ["", "Where stock with defaults produced no valid candidate, its goal is warm stock's best (the same "
                  "search with working builds) and its cap is its wall time: a lower bound (≥). Stock with defaults: "
                  + "; ".join(f"{n}: {f}" for n, f in failures.items())]
    else:
        lines += ["", "Stock with defaults produced valid candidates on every workload in this run."]
    write_atomically(OUT_DIR / "tuning.md", "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--stock-cap-s", type=float, default=240.0)
    parser.add_argument("--workloads", default="matmul512,conv3x3_resnet18,mlp")
    parser.add_argument("--work-root", type=Path, default=Path("results/bench/work"))
    parser.add_argument("--reanalyze", action="store_true",
                        help="re-time and compare the last run's arms (results/bench/tuning.json) without re-running them")
    parser.add_argument("--resume", action="store_true",
                        help=f"keep each arm an earlier run of the same command finished (its work folder's {ARM_RESULT}): "
                             "a killed benchmark goes on from the arm it was in")
    args = parser.parse_args()
    if args.reanalyze:
        report = json.loads((OUT_DIR / "tuning.json").read_text())
        report["workloads"] = {n: bench_workload(n, report["trials"], args.stock_cap_s, args.work_root, w)
                               for n, w in report["workloads"].items()}
        write_tables(report)
        print((OUT_DIR / "tuning.md").read_text())
        return
    import torch
    import tvm

    from autotune.target import host_cores

    from autotune.calibrate import run_calibration

    print("calibrating the engine on this machine (once per machine; later runs read the saved curve) ...",
          file=sys.stderr, flush=True)
    started = time.monotonic()
    calibration, _ = run_calibration("matmul512", 16, None, "cpu", None, None, None, 0)
    calibration["wall_s"] = time.monotonic() - started
    report = {
        "calibration": {k: calibration[k] for k in ("chosen_level", "curve", "wall_s")},
        "trials": args.trials,
        "machine": f"{platform.processor() or platform.machine()}, {host_cores()} cores",
        "versions": {"tvm": tvm.__version__, "torch": torch.__version__},
        "date": time.strftime("%Y-%m-%d"),
        "workloads": {n: bench_workload(n, args.trials, args.stock_cap_s, args.work_root, resume=args.resume)
                      for n in args.workloads.split(",")},
    }
    write_tables(report)
    print((OUT_DIR / "tuning.md").read_text())


if __name__ == "__main__":
    main()

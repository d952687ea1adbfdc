"""Degree-of-parallelism benchmark: throughput and error per level, the chosen level marked.

    python -m bench.dop [--candidates 24]

Runs the engine's calibration (the same candidates alone, then at every level) with
one-thread candidates (a slot per core: parallel timing possible) and with
all-core candidates (one slot). Writes results/bench/dop.{json,md}; the levels the
controller chose in the tuning benchmark are added when results/bench/tuning.json exists.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from results.atomic import write_atomically

OUT_DIR = Path("results/bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", type=int, default=24)
    parser.add_argument("--kernel", default="matmul512")
    args = parser.parse_args()
    from autotune.calibrate import run_calibration
    from autotune.target import host_cores

    configs = sorted({1, host_cores()})
    curves = {}
    with tempfile.TemporaryDirectory() as tmp:
        for threads in configs:
            result, _ = run_calibration(args.kernel, args.candidates, None, "cpu", threads, None,
                                        Path(tmp) / f"t{threads}.json", 0)
            curves[f"threads={threads}"] = result
    tuning_path = OUT_DIR / "tuning.json"
    chosen_in_tuning = {}
    if tuning_path.exists():
        tuning = json.loads(tuning_path.read_text())
        for name, w in tuning["workloads"].items():
            engine = w["arms"]["autotune"].get("engine") or {}
            chosen_in_tuning[name] = [h["level"] for h in engine.get("dop_history", [])]
    report = {"kernel": args.kernel, "date": time.strftime("%Y-%m-%d"), "error_bound": 0.05, "curves": curves,
              "levels_used_in_tuning_benchmark": chosen_in_tuning}
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    write_atomically(OUT_DIR / "dop.json", json.dumps(report, indent=2))
    lines = [f"# Degree of parallelism ({args.kernel}, {args.candidates} candidates per level)", "",
             "| candidates built for | level | measured at once | builds meanwhile | candidates/s | mean error | median error | p90 error | timed again (busy) |",
             "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, c in curves.items():
        for p in c["curve"]:
            pct = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
            mark = " (chosen)" if p["level"] == c["chosen_level"] else ""
            lines.append(f"| {name} | {p['level']}{mark} | {p['concurrency']} | "
                         f"{'idle priority' if p['overlap_builds'] else 'paused'} | {p['candidates_per_s']:.2f} | "
                         f"{pct(p['error'])} | {pct(p['median_error'])} | {pct(p['p90_error'])} | {p['timed_again_busy']} |")
    lines += ["", "Error: |value at this level - isolated value| / isolated value over the same candidates. "
              "The chosen level is the highest whose mean error is within 5% (the statistic the controller bounds "
              "in tuning); the controller starts there. "
              "Timed again (busy): timings repeated because the probe kernel, timed around each, ran more than "
              "8% slower than its fastest (a neighbour on the host; probed at level 0 only, where nothing of ours runs "
              "beside the candidate)."]
    if chosen_in_tuning:
        lines += ["", "Levels the controller used, round by round, in the tuning benchmark: "
                  + "; ".join(f"{k}: {v}" for k, v in chosen_in_tuning.items())]
    write_atomically(OUT_DIR / "dop.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

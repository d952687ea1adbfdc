"""Replay preemption rules on a finished search: where each would have stopped, what it saves and loses.

    python -m bench.replay_preemption WORK_DIR WORKLOAD [--round-size 8]
                                      [--task-patience 96,192] [--min-task-trials 32]
                                      [--model-window 128] [--min-improvement 0.01]
                                      [--patience-share 0.25]

WORK_DIR is a run of the engine alone (the Trimmer benchmark's engine arm): it measured every
proposal and logged each in order. Its rounds are fed, as the session would feed them, to
the real policy (``cost_models.preemption``) once per combination of the rules' settings.
For each combination: the tasks it stops, the share of the run's measurements it keeps,
and the estimated model latency (sum of weight x task best) at the stops, against the
run's own. One whole-model arm takes an hour; a replay takes seconds, so the rules are
chosen on the searches they will stop.

What a replay cannot show: the trials a stopped task hands to the tasks still searching
(the log ends where their budgets did), and the candidate filter. So its latency is what
the rule alone gives up, before those trials buy some of it back.
"""

from __future__ import annotations

import argparse
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.search import DIRECTED
from cost_models.preemption import PlateauPreemption, TaskRound


@dataclass
class Replay:
    settings: dict[str, float]
    kept: int  # measurements made before the stops
    of: int
    latency_s: float  # estimated model latency at the stops
    full_latency_s: float  # the run's own
    stopped: dict[str, int]  # task -> proposals it had when stopped
    job_stopped_at: int | None  # the round the job stopped in


def replay(log: list[dict[str, Any]], weights: dict[str, int], round_size: int, policy: PlateauPreemption,
           settings: dict[str, float]) -> Replay:
    """Feed ``log``'s rounds (each task's measurements in chunks of ``round_size``) to ``policy``."""
    chunks: dict[str, list[list[dict[str, Any]]]] = {}
    for task in weights:
        mine = [m for m in log if m["task"] == task]
        chunks[task] = [mine[i:i + round_size] for i in range(0, len(mine), round_size)]
    best = {task: math.inf for task in weights}
    proposed = dict.fromkeys(weights, 0)
    budget = {task: sum(map(len, c)) for task, c in chunks.items()}  # the engine arm uses its whole budget
    live, stopped, kept, job_round = set(weights), {}, 0, None
    for k in range(max(len(c) for c in chunks.values())):
        rounds = []
        for task in sorted(live):
            if k >= len(chunks[task]):
                continue
            chunk = chunks[task][k]
            before = best[task]
            best[task] = min([before, *(m["latency_s"] for m in chunk if m["latency_s"] is not None)])
            proposed[task] += len(chunk)
            kept += len(chunk)
            rounds.append(TaskRound(task, before, best[task], proposed[task], chunk[0]["proposed_by"] in DIRECTED,
                                    weights[task], budget[task]))
        if not rounds:
            break
        decision = policy.after_round(rounds, sum(weights[t] * b for t, b in best.items()))
        for task in decision.stop_tasks:
            stopped[task] = proposed[task]
            live.discard(task)
        if decision.stop_job:
            job_round = k
            break
    full = {task: min((m["latency_s"] for m in log if m["task"] == task and m["latency_s"] is not None),
                      default=math.inf) for task in weights}
    return Replay(settings, kept, len(log), sum(weights[t] * b for t, b in best.items()),
                  sum(weights[t] * b for t, b in full.items()), stopped, job_round)


def task_weights(workload: str) -> dict[str, int]:
    """The workload's tasks and their weights, extracted as the benchmark's arms extract them."""
    from bench.arms import workload_tasks

    return {t.name: t.weight for t in workload_tasks(workload, "cpu")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work_dir", type=Path, help="a run of the engine alone (its measurements.jsonl)")
    parser.add_argument("workload")
    parser.add_argument("--round-size", type=int, default=8)
    grid = {"task_patience": (int, "96"), "min_task_trials": (int, "32"), "model_window": (int, "128"),
            "min_improvement": (float, "0.01"), "patience_share": (float, "0.25"),
            "solo_patience_share": (float, "0.4")}
    for name, (_, default) in grid.items():
        parser.add_argument(f"--{name.replace('_', '-')}", default=default, help="comma-separated values to try")
    args = parser.parse_args()
    from autotune.session import MEASUREMENTS_LOG
    from bench.workloads import WORKLOADS
    from results.report import read_measurements

    if args.workload not in WORKLOADS:
        raise SystemExit(f"unknown workload {args.workload!r}; expected one of {', '.join(WORKLOADS)}")
    log = read_measurements(args.work_dir / MEASUREMENTS_LOG)
    if not log:
        raise SystemExit(f"{args.work_dir / MEASUREMENTS_LOG}: no measurements; expected a finished run's log")
    weights = task_weights(args.workload)
    values = {name: [kind(v) for v in getattr(args, name).split(",")] for name, (kind, _) in grid.items()}
    print("| task patience | min trials | model window | min gain | patience share | alone | tasks stopped "
          "| job stopped | measurements kept | estimated latency / run's |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    for combo in itertools.product(*values.values()):
        settings = dict(zip(values, combo))
        r = replay(log, weights, args.round_size, PlateauPreemption(**settings), settings)
        print(f"| {settings['task_patience']} | {settings['min_task_trials']} | "
              f"{settings['model_window']} | {settings['min_improvement']:g} | {settings['patience_share']:g} | "
              f"{settings['solo_patience_share']:g} | "
              f"{len(r.stopped)} | "
              f"{'-' if r.job_stopped_at is None else f'round {r.job_stopped_at}'} | {r.kept / r.of:.0%} "
              f"({r.kept} of {r.of}) | {r.latency_s / r.full_latency_s:.3f} |")


if __name__ == "__main__":
    main()

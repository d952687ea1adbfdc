"""The plot of a live plan run: arrival rate, replicas per stage, and rolling p99 against the SLO, over the trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from results.atomic import save_figure

ROLLING_S = 5.0  # the p99 at t is over the queries that arrived in the preceding window of this length


def replica_steps(record: dict[str, Any]) -> dict[str, list[tuple[float, int]]]:
    """Per stage, (time, replicas serving) at each change, from the plan's count at 0."""
    steps: dict[str, list[tuple[float, int]]] = {}
    for e in record["replica_changes"]:
        if e["event"] in ("planned", "serving", "removed", "failed"):  # others count replicas asked for, or standbys
            steps.setdefault(e["stage"], []).append((e["t_s"], e["replicas"]))
    return steps


def rolling_p99(arrival_s: np.ndarray, latency_ms: np.ndarray, step_s: float = 1.0,
                window_s: float = ROLLING_S) -> tuple[np.ndarray, np.ndarray]:
    """Times and the p99 of the answered queries that arrived in ``[t - window_s, t)`` (NaN where none did)."""
    ends = np.arange(step_s, (arrival_s.max() if arrival_s.size else 0.0) + step_s, step_s)
    p99 = [np.percentile(v, 99) if (v := latency_ms[(arrival_s >= t - window_s) & (arrival_s < t)]).size else np.nan
           for t in ends]
    return ends, np.asarray(p99, dtype=float)


def plot_live(record: dict[str, Any], path: Path) -> None:
    """Three panels sharing the time axis, written to a temporary file and renamed (a reader never sees half)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    q = record["queries"]
    arrival = np.asarray(q["arrival_s"], dtype=float)
    latency = np.asarray([np.nan if v is None else v for v in q["latency_ms"]], dtype=float)
    answered = ~np.isnan(latency) & ~np.asarray(q["failed"], dtype=bool)
    end = float(arrival.max()) if arrival.size else 1.0
    fig, (rate, reps, tail) = plt.subplots(3, 1, figsize=(9, 7.5), sharex=True)
    rate.hist(arrival, bins=np.arange(0.0, end + 1.0, 1.0), color="tab:gray")
    rate.set_ylabel("arrivals / s")
    tuner = ", Tuner on" if record["tuner"] else ""
    rate.set_title(f"{record['pipeline']} ({record['method']} plan, {record['backend']} backend{tuner})")
    most = 1
    for stage, steps in replica_steps(record).items():
        times, counts = [t for t, _ in steps] + [end], [n for _, n in steps] + [steps[-1][1]]
        reps.step(times, counts, where="post", label=stage)
        most = max(most, *counts)
    reps.set_ylabel("replicas serving")
    reps.set_ylim(0, most + 1)
    reps.yaxis.set_major_locator(MaxNLocator(integer=True))
    reps.legend(loc="upper left", fontsize="small")
    ends, p99 = rolling_p99(arrival[answered], latency[answered])
    tail.plot(ends, p99, color="tab:blue", label=f"measured p99 (last {ROLLING_S:g} s)")
    tail.axhline(record["slo_ms"], color="tab:red", ls="--", label="SLO")
    predicted = record[record["compared_with"]]["p99_ms"]
    tail.axhline(predicted, color="tab:green", ls=":", label=f"{record['compared_with'].replace('_', ' ')} p99 "
                                                                "(whole trace)")
    failed = arrival[np.asarray(q["failed"], dtype=bool)]
    if failed.size:
        tail.plot(failed, np.full(failed.size, record["slo_ms"]), "x", color="black", label="failed query")
    tail.set_yscale("log")
    tail.set_ylabel("latency (ms)")
    tail.set_xlabel("seconds")
    tail.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)

"""The human side of an artifact: a tuning-curve plot and a short Markdown summary."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from results.atomic import save_figure
from results.profile import Profile


def read_measurements(log_path: str | Path) -> list[dict[str, Any]]:
    """The session's measurement log, one dict per measured candidate, in order.

    A line that does not parse (one cut short when a job was killed mid-write, and the
    session appends after it) is passed over: the measurements are in the database too.
    """
    path = Path(log_path)
    if not path.is_file():
        return []
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                out.append(record)
    return out


def plot_tuning_curve(measurements: Sequence[dict[str, Any]], weights: dict[str, int], path: Path) -> None:
    """Per-task best latency against trials, and the estimated model latency (sum of weight x best) against trials."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (per_task, model) = plt.subplots(1, 2, figsize=(11, 4))
    best: dict[str, float] = {}
    series: dict[str, tuple[list[int], list[float]]] = {}
    total_x, total_y = [], []
    for i, m in enumerate(measurements, 1):
        if m.get("latency_s") is None or m.get("task") not in weights:  # not this model's (an earlier run's shapes)
            continue
        task = m["task"]
        if m["latency_s"] < best.get(task, math.inf):
            best[task] = m["latency_s"]
            xs, ys = series.setdefault(task, ([], []))
            xs.append(m["trial"])
            ys.append(best[task] * 1e6)
        if len(best) == len(weights):
            total_x.append(i)
            total_y.append(sum(weights[t] * b for t, b in best.items()) * 1e3)
    last_trial = {m["task"]: m["trial"] for m in measurements if m.get("task") in weights}
    for task, (xs, ys) in series.items():
        per_task.step([*xs, last_trial[task]], [*ys, ys[-1]], where="post", marker=".", label=task)
    per_task.set(xlabel="trials of the task", ylabel="best latency (us)", yscale="log", title="Best candidate per task")
    if len(series) <= 12:
        per_task.legend(fontsize=6)
    model.step(total_x, total_y, where="post", color="black")
    model.set(xlabel="trials (all tasks)", ylabel="estimated model latency (ms)", title="Sum of weight x task best")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def energy_table(bill: dict[str, Any]) -> list[str]:
    """The tuning job's bill as Markdown lines: energy per phase, its method, waste and cost."""
    method = bill["method"]["cpu"] + (f"; {bill['method']['gpu']}" if bill["method"].get("gpu") else "")
    wasted = bill["wasted"]
    share = f"{wasted['measurements'] / wasted['of']:.0%}" if wasted["of"] else "-"
    lines = [f"Tuning energy {bill['energy_j'] / 1000:.2f} kJ ({method}).",
             f"Measurements that never improved a task's best: {wasted['measurements']} of {wasted['of']} ({share}), "
             f"{wasted['energy_j'] / 1000:.2f} kJ." + (f" Cost: {bill['cost']:.4f}." if "cost" in bill else ""),
             "", "| phase | CPU-s | device-s | energy (kJ) |", "| --- | ---: | ---: | ---: |"]
    for name, p in bill["phases"].items():
        lines.append(f"| {name} | {p['cpu_s']:.1f} | {p['device_s']:.1f} | {p['energy_j'] / 1000:.2f} |")
    return lines


def write_summary(path: Path, manifest: dict[str, Any], profile: Profile) -> None:
    """A Markdown page: what was tuned, how well, and how fast the result runs."""
    tuning = manifest["tuning"]
    lines = [
        f"# {manifest['model']['spec']} on {manifest['target']['device']}",
        "",
        f"Tuned with the `{tuning['engine']}` engine: {tuning['trials']} trials over {len(tuning['tasks'])} tasks "
        f"in {tuning['wall_s']:.0f} s. Verified against PyTorch at every batch size.",
        "",
    ]
    if tuning.get("budget_warning"):
        lines += [f"> Warning: {tuning['budget_warning']}", ""]
    lines += ["| task | weight | MFLOP | measured | screened out | stopped | best (us) |",
              "| --- | ---: | ---: | ---: | ---: | --- | ---: |"]
    for t in tuning["tasks"]:
        best = "-" if t["best_us"] is None else f"{t['best_us']:.1f}"
        lines.append(f"| {t['name']} | {t['weight']} | {t['flops'] / 1e6:.2f} | {t['trials']} | {t.get('screened', 0)} "
                     f"| {t.get('stopped') or '-'} | {best} |")
    if tuning.get("energy"):
        lines += ["", *energy_table(tuning["energy"])]
    lines += ["", "| threads | batch | tuned p50 (ms) | tuned p99 (ms) | PyTorch eager p50 (ms) | items/s |",
              "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for e in profile.entries:
        eager = "-" if e.torch_eager_latency_ms is None else f"{e.torch_eager_latency_ms.p50:.3f}"
        lines.append(
            f"| {e.hardware['threads']} | {e.batch_size} | {e.latency_ms.p50:.3f} | {e.latency_ms.p99:.3f} | "
            f"{eager} | {e.throughput_per_s:,.0f} |"
        )
    lines += ["", "![tuning curve](tuning_curve.png)", ""]
    path.write_text("\n".join(lines), encoding="utf-8")

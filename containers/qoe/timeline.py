"""The timeline plot of a QoE run: containers in G, S and B over time, and each container's CPU limit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from results.atomic import save_figure


def plot_timeline(record: dict[str, Any], path: Path) -> None:
    """Two panels sharing the time axis; joins are marked. Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = [t for t in record["timeline"] if t["counts"]]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    times = [t["t"] for t in timeline]
    for cls, color in (("S", "tab:green"), ("G", "tab:blue"), ("B", "tab:red")):
        top.step(times, [t["counts"][cls] for t in timeline], where="post", color=color, label=cls)
    top.set_ylabel("containers")
    top.legend(loc="upper left", ncols=3)
    scenario = record["scenario"]
    top.set_title(f"{scenario['name']}: {scenario['policy']} / {scenario['listener']} listener")
    names = sorted({n for t in timeline for n in t["containers"]})
    for name in names:
        points = [(t["t"], t["containers"][name]["limit"]) for t in timeline if name in t["containers"]]
        bottom.step([p[0] for p in points], [p[1] if p[1] is not None else float("nan") for p in points],
                    where="post", label=name)
    bottom.set_ylabel("CPU limit (cores)")
    bottom.set_xlabel("seconds")
    if names:
        bottom.legend(loc="upper right", fontsize="small", ncols=2)
    for at in record["joined_at"].values():
        for ax in (top, bottom):
            ax.axvline(at, color="grey", lw=0.5, ls=":")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)

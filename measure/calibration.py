"""Calibration: the error and throughput of parallel timing at each level, on this machine.

The same candidates are timed once in isolation (the reference) and then at every
level; the curve (level, mean, median and p90 relative error, candidates per second)
is saved per host, device and thread count, and an engine with ``--dop auto`` starts
from the highest level whose error was within the bound instead of probing. The
error bounded is the mean, as in the controller's verification (``measure.dop``):
a level whose median is fine but whose tail is not (1.4% median, 28% p90 at level 1
here) would start a tuning job on a round the controller throws away.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from measure.engine import Candidate, Measurement
from measure.slots import DeviceSlot


def cache_dir() -> Path:
    return Path(os.environ.get("AUTOTUNE_CACHE_DIR", Path.home() / ".cache" / "autotune")) / "calibration"


def calibration_path(slot: DeviceSlot, threads: int) -> Path:
    device = slot.info.get("name", slot.kind) if slot.kind == "cuda" else slot.kind
    key = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{platform.node()}-{device}-t{threads}")
    return cache_dir() / f"{key}.json"


ERROR_STATISTIC = "mean relative error"  # what a curve's "error" is; curves saved with another are not read


def load_calibration(slot: DeviceSlot, threads: int) -> list[dict[str, Any]] | None:
    path = calibration_path(slot, threads)
    try:
        saved = json.loads(path.read_text())
        return saved["curve"] if saved.get("error_statistic") == ERROR_STATISTIC else None
    except (OSError, ValueError, KeyError):
        return None


def sample_candidates(mod: Any, target: Any, count: int, seed: int, task: str = "calibration") -> list[Candidate]:
    """``count`` distinct random schedules from the kernel's design space."""
    from measure.tvm_import import import_meta_schedule

    ms = import_meta_schedule()
    ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                         search_strategy="evolutionary", task_name=task, rand_state=seed, num_threads=1)
    ctx.pre_tuning(max_trials=count, num_trials_per_iter=count, design_spaces=ctx.generate_design_space(),
                   database=ms.database.MemoryDatabase(), cost_model=ms.cost_model.RandomModel())
    candidates = list(ctx.generate_measure_candidates() or [])
    ctx.post_tuning()
    return [Candidate(c.sch.mod, c.args_info, task) for c in candidates[:count]]


def relative_errors(parallel: Sequence[Measurement], reference: Sequence[Measurement]) -> list[float]:
    return [abs(p.latency - r.latency) / r.latency for p, r in zip(parallel, reference) if p.ok and r.ok]


def calibrate(engine: Any, target: Any, candidates: Sequence[Candidate], levels: Sequence[int],
              error_bound: float = 0.05) -> dict[str, Any]:
    """Time ``candidates`` in isolation, then at each level; return the curve and the level to start from."""
    started = time.monotonic()
    reference = engine.measure_isolated(target, engine.slots[0].device_type, candidates)
    isolated_s = time.monotonic() - started
    curve = []
    for level in levels:
        started, disturbed = time.monotonic(), engine.counts["disturbed"]
        results = engine.measure_at(level, target, candidates)
        wall = time.monotonic() - started
        errors = relative_errors(results, reference)
        curve.append({
            "level": level,
            "concurrency": max(1, level),
            "overlap_builds": level > 0,
            "error": statistics.fmean(errors) if errors else None,
            "median_error": statistics.median(errors) if errors else None,
            "p90_error": statistics.quantiles(errors, n=10)[-1] if len(errors) >= 2 else None,
            "candidates_per_s": sum(1 for r in results if r.ok) / wall,
            "timed_again_busy": engine.counts["disturbed"] - disturbed,  # the probe saw a busy machine
            "wall_s": wall,
        })
    good = [p["level"] for p in curve if p["error"] is not None and p["error"] <= error_bound]
    return {
        "error_statistic": ERROR_STATISTIC,
        "candidates": len(candidates),
        "valid": sum(1 for r in reference if r.ok),
        "isolated_wall_s": isolated_s,
        "error_bound": error_bound,
        "chosen_level": max(good, default=0),
        "curve": curve,
    }


def save_calibration(result: dict[str, Any], path: Path) -> Path:
    """Write atomically: a half-written calibration must never be read as one.

    The temporary file comes from ``mkstemp`` (a fresh name, opened exclusively), so a second
    calibration or a link planted in a shared folder cannot take it over. (``results.atomic`` does
    the same for the other packages; ``measure`` may not import ``results``.)
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path

"""``autotune measure calibrate``: the engine's error and throughput per level, saved for later runs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.errors import UsageError


def run_calibration(kernel_name: str, count: int, levels: Sequence[int] | None, target: str, threads: int | None,
                    devices: Sequence[str] | None, out: Path | None, seed: int) -> tuple[dict[str, Any], Path]:
    """Sample ``count`` schedules of a reference kernel and calibrate the parallel engine on them."""
    from autotune.target import resolve_target
    from measure.calibration import calibrate, calibration_path, sample_candidates, save_calibration
    from measure.kernels import KERNELS, kernel
    from measure.slots import DeviceNotFound

    if kernel_name not in KERNELS:
        raise UsageError(f"--kernel must be one of {', '.join(KERNELS)}; got {kernel_name!r}")
    if count < 4:
        raise UsageError(f"--candidates must be at least 4; got {count}")
    if levels is not None and any(level < 0 for level in levels):
        raise UsageError(f"--levels must be levels 0, 1, 2, ...; got {list(levels)}")
    spec = resolve_target(target, threads)
    from measure.factory import create
    from measure.tvm_import import import_meta_schedule

    try:
        engine = create("parallel", target_kind=spec.kind, threads=spec.num_cores, devices=devices, dop="0", seed=seed)
    except DeviceNotFound as err:
        raise UsageError(str(err)) from None
    try:
        import_meta_schedule()
        tvm_target = spec.tvm_target()
        candidates = sample_candidates(kernel(kernel_name), tvm_target, count, seed)
        levels = list(levels) if levels is not None else list(range(len(engine.lanes) + 1))
        result = calibrate(engine, tvm_target, candidates, levels)
        result.update(kernel=kernel_name, threads=spec.num_cores, target=spec.kind,
                      slots=[s.name for s in engine.slots])
        path = save_calibration(result, out or calibration_path(engine.slots[0], spec.num_cores))
    finally:
        engine.close()
    return result, path

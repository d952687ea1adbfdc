"""Making an engine from the command line's words: its name, the target, the devices, the level."""

from __future__ import annotations

from collections.abc import Sequence

from measure.calibration import load_calibration
from measure.dop import DopController
from measure.engine import ENGINES, MeasurementEngine
from measure.slots import discover, host_cores


def create(kind: str | MeasurementEngine, *, target_kind: str, threads: int, devices: Sequence[str] | None = None,
           dop: str = "auto", seed: int = 0) -> MeasurementEngine:
    """An engine by name ("parallel", "stock"), or the instance itself.

    ``dop`` is "auto" (controller; starts from a saved calibration when there is one) or a
    fixed level (0 = isolation). Devices are checked here, before any tuning starts.
    """
    if isinstance(kind, MeasurementEngine):
        return kind
    if kind not in ENGINES:
        raise ValueError(f"unknown measurement engine {kind!r}; expected one of: {', '.join(ENGINES)}")
    slots = discover(devices, target_kind, threads)
    if kind == "stock":
        from measure.stock import StockEngine

        return StockEngine(max_build_workers=len(host_cores()))
    from measure.parallel import EngineLimits, ParallelEngine, lanes_per_slot

    max_level = len(slots) * lanes_per_slot(slots, EngineLimits())
    if dop == "auto":
        curve = load_calibration(slots[0], threads)
        controller = DopController.from_calibration(curve, max_level) if curve else DopController(max_level=max_level)
    else:
        level = int(dop)
        controller = DopController(max_level=level, level=level, fixed=True)
    return ParallelEngine(slots, build_workers=len(host_cores()), controller=controller, seed=seed)

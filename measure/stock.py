"""MetaSchedule's own ``LocalBuilder`` and ``LocalRunner`` behind the engine interface.

The one change from a stock run is the build workers' initializer: without it each
fresh worker spends ~95 s importing TVM's tensor intrinsics (see ``tvm_import``) and
every build hits the 30 s timeout on a 2-core machine with torch installed.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Sequence
from typing import Any

from measure.engine import Candidate, Measurement, MeasurementEngine, median_turn
from measure.tvm_import import import_meta_schedule
from measure.workers import CallCost


class StockEngine(MeasurementEngine):
    """Builds a round in one fresh process pool, then runs candidates one at a time."""

    name = "stock"

    def __init__(self, max_build_workers: int, build_timeout_s: float = 60.0, run_timeout_s: float = 30.0) -> None:
        super().__init__()
        ms = import_meta_schedule()
        self._builder = ms.builder.LocalBuilder(
            max_workers=max_build_workers, timeout_sec=build_timeout_s, initializer=import_meta_schedule
        )
        self._runner = ms.runner.LocalRunner(timeout_sec=run_timeout_s)

    def measure(self, target: Any, device_type: str, candidates: Sequence[Candidate]) -> list[Measurement]:
        return self.measure_isolated(target, device_type, candidates)

    def measure_isolated(self, target: Any, device_type: str, candidates: Sequence[Candidate],
                         turns: int = 1) -> list[Measurement]:
        """The stock runner already times one candidate at a time; turns re-run what was built once
        (a build is a fresh process pool, seconds before its first candidate), each keeping its median turn."""
        from tvm.s_tir.meta_schedule.builder import BuilderInput
        from tvm.s_tir.meta_schedule.runner import RunnerInput

        built, build_cost = _with_children_cost(self._builder.build, [BuilderInput(c.mod, target) for c in candidates])
        runnable = [
            RunnerInput(b.artifact_path, device_type, c.args_info)
            for b, c in zip(built, candidates)
            if b.error_msg is None
        ]
        passes, run_cost = _with_children_cost(
            lambda r: [[f.result() for f in self._runner.run(r)] for _ in range(turns)], runnable)
        self.work["build"].add(build_cost.cpu_s)
        self.work["measure"].add(run_cost.cpu_s, run_cost.wall_s)
        # The stock runner times candidates one after another in one process: each run gets an equal share.
        timed = max(len(runnable) * turns, 1)
        share = CallCost(run_cost.wall_s / timed, build_cost.cpu_s / max(len(built), 1) + run_cost.cpu_s / timed)
        runs = iter(zip(*passes))
        results = []
        for b in built:
            if b.error_msg is not None:
                results.append(Measurement(error=f"build: {b.error_msg}", cpu_s=share.cpu_s))
            else:
                results.append(median_turn([_measurement(r, share) for r in next(runs)]))
        self._remove_artifacts(built)
        return results

    @staticmethod
    def _remove_artifacts(built: Sequence[Any]) -> None:
        import os
        import shutil

        for b in built:
            if b.artifact_path:
                shutil.rmtree(os.path.dirname(b.artifact_path), ignore_errors=True)


def _measurement(run: Any, share: CallCost) -> Measurement:
    """One stock ``RunnerResult`` as a ``Measurement`` that carries its share of the round's cost."""
    if run.error_msg is not None:
        return Measurement(error=f"run: {run.error_msg}", device_s=share.wall_s, cpu_s=share.cpu_s)
    return Measurement(run_secs=tuple(float(s) for s in run.run_secs), device_s=share.wall_s, cpu_s=share.cpu_s)


def _with_children_cost(fn: Callable[[Any], Any], arg: Any) -> tuple[Any, CallCost]:
    """``fn(arg)``, its wall time and the CPU time of the child processes it started and reaped (stock's pools)."""
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    result = fn(arg)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return result, CallCost(time.monotonic() - started, cpu)

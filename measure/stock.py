"""MetaSchedule's own ``LocalBuilder`` and ``LocalRunner`` behind the engine interface.

The one change from a stock run is the build workers' initializer: without it each
fresh worker spends ~95 s importing TVM's tensor intrinsics (see ``tvm_import``) and
every build hits the 30 s timeout on a 2-core machine with torch installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from measure.engine import Candidate, Measurement, MeasurementEngine
from measure.tvm_import import import_meta_schedule


class StockEngine(MeasurementEngine):
    """Builds a round in one fresh process pool, then runs candidates one at a time."""

    name = "stock"

    def __init__(self, max_build_workers: int, build_timeout_s: float = 60.0, run_timeout_s: float = 30.0) -> None:
        ms = import_meta_schedule()
        self._builder = ms.builder.LocalBuilder(
            max_workers=max_build_workers, timeout_sec=build_timeout_s, initializer=import_meta_schedule
        )
        self._runner = ms.runner.LocalRunner(timeout_sec=run_timeout_s)

    def measure(self, target: Any, device_type: str, candidates: Sequence[Candidate]) -> list[Measurement]:
        from tvm.s_tir.meta_schedule.builder import BuilderInput
        from tvm.s_tir.meta_schedule.runner import RunnerInput

        built = self._builder.build([BuilderInput(c.mod, target) for c in candidates])
        runnable = [
            RunnerInput(b.artifact_path, device_type, c.args_info)
            for b, c in zip(built, candidates)
            if b.error_msg is None
        ]
        futures = iter(self._runner.run(runnable))
        results = []
        for b in built:
            if b.error_msg is not None:
                results.append(Measurement(error=f"build: {b.error_msg}"))
                continue
            r = next(futures).result()
            if r.error_msg is not None:
                results.append(Measurement(error=f"run: {r.error_msg}"))
            else:
                results.append(Measurement(run_secs=tuple(float(s) for s in r.run_secs)))
        self._remove_artifacts(built)
        return results

    @staticmethod
    def _remove_artifacts(built: Sequence[Any]) -> None:
        import os
        import shutil

        for b in built:
            if b.artifact_path:
                shutil.rmtree(os.path.dirname(b.artifact_path), ignore_errors=True)

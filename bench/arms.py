"""One arm of the tuning benchmark, run in its own process so each pays its own start-up.

``python -m bench.arms ARM WORKLOAD TRIALS WORK_DIR`` prints one JSON line: wall time,
valid trials, best logged latency and the best-so-far curve. The clock starts after TVM
and torch are imported and the workload is built, and before the tensor intrinsics are
imported (stock pays that inside its first ``TuneContext``).

Arms: ``stock`` (``tune_tir`` / ``tune_relax`` with their defaults), ``warm_stock`` (the
same with a build pool that lives across rounds and imports quickly, so that only
autotune's measurement remains different), ``autotune`` (our session and engine).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from typing import Any

from bench.workloads import WORKLOADS, kernel, model_relax


def _setup(workload: str) -> tuple[Any, Any]:
    from autotune.target import resolve_target

    spec = resolve_target("cpu")
    mod = kernel(workload) if WORKLOADS[workload].kind == "kernel" else model_relax(workload)[0]
    return spec, mod


def stock(workload: str, trials: int, work_dir: str, warm: bool) -> dict[str, Any]:
    """``tune_tir`` / ``tune_relax`` with their defaults; ``warm`` swaps in a persistent, fast-importing build pool."""
    spec, mod = _setup(workload)
    started = time.monotonic()
    builder: Any = "local"
    if warm:
        builder = _warm_builder(spec.num_cores)
    from tvm.s_tir import meta_schedule as ms

    target = spec.tvm_target()
    if WORKLOADS[workload].kind == "kernel":
        db = ms.tune_tir(mod=mod, target=target, work_dir=work_dir, max_trials_global=trials, builder=builder)
    else:  # tune_relax extracts nothing from an unfused module: fuse first, as compile_relax does
        from autotune.frontend import prepare_for_tuning

        db = ms.relax_integration.tune_relax(prepare_for_tuning(mod, target), {}, target, work_dir,
                                             max_trials_global=trials, builder=builder)
    wall = time.monotonic() - started
    records = db.get_all_tuning_records()
    secs = [s for s in (statistics.fmean(float(x) for x in r.run_secs) for r in records if r.run_secs) if s < 1e9]
    return {"wall_s": wall, "valid_trials": len(secs), "best_logged_s": min(secs, default=None)}


def _warm_builder(workers: int) -> Any:
    """LocalBuilder's own worker function on one process pool kept for the whole run."""
    from measure.tvm_import import import_meta_schedule

    ms = import_meta_schedule()
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.s_tir.meta_schedule.builder.local_builder import _worker_func
    from tvm.ir.utils import derived_object
    from tvm.support.popen_pool import PopenPoolExecutor

    @derived_object
    class WarmBuilder(PyBuilder):
        def __init__(self) -> None:
            super().__init__()
            self.pool = PopenPoolExecutor(max_workers=workers, timeout=60, initializer=import_meta_schedule)

        def build(self, build_inputs: list[Any]) -> list[Any]:
            futures = [self.pool.submit(_worker_func, None, None, b.mod, b.target, None) for b in build_inputs]
            results = []
            for f in futures:
                try:
                    results.append(BuilderResult(f.result(), None))
                except Exception as err:  # noqa: BLE001  (as LocalBuilder: a failed build is a result)
                    results.append(BuilderResult(None, str(err)))
            return results

    del ms
    return WarmBuilder()


def autotune(workload: str, trials: int, work_dir: str) -> dict[str, Any]:
    """Our session (budget split, parallel engine, final ranking) on the same workload and budget."""
    spec, mod = _setup(workload)
    started, started_at = time.monotonic(), time.time()
    from measure.tvm_import import import_meta_schedule

    import_meta_schedule()
    from autotune.budget import split_budget
    from autotune.frontend import prepare_for_tuning
    from autotune.pipeline import run_tuning
    from autotune.session import MEASUREMENTS_LOG
    from autotune.tasks import Task, extract_tasks
    from results.report import read_measurements

    target = spec.tvm_target()
    if WORKLOADS[workload].kind == "kernel":
        from tvm.s_tir.analysis import estimate_tir_flops

        tasks = [Task(workload, mod, 1, float(estimate_tir_flops(mod)))]
    else:
        tasks = extract_tasks([prepare_for_tuning(mod, target)], target)
    plan = split_budget(tasks, trials, floor=8)
    session, _ = run_tuning(tasks, plan, spec, target, work_dir)
    wall = time.monotonic() - started
    log = read_measurements(f"{work_dir}/{MEASUREMENTS_LOG}")
    weights = {t.name: t.weight for t in tasks}
    curve, best = _model_latency_curve(log, weights, started_at)
    valid = sum(1 for m in log if m["latency_s"] is not None)
    return {"wall_s": wall, "valid_trials": valid, "best_logged_s": best if valid else None, "curve": curve,
            "engine": session.engine_report}


def _model_latency_curve(log: list[dict[str, Any]], weights: dict[str, int],
                         started_at: float) -> tuple[list[tuple[float, float]], float]:
    """(seconds since ``started_at``, sum of weight x task best) each time it improves, once every task has a best."""
    best: dict[str, float] = {}
    curve: list[tuple[float, float]] = []
    total = math.inf
    for m in sorted(log, key=lambda m: m["at"]):
        if m["latency_s"] is None:
            continue
        best[m["task"]] = min(best.get(m["task"], math.inf), m["latency_s"])
        if len(best) == len(weights):
            now = sum(weights[t] * b for t, b in best.items())
            if now < total:
                total = now
                curve.append((m["at"] - started_at, total))
    return curve, total


if __name__ == "__main__":
    arm, workload, trials, work_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if arm == "autotune":
        out = autotune(workload, trials, work_dir)
    else:
        out = stock(workload, trials, work_dir, warm=arm == "warm_stock")
    print(json.dumps(out))

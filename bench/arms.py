"""One arm of the tuning benchmark, run in its own process so each pays its own start-up.

``python -m bench.arms ARM WORKLOAD TRIALS WORK_DIR`` prints one JSON line: wall time,
valid trials, best logged latency and the best-so-far curve. The clock starts after TVM
and torch are imported and the workload is built, and before the tensor intrinsics are
imported (stock pays that inside its first ``TuneContext``).

Arms: ``stock`` (``tune_tir`` / ``tune_relax`` with their defaults), ``warm_stock`` (the
same with a build pool that lives across rounds and imports quickly, so that only
autotune's measurement remains different), ``autotune`` (our session and engine;
``--policies trimmer`` adds the candidate filter and preemption, ``--policies preemption``
preemption alone (what the filter adds shows against it), ``--warm-start PATH``
starts the latency model from an earlier run). Every arm reports its work: CPU-seconds
of the arm's process and its children, device-seconds spent measuring, and how many
measurements never improved a best.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import time
from typing import Any

from bench.workloads import WORKLOADS, kernel, model_relax
from autotune.policies import PolicySettings
from cost_models.preemption import COUNTS


def _setup(workload: str, target_name: str) -> tuple[Any, Any]:
    from autotune.target import resolve_target

    spec = resolve_target(target_name)
    mod = kernel(workload) if WORKLOADS[workload].kind == "kernel" else model_relax(workload)[0]
    return spec, mod


def stock(workload: str, trials: int, work_dir: str, warm: bool, target_name: str = "cpu") -> dict[str, Any]:
    """``tune_tir`` / ``tune_relax`` with their defaults; ``warm`` swaps in a persistent, fast-importing build pool."""
    spec, mod = _setup(workload, target_name)
    from cost_models.energy import EnergyLedger, cpu_meter, gpu_meter
    from measure.slots import local_gpu_ids

    ledger = EnergyLedger(cpu_meter(), gpu_meter(local_gpu_ids(None, spec.kind, spec.num_cores)))
    cpu_before = _cpu_s()
    started = time.monotonic()
    builder: Any = "local"
    if warm:
        builder = _warm_builder(spec.num_cores)
    runner = _timed_runner()
    from tvm.s_tir import meta_schedule as ms

    target = spec.tvm_target()
    if WORKLOADS[workload].kind == "kernel":
        db = ms.tune_tir(mod=mod, target=target, work_dir=work_dir, max_trials_global=trials, builder=builder,
                         runner=runner)
    else:  # tune_relax extracts nothing from an unfused module: fuse first, as compile_relax does
        from autotune.frontend import prepare_for_tuning

        db = ms.relax_integration.tune_relax(prepare_for_tuning(mod, target), {}, target, work_dir,
                                             max_trials_global=trials, builder=builder, runner=runner)
    wall = time.monotonic() - started
    if warm:
        builder.pool.shutdown()  # its workers' CPU time is counted once they are reaped
    runner.runner.pool.shutdown()  # and so is the timing worker's, which lives as long as the runner
    records = db.get_all_tuning_records()
    secs = [s for s in (statistics.fmean(float(x) for x in r.run_secs) for r in records if r.run_secs) if s < 1e9]
    wasted = never_improved(records)
    cpu = _cpu_s() - cpu_before
    bill = ledger.bill({"all": {"cpu_s": cpu, "device_s": runner.busy_s}}, wall, 1,
                       {"measurements": wasted, "of": len(records), "cpu_s": 0.0, "device_s": 0.0})
    bill["device_s_measuring"] = round(runner.busy_s, 3)
    return {"wall_s": wall, "valid_trials": len(secs), "best_logged_s": min(secs, default=None), "bill": bill}


def never_improved(records: list[Any]) -> int:
    """How many records, in commit order, did not beat their workload's best so far."""
    import tvm_ffi

    wasted, best = 0, {}
    for r in records:
        key = tvm_ffi.structural_hash(r.workload.mod)
        value = statistics.fmean(float(x) for x in r.run_secs) if r.run_secs else math.inf
        wasted += not value < best.get(key, math.inf)
        best[key] = min(best.get(key, math.inf), value)
    return wasted


def _cpu_s() -> float:
    """CPU-seconds of this process and of its children that have been reaped."""
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def _timed_runner() -> Any:
    """Stock's ``LocalRunner``, counting the seconds it keeps the device busy (it measures synchronously)."""
    from measure.tvm_import import import_meta_schedule

    ms = import_meta_schedule()
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.runner import PyRunner

    @derived_object
    class TimedRunner(PyRunner):
        def __init__(self) -> None:
            super().__init__()
            self.runner = ms.runner.LocalRunner()
            self.busy_s = 0.0

        def run(self, runner_inputs: list[Any]) -> list[Any]:
            started = time.monotonic()
            futures = self.runner.run(runner_inputs)
            for f in futures:
                f.result()
            self.busy_s += time.monotonic() - started
            return futures

    return TimedRunner()


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


def autotune(workload: str, trials: int, work_dir: str, *, policies: str = "off", round_size: int | None = None,
             warm_start: str | None = None, target_name: str = "cpu", seed: int = 0,
             patience_counts: str = COUNTS[0], guided_search: bool = True,
             guided_pool: float = PolicySettings.filter_guided_pool,
             guided_generations: int = PolicySettings.filter_guided_generations,
             guided_population: int = PolicySettings.filter_guided_population) -> dict[str, Any]:
    """Our session (budget split, parallel engine, final ranking) on the same workload and budget.

    ``policies``: "off" (the engine alone), "trimmer" (candidate filter and preemption, defaults) or
    "preemption" (preemption alone, at its defaults); ``patience_counts``: what preemption's patience counts.
    ``seed``: the search's; runs of both arms on the same seed are paired. ``guided_search``: see autotune.search.
    Both bill with the same meters (NVML on a GPU target), so their energy compares.
    """
    spec, mod = _setup(workload, target_name)
    started, started_at = time.monotonic(), time.time()
    from measure.tvm_import import import_meta_schedule

    import_meta_schedule()
    from autotune.budget import split_budget
    from autotune.pipeline import run_tuning
    from autotune.policies import build_policies
    from autotune.session import MEASUREMENTS_LOG
    from measure.slots import local_gpu_ids
    from results.report import read_measurements

    target = spec.tvm_target()
    tasks = _tasks(workload, mod, target)
    plan = split_budget(tasks, trials, floor=8)
    warnings: list[str] = []
    settings = PolicySettings(filter=policies == "trimmer", preemption=policies != "off",
                              patience_counts=patience_counts, filter_guided_pool=guided_pool,
                              filter_guided_generations=guided_generations,
                              filter_guided_population=guided_population,
                              warm_start=(warm_start,) if warm_start else ())
    chosen = build_policies(settings, target, spec.num_cores, 0, local_gpu_ids(None, spec.kind, spec.num_cores),
                            warnings.append)
    session, _ = run_tuning(tasks, plan, spec, target, work_dir, round_size=round_size, seed=seed,
                            policies=chosen, guided_search=guided_search)
    wall = time.monotonic() - started
    log = read_measurements(f"{work_dir}/{MEASUREMENTS_LOG}")
    weights = {t.name: t.weight for t in tasks}
    curve, best = _model_latency_curve(log, weights, started_at)
    valid = sum(1 for m in log if m["latency_s"] is not None)
    return {"wall_s": wall, "valid_trials": valid, "best_logged_s": best if valid else None, "curve": curve,
            "engine": session.engine_report, "bill": session.bill, "policies": session.policies_report(),
            "screened": sum(s.screened for s in session.states), "warnings": warnings}


def workload_tasks(workload: str, target_name: str) -> list[Any]:
    """The tuning tasks of ``workload`` on ``target_name``, as the arms tune them."""
    spec, mod = _setup(workload, target_name)
    return _tasks(workload, mod, spec.tvm_target())


def _tasks(workload: str, mod: Any, target: Any) -> list[Any]:
    from autotune.frontend import prepare_for_tuning
    from autotune.tasks import Task, extract_tasks

    if WORKLOADS[workload].kind == "kernel":
        from tvm.s_tir.analysis import estimate_tir_flops

        return [Task(workload, mod, 1, float(estimate_tir_flops(mod)))]
    return extract_tasks([prepare_for_tuning(mod, target)], target)


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
    parser = argparse.ArgumentParser(description="one benchmark arm; prints one JSON line")
    parser.add_argument("arm", choices=("stock", "warm_stock", "autotune"))
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("trials", type=int)
    parser.add_argument("work_dir")
    parser.add_argument("--policies", choices=("off", "trimmer", "preemption"), default="off")
    parser.add_argument("--round-size", type=int, default=None)
    parser.add_argument("--warm-start")
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--seed", type=int, default=0, help="the search's seed (our arms)")
    parser.add_argument("--patience-counts", choices=COUNTS, default=COUNTS[0], help="what preemption's patience counts")
    parser.add_argument("--guided-search", action=argparse.BooleanOptionalAction, default=True,
                        help="MetaSchedule's search takes rounds once the model ranks well (autotune.search)")
    parser.add_argument("--guided-pool", type=float, default=PolicySettings.filter_guided_pool,
                        help="the candidate filter's --filter-guided-pool")
    parser.add_argument("--guided-generations", type=int, default=PolicySettings.filter_guided_generations,
                        help="the candidate filter's --filter-guided-generations")
    parser.add_argument("--guided-population", type=int, default=PolicySettings.filter_guided_population,
                        help="the candidate filter's --filter-guided-population")
    args = parser.parse_args()
    if args.arm == "autotune":
        out = autotune(args.workload, args.trials, args.work_dir, policies=args.policies, round_size=args.round_size,
                       warm_start=args.warm_start, target_name=args.target, seed=args.seed,
                       patience_counts=args.patience_counts, guided_search=args.guided_search,
                       guided_pool=args.guided_pool, guided_generations=args.guided_generations,
                       guided_population=args.guided_population)
    else:
        out = stock(args.workload, args.trials, args.work_dir, warm=args.arm == "warm_stock", target_name=args.target)
    print(json.dumps(out))

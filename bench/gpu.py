"""GPU check: the engine against stock MetaSchedule on an NVIDIA GPU, and its timings against isolation.

    python -m bench.gpu [--trials 64] [--candidates 48]   (bench/gpu_check.sh runs it)

For a matmul and a convolution: stock ``tune_tir`` (LocalBuilder with the fast import,
LocalRunner: one candidate at a time) and autotune's session with the parallel engine
(CUDA slots from NVML, several measurement processes per GPU, CUDA-event timing on
each worker's own stream), same budget, one after the other, each in its own process;
both final bests re-timed side by side. Then the engine's calibration on the GPU and a
fidelity check (random candidates at the controller's level, then alone). Writes
results/bench/gpu.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

OUT = Path("results/bench/gpu.json")
KERNELS = ("matmul512", "conv3x3_resnet18")


def arm(which: str, kernel_name: str, trials: int, work_dir: str) -> dict[str, Any]:
    """One tuning run on the GPU; the clock starts after imports."""
    from autotune.target import resolve_target
    from measure.kernels import kernel
    from measure.tvm_import import import_meta_schedule

    spec = resolve_target("cuda")
    mod = kernel(kernel_name)
    started = time.monotonic()
    ms = import_meta_schedule()
    target = spec.tvm_target()
    if which == "stock":
        builder = ms.builder.LocalBuilder(initializer=import_meta_schedule)
        db = ms.tune_tir(mod=mod, target=target, work_dir=work_dir, max_trials_global=trials, builder=builder,
                         runner=ms.runner.LocalRunner())
        report: dict[str, Any] = {}
        db_dir = work_dir
    else:
        from autotune.budget import split_budget
        from autotune.pipeline import run_tuning
        from autotune.tasks import Task
        from tvm.s_tir.analysis import estimate_tir_flops

        tasks = [Task(kernel_name, mod, 1, float(estimate_tir_flops(mod)))]
        session, db = run_tuning(tasks, split_budget(tasks, trials, 8), spec, target, Path(work_dir))
        report = session.engine_report
        db_dir = str(Path(work_dir) / "ranked")
    wall = time.monotonic() - started
    secs = [statistics.fmean(r.run_secs) for r in db.get_all_tuning_records() if r.run_secs]
    return {"wall_s": wall, "valid_trials": len(secs), "best_logged_s": min(secs, default=None), "db": db_dir,
            "engine": report}


def remeasure(kernel_name: str, dbs: dict[str, str]) -> dict[str, float | None]:
    """The arms' bests, rebuilt and timed in turns on the GPU."""
    import numpy as np
    import tvm

    from autotune.target import resolve_target
    from measure.kernels import kernel
    from measure.tvm_import import import_meta_schedule

    ms = import_meta_schedule()
    target, dev = resolve_target("cuda").tvm_target(), tvm.cuda(0)
    timers = {}
    for name, path in dbs.items():
        db = ms.database.JSONDatabase(work_dir=path)
        mod = kernel(kernel_name)
        top = db.get_top_k(db.commit_workload(mod), 1)
        if not top:
            continue
        sch = tvm.s_tir.Schedule(mod)
        top[0].trace.apply_to_schedule(sch, remove_postproc=False)
        lib = tvm.compile(sch.mod, target=target).jit()
        args = [tvm.runtime.tensor(np.random.rand(*[int(d) for d in a.shape]).astype(str(a.dtype)), dev)
                for a in top[0].args_info]
        f = lib.time_evaluator("main", dev, number=10, repeat=3, min_repeat_ms=50)
        timers[name] = (f, args)
    samples: dict[str, list[float]] = {n: [] for n in dbs}
    for _ in range(10):
        for name, (f, args) in timers.items():
            samples[name] += list(f(*args).results)
    return {n: float(np.median(s)) if s else None for n, s in samples.items()}


def engine_checks(kernel_name: str, count: int) -> dict[str, Any]:
    """Calibration curve on the GPU and engine-vs-isolated fidelity on random candidates."""
    from scipy.stats import kendalltau

    from autotune.target import resolve_target
    from measure.calibration import calibrate, sample_candidates
    from measure.factory import create
    from measure.kernels import kernel
    from measure.tvm_import import import_meta_schedule

    import_meta_schedule()
    spec = resolve_target("cuda")
    target = spec.tvm_target()
    candidates = sample_candidates(kernel(kernel_name), target, count, 0, task=kernel_name)
    engine = create("parallel", target_kind="cuda", threads=spec.num_cores)
    try:
        curve = calibrate(engine, target, candidates[:24], list(range(len(engine.lanes) + 1)))
        tuned = engine.measure(target, "cuda", candidates)
        alone = engine.measure_isolated(target, "cuda", candidates)
        report = engine.report()
    finally:
        engine.close()
    pairs = [(t.latency, a.latency) for t, a in zip(tuned, alone) if t.ok and a.ok]
    e, i = zip(*pairs)
    best = min(range(len(pairs)), key=lambda k: e[k])
    return {
        "slots": report["slots"], "calibration": curve, "level": report["dop_history"][-1]["level"],
        "candidates": len(pairs),
        "median_abs_rel_error": statistics.median(abs(a - b) / b for a, b in pairs),
        "kendall_tau": float(kendalltau(e, i).statistic),
        "best_gap": i[best] / min(i) - 1,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--candidates", type=int, default=48)
    parser.add_argument("--work-root", type=Path, default=Path("results/bench/work/gpu"))
    parser.add_argument("--arm", nargs=3, metavar=("ARM", "KERNEL", "WORK_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(arm(args.arm[0], args.arm[1], args.trials, args.arm[2])))
        return
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "trials": args.trials, "kernels": {}}
    for name in KERNELS:
        arms = {}
        for which in ("stock", "autotune"):
            work = args.work_root / name / which
            subprocess.run(["rm", "-rf", str(work)], check=True)
            work.mkdir(parents=True)
            out = subprocess.run([sys.executable, "-m", "bench.gpu", "--trials", str(args.trials), "--arm", which,
                                  name, str(work)], capture_output=True, text=True)
            arms[which] = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {
                "failure": (out.stderr.strip().splitlines() or ["exit %d" % out.returncode])[-1]}
            print(f"[gpu {name}] {which}: {arms[which]}", file=sys.stderr, flush=True)
        isolated = remeasure(name, {w: a["db"] for w, a in arms.items() if "db" in a})
        for w, a in arms.items():
            a["best_isolated_s"] = isolated.get(w)
        if all(a.get("wall_s") for a in arms.values()):
            arms["autotune"]["wall_ratio_stock_over_ours"] = arms["stock"]["wall_s"] / arms["autotune"]["wall_s"]
        results["kernels"][name] = {"arms": arms, "engine": engine_checks(name, args.candidates)}
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(results, indent=2))
    print(OUT.read_text())


if __name__ == "__main__":
    main()

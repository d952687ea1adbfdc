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
import traceback
from pathlib import Path
from typing import Any

from results.atomic import write_atomically

OUT = Path("results/bench/gpu.json")
KERNELS = ("matmul512", "conv3x3_resnet18")


def arm(which: str, kernel_name: str, trials: int, work_dir: str, target_name: str) -> dict[str, Any]:
    """One tuning run on the GPU; the clock starts after imports."""
    from autotune.target import resolve_target
    from measure.kernels import kernel
    from measure.tvm_import import import_meta_schedule

    spec = resolve_target(target_name)
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


def remeasure(kernel_name: str, dbs: dict[str, str], target_name: str) -> dict[str, float | None]:
    """The arms' bests, rebuilt and timed in turns on the GPU."""
    import numpy as np
    import tvm

    from autotune.target import resolve_target
    from measure.kernels import kernel
    from measure.tvm_import import import_meta_schedule

    ms = import_meta_schedule()
    spec = resolve_target(target_name)
    target, dev = spec.tvm_target(), spec.device()
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


def engine_checks(kernel_name: str, count: int, target_name: str) -> dict[str, Any]:
    """Calibration curve on the GPU and engine-vs-isolated fidelity on random candidates."""
    from scipy.stats import kendalltau

    from autotune.target import resolve_target
    from measure.calibration import calibrate, sample_candidates
    from measure.dop import DopController
    from measure.factory import create
    from measure.kernels import kernel
    from measure.tvm_import import import_meta_schedule

    import_meta_schedule()
    spec = resolve_target(target_name)
    target = spec.tvm_target()
    candidates = sample_candidates(kernel(kernel_name), target, count, 0, task=kernel_name)
    engine = create("parallel", target_kind=spec.kind, threads=spec.num_cores)
    try:
        max_level = engine.controller.max_level
        curve = calibrate(engine, target, candidates[:24], list(range(max_level + 1)))
        engine.controller = DopController.from_calibration(curve["curve"], max_level)
        tuned = engine.measure(target, spec.device_type, candidates)
        alone = engine.measure_isolated(target, spec.device_type, candidates)
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


def markdown(results: dict[str, Any]) -> str:
    """The side-by-side table of gpu.json."""
    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x * 1e3:.4f}"

    lines = [f"# GPU check ({results.get('device', '?')}, {results['date']}, {results['trials']} trials per arm)", "",
             "| kernel | stock wall s | autotune wall s | stock/ours | stock best ms | ours best ms "
             "| engine level | fidelity error | Kendall tau | best gap |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, k in results["kernels"].items():
        st, ours, eng = k["arms"].get("stock", {}), k["arms"].get("autotune", {}), k.get("engine", {})
        wall = [f"{a['wall_s']:.1f}" if "wall_s" in a else "failed" if a else "not run" for a in (st, ours)]
        ratio = f"{ours['wall_ratio_stock_over_ours']:.2f}x" if "wall_ratio_stock_over_ours" in ours else "-"
        if "level" in eng:
            fid = (str(eng["level"]), f"{eng['median_abs_rel_error']:.1%}", f"{eng['kendall_tau']:.3f}",
                   f"{eng['best_gap']:.1%}")
        else:
            fid = ("failed" if eng else "not run", "-", "-", "-")
        lines.append(f"| {name} | {wall[0]} | {wall[1]} | {ratio} | {ms(st.get('best_isolated_s'))} "
                     f"| {ms(ours.get('best_isolated_s'))} | " + " | ".join(fid) + " |")
    for name, k in results["kernels"].items():
        curve = k.get("engine", {}).get("calibration", {}).get("curve")
        if curve:
            lines += ["", f"Calibration on {name} (error against isolation, over candidates):", "",
                      "| level | mean error | median error | p90 error | candidates/s |", "|---|---|---|---|---|"]
            lines += [f"| {p['level']} | {p['error']:.2%} | {p.get('median_error', p['error']):.2%} | "
                      f"{p['p90_error']:.2%} | {p['candidates_per_s']:.2f} |" for p in curve]
    lines += [f"\n{results[key]}" for key in ("gpu_tests", "cut_short", "observed") if key in results]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--candidates", type=int, default=48)
    parser.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    parser.add_argument("--target", default="cuda", help="cuda here; cpu only to dry-run the script")
    parser.add_argument("--work-root", type=Path, default=Path("results/bench/work/gpu"))
    parser.add_argument("--table", action="store_true", help="only rewrite gpu.md from gpu.json")
    parser.add_argument("--arm", nargs=3, metavar=("ARM", "KERNEL", "WORK_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.table:
        write_atomically(OUT.with_suffix(".md"), markdown(json.loads(OUT.read_text())))
        return
    if args.arm:
        print(json.dumps(arm(args.arm[0], args.arm[1], args.trials, args.arm[2], args.target)))
        return
    from autotune.target import resolve_target

    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "target": args.target,
                               "device": resolve_target(args.target).device_name, "trials": args.trials, "kernels": {}}

    def save() -> None:
        """After every phase: a run cut short by its time limit still leaves what it measured."""
        OUT.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(OUT, json.dumps(results, indent=2))

    for name in args.kernels:
        arms: dict[str, Any] = {}
        results["kernels"][name] = {"arms": arms}
        for which in ("stock", "autotune"):
            work = args.work_root / name / which
            subprocess.run(["rm", "-rf", str(work)], check=True)
            work.mkdir(parents=True)
            out = subprocess.run([sys.executable, "-m", "bench.gpu", "--trials", str(args.trials), "--target",
                                  args.target, "--arm", which, name, str(work)], capture_output=True, text=True)
            arms[which] = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {
                "failure": "\n".join(out.stderr.strip().splitlines()[-15:]) or f"exit {out.returncode}"}
            print(f"[gpu {name}] {which}: {arms[which]}", file=sys.stderr, flush=True)
            save()
        isolated = remeasure(name, {w: a["db"] for w, a in arms.items() if "db" in a}, args.target)
        for w, a in arms.items():
            a["best_isolated_s"] = isolated.get(w)
        if all(a.get("wall_s") for a in arms.values()):
            arms["autotune"]["wall_ratio_stock_over_ours"] = arms["stock"]["wall_s"] / arms["autotune"]["wall_s"]
        save()
        try:
            results["kernels"][name]["engine"] = engine_checks(name, args.candidates, args.target)
        except Exception:  # noqa: BLE001 - record it and go on to the next kernel
            results["kernels"][name]["engine"] = {"failure": traceback.format_exc()}
        print(f"[gpu {name}] engine: {results['kernels'][name]['engine']}", file=sys.stderr, flush=True)
        save()
    write_atomically(OUT.with_suffix(".md"), markdown(results))
    print(OUT.read_text())


if __name__ == "__main__":
    main()

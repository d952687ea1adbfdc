"""Re-measure candidates side by side: ``python -m bench.remeasure [--target T] WORKLOAD NAME=DB_DIR[@INDEX] ...``.

Kernels: each named database's best record (or, with ``@INDEX``, its INDEX-th record in
commit order) is rebuilt as tuning builds it (weight-layout rewrite
blocks removed, as MetaSchedule measures); models: the model is compiled with each
arm's database. Then the arms are timed in turns (60 turns, each 3 repeats of at
least 100 ms), so that the host's slow drifts hit every arm alike. Printed as JSON: each arm's
median and its samples turn by turn, from which ``ratio_interval`` bootstraps how far the ratio
of two arms' medians can be trusted (blocks of turns resampled in pairs, as they were timed).

Why 60 turns in blocks of 10: this host's states last tens of seconds and some schedules fare
very differently in them. One convolution library, re-timed in eight passes of 10 turns back to
back, had medians of 1429-2341 us (two modes), and its ratio to another arm went 0.80-1.46 pass
to pass while each pass's own interval was a few percent wide. Ten turns span one state; sixty
span several, and resampling whole blocks keeps the interval honest about how few states that is.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.workloads import WORKLOADS, kernel, model_relax
from measure.build import build_candidate

TURNS = 60
BLOCK = 10  # consecutive turns that share a host state: the unit ``ratio_interval`` resamples


def _timer(workload: str, spec: str, target: Any, dev: Any) -> Any:
    """A callable that returns one turn's timings, or None if the run left no valid record."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    db_dir, _, index = spec.partition("@")
    db = ms.database.JSONDatabase(work_dir=db_dir)
    if WORKLOADS[workload].kind == "kernel":
        mod = kernel(workload)
        if not db.has_workload(mod):
            return None
        if index:
            lines = Path(db_dir, "database_tuning_record.json").read_text().splitlines()
            top = [ms.database.TuningRecord.from_json(json.loads(lines[int(index)])[1], db.commit_workload(mod))]
        else:
            top = db.get_top_k(db.commit_workload(mod), 1)
        if not top:
            return None
        sch = tvm.s_tir.Schedule(mod)
        top[0].trace.apply_to_schedule(sch, remove_postproc=False)
        lib = tvm.runtime.load_module(build_candidate(sch.mod, target, tempfile.mkdtemp()))  # as tuning built it
        args = [tvm.runtime.tensor(np.random.rand(*[int(d) for d in a.shape]).astype(str(a.dtype)), dev)
                for a in top[0].args_info]
        f = lib.time_evaluator(lib.entry_name, dev, number=1, repeat=3, min_repeat_ms=100)
        return lambda: f(*args).results
    from tvm import relax

    relax_mod, model = model_relax(workload)
    vm = relax.VirtualMachine(ms.relax_integration.compile_relax(db, relax_mod, target, None), dev)
    args = [tvm.runtime.tensor(t.numpy(), dev) for t in model.inputs]
    f = vm.time_evaluator("main", dev, number=10, repeat=3, min_repeat_ms=100)
    return lambda: f(*args).results


def remeasure(workload: str, arms: dict[str, str], target_name: str = "cpu") -> dict[str, dict[str, Any]]:
    """{"median": {arm: seconds or None}, "fastest": {arm: its quietest repeat, the statistic tuning ranks by},
    "turns": {arm: [[seconds of each repeat] per turn]}}."""
    from autotune.target import resolve_target
    from measure.tvm_import import import_meta_schedule

    spec = resolve_target(target_name)
    import_meta_schedule()
    target, dev = spec.tvm_target(), spec.device()
    timers = {arm: _timer(workload, path, target, dev) for arm, path in arms.items()}
    turns: dict[str, list[list[float]]] = {arm: [] for arm in arms}
    for _ in range(TURNS):
        for arm, timer in timers.items():
            if timer is not None:
                turns[arm].append([float(t) for t in timer()])
    return {"median": {arm: float(np.median(t)) if t else None for arm, t in turns.items()},
            "fastest": {arm: float(np.min(t)) if t else None for arm, t in turns.items()}, "turns": turns}


def ratio_interval(turns: list[list[float]], base: list[list[float]], level: float = 0.95,
                   resamples: int = 2000, block: int = 1) -> tuple[float, float]:
    """Bootstrap interval of median(turns) / median(base), resampling blocks of ``block`` consecutive turns
    in pairs.

    A turn of one arm and the same turn of the other were timed back to back, so they share the host's
    state; resampling them together keeps that pairing, and the interval is the timing noise left in the
    ratio (not the search's luck, which only other runs show). Consecutive turns share the host's slower
    states too: resampled as blocks, a state that lasted ten turns counts once, not ten times. (A last,
    shorter block is filled from the first turns, so every resample has as many turns as the timing.)
    """
    if len(turns) != len(base) or not turns:
        raise ValueError(f"need the same number of turns for both arms; got {len(turns)} and {len(base)}")
    blocks = -(-len(turns) // block)
    a, b = np.asarray(turns), np.asarray(base)
    starts = np.random.default_rng(0).integers(0, blocks, size=(resamples, blocks)) * block
    picks = (starts[:, :, None] + np.arange(block)).reshape(resamples, -1) % len(a)
    ratios = np.median(a[picks].reshape(resamples, -1), axis=1) / np.median(b[picks].reshape(resamples, -1), axis=1)
    lo, hi = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="re-time arms side by side; prints one JSON line")
    parser.add_argument("--target", default="cpu")
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("arms", nargs="+", metavar="NAME=DB_DIR[@INDEX]")
    args = parser.parse_args()
    print(json.dumps(remeasure(args.workload, dict(a.split("=", 1) for a in args.arms), args.target)))

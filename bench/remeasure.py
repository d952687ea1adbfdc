"""Re-measure a tuning run's final best in isolation: ``python -m bench.remeasure WORKLOAD WORK_DIR``.

Kernels: the best record is rebuilt and timed alone (30 repeats of at least 100 ms,
median). Models: the model is compiled with the run's database and timed (median).
"""

from __future__ import annotations

import json
import sys

import numpy as np

from bench.workloads import WORKLOADS, kernel, model_relax


def remeasure(workload: str, work_dir: str) -> float | None:
    from autotune.target import resolve_target
    from measure.tvm_import import import_meta_schedule

    spec = resolve_target("cpu")
    ms = import_meta_schedule()
    import tvm

    target, dev = spec.tvm_target(), tvm.cpu(0)
    db = ms.database.JSONDatabase(work_dir=work_dir)
    if WORKLOADS[workload].kind == "kernel":
        mod = kernel(workload)
        if not db.has_workload(mod):
            return None
        top = db.get_top_k(db.commit_workload(mod), 1)
        if not top:
            return None
        sch = tvm.s_tir.Schedule(mod)
        top[0].trace.apply_to_schedule(sch, remove_postproc=False)
        lib = tvm.compile(sch.mod, target=target)
        args = [tvm.runtime.tensor(np.random.rand(*[int(d) for d in a.shape]).astype(str(a.dtype)), dev)
                for a in top[0].args_info]
        timer = lib.jit().time_evaluator("main", dev, number=1, repeat=30, min_repeat_ms=100)
        return float(np.median(timer(*args).results))
    from tvm import relax

    relax_mod, model = model_relax(workload)
    vm = relax.VirtualMachine(ms.relax_integration.compile_relax(db, relax_mod, target, None), dev)
    args = [tvm.runtime.tensor(t.numpy(), dev) for t in model.inputs]
    return float(np.median(vm.time_evaluator("main", dev, number=10, repeat=30)(*args).results))


if __name__ == "__main__":
    print(json.dumps({"isolated_s": remeasure(sys.argv[1], sys.argv[2])}))

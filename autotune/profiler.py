"""Profile a compiled model: latency percentiles and throughput per batch size and thread count.

Each thread count is measured in its own process, pinned to that many cores with
``TVM_NUM_THREADS`` set before TVM starts, because the runtime's thread pool is sized
once per process. PyTorch eager runs in the same process on the same cores and
threads, so the two latencies compare like for like.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autotune.errors import AutotuneError
from results.profile import LatencyStats, Profile, ProfileEntry


@dataclass(frozen=True)
class ProfileJob:
    """What a profile worker measures: one library (with its expected hash) per batch size."""

    model_spec: str
    input_shape: list[int] | None
    libraries: dict[int, tuple[str, str]]
    target_kind: str
    device_name: str
    seconds_per_config: float = 1.0


def profile_model(job: ProfileJob, thread_counts: Sequence[int]) -> Profile:
    """Measure every (thread count, batch size); one worker process per thread count.

    PyTorch eager is measured beside the tuned model on CPU targets only: the torch
    build this project pins is a CPU build, so on a GPU it would not compare like for like.
    """
    entries: list[ProfileEntry] = []
    for threads in thread_counts:
        cores = sorted(os.sched_getaffinity(0))[:threads]
        payload = json.dumps({"job": job.__dict__, "threads": threads, "cores": cores})
        env = {**os.environ, "TVM_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
        proc = subprocess.run(
            [sys.executable, "-m", "autotune.profiler"], input=payload, capture_output=True, text=True, env=env
        )
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise AutotuneError(f"profiling with {threads} thread(s) failed: {tail}")
        for raw in json.loads(proc.stdout.strip().splitlines()[-1]):
            entries.append(ProfileEntry(
                hardware={"kind": "cpu" if job.target_kind == "llvm" else "cuda", "device": job.device_name,
                          "threads": threads, "cores": cores, "cpu_limit": None},
                batch_size=raw["batch_size"],
                latency_ms=LatencyStats.from_seconds(raw["tuned_s"]),
                throughput_per_s=raw["batch_size"] / (sum(raw["tuned_s"]) / len(raw["tuned_s"])),
                samples=len(raw["tuned_s"]),
                torch_eager_latency_ms=LatencyStats.from_seconds(raw["torch_s"]) if raw["torch_s"] else None,
            ))
    return Profile(job.model_spec, job.target_kind, tuple(entries))


def _measure_in_this_process(job: ProfileJob, threads: int, cores: list[int]) -> list[dict[str, Any]]:
    os.sched_setaffinity(0, cores)
    import torch

    torch.set_num_threads(threads)
    import tvm
    from tvm import relax

    from autotune.models.loader import load_model
    from results.integrity import load_verified_library

    model = load_model(job.model_spec)
    if job.input_shape:
        model = model.with_shape(job.input_shape)
    on_gpu = job.target_kind == "cuda"
    dev = tvm.cuda(0) if on_gpu else tvm.cpu(0)
    out = []
    for batch, (path, digest) in sorted(job.libraries.items(), key=lambda kv: int(kv[0])):
        variant = model.with_batch(int(batch))
        vm = relax.VirtualMachine(load_verified_library(path, digest), dev)
        args = [tvm.runtime.tensor(t.numpy(), dev) for t in variant.inputs]
        vm["main"](*args)
        start = time.perf_counter()
        vm["main"](*args)
        repeats = _repeats(time.perf_counter() - start, job.seconds_per_config)
        tuned = list(vm.time_evaluator("main", dev, number=1, repeat=repeats)(*args).results)
        eager = [] if on_gpu else _time_torch(variant, repeats)
        out.append({"batch_size": int(batch), "tuned_s": tuned, "torch_s": eager})
    return out


def _time_torch(model: Any, repeats: int) -> list[float]:
    import torch

    samples = []
    with torch.inference_mode():
        model.module(*model.inputs)
        for _ in range(repeats):
            start = time.perf_counter()
            model.module(*model.inputs)
            samples.append(time.perf_counter() - start)
    return samples


def _repeats(one_run_s: float, budget_s: float) -> int:
    return int(min(max(budget_s / max(one_run_s, 1e-6), 20), 500))


if __name__ == "__main__":
    request = json.loads(sys.stdin.read())
    job = ProfileJob(**request["job"])
    result = _measure_in_this_process(job, request["threads"], request["cores"])
    print(json.dumps(result))

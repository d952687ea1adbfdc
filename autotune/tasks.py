"""Tuning tasks: the distinct fused kernels of a model, with how often each runs and its FLOPs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass
class Task:
    """One kernel to tune. ``weight`` counts its calls per inference over all batch variants."""

    name: str
    mod: Any
    weight: int
    flops: float

    @property
    def share(self) -> float:
        """Work per inference pass this task accounts for (calls x FLOPs)."""
        return self.weight * self.flops


def extract_tasks(modules: Iterable[Any], target: Any) -> list[Task]:
    """Extract tasks from prepared Relax modules, merging identical kernels across modules."""
    import tvm_ffi
    from tvm.s_tir.analysis import estimate_tir_flops
    from tvm.s_tir.meta_schedule.relax_integration import extract_tasks as ms_extract

    tasks: list[Task] = []
    by_hash: dict[int, list[Task]] = {}
    for mod in modules:
        for extracted in ms_extract(mod, target):
            kernel = extracted.dispatched[0]
            bucket = by_hash.setdefault(tvm_ffi.structural_hash(kernel), [])
            same = next((t for t in bucket if tvm_ffi.structural_equal(t.mod, kernel)), None)
            if same is not None:
                same.weight += int(extracted.weight)
                continue
            name = _unique_name(extracted.task_name, {t.name for t in tasks})
            task = Task(name, kernel, int(extracted.weight), max(float(estimate_tir_flops(kernel)), 1.0))
            bucket.append(task)
            tasks.append(task)
    return tasks


def _unique_name(name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}_{n}"
    return candidate

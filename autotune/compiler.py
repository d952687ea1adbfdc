"""Compile a model with its tuning database, and check its numbers against PyTorch.

Compilation is MetaSchedule's own ``compile_relax``, so stock TVM given the same
database and module builds the same library.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autotune.errors import VerificationError
from autotune.models.loader import LoadedModel
from results.integrity import load_verified_library, sha256_of


def compile_to_library(database: Any, relax_mod: Any, target: Any, path: Path) -> str:
    """Compile ``relax_mod`` applying ``database`` and export it to ``path``; return its sha256."""
    from tvm.s_tir.meta_schedule.relax_integration import compile_relax

    executable = compile_relax(database, relax_mod, target, params=None)
    executable.export_library(str(path))
    return sha256_of(path)


@dataclass(frozen=True)
class Verification:
    """How far the compiled model's outputs are from PyTorch's, relative to the outputs' scale."""

    max_abs_error: float
    relative_error: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.relative_error <= self.tolerance


def verify_library(path: Path, sha256: str, model: LoadedModel, device: Any, tolerance: float) -> Verification:
    """Run the library on the model's example inputs; raise ``VerificationError`` beyond ``tolerance``."""
    import torch
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(load_verified_library(path, sha256), device)
    ours = _flatten(vm["main"](*[tvm.runtime.tensor(t.numpy(), device) for t in model.inputs]))
    with torch.inference_mode():
        reference = _flatten(model.module(*model.inputs))
    if len(ours) != len(reference):
        raise VerificationError(f"compiled model returns {len(ours)} outputs, PyTorch returns {len(reference)}")
    abs_err = max(float(np.max(np.abs(a - b), initial=0.0)) for a, b in zip(ours, reference))
    scale = max(float(np.max(np.abs(b), initial=0.0)) for b in reference)
    result = Verification(abs_err, abs_err / max(scale, 1e-12), tolerance)
    if not result.passed:
        raise VerificationError(
            f"compiled model differs from PyTorch at batch {model.inputs[0].shape[0]}: relative error "
            f"{result.relative_error:.2e} exceeds tolerance {tolerance:.1e} (max abs error {abs_err:.2e})"
        )
    return result


def _flatten(value: Any) -> list[np.ndarray]:
    import torch

    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return [a for v in value for a in _flatten(v)]
    if isinstance(value, torch.Tensor):
        return [value.detach().numpy()]
    return [value.numpy()]

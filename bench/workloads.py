"""The tuning benchmark's workloads: two single kernels and one whole model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # "kernel" (one PrimFunc) or "model" (a zoo model at batch 1)
    description: str


WORKLOADS = {
    "matmul512": Workload("matmul512", "kernel", "512x512x512 fp32 matmul"),
    "conv3x3_resnet18": Workload("conv3x3_resnet18", "kernel", "ResNet-18 layer1 conv: 1x64x56x56, 64 filters 3x3, pad 1"),
    "mlp": Workload("mlp", "model", "zoo:mlp (784-512-256-10) at batch 1"),
}


def kernel(name: str) -> Any:
    """The workload's PrimFunc as an IRModule."""
    import tvm
    from tvm import te, topi

    if name == "matmul512":
        a = te.placeholder((512, 512), name="A")
        b = te.placeholder((512, 512), name="B")
        k = te.reduce_axis((0, 512), name="k")
        c = te.compute((512, 512), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
        args = [a, b, c]
    elif name == "conv3x3_resnet18":
        data = te.placeholder((1, 64, 56, 56), name="data")
        weight = te.placeholder((64, 64, 3, 3), name="weight")
        args = [data, weight, topi.nn.conv2d_nchw(data, weight, 1, 1, 1)]
    else:
        raise KeyError(name)
    return tvm.IRModule({"main": te.create_prim_func(args)})


def model_relax(name: str) -> tuple[Any, Any]:
    """(Relax module, LoadedModel) for a model workload at batch 1."""
    from autotune.frontend import to_relax
    from autotune.models.loader import export, load_model

    model = load_model(f"zoo:{name}")
    return to_relax(export(model), model.spec), model

"""The tuning benchmark's workloads: two single kernels and one whole model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from measure.kernels import kernel  # noqa: F401  (re-exported for the arms)


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # "kernel" (one PrimFunc) or "model" (a zoo model at batch 1)
    description: str


WORKLOADS = {
    "matmul512": Workload("matmul512", "kernel", "512x512x512 fp32 matmul"),
    "conv3x3_resnet18": Workload("conv3x3_resnet18", "kernel", "ResNet-18 layer1 conv: 1x64x56x56, 64 filters 3x3, pad 1"),
    "mlp": Workload("mlp", "model", "zoo:mlp (784-512-256-10) at batch 1"),
    "resnet18": Workload("resnet18", "model", "zoo:resnet18 at batch 1, all 27 tasks"),
    "bert_layer": Workload("bert_layer", "model", "zoo:bert_layer (one encoder layer) at batch 1, all 18 tasks"),
}


def model_relax(name: str) -> tuple[Any, Any]:
    """(Relax module, LoadedModel) for a model workload at batch 1."""
    from autotune.frontend import to_relax
    from autotune.models.loader import export, load_model

    model = load_model(f"zoo:{name}")
    return to_relax(export(model), model.spec), model

"""Run an opened artifact's model on NumPy arrays of any batch size.

An artifact holds one library per compiled batch size; callers (the CLI, the model server)
should not have to care which. A batch of ``n`` items runs on the smallest compiled batch
that holds it, zero-padded, with the outputs sliced back to ``n`` rows; a batch above the
largest compiled size runs as chunks of that size. Inputs and outputs are batch-major.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from results.artifact import MANIFEST, Artifact
from results.errors import ArtifactError, InputMismatch


class ArtifactModel:
    """A callable model over a verified artifact, caching one Relax VM per batch size.

    Not safe to call from several threads at once: the model server serialises calls.

    Args:
        artifact: an artifact opened (and so hash-checked) by ``results.artifact.open_artifact``.
    """

    def __init__(self, artifact: Artifact) -> None:
        """Raises ``ArtifactError`` where the manifest does not describe the model's inputs and target."""
        _check_model_manifest(artifact.path / MANIFEST, artifact.manifest)
        self.artifact = artifact
        self.inputs: list[dict[str, Any]] = artifact.manifest["model"]["inputs"]
        self.batch_sizes = artifact.batch_sizes
        self._vms: dict[int, Any] = {}

    def check(self, arrays: Sequence[np.ndarray]) -> int:
        """The batch size of ``arrays``, after checking them against the manifest's inputs.

        Raises:
            InputMismatch: wrong number of arrays, or one whose dtype, rank, per-item shape
                or batch size does not fit.
        """
        if len(arrays) != len(self.inputs):
            raise InputMismatch(f"the model takes {len(self.inputs)} input(s); got {len(arrays)}")
        batch = None
        for i, (array, want) in enumerate(zip(arrays, self.inputs)):
            label = f"input {i} ({want['name']})" if want.get("name") else f"input {i}"
            expected = f"[batch, {', '.join(map(str, want['shape'][1:]))}] {want['dtype']}"
            if not isinstance(array, np.ndarray):
                raise InputMismatch(f"{label} is a {type(array).__name__}; expected an array {expected}")
            shape_fits = array.ndim == len(want["shape"]) and list(array.shape[1:]) == want["shape"][1:]
            if not shape_fits or str(array.dtype) != want["dtype"]:
                raise InputMismatch(f"{label} has shape {list(array.shape)} {array.dtype}; expected {expected}")
            if array.shape[0] < 1:
                raise InputMismatch(f"{label} has batch size 0; expected at least 1 item")
            if batch is not None and array.shape[0] != batch:
                raise InputMismatch(f"{label} has batch size {array.shape[0]}; input 0 has {batch}, they must agree")
            batch = array.shape[0]
        return int(batch)

    def __call__(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The model's outputs for ``arrays`` (one per input, sharing a batch size of at least 1)."""
        n = self.check(arrays)
        largest = self.batch_sizes[-1]
        chunks = [self._run_padded([a[start:start + largest] for a in arrays]) for start in range(0, n, largest)]
        if len(chunks) == 1:
            return chunks[0]
        return [np.concatenate(parts) for parts in zip(*chunks)]

    def warm_up(self) -> None:
        """Load every batch size's VM and run it once on zeros.

        A server calls this before taking requests so the first request pays neither the
        library load nor first-call costs, and a library that will not load fails at start.
        """
        for batch in self.batch_sizes:
            self._run_padded([np.zeros([batch, *spec["shape"][1:]], dtype=spec["dtype"]) for spec in self.inputs])

    def _run_padded(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Run a batch no larger than the largest compiled one, padding it up to a compiled size."""
        import tvm

        n = arrays[0].shape[0]
        batch = min(b for b in self.batch_sizes if b >= n)
        if batch > n:
            arrays = [np.concatenate([a, np.zeros((batch - n, *a.shape[1:]), dtype=a.dtype)]) for a in arrays]
        vm, device = self._vm(batch)
        result = vm["main"](*[tvm.runtime.tensor(np.ascontiguousarray(a), device) for a in arrays])
        items = result if not hasattr(result, "numpy") else [result]
        return [item.numpy()[:n] for item in items]

    def _vm(self, batch: int) -> tuple[Any, Any]:
        """The cached VM for ``batch`` and its device, loading the library on first use."""
        import tvm
        from tvm.runtime.vm import VirtualMachine

        device = tvm.cuda(0) if self.artifact.manifest["target"]["kind"] == "cuda" else tvm.cpu(0)
        if batch not in self._vms:
            library = self.artifact.load_library(batch)
            try:
                self._vms[batch] = VirtualMachine(library, device)
            except Exception as err:  # TVM's own error types: e.g. a cuda artifact on a host without the GPU
                reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise ArtifactError(f"cannot start the batch-{batch} library of {self.artifact.path} "
                                    f"on {device}: {reason}") from None
        return self._vms[batch], device


def _check_model_manifest(where: Path, manifest: dict[str, Any]) -> None:
    """The manifest's ``model`` inputs and ``target`` kind, which running the model reads."""
    model, target = manifest.get("model"), manifest.get("target")
    inputs = model.get("inputs") if isinstance(model, dict) else None
    if not isinstance(inputs, list) or not inputs or not all(_is_input(item) for item in inputs):
        raise ArtifactError(f"{where} has no 'model' object whose 'inputs' list each input's 'shape' "
                            f"([batch, positive sizes...]) and numeric 'dtype'; expected one describing the model")
    if not isinstance(target, dict) or not isinstance(target.get("kind"), str):
        raise ArtifactError(f"{where} has no 'target' object with a 'kind' string; expected one naming the target "
                            f"the libraries were compiled for (llvm, cuda)")


def _is_input(item: Any) -> bool:
    """One ``model.inputs`` entry: ``{"shape": [batch, d1...], "dtype": ...}``."""
    if not isinstance(item, dict) or not isinstance(item.get("dtype"), str):
        return False
    shape = item.get("shape")
    if not isinstance(shape, list) or not shape or not all(type(d) is int and d >= 1 for d in shape):
        return False
    try:
        return np.dtype(item["dtype"]).kind in "biufc"
    except (TypeError, ValueError):
        return False

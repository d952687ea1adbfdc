"""Run a saved artifact on NumPy inputs, after its hashes check out."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from autotune.errors import UsageError
from results.artifact import open_artifact


def run_artifact(path: str | Path, input_files: Sequence[str | Path]) -> list[np.ndarray]:
    """Outputs of the artifact's model for the inputs in ``input_files`` (.npy, one per model input).

    The batch size of the inputs picks the library; shapes and dtypes must match the manifest.
    """
    artifact = open_artifact(path)
    spec = artifact.manifest["model"]["inputs"]
    if len(input_files) != len(spec):
        raise UsageError(f"the model takes {len(spec)} input(s); got {len(input_files)} --input file(s)")
    arrays = []
    for file, want in zip(input_files, spec):
        try:
            array = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise UsageError(f"cannot read input {file}: {err}; expected a .npy file") from None
        if list(array.shape[1:]) != want["shape"][1:] or str(array.dtype) != want["dtype"]:
            raise UsageError(f"input {file} has shape {list(array.shape)} {array.dtype}; expected "
                             f"[batch, {', '.join(map(str, want['shape'][1:]))}] {want['dtype']}")
        arrays.append(array)
    batch = int(arrays[0].shape[0])
    if batch not in artifact.batch_sizes:
        raise UsageError(f"input batch size {batch} is not compiled in this artifact; it has {artifact.batch_sizes}")
    import tvm
    from tvm import relax

    device = tvm.cuda(0) if artifact.manifest["target"]["kind"] == "cuda" else tvm.cpu(0)
    vm = relax.VirtualMachine(artifact.load_library(batch), device)
    result = vm["main"](*[tvm.runtime.tensor(a, device) for a in arrays])
    items = result if not hasattr(result, "numpy") else [result]
    return [item.numpy() for item in items]

"""Run a saved artifact on inputs read from .npy files, after its hashes check out."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from autotune.errors import UsageError
from results.artifact import open_artifact
from results.errors import InputMismatch
from results.inference import ArtifactModel


def run_artifact(path: str | Path, input_files: Sequence[str | Path]) -> list[np.ndarray]:
    """Outputs of the artifact's model for the inputs in ``input_files`` (.npy, one per model input).

    Any batch size of at least 1 runs (see ``results.inference``); shapes and dtypes must
    match the manifest. Problems with the inputs become ``UsageError`` lines that name the
    ``--input`` files, since that is what a CLI user can fix.
    """
    model = ArtifactModel(open_artifact(path))
    if len(input_files) != len(model.inputs):
        raise UsageError(f"the model takes {len(model.inputs)} input(s); got {len(input_files)} --input file(s)")
    arrays = []
    for file in input_files:
        try:
            arrays.append(np.load(file, allow_pickle=False))
        except EOFError:  # numpy's word for a file with no header at all
            raise UsageError(f"cannot read input {file}: it is empty; expected a .npy file") from None
        except (OSError, ValueError) as err:
            raise UsageError(f"cannot read input {file}: {err}; expected a .npy file") from None
    try:
        return model(arrays)
    except InputMismatch as err:
        raise UsageError(f"{err} (--input {' '.join(map(str, input_files))})") from None

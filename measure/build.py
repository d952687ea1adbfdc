"""Building one candidate into a shared library, run inside a warm build worker.

The library is linked here, in parallel on the build workers, so that a measurement
worker only has to ``dlopen`` it (stock MetaSchedule exports a tar that every
measurement re-links with the system compiler). The passes are those of
MetaSchedule's ``default_build``, without its import of the tensor-intrinsic registry:
a candidate arrives already scheduled, so the worker never needs the registry, and
skipping it saves ~7 s of TVMScript parsing per worker.
"""

from __future__ import annotations

import os
import uuid
from typing import Any


def build_candidate(mod: Any, target: Any, out_dir: str) -> str:
    """Compile ``mod`` for ``target``; return the library's path."""
    from tvm import tirx
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    path = os.path.join(out_dir, f"candidate-{uuid.uuid4().hex}.so")
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    tirx.build(mod, target).export_library(path)
    return path

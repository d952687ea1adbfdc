"""Building one candidate into a shared library, run inside a warm build worker.

The library is linked here, in parallel on the build workers, so that a measurement
worker only has to ``dlopen`` it (stock MetaSchedule exports a tar that every
measurement re-links with the system compiler).
"""

from __future__ import annotations

import os
import uuid
from typing import Any


def build_candidate(mod: Any, target: Any, out_dir: str) -> str:
    """Compile ``mod`` for ``target`` as MetaSchedule's default builder does; return the library's path."""
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build

    path = os.path.join(out_dir, f"candidate-{uuid.uuid4().hex}.so")
    default_build(mod, target, None).export_library(path)
    return path

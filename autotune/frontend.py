"""From an exported PyTorch program to the Relax module MetaSchedule tunes and compiles.

Task extraction must see the module after the same passes ``compile_relax`` runs
before it applies the database (library dispatch, legalize, fuse); otherwise the
database keys of the tuned tasks do not match at compile time.
"""

from __future__ import annotations

from typing import Any

from autotune.errors import UsageError


def to_relax(program: Any, spec: str) -> Any:
    """Import a ``torch.export`` program into a Relax module with weights bound as constants."""
    from tvm.relax.frontend.torch import from_exported_program

    try:
        return from_exported_program(program)
    except Exception as err:
        first = next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise UsageError(f"TVM cannot import {spec}: {first.strip()}") from err


def prepare_for_tuning(mod: Any, target: Any) -> Any:
    """Apply ``compile_relax``'s fusion prefix so extracted tasks match its database queries."""
    import tvm
    from tvm import relax
    from tvm.relax import pipeline

    try:
        dispatch = pipeline.library_dispatch_passes(target)
    except (ValueError, AttributeError):
        dispatch = []
    passes = tvm.transform.Sequential(
        [
            *dispatch,
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )
    with target, tvm.transform.PassContext(opt_level=3):
        return passes(mod)

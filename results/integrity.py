"""Hashes that stand between a file on disk and native code loaded from it."""

from __future__ import annotations

import hashlib
from pathlib import Path

from results.errors import ArtifactError


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_hash(path: str | Path, expected: str) -> None:
    """Raise ``ArtifactError`` unless ``path`` exists and hashes to ``expected``."""
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"artifact file {path} is missing")
    actual = sha256_of(path)
    if actual != expected:
        raise ArtifactError(f"artifact file {path} has sha256 {actual[:12]}..., the manifest expects {expected[:12]}...; refusing to load it")


def load_verified_library(path: str | Path, expected: str) -> object:
    """Load a compiled library only after its hash matches, just before loading."""
    check_hash(path, expected)
    import tvm

    return tvm.runtime.load_module(str(path))

"""Hashes that stand between a file on disk and native code loaded from it.

What is loaded must be the very bytes that were hashed. A library is therefore read once,
through a descriptor that refuses a symbolic link, hashed, and written to a private folder
that only this process can write, and the copy is what is loaded: a file swapped or rewritten
in the artifact between the check and the load is never run.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import tempfile
from pathlib import Path

from results.errors import ArtifactError


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verified_bytes(path: str | Path, expected: str) -> bytes:
    """The content of ``path``, a regular file and no link, once it hashes to ``expected``.

    Raises:
        ArtifactError: the file is missing, a link or not a regular file, or its hash differs.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise ArtifactError(f"artifact file {path} is missing") from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ArtifactError(f"artifact file {path} is a symbolic link; expected a regular file, refusing it") from None
        raise ArtifactError(f"cannot read artifact file {path}: {err.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ArtifactError(f"artifact file {path} is not a regular file; refusing it")
        data = f.read()
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise ArtifactError(f"artifact file {path} has sha256 {actual[:12]}..., the manifest expects {expected[:12]}...; refusing to load it")
    return data


def check_hash(path: str | Path, expected: str) -> None:
    """Raise ``ArtifactError`` unless ``path`` is a regular file that hashes to ``expected``."""
    verified_bytes(path, expected)


def load_verified_library(path: str | Path, expected: str) -> object:
    """Load a compiled library from a private copy of the bytes that matched ``expected``."""
    data = verified_bytes(path, expected)
    import tvm

    with tempfile.TemporaryDirectory(prefix="autotune-lib-") as private:  # mode 0700: no one else can swap the copy
        copy = Path(private) / Path(path).name
        copy.write_bytes(data)
        return tvm.runtime.load_module(str(copy))  # the loader maps it now; the copy may go once loaded

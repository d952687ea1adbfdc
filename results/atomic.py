"""Writing a file or a folder so that a reader sees the old content or the new, never half of it."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import io
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

RENAME_EXCHANGE = 2  # linux/fs.h


def current_umask() -> int:
    """The process's umask, read without changing it where Linux tells it; elsewhere set to owner-only for an
    instant and put back (a file another thread makes meanwhile is then too private, never too open)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def write_atomically(path: str | Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to a temporary file beside ``path``, then rename it over ``path``.

    The file keeps the mode of the file it replaces, or gets the one a plain ``open`` would give a new
    file (``mkstemp`` makes it owner-only). ``mkstemp`` also never follows a link or reuses a name,
    so neither a planted link nor a second writer can take the temporary file over.
    """
    path = Path(path)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~current_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_figure(figure: Any, path: str | Path) -> None:
    """Write a matplotlib ``figure`` to ``path`` as PNG, atomically (a plot is rewritten while a run goes on)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    write_atomically(path, buffer.getvalue())


def swap_into_place(folder: Path, final: Path) -> None:
    """Put the complete ``folder`` at ``final``. A folder already there is swapped out in one step, so a
    reader or a kill finds the old or the new, never neither; it is left at ``folder`` for the caller to remove."""
    if final.exists():
        _exchange(folder, final)
    else:
        os.replace(folder, final)


def claim_staging(final: Path) -> tuple[Path, int]:
    """A fresh hidden folder beside ``final`` (owner-only, as ``mkdtemp`` makes it) and a lock on it that its
    writer holds while it lives. A folder nobody holds was left by a writer that was killed: it is removed first."""
    final.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{final.name}.tmp-"
    for folder in final.parent.glob(f"{prefix}*"):
        with _locked(folder) as abandoned:
            if abandoned:
                shutil.rmtree(folder, ignore_errors=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=final.parent))
    lock = os.open(path, os.O_RDONLY)
    fcntl.flock(lock, fcntl.LOCK_EX)
    return path, lock


@contextmanager
def staged_folder(final: str | Path) -> Iterator[Path]:
    """A fresh folder beside ``final`` to fill; swapped into place when the block ends without an error, and
    removed either way (holding, after a swap, the folder it replaced). It takes the permissions the umask
    gives a new folder, so another user can warm-start from a saved model."""
    final = Path(final)
    staging, lock = claim_staging(final)
    try:
        os.chmod(staging, 0o777 & ~current_umask())
        yield staging
        swap_into_place(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(lock)


@contextmanager
def _locked(folder: Path) -> Iterator[bool]:
    """Whether ``folder``'s lock could be taken (no live writer holds it), holding it meanwhile."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        yield False
        return
    try:
        yield True
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> None:
    """Swap two paths in one step (Linux ``renameat2``), so a reader or a kill never finds ``b`` absent.

    Where the call is missing (another OS, an old C library, a file system without it), the
    swap takes two renames and ``b`` is absent between them.
    """
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        at_fdcwd = -100
        if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), RENAME_EXCHANGE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EPERM):
            raise OSError(err, os.strerror(err), str(b))
    parking = Path(tempfile.mkdtemp(prefix=f".{b.name}.old-", dir=b.parent))
    os.replace(b, parking / b.name)
    os.replace(a, b)
    os.replace(parking / b.name, a)
    parking.rmdir()

"""Writing a file so that a reader sees the old content or the new, never half of it."""

from __future__ import annotations

import io
import os
import stat
import tempfile
from pathlib import Path
from typing import Any


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

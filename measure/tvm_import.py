"""Import TVM's MetaSchedule in seconds instead of minutes.

Importing ``tvm.s_tir.tensor_intrin`` parses a few hundred TVMScript functions; each
parse calls ``inspect.stack()``, and for every frame without a source file (frozen
importlib frames) ``inspect.getmodule`` scans all of ``sys.modules``. With torch
loaded (every ``import tvm`` loads it) that is ~2,000 modules x ~30,000 frames: 95 s
measured on a 2-core machine, long enough for every stock build worker to hit its
30 s timeout. Remembering the frames that have no module makes it ~7 s.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from types import ModuleType


@contextlib.contextmanager
def _remember_moduleless_frames() -> Iterator[None]:
    original = inspect.getmodule
    misses: set[str] = set()

    def getmodule(obj: object, _filename: str | None = None) -> ModuleType | None:
        key = _filename or getattr(getattr(obj, "f_code", None), "co_filename", None)
        if key in misses:
            return None
        found = original(obj, _filename)
        if found is None and key:
            misses.add(key)
        return found

    inspect.getmodule = getmodule
    try:
        yield
    finally:
        inspect.getmodule = original


def import_meta_schedule() -> ModuleType:
    """Return ``tvm.s_tir.meta_schedule`` with its tensor intrinsics registered, fast.

    Safe to call in any process, any number of times; build workers call it from
    their initializer.
    """
    with _remember_moduleless_frames():
        import tvm.s_tir.tensor_intrin  # noqa: F401  (registers intrinsics)
        from tvm.s_tir import meta_schedule
    return meta_schedule

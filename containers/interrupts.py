"""SIGTERM as Ctrl-C, for commands that start containers.

Local model servers run in sessions of their own, and Docker containers are the engine's:
both outlive a command ended by SIGTERM's default action, holding their cores and ports.
Inside ``sigterm_as_interrupt`` SIGTERM raises ``KeyboardInterrupt`` instead, so the
``finally`` blocks that stop them run. Imports nothing of the project.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises ``KeyboardInterrupt`` in the main thread, as Ctrl-C does, while the block runs.

    Only the first: the cleanup it starts is not cut short by another. Elsewhere than the main
    thread (which alone may handle signals) nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)

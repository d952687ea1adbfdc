"""Progress for a person (a live table on stderr) or for nobody (``--quiet`` / ``--json``)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from autotune.session import TaskState


class SilentProgress:
    """Shows nothing; used for ``--quiet``, ``--json`` and library callers."""

    def on_phase(self, phase: str) -> None:
        pass

    def on_tuning_start(self, states: Sequence[TaskState], warning: str | None) -> None:
        pass

    def on_round_end(self, states: Sequence[TaskState], elapsed_s: float, model: dict[str, Any]) -> None:
        pass


class LiveProgress:
    """A live view: trials done of budget, best latency per task, elapsed and estimated time left."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self._live: Live | None = None
        self._started = time.monotonic()
        self._start_trials = 0

    def on_phase(self, phase: str) -> None:
        self._stop_live()
        self.console.log(f"{phase}")

    def on_tuning_start(self, states: Sequence[TaskState], warning: str | None) -> None:
        if warning:
            self.console.print(f"[bold yellow]warning:[/] {warning}")
        resumed = sum(s.resumed for s in states)
        budget = sum(s.budget for s in states)
        self.console.log(f"tuning {len(states)} tasks, {budget} trials" + (f" ({resumed} found in the database)" if resumed else ""))
        self._started = time.monotonic()
        self._start_trials = sum(s.proposed for s in states)
        self._live = Live(self._render(states, 0.0, {}), console=self.console, refresh_per_second=2, transient=False)
        self._live.start()

    def on_round_end(self, states: Sequence[TaskState], elapsed_s: float, model: dict[str, Any]) -> None:
        if self._live is not None:
            self._live.update(self._render(states, elapsed_s, model))

    def _stop_live(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
            self.console.line()

    def _render(self, states: Sequence[TaskState], elapsed_s: float, model: dict[str, Any]) -> Group:
        done = sum(s.proposed for s in states)
        budget = sum(s.budget for s in states)
        new = done - self._start_trials
        left = sum(s.remaining for s in states if not s.finished)
        eta = f"{left * elapsed_s / new:.0f} s" if new else "-"
        table = Table(box=None, pad_edge=False)
        for col in ("task", "trials", "screened", "best (us)", "errors", "stopped"):
            table.add_column(col, justify="left" if col in ("task", "stopped") else "right")
        for s in states:
            best = "-" if math.isinf(s.best_s) else f"{s.best_s * 1e6:.1f}"
            table.add_row(s.task.name, f"{s.proposed}/{s.budget}", str(s.screened), best, str(s.errors), s.stopped)
        tau = model.get("tau")
        quality = "" if tau is None else f"   model tau {tau:+.2f}" + ("   filtering" if model.get("filtering") else "")
        head = Text(f"trials {done}/{budget}   elapsed {elapsed_s:.0f} s   left ~{eta}{quality}")
        return Group(head, table)

"""The QoE Analyst (manager side): takes QoE targets from clients, keeps the performance table.

Targets may be set, changed and removed while the manager runs; every change is checked
here once, so a bad value from a client is one clear error and never reaches Algorithm 1.
"""

from __future__ import annotations

import math
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from containers.errors import ScenarioError, UnknownContainer
from containers.qoe.algorithm import Classification


def check_target(name: str, value: Any) -> float:
    """``value`` as a target in ms, or ``ScenarioError`` naming the container and what was given."""
    try:
        ms = float(value)
    except (TypeError, ValueError):
        raise ScenarioError(f"QoE target for {name} must be a number of milliseconds; got {value!r}") from None
    if not math.isfinite(ms) or ms <= 0:
        raise ScenarioError(f"QoE target for {name} must be a positive number of milliseconds; got {value!r}")
    return ms


@dataclass
class Row:
    """One container's line in the performance table."""

    name: str
    target_ms: float | None
    response_ms: float | None = None
    qoe_class: str = "-"
    quality_ms: float | None = None
    usage_cpus: float | None = None
    limit_cpus: float | None = None
    state: str = "running"


@dataclass
class QoeAnalyst:
    """Targets per container and the latest performance table, safe to use from a control thread."""

    targets: dict[str, float] = field(default_factory=dict)
    table: dict[str, Row] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def register(self, name: str, target_ms: Any | None) -> None:
        with self._lock:
            self.table[name] = Row(name, None)
            if target_ms is not None:
                self.targets[name] = self.table[name].target_ms = check_target(name, target_ms)

    def set_target(self, name: str, target_ms: Any) -> float:
        ms = check_target(name, target_ms)
        with self._lock:
            self._known(name)
            self.targets[name] = self.table[name].target_ms = ms
        return ms

    def remove_target(self, name: str) -> None:
        with self._lock:
            self._known(name)
            self.targets.pop(name, None)
            self.table[name].target_ms = None
            self.table[name].qoe_class = "-"

    def target(self, name: str) -> float | None:
        with self._lock:
            return self.targets.get(name)

    def record(self, row: Row) -> None:
        with self._lock:
            self.table[row.name] = row

    def drop(self, name: str) -> None:
        with self._lock:
            self.targets.pop(name, None)
            if name in self.table:
                self.table[name].state = "dropped"

    def note(self, t: float, kind: str, name: str, detail: str = "") -> None:
        with self._lock:
            self.events.append({"t": round(t, 2), "event": kind, "container": name, "detail": detail})

    def report(self, c: Classification | None) -> dict[str, Any]:
        """The performance table and class sums, as the status file and the final record show them."""
        with self._lock:
            rows = [asdict(r) for r in self.table.values()]
        sums = {"G": c.q_g, "S": c.satisfied, "B": c.q_b} if c else None
        counts = {k: sum(1 for r in rows if r["qoe_class"] == k) for k in "GSB"}
        return {"containers": rows, "counts": counts, "quality_sums": sums, "events": self.events[-20:]}

    def _known(self, name: str) -> None:
        if name not in self.table:
            raise UnknownContainer(f"no container named {name!r}; managed: {', '.join(self.table) or 'none'}")

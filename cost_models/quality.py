"""How well the latency model ranks what it has not seen yet.

Each round, the model scores a task's proposals before they are measured; once
measured, the Kendall rank correlation between those scores and the measured
throughputs says whether the model can be trusted to drop candidates.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RankQuality:
    """Per-round rank correlation of predictions against measurements."""

    rounds: list[dict[str, Any]] = field(default_factory=list)

    def record(self, task: str, predicted: Sequence[float], latencies: Sequence[float],
               trained: bool) -> float | None:
        """Kendall tau of ``predicted`` scores against measured throughput (1 / latency).

        Failed candidates (infinite latency) are left out; fewer than 3 measured gives None.
        """
        from scipy.stats import kendalltau

        pairs = [(p, 1.0 / t) for p, t in zip(predicted, latencies) if math.isfinite(t) and t > 0]
        tau = None
        if len(pairs) >= 3:
            value = kendalltau([p for p, _ in pairs], [m for _, m in pairs]).statistic
            tau = None if math.isnan(value) else float(value)
        self.rounds.append({"task": task, "measured": len(pairs), "tau": tau, "trained": trained})
        return tau

    def recent_tau(self, last: int = 4) -> float | None:
        """Mean tau of the last ``last`` rounds the trained model scored (None before any)."""
        taus = [r["tau"] for r in self.rounds if r["trained"] and r["tau"] is not None][-last:]
        return statistics.fmean(taus) if taus else None

    def report(self) -> dict[str, Any]:
        trained = [r["tau"] for r in self.rounds if r["trained"] and r["tau"] is not None]
        return {"mean_tau_trained": statistics.fmean(trained) if trained else None, "rounds": self.rounds}

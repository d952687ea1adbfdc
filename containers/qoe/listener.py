"""DQoES Algorithm 2: how long to wait before the next run of Algorithm 1.

The adaptive listener doubles its interval after ``converge_rounds`` (3) iterations in a row
in which both G's and B's summed quality gap moved towards zero, resets it to the initial
interval at once when the number of satisfied containers drops (a container joined, or one
misbehaves), and otherwise keeps it. A fixed listener, its baseline, never changes.

Two readings of the paper's conditions for measured, noisy response times (both measured
in ``bench/qoe.py``; ``margin=0`` gives the strict reset rule):

- "Moved towards zero" allows the tolerance alpha (a gap that grew by less than alpha of
  itself holds), and an iteration in which Algorithm 1 changed no limit counts as
  converging: nothing is left to adjust. With strict inequalities a settled system whose
  unachievable containers keep a steady gap would never back off.
- "The satisfied count drops" counts containers within ``alpha + margin`` of their target.
  A container at the edge of its band flickers in and out of S from one window to the
  next; resetting on every flicker kept the interval at its minimum in a system that had
  long converged. A container that really degrades, or a new one, moves further (and a
  join resets the interval anyway).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from containers.errors import ScenarioError
from containers.qoe.algorithm import Classification


class Listener(ABC):
    """Regulates how often the manager observes and runs the allocation policy."""

    name: str = ""
    interval_s: float

    @abstractmethod
    def observe(self, c: Classification, changes: int) -> float:
        """Record one iteration's classification and how many limits it changed; the seconds to wait."""

    def reset(self) -> float:
        """Back to the initial interval (the pool changed); the seconds to wait."""
        return self.interval_s


@dataclass
class FixedListener(Listener):
    interval_s: float = 10.0
    name = "fixed"

    def __post_init__(self) -> None:
        _positive("interval_s", self.interval_s)

    def observe(self, c: Classification, changes: int) -> float:
        return self.interval_s


@dataclass
class AdaptiveListener(Listener):
    """Algorithm 2's exponential back-off.

    Attributes:
        initial_s: the first and reset interval (10 s in the paper).
        converge_rounds: converging iterations in a row before the interval doubles.
        alpha: tolerance when comparing summed gaps between iterations.
        margin: how far past its band a container must be to count as having left S (0: the paper's rule).
        max_s: the interval never grows past this.
    """

    initial_s: float = 10.0
    converge_rounds: int = 3
    alpha: float = 0.10
    margin: float = 0.10
    max_s: float = 160.0
    interval_s: float = field(init=False)
    name = "adaptive"
    _streak: int = field(default=0, init=False)
    _last: Classification | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        _positive("initial_s", self.initial_s)
        _positive("max_s", self.max_s)
        if self.converge_rounds < 1:
            raise ScenarioError(f"converge_rounds must be at least 1; got {self.converge_rounds}")
        self.interval_s = self.initial_s

    def observe(self, c: Classification, changes: int) -> float:
        last, self._last = self._last, c
        if last is None:
            return self.interval_s
        if self._settled(c) < self._settled(last):  # lines 17-20: the stable state broke
            return self.reset()
        if changes == 0 or (self._holds(last.q_g, c.q_g) and self._holds(last.q_b, c.q_b)):  # lines 12-16
            self._streak += 1
            if self._streak >= self.converge_rounds:
                self._streak = 0
                self.interval_s = min(self.interval_s * 2, self.max_s)
        else:  # lines 21-23: still bouncing
            self._streak = 0
        return self.interval_s

    def reset(self) -> float:
        self._streak = 0
        self.interval_s = self.initial_s
        return self.interval_s

    def _settled(self, c: Classification) -> int:
        """Containers within ``alpha + margin`` of their target."""
        return sum(1 for name, q in c.quality.items() if abs(q) <= (self.alpha + self.margin) * c.targets[name])

    def _holds(self, before: float, now: float) -> bool:
        return abs(now) <= abs(before) * (1 + self.alpha) + 1e-9


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ScenarioError(f"listener {name} must be a positive number of seconds; got {value}")


def create_listener(kind: str | Listener, interval_s: float = 10.0, alpha: float = 0.10) -> Listener:
    """A listener from its name (``adaptive``, ``fixed``) or the instance itself."""
    if isinstance(kind, Listener):
        return kind
    if kind == "adaptive":
        return AdaptiveListener(initial_s=interval_s, alpha=alpha)
    if kind == "fixed":
        return FixedListener(interval_s=interval_s)
    raise ScenarioError(f"unknown listener {kind!r}; expected adaptive or fixed")

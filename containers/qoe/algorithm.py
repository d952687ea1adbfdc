"""DQoES Algorithm 1: classify containers against their QoE targets and move CPU from G to B.

Quality of container i is ``q_i = o_i - p_i`` (target minus measured response time). A
container is in G (better than target) when ``q_i > alpha * o_i``, in B (worse) when
``q_i < -alpha * o_i``, and in S (satisfied) otherwise. Containers in G give up
``beta * R_G * q_i / Q_G`` cores of their usage, never going below a floor; what G gives
up goes to B in proportion to ``q_i / Q_B``, never above the hardware ceiling. A container
with no limit already has every core (the hardware limit): in B it is left as it is, since
any limit would give it less.

The two policies DQoES is compared with (no limits, static equal limits) implement the
same interface so that one manager runs all three arms.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from containers.errors import ScenarioError


class QoeClass(str, Enum):
    G = "G"  # better than its target: can give CPU away
    S = "S"  # within alpha of its target: satisfied
    B = "B"  # worse than its target: needs CPU


@dataclass(frozen=True)
class Reading:
    """One container in one iteration: its target, what it delivered, and its CPU."""

    name: str
    target_ms: float
    response_ms: float
    usage_cpus: float  # cores used over the last interval
    limit_cpus: float | None  # current limit; None = none


@dataclass(frozen=True)
class Classification:
    """Classes and summed qualities of one iteration (Algorithm 1, lines 2-15)."""

    classes: dict[str, QoeClass]
    quality: dict[str, float]  # q_i in ms
    q_g: float  # sum of q_i over G (> 0)
    q_b: float  # sum of q_i over B (< 0)
    r_g: float  # sum of usage over G (cores)
    r_b: float  # sum of usage over B (cores)
    targets: dict[str, float] = field(default_factory=dict)  # o_i in ms

    @property
    def satisfied(self) -> int:
        """|S|, which the paper uses as Q_S (every q_i in S counts as 0)."""
        return sum(1 for c in self.classes.values() if c is QoeClass.S)

    def members(self, cls: QoeClass) -> list[str]:
        return [n for n, c in self.classes.items() if c is cls]


def classify(readings: Sequence[Reading], alpha: float) -> Classification:
    classes: dict[str, QoeClass] = {}
    quality: dict[str, float] = {}
    targets = {r.name: r.target_ms for r in readings}
    q_g = q_b = r_g = r_b = 0.0
    for r in readings:
        q = r.target_ms - r.response_ms
        quality[r.name] = q
        if q > alpha * r.target_ms:
            classes[r.name], q_g, r_g = QoeClass.G, q_g + q, r_g + r.usage_cpus
        elif q < -alpha * r.target_ms:
            classes[r.name], q_b, r_b = QoeClass.B, q_b + q, r_b + r.usage_cpus
        else:
            classes[r.name] = QoeClass.S
    return Classification(classes, quality, q_g, q_b, r_g, r_b, targets)


class AllocationPolicy(ABC):
    """Decides every container's CPU limit from one iteration's readings."""

    name: str = ""

    @abstractmethod
    def allocate(self, readings: Sequence[Reading], host_cpus: float,
                 pool: Mapping[str, float | None] | None = None) -> dict[str, float | None]:
        """New limits (cores; None = no limit) for the containers whose limit should change.

        Args:
            readings: this iteration's containers with a target and a response time.
            host_cpus: the cores the containers share.
            pool: every container sharing them, read this iteration or not, with its current limit
                (None: those in ``readings``); a container without a reading still holds its share.
        """


def _limits_of(readings: Sequence[Reading], pool: Mapping[str, float | None] | None) -> dict[str, float | None]:
    """Every container sharing the host and its current limit: ``pool``, or else the read containers."""
    return {r.name: r.limit_cpus for r in readings} if pool is None else dict(pool)


class NoLimits(AllocationPolicy):
    """Default Docker: every container competes for all cores."""

    name = "none"

    def allocate(self, readings: Sequence[Reading], host_cpus: float,
                 pool: Mapping[str, float | None] | None = None) -> dict[str, float | None]:
        return {name: None for name, limit in _limits_of(readings, pool).items() if limit is not None}


class StaticEqual(AllocationPolicy):
    """Each of the n containers in the pool gets host_cpus / n, whatever its target."""

    name = "static"

    def allocate(self, readings: Sequence[Reading], host_cpus: float,
                 pool: Mapping[str, float | None] | None = None) -> dict[str, float | None]:
        limits = _limits_of(readings, pool)
        share = round(host_cpus / max(len(limits), 1), 3)
        return {name: share for name, limit in limits.items() if limit != share}


@dataclass(frozen=True)
class DQoES(AllocationPolicy):
    """Algorithm 1 of DQoES.

    Attributes:
        alpha: tolerance of a target (0.1 = within 10% is satisfied).
        beta: amplitude of one adjustment (share of G's usage moved per iteration).
        floor_cpus: lowest limit any container gets; None = host_cpus / (2 n), n the containers in the pool
            (the paper's 1 / (2|C|)).
        ceiling_cpus: highest limit; None = every host core (the hardware limit).
    """

    alpha: float = 0.10
    beta: float = 0.10
    floor_cpus: float | None = None
    ceiling_cpus: float | None = None
    name = "dqoes"

    def __post_init__(self) -> None:
        for field_name in ("alpha", "beta"):
            value = getattr(self, field_name)
            if not 0 < value < 1:
                raise ScenarioError(f"DQoES {field_name} must be in (0, 1); got {value}")

    def allocate(self, readings: Sequence[Reading], host_cpus: float,
                 pool: Mapping[str, float | None] | None = None) -> dict[str, float | None]:
        c = classify(readings, self.alpha)
        containers = len(_limits_of(readings, pool))
        floor = self.floor_cpus if self.floor_cpus is not None else host_cpus / (2 * max(containers, 1))
        ceiling = self.ceiling_cpus if self.ceiling_cpus is not None else host_cpus
        by_name = {r.name: r for r in readings}
        limits: dict[str, float | None] = {}
        saved = 0.0
        for name in c.members(QoeClass.G):  # lines 16-20: cut G in proportion to how far ahead each is
            r = by_name[name]
            new = max(r.usage_cpus - c.r_g * self.beta * c.quality[name] / c.q_g, floor)
            saved += max(r.usage_cpus - new, 0.0)
            limits[name] = round(new, 3)
        if saved > 0:
            for name in c.members(QoeClass.B):  # lines 21-24: give B what G gave up, worst first
                r = by_name[name]
                if r.limit_cpus is None or r.limit_cpus >= ceiling:  # no limit, or at the ceiling: a cap would take CPU
                    continue
                grown = max(r.usage_cpus, r.limit_cpus) + saved * c.quality[name] / c.q_b
                limits[name] = round(min(max(grown, floor), ceiling), 3)
        return {n: v for n, v in limits.items() if v != by_name[n].limit_cpus}


POLICIES = {"dqoes": DQoES, "static": StaticEqual, "none": NoLimits}


def create_policy(kind: str | AllocationPolicy, alpha: float = 0.10, beta: float = 0.10) -> AllocationPolicy:
    """A policy from its name (``dqoes``, ``static``, ``none``) or the instance itself."""
    if isinstance(kind, AllocationPolicy):
        return kind
    if kind == "dqoes":
        return DQoES(alpha=alpha, beta=beta)
    if kind in POLICIES:
        return POLICIES[kind]()
    raise ScenarioError(f"unknown allocation policy {kind!r}; expected one of {', '.join(POLICIES)}")

"""One stage as a centralized batched queue in front of k replicas, simulated over sorted arrivals.

Kept apart from the Estimator because it is the hot loop: plain Python lists, ``bisect`` and
``heapq`` (numpy calls cost more than they save on one batch at a time), one iteration per
batch. Replicas may come and go over time: each serves only inside its active windows,
and a batch it starts inside one runs to completion. A replica under a CPU quota runs its
batches through ``CfsBandwidth``; how long each batch takes comes from ``ServiceJitter``.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from containers.errors import PlanError


@dataclass(frozen=True)
class ReplicaChange:
    """From ``at_s`` (trace time) on, ``stage`` should have ``replicas`` replicas."""

    at_s: float
    stage: str
    replicas: int

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 1:
            raise PlanError(f"stage {self.stage}: replicas must be an integer of at least 1; got {self.replicas!r}")


GOLDEN = 0.6180339887498949  # spreads the replicas' CFS period phases evenly, without a random draw


class CfsBandwidth:
    """The kernel's CFS bandwidth control on each replica: run at most ``share`` of every period, then wait.

    Each replica's period starts at its own phase (containers start at unrelated times);
    runtime left unused in a period does not carry over (no CFS burst), so a batch that
    needs more than what is left of the period's runtime pauses until the next period.
    """

    def __init__(self, share: float, period_s: float, replicas: int) -> None:
        if not 0 < share < 1 or not period_s > 0:
            raise PlanError(f"a CPU quota needs a share in (0, 1) of a positive period; got {share!r} of {period_s!r} s")
        self.runtime_s, self.period_s = share * period_s, period_s
        self.phase = [(r * GOLDEN) % 1.0 * period_s for r in range(replicas)]
        self.period = [-1] * replicas
        self.used = [0.0] * replicas

    def finish(self, replica: int, start: float, work_s: float) -> float:
        """When a batch needing ``work_s`` of unthrottled running, started at ``start``, is done on ``replica``."""
        phase, p = self.phase[replica], self.period_s
        k = math.floor((start - phase) / p)
        used = self.used[replica] if k == self.period[replica] else 0.0
        t = start
        while True:
            left = max(0.0, min(self.runtime_s - used, phase + (k + 1) * p - t))
            if work_s <= left:
                self.period[replica], self.used[replica] = k, used + work_s
                return t + work_s
            work_s -= left
            k, used, t = k + 1, 0.0, phase + (k + 1) * p


class SlowSpells:
    """Per replica, the persistent part of its runs' normal scores over time (``results.profile.Persistence``).

    An Ornstein-Uhlenbeck process of time constant ``time_s``, stationary from the start, on a
    grid fine against it; each replica slot gets its own (replicas run on their own cores),
    drawn from ``seed`` and its index when it first serves, so every configuration sees the
    same spells on the same slot.
    """

    MAX_POINTS = 20_000

    def __init__(self, time_s: float, span_s: float, seed: Sequence[int]) -> None:
        self.dt = max(time_s / 8, span_s / self.MAX_POINTS)
        self.size = int(span_s / self.dt) + 2
        self.phi = math.exp(-self.dt / time_s)
        self.seed = tuple(seed)
        self.grids: list[list[float]] = []  # per replica slot, the process at 0, dt, 2 dt, ...

    def grow(self, replicas: int) -> None:
        """Make the grids of the first ``replicas`` slots."""
        from scipy.signal import lfilter

        while len(self.grids) < replicas:
            eta = np.random.default_rng([*self.seed, len(self.grids)]).standard_normal(self.size)
            walk = lfilter([math.sqrt(1 - self.phi ** 2)], [1.0, -self.phi], eta[1:], zi=[self.phi * eta[0]])[0]
            self.grids.append([float(eta[0]), *walk.tolist()])


class ServiceJitter:
    """Each batch's service time over its mean, drawn from the profiled shapes (mean 1, at evenly spaced
    quantile levels): ``busy`` for a replica that went from batch to batch, ``idle`` for one that rested
    before it (``busy`` again where no idle shape was profiled).

    The level is the normal score of the batch's oldest query (``fresh``, one per query in ready
    order) or, where slow spells persist, ``sqrt(1 - share)`` of it plus ``sqrt(share)`` of the
    serving replica's spell at the batch's start: the same distribution, but slow runs come in
    spells, as they do on a shared host.
    """

    def __init__(self, busy: np.ndarray, idle: np.ndarray | None, fresh: np.ndarray, spells: SlowSpells | None = None,
                 share: float = 0.0) -> None:
        self.levels = len(busy)
        self.spells = spells if share > 0 else None
        shapes = (busy, busy if idle is None else idle)
        if self.spells is None:
            levels = self._level(fresh)
            self._fixed = tuple(s[levels].tolist() for s in shapes)
        else:
            self._shapes = tuple(s.tolist() for s in shapes)
            self._fresh, self._spell = (math.sqrt(1 - share) * fresh).tolist(), math.sqrt(share)
            self._per_s, self._last = 1 / self.spells.dt, self.spells.size - 1

    def _level(self, z: np.ndarray) -> np.ndarray:
        from scipy.special import ndtr

        return np.minimum((ndtr(z) * self.levels).astype(int), self.levels - 1)

    def __call__(self, query: int, replica: int, start_s: float, idle: bool) -> float:
        """The scale of a batch headed by ``query``; hot (once per batch), so the spell lookup is inlined."""
        if self.spells is None:
            return self._fixed[idle][query]
        grids = self.spells.grids
        if replica >= len(grids):
            self.spells.grow(replica + 1)
        k = int(start_s * self._per_s)
        z = self._fresh[query] + self._spell * grids[replica][k if k < self._last else self._last]
        level = int((1 + math.erf(z * 0.7071067811865476)) * 0.5 * self.levels)
        return self._shapes[idle][level if level < self.levels else self.levels - 1]


def replica_windows(initial: int, changes: Sequence[tuple[float, int]], startup_s: float, standby: int = 0,
                    resume_s: float = 0.0) -> list[list[tuple[float, float]]]:
    """For each replica slot, the ``[start, end)`` spans in which it serves.

    ``initial`` replicas serve from time 0. A change to more replicas adds slots that serve
    ``startup_s`` after the change (a container starting), or ``resume_s`` after it where one of
    ``standby`` warm, paused replicas is ready: that one is resumed and a new standby starts in
    its place once no cold start is in progress (ready ``startup_s`` later; ``ReplicaSet``).
    A change to fewer retires the newest slots at once (they finish the batch in hand; a start
    already under way runs to its end). A slot retired before it was ready never serves.
    """
    if not startup_s >= 0:
        raise PlanError(f"a replica's start-up must be at least 0 s; got {startup_s!r}")
    if not resume_s >= 0:
        raise PlanError(f"a standby replica's resume must be at least 0 s; got {resume_s!r}")
    slots: list[list[list[float]]] = [[[0.0, math.inf]] for _ in range(initial)]
    pool = [0.0] * standby  # when each standby is ready (a heap)
    waiting: list[float] = []  # when each taken standby's replacement was asked for; it starts once no cold one runs
    cold_until = 0.0  # when the cold starts asked for so far have all ended
    count = initial
    for at, replicas in sorted(changes, key=lambda c: c[0]):
        if waiting and cold_until <= at:
            for asked in waiting:
                heapq.heappush(pool, max(asked, cold_until) + startup_s)
            waiting.clear()
        for r in range(count, replicas):
            if r == len(slots):
                slots.append([])
            if pool and pool[0] <= at:
                heapq.heappop(pool)
                waiting.append(at)
                slots[r].append([at + resume_s, math.inf])
            else:
                cold_until = max(cold_until, at + startup_s)
                slots[r].append([at + startup_s, math.inf])
        for r in range(replicas, count):
            slots[r][-1][1] = at
            if slots[r][-1][1] <= slots[r][-1][0]:
                slots[r].pop()
        count = replicas
    return [[(s, e) for s, e in windows] for windows in slots]


def serve(ready: list[float], service_s: Sequence[float], batch: int, timeout_s: float,
          windows: list[list[tuple[float, float]]], jitter: ServiceJitter | None = None,
          quota: tuple[float, float] | None = None, idle_s: Sequence[float] | None = None) -> list[float]:
    """When each query finishes, for queries ready at the sorted times ``ready``.

    Args:
        ready: sorted times (s) at which queries join the queue.
        service_s: ``service_s[k]`` is the time (s) one replica takes for a batch of k (index 0 unused).
        batch: the most queries a replica takes at once.
        timeout_s: how long a free replica waits, from the oldest query's arrival, for a full batch.
        windows: per replica slot, its active ``[start, end)`` spans, sorted (``replica_windows``).
        jitter: a batch whose oldest query is the i-th ready, started at ``start`` on replica ``r``,
            takes ``service_s[k] * jitter(i, r, start, idle)``; none: every batch takes its mean.
        quota: (share, period s) of a CPU quota every replica runs under (``CfsBandwidth``);
            none: batches run unthrottled.
        idle_s: like ``service_s``, for a batch that a replica waited for (it rested before it,
            or it is its first); none: the same as ``service_s``.

    The replica free soonest takes the queue's head. It starts at the later of when it is free
    and when the batch is due (``batch`` queries waiting, or the head waited ``timeout_s``), and
    takes every query ready by then, up to ``batch``. Start times never decrease, so the queue
    is served in order.

    Raises:
        PlanError: queries are left while no replica will ever serve again.
    """
    n = len(ready)
    finished = [0.0] * n
    heap = [(w[0][0], r) for r, w in enumerate(windows) if w]
    heapq.heapify(heap)
    slot = [0] * len(windows)
    last_end = [-math.inf] * len(windows)  # when each replica's last batch ended: it rests until the next starts
    cfs = CfsBandwidth(*quota, len(windows)) if quota else None
    i = 0
    while i < n:
        if not heap:
            raise PlanError(f"{n - i} queries wait from {ready[i]:.3f} s but no replica serves after that")
        free, r = heap[0]
        last = i + batch - 1
        due = ready[i] + timeout_s
        if last < n and ready[last] < due:
            due = ready[last]
        start = free if free > due else due
        active = windows[r]
        if start >= active[slot[r]][1]:  # retired before this batch is due: move to its next span, if any
            slot[r] += 1
            if slot[r] < len(active):
                heapq.heapreplace(heap, (max(active[slot[r]][0], free), r))
            else:
                heapq.heappop(heap)
            continue
        j = bisect_right(ready, start, i, last + 1 if last < n else n)
        idle = idle_s is not None and start > last_end[r]
        work = (idle_s if idle else service_s)[j - i]  # type: ignore[index]
        if jitter is not None:
            work *= jitter(i, r, start, idle)
        end = last_end[r] = start + work if cfs is None else cfs.finish(r, start, work)
        if j == i + 1:
            finished[i] = end
        else:
            finished[i:j] = [end] * (j - i)
        heapq.heapreplace(heap, (end, r))
        i = j
    return finished

"""The Estimator: end-to-end latency of every query of a trace under a pipeline configuration.

A discrete-event simulation of InferLine's serving model (section 4.2): each stage has one
centralized batched queue feeding its replicas; a free replica dispatches when ``batch``
queries wait or the oldest has waited the batching timeout, and then takes what is queued,
up to ``batch``; a batch of k takes the profiled service time of k, drawn from the measured
distribution where the profile kept its quantiles, else its mean; where the profile also kept
how long slow spells last (``results.profile.Persistence``), each replica's draws come in
spells of that length (``batchqueue.ServiceJitter``); and a batch a replica waited for is
drawn from the profile's idle measurement, where it has one (a rested server is slower than a
busy one). On a CPU container whose
quota is below its threads, the run is drawn from the unthrottled twin's profile and the
replica's CFS bandwidth control is simulated (``profiles``, ``batchqueue.CfsBandwidth``), so
throttling depends on how busy the replica is, as it does live. A query goes on to a
child stage with that stage's scale factor, enters a join once every parent it visited is
done, and is finished when every stage it visited is.

The planner calls this hundreds of times, so it is built for speed: a DAG has no feedback,
so stages are simulated one at a time in topological order, each as a k-server batched
queue over its own sorted arrivals with a heap of replica free times (``batchqueue.serve``);
the conditional-flow and service-time draws are made once per trace (same seed, same draws
for every configuration, so two configurations are compared on the same queries); and a stage's
result is cached by the configurations of the stages it depends on, so a search that
changes one stage re-simulates only it and what is downstream.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from containers.backends import PERIOD_US
from containers.errors import PlanError
from containers.planner.config import Config, check_config, check_standby, standby_replicas
from containers.planner.pipeline import Pipeline
from containers.planner.batchqueue import ReplicaChange, ServiceJitter, SlowSpells, replica_windows, serve
from containers.planner.trace import check_trace

SHAPE_LEVELS = 256  # service-time quantile levels drawn from
STARTUP_S = 5.0  # ask to serving, for a replica whose container start was not profiled
RESUME_S = 0.05  # ask to serving, for a warm standby replica: its cores and limit set, unpaused, routed (a Docker
# unpause took 8-10 ms and the server's first /health after it 2 ms more here)
WARMUP_REQUESTS = 2  # of each batch size a new replica serves back to back before it is routed to: a started
# server's first request of a size ran 1.5-7x slower (connection and first run), its second as steadily as any later


@dataclass(frozen=True, eq=False)
class Estimate:
    """What a configuration gives over the trace.

    Attributes:
        latencies_ms: per query of the trace, end to end; NaN for one that visits no stage.
        visits: query-stage visits simulated.
        seconds: wall time the simulation took.
    """

    latencies_ms: np.ndarray = field(repr=False)
    slo_ms: float
    visits: int
    seconds: float

    @property
    def _served(self) -> np.ndarray:
        return self.latencies_ms[~np.isnan(self.latencies_ms)]

    @property
    def p50_ms(self) -> float:
        return float(np.percentile(self._served, 50))

    @property
    def p99_ms(self) -> float:
        return float(np.percentile(self._served, 99))

    @property
    def mean_ms(self) -> float:
        return float(self._served.mean())

    @property
    def miss_rate(self) -> float:
        """Share of queries whose end-to-end latency is above the SLO."""
        return float((self._served > self.slo_ms).mean())

    @property
    def visits_per_s(self) -> float:
        """Query-stage visits simulated per second of wall time."""
        return self.visits / max(self.seconds, 1e-9)

    @property
    def queries_per_s(self) -> float:
        """Queries (end to end) simulated per second of wall time."""
        return self._served.size / max(self.seconds, 1e-9)

    def summary(self) -> dict[str, float]:
        return {"p50_ms": round(self.p50_ms, 3), "p99_ms": round(self.p99_ms, 3), "mean_ms": round(self.mean_ms, 3),
                "miss_rate": round(self.miss_rate, 5), "slo_ms": self.slo_ms, "queries": int(self._served.size),
                "visits": self.visits, "visits_per_s": round(self.visits_per_s), "queries_per_s": round(self.queries_per_s)}


class Estimator:
    """Simulates configurations of one pipeline over one trace.

    Args:
        pipeline: the stages, their profiles and scale factors.
        arrivals: sorted arrival times in seconds.
        seed: seeds the scale-factor draws (which queries visit which stage) and the service-time draws.
        startup_s: how long a replica added by a schedule takes from the ask to serving, on every stage;
            None: its stage's profiled container start on its hardware, plus its warm-up (``STARTUP_S``
            where the start was not profiled).
        standby: warm, paused replicas each stage keeps for a schedule's scale-ups, per replica it is
            configured with (``standby_replicas``): one that is ready serves ``resume_s`` after the ask, and
            another starts in its place once the stage's cold starts are done (``replica_windows``).
        cache_bytes: memory for stage results kept for reuse between calls.
        slo_percentile: the latency percentile that ``feasible`` holds to the SLO (99: a p99 SLO).
    """

    def __init__(self, pipeline: Pipeline, arrivals: np.ndarray, seed: int = 0, startup_s: float | None = None,
                 cache_bytes: int = 64 << 20, slo_percentile: float = 99.0, standby: float = 0.0,
                 resume_s: float = RESUME_S) -> None:
        if not 50 <= slo_percentile < 100:
            raise PlanError(f"the SLO percentile must be in [50, 100); got {slo_percentile!r}")
        check_standby(standby)
        self.pipeline, self.seed, self.startup_s, self.slo_percentile = pipeline, seed, startup_s, slo_percentile
        self.standby, self.resume_s = standby, resume_s
        self.arrivals = check_trace(arrivals)
        self.cache_size = max(8, cache_bytes // (8 * self.arrivals.size))
        rng = np.random.default_rng(seed)
        draws = rng.random((len(pipeline.stages), self.arrivals.size))
        self.visits_: dict[str, np.ndarray] = {}
        for stage, u in zip(pipeline.stages, draws):
            reached = (np.logical_or.reduce([self.visits_[p] for p in stage.parents]) if stage.parents
                       else np.ones(self.arrivals.size, dtype=bool))
            self.visits_[stage.name] = reached & (u < stage.scale_factor)
        self._index = {name: np.flatnonzero(v) for name, v in self.visits_.items()}
        self._fresh = {name: rng.standard_normal(max(1, idx.size)) for name, idx in self._index.items()}
        self._spells: dict[tuple[str, float], SlowSpells] = {}
        self._ancestors = self._closure()
        served = int(np.logical_or.reduce(list(self.visits_.values())).sum())
        if served == 0:
            raise PlanError(f"no query of the {self.arrivals.size}-query trace visits any stage of {pipeline.name}")
        # this many misses put the SLO percentile above the SLO
        self._misses_allowed = served - int(np.floor(self.slo_percentile / 100 * (served - 1)))
        self._cache: dict[tuple[object, ...], np.ndarray] = {}
        self.calls_ = 0

    @property
    def span_s(self) -> float:
        """The trace's length, first arrival to last (at least 1 ms)."""
        return max(float(self.arrivals[-1] - self.arrivals[0]), 1e-3)

    def share(self, stage: str) -> float:
        """The share of the trace's queries that visit ``stage``."""
        return float(self.visits_[stage].mean())

    def load_per_s(self, stage: str) -> float:
        """Queries per second reaching ``stage`` over the trace."""
        return float(self._index[stage].size) / self.span_s

    def replica_startup_s(self, stage: str, hardware: str, batch: int) -> float:
        """From the ask to a new replica of ``stage`` on ``hardware`` at ``batch`` serving, as this Estimator has it:
        its container's profiled start, then ``WARMUP_REQUESTS`` of one item and of ``batch`` at profiled speed."""
        if self.startup_s is not None:
            return self.startup_s
        profile = self.pipeline.stage(stage).profile
        profiled = profile.startup_s(hardware)
        if profiled is None:
            return STARTUP_S
        return profiled + WARMUP_REQUESTS * sum(profile.service_ms(hardware, k) for k in {1, batch}) / 1e3

    def startups(self, config: Config) -> dict[str, float]:
        """Each stage's ``replica_startup_s`` on its hardware and batch size in ``config``."""
        return {name: self.replica_startup_s(name, cfg.hardware, cfg.batch_size) for name, cfg in config.items()}

    def estimate(self, config: Config, slo_ms: float, schedule: Sequence[ReplicaChange] = (),
                 startup_s: float | None = None) -> Estimate:
        """Simulate ``config`` (replica counts changing as ``schedule`` says, new replicas serving ``startup_s``
        after a change, on every stage; None: ``replica_startup_s``) over the whole trace."""
        finish, visits, seconds = self._run(config, schedule, None, startup_s)
        return Estimate((finish - self.arrivals) * 1e3, slo_ms, visits, seconds)  # type: ignore[operator]

    def feasible(self, config: Config, slo_ms: float) -> bool:
        """Whether ``config``'s SLO percentile meets ``slo_ms``; stops as soon as enough queries are known to miss it."""
        finish, _, _ = self._run(config, (), slo_ms, None)
        return finish is not None and float(np.percentile((finish - self.arrivals)[~np.isnan(finish)] * 1e3,
                                                          self.slo_percentile)) <= slo_ms

    def _run(self, config: Config, schedule: Sequence[ReplicaChange], stop_ms: float | None,
             startup_s: float | None) -> tuple[np.ndarray | None, int, float]:
        """The time each query finishes (None when stopped early), visits simulated, and wall seconds."""
        check_config(self.pipeline, config)
        self.calls_ += 1
        t0 = time.perf_counter()
        n = self.arrivals.size
        done: dict[str, np.ndarray] = {}
        finish = np.full(n, np.nan)
        visits = 0
        for stage in self.pipeline.stages:
            changes = [c for c in schedule if c.stage == stage.name]
            key = (stage.name, *(config[a] for a in self._ancestors[stage.name])) if not schedule else None
            if key is not None and key in self._cache:
                done[stage.name] = self._cache[key]
            else:
                done[stage.name] = self._stage(stage.name, config, done, changes, startup_s)
                visits += int(self._index[stage.name].size)
                if key is not None:
                    if len(self._cache) >= self.cache_size:
                        self._cache.pop(next(iter(self._cache)))
                    self._cache[key] = done[stage.name]
            finish = np.fmax(finish, done[stage.name])
            if stop_ms is not None and int(((finish - self.arrivals) * 1e3 > stop_ms).sum()) >= self._misses_allowed:
                return None, visits, time.perf_counter() - t0
        return finish, visits, time.perf_counter() - t0

    def _stage(self, name: str, config: Config, done: dict[str, np.ndarray], changes: Sequence[ReplicaChange],
               startup_s: float | None) -> np.ndarray:
        """When each query finishes at stage ``name`` (NaN where it does not visit), given its parents' results."""
        stage, cfg = self.pipeline.stage(name), config[name]
        idx = self._index[name]
        ready = self.arrivals[idx] if not stage.parents else np.fmax.reduce([done[p][idx] for p in stage.parents])
        order = np.argsort(ready, kind="stable")
        points = [stage.profile.run_point(cfg.hardware, k) for k in range(1, cfg.batch_size + 1)]
        service_s = [0.0] + [p.mean_ms / 1e3 for p in points]
        idle_s = [0.0] + [(p.idle or p).mean_ms / 1e3 for p in points] if any(p.idle for p in points) else None
        start_s = self.replica_startup_s(name, cfg.hardware, cfg.batch_size) if startup_s is None else startup_s
        windows = replica_windows(cfg.replicas, [(c.at_s, c.replicas) for c in changes], start_s,
                                  standby_replicas(self.standby, cfg.replicas), self.resume_s)
        share = stage.profile.quota_share(cfg.hardware)
        try:
            finished = serve(ready[order].tolist(), service_s, cfg.batch_size, cfg.batch_timeout_ms / 1e3, windows,
                             self._service_jitter(name, cfg.hardware, cfg.batch_size, order),
                             (share, PERIOD_US / 1e6) if share else None, idle_s)
        except PlanError as err:
            raise PlanError(f"stage {name}: {err}") from None
        out = np.full(self.arrivals.size, np.nan)
        out[idx[order]] = finished
        return out

    def _service_jitter(self, name: str, hardware: str, batch: int, order: np.ndarray) -> ServiceJitter | None:
        """How batches of ``name`` vary around their mean (its visiting queries in ready ``order``): the shape
        profiled for this batch size, in spells as long as profiled; None where only a mean was profiled."""
        point = self.pipeline.stage(name).profile.run_point(hardware, batch)
        if not point.quantiles_ms:
            return None
        fresh, p = self._fresh[name][order], point.persistence
        busy = point.shape(SHAPE_LEVELS)
        idle = point.idle.shape(SHAPE_LEVELS) if point.idle and point.idle.quantiles_ms else None
        if p is None or p.share <= 0:
            return ServiceJitter(busy, idle, fresh)
        key = (name, p.time_s)
        if key not in self._spells:
            stage = [s.name for s in self.pipeline.stages].index(name)
            self._spells[key] = SlowSpells(p.time_s, float(self.arrivals[-1]) + 60.0, (self.seed, stage))
        return ServiceJitter(busy, idle, fresh, self._spells[key], p.share)

    def _closure(self) -> dict[str, tuple[str, ...]]:
        """Each stage with the stages it depends on (itself and its ancestors), in topological order."""
        deps: dict[str, set[str]] = {}
        for s in self.pipeline.stages:
            deps[s.name] = {s.name}.union(*(deps[p] for p in s.parents))
        order = [s.name for s in self.pipeline.stages]
        return {name: tuple(n for n in order if n in d) for name, d in deps.items()}

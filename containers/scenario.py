"""Scenario files: which artifacts to serve, their QoE targets, loads and join schedule, and the manager's settings.

A scenario is TOML::

    name = "mixed-burst"
    duration_s = 240
    backend = "docker"        # docker | local | auto
    policy = "dqoes"          # dqoes | static | none
    listener = "adaptive"     # adaptive | fixed
    interval_s = 10           # the listener's initial (or fixed) interval
    alpha = 0.1
    beta = 0.1
    statistic = "mean"        # mean | p50 | p90 | p95 | p99 of server request time
    on_exit = "restart"       # restart | drop a container that dies
    base_port = 18500

    [schedule]
    kind = "burst"            # burst | fixed (interval_s) | random (window_s, seed)

    [[containers]]
    name = "mlp-a"
    artifact = "runs/mlp/artifact"
    target_ms = 2.5
    threads = 1
    batch = 1
    load = { kind = "closed", concurrency = 1 }   # or poisson (rate_per_s), gamma (rate_per_s, cv), trace (path),
                                                  # none (clients come from outside)

Every error names the file, the line and the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from containers.errors import ScenarioError
from containers.load import Arrivals, Gamma, Poisson, Trace
from containers.tomlfile import TomlFile

CHOICES = {"backend": ("docker", "local", "auto"), "policy": ("dqoes", "static", "none"),
           "listener": ("adaptive", "fixed"), "statistic": ("mean", "p50", "p90", "p95", "p99"),
           "on_exit": ("restart", "drop")}


@dataclass(frozen=True)
class LoadSpec:
    kind: str = "closed"
    concurrency: int = 1
    think_s: float = 0.0
    rate_per_s: float | None = None
    cv: float = 1.0
    trace: Path | None = None

    @property
    def external(self) -> bool:
        """No load from us: clients come from outside (``autotune serve``)."""
        return self.kind == "none"

    def arrivals(self) -> Arrivals | None:
        if self.kind in ("closed", "none"):
            return None
        if self.kind == "poisson":
            return Poisson(self.rate_per_s or 0.0)
        if self.kind == "gamma":
            return Gamma(self.rate_per_s or 0.0, self.cv)
        return Trace.read(self.trace or "")


@dataclass(frozen=True)
class ContainerPlan:
    name: str
    artifact: Path
    target_ms: float | None
    threads: int = 1
    cpus: float | None = None
    cpuset: tuple[int, ...] | None = None
    batch: int = 1
    load: LoadSpec = field(default_factory=LoadSpec)


@dataclass(frozen=True)
class Schedule:
    kind: str = "burst"
    interval_s: float = 30.0
    window_s: float = 120.0
    seed: int = 0


@dataclass(frozen=True)
class Scenario:
    name: str
    duration_s: float
    containers: tuple[ContainerPlan, ...]
    backend: str = "auto"
    policy: str = "dqoes"
    listener: str = "adaptive"
    interval_s: float = 10.0
    alpha: float = 0.10
    beta: float = 0.10
    statistic: str = "mean"
    on_exit: str = "restart"
    base_port: int = 18500
    schedule: Schedule = field(default_factory=Schedule)


def read_scenario(path: str | Path) -> Scenario:
    """Parse and check a scenario file; ``ScenarioError`` names the line and field of the first problem."""
    raw, reader = _Reader.read(path, "scenario", CHOICES)
    return reader.scenario(raw)


class _Reader(TomlFile):
    """Builds a Scenario from parsed TOML, pointing each error at its line in the source."""

    def scenario(self, raw: dict[str, Any]) -> Scenario:
        top = {"name", "duration_s", "backend", "policy", "listener", "interval_s", "alpha", "beta", "statistic",
               "on_exit", "base_port", "schedule", "containers"}
        self.unknown(raw, top, "", None)
        v = lambda key, kind, default, positive=False: self.value(raw, key, kind, default, "", positive=positive)  # noqa: E731
        for key in ("alpha", "beta"):
            if key in raw and not (isinstance(raw[key], (int, float)) and 0 < raw[key] < 1):
                self.fail(key, f"must be a fraction in (0, 1); got {raw[key]!r}", None, 0, key)
        containers = raw.get("containers")
        if not isinstance(containers, list) or not containers:
            self.fail("containers", "must list at least one [[containers]] table", None, 0, "name")
        plans = tuple(self.container(c, i) for i, c in enumerate(containers))
        names = [p.name for p in plans]
        for i, name in enumerate(names):
            if name in names[:i]:
                self.fail(f"containers[{i}].name", f"{name!r} is used twice", "containers", i, "name")
        return Scenario(
            name=v("name", str, self.path.stem), duration_s=v("duration_s", float, ..., True), containers=plans,
            backend=v("backend", str, "auto"), policy=v("policy", str, "dqoes"), listener=v("listener", str, "adaptive"),
            interval_s=v("interval_s", float, 10.0, True), alpha=v("alpha", float, 0.10), beta=v("beta", float, 0.10),
            statistic=v("statistic", str, "mean"), on_exit=v("on_exit", str, "restart"),
            base_port=v("base_port", int, 18500, True), schedule=self.schedule(raw.get("schedule", {})),
        )

    def schedule(self, raw: Any) -> Schedule:
        if not isinstance(raw, dict):
            self.fail("schedule", "must be a table", None, 0, "schedule")
        self.unknown(raw, {"kind", "interval_s", "window_s", "seed"}, "schedule.", "schedule")
        kind = self.value(raw, "kind", str, "burst", "schedule.", "schedule")
        if kind not in ("burst", "fixed", "random"):
            self.fail("schedule.kind", f"must be one of burst, fixed, random; got {kind!r}", "schedule", 0, "kind")
        return Schedule(kind, self.value(raw, "interval_s", float, 30.0, "schedule.", "schedule", positive=True),
                        self.value(raw, "window_s", float, 120.0, "schedule.", "schedule", positive=True),
                        self.value(raw, "seed", int, 0, "schedule.", "schedule"))

    def container(self, raw: Any, i: int) -> ContainerPlan:
        where, val, name = self.entry(raw, "containers", i, {"name", "artifact", "target_ms", "threads", "cpus",
                                                              "cpuset", "batch", "load"})
        artifact = val("artifact", str, ...)
        artifact_path = (self.path.parent / artifact).resolve() if not Path(artifact).is_absolute() else Path(artifact)
        if not (artifact_path / "manifest.json").is_file() and not (artifact_path / "artifact" / "manifest.json").is_file():
            self.fail(f"{where}artifact", f"{artifact_path} is not an artifact (no manifest.json)", "containers", i,
                      "artifact")
        cpuset = raw.get("cpuset")
        if cpuset is not None and not (isinstance(cpuset, list) and all(isinstance(c, int) and c >= 0 for c in cpuset)):
            self.fail(f"{where}cpuset", f"must be a list of core numbers; got {cpuset!r}", "containers", i, "cpuset")
        return ContainerPlan(
            name=name, artifact=artifact_path, target_ms=val("target_ms", float, None, True),
            threads=val("threads", int, 1, True), cpus=val("cpus", float, None, True),
            cpuset=tuple(cpuset) if cpuset else None, batch=val("batch", int, 1, True),
            load=self.load(raw.get("load", {}), i),
        )

    def load(self, raw: Any, i: int) -> LoadSpec:
        where = f"containers[{i}].load."
        if not isinstance(raw, dict):
            self.fail(where[:-1], "must be a table like { kind = \"closed\" }", "containers", i, "load")
        self.unknown(raw, {"kind", "concurrency", "think_s", "rate_per_s", "cv", "trace"}, where, "containers", i, "load")
        kind = raw.get("kind", "closed")
        if kind not in ("closed", "poisson", "gamma", "trace", "none"):
            self.fail(f"{where}kind", f"must be one of closed, poisson, gamma, trace, none; got {kind!r}", "containers", i,
                      "load")
        if kind in ("poisson", "gamma") and "rate_per_s" not in raw:
            self.fail(f"{where}rate_per_s", f"must be a positive number for {kind} arrivals; it is missing",
                      "containers", i, "load")
        if kind == "trace" and not isinstance(raw.get("trace"), str):
            self.fail(f"{where}trace", "must name a trace file for trace arrivals", "containers", i, "load")

        def number(key: str, of: type, default: Any, positive: bool = True) -> Any:
            return self.value(raw, key, of, default, where, "containers", i, positive, line_key="load")

        think_s = number("think_s", float, 0.0, positive=False)
        if not 0 <= think_s < math.inf:
            self.fail(f"{where}think_s", f"must be a finite number of seconds >= 0; got {raw['think_s']!r}",
                      "containers", i, "load")
        spec = LoadSpec(kind, number("concurrency", int, 1), think_s, number("rate_per_s", float, None),
                        number("cv", float, 1.0), self.path.parent / raw["trace"] if kind == "trace" else None)
        spec.arrivals()  # a trace file is read and checked now, not when its container joins
        return spec

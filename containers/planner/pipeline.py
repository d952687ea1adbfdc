"""Pipeline files: the stages of an inference pipeline, how queries flow between them, and what they may run on.

A pipeline is TOML::

    name = "video"
    slo_ms = 250                    # p99 end to end; optional here, --slo-ms overrides
    [prices]                        # dollars per replica-hour; overrides or adds to the defaults
    "gpu-NVIDIAH200" = 10.0

    [[stages]]
    name = "detect"
    artifact = "runs/yolo/artifact" # relative to this file; only <artifact>/profile.json is read
    parents = []                    # empty: queries enter here
    scale_factor = 1.0              # share of the queries reaching its parents that reach it, in (0, 1]
    hardware = ["cpu-1", "cpu-2"]   # optional: allowed keys (default: every profiled one)
    batch_timeout_ms = 2            # optional: how long a partial batch may wait for more (default 0)

Every error names the file, the line and the stage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from containers.errors import PlanError, ScenarioError
from containers.planner.hardware import PriceTable
from containers.planner.profiles import StageProfile
from containers.tomlfile import NAME, TomlFile
from results.errors import ArtifactError
from results.profile import read_profile


@dataclass(frozen=True)
class Stage:
    """One model of the pipeline, with the hardware it may use and what each costs per replica-hour."""

    name: str
    artifact: Path
    parents: tuple[str, ...]
    scale_factor: float
    profile: StageProfile
    prices: Mapping[str, float]
    batch_timeout_ms: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.scale_factor <= 1:
            raise ScenarioError(f"stage {self.name}: scale_factor must be in (0, 1]; got {self.scale_factor!r}")
        if not self.profile.points:
            raise ScenarioError(f"stage {self.name} has no profiled hardware")
        missing = [k for k in self.profile.hardware if k not in self.prices]
        if missing:
            raise ScenarioError(f"stage {self.name}: no price for hardware {', '.join(missing)}")
        if self.batch_timeout_ms < 0:
            raise ScenarioError(f"stage {self.name}: batch_timeout_ms must be >= 0; got {self.batch_timeout_ms!r}")

    @property
    def hardware(self) -> tuple[str, ...]:
        return self.profile.hardware


@dataclass(frozen=True)
class Pipeline:
    """A DAG of stages, in topological order (parents before children); ``source`` is the file it was read from."""

    name: str
    stages: tuple[Stage, ...]
    slo_ms: float | None = None
    source: Path | None = None

    def __post_init__(self) -> None:
        try:
            order = topological_order({s.name: s.parents for s in self.stages})
        except DagError as err:
            raise ScenarioError(f"pipeline {self.name}: stage {err.stage}: {err}") from None
        if [s.name for s in self.stages] != order:
            raise ScenarioError(f"pipeline {self.name}: stages must be in topological order ({', '.join(order)})")

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise ScenarioError(f"pipeline {self.name} has no stage {name!r}")

    def longest_path(self, times_ms: Mapping[str, float]) -> tuple[float, tuple[str, ...]]:
        """The largest sum of ``times_ms`` along a source-to-sink path, and that path."""
        best: dict[str, tuple[float, tuple[str, ...]]] = {}
        for s in self.stages:
            before = max((best[p] for p in s.parents), default=(0.0, ()), key=lambda item: item[0])
            best[s.name] = (before[0] + times_ms[s.name], (*before[1], s.name))
        return max(best.values(), key=lambda item: item[0])


class DagError(ValueError):
    """Stages that do not form a DAG; ``stage`` is the one whose ``parents`` to look at."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage


def topological_order(parents: Mapping[str, Sequence[str]]) -> list[str]:
    """Stage names with every parent before its children, ties in the given order.

    Raises:
        DagError: a parent that is not a stage, or a cycle (the message names its stages in order).
    """
    for name, ps in parents.items():
        for p in ps:
            if p not in parents:
                raise DagError(name, f"parent {p!r} is not a stage")
    order: list[str] = []
    while len(order) < len(parents):
        ready = [n for n, ps in parents.items() if n not in order and all(p in order for p in ps)]
        if not ready:
            cycle = _cycle(parents, set(order))
            raise DagError(cycle[0], f"the parents form a cycle: {' -> '.join(cycle)}")
        order.append(ready[0])
    return order


def _cycle(parents: Mapping[str, Sequence[str]], done: set[str]) -> list[str]:
    """A cycle among the stages not in ``done``, in data-flow order, found by walking parents until one repeats."""
    walk = [next(n for n in parents if n not in done)]
    while True:
        nxt = next(p for p in parents[walk[-1]] if p not in done)
        if nxt in walk:
            return (walk[walk.index(nxt):] + [nxt])[::-1]
        walk.append(nxt)


def read_pipeline(path: str | Path) -> Pipeline:
    """Parse and check a pipeline file and read its stages' profiles; ``ScenarioError`` names the line and stage."""
    raw, reader = _Reader.read(path, "pipeline")
    return reader.pipeline(raw)


class _Reader(TomlFile):
    """Builds a Pipeline from parsed TOML, pointing each error at its line in the source."""

    def pipeline(self, raw: dict[str, Any]) -> Pipeline:
        self.unknown(raw, {"name", "slo_ms", "prices", "stages"}, "", None)
        prices = raw.get("prices", {})
        if not isinstance(prices, dict):
            self.fail("prices", "must be a table of hardware key = dollars per hour", None, 0, "prices")
        for key in prices:
            self.value(prices, key, float, ..., "prices.", "prices", positive=True)
        table = PriceTable(prices)
        stages = raw.get("stages")
        if not isinstance(stages, list) or not stages:
            self.fail("stages", "must list at least one [[stages]] table", None, 0, "name")
        built = [self.stage(s, i, table) for i, s in enumerate(stages)]
        names = [s.name for s in built]
        for i, name in enumerate(names):
            if name in names[:i]:
                self.fail(f"stages[{i}].name", f"{name!r} is used twice", "stages", i, "name")
        try:
            order = topological_order({s.name: s.parents for s in built})
        except DagError as err:
            i = names.index(err.stage)
            self.fail(f"stages[{i}].parents", f"(stage {err.stage}) {err}", "stages", i, "parents")
        name = self.value(raw, "name", str, self.path.stem, "")
        if not NAME.match(name):
            self.fail("name", f"must be letters, digits, '-' or '_' (up to 41); got {name!r}", None, 0, "name")
        return Pipeline(name, tuple(built[names.index(n)] for n in order),
                        self.value(raw, "slo_ms", float, None, "", positive=True), self.path.resolve())

    def stage(self, raw: Any, i: int, table: PriceTable) -> Stage:
        where, val, name = self.entry(raw, "stages", i, {"name", "artifact", "parents", "scale_factor", "hardware",
                                                          "batch_timeout_ms"})
        fail = lambda key, message: self.fail(f"{where}{key}", f"(stage {name}) {message}", "stages", i, key)  # noqa: E731
        parents, hardware = raw.get("parents", []), raw.get("hardware")
        if not (isinstance(parents, list) and all(isinstance(p, str) for p in parents)):
            fail("parents", f"must be a list of stage names; got {parents!r}")
        if hardware is not None and not (isinstance(hardware, list) and hardware
                                         and all(isinstance(h, str) for h in hardware)):
            fail("hardware", f"must be a non-empty list of hardware keys like \"cpu-1\"; got {hardware!r}")
        scale = val("scale_factor", float, 1.0)
        if not 0 < scale <= 1:
            fail("scale_factor", f"must be in (0, 1]; got {scale!r}")
        artifact, profile = self.profile(val("artifact", str, ...), name, fail)
        if hardware is not None:
            allowed = profile.restrict(hardware)
            if not allowed.points:
                fail("hardware", f"allows {', '.join(hardware)}, but the profile has only "
                                 f"{', '.join(profile.hardware) or 'nothing'}")
            profile = allowed
        prices: dict[str, float] = {}
        for key in profile.hardware:
            price = table.price(key)
            if price is None:
                fail("hardware" if hardware is not None else "artifact",
                     f"has no price for hardware {key}; add it to [prices]")
            prices[key] = price
        return Stage(name, artifact, tuple(parents), scale, profile, prices,
                     val("batch_timeout_ms", float, 0.0))

    def profile(self, artifact: str, stage: str, fail: Callable[[str, str], NoReturn]) -> tuple[Path, StageProfile]:
        """The stage's artifact folder and profile, from ``<artifact>/profile.json`` (or ``<artifact>/artifact/profile.json``)."""
        path = Path(artifact) if Path(artifact).is_absolute() else (self.path.parent / artifact).resolve()
        if not (path / "profile.json").is_file() and (path / "artifact" / "profile.json").is_file():
            path = path / "artifact"
        if not (path / "profile.json").is_file():
            fail("artifact", f"{path} has no profile.json")
        try:
            profile = StageProfile.from_profile(stage, read_profile(path / "profile.json"))
        except (ArtifactError, PlanError) as err:
            fail("artifact", str(err))
        return path, profile

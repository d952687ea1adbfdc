"""Synthetic but realistic profiles and pipeline files for the planner's tests.

Service times per batch of 1/2/4/8 on CPU containers of 0.5, 1 and 2 cores, written in the
real ``profile.json`` format so the tests read them the way the planner reads real ones.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

from containers.planner.pipeline import Pipeline, read_pipeline
from results.profile import LatencyStats, Profile, ProfileEntry

# ms per batch size on each container size: a small CNN (about 20 ms at batch 1 on one core) and a cheap pre-processor
CNN = {0.5: {1: 40.0, 2: 72.0, 4: 136.0, 8: 260.0}, 1: {1: 20.0, 2: 36.0, 4: 68.0, 8: 130.0},
       2: {1: 11.0, 2: 19.0, 4: 36.0, 8: 68.0}}
PRE = {0.5: {1: 4.0, 2: 6.0, 4: 10.0, 8: 18.0}, 1: {1: 2.0, 2: 3.0, 4: 5.0, 8: 9.0}}


def bimodal(fast_ms: float, slow_ms: float, slow_share: float) -> tuple[float, ...]:
    """The 0th..100th percentiles of service times that are ``slow_ms`` for ``slow_share`` of runs (a CPU quota's throttling)."""
    fast = round(100 * (1 - slow_share))
    return (fast_ms,) * fast + (slow_ms,) * (101 - fast)


def write_profile(folder: Path, table: dict[float, dict[int, float | tuple[float, ...] | LatencyStats]],
                  gpu: str | None = None, startup_s: float | None = None) -> Path:
    """An artifact folder holding only a ``profile.json``: one entry per (container size or GPU, batch size).

    A table value is a service time in ms (every run the same, as far as the Estimator knows),
    the 0th..100th percentiles of one (``bimodal``), or its ``LatencyStats`` as they are.
    ``startup_s``: every container's start, as profiled (None: not measured).
    """
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for cpus, rows in table.items():
        for batch, ms in rows.items():
            hw = ({"kind": "cuda", "device": gpu} if gpu else
                  {"kind": "cpu", "device": "znver4", "threads": math.ceil(cpus),
                   "cores": list(range(math.ceil(cpus))), "cpu_limit": cpus})
            if isinstance(ms, LatencyStats):
                stats = ms
            elif isinstance(ms, tuple):
                stats = LatencyStats(ms[50], ms[99], sum(ms) / len(ms), ms[0], ms)
            else:
                stats = LatencyStats(ms, ms * 1.3, ms, ms * 0.9)
            entries.append(ProfileEntry(hw, batch, stats, batch * 1e3 / stats.mean, 100, startup_s=startup_s))
    Profile("zoo:test", "llvm", tuple(entries)).write(folder / "profile.json")
    return folder


def write_pipeline(tmp_path: Path, body: str, profiles: dict[str, dict[float, dict[int, float]]],
                   startup_s: float | None = None) -> Path:
    """``tmp_path/pipeline.toml`` holding ``body``, with an artifact folder per entry of ``profiles`` beside it."""
    for name, table in profiles.items():
        write_profile(tmp_path / name, table, startup_s=startup_s)
    path = tmp_path / "pipeline.toml"
    path.write_text(textwrap.dedent(body))
    return path


CHAIN = """\
    name = "chain"
    slo_ms = 150

    [[stages]]
    name = "pre"
    artifact = "pre"

    [[stages]]
    name = "cnn"
    artifact = "cnn"
    parents = ["pre"]

    [[stages]]
    name = "post"
    artifact = "pre"
    parents = ["cnn"]
    scale_factor = 0.5
"""


@pytest.fixture
def chain(tmp_path: Path) -> Pipeline:
    """pre (cheap) -> cnn (the bottleneck) -> post (half the queries)."""
    return read_pipeline(write_pipeline(tmp_path, CHAIN, {"pre": PRE, "cnn": CNN}))


def one_stage(tmp_path: Path, table: dict[float, dict[int, float]], timeout_ms: float = 0,
              startup_s: float | None = None) -> Pipeline:
    """A pipeline of one stage ``m`` profiled as ``table`` (its containers starting in ``startup_s``)."""
    body = f'name = "one"\n[[stages]]\nname = "m"\nartifact = "m"\nbatch_timeout_ms = {timeout_ms}\n'
    return read_pipeline(write_pipeline(tmp_path, body, {"m": table}, startup_s))

"""Profile an artifact in real containers: latency and throughput per (container size, batch size).

A container size is a CPU limit in cores (a CFS quota); the container is pinned to
``ceil(limit)`` cores and its server runs that many TVM threads. Each configuration is
started on a backend, warmed up, then driven by one closed-loop client (no queueing), so
the latency recorded is the service time a request sees, HTTP included, and the runs in order
say how long slow spells last (``results.profile.Persistence``). Then the same client rests
``IDLE_GAP`` times the mean service time before each request, as a replica at about 25% load
would: a server that rested serves slower than one kept busy. Each entry also says how long
its container took to start serving (``startup_s``: a boosted start, ``backends.base``, as the
planner's replicas get). The entries join the artifact's ``profile.json``, which the placement
planner reads.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from containers.backends.base import ContainerBackend, ContainerSpec
from containers.errors import ScenarioError
from containers.load import LoadClient
from results.profile import LatencyStats, Profile, ProfileEntry

IDLE_GAP = 3.0  # rest before each idle-phase request, in mean service times: the mean gap at 25% load
MIN_IDLE_SAMPLES = 20  # the idle phase runs long enough for these, up to three times the closed loop's time


@dataclass(frozen=True)
class ContainerSize:
    """A CPU container: ``cpus`` cores of quota on ``cores`` pinned cores."""

    cpus: float
    cores: tuple[int, ...]

    @property
    def threads(self) -> int:
        return len(self.cores)

    @classmethod
    def parse(cls, text: str, available: Sequence[int]) -> ContainerSize:
        try:
            cpus = float(text)
        except ValueError:
            raise ScenarioError(f"container size {text!r} is not a number of cores (e.g. 0.5, 1, 2)") from None
        if not 0 < cpus <= len(available):
            raise ScenarioError(f"container size {text} must be above 0 and at most the {len(available)} cores here")
        return cls(cpus, tuple(available[: math.ceil(cpus)]))


def profile_in_containers(backend: ContainerBackend, artifact: Path, sizes: Sequence[ContainerSize],
                          batch_sizes: Sequence[int], seconds: float = 5.0, warmup_s: float = 1.0,
                          base_port: int = 18650) -> list[ProfileEntry]:
    """One entry per (size, batch size), each measured in a fresh container of that size."""
    from containers.qoe.run import request_inputs
    from results.artifact import open_artifact

    device = open_artifact(artifact).manifest["target"]["device"]
    entries = []
    for i, size in enumerate(sizes):
        spec = ContainerSpec(f"profile-{i}", artifact, base_port + i, size.threads, size.cpus, size.cores)
        asked = time.monotonic()
        backend.start(spec)
        startup_s = round(time.monotonic() - asked, 3)
        try:
            for batch in batch_sizes:
                inputs = request_inputs(artifact, batch)
                LoadClient([spec.url], inputs).run_for(warmup_s)
                records = [r for r in LoadClient([spec.url], inputs).run_for(seconds) if r.ok]
                if not records:
                    raise ScenarioError(f"no request succeeded on {spec.name} ({size.cpus:g} cores, batch {batch})")
                busy = LatencyStats.from_seconds([r.latency_s for r in records], [r.sent_at for r in records])
                gap_s = IDLE_GAP * busy.mean / 1e3
                after_rest = [r for r in LoadClient([spec.url], inputs, think_s=gap_s).run_for(
                    min(3 * seconds, max(seconds, MIN_IDLE_SAMPLES * (gap_s + busy.mean / 1e3)))) if r.ok]
                entries.append(ProfileEntry(
                    hardware={"kind": "cpu", "device": device, "threads": size.threads, "cores": list(size.cores),
                              "cpu_limit": size.cpus, "container": backend.kind},
                    batch_size=batch, latency_ms=busy, throughput_per_s=round(batch * len(records) / seconds, 2),
                    samples=len(records),
                    idle_latency_ms=LatencyStats.from_seconds([r.latency_s for r in after_rest]) if after_rest else None,
                    idle_gap_ms=round(gap_s * 1e3, 3) if after_rest else None, startup_s=startup_s))
        finally:
            backend.stop(spec.name)
    return entries


def merge_profile(profile: Profile, entries: Sequence[ProfileEntry]) -> Profile:
    """``profile`` with ``entries`` added; an entry for the same container size and batch replaces the old one."""
    def key(e: ProfileEntry) -> tuple[object, ...]:
        return e.hardware.get("cpu_limit"), tuple(e.hardware.get("cores", ())), e.batch_size

    new = {key(e) for e in entries}
    kept = tuple(e for e in profile.entries if key(e) not in new)
    return replace(profile, entries=kept + tuple(entries))


def available_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))

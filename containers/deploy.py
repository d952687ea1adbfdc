"""Multi-container deployment schemes: one model as k containers of t threads, pinned or not, behind a balancer.

A scheme ``KxT`` runs K containers of T TVM threads each. Pinned (the default), container i
gets cores ``[i*T, (i+1)*T)`` as its cpuset, so containers never share a core or its caches;
``KxTu`` leaves them unpinned for the scheduler to place. ``compare_schemes`` serves the
same artifact under each scheme in turn and drives them with the same load.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from containers.backends.base import ContainerBackend, ContainerSpec
from containers.errors import ScenarioError
from containers.load import Arrivals, LoadClient

SCHEME = re.compile(r"^(\d+)x(\d+)(u?)$")


@dataclass(frozen=True)
class Scheme:
    containers: int
    threads: int
    pinned: bool = True

    @property
    def name(self) -> str:
        return f"{self.containers}x{self.threads}{'' if self.pinned else 'u'}"

    @classmethod
    def parse(cls, text: str, cores: int) -> Scheme:
        """``2x1`` (pinned) or ``2x1u`` (unpinned); refuses one that needs more cores than ``cores``."""
        m = SCHEME.match(text.strip())
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            raise ScenarioError(f"deployment scheme {text!r} is not KxT or KxTu (e.g. 1x2, 2x1, 2x1u)")
        scheme = cls(int(m.group(1)), int(m.group(2)), not m.group(3))
        if scheme.pinned and scheme.containers * scheme.threads > cores:
            raise ScenarioError(f"scheme {scheme.name} pins {scheme.containers * scheme.threads} cores; "
                                f"this machine has {cores}")
        return scheme

    def specs(self, name: str, artifact: Path, base_port: int, cores: list[int]) -> list[ContainerSpec]:
        t = self.threads
        return [ContainerSpec(f"{name}-{self.name}-{i}", artifact, base_port + i, t, None,
                              tuple(cores[i * t:(i + 1) * t]) if self.pinned else None)
                for i in range(self.containers)]


def compare_schemes(backend: ContainerBackend, artifact: Path, schemes: list[Scheme], inputs: list[np.ndarray],
                    duration_s: float, concurrency: int, arrivals: Arrivals | None = None, base_port: int = 18600,
                    warmup_s: float = 2.0) -> list[dict[str, Any]]:
    """Throughput and latency of each scheme under the same load, one scheme at a time."""
    cores = sorted(os.sched_getaffinity(0))
    rows = []
    for scheme in schemes:
        specs = scheme.specs("deploy", artifact, base_port, cores)
        try:
            for spec in specs:
                backend.start(spec)
            urls = [s.url for s in specs]
            LoadClient(urls, inputs, arrivals, concurrency).run_for(warmup_s)
            records = LoadClient(urls, inputs, arrivals, concurrency, seed=1).run_for(duration_s)
        finally:
            backend.stop_all(spec.name for spec in specs)
        ok = np.array([r.latency_s for r in records if r.ok]) * 1e3
        rows.append({
            "scheme": scheme.name, "containers": scheme.containers, "threads": scheme.threads, "pinned": scheme.pinned,
            "requests": len(records), "failed": sum(not r.ok for r in records),
            "throughput_per_s": round(len(ok) * inputs[0].shape[0] / duration_s, 1),
            "p50_ms": round(float(np.percentile(ok, 50)), 3) if len(ok) else None,
            "p99_ms": round(float(np.percentile(ok, 99)), 3) if len(ok) else None,
        })
    return rows

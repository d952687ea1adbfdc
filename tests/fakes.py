"""Fakes for unit tests of code above the container backend (one place, per STYLE).

``SimulatedHost`` stands in for a worker whose containers serve closed-loop clients: each
container needs ``work_ms`` of one core per request, gets CPU by CFS-like water-filling
of the host's cores under its limit, and so answers in ``work_ms / cores`` ms. It is the
backend (start, resize, usage, stop, list) and the Application Monitor's scraper at once.
``SlowInferenceClient`` stands in for the model server's client: every request is answered, slowly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from containers.backends.base import ContainerBackend, ContainerInfo, ContainerSpec
from containers.client import InferenceReply
from containers.errors import ContainerError, UnknownContainer
from containers.qoe.monitors import HistogramSnapshot

REQUESTS_PER_SCRAPE = 10


@dataclass
class _Container:
    spec: ContainerSpec
    work_ms: float
    running: bool = True
    count: float = 0.0
    total_s: float = 0.0


class SimulatedHost(ContainerBackend):
    kind = "simulated"

    def __init__(self, cpus: float, work_ms: dict[str, float]) -> None:
        self.cpus = cpus
        self.work_ms = work_ms
        self.containers: dict[str, _Container] = {}
        self.resizes = 0
        self.failing_starts: set[str] = set()  # names the engine refuses to start
        self.failing_stops: set[str] = set()  # names the engine refuses to stop (they keep running)

    def start(self, spec: ContainerSpec, timeout_s: float = 60.0, boost: bool = True) -> ContainerInfo:
        if spec.name in self.containers and self.containers[spec.name].running:
            raise ContainerError(f"container {spec.name} already runs")
        if spec.name in self.failing_starts:
            raise ContainerError(f"container {spec.name} did not start")
        self.containers[spec.name] = _Container(spec, self.work_ms[spec.name])
        return self._info(self.containers[spec.name])

    def resize(self, name: str, cpus: float | None, cpuset: tuple[int, ...] | None = None) -> None:
        c = self._get(name)
        c.spec = replace(c.spec, cpus=cpus)
        self.resizes += 1

    def usage(self, name: str) -> float:
        self._get(name)
        return self.cores()[name]

    def stop(self, name: str) -> None:
        if name in self.failing_stops:
            raise ContainerError(f"the engine refused to stop container {name}")
        self.containers.pop(name, None)

    def pause(self, name: str) -> None:
        self._get(name).running = False

    def resume(self, name: str) -> None:
        self.containers[name].running = True

    def list(self) -> list[ContainerInfo]:
        return [self._info(c) for c in self.containers.values()]

    def kill(self, name: str) -> None:
        self.containers[name].running = False

    def cores(self) -> dict[str, float]:
        """Water-filling: each running container gets an equal share, capped by its limit."""
        live = {n: (c.spec.cpus or self.cpus) for n, c in self.containers.items() if c.running}
        got = {n: 0.0 for n in live}
        left = self.cpus
        while live and left > 1e-9:
            share = left / len(live)
            capped = {n: cap for n, cap in live.items() if cap - got[n] <= share}
            if not capped:
                for n in live:
                    got[n] += share
                break
            for n, cap in capped.items():
                left -= cap - got[n]
                got[n] = cap
                del live[n]
        return got

    def response_ms(self, name: str) -> float:
        return self.containers[name].work_ms / self.cores()[name]

    def scrape(self, url: str) -> HistogramSnapshot | None:
        name = next((n for n, c in self.containers.items() if c.spec.url == url and c.running), None)
        if name is None:
            return None
        c = self.containers[name]
        c.count += REQUESTS_PER_SCRAPE
        c.total_s += REQUESTS_PER_SCRAPE * self.response_ms(name) / 1e3
        return HistogramSnapshot((float("inf"),), (c.count,), c.total_s, c.count)

    def _get(self, name: str) -> _Container:
        c = self.containers.get(name)
        if c is None or not c.running:
            raise UnknownContainer(f"no running container named {name!r}")
        return c

    def _info(self, c: _Container) -> ContainerInfo:
        return ContainerInfo(c.spec, c.running, c.spec.cpus, c.spec.cpuset, c.spec.name)


def spec(name: str, port: int) -> ContainerSpec:
    """A container spec for the simulated host (its artifact is never opened)."""
    return ContainerSpec(name=name, artifact=Path("/nonexistent"), port=port)


class SlowInferenceClient:
    """``containers.client.InferenceClient`` without a server: each request is answered after ``seconds``."""

    seconds = 0.05

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url

    def infer(self, arrays: list[np.ndarray]) -> InferenceReply:
        time.sleep(self.seconds)
        return InferenceReply([], self.seconds * 1e3, self.seconds * 1e3, self.seconds * 1e3)

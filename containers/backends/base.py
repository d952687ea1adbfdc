"""The container backend: what the QoE manager and the planner may ask of a container engine.

A backend starts model servers, changes their CPU limit and cpuset while they run,
reports the CPU they use, pauses and resumes them (a warm standby holds memory, no CPU),
and stops them. It holds no policy: who gets how much CPU
is decided above it (``containers.qoe``) and handed down as numbers.

A start is boosted (``startup_boost``, as Kubernetes' startup CPU boost): the server loads
with no CFS quota on its cpuset and takes its limit once it answers, so a half-core replica
starts as soon as a whole-core one and a replica the planner's Tuner adds serves sooner. A
neighbour on the same cores keeps its fair share meanwhile (equal CFS weights), which is all
its own quota allows it on a shared core.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Callable, Iterable
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from containers.errors import ContainerError

if TYPE_CHECKING:
    from requests import Response

HOST = "127.0.0.1"


@dataclass(frozen=True)
class ContainerSpec:
    """One model server to run.

    Attributes:
        name: unique among the backend's containers; letters, digits, ``-`` and ``_``.
        artifact: the artifact folder the server loads (its hashes are checked there).
        port: the server's port on ``host``.
        threads: TVM runtime threads inside the server.
        cpus: CPU limit in cores (a CFS quota); None for no limit.
        cpuset: cores the container may run on; None for any.
        host: the address the server binds.
    """

    name: str
    artifact: Path
    port: int
    threads: int = 1
    cpus: float | None = None
    cpuset: tuple[int, ...] | None = None
    host: str = HOST

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True)
class ContainerInfo:
    """A container as the backend sees it now."""

    spec: ContainerSpec
    running: bool
    cpus: float | None
    cpuset: tuple[int, ...] | None
    ident: str  # the engine's id (Docker) or the server's pid (local)


class ContainerBackend(ABC):
    """Start, resize, observe and stop model-server containers."""

    kind: str = ""
    startup_boost: bool = True  # a start runs without its CPU limit (its cpuset holds) until the server answers

    @abstractmethod
    def start(self, spec: ContainerSpec, timeout_s: float = 60.0, boost: bool = True) -> ContainerInfo:
        """Start ``spec`` and return once its server answers ``/health``; ``boost``: as ``startup_boost`` has it
        (False: under its limit throughout, for a start nothing waits on that must not crowd its neighbours).

        Raises:
            ContainerError: the name is taken, or the server did not become healthy in time.
            BackendUnavailable: the engine cannot be reached.
        """

    @abstractmethod
    def resize(self, name: str, cpus: float | None, cpuset: tuple[int, ...] | None = None) -> None:
        """Set the CPU limit (cores; None lifts it) and, when given, the cpuset of a running container."""

    @abstractmethod
    def usage(self, name: str) -> float:
        """CPU the container used since the previous call for it (cores, e.g. 0.5 = half a core)."""

    @abstractmethod
    def stop(self, name: str) -> None:
        """Stop and remove the container; stopping one already gone is not an error."""

    @abstractmethod
    def pause(self, name: str) -> None:
        """Freeze a running container: it keeps its memory and state, and uses no CPU until ``resume``."""

    @abstractmethod
    def resume(self, name: str) -> None:
        """Thaw a paused container; its server answers again within milliseconds."""

    @abstractmethod
    def list(self) -> list[ContainerInfo]:
        """Every container this backend started and has not stopped, running or not."""

    def close(self) -> None:
        """Stop every container this backend started."""
        self.stop_all(info.spec.name for info in self.list())

    def stop_all(self, names: Iterable[str]) -> None:
        """Stop every container in ``names``, each one even when a stop before it failed.

        Raises:
            ContainerError: a container did not stop (that stop's own error), or several did not (one error
                naming each); the others were stopped all the same.
        """
        errors: list[ContainerError] = []
        for name in list(names):
            try:
                self.stop(name)
            except ContainerError as err:
                errors.append(err)
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise ContainerError(f"{len(errors)} containers did not stop: {'; '.join(map(str, errors))}") from errors[0]

    def start_cpus(self, spec: ContainerSpec, boost: bool = True) -> float | None:
        """The CPU limit a start of ``spec`` runs under until its server answers."""
        return None if self.startup_boost and boost else spec.cpus

    def settle(self, spec: ContainerSpec, boost: bool = True) -> None:
        """Give a started ``spec`` its own CPU limit, if the start ran without it."""
        if self.start_cpus(spec, boost) != spec.cpus:
            self.resize(spec.name, spec.cpus, spec.cpuset)

    def info(self, name: str) -> ContainerInfo:
        from containers.errors import UnknownContainer

        for info in self.list():
            if info.spec.name == name:
                return info
        raise UnknownContainer(f"no container named {name!r}; running: {', '.join(i.spec.name for i in self.list()) or 'none'}")


def check_port_free(spec: ContainerSpec) -> None:
    """Refuse a start on a port something already holds.

    Its server could not bind the port, and whatever answers there would be taken for it.
    The probe binds as the server does (``SO_REUSEADDR``), so a stopped server's lingering
    connections do not count.

    Raises:
        ContainerError: naming the port and the container.
    """
    family = socket.AF_INET6 if ":" in spec.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((spec.host, spec.port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise ContainerError(f"port {spec.port} on {spec.host} is already in use; container {spec.name} cannot "
                                     f"serve there (stop what holds it or give the container another port)") from None
            raise ContainerError(f"container {spec.name} cannot bind port {spec.port} on {spec.host}: "
                                 f"{err.strerror or err}") from None


def wait_healthy(spec: ContainerSpec, timeout_s: float, alive: Callable[[], bool] | None = None) -> None:
    """Poll the server's ``/health`` until it answers 200 with this container's name; raise ``ContainerError``
    after ``timeout_s``, or at once when another server answers on the port.

    ``alive`` (when given) is asked between polls so a server that died is reported at once.
    """
    import requests

    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise ContainerError(f"container {spec.name} exited before its server answered /health")
        try:
            reply = requests.get(f"{spec.url}/health", timeout=2)
            if reply.status_code == 200:
                answered = _health_name(reply)
                if answered == spec.name:
                    return
                raise ContainerError(f"port {spec.port} on {spec.host} answers /health as "
                                     f"{'server ' + repr(answered) if answered else 'something else'}, not as "
                                     f"container {spec.name}: another server holds the port")
            last = f"HTTP {reply.status_code}"
        except requests.RequestException as err:
            last = type(err).__name__
        time.sleep(0.2)
    raise ContainerError(f"container {spec.name} did not answer {spec.url}/health within {timeout_s:.0f} s ({last})")


def reply_object(reply: Response) -> dict[str, Any] | None:
    """A reply's JSON object, or None when its body is not one (another program may answer on a port)."""
    try:
        document = reply.json()
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def _health_name(reply: Response) -> str | None:
    """The ``name`` a ``/health`` reply gives, or None when it is not a model server's reply."""
    name = (reply_object(reply) or {}).get("name")
    return name if isinstance(name, str) else None

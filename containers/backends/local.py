"""The local backend: model servers as plain processes, their CPU limited by a cgroup of their own.

For machines without a Docker engine. A cgroup's CFS quota and cpuset are what Docker itself
writes, so limits behave the same; where the cgroup tree cannot be written (not root, a
delegated or read-only hierarchy) the backend says so and pins cores instead, which can
only approximate a fractional limit.
"""

from __future__ import annotations

import errno
import math
import os
import signal
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from containers.backends import (PERIOD_US, cfs_quota, check_limits, check_spec, cores_text, server_command,
                                 start_failure, terminate)
from containers.backends.base import ContainerBackend, ContainerInfo, ContainerSpec, check_port_free, wait_healthy
from containers.errors import BackendUnavailable, ContainerError, UnknownContainer

GROUP = "autotune"
STOP_GRACE_S = 5.0


class LocalBackend(ContainerBackend):
    """Model servers as processes of this machine, each in its own session and cgroup.

    Args:
        cgroup_root: where the cgroup hierarchies are mounted (v2 when it has ``cgroup.controllers``).
        log_dir: where each server's output goes (``NAME.log``); a temporary folder by default.
        startup_boost: start each server without its CPU limit until it answers (``base``).

    Attributes:
        limits: how limits are enforced: ``"cgroup v1"``, ``"cgroup v2"`` or ``"core affinity only"``.
        warning: one line saying why limits are only approximated, or None when cgroups are used.
    """

    kind = "local"

    def __init__(self, cgroup_root: Path = Path("/sys/fs/cgroup"), log_dir: Path | None = None,
                 startup_boost: bool = True) -> None:
        self.cgroup_root, self.startup_boost = Path(cgroup_root), startup_boost
        self.log_dir = log_dir
        self._logs: Path | None = None  # log_dir, or a temporary folder made at the first start
        self._limiter, self.warning = _choose_limiter(self.cgroup_root)
        self.limits = self._limiter.limits
        self._servers: dict[str, _Server] = {}

    def start(self, spec: ContainerSpec, timeout_s: float = 60.0, boost: bool = True) -> ContainerInfo:
        check_spec(spec)
        if spec.name in self._servers:
            raise ContainerError(f"a container named {spec.name!r} already exists; stop it first")
        check_port_free(spec)
        if self._logs is None:
            self._logs = Path(self.log_dir) if self.log_dir else Path(tempfile.mkdtemp(prefix="autotune-local-"))
        log_path = self._logs / f"{spec.name}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(server_command(spec), stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True,
                                       env={**os.environ, "TVM_NUM_THREADS": str(spec.threads)})
        server = self._servers[spec.name] = _Server(spec, process, self.start_cpus(spec, boost), spec.cpuset)
        try:
            with _cgroup_errors(spec.name):
                self._limiter.attach(spec.name, process.pid)
                self._limiter.limit(spec.name, process.pid, server.cpus, spec.cpuset)
            wait_healthy(spec, timeout_s, alive=lambda: process.poll() is None)
            self.settle(spec, boost)
        except BackendUnavailable:
            self.stop(spec.name)
            raise
        except ContainerError as err:
            self.stop(spec.name)
            raise start_failure(err, log_path.read_text(errors="replace")) from None
        server.baseline = (_cpu_seconds(process.pid), time.monotonic())
        return self.info(spec.name)

    def resize(self, name: str, cpus: float | None, cpuset: tuple[int, ...] | None = None) -> None:
        check_limits(name, cpus, cpuset)
        server = self._server(name)
        cpuset = cpuset if cpuset is not None else server.cpuset
        with _cgroup_errors(name):
            self._limiter.limit(name, server.process.pid, cpus, cpuset)
        server.cpus, server.cpuset = cpus, cpuset

    def usage(self, name: str) -> float:
        server = self._server(name)
        if server.process.poll() is not None:
            return 0.0
        now = (_cpu_seconds(server.process.pid), time.monotonic())
        before, server.baseline = server.baseline, now
        return max(0.0, (now[0] - before[0]) / max(now[1] - before[1], 1e-3))

    def stop(self, name: str) -> None:
        server = self._servers.pop(name, None)
        if server is None:
            return
        try:
            os.killpg(server.process.pid, signal.SIGCONT)  # a paused server takes its SIGTERM only once thawed
        except ProcessLookupError:
            pass
        terminate(server.process, STOP_GRACE_S)
        with _cgroup_errors(name):
            self._limiter.detach(name)

    def pause(self, name: str) -> None:
        self._signal(name, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self._signal(name, signal.SIGCONT)

    def _signal(self, name: str, sig: signal.Signals) -> None:
        """Send ``sig`` to the server's process group (it runs in a session of its own)."""
        server = self._server(name)
        try:
            os.killpg(server.process.pid, sig)
        except ProcessLookupError:
            raise ContainerError(f"container {name}'s server has exited; it cannot be paused or resumed") from None

    def list(self) -> list[ContainerInfo]:
        return [ContainerInfo(spec=server.spec, running=server.process.poll() is None, cpus=server.cpus,
                              cpuset=server.cpuset, ident=str(server.process.pid))
                for server in self._servers.values()]

    def _server(self, name: str) -> _Server:
        if name not in self._servers:
            running = ", ".join(self._servers) or "none"
            raise UnknownContainer(f"no container named {name!r}; this backend runs: {running}")
        return self._servers[name]


@dataclass
class _Server:
    spec: ContainerSpec
    process: subprocess.Popen
    cpus: float | None
    cpuset: tuple[int, ...] | None
    baseline: tuple[float, float] = (0.0, 0.0)  # (CPU s, monotonic s) at the previous usage()


class _Limiter(ABC):
    """How a server process's CPU is limited: its group made and joined, limits set, group removed."""

    limits = ""

    def prepare(self) -> None:
        """Check (and make) what every group needs, so a tree that cannot be used is found up front."""

    def attach(self, name: str, pid: int) -> None:
        """Put the process in a group of its own."""

    @abstractmethod
    def limit(self, name: str, pid: int, cpus: float | None, cpuset: tuple[int, ...] | None) -> None:
        """Apply a CPU limit (None: none) and cpuset (None: any core) to a running process."""

    def detach(self, name: str) -> None:
        """Remove the process's group once the process is gone."""


class _CgroupV1(_Limiter):
    """``cpu/autotune/NAME`` for the CFS quota, ``cpuset/autotune/NAME`` for cores."""

    limits = "cgroup v1"

    def __init__(self, root: Path) -> None:
        self.cpu, self.cpuset = root / "cpu" / GROUP, root / "cpuset" / GROUP

    def prepare(self) -> None:
        for base, control in ((self.cpu, "cpu.cfs_quota_us"), (self.cpuset, "cpuset.cpus")):
            base.mkdir(exist_ok=True)
            if not (base / control).exists():
                raise FileNotFoundError(errno.ENOENT, "not a cgroup controller", str(base.parent))
        _inherit_cpuset(self.cpuset)

    def attach(self, name: str, pid: int) -> None:
        for base in (self.cpu, self.cpuset):
            (base / name).mkdir(exist_ok=True)
        _inherit_cpuset(self.cpuset / name)
        for base in (self.cpu, self.cpuset):
            (base / name / "cgroup.procs").write_text(str(pid))

    def limit(self, name: str, pid: int, cpus: float | None, cpuset: tuple[int, ...] | None) -> None:
        (self.cpu / name / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (self.cpu / name / "cpu.cfs_quota_us").write_text(str(cfs_quota(cpus) if cpus else -1))
        any_core = (self.cpuset / "cpuset.cpus").read_text().strip()
        (self.cpuset / name / "cpuset.cpus").write_text(cores_text(cpuset) if cpuset else any_core)

    def detach(self, name: str) -> None:
        for base in (self.cpu, self.cpuset):
            _remove_group(base / name)


class _CgroupV2(_Limiter):
    """``autotune/NAME`` with ``cpu.max`` and ``cpuset.cpus``, the controllers enabled down to it."""

    limits = "cgroup v2"

    def __init__(self, root: Path) -> None:
        self.root, self.base = root, root / GROUP

    def prepare(self) -> None:
        (self.root / "cgroup.subtree_control").write_text("+cpu +cpuset")
        self.base.mkdir(exist_ok=True)
        (self.base / "cgroup.subtree_control").write_text("+cpu +cpuset")

    def attach(self, name: str, pid: int) -> None:
        (self.base / name).mkdir(exist_ok=True)
        (self.base / name / "cgroup.procs").write_text(str(pid))

    def limit(self, name: str, pid: int, cpus: float | None, cpuset: tuple[int, ...] | None) -> None:
        (self.base / name / "cpu.max").write_text(f"{cfs_quota(cpus) if cpus else 'max'} {PERIOD_US}")
        (self.base / name / "cpuset.cpus").write_text(cores_text(cpuset) if cpuset else "")  # "": the parent's

    def detach(self, name: str) -> None:
        _remove_group(self.base / name)


class _Affinity(_Limiter):
    """Core affinity of every thread: a cpuset exactly, a limit of c cores as floor(c) whole cores."""

    limits = "core affinity only"

    def limit(self, name: str, pid: int, cpus: float | None, cpuset: tuple[int, ...] | None) -> None:
        import psutil

        cores = list(cpuset or sorted(os.sched_getaffinity(0)))
        if cpus:
            cores = cores[:max(1, math.floor(cpus))]
        try:
            root = psutil.Process(pid)
            for process in (root, *root.children(recursive=True)):
                for thread in process.threads():  # the affinity call sets one thread, not the process
                    os.sched_setaffinity(thread.id, cores)
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass  # it exited; start() and list() report that


def _choose_limiter(root: Path) -> tuple[_Limiter, str | None]:
    """v2 where the root has ``cgroup.controllers``, else v1; affinity (and a warning) when that fails."""
    limiter: _Limiter = _CgroupV2(root) if (root / "cgroup.controllers").exists() else _CgroupV1(root)
    try:
        limiter.prepare()
    except OSError as err:
        return _Affinity(), (f"cannot use {limiter.limits} under {root} ({err.strerror or err}: {err.filename}); "
                             f"CPU limits are approximated by core affinity: a limit of c cores gives floor(c) "
                             f"whole cores (at least one)")
    return limiter, None


@contextmanager
def _cgroup_errors(name: str) -> Iterator[None]:
    try:
        yield
    except OSError as err:
        raise BackendUnavailable(f"could not set the cgroup of container {name}: {err.strerror or err} "
                                 f"({err.filename})") from None


def _inherit_cpuset(group: Path) -> None:
    """A new v1 cpuset group has no cores and no memory nodes, and takes no process until given its parent's."""
    for control in ("cpuset.cpus", "cpuset.mems"):
        if not (group / control).read_text().strip():
            (group / control).write_text((group.parent / control).read_text().strip())


def _remove_group(group: Path) -> None:
    """rmdir a group, waiting briefly for killed members to leave it."""
    deadline = time.monotonic() + 2.0
    while True:
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as err:
            if err.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _cpu_seconds(pid: int) -> float:
    """CPU time of the process and its reaped children; 0 once it is gone."""
    import psutil

    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return times.user + times.system + times.children_user + times.children_system

"""Container backends: one interface (``base.ContainerBackend``), one file per engine."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from typing import Any

from containers.backends.base import ContainerBackend, ContainerSpec
from containers.errors import BackendUnavailable, ContainerError, ScenarioError

KINDS = ("docker", "local", "auto")
PERIOD_US = 100_000  # the CFS period every backend uses, as Docker's --cpus does
MIN_CPUS = 0.01  # the kernel's smallest CFS quota: 1 ms per 100 ms period
_NAME = re.compile(r"[A-Za-z0-9_-]+")
_LOG_LINES = 5


def create_backend(kind: str | ContainerBackend, **kwargs: Any) -> ContainerBackend:
    """The backend named ``kind`` (or ``kind`` itself when it already is one).

    Args:
        kind: ``"docker"`` (a running engine), ``"local"`` (processes in cgroups), ``"auto"``
            (docker when an engine answers, else local), or a backend instance.
        **kwargs: passed to the chosen backend's constructor (``client`` for docker, which
            otherwise connects to the standard engine; ``cgroup_root``/``log_dir`` for local).

    Raises:
        ContainerError: an unknown kind, or options given with an instance.
        BackendUnavailable: ``"docker"`` was asked for and no engine answers.
    """
    if isinstance(kind, ContainerBackend):
        if kwargs:
            raise ContainerError(f"options {sorted(kwargs)} apply only to a backend named by kind, "
                                 f"not to one given as an instance")
        return kind
    if kind not in KINDS:
        raise ContainerError(f"The backend kind must be one of {', '.join(KINDS)}. Got {kind!r} instead.")
    if kind in ("docker", "auto"):
        from containers.backends.docker import DockerBackend
        from containers.backends.engine import engine_client

        try:
            client = kwargs.pop("client", None) or engine_client()
        except BackendUnavailable:
            if kind == "docker":
                raise
        else:
            return DockerBackend(client, **kwargs)
    from containers.backends.local import LocalBackend

    return LocalBackend(**kwargs)


def check_spec(spec: ContainerSpec) -> None:
    """Reject a spec no backend can run, before anything is started.

    Raises:
        ScenarioError: naming the field, what it must be and what was given.
    """
    if not isinstance(spec.name, str) or not _NAME.fullmatch(spec.name):
        raise ScenarioError(f"The container name must be letters, digits, '-' and '_' only. Got {spec.name!r} instead.")
    if not isinstance(spec.port, int) or not 0 < spec.port < 65536:
        raise ScenarioError(f"The 'port' of container {spec.name} must be 1..65535. Got {spec.port!r} instead.")
    if not isinstance(spec.threads, int) or spec.threads < 1:
        raise ScenarioError(f"The 'threads' of container {spec.name} must be a positive integer. "
                            f"Got {spec.threads!r} instead.")
    if not spec.artifact.exists():
        raise ScenarioError(f"The 'artifact' of container {spec.name} must exist. Got {str(spec.artifact)!r} instead.")
    check_limits(spec.name, spec.cpus, spec.cpuset)


def check_limits(name: str, cpus: float | None, cpuset: tuple[int, ...] | None) -> None:
    """Reject a CPU limit or cpuset the kernel would refuse (or silently misread)."""
    if cpus is not None and (not isinstance(cpus, (int, float)) or not MIN_CPUS <= cpus <= (os.cpu_count() or 1)):
        raise ScenarioError(f"The 'cpus' of container {name} must be None or {MIN_CPUS}..{os.cpu_count()} cores. "
                            f"Got {cpus!r} instead.")
    cores = range(os.cpu_count() or 1)
    if cpuset is not None and (not cpuset or any(not isinstance(core, int) or core not in cores for core in cpuset)):
        raise ScenarioError(f"The 'cpuset' of container {name} must be None or a non-empty tuple of cores in "
                            f"0..{cores[-1]}. Got {cpuset!r} instead.")


def cfs_quota(cpus: float) -> int:
    """The CFS quota (microseconds per ``PERIOD_US``) that allows ``cpus`` cores."""
    return int(round(cpus * PERIOD_US))


def cores_text(cpuset: tuple[int, ...]) -> str:
    """A cpuset as the kernel and Docker write it: ``"0,2"``."""
    return ",".join(str(core) for core in cpuset)


def server_command(spec: ContainerSpec) -> list[str]:
    """The model server's command line; absolute paths, so it runs the same inside a container."""
    return [sys.executable, "-m", "containers.server", str(spec.artifact.resolve()), "--port", str(spec.port),
            "--host", spec.host, "--threads", str(spec.threads), "--name", spec.name]


def start_failure(err: ContainerError, log: str) -> ContainerError:
    """``err`` with the end of the server's log, where the reason it did not come up usually is."""
    lines = [line.strip() for line in log.splitlines() if line.strip()][-_LOG_LINES:]
    return ContainerError(f"{err}; its log ends: {' | '.join(lines)}" if lines else str(err))


def terminate(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM ``process``'s group (it leads one of its own), SIGKILL what is left after ``grace_s``, reap it."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass  # the whole group is gone
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            pass

"""The Docker backend: each model server in a container, its CPU limited by the CFS quota.

There is no registry to pull from, so the image is a tiny root file system made here, and
the host's Python, virtual environment, project and artifact are bind-mounted read-only at
their own paths: the container runs exactly the code and libraries the host runs.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import tarfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import containers
from containers.backends import (PERIOD_US, cfs_quota, check_limits, check_spec, cores_text, server_command,
                                 start_failure)
from containers.backends.base import ContainerBackend, ContainerInfo, ContainerSpec, check_port_free, wait_healthy
from containers.backends.engine import not_answering, one_line
from containers.errors import BackendUnavailable, ContainerError, UnknownContainer

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.containers import Container

IMAGE = "autotune-runtime"
MANAGED = "autotune.managed"
PREFIX = "autotune-"
_PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
_GROUP = "root:x:0:\nnogroup:x:65534:\n"


class DockerBackend(ContainerBackend):
    """Model servers as Docker containers on the host network, unprivileged.

    ``list`` reports every container labelled ``autotune.managed`` (started by any instance or
    process, so a CLI can see what an earlier command started); ``close`` stops only those this
    instance started.

    A server runs as ``user`` with no capabilities and no way to gain privileges: it shares the
    host's network, so root in it would be root on the host's interfaces. The invoking user's
    uid:gid by default, as the local backend runs: the artifact is theirs to read (older ones
    were written readable by their owner only).

    Args:
        client: a connected client (``engine.engine_client`` or ``engine.ensure_engine``).
        startup_boost: start each container without its CPU limit until its server answers (``base``).
        user: ``"uid:gid"`` the servers run as; None for the invoking user's.
    """

    kind = "docker"

    def __init__(self, client: DockerClient, startup_boost: bool = True, user: str | None = None) -> None:
        self.client, self.startup_boost = client, startup_boost
        self.user = user or f"{os.getuid()}:{os.getgid()}"
        self._started: set[str] = set()
        self._baselines: dict[str, tuple[int, float]] = {}  # name -> (CPU ns, epoch s)
        self._image: str | None = None

    def start(self, spec: ContainerSpec, timeout_s: float = 60.0, boost: bool = True) -> ContainerInfo:
        check_spec(spec)
        with self._errors(spec.name, "start"):
            for found in self.client.containers.list(all=True, filters={"name": f"^/{PREFIX}{spec.name}$"}):
                if found.status == "running":
                    raise ContainerError(f"a container named {spec.name!r} is already running; stop it first")
                found.remove(force=True)  # left stopped by a job that died before it could stop it
            image = self._ensure_image()
        check_port_free(spec)  # host networking: the container's port is this host's
        self._started.add(spec.name)
        try:
            with self._errors(spec.name, "start"):
                container = self.client.containers.run(image, server_command(spec),
                                                       **_run_options(spec, self.start_cpus(spec, boost), self.user))
            wait_healthy(spec, timeout_s, alive=lambda: self._alive(container))
            self.settle(spec, boost)
        except BackendUnavailable:
            raise
        except ContainerError as err:
            log = self._log(spec.name)
            self.stop(spec.name)
            raise start_failure(err, log) from None
        self._baselines[spec.name] = _cpu_sample(self._get(spec.name))
        return self.info(spec.name)

    def resize(self, name: str, cpus: float | None, cpuset: tuple[int, ...] | None = None) -> None:
        check_limits(name, cpus, cpuset)
        container = self._get(name)
        with self._errors(name, "resize"):
            container.update(cpu_period=PERIOD_US, cpu_quota=cfs_quota(cpus) if cpus else -1,
                             **({"cpuset_cpus": cores_text(cpuset)} if cpuset else {}))

    def usage(self, name: str) -> float:
        container = self._get(name)
        if container.status != "running":
            self._baselines.pop(name, None)
            return 0.0
        with self._errors(name, "read the CPU use of"):
            now = _cpu_sample(container)
        before = self._baselines.get(name) or (0, _epoch_s(container.attrs["State"]["StartedAt"]))
        self._baselines[name] = now
        return max(0.0, (now[0] - before[0]) / 1e9 / max(now[1] - before[1], 1e-3))

    def stop(self, name: str) -> None:
        import docker

        self._started.discard(name)
        self._baselines.pop(name, None)
        with self._errors(name, "stop"):
            try:
                container = self.client.containers.get(PREFIX + name)
                container.stop(timeout=2)
                container.remove(force=True)
            except docker.errors.NotFound:
                pass

    def pause(self, name: str) -> None:
        container = self._get(name)
        with self._errors(name, "pause"):
            container.pause()

    def resume(self, name: str) -> None:
        container = self._get(name)
        with self._errors(name, "resume"):
            container.unpause()

    def list(self) -> list[ContainerInfo]:
        with self._errors(None, "list"):
            return [_info(container) for container in self._managed()]

    def info(self, name: str) -> ContainerInfo:
        return _info(self._get(name))

    def prune(self) -> list[str]:
        """Remove the labelled containers that no longer run: what killed jobs left behind.

        Returns:
            Their server names.
        """
        with self._errors(None, "prune"):
            stopped = [container for container in self._managed() if container.status != "running"]
            for container in stopped:
                container.remove(force=True)
        return sorted(container.labels.get("autotune.name", container.name) for container in stopped)

    def close(self) -> None:
        """Stop the containers this instance started (others' labelled containers are left alone)."""
        self.stop_all(sorted(self._started))

    def _managed(self) -> list[Container]:
        """Every labelled container, running or not, whoever started it."""
        return self.client.containers.list(all=True, filters={"label": f"{MANAGED}=true"}, ignore_removed=True)

    def _get(self, name: str) -> Container:
        with self._errors(name, "find"):
            return self.client.containers.get(PREFIX + name)

    def _log(self, name: str) -> str:
        """The end of a container's log, or "" when there is none to read (it was never created)."""
        try:
            return self._get(name).logs(tail=20).decode(errors="replace")
        except UnknownContainer:
            return ""

    def _alive(self, container: Container) -> bool:
        import docker

        with self._errors(container.name, "inspect"):
            try:
                container.reload()
            except docker.errors.NotFound:
                return False
        return container.status in ("created", "running")

    def _ensure_image(self) -> str:
        """The runtime image's tag, imported from a root file system made here unless already present."""
        import docker

        if self._image is None:
            rootfs = _rootfs()
            tag = hashlib.sha256(rootfs).hexdigest()[:12]
            try:
                self.client.images.get(f"{IMAGE}:{tag}")
            except docker.errors.ImageNotFound:
                self.client.api.import_image_from_data(rootfs, repository=IMAGE, tag=tag)
            self._image = f"{IMAGE}:{tag}"
        return self._image

    @contextmanager
    def _errors(self, name: str | None, action: str) -> Iterator[None]:
        """Engine failures as the package's one-line errors."""
        import docker
        import requests

        try:
            yield
        except docker.errors.NotFound:
            raise UnknownContainer(f"no container named {name!r} in the Docker engine") from None
        except docker.errors.APIError as err:
            raise ContainerError(f"the Docker engine refused to {action} container {name}: "
                                 f"{one_line(err.explanation or err)}") from None
        except (requests.ConnectionError, requests.Timeout) as err:
            raise not_answering(_engine_url(self.client), err) from None


def _engine_url(client: DockerClient) -> str:
    """The engine's address as a person wrote it (the SDK rewrites a socket path as http+docker://localhost)."""
    socket = getattr(client.api.get_adapter(client.api.base_url), "socket_path", None)
    return f"unix://{socket}" if socket else client.api.base_url


def _info(container: Container) -> ContainerInfo:
    host = container.attrs["HostConfig"]
    labels = container.labels
    fields = json.loads(labels["autotune.spec"])
    fields.update(artifact=Path(fields["artifact"]), cpuset=tuple(fields["cpuset"]) if fields["cpuset"] else None)
    spec = ContainerSpec(name=labels["autotune.name"], **fields)
    quota, period = host.get("CpuQuota") or 0, host.get("CpuPeriod") or PERIOD_US
    return ContainerInfo(spec=spec, running=container.status == "running", cpus=quota / period if quota > 0 else None,
                         cpuset=_parse_cpuset(host.get("CpusetCpus") or ""), ident=container.id)


def _run_options(spec: ContainerSpec, cpus: float | None, user: str) -> dict[str, Any]:
    """How the server's container is made: as ``user`` with no capabilities, host network, read-only host
    runtime, CFS quota (``cpus``) and cpuset.

    HOME is the container's own /tmp (mode 1777): any uid can use it, where the image's /root is root's alone.
    """
    return {"detach": True, "name": PREFIX + spec.name, "network_mode": "host", "mounts": _mounts(spec.artifact),
            "user": user, "cap_drop": ["ALL"], "security_opt": ["no-new-privileges"],
            "labels": {MANAGED: "true", "autotune.name": spec.name, "autotune.spec": _spec_label(spec)},
            "environment": {"TVM_NUM_THREADS": str(spec.threads), "HOME": "/tmp", "PYTHONUNBUFFERED": "1",
                            "PYTHONDONTWRITEBYTECODE": "1"},
            "cpu_period": PERIOD_US, "cpu_quota": cfs_quota(cpus) if cpus else None,
            "cpuset_cpus": cores_text(spec.cpuset) if spec.cpuset else None}


def _spec_label(spec: ContainerSpec) -> str:
    """The spec as a label, so any backend instance (another process too) can list the container."""
    return json.dumps({"artifact": str(spec.artifact.resolve()), "port": spec.port, "threads": spec.threads,
                       "cpus": spec.cpus, "cpuset": list(spec.cpuset) if spec.cpuset else None, "host": spec.host})


def _parse_cpuset(text: str) -> tuple[int, ...] | None:
    """``"0-2,5"`` -> ``(0, 1, 2, 5)``; empty -> None (any core)."""
    cores: list[int] = []
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        cores.extend(range(int(low), int(high or low) + 1))
    return tuple(cores) or None


def _cpu_sample(container: Container) -> tuple[int, float]:
    """Total CPU ns the container used, and when (epoch s).

    Read from its cgroup when the engine runs on this host: the engine's own stats come from a
    collector that ticks once a second, so each call waits up to a second for the next tick.
    """
    used = _cgroup_cpu_ns(container.attrs["State"]["Pid"], container.id)
    if used is not None:
        return used, time.time()
    stats = container.stats(stream=False, one_shot=True)
    return int(stats["cpu_stats"]["cpu_usage"]["total_usage"]), _epoch_s(stats["read"])


def _cgroup_cpu_ns(pid: int, ident: str) -> int | None:
    """CPU ns of the cgroup holding ``pid`` (v1 cpuacct or v2), or None when it is not this container's here."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, group = line.split(":", 2)
        if ident not in group:  # another PID namespace's process, or not the container's cgroup
            continue
        folder = Path("/sys/fs/cgroup", controllers, group.lstrip("/"))  # v2: controllers is ""
        try:
            if "cpuacct" in controllers.split(","):
                return int((folder / "cpuacct.usage").read_text())
            if not controllers:
                stat = dict(row.split() for row in (folder / "cpu.stat").read_text().splitlines())
                return int(stat["usage_usec"]) * 1000
        except (OSError, KeyError, ValueError):
            return None
    return None


def _epoch_s(timestamp: str) -> float:
    """An engine timestamp (RFC 3339 with nanoseconds, which ``fromisoformat`` cannot read) in epoch s."""
    trimmed = re.sub(r"(\.\d{1,6})\d*", r"\1", timestamp).replace("Z", "+00:00")
    return datetime.fromisoformat(trimmed).timestamp()


def _mounts(artifact: Path) -> list[Any]:
    """Read-only binds at the host's own paths; a path inside another bound one is not bound twice."""
    from docker.types import Mount

    project = Path(containers.__file__).resolve().parents[1]  # what the editable install points at
    wanted = [Path("/usr"), Path(sys.base_prefix).resolve(), Path(sys.prefix), project, artifact.resolve(),
              *(Path("/", name) for name, target in _top_links() if target is None)]
    kept: list[Path] = []
    for path in sorted(set(wanted), key=lambda p: len(p.parts)):
        if not any(path.is_relative_to(parent) for parent in kept):
            kept.append(path)
    return [Mount(str(path), str(path), type="bind", read_only=True) for path in kept]


def _top_links() -> list[tuple[str, str | None]]:
    """``/bin``, ``/lib``... as on the host: a link into ``/usr`` (merged /usr), else None (a folder to bind)."""
    found = []
    for name in ("bin", "sbin", "lib", "lib64"):
        path = Path("/", name)
        if path.is_symlink():
            found.append((name, str(path.readlink())))
        elif path.is_dir():
            found.append((name, None))
    return found


def _rootfs() -> bytes:
    """A minimal root file system as a tar, byte-for-byte the same each time so its hash names the image."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        # /root is no one's home here (HOME is /tmp) and open: a Python the host keeps under /root (pyenv as
        # root) is bound inside it, and must be reachable for whichever uid the servers run as
        for name, mode in (("tmp", 0o1777), ("proc", 0o755), ("sys", 0o755), ("dev", 0o755), ("etc", 0o755),
                           ("root", 0o755)):
            tar.addfile(_entry(name, tarfile.DIRTYPE, mode))
        for name, target in _top_links():
            if target is not None:
                tar.addfile(_entry(name, tarfile.SYMTYPE, 0o777, linkname=target))
        for name, text in (("etc/passwd", _PASSWD), ("etc/group", _GROUP)):
            data = text.encode()
            entry = _entry(name, tarfile.REGTYPE, 0o644)
            entry.size = len(data)
            tar.addfile(entry, io.BytesIO(data))
    return buffer.getvalue()


def _entry(name: str, kind: bytes, mode: int, linkname: str = "") -> tarfile.TarInfo:
    entry = tarfile.TarInfo(name)
    entry.type, entry.mode, entry.linkname = kind, mode, linkname
    entry.mtime, entry.uname, entry.gname = 0, "root", "root"
    return entry

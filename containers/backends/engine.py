"""The Docker engine: connect to one that runs, or start a private one for the duration of a job.

Machines here ship the engine as a Debian package but do not run it, and CI starts from a
fresh machine; so tests and jobs that need Docker bring the engine up themselves and take
it down again, while leaving alone an engine someone else started.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from containers.backends import terminate
from containers.errors import BackendUnavailable

if TYPE_CHECKING:
    from docker import DockerClient

DEFAULT_URL = "unix:///var/run/docker.sock"
PIDFILE = Path("/var/run/docker.pid")
# No bridge and no iptables: the machines have neither, and servers use the host network.
DOCKERD_ARGS = ("--iptables=false", "--bridge=none", "--pidfile", str(PIDFILE))
PROBE_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 60.0  # the yielded client's, per request: imports and stops take seconds on a busy host
STOP_GRACE_S = 30.0


def engine_client(timeout_s: float = 10.0, base_url: str | None = None) -> DockerClient:
    """Connect to a running engine and check that it answers.

    Args:
        timeout_s: limit for each request, this check included, so a hung engine is an
            error rather than a hang.
        base_url: the engine's address; by default ``DOCKER_HOST`` or the standard socket.

    Raises:
        BackendUnavailable: nothing answers at that address in time.
    """
    import docker
    import requests

    url = base_url or os.environ.get("DOCKER_HOST") or DEFAULT_URL
    try:
        if base_url:
            client = docker.DockerClient(base_url=url, timeout=timeout_s)
        else:
            client = docker.from_env(timeout=timeout_s)  # DOCKER_HOST and its TLS settings
        client.ping()
    except (docker.errors.DockerException, requests.RequestException) as err:
        raise not_answering(url, err) from None
    return client


def not_answering(url: str, err: BaseException) -> BackendUnavailable:
    """The one-line error for an engine that cannot be reached, whichever call found out."""
    return BackendUnavailable(f"the Docker engine at {url} is not answering: {one_line(err)}")


def one_line(err: object) -> str:
    """An engine's error text (often multi-line, or empty) as one line."""
    return " ".join(str(err).split()) or type(err).__name__


@contextmanager
def ensure_engine(log_path: Path | None = None, timeout_s: float = 60.0) -> Iterator[DockerClient]:
    """Yield a client of a running engine, starting ``dockerd`` (and stopping it after) if none runs.

    Args:
        log_path: where a started ``dockerd`` logs; a new temporary file by default.
        timeout_s: how long a started engine may take to answer.

    Raises:
        BackendUnavailable: no engine answers and none can be started here (the reason in one line).
    """
    try:
        engine_client(PROBE_TIMEOUT_S).close()
        process = None
    except BackendUnavailable as absent:
        process = _start_dockerd(absent, log_path, timeout_s)
    try:
        client = engine_client(REQUEST_TIMEOUT_S)
        try:
            yield client
        finally:
            client.close()
    finally:
        if process is not None:
            _stop_dockerd(process)


def _temporary_log() -> Path:
    handle, name = tempfile.mkstemp(prefix="autotune-dockerd-", suffix=".log")
    os.close(handle)
    return Path(name)


def _start_dockerd(absent: BackendUnavailable, log_path: Path | None, timeout_s: float) -> subprocess.Popen | None:
    """Start the daemon in a process group of its own and wait until it (or one started meanwhile) answers.

    Returns:
        The daemon to stop after, or None when another one, started at the same time, answers instead.

    Raises:
        BackendUnavailable: it cannot be started here (``absent`` says why one was needed), it
            exited, or it did not answer in time; it is stopped again in the last case.
    """
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise BackendUnavailable(f"{absent}; and dockerd is not installed (apt-get install docker.io)")
    if os.geteuid() != 0:
        raise BackendUnavailable(f"{absent}; and starting dockerd needs root (running as uid {os.geteuid()})")
    log_path = Path(log_path) if log_path else _temporary_log()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen([dockerd, *DOCKERD_ARGS], stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        try:
            engine_client(PROBE_TIMEOUT_S).close()
            # Ours answers; or ours lost the race to one started at the same time, which is not ours to stop.
            return process if process.poll() is None else None
        except BackendUnavailable as err:
            last = str(err)
        if process.poll() is not None:
            raise BackendUnavailable(f"dockerd exited with code {process.returncode}: {_last_line(log_path)} "
                                     f"(log: {log_path})")
        time.sleep(0.5)
    _stop_dockerd(process)
    raise BackendUnavailable(f"dockerd did not answer within {timeout_s:.0f} s ({last}); log: {log_path}")


def _stop_dockerd(process: subprocess.Popen) -> None:
    """SIGTERM (dockerd then stops its containers and its containerd), SIGKILL if it lingers; drop its pidfile."""
    terminate(process, STOP_GRACE_S)
    try:
        if PIDFILE.read_text().strip() == str(process.pid):  # not another daemon's
            PIDFILE.unlink()
    except FileNotFoundError:
        pass


def _last_line(log_path: Path) -> str:
    try:
        lines = log_path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1] if lines else "empty log"

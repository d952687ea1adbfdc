"""Container backends against the real thing: a Docker engine, the cgroup tree, the model server.

Limits are checked where the engine and kernel keep them (``docker inspect``, cgroup files)
and by their effect (CPU used under load), since a backend that only records what it was
asked would pass a test that reads its own answers back.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import requests

from containers import wire
from containers.backends import create_backend
from containers.backends.base import ContainerBackend, ContainerSpec, wait_healthy
from containers.backends.local import LocalBackend
from containers.errors import BackendUnavailable, ContainerError, ScenarioError, UnknownContainer
from tests.fakes import SimulatedHost, spec

LOAD_S = 2.0
ROOT = Path(__file__).resolve().parent.parent


def _spec(artifact: Path, **limits: object) -> ContainerSpec:
    """A spec with a name and port of its own, so concurrent runs on one engine do not collide."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return ContainerSpec(name=f"test-{uuid.uuid4().hex[:8]}", artifact=Path(artifact), port=port, **limits)


@contextmanager
def _other_server(body: bytes) -> Iterator[int]:
    """Something else answering ``GET /health`` with 200 and ``body`` on a port of its own; yields the port."""

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _usage_under_load(backend: ContainerBackend, spec: ContainerSpec) -> float:
    """Cores the container used while a thread sent it inference requests back to back."""
    model = requests.get(f"{spec.url}/health", timeout=5).json()["model"]
    media, body = wire.encode_arrays([np.zeros(item["shape"], item["dtype"]) for item in model["inputs"]])
    answered: list[int] = []

    def send(until: float) -> None:
        with requests.Session() as session:
            while time.monotonic() < until:
                answered.append(session.post(f"{spec.url}/v1/infer", data=body, headers={"Content-Type": media},
                                             timeout=10).status_code)

    sender = threading.Thread(target=send, args=(time.monotonic() + LOAD_S + 0.5,))
    sender.start()
    time.sleep(0.3)
    backend.usage(spec.name)  # the baseline, once the load runs
    time.sleep(LOAD_S)
    used = backend.usage(spec.name)
    sender.join()
    assert answered and set(answered) == {200}
    return used


def _killed_from_outside_then_stopped(backend: ContainerBackend, spec: ContainerSpec,
                                      kill: Callable[[], object]) -> None:
    kill()
    deadline = time.monotonic() + 10
    while backend.info(spec.name).running and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [info.running for info in backend.list() if info.spec.name == spec.name] == [False]
    assert backend.usage(spec.name) == 0.0
    backend.stop(spec.name)
    backend.stop(spec.name)
    assert spec.name not in [info.spec.name for info in backend.list()]
    with pytest.raises(UnknownContainer):
        backend.resize(spec.name, 1.0)


def _quotas_while_starting(backend: ContainerBackend, spec: ContainerSpec, quota: Callable[[], str | None],
                           boost: bool = True) -> list[str]:
    """The CPU quota as the engine or kernel held it (``quota``; None before the container exists), read
    every 20 ms from the start's call until the server answered ``/health``."""
    answered, seen = threading.Event(), []

    def watch() -> None:
        while not answered.is_set():
            try:
                requests.get(f"{spec.url}/health", timeout=0.2).raise_for_status()
                answered.set()
            except requests.RequestException:
                pass
            value = quota()
            if value is not None and not answered.is_set():
                seen.append(value)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        backend.start(spec, boost=boost)
    finally:
        answered.set()
        watcher.join()
    return seen


# Docker


@pytest.mark.docker
def test_docker_limits_are_set_and_changed_live(docker_backend, tuned_run):
    spec = _spec(tuned_run.artifact, cpus=0.5, cpuset=(0,))
    info = docker_backend.start(spec)
    assert requests.get(f"{spec.url}/health", timeout=5).status_code == 200
    assert (info.running, info.cpus, info.cpuset) == (True, 0.5, (0,))
    container = docker_backend.client.containers.get(info.ident)

    def inspected() -> tuple[int, int, str]:
        container.reload()
        host = container.attrs["HostConfig"]
        return host["CpuQuota"], host["CpuPeriod"], host["CpusetCpus"]

    assert inspected() == (50_000, 100_000, "0")
    docker_backend.resize(spec.name, 1.0, (0, 1))
    assert inspected() == (100_000, 100_000, "0,1")
    docker_backend.resize(spec.name, None)
    quota, _, cpuset = inspected()
    assert quota <= 0 and cpuset == "0,1"
    assert (docker_backend.info(spec.name).cpus, docker_backend.info(spec.name).cpuset) == (None, (0, 1))
    assert requests.get(f"{spec.url}/health", timeout=5).status_code == 200
    # a standby: paused (frozen, not answering), given its cores and limit while paused, then resumed
    docker_backend.pause(spec.name)
    assert not docker_backend.info(spec.name).running and docker_backend.usage(spec.name) == 0.0
    with pytest.raises(requests.RequestException):
        requests.get(f"{spec.url}/health", timeout=0.5)
    docker_backend.resize(spec.name, 0.5, (1,))
    docker_backend.resume(spec.name)
    assert inspected() == (50_000, 100_000, "1") and docker_backend.info(spec.name).running
    assert requests.get(f"{spec.url}/health", timeout=5).status_code == 200
    docker_backend.pause(spec.name)  # a standby left paused is stopped as promptly as any other
    started = time.monotonic()
    docker_backend.stop(spec.name)
    assert time.monotonic() - started < 1.9 and spec.name not in [i.spec.name for i in docker_backend.list()]


@pytest.mark.docker
@pytest.mark.parametrize("boost, this_start", [(True, True), (False, True), (True, False)])
def test_docker_a_boosted_start_takes_its_quota_once_the_server_answers(docker_engine, tuned_run, boost, this_start):
    from containers.backends.docker import DockerBackend

    backend = DockerBackend(docker_engine, startup_boost=boost)  # this_start: a start may decline the boost
    spec = _spec(tuned_run.artifact, cpus=0.5, cpuset=(0,))

    def quota() -> str | None:
        found = docker_engine.containers.list(all=True, filters={"name": f"^/autotune-{spec.name}$"})
        return str(found[0].attrs["HostConfig"]["CpuQuota"]) if found else None

    try:
        seen = _quotas_while_starting(backend, spec, quota, this_start)  # the last read may race the limit's setting
        assert seen[0] == "0" if boost and this_start else set(seen) == {"50000"}
        assert quota() == "50000" and backend.info(spec.name).cpus == 0.5
    finally:
        backend.close()


@pytest.mark.docker
def test_docker_usage_is_held_under_the_quota(docker_backend, tuned_run):
    spec = _spec(tuned_run.artifact)
    docker_backend.start(spec)
    docker_backend.resize(spec.name, 0.25)
    assert 0.0 < _usage_under_load(docker_backend, spec) < 0.4


@pytest.mark.docker
def test_docker_container_killed_from_outside_is_listed_as_not_running(docker_backend, docker_engine, tuned_run):
    spec = _spec(tuned_run.artifact)
    docker_backend.start(spec)
    _killed_from_outside_then_stopped(docker_backend, spec, docker_engine.containers.get(f"autotune-{spec.name}").kill)


@pytest.mark.docker
def test_docker_a_server_left_stopped_by_a_dead_job_is_replaced_or_pruned_a_running_one_is_not(
        docker_backend, docker_engine, tuned_run):
    from containers.backends.docker import DockerBackend

    spec = _spec(tuned_run.artifact)
    first = docker_backend.start(spec).ident
    with pytest.raises(ContainerError, match=f"{spec.name!r} is already running; stop it first"):
        DockerBackend(docker_engine).start(spec)

    def killed() -> None:  # the job that started it died, and its server with it
        docker_engine.containers.get(f"autotune-{spec.name}").kill()
        deadline = time.monotonic() + 10
        while docker_backend.info(spec.name).running and time.monotonic() < deadline:
            time.sleep(0.1)

    killed()
    second = docker_backend.start(spec)
    assert second.running and second.ident != first
    killed()
    assert spec.name in DockerBackend(docker_engine).prune()
    assert spec.name not in [info.spec.name for info in docker_backend.list()]


@pytest.mark.docker
def test_docker_bad_artifact_fails_fast_with_the_server_log(docker_backend, tmp_path):
    spec = _spec(tmp_path)
    started = time.monotonic()
    with pytest.raises(ContainerError, match="not an artifact"):
        docker_backend.start(spec)
    assert time.monotonic() - started < 30
    assert spec.name not in [info.spec.name for info in docker_backend.list()]


@pytest.mark.docker
def test_docker_unknown_names_and_auto_kind(docker_backend, docker_engine):
    with pytest.raises(UnknownContainer, match="nope"):
        docker_backend.usage("nope")
    with pytest.raises(UnknownContainer):
        docker_backend.resize("nope", 1.0)
    docker_backend.stop("nope")
    assert create_backend("auto").kind == "docker"


@pytest.mark.docker
def test_docker_servers_run_as_the_invoking_user_without_privileges(docker_backend, docker_engine, tuned_run,
                                                                   tmp_path):
    from containers.backends.docker import DockerBackend

    def inspected(backend: ContainerBackend, spec: ContainerSpec) -> tuple[str, list[str], list[str], dict[str, str]]:
        container = docker_engine.containers.get(backend.info(spec.name).ident)
        status = Path(f"/proc/{container.attrs['State']['Pid']}/status").read_text()
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        host = container.attrs["HostConfig"]
        return container.attrs["Config"]["User"], host["CapDrop"], host["SecurityOpt"], fields

    spec = _spec(tuned_run.artifact)
    docker_backend.start(spec)
    user, dropped, options, proc = inspected(docker_backend, spec)
    assert user == f"{os.getuid()}:{os.getgid()}" and proc["Uid"].split()[0] == str(os.getuid())
    assert dropped == ["ALL"] and int(proc["CapEff"], 16) == 0
    assert "no-new-privileges" in options and proc["NoNewPrivs"].strip() == "1"
    if os.getuid() != 0:
        return
    # another user's artifact, readable by its owner only (as older artifacts were written), served as that user
    theirs = shutil.copytree(tuned_run.artifact, tmp_path / "theirs")
    for path in [theirs, *theirs.rglob("*")]:
        os.chown(path, 4321, 4321)
        path.chmod(0o700 if path.is_dir() else 0o600)
    backend = DockerBackend(docker_engine, user="4321:4321")
    other = _spec(theirs)
    try:
        assert backend.start(other).running
        assert requests.get(f"{other.url}/health", timeout=5).json()["name"] == other.name
        assert inspected(backend, other)[3]["Uid"].split()[0] == "4321"
    finally:
        backend.close()


@pytest.mark.docker
def test_docker_a_start_on_a_port_another_server_holds_is_refused(docker_backend, tmp_path):
    with _other_server(b'{"status": "ok", "name": "someone-else"}') as port:
        spec = ContainerSpec(name=f"test-{uuid.uuid4().hex[:8]}", artifact=tmp_path, port=port)
        with pytest.raises(ContainerError, match=f"^port {port} on 127.0.0.1 is already in use; container {spec.name}"):
            docker_backend.start(spec)
    assert spec.name not in [info.spec.name for info in docker_backend.list()]


def test_unreachable_engine_is_backend_unavailable_quickly(tmp_path):
    import docker

    from containers.backends.docker import DockerBackend
    from containers.backends.engine import engine_client

    bogus = f"unix://{tmp_path}/docker.sock"
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="is not answering"):
        engine_client(2.0, base_url=bogus)
    backend = DockerBackend(docker.DockerClient(base_url=bogus, version="1.41", timeout=2))
    with pytest.raises(BackendUnavailable, match=f"{tmp_path}/docker.sock is not answering"):
        backend.list()
    with pytest.raises(BackendUnavailable):
        backend.start(_spec(tmp_path))
    assert time.monotonic() - started < 10


def test_ensure_engine_says_what_is_missing(monkeypatch, tmp_path):
    from containers.backends import engine

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/docker.sock")
    monkeypatch.setattr(engine.shutil, "which", lambda name: None)
    with pytest.raises(BackendUnavailable, match="not answering: .*; and dockerd is not installed"):
        with engine.ensure_engine():
            pass
    monkeypatch.setattr(engine.shutil, "which", lambda name: "/usr/sbin/dockerd")
    monkeypatch.setattr(engine.os, "geteuid", lambda: 1000)
    with pytest.raises(BackendUnavailable, match="starting dockerd needs root"):
        with engine.ensure_engine():
            pass


# Checks shared by both backends, without starting anything


def test_bad_names_limits_and_kinds_are_one_line_errors(tmp_path):
    backend = LocalBackend(tmp_path)
    with pytest.raises(ScenarioError, match="letters, digits, '-' and '_' only. Got 'a b'"):
        backend.start(ContainerSpec(name="a b", artifact=tmp_path, port=8000))
    with pytest.raises(ScenarioError, match="'cpus' of container x"):
        backend.start(ContainerSpec(name="x", artifact=tmp_path, port=8000, cpus=0))
    with pytest.raises(ScenarioError, match="'cpuset' of container x"):
        backend.start(ContainerSpec(name="x", artifact=tmp_path, port=8000, cpuset=(os.cpu_count(),)))
    with pytest.raises(ContainerError, match="docker, local, auto. Got 'podman'"):
        create_backend("podman")
    assert create_backend(backend) is backend
    assert backend.list() == []


def test_a_start_on_a_port_another_server_holds_is_refused(tmp_path):
    backend = LocalBackend(tmp_path / "no-cgroups", log_dir=tmp_path)
    with _other_server(b'{"status": "ok", "name": "someone-else"}') as port:
        spec = ContainerSpec(name="late", artifact=tmp_path, port=port)
        with pytest.raises(ContainerError, match=f"^port {port} on 127.0.0.1 is already in use; container late "
                                                 f"cannot serve there[^\n]*$"):
            backend.start(spec)
    assert backend.list() == [] and not (tmp_path / "late.log").exists()  # refused before anything started


@pytest.mark.parametrize("body, says", [(b'{"status": "ok", "name": "someone-else"}', "as server 'someone-else'"),
                                        (b"<html>hello</html>", "as something else")])
def test_a_health_answer_counts_only_with_the_containers_own_name(tmp_path, body, says):
    with _other_server(body) as port:
        started = time.monotonic()
        with pytest.raises(ContainerError, match=f"port {port} on 127.0.0.1 answers /health {says}, not as container "
                                                 f"mine: another server holds the port$"):
            wait_healthy(ContainerSpec(name="mine", artifact=tmp_path, port=port), timeout_s=30)
        assert time.monotonic() - started < 5  # at once, not after the timeout
    with _other_server(b'{"status": "ok", "name": "mine"}') as port:
        wait_healthy(ContainerSpec(name="mine", artifact=tmp_path, port=port), timeout_s=30)


def test_the_dockerfile_publishes_the_server_on_loopback_only():
    runs = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if "docker run" in line]
    published = [found for line in runs for found in re.findall(r"(?:-p|--publish)[ =](\S+)", line)]
    assert published and all(p.startswith("127.0.0.1:") for p in published), published


def test_close_stops_every_container_when_some_do_not_stop():
    host = SimulatedHost(2.0, {n: 10.0 for n in "abcd"})
    for i, name in enumerate("abcd"):
        host.start(spec(name, 9000 + i))
    host.failing_stops = {"b"}
    with pytest.raises(ContainerError, match="^the engine refused to stop container b$"):
        host.close()
    assert list(host.containers) == ["b"]  # c and d stopped all the same
    host.failing_stops = {"a", "b"}
    host.start(spec("a", 9000))
    with pytest.raises(ContainerError, match="^2 containers did not stop: .* container b; .* container a$"):
        host.close()


# Local: processes in cgroups


def _cgroup_limits(backend: LocalBackend, name: str) -> tuple[str, str]:
    """(quota, cores) as the kernel holds them: cfs_quota_us or cpu.max's first field, and cpuset.cpus."""
    root = backend.cgroup_root
    if backend.limits == "cgroup v1":
        quota = (root / "cpu" / "autotune" / name / "cpu.cfs_quota_us").read_text()
        return quota.strip(), (root / "cpuset" / "autotune" / name / "cpuset.cpus").read_text().strip()
    group = root / "autotune" / name
    return (group / "cpu.max").read_text().split()[0], (group / "cpuset.cpus").read_text().strip()


def test_local_cgroup_quota_is_honoured_and_resized(tuned_run, tmp_path):
    backend = LocalBackend(log_dir=tmp_path)
    if backend.limits == "core affinity only":
        pytest.skip(backend.warning)
    spec = _spec(tuned_run.artifact, cpus=1.0, cpuset=(0,))

    def quota() -> str | None:
        try:
            return _cgroup_limits(backend, spec.name)[0]
        except FileNotFoundError:
            return None

    try:
        assert _quotas_while_starting(backend, spec, quota)[0] in ("-1", "max")  # boosted while it loads
        assert backend.info(spec.name).running
        assert _cgroup_limits(backend, spec.name) == ("100000", "0")
        backend.resize(spec.name, 0.25)
        assert _cgroup_limits(backend, spec.name) == ("25000", "0")
        assert 0.0 < _usage_under_load(backend, spec) < 0.4
        backend.resize(spec.name, None, (1,))
        assert _cgroup_limits(backend, spec.name) in (("-1", "1"), ("max", "1"))
        assert (backend.info(spec.name).cpus, backend.info(spec.name).cpuset) == (None, (1,))
    finally:
        backend.close()
    assert not (backend.cgroup_root / "cpu" / "autotune" / spec.name).exists()
    assert not (backend.cgroup_root / "autotune" / spec.name).exists()


def test_local_falls_back_to_core_affinity_where_cgroups_cannot_be_used(tuned_run, tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores to tell pinned from unpinned")
    readonly = tmp_path / "cgroup"
    readonly.mkdir(mode=0o555)
    backend = LocalBackend(readonly, log_dir=tmp_path)
    assert backend.limits == "core affinity only"
    assert str(readonly) in backend.warning and "floor(c) whole cores" in backend.warning
    first, second = sorted(os.sched_getaffinity(0))[:2]
    spec = _spec(tuned_run.artifact, cpus=1.5)
    try:
        pid = int(backend.start(spec).ident)
        assert _thread_cores(pid) == {(first,)}
        backend.resize(spec.name, None, (second,))
        assert _thread_cores(pid) == {(second,)}
        _killed_from_outside_then_stopped(backend, spec, lambda: os.kill(pid, signal.SIGKILL))
    finally:
        backend.close()


def test_local_bad_artifact_fails_with_the_server_log(tmp_path):
    backend = LocalBackend(tmp_path / "no-cgroups", log_dir=tmp_path)
    with pytest.raises(ContainerError, match="exited before .* its log ends: .*not an artifact"):
        backend.start(_spec(tmp_path))
    assert backend.list() == []


def test_local_servers_are_stopped_when_autotune_serve_gets_sigterm(tuned_run, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    name = f"sigterm-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "serve.log"
    cli = _autotune_in_background(log, "serve", str(tuned_run.artifact), "--target-ms", "50", "--backend", "local",
                                  "--port", str(port), "--name", name, "--out", str(tmp_path / "serve"))
    try:
        deadline = time.monotonic() + 60
        while True:
            assert cli.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"the server did not answer in 60 s:\n{log.read_text()}"
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).json()["name"] == name:
                    break
            except requests.RequestException:
                time.sleep(0.2)
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=30) == 0, log.read_text()
        with pytest.raises(requests.ConnectionError):  # the server went with it, and its port is free
            requests.get(f"http://127.0.0.1:{port}/health", timeout=1)
        assert "interrupted: stopping the containers" in log.read_text()
        assert json.loads((tmp_path / "serve" / "qoe.json").read_text())["scenario"]["name"] == f"serve-{name}"
    finally:
        cli.kill()
        cli.wait()
        _kill_listener(port)


def test_deploy_compare_stops_its_local_servers_on_sigterm(tuned_run, tmp_path):
    import psutil

    artifact = str(tuned_run.artifact)

    def servers() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            command = proc.info["cmdline"] or []
            if "containers.server" in command and artifact in command:
                found.append(proc)
        return found

    log = tmp_path / "deploy.log"
    cli = _autotune_in_background(log, "deploy", "compare", artifact, "--schemes", "1x1", "--duration", "120",
                                  "--backend", "local")
    try:
        deadline = time.monotonic() + 60
        while not servers():
            assert cli.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"no server started in 60 s:\n{log.read_text()}"
            time.sleep(0.2)
        time.sleep(1.0)
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=30) == 130, log.read_text()
        assert "interrupted: the containers it started are stopped" in log.read_text()
        assert servers() == []  # SIGTERM's default action would have left it serving
    finally:
        cli.kill()
        cli.wait()
        for proc in servers():
            proc.kill()


def _autotune_in_background(log: Path, *args: str) -> subprocess.Popen:
    """The ``autotune`` command with ``args`` in its own process, its output going to ``log``."""
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-c", "from autotune.cli import main; main()", *args], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _kill_listener(port: int) -> None:
    """Kill whatever process still listens on ``port`` (a server its CLI left behind), by its pid."""
    import psutil

    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
            os.kill(conn.pid, signal.SIGKILL)


def _thread_cores(pid: int) -> set[tuple[int, ...]]:
    import psutil

    return {tuple(sorted(os.sched_getaffinity(thread.id))) for thread in psutil.Process(pid).threads()}

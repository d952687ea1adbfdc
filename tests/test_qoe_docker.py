"""The QoE manager, load generator and deployment schemes on a real Docker engine and real model servers."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import requests
from typer.testing import CliRunner

from autotune.cli import app
from containers.deploy import Scheme, compare_schemes
from containers.load import LoadClient
from containers.qoe.run import request_inputs, run_scenario
from containers.scenario import ContainerPlan, Scenario, Schedule

pytestmark = pytest.mark.docker


def _scenario(artifact: Path, name: str, **overrides: object) -> Scenario:
    plans = (ContainerPlan("fast", artifact, 50.0), ContainerPlan("tight", artifact, 0.05))
    settings = {"duration_s": 24.0, "policy": "dqoes", "listener": "fixed", "interval_s": 2.0, "base_port": 18700,
                "schedule": Schedule("fixed", interval_s=3.0), **overrides}
    return Scenario(name, containers=plans, backend="docker", **settings)  # type: ignore[arg-type]


def test_a_scenario_runs_on_docker_and_dqoes_moves_cpu_from_g_to_b(tuned_run, docker_backend, tmp_path: Path) -> None:
    record = run_scenario(_scenario(tuned_run.artifact, "two"), tmp_path / "run", backend=docker_backend)
    assert (tmp_path / "run" / "qoe.json").is_file() and (tmp_path / "run" / "timeline.png").stat().st_size > 10_000
    assert record["joined_at"]["tight"] >= record["joined_at"]["fast"] + 2.5  # the fixed schedule's 3 s apart
    for name, r in record["requests"].items():
        assert r["sent"] > 50 and r["failed"] == 0 and r["answered"] == r["sent"], name
    classes = [t["containers"] for t in record["timeline"] if t["counts"]]
    assert classes and all(c["fast"]["class"] == "G" for c in classes)  # 50 ms target, sub-ms service: far ahead
    both = [c for c in classes if "tight" in c]
    assert both and all(c["tight"]["class"] == "B" for c in both)  # 50 us: unachievable
    limits = [c["fast"]["limit"] for c in classes]
    assert limits[-1] is not None and limits[-1] < 1.0  # G gave CPU up, down towards its floor
    floor = 2 / (2 * 2)
    assert limits[-1] >= floor - 1e-6
    assert record["summary"]["manager_cpu_share"] < 0.2
    assert docker_backend.list() == []  # the run stopped what it started


def test_a_container_killed_from_outside_is_restarted_and_the_manager_goes_on(tuned_run, docker_backend,
                                                                              docker_engine, tmp_path: Path) -> None:
    scenario = _scenario(tuned_run.artifact, "kill", duration_s=36.0, schedule=Schedule("burst"))  # room for slow starts
    served_s: list[float] = []  # seconds from both servers answering (the burst's join ends) to the kill

    def kill_once_serving() -> None:  # a fixed delay killed the container while it was still starting on a slow host
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if all(requests.get(f"http://127.0.0.1:{port}/health", timeout=1).ok for port in (18700, 18701)):
                    break
            except requests.RequestException:
                pass
            time.sleep(0.1)
        healthy = time.monotonic()
        time.sleep(4.0)
        docker_engine.containers.get("autotune-fast").kill()
        served_s.append(time.monotonic() - healthy)

    killer = threading.Thread(target=kill_once_serving)
    killer.start()
    record = run_scenario(scenario, tmp_path / "run", backend=docker_backend)
    killer.join()
    killed = record["joined_at"]["fast"] + served_s[0]
    events = [e for e in record["status"]["events"] if e["container"] == "fast"]
    exited = [e for e in events if e["event"] == "exited"]
    assert exited and killed - 0.5 <= exited[0]["t"] <= killed + 2.0 + 1.5  # seen within one interval (2 s)
    after = [t for t in record["timeline"] if t["t"] > exited[0]["t"] + 4 and t["counts"]]
    assert any("fast" in t["containers"] for t in after)  # restarted, measured again


def test_ten_thousand_requests_across_containers_lose_none(tuned_run, docker_backend) -> None:
    specs = Scheme(2, 1, pinned=True).specs("load", tuned_run.artifact, 18720, [0, 1])
    for spec in specs:
        docker_backend.start(spec)
    client = LoadClient([s.url for s in specs], request_inputs(tuned_run.artifact, 1), concurrency=8).start()
    while len(client.records) < 10_000:
        time.sleep(0.2)
    records = client.stop()
    served = 0
    for spec in specs:
        text = requests.get(f"{spec.url}/metrics", timeout=5).text
        served += sum(float(line.split()[-1]) for line in text.splitlines()
                      if line.startswith('autotune_requests_total{outcome="ok"}'))
    failed = [(round(r.sent_at, 3), r.error) for r in records if not r.ok]
    assert len(records) >= 10_000 and not failed, failed[:5]  # when and why, if any failed
    assert served == len(records)  # every request the clients sent was served once, and answered


def test_deployment_schemes_compare_on_the_same_load(tuned_run, docker_backend) -> None:
    rows = compare_schemes(docker_backend, tuned_run.artifact, [Scheme.parse(s, 2) for s in ("1x2", "2x1", "2x1u")],
                           request_inputs(tuned_run.artifact, 1), duration_s=3.0, concurrency=2, warmup_s=0.5)
    assert [r["scheme"] for r in rows] == ["1x2", "2x1", "2x1u"]
    assert all(r["requests"] > 20 and r["failed"] == 0 and r["p99_ms"] >= r["p50_ms"] > 0 for r in rows), rows
    assert docker_backend.list() == []


def test_qoe_status_and_target_commands_talk_to_a_running_manager(tuned_run, docker_backend, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    scenario = _scenario(tuned_run.artifact, "cli", duration_s=14.0, schedule=Schedule("burst"))
    runner = threading.Thread(target=run_scenario, args=(scenario, run_dir), kwargs={"backend": docker_backend})
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while not (run_dir / "status.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        cli = CliRunner()
        status = cli.invoke(app, ["qoe", "status", str(run_dir), "--json"])
        assert status.exit_code == 0, status.output
        assert json.loads(status.output)["running"] is True
        changed = cli.invoke(app, ["qoe", "target", "tight", "7.5", "--run", str(run_dir)])
        assert changed.exit_code == 0 and "tight: target 7.5 ms" in changed.output
        for args, message in [(["qoe", "target", "nobody", "5", "--run", str(run_dir)], "no container named 'nobody'"),
                              (["qoe", "target", "tight", "0", "--run", str(run_dir)], "positive number"),
                              (["qoe", "target", "tight", "soon", "--run", str(run_dir)], "must be a number")]:
            bad = cli.invoke(app, args)
            assert bad.exit_code == 2 and message in bad.output
    finally:
        runner.join()
    final = json.loads((run_dir / "qoe.json").read_text())
    assert {r["name"]: r["target_ms"] for r in final["status"]["containers"]}["tight"] == 7.5

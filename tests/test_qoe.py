"""The QoE manager's algorithms and loop, on a simulated host (real Docker runs in test_qoe_docker.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import requests
from typer.testing import CliRunner

from containers.errors import ScenarioError, UnknownContainer
from containers.qoe.algorithm import (Classification, DQoES, NoLimits, QoeClass, Reading, StaticEqual, classify,
                                      create_policy)
from containers.qoe.control import ControlServer, change_target, write_status
from containers.qoe.listener import AdaptiveListener, FixedListener, create_listener
from containers.qoe.manager import QoeManager
from containers.qoe.monitors import ApplicationMonitor, HistogramSnapshot
from containers.qoe.run import run_scenario
from containers.scenario import ContainerPlan, LoadSpec, Scenario, Schedule
from tests.fakes import SimulatedHost, spec

# six containers of 20 ms of one core per request on two cores; default Docker gives each a
# third of a core (60 ms): targets a-c are reachable with more or less CPU, f (10 ms) is not.
WORK = {n: 20.0 for n in "abcdef"}
TARGETS = {"a": 30.0, "b": 40.0, "c": 100.0, "d": 110.0, "e": 90.0, "f": 10.0}


def r(name: str, target: float, response: float, usage: float, limit: float | None = None) -> Reading:
    return Reading(name, target, response, usage, limit)


def test_classify_puts_each_container_in_g_s_or_b_with_the_papers_sums() -> None:
    c = classify([r("g", 100, 50, 0.5), r("s", 100, 105, 0.3), r("b", 100, 150, 0.2), r("b2", 10, 12, 0.1)], 0.1)
    assert c.classes == {"g": QoeClass.G, "s": QoeClass.S, "b": QoeClass.B, "b2": QoeClass.B}
    assert (c.q_g, c.q_b, c.r_g, c.r_b, c.satisfied) == (50, -52, 0.5, 0.30000000000000004, 1)


def test_dqoes_moves_cpu_from_g_to_b_in_proportion_to_their_gaps() -> None:
    readings = [r("g1", 100, 40, 0.6), r("g2", 100, 80, 0.4), r("b1", 50, 100, 0.5, 0.5), r("b2", 50, 75, 0.5, 0.5),
                r("s", 50, 52, 0.3, 0.3)]
    limits = DQoES(alpha=0.1, beta=0.1).allocate(readings, host_cpus=2)
    # G's usage 1.0 x beta 0.1 = 0.1 cores, split 60:20 by quality; B gets it back split 50:25
    assert limits["g1"] == pytest.approx(0.6 - 0.075) and limits["g2"] == pytest.approx(0.4 - 0.025)
    assert limits["b1"] == pytest.approx(0.5 + 0.1 * 2 / 3, abs=1e-3)
    assert limits["b2"] == pytest.approx(0.5 + 0.1 / 3, abs=1e-3)
    assert "s" not in limits  # satisfied containers keep their limit


def test_dqoes_never_lowers_the_limit_of_a_container_that_needs_cpu() -> None:
    # b uses 0.2 of its 0.3-core limit (idle between requests); what G frees is added to the limit
    limits = DQoES(floor_cpus=0.1).allocate([r("g", 100, 50, 0.8), r("b", 10, 20, 0.2, 0.3)], host_cpus=2)
    assert limits["g"] == pytest.approx(0.72) and limits["b"] == pytest.approx(0.3 + 0.08)


def test_dqoes_respects_floor_and_ceiling_and_gives_nothing_when_g_has_nothing_to_give() -> None:
    policy = DQoES(alpha=0.1, beta=0.5)
    limits = policy.allocate([r("g", 100, 10, 0.2), r("b", 10, 100, 1.9)], host_cpus=2)
    assert limits["g"] == pytest.approx(0.5)  # floor 2 / (2 x 2): raised, not cut, so nothing saved
    assert "b" not in limits
    limits = DQoES(alpha=0.1, beta=0.5, floor_cpus=0.05).allocate([r("g", 100, 10, 0.4), r("b", 10, 100, 1.9, 1.9)], 2)
    assert limits["b"] == 2.0  # ceiling: the host's cores
    assert DQoES().allocate([r("b", 10, 100, 1.0), r("b2", 10, 50, 1.0)], 2) == {}


def test_dqoes_leaves_an_unlimited_container_in_b_unlimited_and_limits_none_below_the_floor() -> None:
    # four cores, two containers: the floor is 4 / (2 x 2) = 1 core
    g, b = r("g", 100, 50, 2.0), r("b", 10, 20, 0.3)
    assert DQoES().allocate([g, b], host_cpus=4) == {"g": 1.8}  # b already has every core: a limit takes some away
    assert DQoES().allocate([g, replace(b, limit_cpus=0.3)], host_cpus=4) == {"g": 1.8, "b": 1.0}  # raised to it
    assert DQoES(ceiling_cpus=2.0).allocate([g, replace(b, limit_cpus=3.0)], host_cpus=4) == {"g": 1.8}  # never cut


def test_static_shares_divide_the_host_over_the_whole_pool() -> None:
    read = [r("a", 10, 10, 1.0, 1.0), r("b", 10, 10, 1.0, 1.0)]
    assert StaticEqual().allocate(read, 4, pool={"a": 1.0, "b": 1.0, "c": 1.0, "d": None}) == {"d": 1.0}
    m, host = _manager(StaticEqual())
    m.analyst.remove_target("e")  # no target: no reading, but a share all the same
    m.analyst.remove_target("f")
    m.step()
    assert {c.spec.cpus for c in host.containers.values()} == {round(2 / 6, 3)}


def test_baselines_and_factory() -> None:
    readings = [r("x", 10, 10, 1.0, 0.5), r("y", 10, 10, 1.0)]
    assert NoLimits().allocate(readings, 2) == {"x": None}
    assert StaticEqual().allocate(readings, 2) == {"x": 1.0, "y": 1.0}
    assert create_policy("static").name == "static"
    with pytest.raises(ScenarioError, match="unknown allocation policy 'fair'"):
        create_policy("fair")
    with pytest.raises(ScenarioError, match="beta must be in"):
        DQoES(beta=1.5)


def _c(q_g: float, q_b: float, gaps: list[float]) -> Classification:
    """A classification with the summed gaps given and containers of target 100 ms at ``gaps`` (q_i, ms)."""
    c = classify([r(f"c{i}", 100, 100 - q, 0.1) for i, q in enumerate(gaps)], 0.1)
    return replace(c, q_g=q_g, q_b=q_b)


def test_adaptive_listener_doubles_after_three_converging_rounds_and_resets_when_s_drops() -> None:
    lis = AdaptiveListener(initial_s=10, alpha=0.1, margin=0.0, max_s=40)  # margin 0: the paper's rule
    moving = 1  # limits changed: only the gap sums can say "converging"
    assert lis.observe(_c(50, -50, [0]), moving) == 10  # first look: nothing to compare with
    steps = [(40, -40), (30, -35), (30, -30)]
    assert [lis.observe(_c(g, b, [0]), moving) for g, b in steps] == [10, 10, 20]
    assert [lis.observe(_c(30, -30, [0]), moving) for _ in range(3)] == [20, 20, 40]
    assert [lis.observe(_c(30, -30, [0]), moving) for _ in range(3)] == [40, 40, 40]  # capped at max_s
    assert lis.observe(_c(30, -30, [12]), moving) == 10  # the one satisfied container left S: reset at once
    assert lis.observe(_c(30, -60, [12]), moving) == 10 and lis._streak == 0  # B's gap grew: bouncing, keep
    assert [lis.observe(_c(30, -60, [12]), 0) for _ in range(3)] == [10, 10, 20]  # nothing changed: settled
    assert FixedListener(5).observe(_c(0, 0, [0]), 0) == 5
    with pytest.raises(ScenarioError, match="positive number of seconds; got 0"):
        create_listener("adaptive", interval_s=0)


def test_a_container_flickering_at_the_edge_of_its_band_does_not_reset_the_interval() -> None:
    lis = AdaptiveListener(initial_s=10, alpha=0.1, margin=0.1)
    for _ in range(4):
        lis.observe(_c(0, -5, [0, 5]), 0)
    assert lis.interval_s == 20
    assert lis.observe(_c(0, -12, [0, -12]), 0) == 20  # 12% off: just past the band, within the margin
    assert lis.observe(_c(0, -35, [0, -35]), 0) == 10  # 35% off: a real break


def test_histogram_statistics_from_bucket_deltas() -> None:
    before = HistogramSnapshot((0.01, 0.02, 0.04, float("inf")), (0, 0, 0, 0), 0.0, 0)
    after = HistogramSnapshot((0.01, 0.02, 0.04, float("inf")), (10, 60, 100, 100), 2.0, 100)
    d = after.since(before)
    assert d.statistic_s("mean") == pytest.approx(0.02)
    assert d.statistic_s("p50") == pytest.approx(0.01 + 0.01 * 40 / 50)
    assert d.statistic_s("p99") == pytest.approx(0.02 + 0.02 * 39 / 40)
    assert after.since(after).statistic_s("mean") is None  # nothing served in the interval
    with pytest.raises(ScenarioError, match="statistic 'p42'"):
        ApplicationMonitor(statistic="p42")


def _manager(policy, listener=None, on_exit: str = "restart") -> tuple[QoeManager, SimulatedHost]:
    host = SimulatedHost(2.0, WORK)
    m = QoeManager(host, policy, listener or FixedListener(1.0), host_cpus=2.0, on_exit=on_exit,
                   monitor=ApplicationMonitor(scraper=host.scrape))
    for i, name in enumerate(WORK):
        m.join(spec(name, 9000 + i), TARGETS[name])
    return m, host


def _satisfied_after(m: QoeManager, iterations: int) -> int:
    for _ in range(iterations):
        m.step()
    return m.timeline[-1]["counts"]["S"]


def test_dqoes_satisfies_more_containers_than_default_or_static_limits() -> None:
    default, static, dqoes = (_satisfied_after(_manager(p)[0], 40) for p in (NoLimits(), StaticEqual(), DQoES()))
    assert default == 0 and static == 0
    assert dqoes >= 3
    m, host = _manager(DQoES())
    _satisfied_after(m, 40)
    assert sum(host.cores().values()) <= 2.0 + 1e-6
    limits = [row["limit_cpus"] for row in m.status()["containers"]]
    assert all(limit is None or limit >= 2 / 12 - 1e-3 for limit in limits)  # the floor held


def test_adaptive_listener_backs_off_once_dqoes_converges() -> None:
    m, _ = _manager(DQoES(), AdaptiveListener(initial_s=1.0))
    waits = [m.step() for _ in range(60)]
    assert waits[-1] >= 8 and max(waits) == waits[-1]


def test_a_killed_container_is_restarted_or_dropped_and_the_loop_goes_on() -> None:
    m, host = _manager(DQoES())
    m.step()
    host.kill("c")
    m.step()
    assert host.containers["c"].running and any(e["event"] == "exited" for e in m.status()["events"])
    m, host = _manager(DQoES(), on_exit="drop")
    m.step()
    host.kill("c")
    m.step()
    assert "c" not in host.containers and "c" not in m.workers.pool
    assert m.step() > 0


def test_a_container_that_does_not_restart_is_dropped_and_the_loop_goes_on() -> None:
    m, host = _manager(DQoES())
    m.step()
    host.kill("c")
    host.failing_starts.add("c")
    host.kill("d")
    host.failing_stops.add("d")  # the stop before its restart fails, and so does the one that drops it
    m.step()
    assert "c" not in m.workers.pool and "d" not in m.workers.pool
    events = [(e["event"], e["container"]) for e in m.status()["events"]]
    assert ("restart failed", "c") in events and ("restart failed", "d") in events and ("stop failed", "d") in events
    assert m.step() > 0 and "c" not in m.timeline[-1]["containers"]


def test_a_run_with_no_container_to_manage_waits_instead_of_spinning(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("containers.qoe.timeline.plot_timeline", lambda record, path: None)
    late = ContainerPlan("late", tmp_path, 50.0, load=LoadSpec("none"))  # joins at a random time in the hour
    scenario = Scenario("empty", 1.0, (late,), schedule=Schedule("random", window_s=3600.0))
    cpu = time.thread_time()
    record = run_scenario(scenario, tmp_path / "run", backend=SimulatedHost(2.0, {"late": 20.0}))
    assert record["joined_at"] == {} and record["wall_s"] >= 1.0 and record["interrupted"] is False
    assert time.thread_time() - cpu < 0.25  # busy-waiting for the join took the whole second


def test_targets_change_while_running_and_bad_targets_are_refused() -> None:
    m, _ = _manager(DQoES())
    m.analyst.set_target("f", "75")
    m.analyst.remove_target("e")
    m.step()
    assert m.analyst.target("f") == 75.0 and "e" not in m.timeline[-1]["containers"]
    for bad, msg in [(0, "positive"), (-3, "positive"), ("fast", "must be a number"), (float("nan"), "positive")]:
        with pytest.raises(ScenarioError, match=msg):
            m.analyst.set_target("a", bad)
    with pytest.raises(UnknownContainer, match="no container named 'zz'"):
        m.analyst.set_target("zz", 10)


def test_a_container_that_stops_between_reading_and_resizing_is_left_to_the_restart() -> None:
    m, host = _manager(DQoES())
    m.step()
    before = m.executor.limit("c")
    host.kill("c")  # after its usage was read, before the new limits are applied
    assert m.executor.apply({"c": 0.9}) == 0 and m.executor.limit("c") == before
    m.step()
    assert host.containers["c"].running and host.containers["c"].spec.cpus == before


@pytest.mark.parametrize("name", ["a/b", "..", "a b", "x?y=1", "%2F", "é"])
def test_a_target_for_a_name_the_manager_does_not_know_is_a_one_line_error(tmp_path: Path, name: str) -> None:
    m, _ = _manager(DQoES())
    control = ControlServer(m.analyst, m.status, m.wake.set).start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # a run writes its status once its API answers
            try:
                requests.get(f"{control.url}/status", timeout=1)
                break
            except requests.ConnectionError:
                time.sleep(0.05)
        write_status(tmp_path, {"pid": os.getpid(), "control_url": control.url})
        with pytest.raises(UnknownContainer, match=f"^no container named {re.escape(repr(name))}"):
            change_target(tmp_path, name, 5.0)
        with pytest.raises(UnknownContainer, match=f"^no container named {re.escape(repr(name))}"):
            change_target(tmp_path, name, None)
        assert change_target(tmp_path, "a", 7.5) == {"container": "a", "target_ms": 7.5}
    finally:
        control.stop()


def test_sigterm_ends_a_run_as_ctrl_c_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("containers.qoe.timeline.plot_timeline", lambda record, path: None)
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))  # a run that ignored
    try:                                                                                     # it would go on
        plans = tuple(ContainerPlan(n, tmp_path, 50.0, load=LoadSpec("none")) for n in "ab")
        host = SimulatedHost(2.0, {"a": 20.0, "b": 20.0})
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
        started = time.monotonic()
        record = run_scenario(Scenario("term", 8.0, plans, interval_s=1.0), tmp_path / "run", backend=host)
        assert time.monotonic() - started < 4 and received == []
        assert set(record["joined_at"]) == {"a", "b"} and host.containers == {}  # joined, then stopped
        assert json.loads((tmp_path / "run" / "qoe.json").read_text())["interrupted"] is True  # no full run
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN  # the handler it had is back
        os.kill(os.getpid(), signal.SIGTERM)
        assert received == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("duration", ["0", "-5", "nan"])
def test_serve_refuses_a_duration_that_is_not_positive(tmp_path: Path, duration: str) -> None:
    from autotune.cli import app

    result = CliRunner().invoke(app, ["serve", str(tmp_path), "--target-ms", "5", "--duration", duration])
    assert result.exit_code == 2, result.output
    assert "--duration must be a positive number of seconds" in result.output

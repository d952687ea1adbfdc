"""Scenario files, arrival patterns, join schedules and the client-side balancer."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from containers.errors import ScenarioError
from containers.load import NOT_SENT, Arrivals, Balancer, Gamma, LoadClient, Poisson, Trace, join_times
from containers.qoe.run import summarize
from containers.scenario import read_scenario
from tests.fakes import SlowInferenceClient


def _artifact(tmp_path: Path) -> Path:
    art = tmp_path / "art"
    art.mkdir(exist_ok=True)
    (art / "manifest.json").write_text("{}")
    return art


def _write(tmp_path: Path, body: str) -> Path:
    _artifact(tmp_path)
    path = tmp_path / "scenario.toml"
    path.write_text(textwrap.dedent(body))
    return path


GOOD = """\
    name = "mixed"
    duration_s = 60
    policy = "dqoes"

    [schedule]
    kind = "fixed"
    interval_s = 5

    [[containers]]
    name = "a"
    artifact = "art"
    target_ms = 2.5

    [[containers]]
    name = "b"
    artifact = "art"
    target_ms = 40
    load = { kind = "gamma", rate_per_s = 20, cv = 2 }
"""


def test_a_good_scenario_reads_with_defaults(tmp_path: Path) -> None:
    s = read_scenario(_write(tmp_path, GOOD))
    assert (s.name, s.duration_s, s.listener, s.alpha, s.schedule.kind, s.schedule.interval_s) == (
        "mixed", 60.0, "adaptive", 0.1, "fixed", 5.0)
    assert [c.name for c in s.containers] == ["a", "b"]
    assert s.containers[0].artifact == (tmp_path / "art").resolve()
    assert isinstance(s.containers[1].load.arrivals(), Gamma) and s.containers[0].load.arrivals() is None


@pytest.mark.parametrize("old, new, message", [
    ('target_ms = 2.5', 'target_ms = -1', r"line 12: containers\[0\].target_ms must be a positive number; got -1"),
    ('target_ms = 40', 'target_ms = "fast"', r"line 17: containers\[1\].target_ms must be a positive number; got 'fast'"),
    ('name = "b"', 'name = "a"', r"line 15: containers\[1\].name 'a' is used twice"),
    ('name = "b"', 'name = "b c"', r"line 15: containers\[1\].name must be letters"),
    ('artifact = "art"\ntarget_ms = 2.5', 'artifact = "nope"\ntarget_ms = 2.5', r"line 11: containers\[0\].artifact .*nope is not an artifact"),
    ('policy = "dqoes"', 'policy = "fair"', r"line 3: policy must be one of dqoes, static, none; got 'fair'"),
    ('duration_s = 60', 'duration_s = 0', r"line 2: duration_s must be a positive number; got 0"),
    ('duration_s = 60', 'durations = 60', r"line 2: durations is not a known field"),
    ('kind = "fixed"', 'kind = "weekly"', r"line 6: schedule.kind must be one of burst, fixed, random"),
    ('cv = 2 }', 'cv = 2, rate = 3 }', r"line 18: containers\[1\].load.rate is not a known field"),
    ('rate_per_s = 20, ', '', r"line 18: containers\[1\].load.rate_per_s must be a positive number for gamma"),
    ('name = "mixed"', 'name = "mixed', r"not valid TOML"),
    ('cv = 2 }', 'cv = 2, concurrency = "many" }',
     r"line 18: containers\[1\].load.concurrency must be a positive integer; got 'many'$"),
    ('cv = 2 }', 'cv = 2, think_s = [1] }', r"line 18: containers\[1\].load.think_s must be a number; got \[1\]$"),
    ('cv = 2 }', 'cv = 2, think_s = -0.5 }', r"line 18: containers\[1\].load.think_s must be a finite number"),
    ('cv = 2 }', 'cv = "high" }', r"line 18: containers\[1\].load.cv must be a positive number; got 'high'$"),
    ('rate_per_s = 20', 'rate_per_s = "20"', r"line 18: containers\[1\].load.rate_per_s must be a positive number"),
])
def test_scenario_errors_name_the_line_and_field(tmp_path: Path, old: str, new: str, message: str) -> None:
    body = textwrap.dedent(GOOD)
    assert old in body
    with pytest.raises(ScenarioError, match=message):
        read_scenario(_write(tmp_path, body.replace(old, new, 1)))


def test_a_scenario_without_containers_or_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"containers must list at least one"):
        read_scenario(_write(tmp_path, 'duration_s = 5\n'))
    with pytest.raises(ScenarioError, match="cannot read scenario"):
        read_scenario(tmp_path / "missing.toml")


def test_a_scenario_that_is_not_utf8_is_refused_with_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    path.write_bytes(path.read_bytes().replace(b'name = "b"', b'name = "b\xe9"'))
    with pytest.raises(ScenarioError, match=r"scenario.toml, line 15: not UTF-8 text \(byte 0xe9\); a scenario file "
                                            r"must be UTF-8 TOML$"):
        read_scenario(path)


def test_trace_files_are_checked_line_by_line(tmp_path: Path) -> None:
    good = tmp_path / "t.txt"
    good.write_text("# seconds\n0.0\n0.5\n0.5\n2\n")
    assert Trace.read(good).times == (0.0, 0.5, 0.5, 2.0)
    assert list(Trace.read(good).gaps(np.random.default_rng())) == [0.0, 0.5, 0.0, 1.5]
    for body, message in [("1\n0.5\n", "line 2: times must be non-negative and sorted"),
                          ("1\nsoon\n", "line 2: expected a time in seconds; got 'soon'"), ("# empty\n", "holds no")]:
        good.write_text(body)
        with pytest.raises(ScenarioError, match=message):
            Trace.read(good)


@pytest.mark.parametrize("text", ["nan", "inf", "-inf"])
def test_trace_files_refuse_times_that_are_not_finite(tmp_path: Path, text: str) -> None:
    path = tmp_path / "t.txt"
    path.write_text(f"0.5\n{text}\n")
    with pytest.raises(ScenarioError, match=f"t.txt, line 2: expected a time in seconds; got '{text}'"):
        Trace.read(path)


@pytest.mark.parametrize("arrivals", [Trace((0.0,) * 200), Poisson(500.0)], ids=["trace ran out", "still arriving"])
def test_stopping_an_open_loop_does_not_send_its_backlog(monkeypatch: pytest.MonkeyPatch, arrivals: Arrivals) -> None:
    monkeypatch.setattr("containers.client.InferenceClient", SlowInferenceClient)
    client = LoadClient(["http://127.0.0.1:9"], [], arrivals).start()  # one request in flight at a time
    time.sleep(0.3)
    started = time.monotonic()
    records = client.stop()
    assert time.monotonic() - started < 10 * SlowInferenceClient.seconds  # the request in flight, not seconds more
    answered, unsent = [r for r in records if r.ok], [r for r in records if not r.ok]
    assert answered and unsent and all(r.error == NOT_SENT for r in unsent)  # the backlog is on the record, not lost
    if isinstance(arrivals, Trace):
        assert len(records) == 200


class _SlowlyDrawn(Arrivals):
    """``count`` arrivals all due at once, drawn slowly, as on a busy host."""

    def __init__(self, count: int) -> None:
        self.count = count

    def gaps(self, rng: np.random.Generator) -> Iterator[float]:
        for _ in range(self.count):
            time.sleep(0.01)
            yield 0.0


def test_arrivals_due_before_the_stop_are_on_the_record_even_if_not_yet_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("containers.client.InferenceClient", SlowInferenceClient)
    client = LoadClient(["http://127.0.0.1:9"], [], _SlowlyDrawn(60)).start()
    time.sleep(0.2)  # about 20 of the 60 drawn
    records = client.stop()
    assert len(records) == 60 and sum(r.error == NOT_SENT for r in records) >= 30


def test_arrival_processes_have_the_asked_rate_and_variability() -> None:
    rng = np.random.default_rng(0)
    for arrivals, cv in [(Poisson(50.0), 1.0), (Gamma(50.0, 3.0), 3.0), (Gamma(50.0, 0.5), 0.5)]:
        gaps = np.array([g for g, _ in zip(arrivals.gaps(rng), range(20000))])
        assert gaps.mean() == pytest.approx(1 / 50, rel=0.08)
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)
    with pytest.raises(ScenarioError, match="rate_per_s must be a positive number; got 0"):
        Poisson(0)


def test_join_schedules() -> None:
    assert join_times("burst", 3) == [0.0, 0.0, 0.0]
    assert join_times("fixed", 3, interval_s=20) == [0.0, 20.0, 40.0]
    times = join_times("random", 6, window_s=60, seed=1)
    assert times == sorted(times) and all(0 <= t <= 60 for t in times) and len(set(times)) == 6
    assert times == join_times("random", 6, window_s=60, seed=1)
    with pytest.raises(ScenarioError, match="unknown schedule 'daily'"):
        join_times("daily", 2)


def test_balancer_sends_to_the_replica_with_fewest_in_flight() -> None:
    b = Balancer(["u0", "u1", "u2"])
    with b.pick() as first, b.pick() as second:
        with b.pick() as third:
            assert {first, second, third} == {"u0", "u1", "u2"}
        with b.pick() as fourth:
            assert fourth == third  # the only one with nothing in flight
    picks = []
    for _ in range(6):
        with b.pick() as url:
            picks.append(url)
    assert sorted(picks) == ["u0", "u0", "u1", "u1", "u2", "u2"]  # idle replicas take turns


def test_summary_finds_when_satisfied_count_settled() -> None:
    def it(t: float, s: int, changes: int) -> dict:
        return {"t": t, "counts": {"G": 0, "S": s, "B": 3 - s}, "changes": changes, "quality_sums": {}}

    timeline = [it(0, 0, 0), it(10, 1, 3), it(20, 2, 2), it(30, 1, 1), it(40, 3, 1), it(80, 3, 0), it(160, 3, 0)]
    s = summarize(timeline, last_join_s=5, duration_s=220)
    assert s["satisfied_final"] == 3 and s["converged_after_iterations"] == 3 and s["converged_at_s"] == 40
    assert s["iterations_after_converged_per_min"] == pytest.approx(3 / 3, rel=0.01)

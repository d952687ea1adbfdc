"""The live pipeline: batched queues, routing and joins against real model servers; replicas coming and going;
``plan apply`` refusing bad input before it starts anything; and a plan applied on Docker against its prediction.

The front-end tests run real model servers (``python -m containers.server``) on a real toy
artifact built from Relax in seconds (``tests.test_server``); the Docker test profiles the
session's tuned MLP in containers, plans a two-stage pipeline on it and serves it.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from autotune.cli import app
from containers.backends import PERIOD_US
from containers.errors import ContainerError
from containers.planner.batchqueue import ReplicaChange
from containers.planner.config import StageConfig
from containers.planner.estimator import Estimator
from containers.planner.frontend import UNFINISHED, Frontend, LiveQueries, stage_inputs
from containers.planner.live import served_schedule, start_ups
from containers.planner.replicas import ReplicaEvent, ReplicaSet
from containers.planner.pipeline import Pipeline, Stage, read_pipeline
from containers.planner.planner import plan_pipeline
from containers.planner.profiles import ServicePoint, StageProfile
from containers.planner.trace import gamma_trace, write_trace
from tests.fakes import SimulatedHost, spec
from results.artifact import rewrite_profile
from results.profile import read_profile
from tests.planner_profiles import CHAIN, CNN, PRE, chain, one_stage, write_profile  # noqa: F401 (chain: a fixture)
from tests.test_server import build_toy_artifact, running_server

SHARE_TOLERANCE = 0.08


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_toy_artifact(tmp_path_factory.mktemp("toy") / "artifact")


@pytest.fixture(scope="module")
def urls(toy: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two model servers on the toy artifact, shared by the front-end tests (stages may share a server)."""
    logs = tmp_path_factory.mktemp("logs")
    with ExitStack() as stack:
        yield [stack.enter_context(running_server(toy, logs / f"toy-{i}.log")) for i in range(2)]


def _pipeline(toy: Path, layout: list[tuple[str, tuple[str, ...], float]]) -> Pipeline:
    """Stages on the toy artifact; their profile only matters to the Estimator, whose draws route the queries."""
    points = {"cpu-1": tuple(ServicePoint(b, 1.0 + b, 2.0 + b) for b in (1, 2, 4, 8))}
    return Pipeline("live", tuple(Stage(n, toy, parents, s, StageProfile(n, points), {"cpu-1": 0.0425})
                                  for n, parents, s in layout))


def _serve(pipeline: Pipeline, config: dict[str, StageConfig], arrivals: np.ndarray, replicas: dict[str, list[str]]
           ) -> tuple[LiveQueries, Estimator]:
    estimator = Estimator(pipeline, arrivals, seed=0)
    frontend = Frontend(pipeline, config, estimator.visits_, stage_inputs(pipeline, config), request_timeout_s=5)
    for stage, stage_urls in replicas.items():
        for url in stage_urls:
            frontend.add_replica(stage, url)
    frontend.drive(arrivals)
    frontend.drain(10)
    return frontend.close(), estimator


def test_every_query_is_routed_as_the_estimator_draws_and_joins_wait_for_all_parents(toy: Path, urls: list[str]
                                                                                    ) -> None:
    pipeline = _pipeline(toy, [("a", (), 1.0), ("b", ("a",), 0.5), ("c", ("a",), 0.7), ("d", ("b", "c"), 1.0)])
    config = {n: StageConfig("cpu-1", 4, 1, 5.0) for n in "abcd"}
    arrivals = gamma_trace(150, 1.0, 2.5, seed=3)
    queries, estimator = _serve(pipeline, config, arrivals, {"a": urls, "b": urls[:1], "c": urls[1:], "d": urls[:1]})
    assert queries.arrival_s.size == arrivals.size and not queries.failed.any()
    assert np.isfinite(queries.latency_ms).all() and (queries.latency_ms > 0).all()
    carried: dict[str, dict[int, tuple[float, float]]] = {n: {} for n in "abcd"}
    for batch in queries.batches:
        assert batch.error is None
        for q in batch.queries:
            assert q not in carried[batch.stage], f"query {q} served twice at {batch.stage}"
            carried[batch.stage][q] = (batch.sent_s, batch.done_s)
    for stage in "abcd":  # the same queries as the Estimator's draws, no more and no fewer
        assert sorted(carried[stage]) == np.flatnonzero(estimator.visits_[stage]).tolist()
    assert abs(len(carried["b"]) / arrivals.size - 0.5) < SHARE_TOLERANCE
    assert abs(len(carried["c"]) / arrivals.size - 0.7) < SHARE_TOLERANCE
    for q, (sent, _) in carried["d"].items():  # a join starts a query only once every parent it visited is done
        parents = [carried[p][q][1] for p in "bc" if q in carried[p]]
        assert parents and sent >= max(parents)
    for q in range(arrivals.size):  # complete when its last stage is done; latency counts from its arrival
        last = max(done for stage in "abcd" if q in carried[stage] for done in [carried[stage][q][1]])
        assert queries.latency_ms[q] == pytest.approx((last - queries.arrival_s[q]) * 1e3)


def test_batches_respect_the_batch_size_and_the_timeout(toy: Path, urls: list[str]) -> None:
    timeout_s, size = 0.040, 4
    pipeline = _pipeline(toy, [("m", (), 1.0)])
    config = {"m": StageConfig("cpu-1", size, 1, timeout_s * 1e3)}
    burst = [0.1] * 10 + [0.5, 0.8, 1.1] + [1.5] * 6  # two bursts with lone queries between them
    queries, _ = _serve(pipeline, config, np.asarray(burst), {"m": urls[:1]})
    assert not queries.failed.any()
    sizes = [len(b.queries) for b in queries.batches]
    assert max(sizes) == size and sum(sizes) == len(burst)
    for batch in queries.batches:
        waited = batch.sent_s - batch.oldest_ready_s
        if len(batch.queries) < size:  # a partial batch goes only once its oldest query waited the timeout
            assert timeout_s - 1e-3 <= waited < timeout_s + 0.1, (batch, waited)
    lone = [b for b in queries.batches if queries.arrival_s[b.queries[0]] in (0.5, 0.8, 1.1)]
    assert [len(b.queries) for b in lone] == [1, 1, 1]
    first = [b for b in queries.batches if b.queries[0] in (0, 13)]  # each burst's first batch is full at once
    assert all(len(b.queries) == size and b.sent_s - b.oldest_ready_s < timeout_s for b in first)


def test_a_failed_request_fails_its_queries_and_none_is_lost(toy: Path, urls: list[str]) -> None:
    pipeline = _pipeline(toy, [("a", (), 1.0), ("b", ("a",), 0.5)])
    config = {n: StageConfig("cpu-1", 2, 1, 0.0) for n in "ab"}
    arrivals = gamma_trace(60, 1.0, 1.5, seed=4)
    queries, estimator = _serve(pipeline, config, arrivals, {"a": urls[:1], "b": ["http://127.0.0.1:9"]})
    assert queries.arrival_s.size == arrivals.size
    assert np.array_equal(queries.failed, estimator.visits_["b"])  # exactly those that reached the dead replica
    assert all(e.startswith("b: ContainerError: cannot reach") for e in queries.errors if e is not None)
    summary = queries.summary(slo_ms=1e6)
    assert summary["failed"] == int(estimator.visits_["b"].sum()) and summary["miss_rate"] == pytest.approx(
        summary["failed"] / arrivals.size, abs=1e-5)  # the summary rounds to 5 places
    assert UNFINISHED not in queries.errors


def test_replicas_join_and_leave_while_queries_flow(toy: Path, tmp_path: Path) -> None:
    from containers.backends.base import ContainerSpec
    from containers.backends.local import LocalBackend
    from containers.planner.replicas import ReplicaSet

    pipeline = _pipeline(toy, [("m", (), 1.0)])
    config = {"m": StageConfig("cpu-1", 1, 1, 0.0)}
    arrivals = gamma_trace(40, 1.0, 20.0, seed=5)  # long enough for a server that takes 7.5 s to start (a busy host)
    estimator = Estimator(pipeline, arrivals)
    frontend = Frontend(pipeline, config, estimator.visits_, stage_inputs(pipeline, config))
    backend = LocalBackend(log_dir=tmp_path)
    replicas = ReplicaSet(backend, frontend, {"m": [ContainerSpec("live-m-0", toy, 18790, threads=1)]})
    replicas.start()
    driver = threading.Thread(target=frontend.drive, args=(arrivals,))
    driver.start()
    try:
        frontend.started.wait(5)
        replicas.scale("m", 2)
        deadline = time.monotonic() + 30
        while len(frontend.replicas("m")) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2.0)  # both serve for two seconds
        replicas.scale("m", 1)
        driver.join()
        frontend.drain(10)
    finally:
        replicas.close()
        queries = frontend.close()
    events = [(e.event, e.replicas, e.container) for e in replicas.events_]
    assert events[:3] == [("planned", 1, None), ("asked", 2, None), ("serving", 2, "live-m-1")]
    assert events[3:] == [("asked", 1, None), ("removed", 1, "live-m-1")]  # the newest goes first
    removed_at, first = replicas.events_[-1].t_s, "http://127.0.0.1:18790"
    added = {b.url for b in queries.batches} - {first}
    assert len(added) == 1  # both replicas served, on ports of their own
    assert all(b.done_s <= removed_at for b in queries.batches if b.url in added)
    assert queries.arrival_s.size == arrivals.size and not queries.failed.any(), \
        sorted({e for e in queries.errors if e is not None})  # why a query failed, when one does
    assert backend.list() == []
    asked_at, served_at = replicas.events_[1].t_s, replicas.events_[2].t_s
    assert start_ups(replicas.events_) == {"m": [pytest.approx(served_at - asked_at, abs=1e-3)]}
    assert removed_at < replicas.events_[3].t_s + 1.0  # stamped when it left the route, not after its stop


def test_a_standby_replica_is_resumed_in_milliseconds_and_another_takes_its_place(toy: Path, tmp_path: Path) -> None:
    from containers.backends.base import ContainerSpec
    from containers.backends.local import LocalBackend
    from containers.planner.replicas import ReplicaSet

    pipeline = _pipeline(toy, [("m", (), 1.0)])
    config = {"m": StageConfig("cpu-1", 1, 1, 0.0)}
    arrivals = gamma_trace(40, 1.0, 20.0, seed=5)
    estimator = Estimator(pipeline, arrivals)
    frontend = Frontend(pipeline, config, estimator.visits_, stage_inputs(pipeline, config))
    backend = LocalBackend(log_dir=tmp_path)
    replicas = ReplicaSet(backend, frontend, {"m": [ContainerSpec("live-m-0", toy, 18790, threads=1, cpus=1.0)]},
                          standby=1.0)
    replicas.start()
    driver = threading.Thread(target=frontend.drive, args=(arrivals,))
    try:
        paused = {info.spec.name: info.ident for info in backend.list()}
        assert sorted(paused) == ["live-m-0", "live-m-1"] and frontend.replicas("m") == ("http://127.0.0.1:18790",)
        assert _process_state(paused["live-m-1"]) == "T"  # frozen: warm, using no CPU
        driver.start()
        frontend.started.wait(5)
        replicas.scale("m", 3)  # one from the standby, one cold
        deadline = time.monotonic() + 60
        while not any(e.event == "standby" for e in replicas.events_) and time.monotonic() < deadline:
            time.sleep(0.1)
        driver.join()
        frontend.drain(10)
    finally:
        if driver.is_alive():
            driver.join()
        replicas.close()
        queries = frontend.close()
    events = [(e.event, e.replicas, e.container) for e in replicas.events_]
    # the replacement standby starts only once the cold start beside it serves
    assert events == [("planned", 1, None), ("asked", 3, None), ("serving", 2, "live-m-1"), ("serving", 3, "live-m-3"),
                      ("standby starting", 0, "live-m-2"), ("standby", 1, "live-m-2")]
    resumed, cold = start_ups(replicas.events_)["m"]
    assert resumed < 0.5 < cold  # a container start takes seconds
    assert len({b.url for b in queries.batches}) == 3  # the resumed standby served (the new one is paused)
    assert queries.arrival_s.size == arrivals.size and not queries.failed.any()
    assert backend.list() == []  # the new standby stopped with the rest


def _process_state(pid: str) -> str:
    """A process's state letter from /proc (``T``: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_an_ask_beyond_what_the_cores_hold_starts_nothing_more_and_says_so(toy: Path, tmp_path: Path) -> None:
    from containers.backends.base import ContainerSpec
    from containers.backends.local import LocalBackend
    from containers.planner.deploy_plan import CorePlacement
    from containers.planner.replicas import ReplicaSet

    pipeline = _pipeline(toy, [("m", (), 1.0)])
    config = {"m": StageConfig("cpu-1", 1, 1, 0.0)}
    frontend = Frontend(pipeline, config, Estimator(pipeline, gamma_trace(10, 1.0, 1.0, seed=5)).visits_,
                        stage_inputs(pipeline, config))
    placement = CorePlacement([0])
    planned = ContainerSpec("live-m-0", toy, 18790, threads=1, cpus=1.0, cpuset=placement.take(1.0))
    backend = LocalBackend(log_dir=tmp_path)
    replicas = ReplicaSet(backend, frontend, {"m": [planned]}, placement)
    try:
        replicas.scale("m", 3)
    finally:
        frontend.close()
    # not started: nothing serves, and the cores, held by the planned replica, take no other
    assert [(e.event, e.replicas) for e in replicas.events_] == [("asked", 3), ("capped", 0)]
    assert "does not fit on cores 0" in (replicas.events_[-1].error or "")
    assert backend.list() == [] and placement.committed == {0: 1.0}


def _simulated_replicas(tmp_path: Path, names: list[str]) -> tuple[ReplicaSet, Frontend, SimulatedHost]:
    """A one-stage pipeline's replicas ``names`` on a simulated host (nothing to warm up: no server answers)."""
    pipeline = one_stage(tmp_path, {1: {1: 10.0}})
    config = {"m": StageConfig("cpu-1", 1, 1)}
    frontend = Frontend(pipeline, config, {"m": np.ones(1, bool)}, {"m": lambda k: []})
    host = SimulatedHost(2.0, {name: 10.0 for name in names})
    specs = {"m": [spec(name, 19000 + i) for i, name in enumerate(names)]}
    return ReplicaSet(host, frontend, specs, warmup_requests=0), frontend, host


def test_closing_the_replicas_stops_every_container_when_one_does_not_stop(tmp_path: Path) -> None:
    replicas, frontend, host = _simulated_replicas(tmp_path, ["m-0", "m-1", "m-2"])
    replicas.start()
    host.failing_stops = {"m-0"}
    try:
        with pytest.raises(ContainerError, match="refused to stop container m-0"):
            replicas.close()
    finally:
        frontend.close()
    assert list(host.containers) == ["m-0"] and frontend.replicas("m") == ()


def test_a_start_that_fails_stops_the_others_even_when_one_of_them_does_not_stop(tmp_path: Path) -> None:
    replicas, frontend, host = _simulated_replicas(tmp_path, ["m-0", "m-1", "m-2"])
    host.failing_starts, host.failing_stops = {"m-1"}, {"m-0"}
    try:
        with pytest.raises(ContainerError, match="did not all start; m-1: container m-1 did not start; stopping those "
                                                 "that started: the engine refused to stop container m-0"):
            replicas.start()
    finally:
        frontend.close()
    assert list(host.containers) == ["m-0"] and frontend.replicas("m") == ()


def test_start_ups_match_each_serving_replica_to_the_ask_it_answered() -> None:
    events = [ReplicaEvent(0.0, "m", 1, "planned"), ReplicaEvent(10.0, "m", 4, "asked"),
              ReplicaEvent(14.0, "m", 2, "serving", "m-1"), ReplicaEvent(15.0, "m", 2, "failed", "m-2", "no port"),
              ReplicaEvent(15.5, "m", 2, "asked"),  # cancels the newest start still pending (m-3)
              ReplicaEvent(20.0, "m", 3, "asked"), ReplicaEvent(26.0, "m", 3, "serving", "m-4"),
              ReplicaEvent(40.0, "m", 1, "asked"), ReplicaEvent(40.1, "m", 2, "removed", "m-4"),
              ReplicaEvent(40.2, "m", 1, "removed", "m-1")]
    assert start_ups(events) == {"m": [4.0, 6.0]}
    # an ask far below what serves cancels every pending start, and no more
    events = [ReplicaEvent(0.0, "m", 3, "planned"), ReplicaEvent(1.0, "m", 6, "asked"), ReplicaEvent(2.0, "m", 1, "asked"),
              ReplicaEvent(3.0, "m", 5, "asked"), ReplicaEvent(9.0, "m", 2, "serving", "m-9"),
              ReplicaEvent(9.5, "m", 1, "removed", "m-1"),  # logged once its container stopped, after the asks
              ReplicaEvent(10.0, "m", 3, "serving", "m-10"), ReplicaEvent(11.0, "m", 4, "serving", "m-11"),
              ReplicaEvent(12.0, "m", 5, "serving", "m-12")]
    assert start_ups(events) == {"m": [6.0, 7.0, 8.0, 9.0]}


def test_an_ask_the_cores_cannot_hold_leaves_only_the_starts_that_fit_pending() -> None:
    events = [ReplicaEvent(0.0, "m", 1, "planned"), ReplicaEvent(10.0, "m", 9, "asked"),
              ReplicaEvent(10.0, "m", 3, "capped", error="does not fit"),  # two started, six never will
              ReplicaEvent(14.0, "m", 2, "serving", "m-1"), ReplicaEvent(15.0, "m", 3, "serving", "m-2"),
              ReplicaEvent(30.0, "m", 4, "asked"), ReplicaEvent(36.0, "m", 4, "serving", "m-3")]
    assert start_ups(events) == {"m": [4.0, 5.0, 6.0]}


def test_the_as_served_schedule_predicts_what_the_asked_one_does_when_replicas_start_as_assumed(chain) -> None:
    arrivals = gamma_trace(60, 1.0, 40, seed=3)
    config = {"pre": StageConfig("cpu-1", 1, 1, 0.0), "cnn": StageConfig("cpu-1", 1, 1, 0.0),
              "post": StageConfig("cpu-1", 1, 1, 0.0)}
    events = [ReplicaEvent(0.0, "cnn", 1, "planned"), ReplicaEvent(10.0, "cnn", 3, "asked"),
              ReplicaEvent(15.0, "cnn", 2, "serving", "c-1"), ReplicaEvent(15.0, "cnn", 3, "serving", "c-2"),
              ReplicaEvent(30.0, "cnn", 1, "asked"), ReplicaEvent(30.0, "cnn", 2, "removed", "c-2"),
              ReplicaEvent(30.0, "cnn", 1, "removed", "c-1")]
    asked = [ReplicaChange(e.t_s, e.stage, e.replicas) for e in events if e.event == "asked"]
    modelled = Estimator(chain, arrivals, seed=4, startup_s=5.0).estimate(config, 200, asked)
    served = Estimator(chain, arrivals, seed=4, startup_s=0.0).estimate(config, 200, served_schedule(events))
    np.testing.assert_allclose(served.latencies_ms, modelled.latencies_ms)
    later = [ReplicaChange(20.0, "cnn", 3), ReplicaChange(30.0, "cnn", 1)]  # had they served 5 s later
    late = Estimator(chain, arrivals, seed=4, startup_s=0.0).estimate(config, 200, later)
    assert late.p99_ms > served.p99_ms


NO_BACKEND = "the test's stand-in backend: nothing starts"


def _apply_inputs(tmp_path: Path, toy: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, dict, list]:
    """The chain pipeline on real toy artifacts (with its synthetic profiles), a trace, the plan made for them as
    JSON, and the calls to a stand-in ``create_backend`` that refuses: a plan without a defect gets that far."""
    import containers.backends

    created: list[object] = []

    def create_backend(*args: object, **kwargs: object) -> None:
        created.append(args)
        raise ContainerError(NO_BACKEND)

    monkeypatch.setattr(containers.backends, "create_backend", create_backend)
    for name, table in (("pre", PRE), ("cnn", CNN)):
        profile = read_profile(write_profile(tmp_path / "profiles" / name, table) / "profile.json")
        rewrite_profile(shutil.copytree(toy, tmp_path / name), profile)
    pipeline_file = tmp_path / "pipeline.toml"
    pipeline_file.write_text(textwrap.dedent(CHAIN))
    trace = tmp_path / "trace.txt"
    write_trace(trace, gamma_trace(20, 1.0, 10, seed=1))
    plan = plan_pipeline(Estimator(read_pipeline(pipeline_file), gamma_trace(20, 1.0, 10, seed=1)))
    return pipeline_file, trace, plan.to_json(), created


def _apply(plan_file: Path, trace: Path, out: Path, pipeline_file: Path, *options: str):
    return CliRunner().invoke(app, ["plan", "apply", str(plan_file), "--trace", str(trace), "--out", str(out),
                                    "--pipeline", str(pipeline_file), *options])


def test_plan_apply_without_a_defect_gets_as_far_as_the_backend(tmp_path: Path, toy: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusals below come from their defects: the same inputs without one pass every check."""
    pipeline_file, trace, raw, created = _apply_inputs(tmp_path, toy, monkeypatch)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(raw))
    result = _apply(plan_file, trace, tmp_path / "run", pipeline_file, "--tuner", "--standby", "1")
    assert result.exit_code == 1 and NO_BACKEND in result.output, result.output
    assert len(created) == 1 and not (tmp_path / "run" / "live.json").exists()


@pytest.mark.parametrize("case", ["other pipeline", "unprofiled hardware", "not a plan", "not an artifact",
                                  "more than the cores hold", "cores not ours", "negative standby",
                                  "standby without the Tuner"])
def test_plan_apply_refuses_bad_input_and_starts_nothing(tmp_path: Path, toy: Path, monkeypatch: pytest.MonkeyPatch,
                                                         case: str) -> None:
    pipeline_file, trace, raw, created = _apply_inputs(tmp_path, toy, monkeypatch)
    if case == "other pipeline":
        raw["pipeline"] = "elsewhere"
    elif case == "unprofiled hardware":
        raw["stages"]["cnn"]["hardware"] = "cpu-4"
    elif case == "not a plan":
        raw = {"schema_version": 1}
    elif case == "not an artifact":  # a folder holding only a profile: plannable, not servable
        shutil.rmtree(tmp_path / "cnn")
        write_profile(tmp_path / "cnn", CNN)
    elif case == "more than the cores hold":
        raw["stages"]["cnn"]["replicas"] = 4 * os.cpu_count()
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(raw))
    options = ["--cores", str(max(os.sched_getaffinity(0)) + 1)] if case == "cores not ours" else []
    options += ["--tuner", "--standby", "-1"] if case == "negative standby" else []
    options += ["--standby", "1"] if case == "standby without the Tuner" else []
    result = _apply(plan_file, trace, tmp_path / "run", pipeline_file, *options)
    assert result.exit_code == 2, result.output
    need = sum(s["replicas"] * float(s["hardware"].removeprefix("cpu-")) for s in raw.get("stages", {}).values())
    says = {"other pipeline": "the plan is for pipeline 'elsewhere', not 'chain'",
            "unprofiled hardware": "stage cnn has no profile for hardware cpu-4; profiled: cpu-0.5, cpu-1, cpu-2",
            "not a plan": "plan.json is not a valid plan",
            "not an artifact": f"{tmp_path / 'cnn'} is not an artifact: it has no manifest.json",
            "more than the cores hold": f"the plan's replicas need {need:g} cores of quota",
            "cores not ours": "names cores this process may not use",
            "negative standby": "standby replicas per planned replica must be a number of at least 0",
            "standby without the Tuner": "serve only the Tuner's scale-ups"}
    assert says[case] in " ".join(result.output.split()), result.output
    assert created == [] and not (tmp_path / "run" / "live.json").exists()


@pytest.mark.docker
def test_a_two_stage_plan_served_on_docker_loses_nothing_and_tracks_its_prediction(tuned_run, docker_backend,
                                                                                  tmp_path: Path) -> None:
    from containers.planner.live import apply_plan
    from containers.profiling import ContainerSize, merge_profile, profile_in_containers

    artifact = Path(shutil.copytree(tuned_run.artifact, tmp_path / "artifact"))
    entries = profile_in_containers(docker_backend, artifact, [ContainerSize(0.5, (0,))], [1], seconds=2.0,
                                    warmup_s=0.5)
    rewrite_profile(artifact, merge_profile(read_profile(artifact / "profile.json"), entries))
    (tmp_path / "two.toml").write_text(
        f'name = "two"\n[[stages]]\nname = "first"\nartifact = "{artifact}"\nhardware = ["cpu-0.5"]\n'
        f'[[stages]]\nname = "second"\nartifact = "{artifact}"\nparents = ["first"]\nhardware = ["cpu-0.5"]\n')
    pipeline = read_pipeline(tmp_path / "two.toml")
    service_ms = pipeline.stage("first").profile.service_ms("cpu-0.5", 1)
    rate = min(0.3e3 / service_ms, 40.0)
    plan = plan_pipeline(Estimator(pipeline, gamma_trace(rate, 1.0, 20, seed=1)), slo_ms=20 * service_ms)
    live = gamma_trace(rate, 1.0, 8, seed=2)
    record = apply_plan(plan, pipeline, live, tmp_path / "run", backend=docker_backend)
    assert record["measured"]["queries"] == live.size and record["measured"]["failed"] == 0
    assert 0 < record["frontend"]["cores_used"] < len(os.sched_getaffinity(0))  # this process: front end and load
    assert docker_backend.list() == []
    assert (tmp_path / "run" / "live.json").is_file() and (tmp_path / "run" / "live.png").is_file()
    measured, predicted = record["measured"], record["predicted"]
    per_query = record["queries"]["predicted_ms"]  # what pools runs: the same prediction, query by query
    assert len(per_query) == live.size and abs(np.percentile(per_query, 99) - predicted["p99_ms"]) < 0.01
    # The body of the live distribution tracks the Estimator's. Live, every query also takes two HTTP hops and the
    # front end's dispatch, so measured p50s run above predicted (1.07x to 2.2x in six runs on a shared 2-core host,
    # predicted 5-9 ms); below half the prediction the profile overstated the service time more than a core busy
    # with something else while profiling explains. The tail of an 8 s run rests on its three slowest queries, and a
    # half-core replica's CFS quota can hold one for half a period: its bound allows that.
    assert predicted["p50_ms"] / 2 <= measured["p50_ms"] <= 3 * predicted["p50_ms"] + 5, (measured, predicted)
    assert measured["p99_ms"] <= 3 * predicted["p99_ms"] + PERIOD_US / 2e3 + 10, (measured, predicted)

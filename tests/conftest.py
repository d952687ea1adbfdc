"""Shared fixtures: one small real tuning run that several tests inspect."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from autotune.config import TuneConfig
from autotune.pipeline import TuneOutcome, tune_model
from autotune.progress import SilentProgress

if TYPE_CHECKING:
    from docker import DockerClient

    from containers.backends.docker import DockerBackend

SMALL_TRIALS = 6


def small_config(out: Path, trials: int = SMALL_TRIALS) -> TuneConfig:
    """zoo:mlp at batch 1: three tasks, two trials each, short profile."""
    return TuneConfig(model="zoo:mlp", out_dir=out, trials=trials, batch_sizes=(1,), round_size=2,
                      trial_floor=2, profile_seconds=0.2)


def pre_tuned_context(mod: Any, target: Any, max_trials: int, per_round: int) -> tuple[Any, list[Any]]:
    """A kernel's tuning context, ``pre_tuning``'d with an evolutionary search as the session does, and its
    design spaces: what ``autotune.search.TaskSearch`` draws from. Call ``post_tuning`` on it when done."""
    from measure.tvm_import import import_meta_schedule

    ms = import_meta_schedule()
    ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply", search_strategy="evolutionary",
                         task_name="kernel", rand_state=0, num_threads=1)
    spaces = ctx.generate_design_space()
    ctx.pre_tuning(max_trials=max_trials, num_trials_per_iter=per_round, design_spaces=spaces,
                   database=ms.database.MemoryDatabase(), cost_model=ms.cost_model.RandomModel())
    return ctx, spaces


def schedule_hash(candidate: Any) -> int:
    """A measure candidate's structural hash: how a search tells schedules it has seen."""
    import tvm_ffi

    return tvm_ffi.structural_hash(candidate.sch.mod)


@pytest.fixture(scope="session")
def matmul_task() -> Iterator[tuple[Any, list[Any]]]:
    """A 512x512 matmul's tuning context on the host CPU, pre-tuned as the session does, and its design spaces."""
    import tvm

    from measure.kernels import kernel

    ctx, spaces = pre_tuned_context(kernel("matmul512"), tvm.target.Target({"kind": "llvm", "num-cores": 2}), 64, 8)
    yield ctx, spaces
    ctx.post_tuning()


@pytest.fixture(scope="session")
def tuned_run(tmp_path_factory: pytest.TempPathFactory) -> TuneOutcome:
    return tune_model(small_config(tmp_path_factory.mktemp("run") / "mlp"), SilentProgress())


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerClient]:
    """A Docker engine for the session: one already running (left running), else dockerd started here and stopped after.

    Skips, with the reason in one line, only where no engine runs and none can be started; fails
    instead where ``AUTOTUNE_REQUIRE_DOCKER`` is set (CI, whose Docker tests must not pass by skipping).
    Servers a killed session left stopped are removed first: tests count what is left after them.
    """
    from containers.backends.docker import DockerBackend
    from containers.backends.engine import ensure_engine
    from containers.errors import BackendUnavailable

    with ExitStack() as stack:
        try:
            client = stack.enter_context(ensure_engine(tmp_path_factory.mktemp("dockerd") / "dockerd.log"))
        except BackendUnavailable as err:
            if os.environ.get("AUTOTUNE_REQUIRE_DOCKER"):
                pytest.fail(f"AUTOTUNE_REQUIRE_DOCKER is set and no Docker engine is available: {err}", pytrace=False)
            pytest.skip(str(err))
        DockerBackend(client).prune()
        yield client


@pytest.fixture
def docker_backend(docker_engine: DockerClient) -> Iterator[DockerBackend]:
    """A Docker backend on the session's engine; the containers it started are stopped after the test."""
    from containers.backends.docker import DockerBackend

    backend = DockerBackend(docker_engine)
    yield backend
    backend.close()

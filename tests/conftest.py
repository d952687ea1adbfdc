"""Shared fixtures: one small real tuning run that several tests inspect."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.config import TuneConfig
from autotune.pipeline import TuneOutcome, tune_model
from autotune.progress import SilentProgress

SMALL_TRIALS = 6


def small_config(out: Path, trials: int = SMALL_TRIALS) -> TuneConfig:
    """zoo:mlp at batch 1: three tasks, two trials each, short profile."""
    return TuneConfig(model="zoo:mlp", out_dir=out, trials=trials, batch_sizes=(1,), round_size=2,
                      trial_floor=2, profile_seconds=0.2)


@pytest.fixture(scope="session")
def tuned_run(tmp_path_factory: pytest.TempPathFactory) -> TuneOutcome:
    return tune_model(small_config(tmp_path_factory.mktemp("run") / "mlp"), SilentProgress())

"""The settings of one tuning job, validated once, with errors that name the field."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from autotune.errors import UsageError
from autotune.policies import PolicySettings
from measure.engine import ENGINES

DEFAULT_TRIALS_PER_TASK = 32
DEFAULT_TRIAL_FLOOR = 8


@dataclass(frozen=True)
class TuneConfig:
    """What ``autotune tune`` was asked to do.

    ``trials`` None means ``DEFAULT_TRIALS_PER_TASK`` per task. ``batch_sizes`` None means
    the model's example batch B and 4B: each batch size becomes a library in the artifact.
    """

    model: str
    out_dir: Path
    target: str = "cpu"
    threads: int | None = None
    trials: int | None = None
    time_limit_s: float | None = None
    round_size: int | None = None  # None: a quarter of each task's budget, 8-32
    guided_search: bool = True  # MetaSchedule's search takes rounds once the model ranks well (autotune.search)
    batch_sizes: tuple[int, ...] | None = None
    input_shape: tuple[int, ...] | None = None
    engine: str = "parallel"
    devices: tuple[str, ...] | None = None
    dop: str = "auto"
    tolerance: float = 1e-3
    seed: int = 0
    trial_floor: int = DEFAULT_TRIAL_FLOOR
    profile_seconds: float = 1.0
    policies: PolicySettings = field(default_factory=PolicySettings)

    def __post_init__(self) -> None:
        _positive("trials", self.trials)
        _positive("time_limit_s", self.time_limit_s)
        _positive("round_size", self.round_size)
        _positive("trial_floor", self.trial_floor)
        _positive("profile_seconds", self.profile_seconds)
        if self.batch_sizes is not None:
            if not self.batch_sizes or any(b <= 0 for b in self.batch_sizes):
                raise UsageError(f"--batch-sizes must be positive integers; got {list(self.batch_sizes)}")
        if self.input_shape is not None and any(d <= 0 for d in self.input_shape):
            raise UsageError(f"--input-shape must be positive integers; got {list(self.input_shape)}")
        if self.engine not in ENGINES:
            raise UsageError(f"--engine must be one of {', '.join(ENGINES)}; got {self.engine!r}")
        if self.dop != "auto" and not (self.dop.isdigit() and int(self.dop) >= 0):
            raise UsageError(f"--dop must be auto or a level 0, 1, 2, ... (0 = one at a time, alone); got {self.dop!r}")
        if not 0 < self.tolerance < 1:
            raise UsageError(f"--tolerance must be between 0 and 1; got {self.tolerance}")
        if not 0 <= self.seed < 2**32:
            raise UsageError(f"--seed must be a whole number from 0 to {2**32 - 1}; got {self.seed}")
        _check_writable(self.out_dir)


def _positive(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise UsageError(f"{name.replace('_', '-')} must be a positive number; got {value}")


def _check_writable(out_dir: Path) -> None:
    """The output folder, or its nearest existing parent, must be a writable folder."""
    probe = Path(out_dir).resolve()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"output folder {out_dir} is not usable: {probe} is a file; expected a writable folder")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as err:
        raise UsageError(f"output folder {out_dir} is not writable ({probe}: {err.strerror}); expected a writable folder") from None

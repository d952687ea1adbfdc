"""The policies a tuning session is handed: latency model, candidate filter, preemption, energy ledger.

``PolicySettings`` is what the command line says (checked when the job is configured,
before anything loads); ``build_policies`` turns it into the objects, starting the
latency model warm from earlier runs when asked, and naming the earlier databases whose
best schedules seed the tasks' first rounds. A saved model or database that cannot be
used is refused with its reason, and tuning goes on with the rest (a run folder's database
where its saved model is refused), or with a fresh model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import UsageError
from cost_models.candidate_filter import CandidateFilter, MeasureAll, TrimmerFilter
from cost_models.energy import DEFAULT_WATTS_PER_CORE, EnergyLedger, cpu_meter, gpu_meter
from cost_models.preemption import NeverPreempt, PlateauPreemption, Preemption

COST_MODEL_DIR = "cost_model"


@dataclass(frozen=True)
class PolicySettings:
    """Filter, preemption and billing settings; every threshold is a ``tune`` flag, defaulting to the policy's own."""

    filter: bool = True
    filter_threshold: float = TrimmerFilter.threshold
    filter_keep: float = TrimmerFilter.keep_share
    filter_explore: float = TrimmerFilter.explore_share
    filter_min_tau: float = TrimmerFilter.min_tau
    filter_trust_rounds: int = TrimmerFilter.trust_rounds
    filter_guided_pool: float = TrimmerFilter.guided_pool
    filter_guided_generations: int = TrimmerFilter.guided_generations
    filter_guided_population: int = TrimmerFilter.guided_population
    preemption: bool = True
    task_patience: int = PlateauPreemption.task_patience
    min_task_trials: int = PlateauPreemption.min_task_trials
    model_window: int = PlateauPreemption.model_window
    min_improvement: float = PlateauPreemption.min_improvement
    patience_share: float = PlateauPreemption.patience_share
    solo_patience_share: float = PlateauPreemption.solo_patience_share
    patience_counts: str = PlateauPreemption.counts
    watts_per_core: float = DEFAULT_WATTS_PER_CORE
    price_per_hour: float | None = None
    warm_start: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        try:
            self.candidate_filter(0)
            self.preemption_policy()
            EnergyLedger(watts_per_core=self.watts_per_core, price_per_device_hour=self.price_per_hour)
        except ValueError as err:
            raise UsageError(str(err)) from None
        for path in self.warm_start:
            if not Path(path).exists():
                raise UsageError(f"--warm-start {path} does not exist; expected a saved latency model, a tuning "
                                 "database folder, a run folder or an artifact")

    def candidate_filter(self, seed: int) -> CandidateFilter:
        if not self.filter:
            return MeasureAll()
        return TrimmerFilter(self.filter_threshold, self.filter_keep, self.filter_explore, self.filter_min_tau,
                             self.filter_trust_rounds, seed, self.filter_guided_pool, self.filter_guided_generations,
                             self.filter_guided_population)

    def preemption_policy(self) -> Preemption:
        if not self.preemption:
            return NeverPreempt()
        return PlateauPreemption(self.task_patience, self.min_task_trials, self.model_window, self.min_improvement,
                                 self.patience_share, self.solo_patience_share, self.patience_counts)


@dataclass
class Policies:
    """The objects a session runs with."""

    latency_model: Any
    candidate_filter: CandidateFilter
    preemption: Preemption
    energy: EnergyLedger
    warm_databases: tuple[Any, ...] = ()  # earlier jobs' databases (read), whose best schedules seed each task

    @classmethod
    def off(cls, num_cores: int, seed: int = 0) -> Policies:
        """A fresh latency model, no filter, no preemption, an estimated bill: the engine alone."""
        from cost_models.latency_model import create_latency_model

        return cls(create_latency_model(num_cores, seed), MeasureAll(), NeverPreempt(), EnergyLedger())


def build_policies(settings: PolicySettings, target: Any, num_cores: int, seed: int, gpu_indices: Sequence[int],
                   warn: Callable[[str], None]) -> Policies:
    """The session's policies from ``settings``; ``warn`` hears about refused warm starts."""
    return Policies(
        latency_model=start_latency_model(settings.warm_start, target, num_cores, seed, warn),
        candidate_filter=settings.candidate_filter(seed),
        preemption=settings.preemption_policy(),
        energy=EnergyLedger(cpu_meter(), gpu_meter(gpu_indices), settings.watts_per_core, settings.price_per_hour),
        warm_databases=earlier_databases(settings.warm_start, warn),
    )


def earlier_databases(sources: Sequence[str], warn: Callable[[str], None]) -> tuple[Any, ...]:
    """The tuning databases ``sources`` hold, read: their best schedules seed the tasks' first rounds."""
    from cost_models.latency_model import CostModelRefused, open_database

    found = []
    for source in sources:
        _, folder = _find(Path(source))
        if folder:
            try:
                found.append(open_database(folder))
            except CostModelRefused as err:
                warn(f"earlier schedules not used: {err}")
    return tuple(found)


def start_latency_model(sources: Sequence[str], target: Any, num_cores: int, seed: int,
                        warn: Callable[[str], None]) -> Any:
    """A latency model started from ``sources`` (saved models, tuning databases, run folders, artifacts),
    or a fresh one.

    Saved models come first, in whatever order ``sources`` names them: the first that loads is
    taken as it is, and any other is skipped with a warning. Then every tuning database that is
    not beside the model taken (none was saved with it, or it was refused or skipped) is learned
    from on top (a run folder's saved model has learned its own database already).
    """
    from cost_models.latency_model import (CostModelRefused, create_latency_model, load_latency_model,
                                           warm_start_from_databases)

    found = [(source, *_find(Path(source))) for source in sources]
    model, taken, refused = None, None, {}
    for _, saved, _ in found:
        if saved is not None and model is None:
            try:
                model, taken = load_latency_model(saved, target, num_cores, seed), saved
            except CostModelRefused as err:
                refused[saved] = err
    learner = model or create_latency_model(num_cores, seed)
    for source, saved, database in found:
        so_far = ("tuning starts from a fresh latency model" if model is None
                  else "going on with what was already loaded")
        beside = "learning from the tuning database beside it instead" if database else so_far
        if saved in refused:
            warn(f"warm start refused: {refused[saved]}; {beside}")
        elif saved is not None and saved != taken:
            warn(f"warm start: saved latency model {saved} skipped, only the first that loads is used ({taken}); "
                 f"{beside}")
        elif saved is None and database is None:
            warn(f"warm start refused: {source} holds no saved latency model ({COST_MODEL_DIR}/meta.json) and no "
                 f"tuning database; {so_far}")
        if database is not None and (saved is None or saved != taken):
            try:
                warm_start_from_databases(learner, [database], target, num_cores)
                model = learner
            except CostModelRefused as err:
                warn(f"warm start refused: {err}; {so_far}")
    return learner


def _find(path: Path) -> tuple[Path | None, Path | None]:
    """The saved latency model and the tuning database a warm-start path holds (None where it holds none).

    A model folder holds only the model; a database folder, a run folder (``tuning/`` or
    ``--out``) or an artifact holds the database, and the model trained on it if one was saved.
    """
    if (path / "meta.json").exists():
        return path, None
    model = next((p for p in (path / COST_MODEL_DIR, path / "tuning" / COST_MODEL_DIR) if (p / "meta.json").exists()),
                 None)
    database = next((p for p in (path, path / "database", path / "tuning")
                     if (p / "database_tuning_record.json").exists()), None)
    return model, database

"""Preemption: stop tuning what has stopped paying (Trimmer).

A task whose best has not improved (by more than ``min_improvement``) for more than
``task_patience`` rounds in a row stops, once it has had ``min_task_trials``
proposals; a round of random draws does not count (random proposals that fail to improve
say nothing about the directed rounds to come); the session gives its unused trials to the
tasks still improving. The
whole job stops when the model's estimated latency (the sum of weight x task best),
averaged over a moving window of ``model_window`` rounds, has not improved for more
than ``model_patience`` windows in a row.
"""

from __future__ import annotations

import math
import statistics
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TaskRound:
    """What one round did for one task."""

    task: str
    best_before_s: float
    best_after_s: float
    proposed: int  # proposals so far, measured or dropped
    directed: bool = True  # proposed from what was measured (evolved or model-guided), not drawn at random


@dataclass(frozen=True)
class Decision:
    """Tasks to stop (name -> why) and whether, and why, to stop the whole job."""

    stop_tasks: dict[str, str]
    stop_job: str = ""


class Preemption(ABC):
    """Decides after each round which tasks, or whether the whole job, should stop."""

    name = "preemption"

    @abstractmethod
    def after_round(self, rounds: Sequence[TaskRound], model_latency_s: float) -> Decision:
        """``model_latency_s``: the estimated model latency after the round (inf while a task has no best)."""

    def report(self) -> dict[str, Any]:
        return {"preemption": self.name}


class NeverPreempt(Preemption):
    """Every task uses its whole budget."""

    name = "off"

    def after_round(self, rounds: Sequence[TaskRound], model_latency_s: float) -> Decision:
        return Decision({})


@dataclass
class PlateauPreemption(Preemption):
    task_patience: int = 2
    min_task_trials: int = 32
    model_window: int = 2
    model_patience: int = 2
    min_improvement: float = 0.01
    name: str = field(default="plateau", init=False)
    _plateau: dict[str, int] = field(default_factory=dict, init=False)
    _history: list[float] = field(default_factory=list, init=False)
    _model_plateau: int = field(default=0, init=False)
    stopped: dict[str, str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        for flag, value, low in (("--task-patience", self.task_patience, 0), ("--min-task-trials", self.min_task_trials, 0),
                                 ("--model-window", self.model_window, 1), ("--model-patience", self.model_patience, 0)):
            if value < low:
                raise ValueError(f"{flag} must be an integer of at least {low}; got {value}")
        if not 0 <= self.min_improvement < 1:
            raise ValueError(f"--min-improvement must be between 0 and 1; got {self.min_improvement}")

    def after_round(self, rounds: Sequence[TaskRound], model_latency_s: float) -> Decision:
        stop = {}
        for r in rounds:
            improved = r.best_after_s < r.best_before_s * (1 - self.min_improvement)
            if improved:
                self._plateau[r.task] = 0
            elif r.directed:
                self._plateau[r.task] = self._plateau.get(r.task, 0) + 1
            if self._plateau.get(r.task, 0) > self.task_patience and r.proposed >= self.min_task_trials:
                stop[r.task] = self.stopped[r.task] = f"no gain in {self._plateau[r.task]} rounds in a row"
        if math.isfinite(model_latency_s):
            self._history.append(model_latency_s)
        w = self.model_window
        if len(self._history) >= 2 * w:
            before, now = statistics.fmean(self._history[-2 * w:-w]), statistics.fmean(self._history[-w:])
            self._model_plateau = 0 if now < before * (1 - self.min_improvement) else self._model_plateau + 1
        if self._model_plateau > self.model_patience:
            return Decision(stop, f"estimated model latency flat for {self._model_plateau} windows of {w} rounds")
        return Decision(stop)

    def report(self) -> dict[str, Any]:
        return {"preemption": self.name, "stopped_tasks": dict(self.stopped), "model_latency_history_s": self._history}

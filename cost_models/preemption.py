"""Preemption: stop tuning what has stopped paying (Trimmer).

A task whose best has not improved (by more than ``min_improvement``) over its last
``task_patience`` proposals, or ``patience_share`` of its budget where that is more, stops,
once it has had ``min_task_trials`` proposals;
proposals drawn at random do not count (random draws that fail to improve say nothing
about the directed rounds to come). The session gives its unused trials to the tasks
still improving. The whole job stops when the model's estimated latency (the sum of
weight x task best) has not improved over the last ``model_window`` proposals per live task
(or ``patience_share`` of the live tasks' mean budget, where that is more).

The job's gain is counted on the part of the estimate the job can still move, the live
tasks' weight x best, chained round by round (a task that stops leaves the sum without
counting as a gain). Against the whole estimate, ``min_improvement`` would ask more of
the job than of any task: once the tasks still searching make up a third of the model,
they would have to gain 3% between them, where each is allowed 1%, and the job would stop
while its tasks were still improving (ResNet-18 at 2880 trials did, with three live
convolutions gaining 4% over its last 400 s).

Both rules count proposals, not rounds, by default. Trimmer counts flat batches of its tuner's
measurements (more than two); our rounds are an engine setting (8 to 32 a task), and a
rule in rounds would stop a task after 24 flat proposals at one round size and 96 at
another. The defaults come from the gaps between the gains of our kernel
searches at 320 trials (README, Preemption).

Patience grows with the budget because a search's gains thin out as it goes: the gaps
between them grow, so a fixed patience that fits 320 trials stops a 1000-trial search at
its first long gap. matmul512 at 1000 trials gained 3.5% after 221 flat measurements in
one engine run, and 96 flat proposals stopped its trimmer run 14% short (README,
Preemption). A quarter of the budget keeps that gain and stops both 1000-trial engine
logs at 42-56% of their measurements; at 320 trials or fewer a task's patience stays 96.

``counts="measurements"`` counts only what was measured: a proposal the candidate filter
dropped unbuilt taught the search nothing, so a filtered search waits as long, in what it
learns from, as an unfiltered one. Counted in proposals, the matmul's trimmer runs at 1000
trials stopped after 271-501 measurements, where the engine's own search still gained about
1% (README, Preemption); counted in measurements, a job stops later and saves less.

A job of one task waits longer: ``solo_patience_share`` (40%) of its budget. Its task's stop
is the job's, and no trials are handed over, so all a stop buys is energy, paid for in
latency. In the engine's own logs of single kernels at 1000 trials (conv3x3 on seven seeds,
matmul512 on three), the longest stretch between gains exceeded a quarter of the run in 5
of the 10 and 40% in 3 (README, Preemption).

The budget is the one the task was planned with: trials handed over by stopped tasks let a
task search longer, not wait longer on a plateau. Counted on the budget as it grows, each
stop lengthened the patience of the tasks left, and the job window with it: ResNet-18 at
2880 trials waited 310 flat proposals a live task before the job stopped, and saved 42% of
device-seconds and 35% of energy (README, Preemption).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


COUNTS = ("proposals", "measurements")  # what preemption's patience can count


@dataclass(frozen=True)
class TaskRound:
    """What one round did for one task."""

    task: str
    best_before_s: float
    best_after_s: float
    proposed: int  # proposals so far, measured or dropped
    directed: bool = True  # proposed from what was measured (evolved or model-guided), not drawn at random
    weight: float = 1.0  # the task's calls per model run: its best counts this many times in the estimate
    budget: int = 0  # the task's planned trial budget (not counting trials handed over from stopped tasks)
    measured: int | None = None  # of the proposals, those measured (None: all of them)
    budget_left: bool = True  # trials left after the round (hand-overs included); a task without any has ended


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

    def state(self) -> dict[str, Any]:
        """What a resumed job needs to go on counting where this one stopped (JSON-safe)."""
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        """Take back ``state`` from the earlier run of the same job.

        Raises:
            ValueError, KeyError, TypeError: ``state`` is not what ``state`` gives.
        """


class NeverPreempt(Preemption):
    """Every task uses its whole budget."""

    name = "off"

    def after_round(self, rounds: Sequence[TaskRound], model_latency_s: float) -> Decision:
        return Decision({})


@dataclass
class PlateauPreemption(Preemption):
    task_patience: int = 96
    min_task_trials: int = 32
    model_window: int = 128
    min_improvement: float = 0.01
    patience_share: float = 0.25
    solo_patience_share: float = 0.4
    counts: str = "proposals"  # what patience and the window count: "proposals" or "measurements"
    name: str = field(default="plateau", init=False)
    _task_flat: dict[str, _Plateau] = field(default_factory=dict, init=False)
    _model_flat: _Plateau = field(init=False)
    _counted: dict[str, int] = field(default_factory=dict, init=False)
    _history: list[float] = field(default_factory=list, init=False)
    _live_index: float = field(default=1.0, init=False)  # the live part of the estimate, chained over rounds
    stopped: dict[str, str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        for flag, value, low in (("--task-patience", self.task_patience, 1), ("--min-task-trials", self.min_task_trials, 0),
                                 ("--model-window", self.model_window, 1)):
            if value < low:
                raise ValueError(f"{flag} must be an integer of at least {low}; got {value}")
        for flag, share in (("--min-improvement", self.min_improvement), ("--patience-share", self.patience_share),
                            ("--solo-patience-share", self.solo_patience_share)):
            if not 0 <= share < 1:
                raise ValueError(f"{flag} must be between 0 and 1; got {share}")
        if self.counts not in COUNTS:
            raise ValueError(f"--patience-counts must be one of {', '.join(COUNTS)}; got {self.counts!r}")
        self._model_flat = _Plateau(self.min_improvement)

    def after_round(self, rounds: Sequence[TaskRound], model_latency_s: float) -> Decision:
        stop = {}
        new = 0
        for r in rounds:
            counted = r.measured if self.counts == "measurements" and r.measured is not None else r.proposed
            fresh, self._counted[r.task] = counted - self._counted.get(r.task, 0), counted
            new += fresh
            flat = self._task_flat.setdefault(r.task, _Plateau(self.min_improvement))
            flat.advance(r.best_after_s, fresh if r.directed else 0)
            if (r.budget_left and flat.since_gain >= self._patience(self.task_patience, r.budget)
                    and r.proposed >= self.min_task_trials):
                stop[r.task] = self.stopped[r.task] = f"no gain in its last {flat.since_gain} {self.counts}"
        if math.isfinite(model_latency_s):
            self._history.append(model_latency_s)
            live_before = sum(r.weight * r.best_before_s for r in rounds)
            if 0 < live_before < math.inf:
                self._live_index *= sum(r.weight * r.best_after_s for r in rounds) / live_before
            self._model_flat.advance(self._live_index, new / max(len(rounds), 1))
            mean_budget = sum(r.budget for r in rounds) / max(len(rounds), 1)
            if self._model_flat.since_gain >= self._patience(self.model_window, mean_budget):
                return Decision(stop, f"estimated model latency flat over the last {self._model_flat.since_gain:.0f} "
                                      f"{self.counts} per live task")
        return Decision(stop)

    def _patience(self, floor: int, budget: float) -> float:
        return max(floor, self._share(len(self._counted)) * budget)

    def _share(self, tasks: int) -> float:
        """Every task of a job is in its first round, so a job of one task is known from then on."""
        return self.solo_patience_share if tasks == 1 else self.patience_share

    def report(self) -> dict[str, Any]:
        return {"preemption": self.name, "rule": self.rule, "stopped_tasks": dict(self.stopped),
                "model_latency_history_s": self._history}

    def state(self) -> dict[str, Any]:
        """Each task's and the job's counts since their last gain: without them a resumed job waits its whole
        patience again, and a job killed more often than that would never stop a task."""
        return {"counts": self.counts, "counted": dict(self._counted), "live_index": self._live_index,
                "stopped": dict(self.stopped),
                "tasks": {task: [p.reference, p.since_gain] for task, p in self._task_flat.items()},
                "model": [self._model_flat.reference, self._model_flat.since_gain]}

    def restore(self, state: dict[str, Any]) -> None:
        if state["counts"] != self.counts:
            raise ValueError(f"the earlier run counted {state['counts']}, this one counts {self.counts}")
        tasks = {str(task): _Plateau(self.min_improvement, float(ref), _count(since))
                 for task, (ref, since) in state["tasks"].items()}
        model = _Plateau(self.min_improvement, float(state["model"][0]), _count(state["model"][1]))
        counted = {str(task): int(n) for task, n in state["counted"].items()}
        live_index, stopped = float(state["live_index"]), {str(k): str(v) for k, v in state["stopped"].items()}
        self._task_flat, self._model_flat, self._counted = tasks, model, counted
        self._live_index, self.stopped = live_index, stopped

    @property
    def rule(self) -> str:
        """The rule as this job applies it (before its first round, as a job of several tasks would)."""
        return self.rule_for(len(self._counted))

    def rule_for(self, tasks: int) -> str:
        """The rule as a job of ``tasks`` tasks applies it."""
        unit = self.counts
        rule = (f"task patience {self.task_patience} {unit} (after {self.min_task_trials}), model window "
                f"{self.model_window} {unit} a task on the live tasks' part, gain > {self.min_improvement:.0%}")
        share = self._share(tasks)
        return rule + (f", both at least {share:.0%} of the planned budget" if share else "") + (
            " (a job of one task)" if tasks == 1 and share != self.patience_share else "")


def _count(value: Any) -> float:
    """A saved count, as it was saved (a task's proposals stay whole numbers in its stop reason)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"a count must be a number of at least 0; got {value!r}")
    return value


@dataclass
class _Plateau:
    """Proposals (or measurements) since a value last fell by more than ``min_improvement`` below where it last fell."""

    min_improvement: float
    reference: float = math.inf
    since_gain: float = 0

    def advance(self, value: float, counted: float) -> None:
        if value < self.reference * (1 - self.min_improvement):  # the first finite value is a gain
            self.reference, self.since_gain = value, 0
        else:
            self.since_gain += counted

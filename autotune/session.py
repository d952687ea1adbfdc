"""The tuning session: MetaSchedule's evolutionary search, our budget and our measurement engine.

The session owns the tuning loop instead of MetaSchedule's task scheduler so that it
can (1) give every task its own trial budget, (2) stop on a wall-clock limit,
(3) resume from the database of an earlier run without re-measuring a candidate it
already holds, and (4) hand a whole round, from all tasks, to the measurement engine
at once. Records go to a ``JSONDatabase`` as they are measured, so a killed job loses
nothing it finished. At the end, each task's top candidates are timed again in
isolation and a ranked copy of the database (``ranked/``) carries those values: that
is the database compilation and the artifact use.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from autotune.budget import share_out
from autotune.tasks import Task
from measure.engine import Candidate, Measurement, MeasurementEngine

MEASUREMENTS_LOG = "measurements.jsonl"
RANKED_DIR = "ranked"
RANKING = "ranking.json"


@dataclass
class TaskState:
    """Progress of one task: its budget, trials measured so far (earlier runs included) and best."""

    task: Task
    budget: int
    trials: int = 0
    resumed: int = 0
    errors: int = 0
    best_s: float = math.inf
    wall_s: float = 0.0
    finished: bool = False

    @property
    def remaining(self) -> int:
        return max(self.budget - self.trials, 0)


class SessionObserver(Protocol):
    """Receives progress; the CLI shows it, tests and benchmarks may record it."""

    def on_tuning_start(self, states: Sequence[TaskState], warning: str | None) -> None: ...

    def on_round_end(self, states: Sequence[TaskState], elapsed_s: float) -> None: ...

    def on_phase(self, phase: str) -> None: ...


@dataclass
class TuningSession:
    """Tunes ``states``' tasks into the JSON database under ``work_dir``."""

    states: list[TaskState]
    target: Any
    device_type: str
    engine: MeasurementEngine
    cost_model: Any
    work_dir: str
    round_size: int = 32
    rerank_share: float = 0.05  # the top 5% of each task's candidates (at least 2, at most 5) are re-timed alone
    time_limit_s: float | None = None
    num_threads: int = 1
    seed: int = 0
    observer: SessionObserver | None = None
    warning: str | None = None
    ranking: dict[str, Any] = field(default_factory=dict, init=False)
    engine_report: dict[str, Any] = field(default_factory=dict, init=False)
    _known: dict[str, dict[int, Measurement]] = field(default_factory=dict, init=False)

    def run(self) -> Any:
        """Tune until every task has used its budget, its search ends, or time runs out; then rank.

        Returns the ranked database.
        """
        from tvm.s_tir.meta_schedule.database import JSONDatabase

        started = time.monotonic()
        os.makedirs(self.work_dir, exist_ok=True)
        database = JSONDatabase(work_dir=self.work_dir)
        self._load_known(database)
        if self.observer:
            self.observer.on_tuning_start(self.states, self.warning)
        contexts = {s.task.name: self._start_task(s, database) for s in self.states if s.remaining > 0}
        with open(os.path.join(self.work_dir, MEASUREMENTS_LOG), "a", encoding="utf-8") as log:
            while contexts and not self._out_of_time(started):
                self._round(contexts, database, log, started)
                if self.observer:
                    self.observer.on_round_end(self.states, time.monotonic() - started)
        for ctx in contexts.values():
            ctx.post_tuning()
        if self.observer:
            self.observer.on_phase("re-timing the best candidates in isolation")
        ranked = self._rank(database)
        self.engine_report = self.engine.report()
        return ranked

    def _out_of_time(self, started: float) -> bool:
        return self.time_limit_s is not None and time.monotonic() - started >= self.time_limit_s

    def _start_task(self, state: TaskState, database: Any) -> Any:
        from tvm.s_tir.meta_schedule import TuneContext

        ctx = TuneContext(
            mod=state.task.mod,
            target=self.target,
            space_generator="post-order-apply",
            search_strategy="evolutionary",
            task_name=state.task.name,
            rand_state=self.seed + self.states.index(state),
            num_threads=self.num_threads,
        )
        ctx.pre_tuning(
            # The session enforces each task's budget; the search's own cap only has to stay out of the way,
            # so that trials handed over from tasks that finish early can be used.
            max_trials=sum(s.budget for s in self.states),
            num_trials_per_iter=self.round_size,
            design_spaces=ctx.generate_design_space(),
            database=database,
            cost_model=self.cost_model,
        )
        return ctx

    def _round(self, contexts: dict[str, Any], database: Any, log: Any, started: float) -> None:
        """Ask every live task for candidates, measure the new ones in one engine call, report back."""
        import tvm_ffi

        proposals: list[tuple[TaskState, Any, list[Any], list[int]]] = []
        fresh: list[Candidate] = []
        for state in self.states:
            ctx = contexts.get(state.task.name)
            if ctx is None:
                continue
            t0 = time.monotonic()
            candidates = list(ctx.generate_measure_candidates() or [])[: state.remaining]
            state.wall_s += time.monotonic() - t0
            if not candidates:
                self._finish(state, contexts)
                continue
            hashes = [tvm_ffi.structural_hash(c.sch.mod) for c in candidates]
            known = self._known.setdefault(state.task.name, {})
            for c, h in zip(candidates, hashes):
                if h not in known:
                    fresh.append(Candidate(c.sch.mod, c.args_info, state.task.name))
            proposals.append((state, ctx, candidates, hashes))
        t0 = time.monotonic()
        measured = iter(self.engine.measure(self.target, self.device_type, fresh) if fresh else [])
        engine_s = time.monotonic() - t0
        for state, ctx, candidates, hashes in proposals:
            state.wall_s += engine_s * len(candidates) / max(len(fresh), 1)
            results = self._collect(state, ctx, candidates, hashes, measured, database, log, started)
            self.cost_model.update(ctx, candidates, results)
            ctx.notify_runner_results(candidates, results)
            if state.remaining == 0:
                self._finish(state, contexts)

    def _finish(self, state: TaskState, contexts: dict[str, Any]) -> None:
        """End a task; trials its search could not use go to the tasks still searching, by work share."""
        state.finished = True
        contexts.pop(state.task.name).post_tuning()
        leftover, state.budget = state.remaining, state.trials
        live = [s for s in self.states if s.task.name in contexts]
        if leftover and live:
            for s, extra in zip(live, share_out(leftover, [s.task.share for s in live])):
                s.budget += extra

    def _collect(self, state: TaskState, ctx: Any, candidates: list[Any], hashes: list[int],
                 measured: Any, database: Any, log: Any, started: float) -> list[Any]:
        """Runner results for ``candidates``: fresh ones are committed and logged, known ones reused."""
        from tvm.s_tir.meta_schedule.database import TuningRecord
        from tvm.s_tir.meta_schedule.runner import RunnerResult

        known = self._known[state.task.name]
        workload = database.commit_workload(state.task.mod)
        results = []
        for candidate, h in zip(candidates, hashes):
            if h in known:
                m = known[h]
            else:
                m = known[h] = next(measured)
                secs = [m.latency] if m.ok else None
                database.commit_tuning_record(
                    TuningRecord(candidate.sch.trace, workload, secs, self.target, candidate.args_info)
                )
                state.trials += 1
                state.errors += 0 if m.ok else 1
                state.best_s = min(state.best_s, m.latency)
                log.write(json.dumps({
                    "task": state.task.name, "trial": state.trials, "latency_s": None if not m.ok else m.latency,
                    "error": m.error, "elapsed_s": round(time.monotonic() - started, 3),
                    "at": round(m.at or time.time(), 3),
                }) + "\n")
            results.append(RunnerResult([m.latency], None) if m.ok else RunnerResult(None, m.error))
        log.flush()
        return results

    def _records_by_task(self, database: Any) -> dict[str, list[Any]]:
        """The database's tuning records, grouped by the task whose workload they tune."""
        import tvm_ffi

        by_workload: dict[int, list[Any]] = {}
        for record in database.get_all_tuning_records():
            by_workload.setdefault(tvm_ffi.structural_hash(record.workload.mod), []).append(record)
        return {
            state.task.name: [r for r in by_workload.get(tvm_ffi.structural_hash(state.task.mod), [])
                              if tvm_ffi.structural_equal(r.workload.mod, state.task.mod)]
            for state in self.states
        }

    def _load_known(self, database: Any) -> None:
        """Index the database's records by task and candidate hash, so a resumed run re-measures nothing."""
        import tvm_ffi
        from tvm.s_tir import Schedule

        for name, records in self._records_by_task(database).items():
            state = next(s for s in self.states if s.task.name == name)
            known = self._known.setdefault(name, {})
            for record in records:
                sch = Schedule(record.workload.mod)
                record.trace.apply_to_schedule(sch, remove_postproc=False)
                secs = tuple(float(s) for s in record.run_secs) if record.run_secs else None
                m = Measurement(run_secs=secs, error=None if secs else "failed in an earlier run")
                known[tvm_ffi.structural_hash(sch.mod)] = m
                state.best_s = min(state.best_s, m.latency)
            state.trials = state.resumed = len(known)

    def _rank(self, database: Any) -> Any:
        """Re-time each task's best candidates alone and write ``ranked/``: all records, re-timed values in place.

        If a candidate that was not re-timed would still come first, the next ones are re-timed too.
        """
        import shutil

        from tvm.s_tir import Schedule
        from tvm.s_tir.meta_schedule.database import JSONDatabase, TuningRecord

        final = os.path.join(self.work_dir, RANKED_DIR)
        staging = final + ".partial"
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
        ranked = JSONDatabase(work_dir=staging)
        by_task = self._records_by_task(database)
        for state in self.states:
            records = by_task[state.task.name]
            value = {i: _mean(r.run_secs) for i, r in enumerate(records)}
            parallel = dict(value)
            retimed: set[int] = set()
            k = min(5, max(2, math.ceil(self.rerank_share * len(records))))
            for _ in range(3):
                order = sorted((i for i in value if value[i] < math.inf), key=value.__getitem__)
                todo = [i for i in order[:len(retimed) + k] if i not in retimed]
                if not todo or (order and order[0] in retimed):
                    break
                batch = []
                for i in todo:
                    sch = Schedule(records[i].workload.mod)
                    records[i].trace.apply_to_schedule(sch, remove_postproc=False)
                    batch.append(Candidate(sch.mod, records[i].args_info, state.task.name))
                for i, m in zip(todo, self.engine.measure_isolated(self.target, self.device_type, batch)):
                    value[i] = m.latency
                    retimed.add(i)
            ranked_workload = ranked.commit_workload(state.task.mod)
            for i, r in enumerate(records):
                secs = [value[i]] if value[i] < math.inf else None
                ranked.commit_tuning_record(TuningRecord(r.trace, ranked_workload, secs, self.target, r.args_info))
            best = min(value, key=value.__getitem__, default=None)
            before = min(parallel, key=parallel.__getitem__, default=None)
            if best is not None and value[best] < math.inf:
                state.best_s = value[best]
            self.ranking[state.task.name] = {
                "retimed": [{"tuning_s": parallel[i], "isolated_s": value[i]} for i in sorted(retimed, key=value.__getitem__)],
                "winner_changed": best != before,
            }
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
        with open(os.path.join(self.work_dir, RANKING), "w", encoding="utf-8") as f:
            json.dump(self.ranking, f, indent=2)
        return JSONDatabase(work_dir=final)


def _mean(secs: Any) -> float:
    values = [float(s) for s in secs or []]
    return sum(values) / len(values) if values else math.inf

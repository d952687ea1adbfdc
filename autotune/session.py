"""The tuning session: search rounds (``autotune.search``), our budget and our measurement engine.

The session owns the tuning loop instead of MetaSchedule's task scheduler so that it
can (1) give every task its own trial budget, (2) stop on a wall-clock limit,
(3) resume from the database of an earlier run without re-measuring a candidate it
already holds, and with the budgets, stops and screened proposals that run saved beside
it, (4) hand a whole round, from all tasks, to the measurement engine at once, and
(5) apply the policies it is given: a candidate filter before anything is built,
preemption after each round, and an energy ledger that bills the job. Records go to a
``JSONDatabase`` as each round's measurements come back, so a killed job loses at most the round
it was measuring (a last line the kill tore is mended before the next run opens it). At the
end, each task's top candidates are timed again in isolation and a ranked copy of the
database (``ranked/``) carries those values: that is the database compilation and the
artifact use.
"""

from __future__ import annotations

import json
import math
import os
import resource
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from autotune.budget import round_size_for, share_out
from autotune.search import DIRECTED, PARENTS, Proposal, TaskSearch, trusts_model
from autotune.tasks import Task
from cost_models.candidate_filter import POPULATION, CandidateFilter, MeasureAll, Selection
from cost_models.energy import EnergyLedger
from cost_models.latency_model import features_reused, for_target, is_trained, learn_records, score
from cost_models.preemption import NeverPreempt, Preemption, TaskRound
from cost_models.quality import RankQuality
from measure.engine import Candidate, Measurement, MeasurementEngine, PhaseWork
from results.atomic import staged_folder, write_atomically

MEASUREMENTS_LOG = "measurements.jsonl"
DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")  # what JSONDatabase(work_dir=) appends to
PROGRESS = "progress.json"  # what a resumed run cannot read back from the database (``TuningSession._save_progress``)
PROGRESS_SCHEMA = 1
RANKED_DIR = "ranked"
RANKING = "ranking.json"
RANK_TURNS = 3  # the final re-timing goes over a task's top candidates this many times; each keeps its median


@dataclass
class TaskState:
    """Progress of one task: its budget, trials measured so far (earlier runs included) and best.

    A proposal the candidate filter drops (``screened``) uses a trial of the budget without
    being built or measured.
    """

    task: Task
    budget: int
    round_size: int = 0  # candidates per round, set when the session starts the task
    trials: int = 0
    screened: int = 0
    resumed: int = 0
    errors: int = 0
    best_s: float = math.inf
    wall_s: float = 0.0
    finished: bool = False
    stopped: str = ""  # why the task ended before its budget ("" if it did not)
    planned: int = field(init=False)  # the budget it started with (``budget`` grows with trials handed over)

    def __post_init__(self) -> None:
        self.planned = self.budget

    @property
    def proposed(self) -> int:
        return self.trials + self.screened

    @property
    def remaining(self) -> int:
        return max(self.budget - self.proposed, 0)


@dataclass
class _Plan:
    """One task's part of a round: the proposals to measure, their predicted scores, which were explored."""

    state: TaskState
    search: TaskSearch
    candidates: list[Any]
    hashes: list[int]
    proposal_scores: list[float]  # of every proposal, measured or not
    selection: Selection
    trained: bool  # the proposals were scored by the model
    kind: str  # how they were proposed (see autotune.search)
    proposal_origins: list[str]  # where each proposal came from (``Proposal.origins``)

    @property
    def scores(self) -> list[float]:
        """Scores of the measured candidates, in their order."""
        return [self.proposal_scores[i] for i in self.selection.measure]

    def measured(self) -> Iterator[tuple[float, str, bool]]:
        """Per measured candidate, in order: its score, its origin, and whether it is the filter's random
        sample of what it would drop."""
        sample = set(self.selection.explore)
        return ((self.proposal_scores[i], self.proposal_origins[i], i in sample) for i in self.selection.measure)


class SessionObserver(Protocol):
    """Receives progress; the CLI shows it, tests and benchmarks may record it."""

    def on_tuning_start(self, states: Sequence[TaskState], warning: str | None) -> None: ...

    def on_round_end(self, states: Sequence[TaskState], elapsed_s: float, model: dict[str, Any]) -> None:
        """``model``: the latency model's recent rank correlation ("tau") and whether the filter filters."""

    def on_phase(self, phase: str) -> None: ...


def evolutionary_search(round_size: int, generations: int, population: int = POPULATION) -> Any:
    """MetaSchedule's evolutionary search with a population of ``population`` schedules per candidate wanted
    (at least 16 wanted, at most 512 schedules), evolved for ``generations`` (both the candidate filter's).

    MetaSchedule keeps 512 whatever the round. On 2 cores a round of a ResNet-18 convolution then
    spends 10-12 s sampling and mutating schedules (6.5 s at 256), as long as building and timing
    the round. It only runs once the latency model is trusted (``autotune.search``).
    """
    from tvm.s_tir.meta_schedule.search_strategy import EvolutionarySearch

    return EvolutionarySearch(population_size=min(512, population * max(16, round_size)),
                              genetic_num_iters=generations)


@dataclass
class TuningSession:
    """Tunes ``states``' tasks into the JSON database under ``work_dir``."""

    states: list[TaskState]
    target: Any
    device_type: str
    engine: MeasurementEngine
    cost_model: Any
    work_dir: str
    round_size: int | None = None  # None: ``round_size_for`` each task's budget
    rerank_share: float = 0.05  # the top 5% of each task's candidates (at least 2, at most 5) are re-timed alone
    time_limit_s: float | None = None
    num_threads: int = 1
    seed: int = 0
    observer: SessionObserver | None = None
    warning: str | None = None
    candidate_filter: CandidateFilter = field(default_factory=MeasureAll)
    preemption: Preemption = field(default_factory=NeverPreempt)
    energy: EnergyLedger = field(default_factory=EnergyLedger)
    warm_databases: Sequence[Any] = ()  # earlier jobs' databases (read): their best schedules seed each task
    guided_search: bool = True  # MetaSchedule's search takes rounds once the model ranks well (autotune.search)
    ranking: dict[str, Any] = field(default_factory=dict, init=False)
    engine_report: dict[str, Any] = field(default_factory=dict, init=False)
    bill: dict[str, Any] = field(default_factory=dict, init=False)
    stop_reason: str = field(default="", init=False)
    quality: RankQuality = field(default_factory=RankQuality, init=False)
    search_work: PhaseWork = field(default_factory=PhaseWork, init=False)
    wasted: dict[str, Any] = field(default_factory=lambda: {"measurements": 0, "of": 0, "cpu_s": 0.0, "device_s": 0.0},
                                   init=False)
    _known: dict[str, dict[int, Measurement]] = field(default_factory=dict, init=False)
    _rounds_by_kind: dict[str, int] = field(
        default_factory=lambda: {"sampled": 0, "seeded": 0, "evolved": 0, "guided": 0}, init=False)
    _seeded: dict[str, int] = field(default_factory=dict, init=False)  # task -> earlier schedules offered
    _elsewhere: dict[str, int] = field(default_factory=dict, init=False)  # task -> its records for other targets

    def run(self) -> Any:
        """Tune until every task has used its budget, its search ends, or time runs out; then rank.

        Returns the ranked database.
        """
        from tvm.s_tir.meta_schedule.database import JSONDatabase

        started = time.monotonic()
        self.energy.start()
        os.makedirs(self.work_dir, exist_ok=True)
        for name in DATABASE_FILES:
            _mend_torn_line(os.path.join(self.work_dir, name))
        database = JSONDatabase(work_dir=self.work_dir)
        self._load_known(database)
        if self.observer:
            self.observer.on_tuning_start(self.states, self.warning)
        searches = {s.task.name: self._start_task(s, database) for s in self.states if s.remaining > 0}
        log_path = os.path.join(self.work_dir, MEASUREMENTS_LOG)
        _mend_torn_line(log_path)
        with open(log_path, "a", encoding="utf-8") as log:
            while searches and not self._out_of_time(started) and not self.stop_reason:
                self._round(searches, database, log, started)
                self._save_progress()
                self.energy.sample()
                if self.observer:
                    self.observer.on_round_end(self.states, time.monotonic() - started, {
                        "tau": self.quality.recent_tau(),
                        "filtering": self.candidate_filter.trusts(is_trained(self.cost_model), self.quality.recent_tau()),
                    })
        for search in searches.values():
            search.ctx.post_tuning()
        if self.observer:
            self.observer.on_phase("re-timing the best candidates in isolation")
        ranked = self._rank(database)
        self.engine_report = self.engine.report()
        work = {"search": self.search_work, **self.engine.work}
        self.bill = self.energy.bill({k: {"cpu_s": w.cpu_s, "device_s": w.device_s} for k, w in work.items()},
                                     time.monotonic() - started, max(len(self.engine_report.get("slots", [])), 1),
                                     self.wasted)
        return ranked

    def model_latency_s(self) -> float:
        """The model's estimated latency: the sum of weight x best over its tasks (inf until each has a best)."""
        return sum(s.task.weight * s.best_s for s in self.states)

    def tuning_best_s(self) -> dict[str, float]:
        """Each task's fastest measured latency of the job (all runs), before the final ranking re-times it."""
        return {task: min((m.latency for m in known.values()), default=math.inf) for task, known in self._known.items()}

    def policies_report(self) -> dict[str, Any]:
        """What the filter, the preemption and the latency model did, for the manifest."""
        return {
            "filter": self.candidate_filter.report(self.tuning_best_s()),
            "preemption": {**self.preemption.report(), "job_stopped": self.stop_reason or None,
                           "tasks_stopped": {s.task.name: s.stopped for s in self.states if s.stopped}},
            "latency_model": {**self.quality.report(), "features": features_reused(self.cost_model)},
            "search_rounds": dict(self._rounds_by_kind),
            "seeded_from_earlier_jobs": dict(self._seeded),
        }

    @contextmanager
    def _searching(self) -> Iterator[None]:
        """Count the tuning process's CPU time (search and latency-model training) as the search phase."""
        before = resource.getrusage(resource.RUSAGE_SELF)
        try:
            yield
        finally:
            after = resource.getrusage(resource.RUSAGE_SELF)
            self.search_work.add((after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime))

    def _out_of_time(self, started: float) -> bool:
        return self.time_limit_s is not None and time.monotonic() - started >= self.time_limit_s

    def _start_task(self, state: TaskState, database: Any) -> TaskSearch:
        """The task's search, seeded with the best schedules earlier jobs' databases hold for its workload."""
        from tvm.s_tir.meta_schedule import TuneContext

        state.round_size = self.round_size or round_size_for(state.planned)
        ctx = TuneContext(
            mod=state.task.mod,
            target=self.target,
            space_generator="post-order-apply",
            search_strategy=evolutionary_search(state.round_size, self.candidate_filter.guided_generations,
                                                self.candidate_filter.guided_population),
            task_name=state.task.name,
            rand_state=self.seed + self.states.index(state),
            num_threads=self.num_threads,
        )
        spaces = ctx.generate_design_space()
        ctx.pre_tuning(
            # The session enforces each task's budget; the search's own cap only has to stay out of the way,
            # so that trials handed over from tasks that finish early can be used.
            max_trials=sum(s.budget for s in self.states),
            num_trials_per_iter=self.candidate_filter.guided_batch(state.round_size),
            design_spaces=spaces,
            database=database,
            cost_model=self.cost_model,
        )
        seeds = _earlier_best(self.warm_databases, state.task.mod, self.target) if state.trials == 0 else []
        if seeds:
            self._seeded[state.task.name] = len(seeds)
        return TaskSearch(ctx, spaces, self.seed + self.states.index(state), seeds)

    def _round(self, searches: dict[str, TaskSearch], database: Any, log: Any, started: float) -> None:
        """Ask every live task for candidates, filter them, measure the new ones in one engine call, report back."""
        plans = [p for p in (self._propose(s, searches, database) for s in self.states if s.task.name in searches) if p]
        fresh: list[Candidate] = []
        for plan in plans:
            known = self._known.setdefault(plan.state.task.name, {})
            fresh += [Candidate(c.sch.mod, c.args_info, plan.state.task.name)
                      for c, h in zip(plan.candidates, plan.hashes) if h not in known]
        t0 = time.monotonic()
        measured = iter(self.engine.measure(self.target, self.device_type, fresh) if fresh else [])
        engine_s = time.monotonic() - t0
        rounds = []
        for plan in plans:
            state, ctx = plan.state, plan.search.ctx
            best_before = state.best_s
            state.wall_s += engine_s * len(plan.candidates) / max(len(fresh), 1)
            results, latencies, improved = self._collect(plan, measured, database, log, started)
            with self._searching():
                self.cost_model.update(ctx, plan.candidates, results)
            ctx.notify_runner_results(plan.candidates, results)
            self.quality.record(state.task.name, plan.scores, latencies, plan.trained)
            self.candidate_filter.observe(plan.proposal_scores, plan.selection,
                                          dict(zip(plan.selection.measure, improved)), plan.trained,
                                          dict(zip(plan.selection.measure, latencies)), state.task.name)
            rounds.append(TaskRound(state.task.name, best_before, state.best_s, state.proposed, plan.kind in DIRECTED,
                                    state.task.weight, state.planned, state.trials, state.remaining > 0))
            if state.remaining == 0:
                self._finish(state, searches)
        decision = self.preemption.after_round(rounds, self.model_latency_s())
        for state in self.states:
            why = decision.stop_tasks.get(state.task.name) or decision.stop_job
            if why and state.task.name in searches:
                state.stopped = why
                self._finish(state, searches)
        self.stop_reason = decision.stop_job

    def _propose(self, state: TaskState, searches: dict[str, TaskSearch], database: Any) -> _Plan | None:
        """The task's proposals for this round that the filter lets through, with the model's scores."""
        import tvm_ffi

        search = searches[state.task.name]
        ctx = search.ctx
        t0 = time.monotonic()
        trained = is_trained(self.cost_model)
        with self._searching():
            proposal: Proposal = search.propose(
                min(state.round_size, state.remaining), self._parents(state, database),
                set(self._known[state.task.name]), (lambda cs: score(self.cost_model, ctx, cs)) if trained else None,
                trained and self.guided_search and trusts_model(self.quality.recent_tau()),
                min(self.candidate_filter.guided_batch(state.round_size), state.remaining))
            candidates = proposal.candidates
            scores = score(self.cost_model, ctx, candidates)
        state.wall_s += time.monotonic() - t0
        if not candidates:
            self._finish(state, searches)
            return None
        self._rounds_by_kind[proposal.kind] += 1
        selection = self.candidate_filter.select(scores, trained, self.quality.recent_tau())
        state.screened += len(selection.dropped)
        kept = [candidates[i] for i in selection.measure]
        return _Plan(state, search, kept, [tvm_ffi.structural_hash(c.sch.mod) for c in kept], scores, selection,
                     trained, proposal.kind, proposal.origins)

    def _parents(self, state: TaskState, database: Any) -> list[tuple[Any, float]]:
        """The task's best schedules measured on this target (trace, latency), best first: what an evolved
        round mutates."""
        top = database.get_top_k(database.commit_workload(state.task.mod), PARENTS + self._elsewhere[state.task.name])
        return [(r.trace, _mean(r.run_secs)) for r in top
                if for_target(r, self.target) and _mean(r.run_secs) < math.inf][:PARENTS]

    def _finish(self, state: TaskState, searches: dict[str, TaskSearch]) -> None:
        """End a task; trials it did not use go to the tasks still searching, by work share."""
        state.finished = True
        searches.pop(state.task.name).ctx.post_tuning()
        leftover, state.budget = state.remaining, state.proposed
        live = [s for s in self.states if s.task.name in searches]
        if leftover and live:
            for s, extra in zip(live, share_out(leftover, [s.task.share for s in live])):
                s.budget += extra

    def _collect(self, plan: _Plan, measured: Any, database: Any, log: Any,
                 started: float) -> tuple[list[Any], list[float], list[bool]]:
        """Runner results, latencies and "improved the task's best" for ``plan``'s candidates.

        Fresh candidates are committed, logged and billed (as wasted when they improved
        nothing); candidates measured in an earlier round or run are reused.
        """
        from tvm.s_tir.meta_schedule.database import TuningRecord
        from tvm.s_tir.meta_schedule.runner import RunnerResult

        state = plan.state
        known = self._known[state.task.name]
        workload = database.commit_workload(state.task.mod)
        results, latencies, improved = [], [], []
        for candidate, h, (predicted, origin, explored) in zip(plan.candidates, plan.hashes, plan.measured()):
            better = False
            if h in known:
                m = known[h]
            else:
                m = known[h] = next(measured)
                secs = [m.latency] if m.ok else None
                database.commit_tuning_record(
                    TuningRecord(candidate.sch.trace, workload, secs, self.target, candidate.args_info)
                )
                better = m.latency < state.best_s
                state.trials += 1
                state.errors += 0 if m.ok else 1
                state.best_s = min(state.best_s, m.latency)
                self.wasted["of"] += 1
                if not better:
                    self.wasted["measurements"] += 1
                    self.wasted["cpu_s"] += m.cpu_s
                    self.wasted["device_s"] += m.device_s
                log.write(json.dumps({
                    "task": state.task.name, "trial": state.trials, "latency_s": None if not m.ok else m.latency,
                    "error": m.error, "elapsed_s": round(time.monotonic() - started, 3),
                    "at": round(m.at or time.time(), 3), "improved": better, "proposed_by": plan.kind,
                    # the model's normalised prediction before it was measured (1.0 = the best then), if trained
                    "score": round(predicted, 4) if plan.trained else None,
                    "origin": origin, "explored": explored,  # explored: measured as the filter's random sample
                }) + "\n")
                log.flush()  # each record as it is committed: a kill leaves none in the database unlogged
            results.append(RunnerResult([m.latency], None) if m.ok else RunnerResult(None, m.error))
            latencies.append(m.latency)
            improved.append(better)
        return results, latencies, improved

    def _records_by_task(self, database: Any) -> dict[str, tuple[list[Any], int]]:
        """Per task, the database's tuning records of its workload on this session's target, and how many it
        holds for other targets (a run folder tuned for another machine measured nothing that holds here)."""
        import tvm_ffi

        by_workload: dict[int, list[Any]] = {}
        for record in database.get_all_tuning_records():
            by_workload.setdefault(tvm_ffi.structural_hash(record.workload.mod), []).append(record)
        by_task = {}
        for state in self.states:
            records = [r for r in by_workload.get(tvm_ffi.structural_hash(state.task.mod), [])
                       if tvm_ffi.structural_equal(r.workload.mod, state.task.mod)]
            here = [r for r in records if for_target(r, self.target)]
            by_task[state.task.name] = here, len(records) - len(here)
        return by_task

    def _load_known(self, database: Any) -> None:
        """Index the database's records by task and candidate hash, so a resumed run re-measures nothing; the
        latency model learns them (its saved copy then holds the whole database), and what the run folder
        saved of the earlier run's progress is taken back."""
        import tvm_ffi
        from tvm.s_tir import Schedule

        by_task = self._records_by_task(database)
        for name, (records, elsewhere) in by_task.items():
            state = next(s for s in self.states if s.task.name == name)
            known = self._known.setdefault(name, {})
            self._elsewhere[name] = elsewhere
            for record in records:
                sch = Schedule(record.workload.mod)
                record.trace.apply_to_schedule(sch, remove_postproc=False)
                secs = tuple(float(s) for s in record.run_secs) if record.run_secs else None
                m = Measurement(run_secs=secs, error=None if secs else "failed in an earlier run")
                known[tvm_ffi.structural_hash(sch.mod)] = m
                state.best_s = min(state.best_s, m.latency)
            state.trials = state.resumed = len(known)
        with self._searching():
            learn_records(self.cost_model, [r for records, _ in by_task.values() for r in records], self.target,
                          self.num_threads)
        self._restore_progress()

    def _save_progress(self) -> None:
        """Write each task's budget (trials handed over included), screened proposals and stop to ``PROGRESS``,
        whole or not at all: a resumed run takes them back, where the database only tells it what was measured."""
        progress = {
            "schema_version": PROGRESS_SCHEMA, "job_stopped": self.stop_reason,
            "tasks": {s.task.name: {"planned": s.planned, "budget": s.budget, "screened": s.screened,
                                    "stopped": s.stopped} for s in self.states},
            "preemption": {"name": self.preemption.name, "state": self.preemption.state()},
        }
        write_atomically(os.path.join(self.work_dir, PROGRESS), json.dumps(progress, indent=2))

    def _restore_progress(self) -> None:
        """Take back the earlier run's ``PROGRESS``: its screened proposals used trials of their budgets, and,
        for the same job (the same tasks planned the same budgets), its stops, budgets handed over and
        preemption counts hold.

        A job planned otherwise (another ``--trials``) keeps its own budgets and searches again where the
        earlier run had stopped: its stops were counted on budgets it no longer has.
        """
        path = os.path.join(self.work_dir, PROGRESS)
        if not os.path.exists(path):
            return
        try:
            with open(path, encoding="utf-8") as f:
                progress = json.load(f)
            if progress["schema_version"] != PROGRESS_SCHEMA:
                raise ValueError(f"schema_version {progress['schema_version']!r}, expected {PROGRESS_SCHEMA}")
            saved = {name: (int(t["planned"]), int(t["budget"]), int(t["screened"]), str(t["stopped"]))
                     for name, t in progress["tasks"].items()}
            job_stopped = str(progress["job_stopped"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            unused = f"{path} not used ({type(err).__name__}: {err}); budgets start as planned"
            self.warning = f"{self.warning}; {unused}" if self.warning else unused
            return
        same_job = saved.keys() == {s.task.name for s in self.states} and all(
            saved[s.task.name][0] == s.planned for s in self.states)
        for state in self.states:
            if state.task.name in saved:
                _, budget, state.screened, stopped = saved[state.task.name]
                if same_job:
                    state.budget, state.stopped = budget, stopped
        if same_job:
            self.stop_reason = job_stopped
            self._restore_preemption(progress.get("preemption"), path)

    def _restore_preemption(self, saved: Any, path: str) -> None:
        """The same job's preemption counts since the last gains go on, where the policy is the same one."""
        if not isinstance(saved, dict) or saved.get("name") != self.preemption.name:
            return
        try:
            self.preemption.restore(saved["state"])
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            unused = f"{path}: preemption state not used ({type(err).__name__}: {err}); its counts start afresh"
            self.warning = f"{self.warning}; {unused}" if self.warning else unused

    def _rank(self, database: Any) -> Any:
        """Re-time each task's best candidates alone, in turns, and write ``ranked/``: all records, re-timed
        values in place. (The top candidates of a task are often within 2% of each other: one timing each
        picks among them by the host's spells; the median of three, taken in turns, by their speed.)

        If a candidate that was not re-timed would still come first, the next ones are re-timed too.
        """
        from tvm.s_tir.meta_schedule.database import JSONDatabase

        final = os.path.join(self.work_dir, RANKED_DIR)
        with staged_folder(final) as staging:
            ranked = JSONDatabase(work_dir=str(staging))
            by_task = self._records_by_task(database)
            for state in self.states:
                self._rank_task(state, by_task[state.task.name][0], ranked)
        write_atomically(os.path.join(self.work_dir, RANKING), json.dumps(self.ranking, indent=2))
        return JSONDatabase(work_dir=final)

    def _rank_task(self, state: TaskState, records: list[Any], ranked: Any) -> None:
        """Re-time ``state``'s best ``records`` alone, in turns, and commit all of them to ``ranked``."""
        from tvm.s_tir import Schedule
        from tvm.s_tir.meta_schedule.database import TuningRecord

        value = {i: _mean(r.run_secs) for i, r in enumerate(records)}
        parallel = dict(value)
        retimed: set[int] = set()
        k = min(5, max(2, math.ceil(self.rerank_share * len(records))))
        for _ in range(3):
            todo = next_to_retime(value, retimed, k)
            if not todo:
                break
            batch = []
            for i in todo:
                sch = Schedule(records[i].workload.mod)
                records[i].trace.apply_to_schedule(sch, remove_postproc=False)
                batch.append(Candidate(sch.mod, records[i].args_info, state.task.name))
            for i, m in zip(todo, self.engine.measure_isolated(self.target, self.device_type, batch, turns=RANK_TURNS)):
                value[i] = m.latency
                retimed.add(i)
            self.energy.sample()
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


def next_to_retime(values: dict[int, float], retimed: set[int], k: int) -> list[int]:
    """The ``k`` fastest candidates not re-timed yet, or none once the fastest of all has been.

    At most ``k`` a time: in a slow spell every re-timed value rises above the tuning values
    it is ranked with, and re-timing "the top 2k" would then mean 2k new candidates, 4k the next time.
    """
    order = sorted((i for i in values if values[i] < math.inf), key=values.__getitem__)
    if not order or order[0] in retimed:
        return []
    return [i for i in order if i not in retimed][:k]


def _earlier_best(databases: Sequence[Any], mod: Any, target: Any) -> list[Any]:
    """Traces of the best schedules ``databases`` hold for workload ``mod`` on ``target``, best first.

    A database only answers for workloads it has (nothing is committed to it): another model's
    tasks that share a workload with this one seed it, the rest start from draws.
    """
    found = [r for db in databases if db.has_workload(mod) for r in db.get_top_k(db.commit_workload(mod), PARENTS)
             if for_target(r, target)]
    found.sort(key=lambda r: _mean(r.run_secs))
    return [r.trace for r in found[:PARENTS] if _mean(r.run_secs) < math.inf]


def _mean(secs: Any) -> float:
    values = [float(s) for s in secs or []]
    return sum(values) / len(values) if values else math.inf


def _mend_torn_line(path: str) -> None:
    """Mend a last line that a killed job left without its newline: a whole JSON record gets its newline, a
    part of one is cut off (it was never a finished record). Either way the next record starts a line of its
    own; and TVM refuses a whole tuning database for one partial line."""
    if not os.path.exists(path):
        return
    with open(path, "rb+") as f:
        data = f.read()
        if not data or data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1  # where the last line begins (0: the file is one line)
        try:
            json.loads(data[cut:])
        except ValueError:
            f.truncate(cut)
        else:
            f.write(b"\n")

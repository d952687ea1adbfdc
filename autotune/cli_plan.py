"""The planning commands: ``autotune plan PIPELINE ...`` (make a plan), ``autotune plan simulate PLAN ...`` and
``autotune plan apply PLAN ...`` (serve it live).

Registered on the main ``autotune`` app by ``autotune.cli``; each command parses, calls one
function of ``containers.planner``, and prints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import click
import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from autotune.cli import _fail, app

PLANS = Path("runs/plans")
TUNER_DRAIN_HELP = ("with the Tuner: how many times its step again each scale-up adds, to drain what queues while "
                    "the new replicas start; 0 adds only what the traffic needs (default 1)")
STANDBY_HELP = ("with the Tuner: warm, paused replicas each stage keeps per planned replica (rounded up), so a "
                "scale-up serves in ~0.05 s rather than a container start; each is billed at 18% of a CPU replica's "
                "price (its memory), a GPU one's in full (default 0)")


class _PlanGroup(TyperGroup):
    """``autotune plan PIPELINE ...`` means ``autotune plan make PIPELINE ...``: a first word that is not a subcommand."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["make", *args]
        return super().parse_args(ctx, args)


plan_app = typer.Typer(cls=_PlanGroup, no_args_is_help=True,
                       help="Placement plans (InferLine): per stage hardware, batch size and replicas for a p99 SLO.")
app.add_typer(plan_app, name="plan")


def _plan_table(plan: Any, others: dict[str, Any]) -> list[Table]:
    stages = Table(title=f"plan for {plan.pipeline}: p99 {plan.predicted.p99_ms:.1f} ms predicted vs SLO "
                         f"{plan.slo_ms:g} ms, miss rate {plan.predicted.miss_rate:.2%}")
    for col in ("stage", "hardware", "batch", "timeout ms", "replicas", "$/hour"):
        stages.add_column(col, justify="left" if col in ("stage", "hardware") else "right")
    for name, cfg in plan.stages.items():
        stages.add_row(name, cfg.hardware, str(cfg.batch_size), f"{cfg.batch_timeout_ms:g}", str(cfg.replicas),
                       f"{plan.stage_cost(name):.4f}")
    stages.caption = (f"total ${plan.cost_per_hour:.4f}/hour; found in {plan.search['seconds']:.2f} s, "
                      f"{plan.search['estimator_calls']} estimator calls over {plan.search['trace_queries']} queries")
    methods = Table(title="against the coarse-grained baselines (same trace, same estimator)")
    for col in ("method", "$/hour", "x planner", "p99 ms", "miss rate"):
        methods.add_column(col, justify="left" if col == "method" else "right")
    for method, other in {"inferline": plan, **others}.items():
        if isinstance(other, Exception):
            methods.add_row(method, "-", "-", "-", str(other))
        else:
            methods.add_row(method, f"{other.cost_per_hour:.4f}", f"{other.cost_per_hour / plan.cost_per_hour:.2f}",
                            f"{other.predicted.p99_ms:.1f}", f"{other.predicted.miss_rate:.2%}")
    return [stages, methods]


@plan_app.command("make")
def plan_make(
    pipeline_file: Annotated[Path, typer.Argument(metavar="PIPELINE", help="pipeline TOML file")],
    trace: Annotated[Path, typer.Option(help="sample arrival trace: one time in seconds per line")],
    slo_ms: Annotated[Optional[float], typer.Option(help="p99 end-to-end SLO in ms (default: the file's slo_ms)")] = None,
    out: Annotated[Optional[Path], typer.Option(help="plan file (default runs/plans/<pipeline>.json)")] = None,
    seed: Annotated[int, typer.Option(help="seed of the scale-factor draws")] = 0,
    plan_percentile: Annotated[Optional[float], typer.Option(
        help="latency percentile held to the SLO over the sample trace; above the SLO's 99 is headroom for "
             "traffic the sample did not show [default: the planner's PLAN_PERCENTILE, 99.9]")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the plans as JSON")] = False,
) -> None:
    """Plan a pipeline for a sample trace and an SLO at least cost, next to the CG-Mean and CG-Peak baselines."""
    from containers.errors import ContainerError
    from containers.planner.estimator import Estimator
    from containers.planner.pipeline import read_pipeline
    from containers.planner.planner import PLAN_PERCENTILE, plan_methods
    from containers.planner.trace import read_trace

    try:
        pipeline = read_pipeline(pipeline_file)
        percentile = PLAN_PERCENTILE if plan_percentile is None else plan_percentile
        sample = Estimator(pipeline, read_trace(trace), seed=seed, slo_percentile=percentile)
        plans = plan_methods(sample, slo_ms)
        plan = plans.pop("inferline")
        if isinstance(plan, ContainerError):
            raise plan
        out = out or PLANS / f"{pipeline.name}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        plan.write(out)
    except ContainerError as err:
        _fail(err)
        return
    if as_json:
        print(json.dumps({"plan": str(out), "inferline": plan.to_json(),
                          **{m: str(p) if isinstance(p, Exception) else p.to_json() for m, p in plans.items()}}, indent=2))
        return
    for table in _plan_table(plan, plans):
        Console().print(table)
    print(f"plan written to {out}")


@plan_app.command("trace")
def plan_trace(
    out: Annotated[Path, typer.Argument(metavar="FILE", help="trace file to write: one time in seconds per line")],
    rate: Annotated[float, typer.Option(help="mean arrivals per second")],
    cv: Annotated[float, typer.Option(help="coefficient of variation of the gaps (1: Poisson, above: burstier)")] = 1.0,
    seconds: Annotated[float, typer.Option(help="how long the trace runs")] = 60.0,
    spike_rate: Annotated[Optional[float], typer.Option(help="arrivals per second during a spike")] = None,
    spike_at: Annotated[float, typer.Option(help="with --spike-rate: when the spike starts, seconds")] = 0.0,
    spike_s: Annotated[float, typer.Option(help="with --spike-rate: how long it lasts, seconds")] = 10.0,
    seed: Annotated[int, typer.Option(help="seed of the gaps")] = 0,
) -> None:
    """Write an arrival trace with gamma gaps (and an optional spike): a sample to plan for, or traffic to replay."""
    from containers.errors import ContainerError, ScenarioError
    from containers.planner.trace import gamma_trace, spike_trace, write_trace

    try:
        for flag, value in (("--rate", rate), ("--cv", cv), ("--seconds", seconds), ("--spike-rate", spike_rate)):
            if value is not None and not value > 0:
                raise ScenarioError(f"{flag} must be a positive number; got {value:g}")
        times = (gamma_trace(rate, cv, seconds, seed) if spike_rate is None
                 else spike_trace(rate, spike_rate, spike_at, spike_s, seconds, cv, seed))
        write_trace(out, times)
    except ContainerError as err:
        _fail(err)
        return
    print(f"{times.size} arrivals over {seconds:g} s ({times.size / seconds:.2f}/s) written to {out}")


def _plan_and_pipeline(plan_file: Path, pipeline_file: Path | None) -> tuple[Any, Any]:
    """The plan, and the pipeline it was made from (or ``pipeline_file``), both checked."""
    from containers.errors import PlanError
    from containers.planner.pipeline import read_pipeline
    from containers.planner.plan import read_plan

    plan = read_plan(plan_file)
    source = pipeline_file or plan.pipeline_file
    if source is None:
        raise PlanError(f"{plan_file} does not say which pipeline file it was made from; give --pipeline")
    return plan, read_pipeline(source)


@plan_app.command("simulate")
def plan_simulate(
    plan_file: Annotated[Path, typer.Argument(metavar="PLAN", help="plan JSON written by autotune plan")],
    trace: Annotated[Path, typer.Option(help="arrival trace to replay: one time in seconds per line")],
    tuner: Annotated[bool, typer.Option("--tuner/--no-tuner", help="let the Tuner scale replicas along the trace")] = False,
    pipeline_file: Annotated[Optional[Path], typer.Option("--pipeline", help="pipeline TOML (default: the one the "
                                                                             "plan was made from)")] = None,
    seed: Annotated[int, typer.Option(help="seed of the scale-factor draws")] = 0,
    startup_s: Annotated[Optional[float], typer.Option("--startup-s", help="with the Tuner: seconds from its ask to "
                                                       "a new replica serving, on every stage [default: each "
                                                       "stage's container start as profiled, plus its warm-up; "
                                                       "5 where not profiled]")] = None,
    tuner_interval: Annotated[Optional[float], typer.Option(help="with the Tuner: seconds between its looks at the "
                                                                 "traffic (default 0.25)")] = None,
    tuner_drain: Annotated[Optional[float], typer.Option(help=TUNER_DRAIN_HELP)] = None,
    standby: Annotated[float, typer.Option(help=STANDBY_HELP)] = 0.0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Replay a plan over a trace in the Estimator: latency, SLO misses and cost, with or without the Tuner."""
    from containers.errors import ContainerError
    from containers.planner.simulate import simulate_plan
    from containers.planner.trace import read_trace

    try:
        plan, pipeline = _plan_and_pipeline(plan_file, pipeline_file)
        given = {k: v for k, v in (("startup_s", startup_s), ("interval_s", tuner_interval), ("drain", tuner_drain))
                 if v is not None}
        result = simulate_plan(pipeline, plan, read_trace(trace), tuner=tuner, seed=seed, standby=standby, **given)
    except ContainerError as err:
        _fail(err)
        return
    if as_json:
        print(json.dumps(result, indent=2))
        return
    table = Table(title=f"{plan.method} plan for {plan.pipeline} over {result['trace_seconds']:g} s of trace"
                        + (", with the Tuner" if tuner else ""))
    for col in ("queries", "p50 ms", "p99 ms", "SLO ms", "miss rate", "$/hour", "planned $/hour", "changes"):
        table.add_column(col, justify="right")
    table.add_row(str(result["queries"]), f"{result['p50_ms']:.1f}", f"{result['p99_ms']:.1f}", f"{plan.slo_ms:g}",
                  f"{result['miss_rate']:.2%}", f"{result['cost_per_hour']:.4f}", f"{result['planned_cost_per_hour']:.4f}",
                  str(result["replica_changes"]))
    Console().print(table)


@plan_app.command("apply")
def plan_apply(
    plan_file: Annotated[Path, typer.Argument(metavar="PLAN", help="plan JSON written by autotune plan")],
    trace: Annotated[Path, typer.Option(help="arrival trace to serve live: one time in seconds per line")],
    backend: Annotated[str, typer.Option(help="docker, local (cgroups) or auto")] = "auto",
    tuner: Annotated[bool, typer.Option("--tuner/--no-tuner", help="let the Tuner add and remove replicas live")] = False,
    out: Annotated[Optional[Path], typer.Option(help="run folder for live.json and live.png "
                                                     "(default runs/live/<pipeline>)")] = None,
    pipeline_file: Annotated[Optional[Path], typer.Option("--pipeline", help="pipeline TOML (default: the one the "
                                                                             "plan was made from)")] = None,
    duration: Annotated[Optional[float], typer.Option(help="send only the arrivals of the first this many seconds")] = None,
    seed: Annotated[int, typer.Option(help="seed of the scale-factor draws (as the Estimator's)")] = 0,
    base_port: Annotated[int, typer.Option(help="the plan's replicas listen on consecutive ports from here")] = 18700,
    cores: Annotated[Optional[str], typer.Option(help="cores the replicas are pinned to, like 0,1; the front end "
                                                      "and load generator then run on the others [default: every "
                                                      "core, shared with them]")] = None,
    tuner_drain: Annotated[Optional[float], typer.Option(help=TUNER_DRAIN_HELP)] = None,
    standby: Annotated[float, typer.Option(help=STANDBY_HELP)] = 0.0,
    as_json: Annotated[bool, typer.Option("--json", help="print the record's summary as JSON")] = False,
) -> None:
    """Serve a plan live: start its replicas, drive the trace through them, stop them; measured p99 against predicted."""
    import os

    from autotune.cli import _ints
    from autotune.cli_serve import _interruptible
    from autotune.errors import AutotuneError
    from containers.backends import cores_text
    from containers.errors import ContainerError, ScenarioError
    from containers.planner.live import apply_plan
    from containers.planner.trace import read_trace
    from results.errors import ArtifactError

    try:
        plan, pipeline = _plan_and_pipeline(plan_file, pipeline_file)
        out = out or Path("runs/live") / plan.pipeline
        allowed, pinned = os.sched_getaffinity(0), _ints(cores, "--cores")
        if pinned is not None and not set(pinned) <= allowed:
            raise ScenarioError(f"--cores {cores} names cores this process may not use; it may use "
                                f"{cores_text(tuple(sorted(allowed)))}")
        if pinned is not None and allowed - set(pinned):
            os.sched_setaffinity(0, allowed - set(pinned))
        with _interruptible():
            record = apply_plan(plan, pipeline, read_trace(trace), out, backend=backend, tuner=tuner,
                                seed=seed, base_port=base_port, duration_s=duration, cores=pinned, standby=standby,
                                **({"tuner_drain": tuner_drain} if tuner_drain is not None else {}),
                                on_event=(lambda text: None) if as_json else print)
    except (ContainerError, ArtifactError, AutotuneError) as err:
        _fail(err)
        return
    summary = {k: v for k, v in record.items() if k != "queries"}
    if as_json:
        print(json.dumps({"record": str(out / "live.json"), **summary}, indent=2))
        return
    table = Table(title=f"{plan.method} plan for {plan.pipeline}, live on {record['backend']}"
                        + (", with the Tuner" if tuner else ""))
    for col in ("", "queries", "failed", "p50 ms", "p99 ms", "SLO ms", "miss rate"):
        table.add_column(col, justify="left" if not col else "right")
    rows = [("measured", record["measured"])] + [(key.replace("_", " "), record[key]) for key in
                                                  ("predicted", "predicted_with_tuner", "predicted_live_schedule",
                                                   "predicted_as_served")
                                                  if key in record]
    for label, r in rows:
        fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        table.add_row(label, str(r.get("queries", "")), str(r.get("failed", "")), fmt(r["p50_ms"]), fmt(r["p99_ms"]),
                      f"{plan.slo_ms:g}", f"{r['miss_rate']:.2%}")
    changes = [c for c in record["replica_changes"] if c["event"] == "asked"]
    capped = [c for c in record["replica_changes"] if c["event"] == "capped"]
    took = [t for ts in record.get("startup_s", {}).values() for t in ts]
    table.caption = (f"p99 error {record.get('p99_error', float('nan')):+.1%} (against "
                     f"{record['compared_with'].replace('_', ' ')}); {len(changes)} replica changes asked"
                     + (f", {len(capped)} capped at what the cores hold" if capped else "")
                     + (f", new replicas served {min(took):.1f}-{max(took):.1f} s after the ask" if took else "")
                     + f"; written to {out}")
    Console().print(table)

"""The serving commands: ``autotune serve``, ``autotune qoe ...`` and ``autotune deploy ...``.

Registered on the main ``autotune`` app by ``autotune.cli``; each command parses, calls one
function of ``containers``, and prints.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from autotune.cli import _fail, app, err_console

qoe_app = typer.Typer(no_args_is_help=True, help="The QoE manager (DQoES): run scenarios, watch them, change targets.")
app.add_typer(qoe_app, name="qoe")
QOE_RUNS = Path("runs/qoe")


def _table(status: dict[str, Any]) -> Table:
    table = Table(title=f"{status.get('scenario', '')}  policy {status['policy']}, listener {status['listener']} "
                        f"(next in {status['interval_s']:.0f} s), {status['iterations']} iterations")
    for col in ("container", "class", "target ms", "response ms", "usage", "limit", "state"):
        table.add_column(col, justify="left" if col in ("container", "state") else "right")
    fmt = lambda v, spec=".2f": "-" if v is None else format(v, spec)  # noqa: E731
    for row in status["containers"]:
        table.add_row(row["name"], row["qoe_class"], fmt(row["target_ms"], ".1f"), fmt(row["response_ms"]),
                      fmt(row["usage_cpus"]), fmt(row["limit_cpus"]), row["state"])
    c = status["counts"]
    table.caption = f"G {c['G']}  S {c['S']}  B {c['B']}   manager CPU {status['manager_cpu_share']:.2%}"
    return table


@contextmanager
def _interruptible() -> Iterator[None]:
    """Ctrl-C or SIGTERM ends a command that started containers after its cleanup has stopped them (exit 130).

    Without it SIGTERM would end the process before its ``finally`` blocks, and the servers it
    started would keep running (``containers.interrupts``).
    """
    from containers.interrupts import sigterm_as_interrupt

    try:
        with sigterm_as_interrupt():
            yield
    except KeyboardInterrupt:
        err_console.print("interrupted: the containers it started are stopped", highlight=False)
        raise typer.Exit(130) from None


def _run(scenario: Any, out: Path, quiet: bool) -> dict[str, Any]:
    """Run with a live table for a person (or silently), mapping errors to one line and an exit code."""
    from containers.errors import ContainerError
    from containers.qoe.run import RunEvents, run_scenario
    from results.errors import ArtifactError

    console = Console(stderr=True)
    try:
        if quiet:
            return run_scenario(scenario, out)
        with Live(console=console, auto_refresh=False) as live:
            events = RunEvents(on_event=lambda text: live.console.print(text),
                               on_iteration=lambda status: live.update(_table(status), refresh=True))
            return run_scenario(scenario, out, events)
    except (ContainerError, ArtifactError) as err:
        _fail(err)
        raise  # unreachable: _fail exits


@app.command()
def serve(
    artifact: Annotated[Path, typer.Argument(help="artifact folder (or the run folder holding it)")],
    target_ms: Annotated[float, typer.Option(help="the client's latency target (mean server time per request)")],
    name: Annotated[str, typer.Option(help="container name")] = "model",
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 18500,
    threads: Annotated[int, typer.Option(help="TVM threads in the server")] = 1,
    backend: Annotated[str, typer.Option(help="docker, local (cgroups) or auto")] = "auto",
    interval: Annotated[float, typer.Option(help="the listener's initial interval, seconds")] = 10.0,
    duration: Annotated[Optional[float], typer.Option(help="stop after this many seconds (default: Ctrl-C or "
                                                           "SIGTERM)")] = None,
    out: Annotated[Path, typer.Option(help="where status.json and the final record go")] = Path("runs/serve"),
) -> None:
    """Serve an artifact in a container whose CPU limit the QoE manager adjusts to --target-ms."""
    from autotune.errors import UsageError
    from containers.errors import ContainerError
    from containers.qoe.analyst import check_target
    from containers.scenario import ContainerPlan, LoadSpec, Scenario
    from results.artifact import open_artifact
    from results.errors import ArtifactError

    try:
        if duration is not None and not duration > 0:
            raise UsageError(f"--duration must be a positive number of seconds (leave it out to serve until Ctrl-C); "
                             f"got {duration:g}")
        check_target(name, target_ms)
        path = open_artifact(artifact).path
    except (UsageError, ContainerError, ArtifactError) as err:
        _fail(err)
        return
    plan = ContainerPlan(name, path, target_ms, threads, load=LoadSpec("none"))
    scenario = Scenario(f"serve-{name}", math.inf if duration is None else duration, (plan,), backend=backend,
                        base_port=port, interval_s=interval)
    print(f"serving {path} at http://127.0.0.1:{port}/v1/infer (metrics at /metrics); Ctrl-C stops")
    _run(scenario, out, quiet=False)


@qoe_app.command("run")
def qoe_run(
    scenario_file: Annotated[Path, typer.Argument(metavar="SCENARIO", help="scenario TOML file")],
    out: Annotated[Optional[Path], typer.Option(help="run folder (default runs/qoe/<scenario name>)")] = None,
    quiet: Annotated[bool, typer.Option(help="no live table")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
) -> None:
    """Run a scenario: containers join on schedule, clients load them, the manager holds their targets."""
    from containers.errors import ContainerError
    from containers.scenario import read_scenario

    try:
        scenario = read_scenario(scenario_file)
    except ContainerError as err:
        _fail(err)
        return
    out = out or QOE_RUNS / scenario.name
    record = _run(scenario, out, quiet or as_json)
    if record["interrupted"]:
        err_console.print(f"interrupted after {record['wall_s']:g} s of {scenario.duration_s:g}: the containers are "
                          f"stopped, the partial record is in {out}", highlight=False)
        raise typer.Exit(130)
    if as_json:
        print(json.dumps({"run": str(out), **record["summary"], "requests": record["requests"]}, indent=2))
    else:
        s = record["summary"]
        print(f"{s['satisfied_final']} of {len(scenario.containers)} containers satisfied; "
              f"{s['iterations']} iterations, {s['limit_changes']} limit changes, manager CPU {s['manager_cpu_share']:.2%}")
        print(f"record and timeline written to {out}")


def _latest_run() -> Path:
    runs = sorted((p.parent for p in [*QOE_RUNS.glob("*/status.json"), Path("runs/serve/status.json")] if p.exists()),
                  key=lambda d: (d / "status.json").stat().st_mtime)
    return runs[-1] if runs else QOE_RUNS


@qoe_app.command("status")
def qoe_status(
    run: Annotated[Optional[Path], typer.Argument(help="run folder (default: the latest)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the status as JSON")] = False,
) -> None:
    """Show a QoE manager's performance table: each container's class, target, response time and limit."""
    from containers.errors import ContainerError
    from containers.qoe.control import read_status

    try:
        status = read_status(run or _latest_run())
    except ContainerError as err:
        _fail(err)
        return
    if as_json:
        print(json.dumps(status, indent=2))
        return
    Console().print(_table(status))
    print("running" if status["running"] else "not running (last status shown)")


@qoe_app.command("target")
def qoe_target(
    container: Annotated[str, typer.Argument(help="container name")],
    target_ms: Annotated[Optional[str], typer.Argument(help="new target in ms")] = None,
    remove: Annotated[bool, typer.Option(help="remove the container's target")] = False,
    run: Annotated[Optional[Path], typer.Option(help="run folder (default: the latest)")] = None,
) -> None:
    """Set, change or remove a container's QoE target while its manager runs."""
    from containers.errors import ContainerError, ScenarioError
    from containers.qoe.analyst import check_target
    from containers.qoe.control import change_target

    try:
        if (target_ms is None) == (not remove):
            raise ScenarioError("give either a target in ms or --remove")
        ms = None if target_ms is None else check_target(container, target_ms)
        reply = change_target(run or _latest_run(), container, ms)
    except ContainerError as err:
        _fail(err)
        return
    new = "removed" if reply["target_ms"] is None else f"{reply['target_ms']} ms"
    print(f"{reply['container']}: target {new}")


deploy_app = typer.Typer(no_args_is_help=True, help="Multi-container deployment schemes.")
app.add_typer(deploy_app, name="deploy")


@deploy_app.command("compare")
def deploy_compare(
    artifact: Annotated[Path, typer.Argument(help="artifact folder (or the run folder holding it)")],
    schemes: Annotated[str, typer.Option(help="KxT containers x threads, u = unpinned, comma-separated")] = "1x2,2x1,2x1u",
    duration: Annotated[float, typer.Option(help="seconds of load per scheme")] = 20.0,
    concurrency: Annotated[int, typer.Option(help="closed-loop clients (or, with --rate, most in flight)")] = 4,
    rate: Annotated[Optional[float], typer.Option(help="open loop: Poisson arrivals per second")] = None,
    batch: Annotated[int, typer.Option(help="items per request")] = 1,
    backend: Annotated[str, typer.Option(help="docker, local (cgroups) or auto")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="print the rows as JSON")] = False,
) -> None:
    """Serve one artifact under each scheme in turn, with the same load; print throughput and latency."""
    import os

    from containers.backends import create_backend
    from containers.deploy import Scheme, compare_schemes
    from containers.errors import ContainerError
    from containers.load import Poisson
    from containers.qoe.run import request_inputs
    from results.artifact import open_artifact
    from results.errors import ArtifactError

    try:
        art = open_artifact(artifact)
        parsed = [Scheme.parse(s, len(os.sched_getaffinity(0))) for s in schemes.split(",")]
        inputs = request_inputs(art.path, batch)
        engine = create_backend(backend)
        with _interruptible():
            try:
                rows = compare_schemes(engine, art.path, parsed, inputs, duration, concurrency,
                                       Poisson(rate) if rate else None)
            finally:
                engine.close()
    except (ContainerError, ArtifactError) as err:
        _fail(err)
        return
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"deployment schemes, {duration:.0f} s each, "
                        + (f"Poisson {rate}/s" if rate else f"{concurrency} closed-loop clients"))
    for col in ("scheme", "pinned", "requests", "failed", "items/s", "p50 ms", "p99 ms"):
        table.add_column(col, justify="left" if col == "scheme" else "right")
    for r in rows:
        table.add_row(r["scheme"], "yes" if r["pinned"] else "no", str(r["requests"]), str(r["failed"]),
                      f"{r['throughput_per_s']:,.1f}", str(r["p50_ms"]), str(r["p99_ms"]))
    Console().print(table)


@app.command()
def profile(
    artifact: Annotated[Path, typer.Argument(help="artifact folder (or the run folder holding it)")],
    configs: Annotated[str, typer.Option(help="container sizes in cores (CPU limit; pinned to as many cores)")] = "0.5,1,2",
    batch_sizes: Annotated[str, typer.Option(help="items per request to measure")] = "1,2,4,8",
    seconds: Annotated[float, typer.Option(help="seconds of closed-loop load per configuration")] = 5.0,
    backend: Annotated[str, typer.Option(help="docker, local (cgroups) or auto")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="print the new entries as JSON")] = False,
) -> None:
    """Measure latency and throughput in containers of each size and batch size; add them to profile.json."""
    from dataclasses import asdict

    from autotune.cli import _ints
    from autotune.errors import AutotuneError
    from containers.backends import create_backend
    from containers.errors import ContainerError
    from containers.profiling import ContainerSize, available_cores, merge_profile, profile_in_containers
    from results.artifact import open_artifact, rewrite_profile
    from results.errors import ArtifactError
    from results.profile import read_profile

    try:
        art = open_artifact(artifact)
        sizes = [ContainerSize.parse(c, available_cores()) for c in configs.split(",")]
        batches = _ints(batch_sizes, "--batch-sizes") or ()
        engine = create_backend(backend)
        with _interruptible():
            try:
                entries = profile_in_containers(engine, art.path, sizes, batches, seconds)
            finally:
                engine.close()
        rewrite_profile(art.path, merge_profile(read_profile(art.path / "profile.json"), entries))
    except (ContainerError, ArtifactError, AutotuneError) as err:
        _fail(err)
        return
    if as_json:
        print(json.dumps([asdict(e) for e in entries], indent=2))
        return
    table = Table(title=f"profile of {art.path} in {engine.kind} containers ({seconds:g} s per row)")
    for col in ("cores", "batch", "p50 ms", "p99 ms", "items/s"):
        table.add_column(col, justify="right")
    for e in entries:
        table.add_row(f"{e.hardware['cpu_limit']:g}", str(e.batch_size), f"{e.latency_ms.p50:.2f}",
                      f"{e.latency_ms.p99:.2f}", f"{e.throughput_per_s:,.1f}")
    Console().print(table)
    print(f"profile.json of {art.path} updated ({len(entries)} entries)")

"""The ``autotune`` command. Each command parses, calls one library function, and prints."""

from __future__ import annotations

import json
import re
import sys
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from autotune.errors import AutotuneError, UsageError
from autotune.policies import PolicySettings

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False, help="Tune PyTorch models with TVM MetaSchedule into verified artifacts.")
err_console = Console(stderr=True)
_POLICY = PolicySettings()  # the flags' defaults are the policies' own


def _ints(text: str | None, flag: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated integers like 1,3,224,224; got {text!r}") from None


def _fail(err: Exception) -> None:
    from results.errors import ArtifactError

    code = 2 if isinstance(err, ArtifactError) else getattr(err, "exit_code", 1)
    err_console.print(Text.assemble(("error:", "bold red"), f" {err}"), highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@app.command()
def tune(
    model: Annotated[str, typer.Argument(help="zoo:NAME, package.module:factory, or a torch.export file")],
    out: Annotated[Optional[Path], typer.Option(help="run folder (default runs/<model>); re-running resumes")] = None,
    target: Annotated[str, typer.Option(help="cpu (LLVM) or cuda")] = "cpu",
    threads: Annotated[Optional[int], typer.Option(help="CPU threads (default: all cores available)")] = None,
    trials: Annotated[Optional[int], typer.Option(help="total trial budget (default 32 per task)")] = None,
    time_limit: Annotated[Optional[float], typer.Option(help="stop tuning after this many seconds")] = None,
    batch_sizes: Annotated[Optional[str], typer.Option(help="batch sizes to compile, e.g. 1,8 (default B,4B)")] = None,
    input_shape: Annotated[Optional[str], typer.Option(help="override the input shape, e.g. 1,3,224,224")] = None,
    round_size: Annotated[Optional[int], typer.Option(help="candidates per task per round (default: a quarter of "
                                                            "the task's budget, 8 to 32)")] = None,
    guided_search: Annotated[bool, typer.Option(
        "--guided-search/--no-guided-search",
        help="hand a task's rounds to MetaSchedule's evolutionary search once the latency model ranks fresh "
             "candidates well; without it every directed round mutates the best measured schedules, which "
             "costs a quarter of the search CPU and, without the filter, found as good or better on a 2-core "
             "CPU (README, Search)")] = True,
    engine: Annotated[str, typer.Option(help="measurement engine: parallel (warm builds, device slots, DoP "
                                             "control) or stock (MetaSchedule's LocalBuilder and LocalRunner)")] = "parallel",
    devices: Annotated[Optional[str], typer.Option(help="where to time candidates: cpu, cuda:N, rpc:HOST:PORT:KEY, "
                                                        "comma-separated (default: every local device of the target)")] = None,
    dop: Annotated[str, typer.Option(help="degree of parallelism: auto (controller) or a fixed level, 0 = alone")] = "auto",
    tolerance: Annotated[float, typer.Option(help="max relative error against PyTorch")] = 1e-3,
    seed: Annotated[int, typer.Option(help="seed for weights, inputs and search")] = 0,
    filter: Annotated[bool, typer.Option("--filter/--no-filter", help="drop proposals the latency model says "
                                         "will not beat the task's best, before building them")] = True,
    filter_threshold: Annotated[float, typer.Option(help="keep proposals scored at least this (1.0 = as fast as "
                                                         "the task's best)")] = _POLICY.filter_threshold,
    filter_keep: Annotated[float, typer.Option(help="always measure at least this share of a round (best scores)")] = _POLICY.filter_keep,
    filter_explore: Annotated[float, typer.Option(help="share of a round drawn at random from what would be "
                                                       "dropped (exploration, and the drop-rate estimate)")] = _POLICY.filter_explore,
    filter_min_tau: Annotated[float, typer.Option(help="filter only while the model's recent rank correlation "
                                                       "(Kendall tau) is at least this")] = _POLICY.filter_min_tau,
    filter_trust_rounds: Annotated[int, typer.Option(help="filter only after this many rounds in a row in which it "
                                                           "would not have dropped a new best")] = _POLICY.filter_trust_rounds,
    filter_guided_pool: Annotated[float, typer.Option(help="a round of the model-guided search proposes this many "
                                                          "times the round, for the filter to choose from")] = _POLICY.filter_guided_pool,
    filter_guided_generations: Annotated[int, typer.Option(help="generations a round of the model-guided search "
                                                                "evolves (fewer: a cheaper round)")] = _POLICY.filter_guided_generations,
    filter_guided_population: Annotated[int, typer.Option(help="schedules a round of the model-guided search "
                                                               "evolves per candidate it brings (fewer: a cheaper "
                                                               "round)")] = _POLICY.filter_guided_population,
    preemption: Annotated[bool, typer.Option("--preemption/--no-preemption",
                                             help="stop tasks and the job when they stop improving")] = True,
    task_patience: Annotated[int, typer.Option(help="stop a task after this many proposals in a row without gain")] = _POLICY.task_patience,
    min_task_trials: Annotated[int, typer.Option(help="proposals a task gets before it can be stopped")] = _POLICY.min_task_trials,
    model_window: Annotated[int, typer.Option(help="stop the job after this many proposals per live task without "
                                                   "a gain in the estimated model latency")] = _POLICY.model_window,
    min_improvement: Annotated[float, typer.Option(help="a gain smaller than this share is no gain")] = _POLICY.min_improvement,
    patience_share: Annotated[float, typer.Option(help="task patience and model window are at least this share "
                                                       "of the budget (a task's; the live tasks' mean)")] = _POLICY.patience_share,
    solo_patience_share: Annotated[float, typer.Option(help="the same share in a job of one task, whose stop "
                                                            "hands no trials over")] = _POLICY.solo_patience_share,
    patience_counts: Annotated[str, typer.Option(help="what task patience and model window count: proposals, or "
                                                      "only measurements (a filtered search then waits as long in "
                                                      "what it learns from, and saves less)")] = _POLICY.patience_counts,
    warm_start: Annotated[Optional[list[Path]], typer.Option(
        help="start from an earlier job (repeatable): a saved latency model, or a tuning database, run folder or "
             "artifact, whose best schedules also lead each matching task's first round")] = None,
    watts_per_core: Annotated[float, typer.Option(help="power of a busy core, for the estimate where no energy "
                                                       "counter is readable")] = _POLICY.watts_per_core,
    price_per_hour: Annotated[Optional[float], typer.Option(help="price per device-hour: adds the job's cost "
                                                                 "to its bill")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the artifact path")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary for CI")] = False,
) -> None:
    """Tune MODEL and write a verified, compiled, profiled artifact."""
    from autotune.config import TuneConfig
    from autotune.pipeline import tune_model
    from autotune.progress import LiveProgress, SilentProgress

    try:
        config = TuneConfig(
            model=model, out_dir=out or Path("runs") / re.sub(r"[^A-Za-z0-9_.-]+", "_", model),
            target=target, threads=threads, trials=trials, time_limit_s=time_limit,
            batch_sizes=_ints(batch_sizes, "--batch-sizes"), input_shape=_ints(input_shape, "--input-shape"),
            round_size=round_size, guided_search=guided_search, engine=engine,
            devices=tuple(devices.split(",")) if devices else None, dop=dop,
            tolerance=tolerance, seed=seed,
            policies=PolicySettings(filter, filter_threshold, filter_keep, filter_explore, filter_min_tau,
                                    filter_trust_rounds, filter_guided_pool, filter_guided_generations,
                                    filter_guided_population, preemption, task_patience, min_task_trials,
                                    model_window, min_improvement, patience_share, solo_patience_share,
                                    patience_counts, watts_per_core, price_per_hour,
                                    tuple(str(p) for p in warm_start or ())),
        )
        observer = SilentProgress() if quiet or as_json else LiveProgress()
        outcome = tune_model(config, observer)
    except AutotuneError as err:
        _fail(err)
        return
    if as_json:
        print(json.dumps(outcome.summary(), indent=2))
    elif quiet:
        print(outcome.artifact)
    else:
        s = outcome.summary()
        eager = f", PyTorch eager {s['torch_eager_ms']:.3f} ms" if s["torch_eager_ms"] else ""
        print(f"tuned latency {s['tuned_ms']:.3f} ms (batch {s['batch_size']}, {s['threads']} threads){eager}")
        gpu_j = s["gpu_energy_j"]
        label = ("measured" if not s["energy_estimated"] else "estimated" if gpu_j is None
                 else f"GPU {gpu_j / 1000:.2f} kJ measured by NVML, CPU estimated")
        cost = f", cost {s['cost']:.4f}" if "cost" in s else ""
        print(f"tuning energy {s['energy_j'] / 1000:.2f} kJ ({label}), {s['device_s_measuring']:.1f} device-s measuring, "
              f"{s['screened']} proposals screened out{cost}")
        print(f"artifact written to {outcome.artifact}")


@app.command()
def run(
    artifact: Annotated[Path, typer.Argument(help="artifact folder (or the run folder holding it)")],
    input: Annotated[list[Path], typer.Option("--input", help=".npy file per model input, in order")],
    output: Annotated[Optional[Path], typer.Option(help="save the first output here (.npy)")] = None,
) -> None:
    """Run a saved artifact on inputs from .npy files."""
    from autotune.runner import run_artifact
    from results.errors import ArtifactError

    try:
        if output is not None:
            _check_output(output)
        outputs = run_artifact(artifact, input)
        if output is not None:
            _save_array(output, outputs[0])
    except (AutotuneError, ArtifactError) as err:
        _fail(err)
        return
    for i, o in enumerate(outputs):
        print(f"output {i}: shape {list(o.shape)} dtype {o.dtype} mean {float(o.mean()):.6g} first {o.ravel()[:4].tolist()}")


def _check_output(path: Path) -> None:
    if path.suffix != ".npy" or path.is_dir():
        raise UsageError(f"--output {path} is not usable; expected a .npy file name")
    if not path.parent.resolve().is_dir():
        raise UsageError(f"--output {path}: folder {path.parent} does not exist; expected an existing folder")


def _save_array(path: Path, array: object) -> None:
    """Write ``array`` to ``path`` whole or not at all."""
    import io

    import numpy as np

    from results.atomic import write_atomically

    buffer = io.BytesIO()
    np.save(buffer, array)
    try:
        write_atomically(path, buffer.getvalue())
    except OSError as err:
        raise UsageError(f"cannot write --output {path}: {err.strerror or err}; expected a writable .npy path") from None


@app.command()
def inspect(
    artifact: Annotated[Path, typer.Argument(help="artifact folder (or the run folder holding it)")],
    as_json: Annotated[bool, typer.Option("--json", help="print the manifest and profile as JSON")] = False,
) -> None:
    """Print an artifact's manifest and profile (after checking its hashes)."""
    from results.artifact import open_artifact
    from results.errors import ArtifactError

    try:
        art = open_artifact(artifact)
    except ArtifactError as err:
        _fail(err)
        return
    if as_json:
        print(json.dumps({"manifest": art.manifest, "profile": art.profile}, indent=2))
        return
    _print_artifact(art.manifest, art.profile)


def _print_artifact(manifest: dict, profile: dict) -> None:
    console = Console()
    m, t = manifest["model"], manifest["tuning"]
    console.print(f"[bold]{m['spec']}[/]  target {manifest['target']['kind']} on {manifest['target']['device']}  "
                  f"tvm {manifest['versions']['tvm']}  torch {manifest['versions']['torch']}")
    console.print("inputs: " + ", ".join(f"{i['name']} {i['shape']} {i['dtype']}" for i in m["inputs"])
                  + f"   batch sizes {m['batch_sizes']}")
    lat = manifest["latency"]
    eager = f"  PyTorch eager {lat['torch_eager_ms']:.3f} ms" if lat["torch_eager_ms"] else ""
    console.print(f"tuned {lat['tuned_ms']:.3f} ms at batch {lat['batch_size']}, {lat['threads']} threads{eager}")
    tasks = Table(title=f"tuning: {t['trials']} trials, {t['wall_s']:.0f} s, engine {t['engine']}")
    for col in ("task", "weight", "MFLOP", "trials", "best (us)"):
        tasks.add_column(col, justify="left" if col == "task" else "right")
    for task in t["tasks"]:
        best = "-" if task["best_us"] is None else f"{task['best_us']:.1f}"
        tasks.add_row(task["name"], str(task["weight"]), f"{task['flops'] / 1e6:.2f}", str(task["trials"]), best)
    console.print(tasks)
    prof = Table(title="profile")
    for col in ("threads", "batch", "p50 (ms)", "p99 (ms)", "items/s", "eager p50 (ms)"):
        prof.add_column(col, justify="right")
    for e in profile["entries"]:
        eager_p50 = e["torch_eager_latency_ms"]["p50"] if e["torch_eager_latency_ms"] else None
        prof.add_row(str(e["hardware"]["threads"]), str(e["batch_size"]), f"{e['latency_ms']['p50']:.3f}",
                     f"{e['latency_ms']['p99']:.3f}", f"{e['throughput_per_s']:,.0f}",
                     "-" if eager_p50 is None else f"{eager_p50:.3f}")
    console.print(prof)


measure_app = typer.Typer(no_args_is_help=True, help="The measurement engine: calibration.")
app.add_typer(measure_app, name="measure")


@measure_app.command()
def calibrate(
    kernel: Annotated[str, typer.Option(help="reference kernel whose random schedules are timed")] = "matmul512",
    candidates: Annotated[int, typer.Option(help="how many candidates to time at every level")] = 24,
    levels: Annotated[Optional[str], typer.Option(help="levels to try, e.g. 0,1,2 (default 0..max)")] = None,
    target: Annotated[str, typer.Option(help="cpu (LLVM) or cuda")] = "cpu",
    threads: Annotated[Optional[int], typer.Option(help="threads per candidate = cores per CPU slot")] = None,
    devices: Annotated[Optional[str], typer.Option(help="cpu, cuda:N, rpc:HOST:PORT:KEY, comma-separated")] = None,
    out: Annotated[Optional[Path], typer.Option(help="where to save the curve (default: the cache the engine reads)")] = None,
    seed: Annotated[int, typer.Option(help="seed for the candidates")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Time the same candidates alone and at each level; print error and throughput per level and save the curve."""
    from autotune.calibrate import run_calibration

    try:
        result, path = run_calibration(kernel, candidates, _ints(levels, "--levels"), target, threads,
                                       tuple(devices.split(",")) if devices else None, out, seed)
    except AutotuneError as err:
        _fail(err)
        return
    if as_json:
        print(json.dumps(result, indent=2))
        return
    table = Table(title=f"calibration: {result['valid']} candidates of {kernel}, error bound {result['error_bound']:.0%}")
    for col in ("level", "at once", "builds run", "mean error", "median error", "p90 error", "candidates/s"):
        table.add_column(col, justify="right")
    for p in result["curve"]:
        pct = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
        mark = " *" if p["level"] == result["chosen_level"] else ""
        table.add_row(f"{p['level']}{mark}", str(p["concurrency"]), "yes" if p["overlap_builds"] else "paused",
                      pct(p["error"]), pct(p["median_error"]), pct(p["p90_error"]), f"{p['candidates_per_s']:.2f}")
    Console().print(table)
    print(f"chosen level {result['chosen_level']} (*); saved to {path}")


from autotune import cli_serve  # noqa: E402,F401  (registers serve, qoe and deploy on ``app``)
from autotune import cli_plan  # noqa: E402,F401  (registers plan on ``app``)


def main() -> None:
    """Console-script entry point."""
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)  # torch's own deprecation noise
    app()


if __name__ == "__main__":
    sys.exit(main())

"""``tune_model``: a model in, a verified and profiled artifact out.

Every input is checked (model, target, shapes, output folder) before anything is
written; the tuning database under ``OUT/tuning`` grows as candidates are measured
and lets a re-run resume; the artifact appears at ``OUT/artifact`` only once
compiled, verified and profiled.
"""

from __future__ import annotations

import logging
import platform
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from autotune.budget import split_budget
from autotune.config import DEFAULT_TRIALS_PER_TASK, TuneConfig
from autotune.errors import UsageError
from autotune.policies import COST_MODEL_DIR, Policies, build_policies
from autotune.session import MEASUREMENTS_LOG, RANKED_DIR, SessionObserver, TaskState, TuningSession
from results.artifact import DATABASE_DIR, PROFILE, ArtifactWriter, library_name
from results.atomic import staged_folder
from results.profile import Profile
from results.report import plot_tuning_curve, read_measurements, write_summary


TUNING_DIR = "tuning"


PipelineObserver = SessionObserver


@dataclass(frozen=True)
class TuneOutcome:
    """Where the artifact is and the figures a person or CI wants first."""

    artifact: Path
    manifest: dict[str, Any]
    profile: Profile

    def summary(self) -> dict[str, Any]:
        """The one machine-readable summary ``--json`` prints."""
        t = self.manifest["tuning"]
        return {
            "artifact": str(self.artifact),
            "model": self.manifest["model"]["spec"],
            "target": self.manifest["target"]["kind"],
            "verified": True,
            "tasks": len(t["tasks"]),
            "trials": t["trials"],
            "new_trials": t["new_trials"],
            "wall_s": t["wall_s"],
            "budget_warning": t["budget_warning"],
            "screened": t["screened"],
            "stopped_early": t["policies"]["preemption"]["job_stopped"],
            "energy_j": t["energy"]["energy_j"],
            "energy_estimated": t["energy"]["estimated"],
            "gpu_energy_j": t["energy"].get("gpu_energy_j"),  # NVML's part; None on a CPU target
            "device_s_measuring": t["energy"]["device_s_measuring"],
            "wasted_share": _share(t["energy"]["wasted"]),
            **({"cost": t["energy"]["cost"]} if "cost" in t["energy"] else {}),
            **self.manifest["latency"],
            "max_relative_error": max(v["relative_error"] for v in self.manifest["verification"].values()),
        }


@dataclass(frozen=True)
class PreparedModel:
    """A model checked, exported and split into tasks: everything tuning needs, nothing written yet."""

    base_batch: int
    variants: dict[int, Any]
    relax_mods: dict[int, Any]
    target_spec: Any
    target: Any
    tasks: list[Any]
    plan: Any


def _share(wasted: dict[str, Any]) -> float | None:
    return round(wasted["measurements"] / wasted["of"], 3) if wasted["of"] else None


def tune_model(config: TuneConfig, observer: PipelineObserver) -> TuneOutcome:
    """Run the whole job described by ``config``; raises ``AutotuneError`` subclasses on failure."""
    started = time.monotonic()
    prepared = prepare_model(config, observer)
    session, database = _tune(config, prepared, observer)
    return _write_artifact(config, prepared, session, database, time.monotonic() - started, observer)


def prepare_model(config: TuneConfig, observer: PipelineObserver) -> PreparedModel:
    """Load, export and import the model at each batch size, and extract and budget its tasks."""
    from autotune.models.loader import export, load_model
    from autotune.target import resolve_target

    target_spec = resolve_target(config.target, config.threads)
    _check_devices(config, target_spec)
    observer.on_phase("loading model")
    model = load_model(config.model, seed=config.seed)
    if config.input_shape:
        model = model.with_shape(config.input_shape)
    base = int(model.inputs[0].shape[0])
    default_batches = (base,) if model.fixed_shapes else (base, 4 * base)
    observer.on_phase("exporting")
    variants = {b: model.with_batch(b) for b in sorted(set(config.batch_sizes or default_batches))}
    if base not in variants:  # --batch-sizes without the example's batch: the smallest asked for leads
        base = min(variants)
    programs = {b: export(v) for b, v in variants.items()}

    from measure.tvm_import import import_meta_schedule

    import_meta_schedule()
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    from autotune.frontend import prepare_for_tuning, to_relax
    from autotune.tasks import extract_tasks

    target = target_spec.tvm_target()
    relax_mods = {b: to_relax(p, config.model) for b, p in programs.items()}
    observer.on_phase("extracting tasks")
    tasks = extract_tasks([prepare_for_tuning(m, target) for m in relax_mods.values()], target)
    plan = split_budget(tasks, config.trials or DEFAULT_TRIALS_PER_TASK * len(tasks), config.trial_floor)
    return PreparedModel(base, variants, relax_mods, target_spec, target, tasks, plan)


def _check_devices(config: TuneConfig, target_spec: Any) -> None:
    """A requested device that is not there is a usage error before anything is loaded or written."""
    from measure.slots import DeviceNotFound, discover

    try:
        discover(config.devices, target_spec.kind, target_spec.num_cores)
    except DeviceNotFound as err:
        raise UsageError(str(err)) from None


def _tune(config: TuneConfig, prepared: PreparedModel, observer: PipelineObserver) -> tuple[TuningSession, Any]:
    from measure.slots import local_gpu_ids

    spec = prepared.target_spec
    gpus = local_gpu_ids(config.devices, spec.kind, spec.num_cores)
    warnings: list[str] = []
    observer.on_phase("starting the latency model")
    policies = build_policies(config.policies, prepared.target, spec.num_cores, config.seed, gpus, warnings.append)
    return run_tuning(prepared.tasks, prepared.plan, spec, prepared.target,
                      Path(config.out_dir) / TUNING_DIR, engine=config.engine, devices=config.devices, dop=config.dop,
                      round_size=config.round_size, time_limit_s=config.time_limit_s, seed=config.seed,
                      observer=observer, policies=policies, warnings=warnings, guided_search=config.guided_search)


def run_tuning(tasks: list[Any], plan: Any, target_spec: Any, target: Any, work_dir: Path, *,
               engine: Any = "parallel", devices: Sequence[str] | None = None, dop: str = "auto",
               round_size: int | None = None, time_limit_s: float | None = None, seed: int = 0,
               observer: PipelineObserver | None = None, policies: Policies | None = None,
               warnings: Sequence[str] = (), guided_search: bool = True) -> tuple[TuningSession, Any]:
    """Tune ``tasks`` under ``plan`` with a fresh engine; return the session and the ranked database.

    ``policies`` (default: none, a fresh latency model) brings the latency model, candidate filter,
    preemption and energy ledger. The trained latency model is saved under ``work_dir``.
    """
    from cost_models.latency_model import save_latency_model
    from measure.factory import create as create_engine

    policies = policies or Policies.off(target_spec.num_cores, seed)
    if observer:
        observer.on_phase("starting measurement engine")
    measurement = create_engine(engine, target_kind=target_spec.kind, threads=target_spec.num_cores,
                                devices=devices, dop=dop, seed=seed)
    session = TuningSession(
        states=[TaskState(t, plan.trials[t.name]) for t in tasks],
        target=target,
        device_type=target_spec.device_type,
        engine=measurement,
        cost_model=policies.latency_model,
        work_dir=str(work_dir),
        round_size=round_size,
        time_limit_s=time_limit_s,
        num_threads=target_spec.num_cores,
        seed=seed,
        observer=observer,
        warning="; ".join(w for w in (plan.warning, *warnings) if w) or None,
        candidate_filter=policies.candidate_filter,
        preemption=policies.preemption,
        energy=policies.energy,
        warm_databases=policies.warm_databases,
        guided_search=guided_search,
    )
    try:
        ranked = session.run()
    finally:
        measurement.close()
    with staged_folder(Path(work_dir) / COST_MODEL_DIR) as staging:
        save_latency_model(policies.latency_model, staging, target)
    return session, ranked


def _write_artifact(config: TuneConfig, prepared: PreparedModel, session: TuningSession, database: Any,
                    wall_s: float, observer: PipelineObserver) -> TuneOutcome:
    """Compile and verify every batch size, profile, and commit the artifact atomically."""
    from autotune.compiler import compile_to_library, verify_library
    from autotune.profiler import ProfileJob, profile_model

    spec, tuning_dir = prepared.target_spec, Path(config.out_dir) / TUNING_DIR
    with ArtifactWriter(Path(config.out_dir) / "artifact") as writer:
        libraries, verification = {}, {}
        for b, mod in prepared.relax_mods.items():
            observer.on_phase(f"compiling batch {b}")
            lib_path = writer.path / library_name(b)
            digest = compile_to_library(database, mod, prepared.target, lib_path)
            observer.on_phase(f"verifying batch {b}")
            check = verify_library(lib_path, digest, prepared.variants[b], spec.device(), config.tolerance)
            libraries[b] = (str(lib_path), digest)
            verification[str(b)] = {"max_abs_error": check.max_abs_error, "relative_error": check.relative_error,
                                    "tolerance": check.tolerance}
        observer.on_phase("profiling")
        threads = sorted({1, spec.num_cores}) if spec.kind == "llvm" else [spec.num_cores]
        job = ProfileJob(config.model, list(config.input_shape) if config.input_shape else None, libraries,
                         spec.kind, spec.device_name, config.profile_seconds)
        profile = profile_model(job, threads)
        profile.write(writer.path / PROFILE)
        shutil.copytree(tuning_dir / RANKED_DIR, writer.path / DATABASE_DIR, ignore=shutil.ignore_patterns("logs"))
        shutil.copytree(tuning_dir / COST_MODEL_DIR, writer.path / COST_MODEL_DIR)
        manifest = _manifest(config, prepared, session, verification, profile, wall_s)
        plot_tuning_curve(read_measurements(tuning_dir / MEASUREMENTS_LOG), {t.name: t.weight for t in prepared.tasks},
                          writer.path / "tuning_curve.png")
        write_summary(writer.path / "report.md", manifest, profile)
        observer.on_phase("writing artifact")
        path = writer.commit(manifest)
    return TuneOutcome(path, {"schema_version": 1, **manifest}, profile)


def _manifest(config: TuneConfig, prepared: PreparedModel, session: TuningSession, verification: dict[str, Any],
              profile: Profile, wall_s: float) -> dict[str, Any]:
    import torch
    import tvm

    base, target_spec = prepared.base_batch, prepared.target_spec
    primary, relax_mod = prepared.variants[base], prepared.relax_mods[base]

    with torch.inference_mode():
        outputs = primary.module(*primary.inputs)
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    names = [p.name for p in relax_mod["main"].params]
    full = max((e for e in profile.entries if e.batch_size == base), key=lambda e: e.hardware["threads"])
    eager = full.torch_eager_latency_ms
    return {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": {
            "spec": config.model,
            "inputs": [{"name": n, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
                       for n, t in zip(names, primary.inputs)],
            "outputs": [{"shape": list(o.shape), "dtype": str(o.dtype).removeprefix("torch.")} for o in outputs],
            "batch_sizes": sorted(int(b) for b in verification),
        },
        "target": target_spec.describe(),
        "versions": {"tvm": tvm.__version__, "torch": torch.__version__, "python": platform.python_version()},
        "libraries": {b: library_name(int(b)) for b in verification},
        "verification": verification,
        "tuning": {
            "engine": config.engine,
            "measurement": session.engine_report,
            "ranking": session.ranking,
            "trials": sum(s.trials for s in session.states),
            "new_trials": sum(s.trials - s.resumed for s in session.states),
            "budget": sum(s.budget for s in session.states),
            "budget_warning": session.warning,
            "screened": sum(s.screened for s in session.states),
            "wall_s": round(wall_s, 2),
            "policies": session.policies_report(),
            "energy": session.bill,
            "tasks": [{"name": s.task.name, "weight": s.task.weight, "flops": s.task.flops, "trials": s.trials,
                       "screened": s.screened, "stopped": s.stopped or None, "errors": s.errors,
                       "best_us": None if s.best_s == float("inf") else s.best_s * 1e6,
                       "wall_s": round(s.wall_s, 2)} for s in session.states],
        },
        "latency": {
            "batch_size": base,
            "threads": full.hardware["threads"],
            "tuned_ms": full.latency_ms.p50,
            "torch_eager_ms": eager.p50 if eager else None,
            "speedup_vs_torch": eager.p50 / full.latency_ms.p50 if eager else None,
        },
    }

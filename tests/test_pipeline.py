"""End to end: a real (small) tuning job, its artifact, resume, and stock TVM reading our database."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch

from autotune.models.loader import load_model
from autotune.pipeline import tune_model
from autotune.progress import SilentProgress
from autotune.runner import run_artifact
from results.artifact import open_artifact
from results.errors import ArtifactError
from results.profile import read_profile
from tests.conftest import SMALL_TRIALS, small_config


def test_artifact_is_written_verified_and_profiled(tuned_run):
    art = open_artifact(tuned_run.artifact)
    m = art.manifest
    assert set(m["files"]) >= {"model_b1.so", "profile.json", "report.md", "tuning_curve.png",
                               "database/database_tuning_record.json", "database/database_workload.json"}
    assert m["tuning"]["trials"] == SMALL_TRIALS and len(m["tuning"]["tasks"]) == 3
    assert all(t["trials"] >= 1 and t["best_us"] > 0 for t in m["tuning"]["tasks"])
    assert m["verification"]["1"]["relative_error"] <= m["verification"]["1"]["tolerance"]
    assert m["model"]["inputs"][0]["shape"] == [1, 784] and m["model"]["outputs"][0]["shape"] == [1, 10]
    profile = read_profile(art.path / "profile.json")
    assert {e.hardware["threads"] for e in profile.entries} >= {1}
    for e in profile.entries:
        assert 0 < e.latency_ms.min <= e.latency_ms.p50 <= e.latency_ms.p99
        assert e.torch_eager_latency_ms is not None and e.throughput_per_s > 0
    assert m["latency"]["tuned_ms"] > 0 and m["latency"]["torch_eager_ms"] > 0
    assert not list(tuned_run.artifact.parent.glob(".artifact.tmp-*")), "temporary folder left behind"


def test_run_matches_pytorch(tuned_run, tmp_path):
    model = load_model("zoo:mlp")
    x = np.random.default_rng(1).standard_normal((1, 784)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    (out,) = run_artifact(tuned_run.artifact, [tmp_path / "x.npy"])
    with torch.inference_mode():
        ref = model.module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_tampered_library_is_refused_before_loading(tuned_run, tmp_path):
    copy = shutil.copytree(tuned_run.artifact, tmp_path / "artifact")
    lib = copy / "model_b1.so"
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="model_b1.so has sha256"):
        open_artifact(copy)


def test_unlisted_file_is_refused(tuned_run, tmp_path):
    copy = shutil.copytree(tuned_run.artifact, tmp_path / "artifact")
    (copy / "extra.so").write_bytes(b"\x7fELF")
    with pytest.raises(ArtifactError, match="does not list: extra.so"):
        open_artifact(copy)


def _candidate_hashes(database_dir):
    import tvm_ffi
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    hashes = []
    for record in JSONDatabase(work_dir=str(database_dir)).get_all_tuning_records():
        sch = Schedule(record.workload.mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        hashes.append(tvm_ffi.structural_hash(sch.mod))
    return hashes


def test_resume_measures_nothing_known(tuned_run, tmp_path):
    run_dir = shutil.copytree(tuned_run.artifact.parent, tmp_path / "mlp")
    before = _candidate_hashes(run_dir / "tuning")
    again = tune_model(small_config(run_dir), SilentProgress())
    assert again.manifest["tuning"]["new_trials"] == 0
    assert _candidate_hashes(run_dir / "tuning") == before
    more = tune_model(small_config(run_dir, trials=SMALL_TRIALS + 3), SilentProgress())
    assert more.manifest["tuning"]["trials"] == SMALL_TRIALS + 3
    after = _candidate_hashes(run_dir / "tuning")
    assert len(after) == len(set(after)) == SMALL_TRIALS + 3, "a known candidate was measured twice"


@pytest.mark.parametrize("torn_bytes, records_lost", [(100, 1), (1, 0)])
def test_a_database_line_torn_by_a_kill_is_mended_before_the_database_is_opened(tuned_run, tmp_path, torn_bytes,
                                                                                records_lost):
    """TVM writes a record, then its newline: a kill in between, or inside the record, leaves a last line that
    makes the whole database unreadable (TVM refuses it). Part of a record is cut; a whole one gets its newline."""
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    from autotune.session import DATABASE_FILES, _mend_torn_line

    work = shutil.copytree(tuned_run.artifact.parent / "tuning", tmp_path / "tuning")
    records = work / DATABASE_FILES[1]
    whole = len(records.read_text().splitlines())
    with open(records, "rb+") as f:
        f.truncate(f.seek(0, os.SEEK_END) - torn_bytes)
    _mend_torn_line(str(records))
    assert len(JSONDatabase(work_dir=str(work)).get_all_tuning_records()) == whole - records_lost


def test_stock_tvm_compiles_with_saved_database(tuned_run):
    """Stock ``compile_relax`` with the artifact's database gives our library's outputs and speed."""
    import tvm
    from tvm import relax
    from tvm.s_tir.meta_schedule.database import JSONDatabase
    from tvm.s_tir.meta_schedule.relax_integration import compile_relax

    from autotune.frontend import to_relax
    from autotune.models.loader import export
    from autotune.target import resolve_target

    art = open_artifact(tuned_run.artifact)
    model = load_model("zoo:mlp")
    target = resolve_target("cpu").tvm_target()
    stock = compile_relax(JSONDatabase(work_dir=str(art.path / "database")), to_relax(export(model), "zoo:mlp"),
                          target, None)
    dev = tvm.cpu(0)
    ours_vm = relax.VirtualMachine(art.load_library(1), dev)
    stock_vm = relax.VirtualMachine(stock, dev)
    x = tvm.runtime.tensor(model.inputs[0].numpy(), dev)
    np.testing.assert_allclose(stock_vm["main"](x)[0].numpy(), ours_vm["main"](x)[0].numpy(), rtol=1e-6, atol=1e-6)
    ratios = []
    for _ in range(3):  # interleaved, median of three: the machine is shared and noisy
        t_ours = np.median(ours_vm.time_evaluator("main", dev, number=20, repeat=10)(x).results)
        t_stock = np.median(stock_vm.time_evaluator("main", dev, number=20, repeat=10)(x).results)
        ratios.append(t_stock / t_ours)
    assert 0.7 < float(np.median(ratios)) < 1.4


def test_failed_run_leaves_no_artifact(tmp_path, monkeypatch):
    """A verification failure after compiling must leave neither an artifact nor a temporary folder."""
    from autotune import compiler
    from autotune.errors import VerificationError

    def failing_verify(*args, **kwargs):
        raise VerificationError("forced")

    monkeypatch.setattr(compiler, "verify_library", failing_verify)
    with pytest.raises(VerificationError):
        tune_model(small_config(tmp_path / "run", trials=3), SilentProgress())
    assert not (tmp_path / "run" / "artifact").exists()
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["tuning"]


@pytest.mark.slow
def test_batch_sizes_without_the_example_batch(tmp_path):
    """--batch-sizes 3 for a model whose example batch is 1: batch 3 leads the manifest and serves."""
    config = replace(small_config(tmp_path / "b3"), batch_sizes=(3,))
    outcome = tune_model(config, SilentProgress())
    assert outcome.manifest["model"]["batch_sizes"] == [3] and outcome.manifest["latency"]["batch_size"] == 3
    assert outcome.manifest["model"]["inputs"][0]["shape"] == [3, 784]

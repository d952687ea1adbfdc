"""Bad input: one clear line on stderr, exit code 2, nothing written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def autotune(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "autotune.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=600)


def assert_usage_error(proc: subprocess.CompletedProcess, *phrases: str) -> None:
    assert proc.returncode == 2, proc.stderr
    message = proc.stderr.strip().splitlines()[-1]
    assert message.startswith("error:"), proc.stderr
    for phrase in phrases:
        assert phrase in message, message


@pytest.mark.parametrize(
    ("args", "phrases"),
    [
        (["zoo:nope"], ["unknown zoo model 'nope'", "resnet18"]),
        (["no_such_pkg.mod:factory"], ["cannot import factory 'no_such_pkg.mod:factory'"]),
        (["tests.factories:raising"], ["factory 'tests.factories:raising' raised RuntimeError", "weights file not found"]),
        (["tests.factories:not_a_model"], ["must return (nn.Module, example inputs)"]),
        (["tests.factories:untraceable"], ["torch.export cannot export tests.factories:untraceable", "factories.py:"]),
        (["zoo:mlp", "--target", "tpu"], ["unknown target 'tpu'"]),
        (["zoo:mlp", "--target", "cuda"], ["no CUDA GPU is present"]),
        (["zoo:mlp", "--trials", "0"], ["trials must be a positive number; got 0"]),
        (["zoo:mlp", "--trials", "-5"], ["trials must be a positive number; got -5"]),
        (["zoo:mlp", "--trials", "2"], ["--trials 2 is fewer than the model's"]),
        (["zoo:mlp", "--batch-sizes", "1,x"], ["--batch-sizes must be comma-separated integers"]),
        (["zoo:mlp", "--engine", "fast"], ["--engine must be one of parallel, stock; got 'fast'"]),
        (["zoo:mlp", "--dop", "many"], ["--dop must be auto or a level"]),
        (["zoo:mlp", "--devices", "tpu:0"], ["unknown device 'tpu:0'", "expected cpu, cuda:N or rpc:HOST:PORT:KEY"]),
        (["zoo:mlp", "--devices", "cuda:3"], ["needs --target cuda"]),
        (["zoo:mlp", "--devices", "rpc:127.0.0.1:9:board"], ["no RPC tracker at 127.0.0.1:9"]),
        (["zoo:mlp", "--filter-threshold", "5"], ["--filter-threshold must be between 0 and 2; got 5.0"]),
        (["zoo:mlp", "--filter-explore", "1.5"], ["--filter-explore must be between 0 and 1; got 1.5"]),
        (["zoo:mlp", "--task-patience", "-1"], ["--task-patience must be an integer of at least 1; got -1"]),
        (["zoo:mlp", "--model-window", "0"], ["--model-window must be an integer of at least 1; got 0"]),
        (["zoo:mlp", "--patience-share", "1"], ["--patience-share must be between 0 and 1; got 1.0"]),
        (["zoo:mlp", "--patience-counts", "rounds"],
         ["--patience-counts must be one of proposals, measurements; got 'rounds'"]),
        (["zoo:mlp", "--price-per-hour", "-2"], ["--price-per-hour must be zero or more; got -2.0"]),
        (["zoo:mlp", "--warm-start", "/nonexistent/run"], ["--warm-start /nonexistent/run does not exist"]),
        (["zoo:mlp", "--seed", "-1"], ["--seed must be a whole number from 0 to 4294967295; got -1"]),
        (["zoo:mlp", "--seed", str(2**64)], ["--seed must be a whole number from 0 to 4294967295"]),
    ],
)
def test_bad_tune_input(args, phrases, tmp_path):
    if args[1:3] == ["--target", "cuda"]:
        import tvm

        if tvm.cuda(0).exist:
            pytest.skip("a CUDA GPU is present: the absent-GPU error cannot happen here")
    proc = autotune("tune", *args, "--out", str(tmp_path / "out"), cwd=ROOT)
    assert_usage_error(proc, *phrases)
    assert not (tmp_path / "out").exists(), "bad input must write nothing"


def test_corrupt_saved_program(tmp_path):
    bad = tmp_path / "model.pt2"
    bad.write_bytes(os.urandom(2048))
    proc = autotune("tune", str(bad), "--out", str(tmp_path / "out"), cwd=ROOT)
    assert_usage_error(proc, f"cannot read saved program '{bad}'")
    assert not (tmp_path / "out").exists()


def test_unwritable_output_folder(tmp_path):
    proc = autotune("tune", "zoo:mlp", "--out", "/proc/autotune-out", cwd=ROOT)
    assert_usage_error(proc, "output folder /proc/autotune-out is not writable")


def test_output_folder_that_is_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    proc = autotune("tune", "zoo:mlp", "--out", str(tmp_path / "file" / "out"), cwd=ROOT)
    assert_usage_error(proc, "is a file")


def test_artifact_hash_mismatch(tuned_run, tmp_path):
    copy = shutil.copytree(tuned_run.artifact, tmp_path / "artifact")
    (copy / "profile.json").write_text("{}")
    for command in (["inspect", str(copy)], ["run", str(copy), "--input", str(tmp_path / "x.npy")]):
        assert_usage_error(autotune(*command, cwd=ROOT), "profile.json has sha256", "refusing to load it")


def test_inspect_and_run_a_good_artifact(tuned_run, tmp_path):
    import numpy as np

    np.save(tmp_path / "x.npy", np.zeros((1, 784), dtype="float32"))
    shown = autotune("inspect", str(tuned_run.artifact), cwd=ROOT)
    assert shown.returncode == 0 and "zoo:mlp" in shown.stdout and "p99 (ms)" in shown.stdout
    ran = autotune("run", str(tuned_run.artifact), "--input", str(tmp_path / "x.npy"), cwd=ROOT)
    assert ran.returncode == 0 and "output 0: shape [1, 10]" in ran.stdout
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((1, 5), dtype="float32"))
    assert_usage_error(autotune("run", str(tuned_run.artifact), "--input", str(wrong), cwd=ROOT), "expected [batch, 784]")
    saved = autotune("run", str(tuned_run.artifact), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy"),
                     cwd=ROOT)
    assert saved.returncode == 0 and np.load(tmp_path / "y.npy").shape == (1, 10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wrong.npy", "x.npy", "y.npy"], "no temporary file left"
    for output, phrase in ((tmp_path, "expected a .npy file name"), (tmp_path / "out.txt", "expected a .npy file name"),
                           (tmp_path / "no" / "y.npy", "does not exist")):
        assert_usage_error(autotune("run", str(tuned_run.artifact), "--input", str(tmp_path / "x.npy"),
                                    "--output", str(output), cwd=ROOT), phrase)
    assert not (tmp_path.parent / f"{tmp_path.name}.npy").exists()


@pytest.mark.parametrize(
    ("args", "phrases"),
    [
        (["--kernel", "fft"], ["--kernel must be one of matmul512"]),
        (["--candidates", "2"], ["--candidates must be at least 4; got 2"]),
        (["--levels", "0,-1"], ["--levels must be levels 0, 1, 2"]),
        (["--devices", "cuda:0"], ["needs --target cuda"]),
    ],
)
def test_bad_calibrate_input(args, phrases, tmp_path):
    proc = autotune("measure", "calibrate", *args, "--out", str(tmp_path / "curve.json"), cwd=ROOT)
    assert_usage_error(proc, *phrases)
    assert not (tmp_path / "curve.json").exists()

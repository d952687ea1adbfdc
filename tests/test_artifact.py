"""Artifacts are written atomically and whole, and opened only when every file is what the manifest says."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from results.artifact import ArtifactWriter, open_artifact
from results.atomic import current_umask, staged_folder, write_atomically
from results.errors import ArtifactError


def _write(final, text: str) -> None:
    with ArtifactWriter(final) as w:
        (w.path / "profile.json").write_text(text)
        (w.path / "model_b1.so").write_bytes(b"lib")
        w.commit({"libraries": {"1": "model_b1.so"}})


def test_commit_replaces_old_artifact(tmp_path):
    final = tmp_path / "artifact"
    _write(final, '{"v": 1}')
    _write(final, '{"v": 2}')
    art = open_artifact(tmp_path)
    assert art.profile == {"v": 2} and art.batch_sizes == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]


def test_error_before_commit_leaves_nothing(tmp_path):
    final = tmp_path / "artifact"
    with pytest.raises(RuntimeError):
        with ArtifactWriter(final) as w:
            (w.path / "model_b1.so").write_bytes(b"half")
            raise RuntimeError("compile failed")
    assert list(tmp_path.iterdir()) == []


def test_artifact_folders_take_the_umask_not_owner_only(tmp_path):
    """A server in a container runs as another user and must be able to read (and so verify) every file."""
    old = os.umask(0o022)
    try:
        with ArtifactWriter(tmp_path / "artifact") as w:
            model = Path(tempfile.mkdtemp(dir=w.path))  # as the saved latency model's folder is made
            (model / "booster.json").write_text("{}")
            (w.path / "model_b1.so").write_bytes(b"lib")
            w.commit({"libraries": {"1": "model_b1.so"}})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "artifact").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "artifact" / model.name).stat().st_mode) == 0o755


def test_a_killed_writers_temporary_folder_is_swept(tmp_path):
    abandoned = tmp_path / ".artifact.tmp-killed"
    abandoned.mkdir()
    (abandoned / "model_b1.so").write_bytes(b"half")
    writing = ArtifactWriter(tmp_path / "artifact")  # another writer, still at work
    _write(tmp_path / "artifact", "{}")
    assert not abandoned.exists() and writing.path.exists()
    with writing:
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]


def _outside_copy(final: Path) -> Path:
    outside = final.parent / "outside"
    outside.mkdir(exist_ok=True)
    return Path(shutil.copy(final / "model_b1.so", outside / "model_b1.so"))


def _library_elsewhere(name: Callable[[Path, Path], str]) -> Callable[[Path, dict], None]:
    """Move the library out of the artifact and point the manifest at it under ``name(final, copy)``."""
    def change(final: Path, manifest: dict) -> None:
        copy = _outside_copy(final)
        (final / "model_b1.so").unlink()
        manifest["files"][name(final, copy)] = manifest["files"].pop("model_b1.so")
        manifest["libraries"]["1"] = name(final, copy)
    return change


def _symlinked_library(final: Path, manifest: dict) -> None:
    copy = _outside_copy(final)
    (final / "model_b1.so").unlink()
    (final / "model_b1.so").symlink_to(copy)


def _symlinked_folder(final: Path, manifest: dict) -> None:
    copy = _outside_copy(final)
    (final / "model_b1.so").unlink()
    (final / "libs").symlink_to(copy.parent, target_is_directory=True)
    manifest["files"]["libs/model_b1.so"] = manifest["files"].pop("model_b1.so")
    manifest["libraries"]["1"] = "libs/model_b1.so"


@pytest.mark.parametrize(("change", "phrase"), [
    (_library_elsewhere(lambda final, copy: str(copy)), "outside the artifact"),
    (_library_elsewhere(lambda final, copy: f"../{copy.parent.name}/{copy.name}"), "outside the artifact"),
    (_symlinked_folder, "outside the artifact"),
    (_symlinked_library, "outside the artifact"),
    (lambda final, manifest: manifest["libraries"].update({"2": "model_b2.so"}), "which its 'files' does not list"),
    (lambda final, manifest: manifest.pop("files"), "no 'files' object"),
    (lambda final, manifest: manifest["libraries"].update({"x": "model_b1.so"}), "batch size 'x'"),
])
def test_a_manifest_that_points_elsewhere_is_refused(tmp_path, change, phrase):
    """Native code is loaded only from the artifact's own regular files, each as hashed."""
    final = tmp_path / "artifact"
    _write(final, "{}")
    manifest = json.loads((final / "manifest.json").read_text())
    change(final, manifest)
    (final / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=phrase):
        open_artifact(final)


def test_a_link_is_refused_even_to_the_right_bytes(tmp_path):
    from results.integrity import check_hash, sha256_of

    (tmp_path / "model.so").write_bytes(b"lib")
    (tmp_path / "link.so").symlink_to(tmp_path / "model.so")
    with pytest.raises(ArtifactError, match="is a symbolic link"):
        check_hash(tmp_path / "link.so", sha256_of(tmp_path / "model.so"))


def test_a_manifest_that_is_not_an_object_is_refused(tmp_path):
    _write(tmp_path / "artifact", "{}")
    (tmp_path / "artifact" / "manifest.json").write_text("[]")
    with pytest.raises(ArtifactError, match="holds a JSON list; expected an object"):
        open_artifact(tmp_path / "artifact")


def test_an_artifact_without_a_profile_says_so(tmp_path):
    with ArtifactWriter(tmp_path / "artifact") as w:
        (w.path / "model_b1.so").write_bytes(b"lib")
        w.commit({"libraries": {"1": "model_b1.so"}})
    with pytest.raises(ArtifactError, match="has no profile.json"):
        open_artifact(tmp_path / "artifact").profile


def test_a_torn_log_line_is_cut_and_the_next_run_s_records_survive(tmp_path):
    """A job killed mid-write leaves a partial line; the next run's records and the report survive it."""
    from autotune.session import _mend_torn_line
    from results.report import plot_tuning_curve, read_measurements

    log = tmp_path / "measurements.jsonl"
    first = {"task": "dense", "trial": 1, "latency_s": 2e-3}
    log.write_text(json.dumps(first) + "\n" + '{"task": "dense", "tri')
    _mend_torn_line(str(log))
    assert log.read_text() == json.dumps(first) + "\n"
    with open(log, "a", encoding="utf-8") as f:
        f.write(json.dumps({"task": "dense", "trial": 2, "latency_s": 1e-3}) + "\n")
        f.write(json.dumps({"task": "conv_of_an_earlier_shape", "trial": 1, "latency_s": 5e-3}) + "\n")
    records = read_measurements(log)
    assert [r["trial"] for r in records] == [1, 2, 1]
    plot_tuning_curve(records, {"dense": 1}, tmp_path / "curve.png")  # a task this model no longer has is left out
    assert (tmp_path / "curve.png").stat().st_size > 0


def test_an_atomic_write_that_fails_keeps_the_old_file_and_leaves_no_partial(tmp_path, monkeypatch):
    path = tmp_path / "progress.json"
    write_atomically(path, "old")
    write_atomically(path, b"\x00new")
    assert path.read_bytes() == b"\x00new"

    def full_disk(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_atomically(path, "lost")
    assert path.read_bytes() == b"\x00new"
    assert os.listdir(tmp_path) == ["progress.json"]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_an_atomic_write_gets_the_mode_a_plain_open_would(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        write_atomically(tmp_path / "y.npy", b"data")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "y.npy").stat().st_mode) == mode


def test_an_atomic_write_keeps_the_mode_of_the_file_it_replaces(tmp_path):
    path = tmp_path / "preds.npy"
    path.write_bytes(b"old")
    path.chmod(0o600)  # made private on purpose
    write_atomically(path, b"new")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_bytes() == b"new"


def test_a_staged_folder_replaces_the_old_one_whole_or_not_at_all(tmp_path):
    """A saved latency model or ranked database is swapped in complete; a failure keeps the old one; the
    folders of killed writers are swept, as an artifact's are."""
    import fcntl

    final = tmp_path / "cost_model"
    with staged_folder(final) as staging:
        (staging / "meta.json").write_text("old")
    assert stat.S_IMODE(final.stat().st_mode) == 0o777 & ~current_umask()
    with pytest.raises(RuntimeError), staged_folder(final) as staging:
        (staging / "meta.json").write_text("half")
        raise RuntimeError("killed mid-save")
    assert os.listdir(final) == ["meta.json"] and (final / "meta.json").read_text() == "old"
    killed, filling = tmp_path / ".cost_model.tmp-killed", tmp_path / ".cost_model.tmp-filling"
    killed.mkdir(), filling.mkdir()
    held = os.open(filling, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        with staged_folder(final) as staging:
            (staging / "data.npz").write_text("new")
    finally:
        os.close(held)
    assert os.listdir(final) == ["data.npz"]
    assert sorted(os.listdir(tmp_path)) == sorted(["cost_model", filling.name])

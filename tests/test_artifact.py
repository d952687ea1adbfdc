"""Artifact writing is atomic and replaces an older artifact whole."""

from __future__ import annotations

import pytest

from results.artifact import ArtifactWriter, open_artifact


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

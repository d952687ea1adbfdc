"""The artifact: one folder per run holding a verified, compiled model and how it was made.

Layout (all paths relative to the artifact folder)::

    manifest.json          what is here: model, shapes, target, versions, tuning summary, sha256 of every file
    model_b{N}.so          the compiled Relax VM library for batch size N (one per batch size)
    database/              the MetaSchedule JSONDatabase (stock ``JSONDatabase(work_dir=...)`` reads it)
    profile.json           measured latency and throughput (see ``results.profile``)
    report.md, tuning_curve.png

An artifact is written into a hidden sibling folder and renamed into place only when
complete; opening one checks every hash before any native code can be loaded.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from results.errors import ArtifactError
from results.integrity import check_hash, load_verified_library, sha256_of

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
PROFILE = "profile.json"
DATABASE_DIR = "database"


def library_name(batch_size: int) -> str:
    return f"model_b{batch_size}.so"


class ArtifactWriter:
    """Collects an artifact's files in a temporary folder; ``commit`` hashes them and moves the folder into place.

    Leaving the ``with`` block without committing (an error) removes the temporary folder,
    so a failed run leaves no half-made artifact behind and an earlier artifact untouched.
    """

    def __init__(self, final_dir: str | Path) -> None:
        self.final_dir = Path(final_dir)
        self.final_dir.parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix=f".{self.final_dir.name}.tmp-", dir=self.final_dir.parent))

    def __enter__(self) -> ArtifactWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def commit(self, manifest: dict[str, Any]) -> Path:
        """Write the manifest with every file's sha256 and atomically replace ``final_dir``."""
        files = sorted(p for p in self.path.rglob("*") if p.is_file())
        manifest = {"schema_version": SCHEMA_VERSION, **manifest}
        manifest["files"] = {str(p.relative_to(self.path)): sha256_of(p) for p in files}
        with open(self.path / MANIFEST, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2)
        old = None
        if self.final_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{self.final_dir.name}.old-", dir=self.final_dir.parent))
            os.replace(self.final_dir, old / "artifact")
        os.replace(self.path, self.final_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.final_dir


@dataclass(frozen=True)
class Artifact:
    """An opened artifact whose files all matched their manifest hashes when opened."""

    path: Path
    manifest: dict[str, Any]

    @property
    def batch_sizes(self) -> list[int]:
        return sorted(int(b) for b in self.manifest["libraries"])

    @property
    def profile(self) -> dict[str, Any]:
        with open(self.path / PROFILE, encoding="utf-8") as f:
            return json.load(f)

    def load_library(self, batch_size: int) -> Any:
        """The compiled library for ``batch_size``, re-hashed immediately before it is loaded."""
        name = self.manifest["libraries"].get(str(batch_size))
        if name is None:
            raise ArtifactError(f"artifact {self.path} has no library for batch size {batch_size}; it has {self.batch_sizes}")
        return load_verified_library(self.path / name, self.manifest["files"][name])


def rewrite_profile(path: str | Path, profile: Any) -> Path:
    """Replace an artifact's ``profile.json`` (a ``results.profile.Profile``) and re-hash it.

    The artifact is verified first, copied to a temporary sibling, given the new profile and
    a manifest with fresh hashes, and renamed into place: a reader never sees a profile
    that its manifest does not vouch for.
    """
    artifact = open_artifact(path)
    with ArtifactWriter(artifact.path) as writer:
        for name in artifact.manifest["files"]:
            (writer.path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(artifact.path / name, writer.path / name)
        profile.write(writer.path / PROFILE)
        manifest = {k: v for k, v in artifact.manifest.items() if k not in ("schema_version", "files")}
        return writer.commit(manifest)


def open_artifact(path: str | Path) -> Artifact:
    """Open and verify an artifact folder (or a run folder holding ``artifact/``).

    Raises:
        ArtifactError: no manifest, an unknown schema version, or a file missing or altered.
    """
    path = Path(path)
    if not (path / MANIFEST).is_file() and (path / "artifact" / MANIFEST).is_file():
        path = path / "artifact"
    try:
        with open(path / MANIFEST, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ArtifactError(f"{path} is not an artifact: it has no {MANIFEST}") from None
    except (OSError, json.JSONDecodeError) as err:
        raise ArtifactError(f"cannot read {path / MANIFEST}: {err}") from None
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise ArtifactError(f"{path / MANIFEST} has schema_version {manifest.get('schema_version')!r}; expected {SCHEMA_VERSION}")
    on_disk = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()} - {MANIFEST}
    unlisted = sorted(on_disk - set(manifest["files"]))
    if unlisted:
        raise ArtifactError(f"artifact {path} holds files its manifest does not list: {', '.join(unlisted)}")
    for name, digest in manifest["files"].items():
        check_hash(path / name, digest)
    return Artifact(path, manifest)

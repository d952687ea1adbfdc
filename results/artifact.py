"""The artifact: one folder per run holding a verified, compiled model and how it was made.

Layout (all paths relative to the artifact folder)::

    manifest.json          what is here: model, shapes, target, versions, tuning summary, sha256 of every file
    model_b{N}.so          the compiled Relax VM library for batch size N (one per batch size)
    database/              the MetaSchedule JSONDatabase (stock ``JSONDatabase(work_dir=...)`` reads it)
    profile.json           measured latency and throughput (see ``results.profile``)
    report.md, tuning_curve.png

An artifact is written into a hidden sibling folder and swapped into place only when
complete. Opening one checks that the manifest names only the folder's own files and every
hash, before any native code can be loaded; a library is then loaded from a private copy of
the very bytes that matched (``results.integrity``).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from results.atomic import claim_staging, current_umask, swap_into_place
from results.errors import ArtifactError
from results.integrity import check_hash, load_verified_library, sha256_of, verified_bytes

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
    The writer holds a lock on its folder while it lives: a temporary folder that nobody
    holds was left by a writer that was killed, and the next writer of the artifact removes it.
    """

    def __init__(self, final_dir: str | Path) -> None:
        self.final_dir = Path(final_dir)
        self.path, self._lock = claim_staging(self.final_dir)

    def __enter__(self) -> ArtifactWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock)

    def commit(self, manifest: dict[str, Any]) -> Path:
        """Write the manifest with every file's sha256 and atomically replace ``final_dir``.

        The folder and every folder in it take the permissions the umask gives a new folder
        (``mkdtemp`` made this one owner-only, and a saved latency model's was too), so a server
        running as another user can read, and so verify, every file the manifest lists.
        """
        entries = list(self.path.rglob("*"))
        files = sorted(p for p in entries if p.is_file())
        manifest = {"schema_version": SCHEMA_VERSION, **manifest}
        manifest["files"] = {str(p.relative_to(self.path)): sha256_of(p) for p in files}
        with open(self.path / MANIFEST, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2)
        mode = 0o777 & ~current_umask()
        for folder in [self.path, *(p for p in entries if p.is_dir() and not p.is_symlink())]:
            os.chmod(folder, mode)
        swap_into_place(self.path, self.final_dir)  # an old artifact is now at self.path, removed on exit
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
        if PROFILE not in self.manifest["files"]:
            raise ArtifactError(f"artifact {self.path} has no {PROFILE}; profile it first (autotune profile)")
        return json.loads(verified_bytes(self.path / PROFILE, self.manifest["files"][PROFILE]))

    def load_library(self, batch_size: int) -> Any:
        """The compiled library for ``batch_size``: the bytes that match the manifest, loaded from a private copy."""
        name = self.manifest["libraries"].get(str(batch_size))
        if name is None:
            raise ArtifactError(f"artifact {self.path} has no library for batch size {batch_size}; it has {self.batch_sizes}")
        return load_verified_library(self.path / name, self.manifest["files"][name])


def rewrite_profile(path: str | Path, profile: Any) -> Path:
    """Replace an artifact's ``profile.json`` (a ``results.profile.Profile``) and re-hash it.

    The artifact is verified first and each file is copied as the bytes that matched its
    hash, to a temporary sibling that gets the new profile and a manifest with fresh hashes
    and is renamed into place: a reader never sees a profile that its manifest does not
    vouch for, and a file changed after the check is refused rather than vouched for.
    """
    artifact = open_artifact(path)
    with ArtifactWriter(artifact.path) as writer:
        for name, digest in artifact.manifest["files"].items():
            (writer.path / name).parent.mkdir(parents=True, exist_ok=True)
            (writer.path / name).write_bytes(verified_bytes(artifact.path / name, digest))
        profile.write(writer.path / PROFILE)
        manifest = {k: v for k, v in artifact.manifest.items() if k not in ("schema_version", "files")}
        return writer.commit(manifest)


def open_artifact(path: str | Path) -> Artifact:
    """Open and verify an artifact folder (or a run folder holding ``artifact/``).

    Raises:
        ArtifactError: no manifest, an unknown schema version, a manifest that is not one,
            a file missing, altered, a link, outside the folder or not listed.
    """
    path = Path(path)
    if not (path / MANIFEST).is_file() and (path / "artifact" / MANIFEST).is_file():
        path = path / "artifact"
    try:
        with open(path / MANIFEST, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ArtifactError(f"{path} is not an artifact: it has no {MANIFEST}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ArtifactError(f"cannot read {path / MANIFEST}: {err}") from None
    _check_manifest(path, manifest)
    on_disk = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() or p.is_symlink()} - {MANIFEST}
    unlisted = sorted(on_disk - set(manifest["files"]))
    if unlisted:
        raise ArtifactError(f"artifact {path} holds files its manifest does not list: {', '.join(unlisted)}")
    for name, digest in manifest["files"].items():
        check_hash(path / name, digest)
    return Artifact(path, manifest)


def _check_manifest(path: Path, manifest: Any) -> None:
    """The manifest's shape, and that every name it lists stays inside the artifact folder."""
    where = path / MANIFEST
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{where} holds a JSON {type(manifest).__name__}; expected an object (an artifact manifest)")
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise ArtifactError(f"{where} has schema_version {manifest.get('schema_version')!r}; expected {SCHEMA_VERSION}")
    files, libraries = manifest.get("files"), manifest.get("libraries")
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise ArtifactError(f"{where} has no 'files' object of file name to sha256; expected one listing every file")
    if not isinstance(libraries, dict) or not all(isinstance(v, str) for v in libraries.values()):
        raise ArtifactError(f"{where} has no 'libraries' object of batch size to library file; expected one")
    root = path.resolve()
    for name in files:
        relative = Path(name)
        if relative.is_absolute() or ".." in relative.parts or not (path / relative).resolve().is_relative_to(root):
            raise ArtifactError(f"{where} lists {name!r}, which is outside the artifact; expected names relative to its folder")
    for batch, name in libraries.items():
        if not batch.isdigit() or int(batch) < 1:
            raise ArtifactError(f"{where} has a library for batch size {batch!r}; expected a whole number of at least 1")
        if name not in files:
            raise ArtifactError(f"{where} names library {name!r} for batch size {batch}, which its 'files' does not list")

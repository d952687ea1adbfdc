"""Profiles measured in real containers, and the artifact's profile rewritten under its manifest's hashes."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from containers.errors import ScenarioError
from containers.profiling import ContainerSize, merge_profile, profile_in_containers
from results.artifact import open_artifact, rewrite_profile
from results.errors import ArtifactError
from results.profile import LatencyStats, ProfileEntry, read_profile


def _copy(artifact: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(artifact, tmp_path / "artifact"))


def _entry(cpus: float, batch: int, ms: float) -> ProfileEntry:
    return ProfileEntry({"kind": "cpu", "device": "x", "threads": 1, "cores": [0], "cpu_limit": cpus}, batch,
                        LatencyStats(ms, ms * 2, ms, ms / 2), batch / ms * 1e3, 10)


def test_container_sizes_parse_and_refuse_what_this_machine_cannot_give() -> None:
    assert ContainerSize.parse("0.5", [0, 1]) == ContainerSize(0.5, (0,))
    assert ContainerSize.parse("2", [0, 1]).threads == 2
    for text, message in [("lots", "not a number of cores"), ("0", "above 0"), ("3", "at most the 2 cores")]:
        with pytest.raises(ScenarioError, match=message):
            ContainerSize.parse(text, [0, 1])


def test_rewritten_profile_is_vouched_for_by_the_manifest(tuned_run, tmp_path: Path) -> None:
    path = _copy(tuned_run.artifact, tmp_path)
    old = read_profile(path / "profile.json")
    merged = merge_profile(old, [_entry(0.5, 1, 3.0), _entry(1.0, 1, 1.5)])
    merged = merge_profile(merged, [_entry(0.5, 1, 2.5)])  # the same size and batch replaces, not duplicates
    rewrite_profile(path, merged)
    art = open_artifact(path)  # every hash checks out, the new profile.json included
    limits = [(e["hardware"].get("cpu_limit"), e["latency_ms"]["p50"]) for e in art.profile["entries"]]
    assert (0.5, 2.5) in limits and (1.0, 1.5) in limits and (0.5, 3.0) not in limits
    assert len(art.profile["entries"]) == len(old.entries) + 2
    (path / "profile.json").write_text("{}")
    with pytest.raises(ArtifactError, match="profile.json"):
        open_artifact(path)


@pytest.mark.docker
def test_profile_command_measures_in_docker_containers(tuned_run, docker_engine, tmp_path: Path) -> None:
    path = _copy(tuned_run.artifact, tmp_path)
    result = CliRunner().invoke(app, ["profile", str(path), "--configs", "0.5,1", "--batch-sizes", "1,64",
                                      "--seconds", "1.5", "--backend", "docker", "--json"])
    assert result.exit_code == 0, result.output
    entries = [e for e in open_artifact(path).profile["entries"] if e["hardware"].get("container") == "docker"]
    assert sorted((e["hardware"]["cpu_limit"], e["batch_size"]) for e in entries) == [(0.5, 1), (0.5, 64), (1.0, 1), (1.0, 64)]
    by = {(e["hardware"]["cpu_limit"], e["batch_size"]): e for e in entries}
    assert all(e["samples"] > 5 and e["latency_ms"]["p99"] >= e["latency_ms"]["p50"] > 0 for e in entries)
    # each row also measured with rests between requests, and its closed loop's slow spells fitted
    assert all(e["idle_gap_ms"] == pytest.approx(3 * e["latency_ms"]["mean"], rel=0.01)
               and e["idle_latency_ms"]["p50"] > 0 and "persistence" in e["latency_ms"] for e in entries)
    # a half-core quota stretches the service time of the heavier batch
    assert by[(0.5, 64)]["latency_ms"]["mean"] > by[(1.0, 64)]["latency_ms"]["mean"]
    # and each size's container start, one start for all its batch sizes
    assert all(0 < by[cpus, 1]["startup_s"] == by[cpus, 64]["startup_s"] < 60 for cpus in (0.5, 1.0))


def test_profile_command_refuses_bad_sizes_and_leaves_the_artifact_alone(tuned_run, tmp_path: Path) -> None:
    path = _copy(tuned_run.artifact, tmp_path)
    before = (path / "manifest.json").read_text()
    for args, message in [(["--configs", "lots"], "not a number of cores"), (["--batch-sizes", "1,x"], "comma-separated")]:
        result = CliRunner().invoke(app, ["profile", str(path), *args])
        assert result.exit_code == 2 and message in result.output
    assert (path / "manifest.json").read_text() == before

"""Preflight refuses a hub id the job does not stage unless the node's Hugging Face cache holds its complete
snapshot (the trainers run offline): the node probe's check (``mift_probe.hub_snapshot``) over cache layouts
made as huggingface_hub makes them, and the requirement preflight sends."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.node import probe_paths as mift_probe_paths
from launcher.preflight.checks import node_paths
from launcher.spec.jobspec import JobSpec

REPO = "meta-llama/Meta-Llama-3-70B-Instruct"
COMMIT = "a" * 40


def cache_with_snapshot(root: Path, *, incomplete: bool = False, broken: bool = False) -> Path:
    """``models--ORG--NAME`` with refs/main, a snapshot of links into blobs/ (the hub cache's layout)."""
    repo = root / "models--meta-llama--Meta-Llama-3-70B-Instruct"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    blobs, snap = repo / "blobs", repo / "snapshots" / COMMIT
    blobs.mkdir()
    snap.mkdir(parents=True)
    for name, blob in (("config.json", "b1"), ("model.safetensors", "b2")):
        (blobs / blob).write_text("x")
        (snap / name).symlink_to(f"../../blobs/{blob}")
    if incomplete:
        (blobs / "b3.incomplete").write_text("half")
    if broken:
        (blobs / "b2").unlink()
    return root


def spec(**env: str) -> JobSpec:
    return JobSpec.model_validate({"name": "j", "train_config": "t.yaml", "hosts": "trainers", "env": env})


def test_an_unstaged_hub_id_is_a_requirement_on_every_node() -> None:
    paths = node_paths({"model_name_or_path": REPO}, spec(HF_HOME="/data/hf"), deepspeed=True)
    extra = paths[0].as_extravar()
    assert extra["hub"] == REPO and extra["cache"] == "/data/hf/hub" and extra["revision"] == "main"
    local = node_paths({"model_name_or_path": "/opt/mift/models/x"}, spec(), deepspeed=True)[0].as_extravar()
    assert "hub" not in local  # a folder's requirement is as before


def test_complete_snapshot_passes(tmp_path: Path) -> None:
    cache = cache_with_snapshot(tmp_path)
    req = node_paths({"model_name_or_path": REPO}, spec(HF_HUB_CACHE=str(cache)), deepspeed=True)
    assert mift_probe_paths.missing_paths(tmp_path / "run", [r.as_extravar() for r in req]) == []


@pytest.mark.parametrize(
    ("layout", "why"),
    [
        ("none", "not staged and not in this node's Hugging Face cache"),
        ("incomplete", "incomplete in"),
        ("broken", "model.safetensors has no blob"),
    ],
)
def test_missing_or_incomplete_snapshot_is_refused(tmp_path: Path, layout: str, why: str) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    if layout != "none":
        cache_with_snapshot(cache, incomplete=layout == "incomplete", broken=layout == "broken")
    req = node_paths({"model_name_or_path": REPO}, spec(HF_HUB_CACHE=str(cache)), deepspeed=True)
    missing = mift_probe_paths.missing_paths(tmp_path / "run", [r.as_extravar() for r in req])
    assert len(missing) == 1 and missing[0]["path"] == REPO
    assert why in missing[0]["why"]
    assert "stage it (stage.model in the job spec)" in missing[0]["why"]


def test_a_revision_the_cache_lacks_is_refused(tmp_path: Path) -> None:
    cache = cache_with_snapshot(tmp_path / "c")
    train = {"model_name_or_path": REPO, "model_revision": "v2"}
    req = node_paths(train, spec(HF_HUB_CACHE=str(cache)), deepspeed=True)
    missing = mift_probe_paths.missing_paths(tmp_path / "run", [r.as_extravar() for r in req])
    assert "no snapshot of v2" in missing[0]["why"]

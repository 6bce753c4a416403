"""Staging end to end on 2 test hosts: ``python -m launcher stage``, the real playbook and ssh.

Staging needs nothing the provisioning installs (ssh and the system ``python3``), so the hosts are bare ones
of rig ``STAGING_E2E_RIG_ID`` (default 1), not the provisioned image. Shows, printing what the launcher
printed: a first pass sends the tiny model and dataset to both hosts (bytes and time), a second sends nothing,
a file corrupted on host2 is sent again to host2 only; and the bad inputs, one line each with nothing
half-written left on a node: a missing source, a source file changed after its manifest was made, too little
free disk (refused before sending), and a disk that fills mid-transfer (a tmpfs on host2 with 4 inodes).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import time
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from mift_testsupport.launcher import Launcher, finish
from mift_testsupport.paths import REPO_ROOT
from mift_testsupport.provision import tiny_model
from mift_testsupport.rig import rig_id_from_env

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator
    from pathlib import Path

    from mift_testsupport.fixtures import RigFactory
    from mift_testsupport.rig import Rig

RIG_ID = rig_id_from_env("STAGING_E2E_RIG_ID", 1)
pytestmark = [pytest.mark.rig, pytest.mark.slow]
TRAIN = REPO_ROOT / "configs" / "train" / "tiny_cpu_lora_sft.yaml"
DATA = REPO_ROOT / "configs" / "data" / "tiny_alpaca"
MODEL_DEST = "/opt/mift/models/tiny-llama"


class Staging:
    """The 2 hosts, the launcher and job specs that stage the tiny model (and dataset)."""

    def __init__(self, rig: Rig, work: Path) -> None:
        self.rig = rig
        self.work = work
        self.launcher = Launcher(work / "runs", work / "logs", real_backend=False)
        (work / "configs" / "train").mkdir(parents=True)
        (work / "configs" / "data").symlink_to(REPO_ROOT / "configs" / "data")

    def job(self, name: str, model: Path, *, dest: str = MODEL_DEST, dataset: bool = False) -> Path:
        train = yaml.safe_load(TRAIN.read_text())
        train["model_name_or_path"] = dest
        train_path = self.work / "configs" / "train" / f"{name}.yaml"
        train_path.write_text(yaml.safe_dump(train, sort_keys=False))
        stage: dict[str, Any] = {"model": {"controller": str(model)}}
        if dataset:
            stage["dataset_dir"] = {"controller": str(DATA)}
        spec = {"name": name, "train_config": str(train_path), "nproc_per_node": 1, "stage": stage}
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    def stage(self, job: Path) -> subprocess.CompletedProcess[str]:
        out = self.launcher.run("stage", str(job), "-i", str(self.rig.inventory), timeout=600)
        print(f"$ python -m launcher stage {job.name} (rc={out.returncode})\n{out.stdout}{out.stderr}")
        return out

    def ssh(self, host: int, command: str) -> str:
        return str(self.rig.ssh(host, command, timeout=60).stdout)

    def sha256s(self, host: int, folder: str) -> dict[str, str]:
        """``{name: sha256}`` of the files in a node folder, partial files included."""
        q = shlex.quote(folder)
        out = self.ssh(host, f"cd {q} 2>/dev/null && find . -type f -printf '%P\\0' | xargs -0r sha256sum")
        return {line.split(None, 1)[1]: line.split(None, 1)[0] for line in out.splitlines() if line.strip()}


def sha256s(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def staging(rig_module_factory: RigFactory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Staging]:
    """2 bare hosts of rig ``STAGING_E2E_RIG_ID``; the launcher's cache in the module's work folder."""
    work = tmp_path_factory.mktemp("staging-e2e")
    old = os.environ.get("MIFT_CACHE_DIR")
    os.environ["MIFT_CACHE_DIR"] = str(work / "cache")
    try:
        yield Staging(rig_module_factory(RIG_ID, 2), work)
    finally:
        if old is None:
            os.environ.pop("MIFT_CACHE_DIR", None)
        else:
            os.environ["MIFT_CACHE_DIR"] = old


def test_stage_once_then_nothing_then_only_the_corrupt_file_on_host2(staging: Staging) -> None:
    job = staging.job("stage-tiny", tiny_model(), dataset=True)
    want = sha256s(tiny_model())
    first = staging.stage(job)
    assert first.returncode == 0, first.stderr
    assert re.search(
        r"staged in [0-9.]+ s: sent 1\.2 MB \(host1 8 files 592\.4 kB, host2 8 files", first.stdout
    )
    for host in (1, 2):
        assert staging.sha256s(host, MODEL_DEST) == want
        assert staging.sha256s(host, "/opt/mift/data/tiny_alpaca") == sha256s(DATA)
    second = staging.stage(job)
    assert second.returncode == 0, second.stderr
    assert re.search(
        r"staged in [0-9.]+ s: every node already held model sha256:\w+, dataset_dir", second.stdout
    )
    staging.ssh(2, f"printf X | dd of={MODEL_DEST}/model.safetensors bs=1 seek=1000 conv=notrunc 2>/dev/null")
    assert staging.sha256s(2, MODEL_DEST)["model.safetensors"] != want["model.safetensors"]
    third = staging.stage(job)
    assert third.returncode == 0, third.stderr
    assert "sent 560.5 kB (host2 1 file 560.5 kB" in third.stdout and "host1 already held it" in third.stdout
    assert staging.sha256s(2, MODEL_DEST) == want


def test_missing_source_is_one_line(staging: Staging) -> None:
    out = staging.stage(staging.job("stage-missing", staging.work / "no-such-model"))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"error: {staging.work}/stage-missing.yaml: stage.model.controller: {staging.work}/no-such-model: "
        "no such folder"
    ]


def test_source_changed_after_its_manifest_is_refused_on_every_node(staging: Staging) -> None:
    src = staging.work / "model-changing"
    src.mkdir()
    for p in tiny_model().iterdir():
        (src / p.name).write_bytes(p.read_bytes())
    dest = "/opt/mift/models/changing"
    proc, log = staging.launcher.start(
        "stage", str(staging.job("stage-changing", src, dest=dest)), "-i", str(staging.rig.inventory)
    )
    deadline = time.monotonic() + 300
    while "manifest sha256:" not in log.read_text() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    weights = src / "model.safetensors"  # rewritten while the nodes report (same size, other bytes)
    weights.write_bytes(bytes(reversed(weights.read_bytes())))
    text = finish(proc, log)
    print(text)
    assert proc.returncode == 1, text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "model.safetensors: checksum mismatch at the source" in errors[0], text
    assert "changed after its manifest was made" in errors[0]
    for host in (1, 2):
        held = staging.sha256s(host, dest)
        assert "model.safetensors" not in held and not [n for n in held if n.endswith(".mift-part")], held


def test_too_little_disk_is_refused_and_a_disk_full_midway_leaves_nothing_half_written(
    staging: Staging,
) -> None:
    mount = "/opt/full"
    dest = f"{mount}/tiny-llama"
    try:
        staging.ssh(2, f"mkdir -p {mount} && mount -t tmpfs -o size=100k mift-small {mount}")
        small = staging.stage(staging.job("stage-small", tiny_model(), dest=dest))
        assert small.returncode == 2, small.stdout
        assert re.fullmatch(
            rf"error: host2: {dest}: needs 602\.1 kB, 102\.4 kB free on its file system; nothing was sent\n",
            small.stderr,
        )
        assert staging.ssh(2, f"ls -A {mount}").strip() == ""
        # bytes enough, inodes not: the disk fills in the middle of the transfer
        staging.ssh(2, f"umount {mount} && mount -t tmpfs -o size=2m,nr_inodes=4 mift-full {mount}")
        full = staging.stage(staging.job("stage-full", tiny_model(), dest=dest))
        assert full.returncode == 1, full.stdout
        errors = full.stderr.strip().splitlines()
        assert len(errors) == 1 and errors[0].startswith(
            f"error: host2: {dest}: disk full while receiving"
        ), errors
        assert "its partial file was removed" in errors[0]
        held = staging.sha256s(2, dest)
        want = sha256s(tiny_model())
        assert held and all(want.get(name) == sha for name, sha in held.items()), held  # complete, verified
        assert len(held) < len(want)
        assert staging.sha256s(1, dest) == want  # host1's disk was not full
    finally:
        staging.rig.ssh(2, f"umount {mount}", check=False)

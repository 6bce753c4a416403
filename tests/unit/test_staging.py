"""Staging: the manifest and its hash cache, what differs, free disk, the node's receiving side
(temp name, checksum, disk full, resume), the job spec's ``stage`` keys, whole passes on a loopback node."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from launcher.backends.runner import PlaybookResult
from launcher.exceptions import ConfigurationError, JobFailedError
from launcher.node import stage as mift_stage
from launcher.rundir.runs import RunRecord
from launcher.spec.jobspec_load import parse_job_spec
from launcher.transfer.manifest import (
    Manifest,
    StageItem,
    build_manifest,
    disk_shortfall,
    hf_snapshot,
    manifest_digest,
    stage_items,
    to_send,
)
from launcher.transfer.staging import progress_line, ssh_argv, stage
from launcher.validation.job import load_job

SRC = Path("/jobs/x.yaml")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


FILES = {"config.json": b"{}", "model.safetensors": b"w" * 5000, "sub/tokenizer.json": b"tok"}


# --- the manifest and its cache ---------------------------------------------------------------------------
def test_manifest_sizes_and_sha256(tmp_path: Path) -> None:
    root = _tree(tmp_path / "m", FILES)
    files = mift_stage.scan(root, mift_stage.HashCache(None), strict=True)
    assert files == {rel: {"size": len(data), "sha256": _sha(data)} for rel, data in FILES.items()}


def test_manifest_digest_is_stable_and_follows_content() -> None:
    a = {"x": {"size": 1, "sha256": "aa"}, "y": {"size": 2, "sha256": "bb"}}
    b = {"y": {"size": 2, "sha256": "bb"}, "x": {"size": 1, "sha256": "aa"}}
    assert manifest_digest(a) == manifest_digest(b)
    assert manifest_digest(a) != manifest_digest({**a, "x": {"size": 1, "sha256": "ab"}})
    assert manifest_digest(a).startswith("sha256:")


def test_hash_cache_hashes_once_and_again_after_a_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _tree(tmp_path / "m", {"w.bin": b"1" * 100})
    cache_file = tmp_path / "cache.json"
    calls: list[int] = []
    real, expected = hashlib.sha256, _sha(b"2" * 100)
    monkeypatch.setattr(mift_stage.hashlib, "sha256", lambda: calls.append(1) or real())
    cache = mift_stage.HashCache(cache_file)
    first = mift_stage.scan(root, cache, strict=True)
    cache.save()
    again = mift_stage.scan(root, mift_stage.HashCache(cache_file), strict=True)  # a new run: read from disk
    assert again == first and len(calls) == 1
    (root / "w.bin").write_bytes(b"2" * 100)  # same size; mtime/ctime change
    changed = mift_stage.scan(root, mift_stage.HashCache(cache_file), strict=True)
    assert changed["w.bin"]["sha256"] == expected and len(calls) == 2
    (root / "w.bin").unlink()  # a file gone is forgotten by the cache
    cache = mift_stage.HashCache(cache_file)
    assert mift_stage.scan(root, cache, strict=True) == {} and cache.entries == {}


def test_file_written_while_hashed_is_a_checksum_mismatch_at_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _tree(tmp_path / "m", {"w.bin": b"1" * 100})
    real = hashlib.sha256
    written: list[int] = []

    class WritesWhileHashing:  # test double of sha256: the file is appended to while it is read
        def __init__(self) -> None:
            self.inner = real()

        def update(self, chunk: bytes) -> None:
            if not written:
                written.append(1)
                with (root / "w.bin").open("ab") as fh:
                    fh.write(b"more")
            self.inner.update(chunk)

        def hexdigest(self) -> str:
            return self.inner.hexdigest()

    monkeypatch.setattr(mift_stage.hashlib, "sha256", WritesWhileHashing)
    item = StageItem("model", "controller", str(root), "/opt/m")
    with pytest.raises(ConfigurationError, match=r"w.bin: checksum mismatch at the source: it changed while"):
        build_manifest(item, mift_stage.HashCache(None))


# --- what differs, free disk ------------------------------------------------------------------------------
def _manifest(root: Path) -> Manifest:
    item = StageItem("model", "controller", str(root), "/opt/m")
    return Manifest(item, mift_stage.scan(root, mift_stage.HashCache(None), strict=True))


def test_only_missing_resized_or_corrupt_files_are_sent(tmp_path: Path) -> None:
    m = _manifest(_tree(tmp_path / "m", FILES))
    held = {"files": {rel: dict(v) for rel, v in m.files.items()}, "parts": {}}
    assert to_send(m, held, 0) == []
    held["files"]["config.json"]["sha256"] = "0" * 64  # corrupt, same size
    del held["files"]["sub/tokenizer.json"]
    held["files"]["model.safetensors"]["size"] = 4999
    assert [s.rel for s in to_send(m, held, 0)] == ["config.json", "model.safetensors", "sub/tokenizer.json"]


def test_a_partial_file_is_resumed_from_its_size(tmp_path: Path) -> None:
    m = _manifest(_tree(tmp_path / "m", FILES))
    sends = to_send(m, {"files": {}, "parts": {"model.safetensors": 3000, "config.json": 99}}, 0)
    offsets = {s.rel: s.offset for s in sends}
    assert offsets == {"config.json": 0, "model.safetensors": 3000, "sub/tokenizer.json": 0}  # 99 > 2 bytes


def test_free_disk_counts_blocks_per_file_system(tmp_path: Path) -> None:
    m = _manifest(_tree(tmp_path / "m", FILES))
    sends = to_send(m, {}, 0)
    held = {"/opt/m": {"dev": 7, "free": 4 * 4096, "block": 4096}}
    assert disk_shortfall(held, ["/opt/m"], sends) is None  # 2 + 5000 + 3 bytes: 1 + 2 + 1 blocks
    held["/opt/m"]["free"] = 4 * 4096 - 1
    assert disk_shortfall(held, ["/opt/m"], sends) == "/opt/m: needs 16.4 kB, 16.4 kB free on its file system"


# --- the node's receiving side ------------------------------------------------------------------------------
def _stream(*files: tuple[str, bytes, str, int]) -> io.BytesIO:
    buf = io.BytesIO()
    for rel, data, sha, offset in files:
        head = {"dest": 0, "path": rel, "size": len(data), "sha256": sha, "offset": offset, "mode": 0o640}
        buf.write(json.dumps(head).encode() + b"\n" + data[offset:])
    buf.write(b'{"end": true}\n')
    buf.seek(0)
    return buf


def _receive(root: Path, stream: io.BytesIO) -> tuple[int, list[dict[str, Any]]]:
    out = io.StringIO()
    rc = mift_stage.receive([root], stream, out, mift_stage.HashCache(None))
    return rc, [json.loads(line) for line in out.getvalue().splitlines()]


def test_received_files_are_renamed_only_when_the_checksum_matches(tmp_path: Path) -> None:
    good, bad = b"good" * 10, b"bad" * 10
    rc, lines = _receive(
        tmp_path, _stream(("a/good.bin", good, _sha(good), 0), ("bad.bin", bad, _sha(b"x"), 0))
    )
    assert rc == 0 and [ln["ok"] for ln in lines] == [True, False]
    assert "checksum mismatch" in lines[1]["error"]
    assert (tmp_path / "a" / "good.bin").read_bytes() == good
    assert (tmp_path / "a" / "good.bin").stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["good.bin"]  # no bad.bin, no part


def test_disk_full_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(_fd: int) -> None:  # test double of fsync: the disk filled while the file was written
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mift_stage.os, "fsync", full)
    data = b"d" * 100
    rc, lines = _receive(tmp_path, _stream(("x.bin", data, _sha(data), 0)))
    assert rc == mift_stage.DISK_FULL_RC and lines[0]["error"] == "disk full" and "free" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_a_partial_file_resumes_and_is_verified_whole(tmp_path: Path) -> None:
    data = bytes(range(256)) * 40
    (tmp_path / ".w.bin.mift-part").write_bytes(data[:3000])
    held = mift_stage.report([str(tmp_path)], mift_stage.HashCache(None))[str(tmp_path)]
    assert held["parts"] == {"w.bin": 3000} and held["files"] == {}
    rc, lines = _receive(tmp_path, _stream(("w.bin", data, _sha(data), 3000)))
    assert rc == 0 and lines[0] == {"dest": 0, "path": "w.bin", "ok": True, "bytes": len(data) - 3000}
    assert (tmp_path / "w.bin").read_bytes() == data and not (tmp_path / ".w.bin.mift-part").exists()


def test_paths_leaving_the_destination_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="refusing path"):
        _receive(tmp_path, _stream(("../escape", b"x", _sha(b"x"), 0)))


# --- the job spec -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("stage_spec", "message"),
    [
        ({"model": {"controller": "m", "shared": "/s"}}, "name exactly one source"),
        ({"model": {}}, "got none"),
        ({"model": {"controller": "m", "revision": "main"}}, "revision goes with hf_cache or hub only"),
        ({"model": {"shared": "rel/path"}}, "must be an absolute node path"),
        ({"dataset_dir": {"hf_cache": "org/data"}}, "hf_cache holds models here"),
        ({"model": {"hf_cache": "not a repo"}}, "String should match pattern"),
        ({"modle": {"controller": "m"}}, "unknown key"),
    ],
)
def test_stage_keys_are_validated(stage_spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_job_spec({"name": "a", "train_config": "t", "stage": stage_spec}, SRC)


def test_controller_source_is_relative_to_the_job_spec() -> None:
    spec = parse_job_spec({"name": "a", "train_config": "t", "stage": {"model": {"controller": "../m"}}}, SRC)
    assert spec.stage.model is not None and spec.stage.model.controller == Path("/m")


def _job(tmp_path: Path, stage_spec: dict[str, Any], train: dict[str, Any] | None = None) -> Path:
    train = train or {"model_name_or_path": str(tmp_path / "node" / "model"), "dataset_dir": "/opt/d"}
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(train))
    job = {"name": "st", "train_config": "train.yaml", "hosts": ["host1"], "stage": stage_spec}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    return tmp_path / "job.yaml"


def test_a_missing_source_is_one_line(tmp_path: Path) -> None:
    job = load_job(_job(tmp_path, {"model": {"controller": "nowhere"}}))
    with pytest.raises(ConfigurationError) as err:
        stage_items(job)
    assert (
        str(err.value) == f"{tmp_path}/job.yaml: stage.model.controller: {tmp_path}/nowhere: no such folder"
    )


def test_destination_is_the_training_yamls_path(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    job = load_job(_job(tmp_path, {"model": {"controller": "m"}}, {"model_name_or_path": "org/hub-id"}))
    with pytest.raises(ConfigurationError, match="model_name_or_path must be an absolute node path"):
        stage_items(job)
    job = load_job(_job(tmp_path, {"dataset_dir": {"shared": "/mnt/a"}}))
    with pytest.raises(ConfigurationError, match="/mnt/a is not the training YAML's dataset_dir /opt/d"):
        stage_items(job)


def test_hf_cache_snapshot_of_a_revision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    repo = tmp_path / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123\n")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    assert hf_snapshot("org/tiny", None) == (repo / "snapshots" / "abc123", "")
    assert hf_snapshot("org/tiny", "v2")[1].endswith("(no refs/v2, no snapshots/v2)")
    assert "not in the Hugging Face cache" in hf_snapshot("org/other", None)[1]


def test_ssh_argv_is_ansibles_connection() -> None:
    ssh = {"host": "10.0.0.2", "port": "2222", "user": "root", "key": "/k", "common_args": "-F /c -o A=b"}
    argv = ssh_argv("ssh", ssh)
    assert argv[0] == "ssh" and argv[-1] == "10.0.0.2" and argv[7:9] == ["-p", "2222"]
    assert argv[argv.index("-i") + 1] == "/k" and "A=b" in argv
    assert ssh_argv("local", ssh) == []


def test_progress_line() -> None:
    line = progress_line({"host1": {"bytes": 5e8, "total": 1e9, "rate": 1e8}})
    assert line == "host1 500.0 MB/1.0 GB (50%) 100.0 MB/s ETA 5 s"


# --- one whole pass on a loopback node ---------------------------------------------------------------------
class StageRunnerDouble:
    """TEST DOUBLE of PlaybookRunner for playbooks/stage.yml: this machine's report (connection local)."""

    def __init__(self, node_cache: Path) -> None:
        self.cancel_requested = threading.Event()
        self.node_cache = node_cache
        self.calls = 0

    def run(self, playbook: str, extravars: dict[str, Any]) -> PlaybookResult:
        assert playbook == "stage"
        self.calls += 1
        held = mift_stage.report(list(extravars["mift_stage_dests"]), mift_stage.HashCache(self.node_cache))
        answer = {"held": held, "connection": "local", "ssh": {"host": "host1"}, "play_hosts": ["host1"]}
        return PlaybookResult("stage", 0, "successful", reports={"host1": {"stage": answer}})


def test_stage_sends_once_then_nothing_then_only_the_corrupt_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MIFT_CACHE_DIR", str(tmp_path / "cache"))
    _tree(tmp_path / "m", FILES)
    job = load_job(
        _job(tmp_path, {"model": {"controller": "m"}, "node_cache": str(tmp_path / "node-cache.json")})
    )
    runner: Any = StageRunnerDouble(tmp_path / "node-cache.json")
    node = tmp_path / "node" / "model"

    def staged() -> tuple[Any, str]:
        out = io.StringIO()
        return stage(job, runner, out=out), out.getvalue()

    first, text = staged()
    assert first is not None and first.sent == {"host1": {"files": 3, "bytes": 5005}}, text
    assert {p.relative_to(node).as_posix(): p.read_bytes() for p in node.rglob("*") if p.is_file()} == FILES
    assert "staged in" in text and "sent 5.0 kB (host1 3 files 5.0 kB" in text
    second, text = staged()
    assert second is not None and second.sent == {} and "nothing sent" in text
    assert second.manifests[0].digest == first.manifests[0].digest
    with (node / "model.safetensors").open("r+b") as fh:  # one byte flipped on the node, size kept
        fh.seek(100)
        fh.write(b"X")
    third, _ = staged()
    assert third is not None and third.sent == {"host1": {"files": 1, "bytes": 5000}}
    assert (node / "model.safetensors").read_bytes() == FILES["model.safetensors"]


def test_stage_refuses_too_little_free_disk_before_sending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MIFT_CACHE_DIR", str(tmp_path / "cache"))
    _tree(tmp_path / "m", FILES)
    job = load_job(_job(tmp_path, {"model": {"controller": "m"}, "node_cache": str(tmp_path / "nc.json")}))
    real = mift_stage._fs_of
    monkeypatch.setattr(mift_stage, "_fs_of", lambda p: {**real(p), "free": 4096})  # test double: a full disk
    with pytest.raises(
        ConfigurationError, match=r"host1: .*/node/model: needs 16.4 kB, 4.1 kB free .*nothing was"
    ):
        stage(job, StageRunnerDouble(tmp_path / "nc.json"), out=io.StringIO())  # type: ignore[arg-type]
    assert not (tmp_path / "node").exists()


def test_source_changed_after_its_manifest_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIFT_CACHE_DIR", str(tmp_path / "cache"))
    src = _tree(tmp_path / "m", FILES)
    job = load_job(_job(tmp_path, {"model": {"controller": "m"}, "node_cache": str(tmp_path / "nc.json")}))

    class ChangesTheSource(StageRunnerDouble):  # TEST DOUBLE: the source is rewritten while the nodes report
        def run(self, playbook: str, extravars: dict[str, Any]) -> PlaybookResult:
            (src / "config.json").write_bytes(b"[]")
            return super().run(playbook, extravars)

    with pytest.raises(
        JobFailedError, match=r"config.json: checksum mismatch at the source: .* changed after"
    ):
        stage(job, ChangesTheSource(tmp_path / "nc.json"), out=io.StringIO())  # type: ignore[arg-type]
    node = tmp_path / "node" / "model"
    assert not (node / "config.json").exists() and not list(node.rglob("*.mift-part"))
    assert (node / "model.safetensors").is_file()  # sent and verified


def test_the_run_records_the_manifests_it_staged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.engine.stage import stage_for_run  # noqa: PLC0415
    from launcher.rundir.report import staging_lines  # noqa: PLC0415
    from launcher.rundir.runs import RunDir  # noqa: PLC0415

    monkeypatch.setenv("MIFT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MIFT_RUNS_DIR", str(tmp_path / "runs"))
    _tree(tmp_path / "m", FILES)
    job = load_job(_job(tmp_path, {"model": {"controller": "m"}, "node_cache": str(tmp_path / "nc.json")}))
    run = RunDir.create("st-1", {"name": "st"})
    stage_for_run(job, StageRunnerDouble(tmp_path / "nc.json"), run, threading.Event(), io.StringIO())  # type: ignore[arg-type]
    record = run.load()
    item = record["staging"]["items"][0]
    files = mift_stage.scan(tmp_path / "m", mift_stage.HashCache(None), strict=True)
    assert item["digest"] == manifest_digest(files) and item["files"] == 3 and item["bytes"] == 5005
    assert record["staging"]["sent"] == {"host1": {"files": 3, "bytes": 5005}}
    kept = json.loads((run.path / "staging" / "model.manifest.json").read_text())
    assert kept["manifest"] == files and kept["dest"] == str(tmp_path / "node" / "model")
    lines = staging_lines(RunRecord.of(record))
    assert lines[0].startswith(f"  staged  model {item['digest']} (3 files, 5.0 kB) from controller")
    assert lines[1].startswith("  staged  sent host1 3 files 5.0 kB in ")
    progress = staging_lines(
        RunRecord.of(
            {"status": "staging", "staging": {"progress": {"h": {"bytes": 1, "total": 2, "rate": 1}}}}
        )
    )
    assert progress == ["  staging: h 1 B/2 B (50%) 1 B/s ETA 1 s"]


def test_hf_cache_snapshot_links_are_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--org--tiny"
    blobs = _tree(repo / "blobs", {"b1": b"{}", "b2": b"weights"})
    snap = repo / "snapshots" / "c0ffee"
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to(blobs / "b1")
    (snap / "model.safetensors").symlink_to(blobs / "b2")
    job = load_job(_job(tmp_path, {"model": {"hf_cache": "org/tiny", "revision": "c0ffee"}}))
    (item,) = stage_items(job)
    assert item.kind == "hf_cache" and item.source == str(snap)
    manifest = build_manifest(item, mift_stage.HashCache(None))
    assert manifest.files == {
        "config.json": {"size": 2, "sha256": _sha(b"{}")},
        "model.safetensors": {"size": 7, "sha256": _sha(b"weights")},
    }


def test_a_file_another_staging_is_writing_is_left_alone(tmp_path: Path) -> None:
    import fcntl  # noqa: PLC0415

    part = tmp_path / ".x.bin.mift-part"
    part.write_bytes(b"the other writer's bytes")
    data = b"d" * 100
    with part.open("r+b") as other:
        fcntl.flock(other.fileno(), fcntl.LOCK_EX)
        rc, lines = _receive(
            tmp_path, _stream(("x.bin", data, _sha(data), 0), ("y.bin", data, _sha(data), 0))
        )
    assert rc == 0 and lines[0]["error"] == "another staging is writing this file now" and lines[1]["ok"]
    assert part.read_bytes() == b"the other writer's bytes" and not (tmp_path / "x.bin").exists()


def test_a_shared_folder_must_look_the_same_from_every_node(tmp_path: Path) -> None:
    from launcher.transfer.manifest import shared_differences  # noqa: PLC0415

    root = _tree(tmp_path / "shared", FILES)
    first = mift_stage.report([str(root)], mift_stage.HashCache(None))[str(root)]
    manifest = Manifest(StageItem("model", "shared", str(root), str(root)), first["files"])
    assert shared_differences(manifest, first) == []
    other = {"files": {**first["files"], "config.json": {"size": 2, "sha256": "0" * 64}, "new.bin": {}}}
    assert shared_differences(manifest, other) == ["config.json", "new.bin"]

"""A backend's handle: prepared once, stored in the run record, and the backend built back from it; the typed
run record and the exit code it gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.backends import backend_of, handle_of, prepare
from launcher.backends.slurm import SharedSlurmHandle, SlurmBackend, SlurmHandle
from launcher.backends.slurm_shared import SharedSlurmBackend
from launcher.backends.ssh import SshBackend, SshHandle
from launcher.exceptions import ConfigurationError
from launcher.exit_codes import JOB_FAILED, OK
from launcher.rundir.runs import RunDir, RunRecord, exit_code_of
from launcher.spec.jobspec_load import parse_job_spec

SLURM_INVENTORY = (
    "all:\n  vars:\n    mift_launcher_backend: slurm\n  children:\n"
    "    trainers:\n      hosts:\n        n1: {}\n    slurm_login:\n      hosts:\n        login1: {}\n"
)


def spec(**fields: Any) -> Any:
    return parse_job_spec({"name": "a", "train_config": "t", **fields}, Path("x.yaml"))


def stored(fields: dict[str, Any]) -> dict[str, Any]:
    """The record's fields as record.json holds them (a JSON round trip)."""
    loaded: dict[str, Any] = json.loads(json.dumps(fields))
    return loaded


def test_each_backend_is_built_back_from_the_handle_its_record_stores(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text(SLURM_INVENTORY)
    job = tmp_path / "job.yaml"

    ssh = prepare("ssh", inv, spec(), job, "r1", resume=False)
    assert ssh == SshHandle()
    assert stored(ssh.record_fields()) == {"backend": "ssh", "handle": {"kind": "ssh"}}
    assert type(backend_of(stored(ssh.record_fields()))) is SshBackend

    slurm = prepare(None, inv, spec(), job, "r1", resume=False)  # the inventory chooses slurm
    assert slurm == SlurmHandle("login1")
    fields = stored(slurm.record_fields())
    assert fields["slurm"] == {"login_host": "login1"}
    assert fields["handle"] == {"kind": "slurm", "login_host": "login1", "job_id": None}
    built = backend_of(fields)
    assert type(built) is SlurmBackend and (built.login, built.job_id) == ("login1", None)

    shared = prepare("slurm", inv, spec(slurm={"shared_dir": "/s", "nodes": 3}), job, "r1", resume=False)
    assert shared == SharedSlurmHandle("login1", "/s", "/s/r1", 3)
    fields = stored(shared.record_fields())
    assert fields["slurm"] == {"login_host": "login1", "shared_dir": "/s", "run_root": "/s/r1", "nodes": 3}
    # the handle says which backend, not the presence of slurm.run_root
    fields["slurm"] = {"login_host": "login1"}
    built = backend_of(fields)
    assert isinstance(built, SharedSlurmBackend) and (built.root, built.nodes) == ("/s/r1", 3)


def test_the_login_host_only_mode_refuses_resume_when_prepared(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text(SLURM_INVENTORY)
    job = tmp_path / "job.yaml"
    with pytest.raises(
        ConfigurationError, match=r"job\.yaml: run --resume: not supported with slurm\.shared"
    ):
        prepare("slurm", inv, spec(slurm={"shared_dir": "/s", "nodes": 2}), job, "r1", resume=True)
    assert prepare("slurm", inv, spec(), job, "r1", resume=True) == SlurmHandle("login1")


def test_a_submitted_job_id_is_in_the_stored_handle() -> None:
    record = stored({**SlurmHandle("h").record_fields(), "run_id": "r1", "status": "running"})
    record["handle"]["job_id"] = "42"  # as SlurmBackend.start stores it once sbatch answered
    assert handle_of(record) == SlurmHandle("h", "42")
    assert backend_of(RunRecord.of(record)).job_id == "42"  # type: ignore[attr-defined]
    record["handle"] = {"kind": "slurm", "login": "h"}
    with pytest.raises(ConfigurationError, match="run record: handle: not a slurm handle"):
        handle_of(record)


def test_the_typed_record_and_the_exit_code_it_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIFT_RUNS_DIR", str(tmp_path / "runs"))
    run = RunDir.create("r1", {"name": "a", "spec_path": "/j.yaml", "launcher_pid": 7, "inventory": None})
    record = run.record()
    assert (record.run_id, record.status, record.name, record.spec_path) == ("r1", "created", "a", "/j.yaml")
    assert (record.launcher_pid, record.inventory, record.hosts, record.final) == (7, None, (), False)
    run.update(hosts=["n1", "n2"], nproc_per_node=8, attempts=[{"attempt": 1}, "not an attempt"])
    run.set_status("failed", "n2: trainer exited rc=1")
    record = run.record()
    assert record.hosts == ("n1", "n2") and record.nproc_per_node == 8 and record.final
    assert record.attempts == ({"attempt": 1},)
    assert record.data["timeline"][-1]["note"] == "n2: trainer exited rc=1"  # the rest, as stored
    assert [
        exit_code_of(s) for s in ("succeeded", "running", "failed", "stalled", "stopped", "rejected")
    ] == [
        OK,
        OK,  # run --detach: the trainers run on
        JOB_FAILED,
        JOB_FAILED,
        JOB_FAILED,
        JOB_FAILED,
    ]

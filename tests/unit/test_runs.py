"""The run directory: creation mode, record and timeline, lookup by id or prefix, listing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from launcher.exceptions import ConfigurationError, NoRunsError
from launcher.rundir.runs import RunDir, find_run, list_runs, new_run_id


@pytest.fixture(autouse=True)
def runs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MIFT_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path / "runs"


def test_create_record_and_timeline(runs_dir: Path) -> None:
    run = RunDir.create("job-1", {"name": "job", "created_at": time.time()})
    assert run.path == runs_dir / "job-1" and run.path.stat().st_mode & 0o777 == 0o700
    run.set_status("running")
    record = run.update(hosts=["h1"])
    assert record["status"] == "running" and record["hosts"] == ["h1"]
    assert [t["status"] for t in record["timeline"]] == ["created", "running"]
    assert (run.path / "record.json").stat().st_mode & 0o777 == 0o600


def test_find_by_id_prefix_latest_and_errors() -> None:
    with pytest.raises(NoRunsError, match="no runs"):
        find_run(None)
    first = RunDir.create("alpha-1", {"created_at": 1.0})
    second = RunDir.create("alpha-2", {"created_at": 2.0})
    RunDir.create("beta-1", {"created_at": 3.0})
    assert find_run("alpha-1").path == first.path
    assert find_run("beta").run_id == "beta-1"
    assert find_run(None).run_id == "beta-1"
    assert find_run(str(second.path)).run_id == "alpha-2"
    with pytest.raises(ConfigurationError, match="ambiguous"):
        find_run("alpha")
    with pytest.raises(ConfigurationError, match="no such run"):
        find_run("gamma")
    assert [r.run_id for r in list_runs()] == ["alpha-1", "alpha-2", "beta-1"]


def test_run_ids_are_unique_and_named() -> None:
    ids = {new_run_id("tiny") for _ in range(20)}
    assert len(ids) == 20 and all(i.startswith("tiny-") for i in ids)

"""``--json`` of status, list and logs read back (rundir/json_out.py; docs/launcher.md "JSON output"), and the
exit code of "nothing there" (3)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from launcher.rundir.json_out import LOG_KEYS, RUN_KEYS, SCHEMA
from mift_testsupport.cli import run_cli

if TYPE_CHECKING:
    from collections.abc import Iterator

FINISHED = Path(__file__).resolve().parents[1] / "fixtures" / "failure_logs" / "cause-lora-module-missing"


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """A runs folder holding the finished run of the faults case cause-lora-module-missing (its real record
    and host2's real trainer.log)."""
    root = tmp_path / "runs"
    record = json.loads((FINISHED / "record.json").read_text())
    run = root / record["run_id"]
    (run / "nodes" / "host2").mkdir(parents=True)
    (run / "record.json").write_text(json.dumps(record))
    shutil.copy(FINISHED / "nodes" / "host2" / "trainer.log", run / "nodes" / "host2" / "trainer.log")
    return root


@pytest.fixture
def follower() -> Iterator[int]:
    """TEST DOUBLE of the launcher that follows a running run: a live process whose command line names the
    launcher (what launcher.job.launcher_alive checks), so that status reads the record without polling."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "launcher"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_status_json_of_a_finished_run(runs: Path) -> None:
    result = run_cli(["status", "--json"], env={"MIFT_RUNS_DIR": str(runs)})
    assert result.rc == 1, result.stderr  # failed: the exit code is status's, JSON or not
    obj = json.loads(result.stdout)
    assert tuple(obj) == RUN_KEYS
    assert (obj["schema"], obj["kind"], obj["status"], obj["final"]) == (SCHEMA, "run", "failed", True)
    assert obj["hosts"] == ["host1", "host2"] and obj["nproc_per_node"] == 2
    assert obj["failure_cause"]["type"] == "ValueError" and obj["failure_cause"]["host"] == "host2"
    assert obj["attempts"][0]["kind"] == "trainer_error"
    assert obj["run_dir"] == str(runs / obj["run_id"])


def test_status_json_of_a_running_run(runs: Path, follower: int) -> None:
    record = {
        "run_id": "demo-20261207-050000-beef",
        "status": "running",
        "name": "demo",
        "created_at": 1.0e10,
        "launcher_pid": follower,
        "timeline": [{"t": 1.0, "status": "running"}],
    }
    (runs / record["run_id"]).mkdir()
    (runs / record["run_id"] / "record.json").write_text(json.dumps(record))
    result = run_cli(["status", "--json", "demo-"], env={"MIFT_RUNS_DIR": str(runs)})
    assert result.rc == 0, result.stderr
    obj = json.loads(result.stdout)
    assert tuple(obj) == RUN_KEYS
    assert (obj["status"], obj["final"], obj["failure_cause"], obj["summary"]) == (
        "running",
        False,
        None,
        None,
    )
    assert obj["hosts"] == [] and obj["attempts"] == [] and obj["nodes"] == {}


def test_list_json_is_one_run_object_per_line(runs: Path, follower: int) -> None:
    second = runs / "demo-20261207-050000-beef"
    second.mkdir()
    (second / "record.json").write_text(
        json.dumps(
            {"run_id": second.name, "status": "running", "created_at": 1.0e10, "launcher_pid": follower}
        )
    )
    result = run_cli(["list", "--json"], env={"MIFT_RUNS_DIR": str(runs)})
    assert result.rc == 0, result.stderr
    objs = [json.loads(line) for line in result.stdout.splitlines()]
    assert [o["status"] for o in objs] == ["failed", "running"]  # oldest first
    assert all(tuple(o) == RUN_KEYS for o in objs)


def test_logs_json_lines_carry_the_rank(runs: Path) -> None:
    result = run_cli(["logs", "--json", "--node", "host2"], env={"MIFT_RUNS_DIR": str(runs)})
    assert result.rc == 0, result.stderr
    objs = [json.loads(line) for line in result.stdout.splitlines()]
    text = (FINISHED / "nodes" / "host2" / "trainer.log").read_text()
    assert [o["line"] for o in objs] == text.splitlines()
    assert all(tuple(o) == LOG_KEYS and o["host"] == "host2" for o in objs)
    ranks = {o["rank"] for o in objs}
    assert ranks == {2, 3, None}  # torchrun's own lines (its ChildFailedError) name no rank
    assert any(o["rank"] == 2 and "no_such_module" in o["line"] for o in objs)


@pytest.mark.parametrize("argv", [["status"], ["status", "--json"], ["logs"], ["list"], ["list", "--json"]])
def test_nothing_there_exits_3(tmp_path: Path, argv: list[str]) -> None:
    result = run_cli(argv, env={"MIFT_RUNS_DIR": str(tmp_path / "empty")})
    assert (result.rc, result.stdout) == (3, "")
    assert result.stderr.strip() == f"error: no runs in {tmp_path / 'empty'}"


def test_a_run_id_that_matches_nothing_is_bad_input(runs: Path) -> None:
    result = run_cli(["status", "nosuchrun"], env={"MIFT_RUNS_DIR": str(runs)})
    assert result.rc == 2 and "nosuchrun: no such run" in result.stderr

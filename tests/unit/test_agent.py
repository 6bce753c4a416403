"""The node agent (``mift_node.pyz agent``: launcher/node/agent.py), run locally against the fake trainer
test double."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from node_agent import agent_json, fake_trainer_job, wait_state

from launcher.node import common as node_common
from launcher.node import supervise as node_supervise

FAKE = Path(__file__).with_name("fake_trainer.py")


def make_run(tmp_path: Path, run_id: str, *trainer_args: str) -> Path:
    run_dir = tmp_path / run_id
    run_dir.mkdir()
    out = run_dir / "output"
    job = {
        "run_id": run_id,
        "node_rank": 0,
        "output_dir": str(out),
        "expect_outputs": ["adapter_model.safetensors", "all_results.json"],
        "argv": [sys.executable, str(FAKE), str(out), *trainer_args],
    }
    (run_dir / "job.json").write_text(json.dumps(job))
    (run_dir / "env.json").write_text(json.dumps({"NCCL_DEBUG": "INFO", "A_TOKEN": "s3cret"}))
    os.chmod(run_dir / "env.json", 0o600)
    return run_dir


def marked(run_dir: Path) -> list[int]:
    return node_common.marked_pids(node_common.agent_key(run_dir.name, run_dir.resolve()))


def test_start_runs_to_success_and_reports_last_step(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "t-ok", "--steps", "4", "--step-s", "0.1")
    started = agent_json("start", str(run_dir))
    assert started["ok"] and started["changed"] and started["pid"]
    st = wait_state(run_dir, {"finished", "failed"})
    assert st["state"] == "finished" and st["rc"] == 0
    assert st["last_log"]["current_steps"] == 4 and st["last_log"]["total_steps"] == 4
    assert st["outputs_complete"] is True
    assert st["world_size"] == 2 and st["ranks_joined"] == [0]
    assert (run_dir / "rc").read_text().strip() == "0"
    assert marked(run_dir) == []


def test_env_reaches_trainer_as_data(tmp_path: Path) -> None:
    run_dir = tmp_path / "t-env"
    run_dir.mkdir()
    (run_dir / "env.json").write_text(json.dumps({"WEIRD": "a b; $(rm -rf /) 'q'"}))
    job = {
        "run_id": "t-env",
        "node_rank": 0,
        "expect_outputs": [],
        "output_dir": str(run_dir),
        "argv": [sys.executable, "-c", "import os; print('WEIRD=' + os.environ['WEIRD'])"],
    }
    (run_dir / "job.json").write_text(json.dumps(job))
    agent_json("start", str(run_dir))
    wait_state(run_dir, {"finished"})
    assert "WEIRD=a b; $(rm -rf /) 'q'" in (run_dir / "trainer.log").read_text()


def test_failing_trainer_is_failed_and_leaves_no_process(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "t-fail", "--steps", "5", "--step-s", "0.1", "--fail-at", "2")
    agent_json("start", str(run_dir))
    st = wait_state(run_dir, {"failed", "finished"})
    assert st["state"] == "failed" and st["rc"] == 3
    assert st["outputs_complete"] is False


def test_killed_trainer_sweeps_detached_workers(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "t-kill", "--steps", "100", "--step-s", "0.2")
    started = agent_json("start", str(run_dir), "--grace", "2")
    time.sleep(1.0)
    assert len(marked(run_dir)) == 2  # trainer + its worker in its own session
    os.kill(started["pid"], signal.SIGKILL)  # the worker is orphaned, like torchrun's ranks
    st = wait_state(run_dir, {"failed"})
    assert st["rc"] == -9
    assert marked(run_dir) == []


def test_stop_is_idempotent_and_marks_stopped(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "t-stop", "--steps", "100", "--step-s", "0.2")
    agent_json("start", str(run_dir))
    wait_state(run_dir, {"running"})
    time.sleep(0.5)
    first = agent_json("stop", str(run_dir), "--grace", "2")
    assert first["ok"] and first["changed"] and first["left"] == []
    assert agent_json("status", str(run_dir))["state"] == "stopped"
    second = agent_json("stop", str(run_dir))
    assert second["ok"] and not second["changed"]
    assert marked(run_dir) == []


@pytest.mark.parametrize("command", ["status", "stop"])
def test_a_reused_pid_is_not_the_trainer(tmp_path: Path, command: str) -> None:
    """The state file names a trainer that ended long ago; its pid now belongs to another program (pids are
    reused: this machine's pid_max is 32768). Neither status nor stop takes it for the trainer: the other
    program is not signalled (the unit-test flake of a stop that killed another test's trainer)."""
    run_dir = make_run(tmp_path, f"t-reused-{command}")
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)  # a group leader, like a trainer
    try:
        (run_dir / "state.json").write_text(
            json.dumps({"state": "running", "pid": other.pid, "supervisor_pid": 999998})
        )
        result = agent_json(command, str(run_dir), *(["--grace", "1"] if command == "stop" else []))
        assert result["state"] == ("vanished" if command == "status" else "stopped")
        if command == "stop":
            assert not result["changed"]
        assert other.poll() is None, "the agent signalled a process that is not the run's"
    finally:
        other.kill()
        other.wait()


def test_a_reused_supervisor_pid_is_not_the_supervisor(tmp_path: Path) -> None:
    """The supervisor and its trainer ended (a node reboot, a kill -9 of both) and another program got the
    supervisor's pid: status says vanished (it said running for as long as that program lived), and start
    starts the trainer again (it answered "already running")."""
    run_dir = make_run(tmp_path, "t-reused-supervisor")
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        state = {
            "state": "running",
            "pid": 999999,
            "supervisor_pid": other.pid,
            "supervisor_id": "an earlier boot:12345",
            "started_at": time.time(),
        }
        (run_dir / "state.json").write_text(json.dumps(state))
        assert agent_json("status", str(run_dir))["state"] == "vanished"
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_the_supervisor_records_who_it_is(tmp_path: Path) -> None:
    """The state file of a started run names the supervisor by pid and by identity (boot id, start time)."""
    run_dir = make_run(tmp_path, "t-supervisor-id")
    agent_json("start", str(run_dir))
    try:
        state = json.loads((run_dir / "state.json").read_text())
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        assert str(state.get("supervisor_id", "")).startswith(boot + ":"), state
    finally:
        agent_json("stop", str(run_dir), "--grace", "1")


def test_status_of_missing_run_dir(tmp_path: Path) -> None:
    assert agent_json("status", str(tmp_path / "nope"))["state"] == "absent"


@pytest.mark.parametrize("command", ["status", "stop"])
def test_vanished_supervisor_and_trainer(tmp_path: Path, command: str) -> None:
    run_dir = make_run(tmp_path, f"t-van-{command}")
    (run_dir / "state.json").write_text(
        json.dumps({"state": "running", "pid": 999999, "supervisor_pid": 999998})
    )
    result = agent_json(command, str(run_dir))
    assert result["state"] == ("vanished" if command == "status" else "stopped")


def test_start_unpacks_the_bundle_with_private_modes(tmp_path: Path) -> None:
    run_dir = tmp_path / "t-bundle"
    run_dir.mkdir()
    job = fake_trainer_job(run_dir, "--steps", "1")
    bundle = {"files": {"train.yaml": "a: 1\n", "../escape.txt": "x"}, "job": job, "env": {"HF_TOKEN": "t"}}
    (run_dir / "bundle.json").write_text(json.dumps(bundle))
    refused = agent_json("start", str(run_dir))  # mift_contract: plain file names only
    assert not refused["ok"] and "plain file names only" in refused["error"]
    assert not (tmp_path / "escape.txt").exists() and not (run_dir / "escape.txt").exists()
    del bundle["files"]["../escape.txt"]
    (run_dir / "bundle.json").write_text(json.dumps(bundle))
    assert agent_json("start", str(run_dir))["ok"]
    assert not (run_dir / "bundle.json").exists()
    for name in ("train.yaml", "env.json", "job.json"):
        assert (run_dir / name).stat().st_mode & 0o777 == 0o600
    assert wait_state(run_dir, {"finished", "failed"})["state"] == "finished"


def test_a_restart_judges_only_its_own_log(tmp_path: Path) -> None:
    """A second start in the same run dir (the launcher's recovery) appends to trainer.log; its status reports
    the failure lines of that start only, not the earlier start's torchrun report of a killed rank."""
    run_dir = make_run(tmp_path, "t-restart", "--steps", "2", "--step-s", "0.1")
    killed = "  traceback : Signal 9 (SIGKILL) received by PID 4242\n"
    (run_dir / "trainer.log").write_text("step 1\n" + killed)
    agent_json("start", str(run_dir))
    st = wait_state(run_dir, {"finished", "failed"})
    assert st["state"] == "finished", st
    assert st["failure_lines"] == [], st["failure_lines"]
    assert killed in (run_dir / "trainer.log").read_text()  # the earlier start's lines are kept
    state = json.loads((run_dir / "state.json").read_text())
    assert state["log_offset"] == len("step 1\n" + killed)


def test_trainer_env_creates_the_kept_tunableop_directory(tmp_path: Path) -> None:
    module = node_supervise
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    results = tmp_path / "kept" / "tunableop" / "tunableop_results.csv"
    (run_dir / "env.json").write_text(json.dumps({"PYTORCH_TUNABLEOP_FILENAME": str(results)}))
    env = module._trainer_env(run_dir, {"run_id": "r1"})
    assert env["PYTORCH_TUNABLEOP_FILENAME"] == str(results)
    assert results.parent.is_dir()

"""The job engine end to end on two "nodes" that are this machine (ansible_connection=local).

The trainer is the test double ``tests/unit/fake_trainer.py``, installed as
``<fake venv>/bin/llamafactory-cli``, so these tests exercise the real playbooks, ansible-runner, the node
agent, follow, stop and the run directory without test hosts. The real training runs in
``test_launcher_e2e.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mift_testsupport.proc import playbooks_against

REPO = Path(__file__).parents[2]
FAKE = REPO / "tests" / "unit" / "fake_trainer.py"
pytestmark = pytest.mark.slow


@pytest.fixture
def lab(tmp_path: Path) -> dict[str, Path]:
    venv_bin = tmp_path / "fakevenv" / "bin"
    venv_bin.mkdir(parents=True)
    cli = venv_bin / "llamafactory-cli"
    cli.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n')
    cli.chmod(0o755)
    hosts = {
        "trainers": {
            "hosts": {
                "n0": {"mift_runs_root": str(tmp_path / "node0"), "train_address": "127.0.0.1"},
                "n1": {"mift_runs_root": str(tmp_path / "node1"), "train_address": "127.0.0.1"},
            },
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"},
        }
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(hosts))
    # the validator maps node paths (/opt/mift/data/...) through a configs/{train,data} layout
    (tmp_path / "configs" / "train").mkdir(parents=True)
    (tmp_path / "configs" / "data").symlink_to(REPO / "configs" / "data")
    # the loopback "nodes" are this machine: the folders preflight requires on every node are made here (a
    # model folder of empty files: the fake trainer opens nothing), the dataset folder is the repo's
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "model.safetensors"):
        (model / name).write_text("")
    train = (REPO / "configs" / "train" / "tiny_cpu_lora_sft.yaml").read_text()
    train = train.replace("/opt/mift/models/tiny-llama", str(model))
    train = train.replace("/opt/mift/data/tiny_alpaca", str(REPO / "configs" / "data" / "tiny_alpaca"))
    (tmp_path / "configs" / "train" / "train.yaml").write_text(train)
    (tmp_path / "runs").mkdir()
    return {"root": tmp_path, "inventory": tmp_path / "hosts.yml", "runs": tmp_path / "runs"}


def job_spec(lab: dict[str, Path], name: str, *, recovery: dict | None = None, **env: object) -> Path:
    spec: dict[str, object] = {
        "name": name,
        "train_config": "configs/train/train.yaml",
        "deepspeed": str(REPO / "configs" / "deepspeed" / "ds_z3.json"),
        "nproc_per_node": 1,
        "master_port": 29633,
        "node_venv": str(lab["root"] / "fakevenv"),
        "poll_interval_s": 1,
        "timeouts": {"stop_grace_s": 3},
        "env": {"FAKE_STEPS": 6, "FAKE_STEP_S": 0.4, "HF_TOKEN": "hf_secret_value", **env},
    }
    if recovery is not None:
        spec["recovery"] = recovery
    path = lab["root"] / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def launcher(lab: dict[str, Path], *args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MIFT_RUNS_DIR": str(lab["runs"])}
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start(lab: dict[str, Path], *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "MIFT_RUNS_DIR": str(lab["runs"])}
    return subprocess.Popen(
        [sys.executable, "-m", "launcher", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def only_run(lab: dict[str, Path]) -> Path:
    (run,) = list(lab["runs"].iterdir())
    return run


def record(run: Path) -> dict:
    return json.loads((run / "record.json").read_text())


def node_state(lab: dict[str, Path], node: int, run_id: str) -> dict:
    path = lab["root"] / f"node{node}" / run_id / "state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def run_processes(run_id: str) -> list[int]:
    """Return pids of this machine carrying the run's marker (the agent's MIFT_AGENT_KEY)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                env = (entry / "environ").read_bytes()
            except OSError:
                continue
            if f"MIFT_AGENT_KEY={run_id}@".encode() in env:
                found.append(int(entry.name))
    return found


def playbooks_left(lab: dict[str, Path]) -> list[str]:
    """The ansible-playbook processes still running against the lab's inventory: the launcher's background
    poll playbook must end with the follow."""
    return playbooks_against(lab["inventory"])


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


# real RCCL init lines (libibverbs missing: "Using network Socket"), printed by every rank of the fake trainer
NCCL_SOCKET_CAPTURE = REPO / "tests" / "fixtures" / "nccl" / "rccl_socket_no_libibverbs.log"


def test_run_succeeds_with_metrics_plot_and_masked_secret(lab: dict[str, Path]) -> None:
    """... and the network RCCL chose (``Using network Socket``, printed by the trainer test double) reaches
    the record through the real agent's status and collect; the loopback nodes have no RDMA, so none is
    expected and nothing is judged (tests/unit/test_fabric_runtime.py judges it in-process)."""
    spec = job_spec(lab, "ok", FAKE_NCCL_LOG=str(NCCL_SOCKET_CAPTURE))
    out = launcher(lab, "run", str(spec), "-i", str(lab["inventory"]))
    assert out.returncode == 0, out.stdout + out.stderr
    run = only_run(lab)
    rec = record(run)
    assert rec["status"] == "succeeded"
    assert [t["status"] for t in rec["timeline"]] == [
        "created",
        "preflight",
        "starting",
        "running",
        "succeeded",
    ]
    assert rec["hosts"] == ["n0", "n1"] and rec["summary"]["world_size"] == 2
    assert rec["node_env"]["n1"]["NODE_RANK"] == "1" and rec["node_env"]["n0"]["MASTER_ADDR"] == "127.0.0.1"
    assert rec["node_env"]["n0"]["HF_TOKEN"] == "***"
    assert "hf_secret_value" not in "".join(
        p.read_text(errors="replace") for p in run.rglob("*") if p.is_file()
    )
    losses = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 6
    assert (run / "loss.png").stat().st_size > 1000
    assert (run / "nodes" / "n0" / "trainer.log").is_file() and (
        run / "nodes" / "n1" / "trainer.log"
    ).is_file()
    assert "final loss" in out.stdout and "adapter" in out.stdout
    assert not playbooks_left(lab), playbooks_left(lab)
    assert (lab["root"] / "node0" / run.name / "env.json").stat().st_mode & 0o777 == 0o600
    listing = launcher(lab, "list")
    assert run.name in listing.stdout and "succeeded" in listing.stdout
    status = launcher(lab, "status")
    assert status.returncode == 0 and "succeeded" in status.stdout
    logs = launcher(lab, "logs", run.name, "--node", "1")
    assert "Process rank: 1" in logs.stdout
    assert {h: n.get("net_transport") for h, n in rec["nodes"].items()} == {
        "n0": ["Socket"],
        "n1": ["Socket"],
    }
    assert rec.get("transport") is None and "fell back" not in out.stdout


def test_killed_trainer_fails_the_job_everywhere(lab: dict[str, Path]) -> None:
    # recovery off: this case shows the stop everywhere that ends a run (recovery retries a killed trainer)
    job = job_spec(lab, "kill", recovery={"max_restarts": 0}, FAKE_STEPS=200)
    proc = start(lab, "run", str(job), "-i", str(lab["inventory"]))
    wait_for(
        lambda: any(lab["runs"].iterdir()) and node_state(lab, 1, only_run(lab).name).get("pid"),
        400,
        "the trainer on n1",
    )
    run = only_run(lab)
    time.sleep(2)
    os.kill(node_state(lab, 1, run.name)["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: not run_processes(run.name), 30, "no trainer process left within 30 s")
    assert time.monotonic() - killed_at < 30
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out
    rec = record(run)
    assert rec["status"] == "failed" and "n1: trainer exited rc=-9" in rec["result_reason"]
    assert (run / "nodes" / "n1" / "trainer.log").is_file()


def test_ctrl_c_while_following_stops_everywhere(lab: dict[str, Path]) -> None:
    proc = start(lab, "run", str(job_spec(lab, "sigint", FAKE_STEPS=200)), "-i", str(lab["inventory"]))
    wait_for(
        lambda: any(lab["runs"].iterdir()) and record(only_run(lab))["status"] == "running", 400, "running"
    )
    time.sleep(2)
    run = only_run(lab)
    proc.send_signal(signal.SIGINT)
    wait_for(lambda: not run_processes(run.name), 30, "no trainer process left within 30 s of Ctrl-C")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out
    rec = record(run)
    assert rec["status"] == "stopped"
    assert node_state(lab, 0, run.name)["state"] == "stopped"
    assert not playbooks_left(lab), playbooks_left(lab)  # the follow's poll playbook and its workers too


def test_detach_then_stop(lab: dict[str, Path]) -> None:
    out = launcher(
        lab, "run", str(job_spec(lab, "detach", FAKE_STEPS=200)), "-i", str(lab["inventory"]), "--detach"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    run = only_run(lab)
    assert run_processes(run.name)
    status = launcher(lab, "status", run.name)
    assert status.returncode == 0 and "running" in status.stdout
    stop = launcher(lab, "stop", run.name)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert not run_processes(run.name)
    assert record(run)["status"] == "stopped"
    again = launcher(lab, "stop", run.name)
    assert again.returncode == 0


def test_detached_run_is_finalized_by_status(lab: dict[str, Path]) -> None:
    out = launcher(
        lab,
        "run",
        str(job_spec(lab, "detach-ok", FAKE_STEPS=3, FAKE_STEP_S=0.2)),
        "-i",
        str(lab["inventory"]),
        "--detach",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    run = only_run(lab)
    wait_for(
        lambda: launcher(lab, "status", run.name).returncode == 0 and record(run)["status"] == "succeeded",
        90,
        "status to finalize the run",
    )
    assert (run / "loss.png").is_file()


def test_bad_input_exits_2_and_starts_nothing(lab: dict[str, Path]) -> None:
    spec = lab["root"] / "typo.yaml"
    spec.write_text("name: typo\ntrain_config: configs/train/train.yaml\nmaster_prot: 29500\n")
    out = launcher(lab, "run", str(spec), "-i", str(lab["inventory"]))
    assert out.returncode == 2
    assert "master_prot: unknown key; did you mean 'master_port'?" in out.stderr


def test_unreachable_host_exits_2_naming_it(lab: dict[str, Path]) -> None:
    inventory = lab["root"] / "bad.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "trainers": {
                    "hosts": {
                        "ghost": {"ansible_host": "127.0.0.1", "ansible_port": 1, "ansible_user": "root"}
                    }
                }
            }
        )
    )
    out = launcher(lab, "run", str(job_spec(lab, "ghost")), "-i", str(inventory))
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("error: ghost: unreachable")
    assert record(only_run(lab))["status"] == "rejected"


def test_killed_trainer_is_retried_in_the_same_run(lab: dict[str, Path]) -> None:
    """Recovery on: n1's trainer SIGKILLed; every node is stopped, and the second attempt (the fake trainer
    saves no checkpoint: from step 0, said) runs in the same node run directories to success."""
    job = job_spec(lab, "retry", recovery={"backoff_s": 0}, FAKE_STEPS=30)
    proc = start(lab, "run", str(job), "-i", str(lab["inventory"]))
    wait_for(
        lambda: any(lab["runs"].iterdir()) and node_state(lab, 1, only_run(lab).name).get("pid"),
        400,
        "the trainer on n1",
    )
    run = only_run(lab)
    time.sleep(2)
    first_pid = node_state(lab, 1, run.name)["pid"]
    os.kill(first_pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    rec = record(run)
    first, second = rec["attempts"]
    assert (first["state"], first["kind"], first["failed_host"]) == ("failed", "trainer_signal", "n1"), first
    assert (second["state"], second["resume_step"]) == ("succeeded", None), second
    assert "attempt 1 failed (trainer_signal on n1): retrying" in out
    assert "no checkpoint complete on every node: the next attempt starts again from step 0" in out
    assert node_state(lab, 1, run.name)["pid"] != first_pid
    assert rec["status"] == "succeeded" and not run_processes(run.name)


def test_a_stalled_run_ends_stalled_with_stack_dumps_and_nothing_left(lab: dict[str, Path]) -> None:
    """SIGSTOP the trainer of n0 (the node that logs steps): the progress watchdog ends the run ``stalled``
    within its window, names n0, and the stop writes stack dumps that collect brings back."""
    # recovery off: this case shows the watchdog's end of a run (recovery retries a stall)
    spec = job_spec(lab, "stall", recovery={"max_restarts": 0}, FAKE_STEPS=400, FAKE_STEP_S=0.3, RANK=0)
    data = yaml.safe_load(spec.read_text())
    data["watchdog"] = {"k": 2, "floor_s": 4, "first_step_s": 120, "save_s": 2, "eval_s": 2}
    spec.write_text(yaml.safe_dump(data))
    proc = start(lab, "run", str(spec), "-i", str(lab["inventory"]))
    wait_for(
        lambda: (
            any(lab["runs"].iterdir())
            and (lab["root"] / "node0" / only_run(lab).name / "output" / "trainer_log.jsonl").is_file()
            and len(
                (lab["root"] / "node0" / only_run(lab).name / "output" / "trainer_log.jsonl")
                .read_text()
                .splitlines()
            )
            >= 6
        ),
        400,
        "6 steps on n0",
    )
    run = only_run(lab)
    pid = node_state(lab, 0, run.name)["pid"]
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.time()
    out, _ = proc.communicate(timeout=300)
    rec = record(run)
    assert proc.returncode == 1, out
    assert rec["status"] == "stalled", rec["timeline"]
    assert rec["stall"]["lagging"] == ["n0"] and f"n0/rank 0 (pid {pid}) stopped" in rec["result_reason"]
    stalled_at = next(e["t"] for e in rec["timeline"] if e["status"] == "stopping")
    # seen at the first poll after the window: a poll period and a poll's own time (seconds when busy)
    assert stalled_at - stopped_at <= rec["stall"]["window_s"] + 30, (stalled_at - stopped_at, rec["stall"])
    stack = run / "nodes" / "n0" / f"stack-rank0-{pid}.txt"
    assert stack.read_text().startswith(f"pid {pid} state T rank 0"), stack.read_text()[:300]
    assert list((run / "nodes" / "n1").glob("stack-rank0-*.txt"))
    assert "stalled: no progress for" in out and "lagging     n0:" in out
    assert not run_processes(run.name)
    status = launcher(lab, "status", run.name)
    assert status.returncode == 1 and "stalled" in status.stdout

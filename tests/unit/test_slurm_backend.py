"""The slurm backend's pure parts (batch script, scontrol/sinfo parsing, the partition check), the agent's
``prepare`` and ``slurm-step`` (with a ``scontrol`` TEST DOUBLE: this machine runs no Slurm), and the backend
choice from the inventory."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from node_agent import AGENT, fake_trainer_job, run_agent

from launcher.backends import choose_backend
from launcher.backends.slurm import first_failure, login_host, record_master
from launcher.backends.slurm_script import (
    Allocation,
    Partition,
    Requeue,
    SlurmJob,
    check_request,
    parse_sinfo,
    sbatch_script,
)
from launcher.exceptions import ConfigurationError
from launcher.rundir.runs import RunDir
from launcher.spec.jobspec import SlurmOptions
from launcher.spec.jobspec_load import parse_job_spec
from mift_testsupport.slurm import srun_task_env

FAKE = Path(__file__).with_name("fake_trainer.py")


def alloc(requeue: Requeue | None = None, *, ranks: bool = False, **options: object) -> Allocation:
    """A 2-node allocation of run r1 (``options``: the job spec's slurm keys)."""
    return Allocation(
        run_id="r1",
        run_dir="/var/lib/mift/runs/r1",
        nodes=("node1", "node2"),
        gpus_per_node=8,
        stop_grace_s=8,
        options=SlurmOptions.model_validate(options),
        ranks=ranks,
        requeue=requeue,
    )


def test_sbatch_script_asks_for_the_nodes_and_runs_one_agent_task_per_node() -> None:
    script = sbatch_script(alloc(partition="mi300x", account="ml", time_limit="2-00:00:00"))
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --nodelist=node1,node2",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --time=2-00:00:00",
        "#SBATCH --partition=mi300x",
        "#SBATCH --account=ml",
        "#SBATCH --output=/var/lib/mift/runs/r1/slurm.out",
    ):
        assert line in lines
    assert lines[-1] == (
        "exec srun --kill-on-bad-exit=1 --nodes=2 --ntasks=2 --ntasks-per-node=1 python3 "
        "/var/lib/mift/runs/r1/mift_node.pyz agent slurm-step /var/lib/mift/runs/r1 --grace 8"
    )
    bare = sbatch_script(alloc())
    assert "--partition" not in bare and "--account" not in bare and "--time" not in bare


def test_scontrol_states_and_reasons() -> None:
    pending = SlurmJob.from_scontrol(
        "7",
        0,
        "JobId=7 JobName=mift-r1 UserId=root(0) JobState=PENDING Reason=Resources Dependency=(null) "
        "ExitCode=0:0 NodeList=(null)\n",
        "",
    )
    assert (pending.state, pending.reason) == ("PENDING", "Resources")
    assert pending.describe() == "slurm job 7 PENDING (Resources, ExitCode=0:0)"
    timeout = SlurmJob.from_scontrol(
        "8",
        0,
        "JobId=8 JobState=TIMEOUT Reason=TimeLimit Dependency=(null) ExitCode=0:15 NodeList=h[1-2]",
        "",
    )
    assert (timeout.state, timeout.reason, timeout.exit_code) == ("TIMEOUT", "TimeLimit", "0:15")
    running = SlurmJob.from_scontrol("9", 0, "JobId=9 JobState=RUNNING Reason=None ExitCode=0:0", "")
    assert running.reason == ""
    gone = SlurmJob.from_scontrol("10", 1, "", "slurm_load_jobs error: Invalid job id specified\n")
    assert gone.state == "GONE"


def test_sinfo_partitions_take_the_smallest_node() -> None:
    parts = parse_sinfo("mift*|2|gpu:mi300x:8\nbig|3|gpu:mi300x:8\nbig|1|gpu:mi300x:4(S:0-1)\ncpu|4|(null)\n")
    assert parts == [
        Partition("mift", 2, 8, default=True),
        Partition("big", 4, 4, default=False),
        Partition("cpu", 4, 0, default=False),
    ]


@pytest.mark.parametrize(
    ("options", "nodes", "gpus", "expected"),
    [
        ({}, 3, 8, "job.yaml: hosts: the job asks for 3 nodes, partition 'mift' has 2"),
        ({}, 2, 9, "job.yaml: slurm.gpus_per_node: the job asks for 9 GPUs per node, partition 'mift' has 8"),
        (
            {"partition": "gpu"},
            1,
            1,
            "job.yaml: slurm.partition: no partition 'gpu' (the cluster has: mift, cpu)",
        ),
        ({"partition": "cpu"}, 1, 1, "partition 'cpu' has 0 on its smallest node"),
    ],
)
def test_requests_that_cannot_fit_fail_in_one_line(
    options: dict, nodes: int, gpus: int, expected: str
) -> None:
    parts = [Partition("mift", 2, 8, default=True), Partition("cpu", 4, 0, default=False)]
    with pytest.raises(ConfigurationError) as err:
        check_request(parts, SlurmOptions.model_validate(options), nodes, gpus, "job.yaml")
    assert str(err.value).startswith("job.yaml: ")
    assert expected in str(err.value)
    assert "\n" not in str(err.value)
    assert check_request(parts, SlurmOptions(), 2, 8, "job.yaml").name == "mift"


def test_job_spec_slurm_options_are_checked() -> None:
    ok = parse_job_spec(
        {"name": "a", "train_config": "t", "slurm": {"time_limit": "1:30:00"}}, Path("x.yaml")
    )
    assert ok.slurm.time_limit == "1:30:00"
    with pytest.raises(ConfigurationError) as err:
        parse_job_spec({"name": "a", "train_config": "t", "slurm": {"time_limit": "1h"}}, Path("x.yaml"))
    assert "slurm.time_limit" in str(err.value)
    with pytest.raises(ConfigurationError) as err:
        parse_job_spec({"name": "a", "train_config": "t", "slurm": {"partitoin": "x"}}, Path("x.yaml"))
    assert "did you mean 'partition'" in str(err.value)


def test_first_failure_names_the_node_that_failed_first() -> None:
    nodes = {
        "h1": {"state": "stopped", "rc": -15, "ended_at": 5.0},
        "h2": {"state": "failed", "rc": -9, "ended_at": 3.0},
        "h3": {"state": "failed", "rc": 1, "ended_at": 4.0},
    }
    assert first_failure(nodes) == "h2: trainer exited rc=-9"
    assert first_failure({"h1": {"state": "finished", "rc": 0}}) == ""


def test_login_host_from_the_inventory() -> None:
    assert login_host({}, {"slurm_controller": ["head"]}, "j") == "head"
    assert login_host({}, {"slurm_login": ["login1"], "slurm_controller": ["head"]}, "j") == "login1"
    assert login_host({"mift_slurm_login_host": "x"}, {"slurm_controller": ["head"]}, "j") == "x"
    with pytest.raises(ConfigurationError, match="j: backend slurm: no login host"):
        login_host({}, {"trainers": ["n1"]}, "j")


def test_backend_from_the_inventory_and_the_command_line(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  vars:\n    mift_launcher_backend: slurm\n  children:\n"
        "    trainers:\n      hosts:\n        n1: {}\n    slurm_controller:\n      hosts:\n        head: {}\n"
    )
    job = tmp_path / "job.yaml"
    assert choose_backend(None, inv, job) == {"backend": "slurm", "slurm": {"login_host": "head"}}
    assert choose_backend("ssh", inv, job) == {"backend": "ssh"}
    bad = tmp_path / "bad.yml"
    bad.write_text("all:\n  vars:\n    mift_launcher_backend: pbs\n  hosts:\n    n1: {}\n")
    with pytest.raises(ConfigurationError, match="mift_launcher_backend: 'pbs' is not a backend"):
        choose_backend(None, bad, job)


# --- the node agent under Slurm ---------------------------------------------------------------------------
def prepared_run(tmp_path: Path, *trainer_args: str) -> Path:
    run_dir = tmp_path / "r-slurm"
    run_dir.mkdir()
    job = fake_trainer_job(run_dir, *trainer_args, expect=("adapter_model.safetensors", "all_results.json"))
    env = {"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    (run_dir / "bundle.json").write_text(json.dumps({"files": {}, "job": job, "env": env}))
    answer = json.loads(run_agent("prepare", str(run_dir)).stdout)
    assert answer["ok"] and answer["state"] == "queued"
    assert json.loads(run_agent("status", str(run_dir)).stdout)["state"] == "queued"
    return run_dir


def slurm_env(tmp_path: Path, node_id: str) -> dict[str, str]:
    return srun_task_env(tmp_path, node_id, ("nodeA", "nodeB"))


def test_slurm_step_takes_rank_and_master_from_slurm_and_runs_in_the_foreground(tmp_path: Path) -> None:
    run_dir = prepared_run(tmp_path, "--steps", "2", "--step-s", "0.05", "--follower")
    proc = run_agent("slurm-step", str(run_dir), "--grace", "2", env=slurm_env(tmp_path, "1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env = json.loads((run_dir / "env.json").read_text())
    assert (env["NODE_RANK"], env["NNODES"], env["MASTER_ADDR"]) == ("1", "2", "nodeA")
    assert env["ROCR_VISIBLE_DEVICES"] == "0"
    assert json.loads((run_dir / "job.json").read_text())["node_rank"] == 1
    status = json.loads(run_agent("status", str(run_dir)).stdout)
    assert (status["state"], status["master_addr"]) == ("finished", "nodeA")  # what the record takes


def test_the_record_takes_the_master_the_allocation_gave_the_nodes(tmp_path: Path) -> None:
    """The plan's MASTER_ADDR (the first inventory host's train_address) is replaced in record.json by the
    allocation's first node once a node reports it; nodes that report nothing change nothing."""
    run = RunDir(tmp_path / "r1")
    run.path.mkdir()
    env = {"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "0"}
    run.save(
        {"run_id": "r1", "master_addr": "10.0.0.1", "node_env": {"h1": env, "h2": {**env, "NODE_RANK": "1"}}}
    )
    record_master(run, {"h1": {"state": "queued"}, "h2": {"state": "pending(Resources)"}})
    assert run.load()["master_addr"] == "10.0.0.1"
    record_master(run, {"h1": {"state": "running", "master_addr": "nodeA"}, "h2": {"state": "running"}})
    record = run.load()
    assert record["master_addr"] == "nodeA"
    assert record["node_env"] == {
        "h1": {"MASTER_ADDR": "nodeA", "NODE_RANK": "0"},
        "h2": {"MASTER_ADDR": "nodeA", "NODE_RANK": "1"},
    }


def test_slurm_step_exits_non_zero_when_the_trainer_fails(tmp_path: Path) -> None:
    run_dir = prepared_run(tmp_path, "--steps", "5", "--step-s", "0.05", "--fail-at", "2")
    proc = run_agent("slurm-step", str(run_dir), "--grace", "2", env=slurm_env(tmp_path, "0"))
    assert proc.returncode == 1
    status = json.loads(run_agent("status", str(run_dir)).stdout)
    assert status["state"] == "failed" and status["rc"] != 0


def test_slurm_step_stops_the_trainer_on_sigterm(tmp_path: Path) -> None:
    run_dir = prepared_run(tmp_path, "--steps", "1000", "--step-s", "0.1")
    step = subprocess.Popen(
        [sys.executable, str(AGENT), "agent", "slurm-step", str(run_dir), "--grace", "2"],
        env=slurm_env(tmp_path, "0"),
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while json.loads(run_agent("status", str(run_dir)).stdout)["state"] != "running":
        assert time.monotonic() < deadline, "the trainer never ran"
        time.sleep(0.1)
    step.send_signal(signal.SIGTERM)  # what slurmstepd sends on scancel or another node's failure
    assert step.wait(timeout=30) == 1
    status = json.loads(run_agent("status", str(run_dir)).stdout)
    assert status["state"] == "stopped" and status["processes"] == 0

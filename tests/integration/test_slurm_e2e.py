"""The launcher's slurm backend end to end: Slurm provisioned on 3 systemd-mode test hosts (host3 the head,
host1 and host2 the nodes; mift_testsupport.slurm), then the tiny ZeRO-3 job through ``sbatch``/``srun``.

The hosts start from the provisioned host image (``mift_testsupport.image``: ``provision.yml`` once on a
systemd-mode host, kept; every suite's image); only ``playbooks/slurm.yml`` runs, once for this module and
test_slurm_login_e2e.py together (the session fixture ``slurm_cluster``, tests/integration/conftest.py). The
test hosts have no GPU device nodes: empty files stand in for the render nodes gres.conf names (TEST DOUBLE,
as in molecule ``slurm``).

Shows: Slurm provisioned (every node idle, 8 GPUs each counted); the job across 2 nodes (world size 2,
losses, adapter, status succeeded, the Slurm job COMPLETED); a request larger than the partition refused in
one line before anything is submitted; a pending job showing its queue reason; killing one node's trainer
ends the whole job (``--kill-on-bad-exit``) within 30 s as failed with Slurm's state; ``stop`` cancels a
running job and leaves no process on any host; a job Slurm stops at its time limit ends failed with Slurm's
reason; a job requeued after a node failure and again at its time limit resumes each time from the last
checkpoint complete on both nodes and finishes, every attempt in the record.

    SLURM_E2E_RIG_ID=9 pytest -q tests/integration/test_slurm_e2e.py
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import pytest

from mift_testsupport.cluster import INJECT_DIR, Cluster
from mift_testsupport.launcher import finish
from mift_testsupport.slurm import (
    HEAD,
    kill_and_follow,
    run_to_success,
    scontrol_job,
    squeue,
    stop_and_check,
    wait_checkpoint,
    wait_restart,
)

if TYPE_CHECKING:
    from mift_testsupport.slurm import SlurmRig

pytestmark = [pytest.mark.rig, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(slurm_cluster: SlurmRig, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    """The session's Slurm cluster (tests/integration/conftest.py), the launcher given every host."""
    c = Cluster(slurm_cluster.rig, tmp_path_factory.mktemp("slurm-e2e"))
    c.inventory = slurm_cluster.inventory
    return c


def test_slurm_is_provisioned(cluster: Cluster) -> None:
    sinfo = cluster.ssh(HEAD, "sinfo --noheader --Node --format='%N %P %t %G'").split("\n")
    print("\n".join(sinfo))
    assert sorted(x for x in sinfo if x) == ["host1 mift* idle gpu:mi300x:8", "host2 mift* idle gpu:mi300x:8"]


def test_tiny_zero3_across_two_nodes_through_slurm(cluster: Cluster) -> None:
    job = cluster.job("slurm-z3", hosts="slurm_nodes", slurm={"gpus_per_node": 1, "time_limit": "15:00"})
    run_to_success(cluster, job, cluster.inventory, "slurm backend")
    rec = cluster.record("slurm-z3")
    run = cluster.run_dir("slurm-z3")
    assert rec["backend"] == "slurm" and rec["status"] == "succeeded"
    assert rec["slurm"]["state"] == "COMPLETED" and rec["slurm"]["login_host"] == f"host{HEAD}"
    assert rec["summary"]["world_size"] == 2, rec["nodes"]
    losses = [json.loads(line).get("loss") for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x for x in losses if isinstance(x, float)], losses
    assert any(p.endswith("adapter_model.safetensors") for p in rec["outputs"]["host1"])
    assert (run / "loss.png").stat().st_size > 1000
    script = (run / "job.sbatch").read_text()
    assert "#SBATCH --gpus-per-node=1" in script and "--kill-on-bad-exit=1" in script
    # the same environment as the ssh backend, rank and master from the allocation
    env2 = json.loads(cluster.ssh(2, f"cat /var/lib/mift/runs/{rec['run_id']}/env.json"))
    assert (env2["NODE_RANK"], env2["NNODES"], env2["MASTER_ADDR"]) == ("1", "2", "host1")
    assert env2["FORCE_TORCHRUN"] == "1"
    # the record holds the rendezvous the allocation gave, not the plan's (host1's train_address)
    assert rec["master_addr"] == "host1" and rec["node_env"]["host1"]["MASTER_ADDR"] == "host1"
    status = cluster.run("status", rec["run_id"])
    assert status.returncode == 0 and "succeeded" in status.stdout and "COMPLETED" in status.stdout
    listing = cluster.run("list")
    assert f"slurm:{rec['slurm']['job_id']}" in listing.stdout


def test_a_request_larger_than_the_partition_is_refused_before_submitting(cluster: Cluster) -> None:
    before = cluster.ssh(HEAD, "scontrol show config | grep -i '^NEXT_JOB_ID' || true")
    job = cluster.job("slurm-big", hosts="slurm_nodes", slurm={"gpus_per_node": 9})
    out = cluster.run("run", str(job), "-i", str(cluster.inventory))
    errors = [line for line in out.stderr.splitlines() if line.strip()]
    print(errors)
    assert out.returncode == 2, out.stdout + out.stderr
    assert len(errors) == 1
    assert "slurm.gpus_per_node: the job asks for 9 GPUs per node, partition 'mift' has 8" in errors[0]
    assert cluster.ssh(HEAD, "scontrol show config | grep -i '^NEXT_JOB_ID' || true") == before
    assert cluster.record("slurm-big")["status"] == "rejected"


def test_a_pending_job_shows_its_queue_reason_then_stop_cancels_it(cluster: Cluster) -> None:
    blocker = cluster.ssh(HEAD, "sbatch --parsable --nodes=2 --exclusive --wrap 'sleep 600'").strip()
    try:
        job = cluster.job("slurm-queued", hosts="slurm_nodes", max_steps=2000, paced=True)
        out = cluster.run("run", str(job), "-i", str(cluster.inventory), "--detach")
        assert out.returncode == 0, out.stdout + out.stderr
        run_id = cluster.record("slurm-queued")["run_id"]
        status = cluster.run("status", run_id)
        print(status.stdout)
        assert "PENDING" in status.stdout and "pending(" in status.stdout, status.stdout
        stop = cluster.run("stop", run_id)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert cluster.record("slurm-queued")["status"] == "stopped"
    finally:
        cluster.ssh(HEAD, f"scancel {blocker}", check=False)
    cluster.wait_no_trainers(30)


def test_killing_one_nodes_trainer_fails_the_whole_job(cluster: Cluster) -> None:
    proc, log = cluster.start(
        "run",
        str(cluster.job("slurm-kill", hosts="slurm_nodes", max_steps=2000, paced=True)),
        "-i",
        str(cluster.inventory),
    )
    run_id = cluster.wait_step(cluster.run_id_of("slurm-kill"), proc)
    pid = json.loads(cluster.ssh(2, f"cat /var/lib/mift/runs/{run_id}/state.json"))["pid"]
    rec, ended = kill_and_follow(cluster, proc, log, "slurm-kill", host=2, pid=pid)  # host2's trainer
    assert "host2: trainer exited rc=-9" in rec["result_reason"]
    assert "cancelled_by_launcher" not in rec["slurm"]  # Slurm ended it; the launcher's stop found it ended
    assert ended < 60  # the launcher saw it, stopped and collected
    assert squeue(cluster) == []


def test_a_job_slurm_stops_at_its_time_limit_fails_with_slurms_reason(cluster: Cluster) -> None:
    job = cluster.job(
        "slurm-time",
        hosts="slurm_nodes",
        max_steps=100000,
        paced=True,
        slurm={"time_limit": "1"},
        recovery={"max_restarts": 0},  # never requeued: the time limit ends it (requeued: the case below)
    )
    t0 = time.monotonic()
    out = cluster.run("run", str(job), "-i", str(cluster.inventory), timeout=600)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr
    rec = cluster.record("slurm-time")
    print(f"launcher ended {time.monotonic() - t0:.1f} s after it started: {rec['result_reason']}")
    assert rec["status"] == "failed"
    assert rec["result_reason"].startswith(f"slurm job {rec['slurm']['job_id']} TIMEOUT (TimeLimit")
    cluster.wait_no_trainers(5)
    assert squeue(cluster) == []


def test_stop_cancels_a_running_job_and_leaves_nothing(cluster: Cluster) -> None:
    out = cluster.run(
        "run",
        str(cluster.job("slurm-stop", hosts="slurm_nodes", max_steps=2000, paced=True)),
        "-i",
        str(cluster.inventory),
        "--detach",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    run_id = cluster.wait_step(cluster.run_id_of("slurm-stop"))
    stop_and_check(cluster, run_id, "slurm-stop")


REQUEUE_STEPS = 24
# the trainer's slowness (tests/faults/inject/sitecustomize.py, a TEST DOUBLE put first on its PYTHONPATH):
# every training step sleeps 1 s first, so that an attempt outlasts Slurm's time-limit check (every 30 s)
SLOW_ENV = {
    "OMP_NUM_THREADS": 1,
    "DS_ACCELERATOR": "cpu",
    "PYTHONPATH": INJECT_DIR,
    "MIFT_FAULTS_SLOW_STEPS": "1-1000:1",
}


def test_a_requeued_job_resumes_from_its_last_checkpoint_after_a_node_failure_and_at_its_time_limit(
    cluster: Cluster,
) -> None:
    """One job, two requeues (recovery.max_restarts 2): slurmctld marks host2 DOWN once both nodes hold a
    checkpoint (a node failure: Slurm requeues the job); once the restart runs, its time limit is lowered to
    within requeue_before_s (the default, 120 s) of now, so Slurm's own time-limit warning (USR1) reaches the
    batch script, which requeues the job; the third attempt finishes. Each restart resumes from the last
    checkpoint complete on both nodes, and the record lists the three attempts."""
    t0 = time.monotonic()
    cluster.install_injection()
    job = cluster.job(
        "slurm-requeue",
        hosts="slurm_nodes",
        max_steps=REQUEUE_STEPS,
        save_steps=4,
        env=SLOW_ENV,
        slurm={"time_limit": "15:00"},
        recovery={"max_restarts": 2},
    )
    proc, log = cluster.start("run", str(job), "-i", str(cluster.inventory))
    run_id = cluster.wait_step(cluster.run_id_of("slurm-requeue"), proc)
    job_id = str(cluster.record("slurm-requeue")["slurm"]["job_id"])
    script = (cluster.run_dir("slurm-requeue") / "job.sbatch").read_text()
    assert "#SBATCH --requeue" in script and "#SBATCH --signal=B:USR1@120" in script
    first = wait_checkpoint(cluster, run_id, 0)
    cluster.ssh(HEAD, "scontrol update nodename=host2 state=down reason=mift-e2e-node-failure")
    print(f"host2 DOWN after checkpoint-{first} on both nodes ({time.monotonic() - t0:.1f} s)")
    took = wait_restart(cluster, job_id, 1)
    run_s = _seconds(scontrol_job(cluster, job_id)["RunTime"])
    limit_min = run_s // 60 + 2  # the end within 120 s of now: Slurm sends USR1 at its next check
    cluster.ssh(HEAD, f"scontrol update jobid={job_id} TimeLimit={limit_min}")
    print(f"restart 1 running {took:.1f} s later; its time limit lowered to {limit_min} min at {run_s} s")
    took = wait_restart(cluster, job_id, 2)
    cluster.ssh(HEAD, f"scontrol update jobid={job_id} TimeLimit=15")  # root: the third attempt has time
    print(f"restart 2 running {took:.1f} s later")
    out = finish(proc, log, timeout=600)
    print(out[-2500:])
    assert proc.returncode == 0, out[-6000:]
    rec = cluster.record("slurm-requeue")
    assert rec["status"] == "succeeded" and rec["slurm"]["state"] == "COMPLETED", rec["result_reason"]
    attempts = rec["attempts"]
    for a in attempts:
        print({k: a.get(k) for k in ("attempt", "state", "kind", "reason", "resume_step")})
    assert [a["state"] for a in attempts] == ["requeued", "requeued", "succeeded"]
    assert [a.get("kind") for a in attempts[:2]] == ["node_lost", "timeout"]
    assert [a["hosts"] for a in attempts] == [["host1", "host2"]] * 3
    assert attempts[0]["resume_step"] is None
    assert attempts[1]["resume_step"] >= first and attempts[2]["resume_step"] >= attempts[1]["resume_step"]
    assert rec["slurm"]["restarts"] == 2
    batch = cluster.node_file(1, run_id, "slurm.out")
    assert "DUE TO NODE FAILURE" in batch and "mift: time limit: requeued (restart 2 of 2)" in batch, batch
    log1 = cluster.node_file(1, run_id, "output/trainer_log.jsonl")
    steps = [json.loads(x)["current_steps"] for x in log1.splitlines()]
    print(f"host1's logged steps, every attempt: {steps}")  # each restart logs on from its checkpoint
    assert steps[-1] == REQUEUE_STEPS, steps
    status = cluster.run("status", run_id)
    assert "attempt 3  succeeded" in status.stdout and "node_lost" in status.stdout, status.stdout
    listing = cluster.run("list").stdout
    assert "3 (node_lost, timeout)" in listing, listing
    print(f"requeue case: {time.monotonic() - t0:.1f} s")
    assert squeue(cluster) == []


def _seconds(runtime: str) -> int:
    """Return the seconds of Slurm's ``RunTime`` ([D-]HH:MM:SS)."""
    days, _, clock = runtime.rpartition("-")
    h, m, sec = (int(x) for x in clock.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + sec

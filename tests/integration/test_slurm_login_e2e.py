"""The slurm backend with ONLY the login host in the launcher's inventory (job spec ``slurm.shared_dir``).

The same Slurm cluster as test_slurm_e2e.py (the session fixture ``slurm_cluster``,
tests/integration/conftest.py: 3 systemd-mode hosts from the provisioned host image, host3 the head, host1
and host2 the nodes; the provisioning inventory is the admin's and names every host). One controller folder,
``/srv/mift<RIG_ID>-shared``, is bind-mounted at the same path into every host (``RIG_SHARED_DIR``): the
stand-in for a cluster's NFS/Lustre home or scratch. The launcher gets an inventory holding only host3, and
every playbook event of its runs names host3 alone.

Shows: the tiny ZeRO-3 job across the 2 nodes Slurm picks (world size 2, losses, the adapter in the shared
folder, status succeeded; ``status``, ``logs``, ``list``); a node failing its in-allocation preflight ends the
job failed with that node's reason, before any trainer starts; killing one node's trainer ends the job within
30 s as failed; ``stop`` cancels a running job and leaves no process on any host; too many nodes are refused
in one line before anything is submitted.

    SLURM_E2E_RIG_ID=9 pytest -q tests/integration/test_slurm_login_e2e.py
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from mift_testsupport.cluster import Cluster
from mift_testsupport.slurm import (
    HEAD,
    NODES,
    kill_and_follow,
    login_only_inventory,
    no_run_process,
    run_to_success,
    squeue,
    stop_and_check,
)

if TYPE_CHECKING:
    from mift_testsupport.slurm import SlurmRig

pytestmark = [pytest.mark.rig, pytest.mark.slow]


class LoginCluster(Cluster):
    """The cluster, with the launcher's inventory holding only the login host, and the folder every host sees
    at the same path."""

    login_inventory: Path
    shared: Path


@pytest.fixture(scope="module")
def cluster(slurm_cluster: SlurmRig, tmp_path_factory: pytest.TempPathFactory) -> LoginCluster:
    """The session's Slurm cluster (tests/integration/conftest.py); the launcher gets the login host alone."""
    c = LoginCluster(slurm_cluster.rig, tmp_path_factory.mktemp("slurm-login-e2e"))
    c.login_inventory = login_only_inventory(slurm_cluster.rig.inventory, c.work / "login.yml")
    c.inventory = c.login_inventory
    c.shared = slurm_cluster.shared
    return c


def login_job(c: LoginCluster, name: str, *, slurm: dict[str, Any] | None = None, **spec: Any) -> Path:
    """A job spec for the login-host-only mode: no ``hosts``, ``slurm.shared_dir`` and ``slurm.nodes: 2``."""
    path = c.job(name, **spec)
    data = yaml.safe_load(path.read_text())
    data.pop("hosts", None)
    data["slurm"] = {"shared_dir": str(c.shared), "nodes": len(NODES), **(slurm or {})}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def launcher_hosts(run: Path) -> set[str]:
    """Every host any kept playbook event of a run names (the launcher's ansible-runner artifacts)."""
    hosts: set[str] = set()
    for event_file in (run / "ansible" / "artifacts").glob("*/job_events/*.json"):
        data = json.loads(event_file.read_text()).get("event_data") or {}
        if data.get("host"):
            hosts.add(str(data["host"]))
        for key in ("ok", "changed", "failures", "dark", "processed", "skipped"):
            hosts.update((data.get(key) or {}).keys())
    return hosts


def wait_rank0_step(c: LoginCluster, name: str, proc: Any = None, seconds: float = 600) -> str:
    """Wait until rank 0 logged a training step (read in the shared folder); return the run id."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"launcher ended early (rc={proc.returncode})")
        run_id = str(c.record(name).get("run_id", "")) if c.runs.is_dir() and c.run_dirs() else ""
        log = c.shared / run_id / "rank0" / "output" / "trainer_log.jsonl"
        if run_id and log.is_file() and '"current_steps"' in log.read_text():
            return run_id
        time.sleep(1)
    raise AssertionError(f"no logged training step within {seconds:.0f} s")


def test_tiny_zero3_across_two_nodes_from_the_login_host_alone(cluster: LoginCluster) -> None:
    job = login_job(cluster, "login-z3", slurm={"gpus_per_node": 1, "time_limit": "15:00"})
    run_to_success(cluster, job, cluster.login_inventory, "slurm backend, login host only")
    rec = cluster.record("login-z3")
    run = cluster.run_dir("login-z3")
    run_id = rec["run_id"]
    assert rec["backend"] == "slurm" and rec["status"] == "succeeded", rec.get("result_reason")
    assert rec["slurm"]["state"] == "COMPLETED" and rec["slurm"]["run_root"] == f"{cluster.shared}/{run_id}"
    assert rec["hosts"] == ["rank0", "rank1"]
    assert {rec["nodes"][r]["slurm_node"] for r in ("rank0", "rank1")} == {"host1", "host2"}, rec["nodes"]
    assert rec["summary"]["world_size"] == 2, rec["nodes"]
    losses = [json.loads(line).get("loss") for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x for x in losses if isinstance(x, float)], losses
    adapter = [p for p in rec["outputs"]["rank0"] if p.endswith("adapter_model.safetensors")]
    assert adapter and adapter[0].startswith(f"{cluster.shared}/{run_id}/rank0/"), rec["outputs"]
    assert Path(adapter[0]).stat().st_size > 0  # in the shared folder: the controller's side of the mount
    script = (run / "job.sbatch").read_text()
    assert "--nodelist" not in script and "#SBATCH --nodes=2" in script and "slurm-check" in script
    env1 = json.loads((cluster.shared / run_id / "rank1" / "env.json").read_text())
    assert (env1["NODE_RANK"], env1["NNODES"], env1["MASTER_ADDR"]) == ("1", "2", "host1")
    assert rec["master_addr"] == "host1"  # the record says what the allocation gave, not the plan's
    # the launcher reached the login host alone
    seen = launcher_hosts(run)
    print(f"hosts in the run's playbook events: {sorted(seen)}")
    assert seen == {f"host{HEAD}"}
    status = cluster.run("status", run_id)
    print(status.stdout)
    assert status.returncode == 0 and "succeeded" in status.stdout and "COMPLETED" in status.stdout
    logs = cluster.run("logs", run_id, "--node", "1")
    assert logs.returncode == 0 and "world size: 2" in logs.stdout, logs.stdout[-2000:] + logs.stderr
    listing = cluster.run("list")
    print(listing.stdout)
    assert f"slurm:{rec['slurm']['job_id']}" in listing.stdout


def test_too_many_nodes_are_refused_before_submitting(cluster: LoginCluster) -> None:
    job = login_job(cluster, "login-big", slurm={"nodes": 3})
    out = cluster.run("run", str(job), "-i", str(cluster.login_inventory))
    errors = [line for line in out.stderr.splitlines() if line.strip()]
    print(errors)
    assert out.returncode == 2, out.stdout + out.stderr
    assert len(errors) == 1 and "slurm.nodes: the job asks for 3 nodes, partition 'mift' has 2" in errors[0]
    assert cluster.record("login-big")["status"] == "rejected"
    assert squeue(cluster) == []


def test_a_node_failing_its_check_in_the_allocation_fails_the_job_with_its_reason(
    cluster: LoginCluster,
) -> None:
    cli = "/opt/mift/venv/bin/llamafactory-cli"
    cluster.ssh(2, f"chmod -x {cli}")  # host2 lost its trainer; the login host (planning) still has it
    try:
        out = cluster.run("run", str(login_job(cluster, "login-check")), "-i", str(cluster.login_inventory))
    finally:
        cluster.ssh(2, f"chmod +x {cli}")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr
    rec = cluster.record("login-check")
    print(rec["result_reason"])
    assert rec["status"] == "failed"
    assert rec["result_reason"].startswith(f"slurm job {rec['slurm']['job_id']} FAILED")
    assert f"(host2): preflight: {cli} not found" in rec["result_reason"]
    # no trainer started anywhere
    assert not (cluster.shared / rec["run_id"] / "rank0" / "trainer.log").exists()
    assert squeue(cluster) == []


def test_killing_one_nodes_trainer_fails_the_whole_job(cluster: LoginCluster) -> None:
    proc, log = cluster.start(
        "run",
        str(login_job(cluster, "login-kill", max_steps=2000, paced=True)),
        "-i",
        str(cluster.login_inventory),
    )
    run_id = wait_rank0_step(cluster, "login-kill", proc)
    state = json.loads((cluster.shared / run_id / "rank1" / "state.json").read_text())
    host = int(state["slurm_node"].removeprefix("host"))
    rec, ended = kill_and_follow(cluster, proc, log, "login-kill", host=host, pid=state["pid"])  # rank 1
    assert f"rank1 (host{host}): trainer exited rc=-9" in rec["result_reason"]
    assert ended < 30
    assert squeue(cluster) == []
    no_run_process(cluster, run_id)


def test_stop_cancels_a_running_job_and_leaves_nothing(cluster: LoginCluster) -> None:
    out = cluster.run(
        "run",
        str(login_job(cluster, "login-stop", max_steps=2000, paced=True)),
        "-i",
        str(cluster.login_inventory),
        "--detach",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    run_id = wait_rank0_step(cluster, "login-stop")
    stop_and_check(cluster, run_id, "login-stop")
    assert launcher_hosts(cluster.run_dir("login-stop")) == {f"host{HEAD}"}

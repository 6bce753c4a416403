"""Slurm on test hosts: the one Slurm cluster, the inventories and the helpers the Slurm e2e suites share.

host3 is the head (slurmctld, the login host), host1 and host2 the nodes. The test hosts have no GPU device
nodes: empty files stand in for the render nodes gres.conf names (TEST DOUBLE, as in molecule ``slurm``).
Both Slurm e2e modules (the launcher given every host; the launcher given the login host alone) run on the
same cluster (:func:`slurm_rig`, a session fixture of tests/integration/conftest.py): 3 hosts from the image
and ``playbooks/slurm.yml`` once, not once per module.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from mift_testsupport.image import provisioned_rig
from mift_testsupport.paths import REPO_ROOT

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator

    from mift_testsupport.cluster import Cluster
    from mift_testsupport.rig import Rig

NODES = (1, 2)
HEAD = 3
# TEST DOUBLE device files for the 8 GPUs of the mi300x profile (gpu_verify's fact says 8)
GPU_STANDINS = "mkdir -p /dev/dri && for i in $(seq 128 135); do : > /dev/dri/renderD$i; done"
# the inventory switches the test hosts need (their cgroups belong to systemd-nspawn; no GPU to detect)
TEST_HOST_VARS = {
    "slurm_node_gpu_detect": "files",
    "slurm_config_proctrack_type": "proctrack/linuxproc",
    "slurm_config_task_plugin": "task/none",
    # a requeued job waits cred_expire + 1 s before it starts again (slurm.conf(5), AuthInfo; default 120 s):
    # 15 s keeps the requeue cases short and still covers a step launch on the loaded CI machine
    "slurm_config_extra_lines": ["AuthInfo=cred_expire=15"],
}


def slurm_inventory(rig_inventory: Path, folder: Path) -> Path:
    """An inventory folder: the rig's hosts, plus the Slurm groups and the test-host switches."""
    folder.mkdir()
    (folder / "rig.yml").symlink_to(rig_inventory)
    groups = {
        "all": {
            "vars": {
                "mift_launcher_backend": "slurm",
                **TEST_HOST_VARS,
                "munge_key_src": str(folder.parent / "munge.key"),
            },
            "children": {
                "slurm_controller": {"hosts": {f"host{HEAD}": {}}},
                "slurm_nodes": {"hosts": {f"host{i}": {} for i in NODES}},
            },
        }
    }
    (folder / "slurm.yml").write_text(yaml.safe_dump(groups, sort_keys=False))
    return folder


def login_only_inventory(rig_inventory: Path, path: Path) -> Path:
    """An inventory with ONLY the head (the login host): what a user of a site's Slurm cluster has."""
    rig: dict[str, Any] = yaml.safe_load(rig_inventory.read_text())["all"]
    head = rig["children"]["trainers"]["hosts"][f"host{HEAD}"]
    inventory = {
        "all": {
            "hosts": {f"host{HEAD}": head},
            "vars": {**rig["vars"], "mift_launcher_backend": "slurm", "mift_slurm_login_host": f"host{HEAD}"},
        }
    }
    path.write_text(yaml.safe_dump(inventory, sort_keys=False))
    return path


def provision_slurm(rig: Rig, inventory: Path, log: Path) -> float:
    """GPU stand-ins on the nodes, then ``playbooks/slurm.yml``; return its seconds (asserts it passed)."""
    for host in NODES:
        rig.ssh(host, GPU_STANDINS)
    t0 = time.monotonic()
    out = rig.playbook(REPO_ROOT / "playbooks" / "slurm.yml", "-i", str(inventory), timeout=1200)
    log.write_text(out.stdout + out.stderr)
    assert out.returncode == 0, out.stdout[-6000:]
    return time.monotonic() - t0


@dataclass(frozen=True)
class SlurmRig:
    """A Slurm cluster on test hosts: the rig, the admin's inventory (every host, the Slurm groups) and the
    controller folder every host sees at the same path (the stand-in for a site's shared file system)."""

    rig: Rig
    inventory: Path
    shared: Path


def shared_dir(rig_id: int) -> Path:
    """The controller folder bind-mounted at the same path into every host of rig ``rig_id``."""
    return Path(f"/srv/mift{rig_id}-shared")


@contextlib.contextmanager
def slurm_rig(rig_id: int, work: Path) -> Iterator[SlurmRig]:
    """3 hosts of rig ``rig_id`` from the provisioned image sharing :func:`shared_dir`, Slurm provisioned on
    them with the admin's inventory; torn down, and the shared folder removed, afterwards."""
    shared = shared_dir(rig_id)
    shutil.rmtree(shared, ignore_errors=True)  # this rig's own folder, from an earlier run
    shared.mkdir(parents=True)
    try:
        with provisioned_rig(rig_id, 3, log=work / "image.log", shared_dir=str(shared)) as rig:
            inventory = slurm_inventory(rig.inventory, work / "inventory")
            took = provision_slurm(rig, inventory, work / "slurm-play.log")
            print(f"playbooks/slurm.yml on 3 hosts: {took:.1f} s")
            for host in (*NODES, HEAD):  # the stand-in is mounted: a file written here is seen there
                assert rig.ssh(host, f"test -d {shared} && echo yes").stdout.strip() == "yes", host
            yield SlurmRig(rig, inventory, shared)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def kill_and_follow(
    cluster: Cluster, proc: subprocess.Popen[str], log: Path, name: str, *, host: int, pid: int
) -> tuple[dict[str, Any], float]:
    """Kill one node's trainer (its whole process group on test host ``host``), wait until no trainer is left
    on any host (at most 30 s), follow the launcher to its end.

    Checks what both Slurm modes must show: exit 1, run ``failed`` with Slurm's ``FAILED`` state. Returns the
    run's record and the seconds from the kill to the launcher's end.
    """
    from mift_testsupport.launcher import finish  # noqa: PLC0415

    t0 = time.monotonic()
    cluster.ssh(host, f"kill -9 -- -{pid}")
    took = cluster.wait_no_trainers(30, since=t0)
    out = finish(proc, log)
    ended = time.monotonic() - t0
    assert proc.returncode == 1, out
    rec = cluster.record(name)
    print(f"no trainer left {took:.1f} s after the kill; launcher ended after {ended:.1f} s")
    print(rec["result_reason"])
    assert rec["status"] == "failed", rec
    assert rec["result_reason"].startswith(f"slurm job {rec['slurm']['job_id']} FAILED"), rec["result_reason"]
    return rec, ended


def srun_task_env(
    tmp_path: Path, node_id: str, nodes: tuple[str, ...], node: str | None = None
) -> dict[str, str]:
    """The environment srun gives task ``node_id`` of an allocation of ``nodes`` (on ``node``, by default the
    node_id-th), with a TEST DOUBLE of ``scontrol show hostnames`` on PATH that prints ``nodes``."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    scontrol = bindir / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\n# TEST DOUBLE of scontrol show hostnames\n" + "".join(f"echo {n}\n" for n in nodes)
    )
    scontrol.chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "SLURM_NODEID": node_id,
        "SLURMD_NODENAME": node or nodes[int(node_id)],
        "SLURM_JOB_NODELIST": ",".join(nodes),
        "ROCR_VISIBLE_DEVICES": "0",
    }


def run_to_success(c: Cluster, job: Path, inventory: Path, label: str) -> subprocess.CompletedProcess[str]:
    """``python -m launcher run JOB -i INVENTORY``, asserted to exit 0; prints its output's tail and time."""
    t0 = time.monotonic()
    out = c.run("run", str(job), "-i", str(inventory))
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    print(out.stdout[-2500:])
    print(f"launcher run ({label}): {took:.1f} s")
    return out


def squeue(c: Cluster) -> list[str]:
    """The jobs slurmctld still knows (``squeue`` on the head): ``ID STATE REASON`` lines."""
    return c.ssh(HEAD, "squeue --noheader --format='%i %T %R'").splitlines()


def no_run_process(c: Cluster, run_id: str) -> None:
    """Assert that no process of the run is left on any host (nodes and head): none has the run id in its
    environment."""
    for host in (*NODES, HEAD):
        left = c.ssh(host, f"grep -l {run_id} /proc/[0-9]*/environ 2>/dev/null || true").split()
        assert left == [], (host, left)


def stop_and_check(c: Cluster, run_id: str, name: str) -> dict[str, Any]:
    """``python -m launcher stop RUN``: what both Slurm modes must show (exit 0, "nothing left running", no
    trainer, nothing queued, no process of the run on any host, run ``stopped`` by the launcher's scancel).
    Returns the run's record."""
    t0 = time.monotonic()
    stop = c.run("stop", run_id)
    took = time.monotonic() - t0
    print(stop.stdout[-1500:])
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "nothing left running" in stop.stdout
    c.wait_no_trainers(5)
    assert squeue(c) == []
    no_run_process(c, run_id)
    rec = c.record(name)
    assert rec["status"] == "stopped" and rec["slurm"]["cancelled_by_launcher"] is True
    print(f"stop took {took:.1f} s")
    return rec


def scontrol_job(c: Cluster, job_id: str) -> dict[str, str]:
    """The fields of ``scontrol --oneliner show job JOB_ID`` on the head."""
    from launcher.backends.slurm_script import parse_fields  # noqa: PLC0415

    return parse_fields(c.ssh(HEAD, f"scontrol --oneliner show job {job_id}").splitlines()[0])


def wait_restart(c: Cluster, job_id: str, restarts: int, seconds: float = 240) -> float:
    """Wait until Slurm restarted the job ``restarts`` times and it runs again; return the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        job = scontrol_job(c, job_id)
        if int(job.get("Restarts") or 0) >= restarts and job.get("JobState") == "RUNNING":
            return time.monotonic() - t0
        time.sleep(1)
    raise AssertionError(f"slurm job {job_id}: not running after restart {restarts} within {seconds:.0f} s")


def wait_checkpoint(c: Cluster, run_id: str, above: int, seconds: float = 300) -> int:
    """Wait until both nodes hold a complete checkpoint-N with N > ``above``; return the newest such N
    both hold."""
    t0 = time.monotonic()
    listing = f"cd /var/lib/mift/runs/{run_id}/output 2>/dev/null && ls -d checkpoint-*/trainer_state.json"
    while time.monotonic() - t0 < seconds:
        held = [
            {int(p.split("/")[0].removeprefix("checkpoint-")) for p in c.ssh(h, listing, check=False).split()}
            for h in NODES
        ]
        common = [n for n in set.intersection(*held) if n > above]
        if common:
            return max(common)
        time.sleep(1)
    raise AssertionError(f"no checkpoint above {above} on both nodes within {seconds:.0f} s")

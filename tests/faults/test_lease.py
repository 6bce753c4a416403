"""The per-node GPU lease on the test hosts (docs/launcher.md "GPU lease"): a second run against the nodes of
a running one is refused in one line naming the first and its owner; a lease left by a killed controller whose
trainers are gone is taken over by the next run, which says so; a run's finish gives its lease back.
``status --json`` of the running run is read back on the way (docs/launcher.md "JSON output")."""

from __future__ import annotations

import json
import re
import signal
from typing import TYPE_CHECKING, Any

import pytest

from launcher.rundir.json_out import RUN_KEYS

if TYPE_CHECKING:
    from mift_testsupport.cluster import Cluster

pytestmark = [pytest.mark.rig, pytest.mark.slow]

LEASE = "/var/lib/mift/gpu-lease.json"  # launcher.engine.lease.lease_file() of the default node layout
STEPS = 400  # paced (1 s a step): still running while the second run is refused


def _lease_on(cluster: Cluster) -> dict[int, str | None]:
    """host -> the run id its lease names (None: no lease)."""
    found: dict[int, str | None] = {}
    for host in cluster.hosts:
        text = cluster.ssh(host, f"cat {LEASE} 2>/dev/null || true").strip()
        found[host] = json.loads(text)["run_id"] if text else None
    return found


def test_second_run_refused_and_killed_controllers_lease_taken_over(
    cluster: Cluster, fault_record: dict[str, Any]
) -> None:
    fault_record.update(
        case="lease-busy-nodes-and-stale-lease",
        group="2 faults",
        input="run A on both hosts (paced); while it runs, run B on the same hosts; then SIGKILL A's "
        "launcher and kill A's trainers on the hosts (their process group); then run C",
        expected="B exits 1 with one line naming run A and its owner, nothing started; C takes over A's "
        "stale lease saying so, succeeds, and gives the lease back (no lease file left)",
    )
    name_a, name_b, name_c = "faults-lease-a", "faults-lease-b", "faults-lease-c"
    proc, _log = cluster.start(
        "run", str(cluster.job(name_a, max_steps=STEPS, paced=True)), "-i", str(cluster.inventory)
    )
    run_a = cluster.wait_step(cluster.run_id_of(name_a), proc)
    running = cluster.run("status", "--json", run_a, timeout=300)
    obj = json.loads(running.stdout)
    held = _lease_on(cluster)

    # another master_port: A's is taken on host1, which preflight refuses before any lease is asked for
    job_b = cluster.job(name_b, max_steps=2, master_port=29610)
    second = cluster.run("run", str(job_b), "-i", str(cluster.inventory))
    refused = [line for line in second.stderr.splitlines() if line.strip()]

    proc.send_signal(signal.SIGKILL)  # the controller dies; its lease stays on the nodes
    proc.wait(timeout=60)
    for host in cluster.hosts:  # A's trainers end too (their process group, which this test started)
        cluster.ssh(host, f"kill -KILL -- -$(cat /var/lib/mift/runs/{run_a}/trainer.pid)", check=False)
    cluster.wait_no_trainers(120)
    left = _lease_on(cluster)

    third = cluster.run("run", str(cluster.job(name_c, max_steps=2)), "-i", str(cluster.inventory))
    took_over = [line for line in third.stdout.splitlines() if "took over the GPU lease" in line]
    after = _lease_on(cluster)
    cluster.run("stop", run_a, timeout=300)  # A's run directory finished (its lease is no longer A's)
    fault_record["observed"] = (
        f"B exit {second.returncode}: {refused[-1] if refused else '(no line)'}; "
        f"C exit {third.returncode}: {took_over[0] if took_over else '(no take-over line)'}; "
        f"lease files after C: {after}"
    )
    print("\n" + "\n".join([*refused, *took_over]))

    assert running.returncode == 0 and tuple(obj) == RUN_KEYS, running.stdout + running.stderr
    assert (obj["status"], obj["final"], obj["lease"]["run_id"]) == ("running", False, run_a), obj
    assert held == dict.fromkeys(cluster.hosts, run_a), held
    assert second.returncode == 1, second.stdout + second.stderr
    assert len(refused) == 1 and re.match(
        rf"error: host1, host2: GPUs leased by run {re.escape(run_a)} of \S+@\S+ \(pid \d+, since ",
        refused[0],
    ), refused
    assert cluster.record(name_b).get("status") == "rejected"
    assert left == dict.fromkeys(cluster.hosts, run_a), left
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-2000:]
    assert len(took_over) == 2 and all(f"of run {run_a} of " in line for line in took_over), took_over
    assert all("its run ended on this node" in line for line in took_over), took_over
    assert after == dict.fromkeys(cluster.hosts), after

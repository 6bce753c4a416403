"""The fabric on 3 provisioned test hosts: the derived NCCL/Gloo environment, its refusal, ``launcher check``.

The hosts start from the provisioned host image (``mift_testsupport.image``). Each host's interface is real (a
veth in its network namespace); RDMA is absent, so the derived environment says sockets.
(The extra interface below is a veth pair: this kernel has no dummy module.)

Shows (run with ``-s``, the outputs are printed):

- an interface name that exists on host1 and host2 (a veth ``fab0`` added there) but not on host3 is refused
  in one line naming host3, before anything starts (no run folder, no trainer on any host);
- the derived environment as each node's trainer saw it: ``/proc/<pid>/environ`` of ``llamafactory-cli``;
- ``launcher check`` with host2's link rate-limited (``tc qdisc ... tbf rate 50mbit`` on host2's veth, the
  controller side: traffic into host2): the pairs with host2 are flagged and host2 named; the second check is
  served from the cache (time printed); unthrottled (``--fresh``) it passes.
"""

from __future__ import annotations

import subprocess
import time
from typing import TYPE_CHECKING

import pytest

from mift_testsupport.cluster import Cluster
from mift_testsupport.fixtures import rig_ready_or_skip
from mift_testsupport.image import SYSTEMD, provisioned_rig
from mift_testsupport.launcher import finish
from mift_testsupport.rig import rig_id_from_env

if TYPE_CHECKING:
    from collections.abc import Iterator

RIG_ID = rig_id_from_env("FABRIC_E2E_RIG_ID", 14)
pytestmark = [pytest.mark.rig, pytest.mark.slow]
FABRIC_VARS = (
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_DISABLE",
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """3 hosts of rig ``FABRIC_E2E_RIG_ID`` (14) from the provisioned image; torn down after the module."""
    rig_ready_or_skip(systemd=SYSTEMD)
    work = tmp_path_factory.mktemp("fabric-e2e")
    with provisioned_rig(RIG_ID, 3, log=work / "image-provision.log") as rig:
        yield Cluster(rig, work)


def _netns(cluster: Cluster, host: int, command: str) -> None:
    subprocess.run(
        ["ip", "netns", "exec", cluster.rig.netns(host), "sh", "-c", command], check=True, timeout=30
    )


def test_an_interface_missing_on_host3_is_refused_before_anything_starts(cluster: Cluster) -> None:
    for host in (1, 2):
        _netns(
            cluster,
            host,
            "ip link show fab0 >/dev/null 2>&1 || ip link add fab0 type veth peer name fab0p; "
            "ip link set fab0 up",
        )
    before = {h: cluster.ssh(h, "ls /var/lib/mift/runs 2>/dev/null || true") for h in cluster.hosts}
    job = cluster.job("fabric-noif", env={"NCCL_SOCKET_IFNAME": "fab0"})
    out = cluster.run("run", str(job), "-i", str(cluster.inventory))
    print(f"$ python -m launcher run {job.name} (env NCCL_SOCKET_IFNAME: fab0)\n{out.stdout}{out.stderr}")
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "error: host3: NCCL_SOCKET_IFNAME=fab0: no interface 'fab0' on host3 (it has lo, eth0); fix env in "
        "the job spec or mift_node_env; nothing was started"
    )
    assert {h: cluster.ssh(h, "ls /var/lib/mift/runs 2>/dev/null || true") for h in cluster.hosts} == before
    assert not any(cluster.trainer_processes().values())


def test_rdma_expected_but_absent_fails_or_warns_by_policy(cluster: Cluster) -> None:
    job = cluster.job("fabric-rdma", fabric={"transport": "rdma"})
    out = cluster.run("run", str(job), "-i", str(cluster.inventory))
    print(f"$ python -m launcher run {job.name} (fabric.transport: rdma)\n{out.stdout}{out.stderr}")
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "error: host1: collectives would fall back to TCP sockets where RDMA is expected (fabric.transport: "
        "rdma): no RDMA device (/sys/class/infiniband is empty); provision the RDMA user space or set "
        "fabric.socket_fallback: warn (or fabric.transport: socket); nothing was started"
    )


def test_the_trainer_sees_the_derived_environment(cluster: Cluster) -> None:
    """With ``fabric.socket_fallback: warn`` the same job runs, one warning line, sockets on every node."""
    job = cluster.job("fabric-env", max_steps=2000, fabric={"transport": "rdma", "socket_fallback": "warn"})
    proc, log = cluster.start("run", str(job), "-i", str(cluster.inventory))
    try:
        run_id = cluster.wait_step(cluster.run_id_of("fabric-env"), proc)
        for host in cluster.hosts:
            pid = cluster.ssh(host, "pgrep -of '[l]lamafactory-cli train'").strip()
            environ = cluster.ssh(host, f"tr '\\0' '\\n' < /proc/{pid}/environ")
            seen = dict(line.split("=", 1) for line in environ.splitlines() if "=" in line)
            fabric = {k: seen[k] for k in FABRIC_VARS if k in seen}
            print(f"host{host}: llamafactory-cli pid {pid} (run {run_id}) /proc/{pid}/environ: {fabric}")
            addr = cluster.rig.ip(host)
            iface = cluster.ssh(host, f"ip -o -4 addr show | awk '$4 ~ /^{addr}\\// {{print $2}}'").strip()
            assert fabric == {
                "NCCL_SOCKET_IFNAME": iface,
                "GLOO_SOCKET_IFNAME": iface,
                "NCCL_IB_DISABLE": "1",
            }
        cluster.run("stop", run_id)
    finally:
        output = finish(proc, log)
    print(output)
    assert (
        "warning: host1: collectives would fall back to TCP sockets where RDMA is expected "
        "(fabric.transport: rdma): no RDMA device (/sys/class/infiniband is empty) "
        "(fabric.socket_fallback: warn: every node uses sockets)"
    ) in output
    cluster.wait_no_trainers(60)


def _check(cluster: Cluster, job: str, *args: str) -> subprocess.CompletedProcess[str]:
    t0 = time.monotonic()
    out = cluster.run("check", job, "-i", str(cluster.inventory), *args, timeout=900)
    took = time.monotonic() - t0
    print(f"$ python -m launcher check {' '.join(args)}  ({took:.1f} s)\n{out.stdout}{out.stderr}")
    return out


def test_check_flags_a_throttled_host2_serves_the_cache_and_passes_unthrottled(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MIFT_CHECK_CACHE", str(tmp_path_factory.mktemp("check-cache")))
    job = str(cluster.job("fabric-check"))
    veth = f"mift{RIG_ID}h2v"
    subprocess.run(
        [
            "tc",
            "qdisc",
            "add",
            "dev",
            veth,
            "root",
            "tbf",
            "rate",
            "50mbit",
            "burst",
            "32kbit",
            "latency",
            "400ms",
        ],
        check=True,
    )
    try:
        slow = _check(cluster, job, "--fresh")
        assert slow.returncode == 1, slow.stdout + slow.stderr
        assert "bad: host2: every link of host2 is slow (host1-host2 " in slow.stdout
        flagged = [line.split()[0] for line in slow.stdout.splitlines() if line.rstrip().endswith("SLOW")]
        assert sorted(flagged[:2]) == ["host1-host2", "host2-host3"], slow.stdout
        cached = _check(cluster, job)
        assert cached.returncode == 1 and "links served from the cache" in cached.stdout
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", veth, "root"], check=True)
    fast = _check(cluster, job, "--fresh")
    assert fast.returncode == 0, fast.stdout + fast.stderr
    assert "check: 3 nodes, passed; links (TCP) measured in" in fast.stdout

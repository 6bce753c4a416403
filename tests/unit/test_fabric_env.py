"""The per-node NCCL/Gloo environment derived from fabric facts, overrides, agreement (launcher.fabric.env).

The ``net`` facts below are TEST DOUBLES in the shape preflight's probe reports them
(``mift_probe.net_facts``): no real RDMA node was available; the sysfs layout they stand for is the kernel's
(``/sys/class/infiniband``).
"""

from __future__ import annotations

from typing import Any

import pytest

from launcher.exceptions import ConfigurationError
from launcher.fabric.env import derived_env, missing_interface, node_fabric, resolve_fabric, roce_v2_index
from launcher.spec.jobspec import FabricOptions

HOSTS = ["host1", "host2", "host3"]
ADDR = {"host1": "10.231.14.11", "host2": "10.231.14.12", "host3": "10.231.14.13"}


def roce_port_double(device: str, *, state: str = "ACTIVE", v2_index: int = 3) -> dict[str, Any]:
    """TEST DOUBLE: one RoCE port with the GID table of AMD's reference setup (RoCEv2 at index 3)."""
    gids = [
        {"index": 0, "gid": "fe80:0000:0000:0000:0a00:27ff:fe00:0001", "type": "IB/RoCE v1", "ndev": "ens1"},
        {"index": 1, "gid": "fe80:0000:0000:0000:0a00:27ff:fe00:0001", "type": "RoCE v2", "ndev": "ens1"},
        {"index": v2_index - 1, "gid": "0000:0000:0000:0000:0000:ffff:0a00:0001", "type": "IB/RoCE v1"},
        {
            "index": v2_index,
            "gid": "0000:0000:0000:0000:0000:ffff:0a00:0001",
            "type": "RoCE v2",
            "ndev": "ens1",
        },
    ]
    return {"device": device, "port": 1, "state": state, "link_layer": "Ethernet", "gids": gids}


def net_double(host: str, *, rdma: list[dict[str, Any]] | None = None, extra_if: str = "") -> dict[str, Any]:
    """TEST DOUBLE: a node's ``net`` facts: lo, eth0 carrying its train_address, optional RDMA ports."""
    ifaces = [
        {"name": "lo", "state": "UNKNOWN", "addrs": ["127.0.0.1"]},
        {"name": "eth0", "state": "UP", "addrs": [ADDR[host]]},
    ]
    if extra_if:
        ifaces.append({"name": extra_if, "state": "UP", "addrs": []})
    return {"interfaces": ifaces, "rdma": rdma or [], "libibverbs": bool(rdma), "boot_id": f"boot-{host}"}


def probes(**nets: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h: {"net": nets.get(h) or net_double(h)} for h in HOSTS}


def test_sockets_on_the_test_hosts_derive_the_interface_and_say_sockets() -> None:
    plan = resolve_fabric(HOSTS, ADDR, probes(), {}, FabricOptions())
    assert plan.envs["host3"] == {
        "NCCL_SOCKET_IFNAME": "eth0",
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_IB_DISABLE": "1",
    }
    assert plan.notes == (
        "fabric: TCP sockets between the nodes (no RDMA device (/sys/class/infiniband is empty) on host1; "
        "NCCL_SOCKET_IFNAME=eth0)",
    )
    assert not plan.warnings


def test_rdma_nodes_derive_hcas_and_the_roce_v2_gid_index() -> None:
    nets = {h: net_double(h, rdma=[roce_port_double("rdma0"), roce_port_double("rdma1")]) for h in HOSTS}
    plan = resolve_fabric(HOSTS, ADDR, probes(**nets), {}, FabricOptions())
    assert plan.envs["host2"] == {
        "NCCL_SOCKET_IFNAME": "eth0",
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_IB_HCA": "=rdma0:1,rdma1:1",
        "NCCL_IB_GID_INDEX": "3",
    }
    assert not plan.notes


def test_an_interface_missing_on_host3_is_refused_naming_it() -> None:
    nets = {h: net_double(h, extra_if="fab0") for h in ("host1", "host2")}
    with pytest.raises(ConfigurationError) as err:
        resolve_fabric(
            HOSTS, ADDR, probes(**nets), {h: {"NCCL_SOCKET_IFNAME": "fab0"} for h in HOSTS}, FabricOptions()
        )
    assert str(err.value) == (
        "host3: NCCL_SOCKET_IFNAME=fab0: no interface 'fab0' on host3 (it has lo, eth0); fix env in the job "
        "spec or mift_node_env; nothing was started"
    )


def test_gid_indexes_that_differ_across_nodes_are_refused_naming_the_node() -> None:
    nets = {h: net_double(h, rdma=[roce_port_double("rdma0")]) for h in HOSTS}
    nets["host2"] = net_double("host2", rdma=[roce_port_double("rdma0", v2_index=5)])
    with pytest.raises(ConfigurationError, match=r"^host2: NCCL_IB_GID_INDEX is 5 on host2 but 3 on host1"):
        resolve_fabric(HOSTS, ADDR, probes(**nets), {}, FabricOptions())
    # one value in the job spec settles it
    plan = resolve_fabric(
        HOSTS, ADDR, probes(**nets), {h: {"NCCL_IB_GID_INDEX": "3"} for h in HOSTS}, FabricOptions()
    )
    assert plan.envs["host2"]["NCCL_IB_GID_INDEX"] == "5"  # derived; the override wins in render_node_env


def test_a_port_down_is_left_out_and_named() -> None:
    ports = [roce_port_double("rdma0"), roce_port_double("rdma1", state="DOWN")]
    nets = {h: net_double(h, rdma=ports) for h in HOSTS}
    plan = resolve_fabric(HOSTS, ADDR, probes(**nets), {}, FabricOptions())
    assert plan.envs["host1"]["NCCL_IB_HCA"] == "=rdma0:1"
    assert "host1: RDMA port rdma1:1 DOWN: left out of NCCL_IB_HCA" in plan.warnings


def test_sockets_where_rdma_is_expected_fail_or_warn_by_policy() -> None:
    nets = {h: net_double(h, rdma=[roce_port_double("rdma0")]) for h in ("host1", "host2")}
    with pytest.raises(ConfigurationError) as err:
        resolve_fabric(HOSTS, ADDR, probes(**nets), {}, FabricOptions())
    assert str(err.value).startswith(
        "host3: collectives would fall back to TCP sockets where RDMA is expected (fabric.transport: auto): "
        "no RDMA device"
    )
    plan = resolve_fabric(HOSTS, ADDR, probes(), {}, FabricOptions(transport="rdma", socket_fallback="warn"))
    assert plan.warnings == (
        "host1: collectives would fall back to TCP sockets where RDMA is expected (fabric.transport: rdma): "
        "no RDMA device (/sys/class/infiniband is empty) "
        "(fabric.socket_fallback: warn: every node uses sockets)",
    )
    # mixed nodes with warn: one transport for the job, sockets everywhere
    plan = resolve_fabric(HOSTS, ADDR, probes(**nets), {}, FabricOptions(socket_fallback="warn"))
    assert {h: plan.envs[h].get("NCCL_IB_DISABLE") for h in HOSTS} == dict.fromkeys(HOSTS, "1")
    # the job spec naming HCAs expects RDMA too (the example spec's hand-written list on a node without any)
    with pytest.raises(ConfigurationError, match=r"^host1: collectives would fall back"):
        resolve_fabric(HOSTS, ADDR, probes(), {h: {"NCCL_IB_HCA": "rdma0"} for h in HOSTS}, FabricOptions())


def test_rdma_devices_without_libibverbs_count_as_sockets() -> None:
    net = net_double("host1", rdma=[roce_port_double("rdma0")])
    fabric = node_fabric("host1", ADDR["host1"], {**net, "libibverbs": False})
    assert fabric.transport == "socket"
    assert derived_env(fabric)["NCCL_IB_DISABLE"] == "1"


def test_nccl_prefix_exact_and_exclude_forms() -> None:
    names = ["lo", "eth0", "ens50f0np0"]
    assert missing_interface("NCCL_SOCKET_IFNAME", "ens", names) is None
    assert missing_interface("NCCL_SOCKET_IFNAME", "=ens", names) == "ens"
    assert missing_interface("NCCL_SOCKET_IFNAME", "^docker", names) is None
    assert missing_interface("GLOO_SOCKET_IFNAME", "eth", names) == "eth"  # gloo: exact names


def test_roce_v2_index_prefers_an_ipv4_mapped_gid() -> None:
    gids = [
        {"index": 1, "gid": "fe80:0000:0000:0000:0a00:27ff:fe00:0001", "type": "RoCE v2"},
        {"index": 3, "gid": "0000:0000:0000:0000:0000:ffff:0a00:0001", "type": "RoCE v2"},
    ]
    assert roce_v2_index(gids) == 3
    assert roce_v2_index(gids[:1]) == 1
    assert roce_v2_index([]) is None


def test_no_interface_carrying_train_address_is_one_warning_on_multi_node_jobs() -> None:
    names = {**ADDR, "host2": "node2.example"}  # an inventory name, not an address of the node
    plan = resolve_fabric(HOSTS, names, probes(), {}, FabricOptions())
    assert plan.warnings == (
        "host2: no interface carries train_address node2.example: NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME not "
        "derived (set them in the job spec's env)",
    )
    assert "NCCL_SOCKET_IFNAME" not in plan.envs["host2"]
    assert resolve_fabric(["host2"], names, probes(), {}, FabricOptions()).warnings == ()

"""Parsers of fabric and GPU tool output, the per-node acceptance lines (launcher.fabric.parsers, .accept).

Real captures (tests/fixtures/gpu-tools, provenance in its INDEX.md): ``amd-smi static`` and ``amd-smi
metric`` of an MI300X x8 (ROCm blogs), ``rocm-smi -a`` of an MI300X x4. The ``metric`` capture is cut before
its ECC and PCIE sections.

NO REAL CAPTURE exists in the repository or the shared fixtures (/work/shared/fixtures/gpu-tools/INDEX.md)
of ``ibv_devinfo -v``, ``rdma link``, ``amd-smi firmware``, ``amd-smi xgmi`` or the ECC/PCIE sections of
``amd-smi metric``: the texts below named ``*_TEST_DOUBLE`` are written by hand after the tools' documented
formats, not captured from a machine. There is no ``amd-smi xgmi`` parser.
"""

from __future__ import annotations

from pathlib import Path

from launcher.fabric.accept import accept_nodes
from launcher.fabric.parsers import (
    amd_smi_blocks,
    gpu_ecc,
    gpu_firmware,
    gpu_pcie,
    ibv_devinfo,
    rdma_link,
    rocm_smi_firmware,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-tools"

IBV_DEVINFO_V_TEST_DOUBLE = """\
hca_id:\tmlx5_0
\ttransport:\t\t\tInfiniBand (0)
\tfw_ver:\t\t\t\t28.39.1002
\tphys_port_cnt:\t\t\t1
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_ACTIVE (4)
\t\t\tmax_mtu:\t\t4096 (5)
\t\t\tactive_mtu:\t\t4096 (5)
\t\t\tlink_layer:\t\tEthernet
\t\t\tGID[  0]:\t\tfe80:0000:0000:0000:0a00:27ff:fe00:0001, RoCE v1
\t\t\tGID[  1]:\t\tfe80:0000:0000:0000:0a00:27ff:fe00:0001, RoCE v2
\t\t\tGID[  2]:\t\t0000:0000:0000:0000:0000:ffff:0a00:0001, RoCE v1
\t\t\tGID[  3]:\t\t0000:0000:0000:0000:0000:ffff:0a00:0001, RoCE v2

hca_id:\tmlx5_1
\ttransport:\t\t\tInfiniBand (0)
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_DOWN (1)
\t\t\tlink_layer:\t\tEthernet
"""

RDMA_LINK_TEST_DOUBLE = """\
link mlx5_0/1 state ACTIVE physical_state LINK_UP netdev ens1f0np0
link mlx5_1/1 state DOWN physical_state DISABLED netdev ens1f1np1
"""

AMD_SMI_FIRMWARE_TEST_DOUBLE = """\
GPU: 0
    FW_LIST:
        FW 0:
            FW_ID: CP_MEC1
            FW_VERSION: 00.00.00.138
        FW 1:
            FW_ID: PLDM_BUNDLE
            FW_VERSION: 01.25.03.12

GPU: 1
    FW_LIST:
        FW 0:
            FW_ID: PLDM_BUNDLE
            FW_VERSION: 01.24.00.01
"""

AMD_SMI_METRIC_ECC_PCIE_TEST_DOUBLE = """\
GPU: 0
    PCIE:
        WIDTH: 16
        SPEED: 32 GT/s
    ECC:
        TOTAL_CORRECTABLE_COUNT: 0
        TOTAL_UNCORRECTABLE_COUNT: 0
        TOTAL_DEFERRED_COUNT: 0

GPU: 3
    PCIE:
        WIDTH: 8
        SPEED: 32 GT/s
    ECC:
        TOTAL_CORRECTABLE_COUNT: 5
        TOTAL_UNCORRECTABLE_COUNT: 2
        TOTAL_DEFERRED_COUNT: 0
"""


def test_amd_smi_blocks_on_the_real_static_capture() -> None:
    text = (FIXTURES / "amd-smi" / "mi300x_x8_rocmblogs_amd-smi-overview_static.txt").read_text()
    gpus = amd_smi_blocks(text)
    assert list(gpus) == [0]  # the capture shows GPU 0's ASIC and BUS blocks
    assert gpu_pcie(gpus[0])["max_width"] == 16 and gpu_pcie(gpus[0])["max_speed_gts"] == 32
    assert gpus[0]["BUS"]["BDF"] == "0000:05:00.0"


def test_amd_smi_blocks_on_the_real_metric_capture() -> None:
    text = (FIXTURES / "amd-smi" / "mi300x_x8_rocmblogs_amd-smi-overview_metric.txt").read_text()
    gpu = amd_smi_blocks(text)[0]
    assert gpu["POWER"]["SOCKET_POWER"] == "234 W"
    assert gpu["CLOCK"]["GFX_2"]["CLK"] == "2107 MHz"
    # the capture is cut before ECC and PCIE: nothing to judge, nothing invented
    assert gpu_ecc(gpu) == {"correctable": None, "uncorrectable": None, "deferred": None}
    assert gpu_pcie(gpu)["width"] is None


def test_rocm_smi_firmware_on_the_real_capture() -> None:
    text = (FIXTURES / "rocm-smi" / "mi300x_x4_thamada_showall.txt").read_text()
    fw = rocm_smi_firmware(text)
    assert sorted(fw) == [0, 1, 2, 3]
    assert fw[0]["TA XGMI"] == "32.00.01.19" and fw[0]["MEC"] == "138"
    assert "ASD" not in fw[0]  # "Not supported on the given system" lines are left out


def test_ibv_devinfo_test_double() -> None:
    ports = ibv_devinfo(IBV_DEVINFO_V_TEST_DOUBLE)
    assert [(p["device"], p["port"], p["state"], p["link_layer"]) for p in ports] == [
        ("mlx5_0", 1, "ACTIVE", "Ethernet"),
        ("mlx5_1", 1, "DOWN", "Ethernet"),
    ]
    assert [(g["index"], g["type"]) for g in ports[0]["gids"]][-1] == (3, "RoCE v2")


def test_rdma_link_test_double() -> None:
    assert [(link["device"], link["state"], link["netdev"]) for link in rdma_link(RDMA_LINK_TEST_DOUBLE)] == [
        ("mlx5_0", "ACTIVE", "ens1f0np0"),
        ("mlx5_1", "DOWN", "ens1f1np1"),
    ]


def test_amd_smi_firmware_and_metric_test_doubles() -> None:
    fw = amd_smi_blocks(AMD_SMI_FIRMWARE_TEST_DOUBLE)
    assert gpu_firmware(fw[0]) == {"CP_MEC1": "00.00.00.138", "PLDM_BUNDLE": "01.25.03.12"}
    metric = amd_smi_blocks(AMD_SMI_METRIC_ECC_PCIE_TEST_DOUBLE)
    assert gpu_pcie(metric[3])["width"] == 8
    assert gpu_ecc(metric[3]) == {"correctable": 5, "uncorrectable": 2, "deferred": 0}


def _tool(stdout: str) -> dict[str, object]:
    return {"rc": 0, "stdout": stdout, "stderr": ""}


def test_acceptance_names_each_bad_fact_in_one_line() -> None:
    """TEST DOUBLES for the rig: a port DOWN, GID indexes that differ, an ECC count, a PCIe link at x8,
    firmware not in the allow-list: each one line naming the node."""
    hosts = ["host1", "host2"]
    addr = {"host1": "10.0.0.1", "host2": "10.0.0.2"}
    ports = ibv_devinfo(IBV_DEVINFO_V_TEST_DOUBLE)  # mlx5_0 active (GID 3), mlx5_1 DOWN
    other = [{**ports[0], "gids": [{**g, "index": g["index"] + 2} for g in ports[0]["gids"]]}]  # RoCEv2 at 5
    probe = {
        "host1": {
            "net": {"interfaces": [], "rdma": ports, "libibverbs": True},
            "gpu_tools": {
                "amd_smi_metric": _tool(AMD_SMI_METRIC_ECC_PCIE_TEST_DOUBLE),
                "amd_smi_firmware": _tool(AMD_SMI_FIRMWARE_TEST_DOUBLE),
            },
        },
        "host2": {"net": {"interfaces": [], "rdma": other, "libibverbs": True}, "gpu_tools": {}},
    }
    result = accept_nodes(hosts, addr, probe, {"host1": "7.2.1", "host2": "7.2.1"})
    assert result.bad == [
        "host1: RDMA port mlx5_1:1 DOWN",
        "host2: RoCEv2 GID index 5 (host1: 3); NCCL_IB_GID_INDEX must be one value for every node",
        "host1: GPU 3: 2 uncorrectable, 0 deferred ECC errors (amd-smi metric)",
        "host1: GPU 3: PCIe link x8, expected x16 (amd-smi metric)",
        "host1: GPU 1: firmware PLDM_BUNDLE 01.24.00.01 is not in the allow-list of ROCm 7.2.1 (01.25.02.04, "
        "01.25.03.12, 01.25.06.04)",
    ]
    assert result.notes == [
        "host2: amd-smi metric: not installed, not judged",
        "host2: amd-smi firmware: not installed, not judged",
    ]

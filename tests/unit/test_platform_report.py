"""The node platform report (plugins/module_utils/mift_platform.py, used by the gpu_verify role).

GPU memory partitions come from real amd-smi and rocm-smi captures (tests/fixtures/gpu-tools,
provenance in its INDEX.md). The sysfs/procfs values are written in the kernel's formats
(Documentation/ABI: smt/control is one of on/off/forceoff/notsupported/notimplemented, node/online a
cpulist); those lines are not captures of an MI300X node (none was found).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU_TOOLS = REPO / "tests" / "fixtures" / "gpu-tools"
sys.path.insert(0, str(REPO / "plugins" / "module_utils"))

import mift_platform as mp  # noqa: E402

# two-socket EPYC and Xeon hosts in /proc/cpuinfo's format (only the lines the report reads)
EPYC_2S = "".join(
    f"processor\t: {i}\nvendor_id\t: AuthenticAMD\nphysical id\t: {i % 2}\n\n" for i in range(4)
)
XEON_2S = EPYC_2S.replace("AuthenticAMD", "GenuineIntel")
CMDLINE_PT = "BOOT_IMAGE=/vmlinuz-6.8.0-45-generic root=UUID=x ro pci=realloc=off iommu=pt"


@pytest.mark.parametrize(
    ("capture", "expected"),
    [
        ("rocm7/amd-smi/NEG_static-partition_mi300x-vf_x2_rocm7.2.4_fleet-amd-task.txt", ["NPS1"] * 2),
        ("rocm7/amd-smi/default_mi300x_x8_spx-nps1_rocm7.0.0_amdsmi-changelog.txt", ["NPS1"] * 8),
        # DPX: 16 logical GPUs, the 8 secondary partitions print N/A and are left out
        ("rocm7/amd-smi/default_mi300x_dpx-nps1_x8-16part_rocm7.0.2_amdsmi-issue132.txt", ["NPS1"] * 8),
        ("rocm7/amd-smi/NEG_partition-g0_mi325x-vf_device-metrics-exporter-metricsmap.txt", ["NPS1"]),
        ("rocm-smi/mi300x_cpx_nps4_63part_issue4750_concise_and_vram.txt", ["NPS4"] * 63),
        ("rocm-smi/mi300x_x8_rocm_issue4021_concise.txt", ["NPS1"] * 8),
        ("rocm7/amd-smi/NEG_list_mi300x-vf_x2_rocm7.2.4_fleet-amd-task.txt", []),  # no partition in `list`
    ],
)
def test_gpu_memory_partition_from_real_captures(capture: str, expected: list[str]) -> None:
    text = (GPU_TOOLS / capture).read_text(encoding="utf-8")
    assert mp.memory_partitions(text) == expected


def test_a_node_as_amd_recommends_has_no_warning() -> None:
    nps1 = (GPU_TOOLS / "rocm7/amd-smi/default_mi300x_x8_spx-nps1_rocm7.0.0_amdsmi-changelog.txt").read_text()
    result = mp.report(
        mp.PlatformInputs(
            smt_control="off\n",
            smt_active="0\n",
            nodes_online="0-1\n",
            cpuinfo=EPYC_2S,
            cmdline=CMDLINE_PT,
            iommu_entries=2,
            iommu_group_types=["identity\n"] * 3,
            amd_smi_partition=nps1,
        )
    )
    assert result == {
        "smt_control": "off",
        "smt_active": "0",
        "cpu_vendor": "AuthenticAMD",
        "sockets": 2,
        "numa_nodes": 2,
        "cpu_nps": 1,
        "iommu_mode": "passthrough",
        "iommu_pt_arg": True,
        "gpu_memory_partitions": ["NPS1"],
        "warnings": [],
    }


def test_each_difference_from_amds_guide_is_one_warning() -> None:
    nps4 = (GPU_TOOLS / "rocm-smi/mi300x_cpx_nps4_63part_issue4750_concise_and_vram.txt").read_text()
    result = mp.report(
        mp.PlatformInputs(
            smt_control="on\n",
            smt_active="1\n",
            nodes_online="0-7\n",
            cpuinfo=EPYC_2S,
            cmdline="ro quiet",
            iommu_entries=4,
            iommu_group_types=["DMA-FQ\n"],
            amd_smi_partition=nps4,
        )
    )
    assert result["warnings"] == [
        "SMT is on (/sys/devices/system/cpu/smt/control); AMD's MI300X guide turns SMT off in the BIOS for "
        "compute-bound workloads",
        "CPU NUMA nodes per socket 4 (NPS4: 8 nodes, 2 sockets); AMD's MI300X guide sets NPS1 in the BIOS",
        "IOMMU mode translated, not passthrough; AMD's MI300X guide adds iommu=pt to the kernel command line "
        "(host_tuning_kernel_args, applied at the next reboot)",
        "GPU memory partition NPS4 on 63 of 63 GPUs; an MI300X in SPX runs NPS1 "
        "(amd-smi set --memory-partition NPS1)",
    ]
    assert result["cpu_nps"] == 4
    assert result["iommu_mode"] == "translated"


def test_nps_is_an_epyc_bios_setting_so_xeon_hosts_only_report_it() -> None:
    result = mp.report(
        mp.PlatformInputs(nodes_online="0-3", cpuinfo=XEON_2S, iommu_entries=1, cmdline=CMDLINE_PT)
    )
    assert result["cpu_nps"] == 2
    assert not [w for w in result["warnings"] if "NUMA" in w]


def test_iommu_off_and_unknown_values() -> None:
    assert mp.iommu_mode([], 0, CMDLINE_PT) == "off"
    assert mp.iommu_mode([], 1, CMDLINE_PT) == "passthrough"  # no group types exposed: the argument tells
    assert mp.iommu_mode([], 1, "ro") == "unknown"
    result = mp.report(mp.PlatformInputs(smt_control="notsupported"))
    assert result["iommu_mode"] == "off"
    assert result["smt_control"] == "notsupported"
    assert result["warnings"] == [
        "IOMMU is off (no /sys/class/iommu entry); AMD's MI300X guide enables it in the BIOS"
    ]


@pytest.mark.parametrize(("text", "count"), [("0", 1), ("0-1", 2), ("0-3,6", 5), ("", 0)])
def test_cpulist(text: str, count: int) -> None:
    assert mp.cpulist_count(text) == count

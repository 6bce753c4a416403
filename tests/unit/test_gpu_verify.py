"""Node verification (``verify_node``) over real and derived captures, and over mutated captures.

rocminfo decides the count and arch; rocm-smi and amd-smi are cross-checked against it. Each case below is a
node as the module would see it: the commands it ran, their exit status and output. Captures: real ones under
tests/fixtures/gpu-tools/ (INDEX.md sections 1-8), derived ones under derived/ (INDEX.md section 9, made by
derived/derive.py).
"""

# ruff: noqa: E501 - the expected failure lines are compared whole, as the module prints them
from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))

import amd_gpu_parse as p  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "gpu-tools"
AMD_SMI_CMD = "amd-smi static --asic --vram --partition --json"
COMMANDS = {"rocminfo": "rocminfo", "rocm-smi": "rocm-smi", "amd-smi": AMD_SMI_CMD}
FULL = p.Expectation()

ROCMINFO_8 = "rocminfo/mi300x_x8_rocm_issue4021.txt"
CONCISE_8 = "rocm-smi/mi300x_x8_rocm_issue4021_concise.txt"
AMD_JSON_8 = "derived/amd-smi/static-json_mi300x_x8_spx-nps1_rocm7.txt"


def text(rel: str) -> str:
    return (FIXTURES / rel).read_bytes().decode("utf-8")


def run(tool: str, rel: str, rc: int = 0, command: str | None = None) -> p.ToolRun:
    return p.ToolRun(tool, command or COMMANDS[tool], rc, text(rel))


def absent(tool: str) -> p.ToolRun:
    return p.ToolRun(tool, COMMANDS[tool], None)


@dataclass
class Node:
    """A node case: what the module ran, and either the count it must accept or the lines it must print."""

    id: str
    runs: list[p.ToolRun]
    expect: p.Expectation = FULL
    accepted: int | None = None
    lines: list[str] = field(default_factory=list)
    visible_env: dict[str, str] = field(default_factory=dict)


_CAUSE_FEWER = (
    "(likely cause: a GPU failed to initialise in the ROCm (HSA) runtime while the driver still lists it, or "
    "ROCR_VISIBLE_DEVICES/HIP_VISIBLE_DEVICES hides it from ROCm programs; fix: unset ROCR_VISIBLE_DEVICES and "
    "HIP_VISIBLE_DEVICES in the users' environment, check `dmesg | grep -i amdgpu`, reboot the node)"
)
_CAUSE_PARSE = (
    "(likely cause: the tool was interrupted or died part-way, or a release changed its format; fix: run "
    "`{cmd}` by hand and compare with docs/rocm.md)"
)
_CAUSE_DRIVER = (
    "(likely cause: amdgpu-dkms is not built or not loaded for the running kernel, or the node was not rebooted "
    "after the driver install; fix: check `dkms status` and `lsmod | grep amdgpu`, install amdgpu-dkms with the "
    "headers of the running kernel (rocm role), then reboot)"
)
_CAUSE_KFD_GROUP = (
    "(likely cause: user root is not in the video group (the groups that own /dev/kfd and /dev/dri/renderD*); "
    "fix: add the user to render and video (rocm_users does) and start a new login session: group membership "
    "applies to new logins only)"
)
_CAUSE_KFD_INVALID = (
    "(likely cause: /dev/kfd exists but the kernel refuses it: a container or VM without the GPU passed "
    "through, or a GPU this amdgpu does not drive; fix: run on the host or pass /dev/kfd and /dev/dri into the "
    "container; check `dmesg | grep -i kfd`)"
)
_CAUSE_HSA = (
    "(likely cause: a GPU failed to initialise in the ROCm runtime while the driver lists it, or a GPU that ROCm "
    "does not support is in the node (rocminfo then exits with the HSA status, 0 for HSA_STATUS_ERROR); fix: "
    "check `dmesg | grep -i amdgpu`, remove or isolate the unsupported GPU, reboot)"
)
_KFD_ERRORS = "rocm7/errors/rocminfo_kfd-invalid-argument_"


def _rocminfo_cut_short(name: str, capture: str, agents: int) -> Node:
    """A node whose rocminfo output (``capture``) ends after ``agents`` GPU agents, with no closing line."""
    return Node(
        name,
        [run("rocminfo", capture)],
        lines=[
            f"host1: rocminfo exited 0 but its output does not parse (rocminfo): cut short: the output ends after "
            f"{agents} GPU agents without rocminfo's closing '*** Done ***' line "
            + _CAUSE_PARSE.format(cmd="rocminfo")
        ],
    )


NODES: list[Node] = [
    Node(
        "8x MI300X, ROCm 7 tools agree",
        [run("rocminfo", ROCMINFO_8), run("rocm-smi", CONCISE_8), run("amd-smi", AMD_JSON_8)],
        accepted=8,
    ),
    Node(
        "noise: CRLF, locale warning, amd-smi group warning, newer JSON fields",
        [
            run("rocminfo", "derived/rocminfo/mi300x_x8_crlf-locale-warning_from-issue4021.txt"),
            run("amd-smi", "derived/amd-smi/static-json_mi300x_x8_warning-newer-fields-crlf.txt"),
        ],
        accepted=8,
    ),
    Node(
        "ROCm 7.0.0 rocminfo alone (rocm-smi and amd-smi not installed)",
        [
            run("rocminfo", "rocminfo/mi300x_x8_rocm7.0.0_rocprofiler-sdk_issue76.txt"),
            absent("rocm-smi"),
            absent("amd-smi"),
        ],
        accepted=8,
    ),
    Node(
        "amd-smi cannot read the partition; rocminfo's 304 CUs per GPU mean SPX",
        [
            run("rocminfo", ROCMINFO_8),
            run("amd-smi", "derived/amd-smi/static-json_mi300x_x8_partition-unknown.txt"),
        ],
        accepted=8,
    ),
    Node(
        "MI300X VF guest, VFs allowed",
        [
            run("rocminfo", "rocm7/rocminfo/NEG_rocminfo_mi300x-vf_x2_rocm7.2.4_fleet-amd-task.txt"),
            run("amd-smi", "derived/amd-smi/static-json_mi300x-vf_x2_rocm7.2.4.txt"),
        ],
        expect=p.Expectation(count=2, allow_vf=True),
        accepted=2,
    ),
    Node(
        "MI300X VF guest, default expectation",
        [
            run("rocminfo", "rocm7/rocminfo/NEG_rocminfo_mi300x-vf_x2_rocm7.2.4_fleet-amd-task.txt"),
            run("amd-smi", "derived/amd-smi/static-json_mi300x-vf_x2_rocm7.2.4.txt"),
        ],
        lines=[
            "host1: GPU count 2, expected 8 (likely cause: a GPU is missing from the bus or failed to initialise; "
            "fix: check `dmesg | grep -i amdgpu` and `amd-smi list`, reseat or replace the GPU, or set "
            "gpu_verify_expected_count)",
            "host1: GPU 0: virtual function (AMD Instinct MI300X VF, device 0x74b5), VF not allowed (likely cause: "
            "a VM guest with an SR-IOV GPU; fix: use bare-metal nodes, or set gpu_verify_allow_vf: true to accept)",
            "host1: GPU 1: virtual function (AMD Instinct MI300X VF, device 0x74b5), VF not allowed (likely cause: "
            "a VM guest with an SR-IOV GPU; fix: use bare-metal nodes, or set gpu_verify_allow_vf: true to accept)",
        ],
    ),
    Node(
        "rocminfo sees 4 of 8 GPUs",
        [
            run("rocminfo", "derived/rocminfo/mi300x_x8_visible4_from-issue4021.txt"),
            run("rocm-smi", CONCISE_8),
            run("amd-smi", AMD_JSON_8),
        ],
        lines=[
            "host1: GPU count disagrees: rocminfo sees 4 GPUs, rocm-smi sees 8, amd-smi sees 8 "
            + _CAUSE_FEWER
        ],
    ),
    Node(
        "rocminfo sees 4 of 8 GPUs, ROCR_VISIBLE_DEVICES set",
        [
            run("rocminfo", "derived/rocminfo/mi300x_x8_visible4_from-issue4021.txt"),
            run("amd-smi", AMD_JSON_8),
        ],
        visible_env={"ROCR_VISIBLE_DEVICES": "0,1,2,3"},
        lines=[
            "host1: GPU count disagrees: rocminfo sees 4 GPUs, amd-smi sees 8 (likely cause: "
            "ROCR_VISIBLE_DEVICES=0,1,2,3 hides GPUs from ROCm programs; fix: unset ROCR_VISIBLE_DEVICES and "
            "HIP_VISIBLE_DEVICES in the users' environment, check `dmesg | grep -i amdgpu`, reboot the node)"
        ],
    ),
    Node(
        "amd-smi JSON cut short",
        [
            run("rocminfo", ROCMINFO_8),
            run("rocm-smi", CONCISE_8),
            run("amd-smi", "derived/amd-smi/static-json_mi300x_x8_cut-short.txt"),
        ],
        lines=[
            f"host1: amd-smi exited 0 but its output does not parse ({AMD_SMI_CMD}): JSON cut short: Expecting "
            "value at line 177 column 11 (char 5994 of 5994) " + _CAUSE_PARSE.format(cmd=AMD_SMI_CMD)
        ],
    ),
    Node(
        "rocm-smi report cut short",
        [
            run("rocminfo", ROCMINFO_8),
            run("rocm-smi", "derived/rocm-smi/mi300x_x8_concise_cut-short_from-issue4021.txt"),
        ],
        lines=[
            "host1: rocm-smi exited 0 but its output does not parse (rocm-smi): cut short: the report ends after 5 "
            "devices without rocm-smi's closing 'End of ROCm SMI Log' line "
            + _CAUSE_PARSE.format(cmd="rocm-smi")
        ],
    ),
    Node(
        "rocminfo cut short in the seventh GPU agent",
        [
            run("rocminfo", "derived/rocminfo/mi300x_x8_cut-short_from-issue4021.txt"),
            run("amd-smi", AMD_JSON_8),
        ],
        lines=[
            "host1: rocminfo exited 0 but its output does not parse (rocminfo): cut short: the output ends after 7 "
            "GPU agents without rocminfo's closing '*** Done ***' line " + _CAUSE_PARSE.format(cmd="rocminfo")
        ],
    ),
    Node(
        "rocminfo HSA error after four GPUs, exit 0",
        [
            run("rocminfo", "derived/rocminfo/mi300x_x8_hsa-error-after-4_from-issue4021.txt"),
            run("amd-smi", AMD_JSON_8),
        ],
        lines=[
            "host1: rocminfo (rocminfo): an HSA runtime call failed part-way (HSA_STATUS_ERROR: A generic error has "
            "occurred., at rocminfo.cc:1329) " + _CAUSE_HSA
        ],
    ),
    Node(
        "rocminfo HSA error (real, ROCm 7.2.0)",
        [
            run(
                "rocminfo",
                "rocm7/errors/rocminfo_hsa-status-error_rx7800xt-plus-rx580_rocm7.2.0_rocm-issue5942.txt",
            )
        ],
        lines=[
            "host1: rocminfo (rocminfo): an HSA runtime call failed part-way (HSA_STATUS_ERROR: A generic error has "
            "occurred., at rocminfo.cc:1329) " + _CAUSE_HSA
        ],
    ),
    Node(
        "user not in the video group",
        [
            run(
                "rocminfo",
                "rocm7/errors/rocminfo_kfd-permission-denied_not-in-video-group_rootless-container_rocm5.7_rocm-issue1549.txt",
                rc=1,
            )
        ],
        lines=["host1: rocminfo (rocminfo): cannot open /dev/kfd (Permission denied) " + _CAUSE_KFD_GROUP],
    ),
    Node(
        "amdgpu not loaded (rocminfo and rocm-smi of one node)",
        [
            run(
                "rocminfo",
                "rocm7/errors/rocminfo_rock-not-loaded_mi210-x4_rocm6.2.3_rocm-issue4098.txt",
                rc=1,
            ),
            run(
                "rocm-smi",
                "rocm7/errors/rocm-smi_driver-not-initialized_mi210-x4_rocm6.2.3_rocm-issue4098.txt",
                rc=1,
            ),
        ],
        lines=[
            "host1: rocminfo (rocminfo): the amdgpu driver is not loaded ('ROCk module is NOT loaded, possibly no "
            "GPU devices') " + _CAUSE_DRIVER,
            "host1: rocm-smi (rocm-smi): the amdgpu driver is not loaded ('cat: /sys/module/amdgpu/initstate: No "
            "such file or directory') " + _CAUSE_DRIVER,
        ],
    ),
    Node(
        "amd-smi: driver not initialised (amdgpu built in)",
        [
            run("rocminfo", ROCMINFO_8),
            run(
                "amd-smi",
                "rocm7/errors/amd-smi_driver-not-initialized_amdgpu-builtin_amdsmi26.1.0_amdsmi-issue172.txt",
            ),
        ],
        lines=[
            f"host1: amd-smi ({AMD_SMI_CMD}): the amdgpu driver is not loaded ('ERROR:root:Unable to get devices, "
            "driver not initialized (amdgpu not found in modules)') " + _CAUSE_DRIVER
        ],
    ),
    Node(
        "amd-smi: no GPU detected",
        [
            run("rocminfo", ROCMINFO_8),
            run(
                "amd-smi",
                "rocm7/errors/amd-smi_no-gpu-detected_strix-halo_rocm7.11.0_kyuz0-toolboxes-issue13.txt",
            ),
        ],
        lines=[
            f"host1: amd-smi ({AMD_SMI_CMD}): the amdgpu driver is not loaded ('ERROR:root:Unable to detect any "
            "GPU devices, check amdgpu version and module status (sudo modprobe amdgpu)') " + _CAUSE_DRIVER
        ],
    ),
    *[
        Node(
            f"/dev/kfd refused ({name})",
            [run("rocminfo", f"{_KFD_ERRORS}{name}", rc=1)],
            lines=[
                "host1: rocminfo (rocminfo): cannot open /dev/kfd (Invalid argument) " + _CAUSE_KFD_INVALID
            ],
        )
        for name in (
            "mi300x-in-docker_rocm6.2.1_rocm-issue4043.txt",
            "rx9070xt-unprivileged-lxc_rocm7.0.1_rocm-issue5379.txt",
            "rx9070xt_rocm7.2.2_rocm-issue6166.txt",
        )
    ],
    Node(
        "8x MI210 (another arch)",
        [
            run("rocminfo", "rocminfo/NEG_mi210_x8_rocmblogs_roc-profiling_sysinfo.txt"),
            run("rocm-smi", "rocm-smi/NEG_mi210_x8_rocmblogs_affinity2_concise.txt"),
        ],
        lines=[
            "host1: GPU 0: arch gfx90a (AMD Instinct MI210), expected gfx942 (likely cause: a GPU of another "
            "generation; code objects built for gfx942 (torch, flash-attn, DeepSpeed ops) fail on it with "
            "hipErrorNoBinaryForGPU; fix: use nodes with gfx942 GPUs, or set gpu_verify_expected_arch if this node "
            "is meant to differ)",
            "host1: GPU 2-7: same arch failure (6 more GPUs)",
        ],
    ),
    _rocminfo_cut_short(
        "MI250X flattened paste served as rocminfo output",
        "rocminfo/NEG_mi250x_x8gcd_flattened_rccl_issue1490.txt",
        agents=8,
    ),
    _rocminfo_cut_short(
        "MI300X CPX, rocminfo pasted partially",
        "rocminfo/mi300x_cpx_partial_2agents_rocm_issue4750.txt",
        agents=2,
    ),
]


@pytest.mark.parametrize("node", NODES, ids=[n.id for n in NODES])
def test_node(node: Node) -> None:
    verdict = p.verify_node("host1", node.runs, node.expect, visible_env=node.visible_env)
    assert all(line.startswith("host1: ") and "\n" not in line for line in verdict.failures)
    if node.accepted is not None:
        assert verdict.failures == []
        assert len(verdict.gpus) == node.accepted
        assert {g.arch for g in verdict.gpus} == {"gfx942"}
    else:
        for line in node.lines:
            assert line in verdict.failures, "\n".join(verdict.failures)
        assert not any("is not an MI300X" in line for line in verdict.failures)


def test_count_line_names_both_tools_and_counts() -> None:
    verdict = p.verify_node(
        "host4",
        [
            run("rocminfo", "derived/rocminfo/mi300x_x8_visible4_from-issue4021.txt"),
            run("amd-smi", AMD_JSON_8),
        ],
        FULL,
    )
    assert len(verdict.failures) == 1
    assert verdict.failures[0].startswith(
        "host4: GPU count disagrees: rocminfo sees 4 GPUs, amd-smi sees 8 ("
    )


def test_tools_record_and_table() -> None:
    verdict = p.verify_node(
        "host1",
        [
            run("rocminfo", ROCMINFO_8),
            run("rocm-smi", CONCISE_8),
            run("amd-smi", AMD_JSON_8),
            absent("rocm-smi"),
        ],
        FULL,
    )
    assert verdict.tools["rocminfo"] == {"rc": 0, "error": "", "gpus": 8}
    assert verdict.tools[AMD_SMI_CMD]["gpus"] == 8
    assert verdict.gpus[0].sources == ["rocminfo", "rocm-smi", "amd-smi"]
    table = p.format_table("host1", verdict.gpus).splitlines()
    assert table[2].split()[:6] == ["0", "gfx942", "AMD", "Instinct", "MI300X", "SPX"]


def test_partition_disagreement_names_the_tools() -> None:
    cpx = text(AMD_JSON_8).replace('"accelerator_partition": "SPX"', '"accelerator_partition": "CPX"')
    verdict = p.verify_node(
        "host1", [run("rocminfo", ROCMINFO_8), p.ToolRun("amd-smi", AMD_SMI_CMD, 0, cpx)], FULL
    )
    assert verdict.failures[0] == (
        "host1: compute partition disagrees: rocminfo (304 CUs per GPU) SPX, amd-smi CPX (likely cause: the mode "
        "changed without the driver reloading, or a tool misreads it; fix: run `amd-smi set --compute-partition "
        "SPX` as root and reboot, then compare `amd-smi static --partition` with `rocminfo`)"
    )
    assert (
        "host1: GPU 0: partition CPX, expected SPX (likely cause: compute partitioning was changed"
        in (verdict.failures[1])
    )


def test_vram_disagreement() -> None:
    half = text(AMD_JSON_8).replace('"value": 196592', '"value": 98296')
    verdict = p.verify_node(
        "host1", [run("rocminfo", ROCMINFO_8), p.ToolRun("amd-smi", AMD_SMI_CMD, 0, half)], FULL
    )
    assert verdict.failures[0].startswith(
        "host1: VRAM per GPU disagrees: rocminfo reports 191.98 GiB, amd-smi 95.99 GiB (likely cause: "
    )


def test_unknown_partition_rejected() -> None:
    """amd-smi of ROCm 7 could not read the partition and no CU count tells it (#12 item 5)."""
    gpus = p.merge(p.parse_amd_smi(text("derived/amd-smi/static-json_mi300x_x8_partition-unknown.txt")))
    failures = p.check("host1", gpus, FULL)
    assert failures[0].startswith(
        "host1: GPU 0: partition unknown, expected SPX (likely cause: no tool reported"
    )
    odd = text(AMD_JSON_8).replace('"accelerator_partition": "SPX"', '"accelerator_partition": "XPX"')
    failures = p.check("host1", p.merge(p.parse_amd_smi(odd)), FULL)
    assert failures[0].startswith("host1: GPU 0: partition 'XPX' is not a compute partition mode")


def test_rocm7_amd_smi_partition_field() -> None:
    """ROCm 6.4.2+ names the field accelerator_partition; ROCm 7 prints it only with --partition."""
    gpus = p.parse_amd_smi(text(AMD_JSON_8))
    assert {(g.compute_partition, g.memory_partition) for g in gpus} == {("SPX", "NPS1")}
    vf = p.parse_amd_smi(text("rocm7/amd-smi/NEG_static-partition_mi300x-vf_x2_rocm7.2.4_fleet-amd-task.txt"))
    assert [g.compute_partition for g in vf] == ["SPX", "SPX"]
    plain = p.parse_amd_smi(text("rocm7/amd-smi/NEG_static_mi300x-vf_x2_rocm7.2.4_fleet-amd-task.txt"))
    assert [g.compute_partition for g in plain] == ["SPX", "SPX"]  # not printed: from 304 CUs of an MI300X


@pytest.mark.parametrize(
    ("device_id", "product", "vf"),
    [
        ("0x74a1", "AMD Instinct MI300X", False),
        ("0x74a9", "AMD Instinct MI300X HF", False),
        ("0x74bd", "AMD Instinct MI300X HF VF", True),
        ("0x74b5", "AMD Instinct MI300X VF", True),
        ("0x74a5", "AMD Instinct MI325X", False),
        ("0x74b9", "AMD Instinct MI325X VF", True),
    ],
)
def test_device_ids(device_id: str, product: str, vf: bool) -> None:
    gpu = p.merge(p.parse_amd_smi(_asic_json(device_id)))[0]
    assert (gpu.product, gpu.is_vf, gpu.arch, gpu.compute_partition) == (product, vf, "gfx942", "SPX")


def _asic_json(device_id: str, vram_mb: int = 196592) -> str:
    """An amd-smi ``static --asic --vram --json`` document that carries only a device id, 304 CUs and VRAM."""
    gpu = {
        "gpu": 0,
        "asic": {"device_id": device_id, "num_compute_units": 304},
        "vram": {"size": {"value": vram_mb, "unit": "MB"}},
    }
    return json.dumps({"gpu_data": [gpu]})


def test_product_allow_list() -> None:
    gpus = p.merge(p.parse_amd_smi(_asic_json("0x74a5", 262144)))
    assert p.check("h", gpus, p.Expectation(count=1)) == [
        "h: GPU 0: product AMD Instinct MI325X, expected one of MI300X (likely cause: another Instinct model of the "
        "same arch in this node; fix: add it to gpu_verify_allowed_products if the jobs' memory plans fit it)"
    ]
    assert p.check("h", gpus, p.Expectation(count=1, products=("MI300X", "MI325X"))) == []
    hf = p.merge(p.parse_amd_smi(_asic_json("0x74a9")))
    assert p.check("h", hf, p.Expectation(count=1)) == []  # an MI300X HF is an MI300X
    real_vf = p.merge(
        p.parse_amd_smi(
            text("rocm7/amd-smi/NEG_static-g0_mi325x-vf_snipped_device-metrics-exporter-metricsmap.txt")
        )
    )
    assert real_vf[0].product == "AMD Instinct MI325X VF"  # printed as "AMD Instinct Mi325X VF"


# Lenient parse of the ROCm 7 captures that are not whole-node outputs: (capture, GPUs, text of a failure or
# None when a default check passes with that count).
AMD7 = "rocm7/amd-smi"  # the folder of most ROCm 7 captures
ROCM7_PARSED: list[tuple[str, int, str | None]] = [
    (f"{AMD7}/EDGE_default_mi300x_x1_passthrough-guest_rocm7.0.0_k8s-gpu-dra-driver-demo.txt", 1, None),
    (
        f"{AMD7}/EDGE_list_mi300x_x1_passthrough-guest_rocm7.0.0_k8s-gpu-dra-driver-demo.txt",
        1,
        "partition unknown",
    ),
    (f"{AMD7}/NEG_EDGE_static_mi300a_docs-example_amdsmi26.5-docs.txt", 1, "product AMD Instinct MI300A"),
    (f"{AMD7}/NEG_default_mi300x-vf_x1_guest_rocm7.2.1_hipfile-docs-known-issues.txt", 1, "VF not allowed"),
    (f"{AMD7}/NEG_list-e_mi325x-vf_2of-N-shown_device-metrics-exporter-metricsmap.txt", 2, "MI325X VF"),
    (f"{AMD7}/NEG_list_mi300x-vf_x2_rocm7.2.4_fleet-amd-task.txt", 2, "VF not allowed"),
    (f"{AMD7}/NEG_list_mi325x-vf_2of-N-shown_device-metrics-exporter-metricsmap.txt", 2, "MI325X VF"),
    (f"{AMD7}/NEG_metric-mem-usage_mi300x-vf_x2_rocm7.2.4_fleet-amd-task.txt", 2, "arch unknown"),
    (f"{AMD7}/NEG_partition-g0_mi325x-vf_device-metrics-exporter-metricsmap.txt", 0, "GPU count 0"),
    (f"{AMD7}/NEG_static-g0_mi325x-vf_snipped_device-metrics-exporter-metricsmap.txt", 1, "VF not allowed"),
    (f"{AMD7}/NEG_static-partition_mi300x-vf_x2_rocm7.2.4_fleet-amd-task.txt", 2, "arch unknown"),
    (f"{AMD7}/NEG_static-vram_mi300x-vf_x2_rocm7.2.4_fleet-amd-task.txt", 2, "arch unknown"),
    (f"{AMD7}/NEG_static_mi300x-vf_x2_rocm7.2.4_fleet-amd-task.txt", 2, "VF not allowed"),
    (f"{AMD7}/default_mi300x_dpx-nps1_x8-16part_rocm7.0.2_amdsmi-issue132.txt", 16, "partition DPX"),
    (f"{AMD7}/default_mi300x_x1_spx-nps1_rocm7.1.1_hipfile-docs-known-issues.txt", 1, None),
    (f"{AMD7}/default_mi300x_x8_spx-nps1_rocm7.0.0_amdsmi-changelog.txt", 8, None),
    (f"{AMD7}/partition-accelerator_mi300x_dpx-nps1_x8-16part_rocm7.0.2_amdsmi-issue132.txt", 0, "count 0"),
    ("rocm7/rocm-smi/NEG_rocm-smi-a_mi300x-vf_x2_rocm7.2.4_fleet-amd-task.txt", 2, "VF not allowed"),
    ("derived/amd-smi/static-json_mi300x_x8_partition-unknown.txt", 8, "partition unknown"),
]
# Not a document any parser reads: amd-smi JSON printed as a Python repr from pdb.
NOT_JSON = [
    "rocm7/amd-smi/EDGE_metric-json-as-python-repr_mi300x_dpx_rocm7.0.2_amdsmi-issue134_TRUNCATED.txt"
]


@pytest.mark.parametrize(("capture", "count", "reason"), ROCM7_PARSED, ids=lambda v: str(v)[:70])
def test_rocm7_capture_parsed(capture: str, count: int, reason: str | None) -> None:
    tool = "rocm-smi" if "/rocm-smi/" in capture else "amd-smi"
    gpus = p.merge((p.parse_rocm_smi if tool == "rocm-smi" else p.parse_amd_smi)(text(capture)))
    assert len(gpus) == count
    failures = p.check("h", gpus, p.Expectation(count=count))
    if reason is None:
        assert failures == []
    else:
        assert any(reason in line for line in failures), failures


@pytest.mark.parametrize("capture", NOT_JSON)
def test_python_repr_is_not_json(capture: str) -> None:
    with pytest.raises(p.ToolOutputError, match="invalid JSON"):
        p.parse_amd_smi(text(capture))


def test_every_rocm7_and_derived_capture_has_a_case() -> None:
    used = {r.stdout for n in NODES for r in n.runs if r.rc is not None}
    named = {c for c, _, _ in ROCM7_PARSED} | set(NOT_JSON)
    missing = [
        str(f.relative_to(FIXTURES))
        for folder in ("rocm7", "derived")
        for f in sorted((FIXTURES / folder).rglob("*.txt"))
        if str(f.relative_to(FIXTURES)) not in named and f.read_bytes().decode("utf-8") not in used
    ]
    assert missing == []


def test_derived_fixtures_are_reproducible() -> None:
    spec = importlib.util.spec_from_file_location("derive", FIXTURES / "derived" / "derive.py")
    assert spec and spec.loader
    derive = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(derive)
    produced = derive.derive()
    on_disk = {str(f.relative_to(FIXTURES / "derived")) for f in (FIXTURES / "derived").rglob("*.txt")}
    assert set(produced) == on_disk
    for rel, content in produced.items():
        assert (FIXTURES / "derived" / rel).read_bytes() == content.encode("utf-8"), rel


# --------------------------------------------------------------------------- mutated captures

_BASES = {"rocminfo": ROCMINFO_8, "rocm-smi": CONCISE_8, "amd-smi": AMD_JSON_8}
_NOISE = st.sampled_from(
    [
        "\x1b[31m",
        "\x1b[0m",
        "\r\n",
        "\r",
        "\x00",
        "\ufeff",
        "WARNING: x\n",
        "{",
        "}",
        "[",
        '"',
        ":",
        "N/A",
        "\n\n",
    ]
)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, str]:
    tool = draw(st.sampled_from(sorted(_BASES)))
    data = text(_BASES[tool])
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["cut", "delete", "insert", "duplicate", "replace"]))
        at = draw(st.integers(0, len(data)))
        if kind == "cut":
            data = data[:at]
        elif kind == "delete":
            data = data[:at] + data[at + draw(st.integers(1, 400)) :]
        elif kind == "insert":
            data = data[:at] + draw(st.one_of(_NOISE, st.text(max_size=40))) + data[at:]
        elif kind == "duplicate":
            data = data[:at] + data[at : at + draw(st.integers(1, 2000))] + data[at:]
        else:
            data = data[:at] + draw(st.characters()) + data[at + 1 :]
    return tool, data


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=mutated(), rc=st.sampled_from([0, 0, 0, 1, 2]))
def test_mutated_capture_never_crashes(case: tuple[str, str], rc: int) -> None:
    tool, data = case
    runs = [run(t, _BASES[t]) for t in sorted(_BASES) if t != tool]
    runs.append(p.ToolRun(tool, COMMANDS[tool], rc, data))
    verdict = p.verify_node("host1", runs, FULL)
    for line in verdict.failures:
        assert line.startswith("host1: ") and "\n" not in line, line
        assert "likely cause: " in line or "same " in line, line
    if not verdict.failures:
        assert len(verdict.gpus) == 8


@settings(max_examples=150, deadline=None)
@given(cut=st.integers(0, 10**6))
def test_any_cut_of_rocminfo_or_amd_smi_rejects(cut: int) -> None:
    for tool in ("rocminfo", "amd-smi"):
        full = text(_BASES[tool])
        end = full.index(p.ROCMINFO_DONE) if tool == "rocminfo" else len(full.rstrip()) - 1
        data = full[: cut % end]
        runs = [run(t, _BASES[t]) for t in sorted(_BASES) if t != tool] + [
            p.ToolRun(tool, COMMANDS[tool], 0, data)
        ]
        verdict = p.verify_node("host1", runs, FULL)
        assert verdict.failures, (tool, len(data))

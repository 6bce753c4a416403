"""Unit tests of plugins/module_utils/amd_gpu_parse.py (role gpu_verify) on every real capture.

The captures under tests/fixtures/gpu-tools/ are verbatim outputs posted by users of real AMD
Instinct machines (see tests/fixtures/gpu-tools/INDEX.md and PROVENANCE.md). Each MI300X capture
must be accepted with the GPU count it shows; each negative capture must be rejected with its reason.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))

import amd_gpu_parse as p  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "gpu-tools"
PARSERS: dict[str, Callable[[str], list[p.Gpu]]] = {
    "rocminfo": p.parse_rocminfo,
    "rocm-smi": p.parse_rocm_smi,
    "amd-smi": p.parse_amd_smi,
}
# What each kind of capture can tell; checks on fields a capture does not carry are switched off.
FULL = p.Expectation()
COUNT_ONLY = p.Expectation(arch=None, products=None, partition=None, min_vram_gib=None)
VRAM_ONLY = p.Expectation(arch=None, products=None, partition=None)
NO_PARTITION = p.Expectation(partition=None)  # captures that carry no partition mode and no CU count


def gpus(count: int) -> p.Expectation:
    """The default expectation (FULL) for a node of ``count`` GPUs."""
    return p.Expectation(count=count)


def load(rel: str) -> list[p.Gpu]:
    tool = rel.split("/", 1)[0]
    return p.merge(PARSERS[tool]((FIXTURES / rel).read_text(encoding="utf-8")))


# (capture, GPUs it shows, expectation it must satisfy besides the count)
MI300X_CAPTURES: list[tuple[str, int, p.Expectation]] = [
    ("rocminfo/mi300x_x8_rocm_issue4021.txt", 8, FULL),
    ("rocminfo/mi300x_x8_rocm7.0.0_rocprofiler-sdk_issue76.txt", 8, FULL),
    ("rocminfo/mi300x_x4_thamada_gls.txt", 4, FULL),
    ("rocminfo/mi300x_x2_rocprofiler-sdk_issue137.txt", 2, FULL),
    ("rocminfo/mi300x_excerpt_cpu0_gpu_stas00-mlengineering.txt", 1, FULL),
    ("rocm-smi/mi300x_x8_rocm_issue4021_concise.txt", 8, FULL),
    ("rocm-smi/mi300x_x8_rocmblogs_grok1_concise_rocm6.1fmt.txt", 8, FULL),
    ("rocm-smi/mi300x_x8_dstack_tgi_concise_rocm6.2fmt.txt", 8, FULL),
    ("rocm-smi/mi300x_x8_dstack_vllm_concise_rocm6.1fmt.txt", 8, FULL),
    ("rocm-smi/mi300x_x8_cmontemuino_concise_rocm6.4.2_head20.txt", 8, FULL),
    ("rocm-smi/mi300x_x8_stas00-mlengineering_concise_rocm6.1fmt.txt", 8, FULL),
    ("rocm-smi/mi300x_spx_x8_issue4750_concise_and_vram.txt", 8, FULL),
    ("rocm-smi/mi300x_x8_cmontemuino_showtoponuma.txt", 8, COUNT_ONLY),
    ("rocm-smi/mi300x_x4_thamada_concise.txt", 4, FULL),
    ("rocm-smi/mi300x_x4_thamada_showall.txt", 4, FULL),
    ("rocm-smi/mi300x_x1_thamada_concise.txt", 1, FULL),
    ("rocm-smi/mi300x_spx_x1_issue4750_concise.txt", 1, FULL),
    ("rocm-smi/mi300x_spx_x1_issue4750_rocm-smi-i.txt", 1, NO_PARTITION),
    ("rocm-smi/mi300x_spx_x1_issue4750_showmeminfo_vram.txt", 1, VRAM_ONLY),
    ("rocm-smi/mi300x_x1_rocmblogs_llama-lora_showproductname.txt", 1, NO_PARTITION),
    ("rocm-smi/mi300x_x1_rocmblogs_llama-lora_concise_under_load.txt", 1, FULL),
    ("rocm-smi/mi300x_x1_rocmblogs_llama-Qlora_concise_under_load.txt", 1, FULL),
    ("amd-smi/mi300x_x8_oci-hpc-oke_version_and_list_rocm6.1.2.txt", 8, NO_PARTITION),
    ("amd-smi/mi300x_x8_rocmblogs_amd-smi-overview_list.txt", 3, NO_PARTITION),  # author cut it after GPU 2
    ("amd-smi/mi300x_x8_rocmblogs_amd-smi-overview_static.txt", 1, NO_PARTITION),  # author cut it after GPU 0
    ("amd-smi/mi300x_x8_rocmblogs_amd-smi-overview_monitor-putm.txt", 8, COUNT_ONLY),
    ("amd-smi/mi300x_x8_cmontemuino_monitor_watch5.txt", 8, VRAM_ONLY),
    ("amd-smi/mi300x_x8_rocmblogs_amd-smi-overview_metric.txt", 1, COUNT_ONLY),
]

# (capture, expectation, text every failure list must contain)
NEGATIVE_CAPTURES: list[tuple[str, p.Expectation, str]] = [
    ("rocminfo/NEG_mi250x_x8gcd_flattened_rccl_issue1490.txt", FULL, "GPU 0: arch gfx90a (AMD Instinct MI2"),
    (
        "rocminfo/NEG_mi210_x8_rocmblogs_roc-profiling_sysinfo.txt",
        FULL,
        "GPU 0: arch gfx90a (AMD Instinct MI2",
    ),
    (
        "rocminfo/NEG_radeon_rx7900xtx_x2_plus_igpu_gfx1100_rocm_issue6074_grep.txt",
        FULL,
        "GPU 0: arch gfx1100 (",
    ),
    (
        "rocminfo/EDGE_mi300x_gfx941_prerelease_rocminfo-docs-example.txt",
        gpus(1),
        "GPU 0: arch gfx941 (AMD Instinct MI300X), expected gfx942",
    ),
    ("rocminfo/NEG_mi300x_vf_x4_azure_rccl_issue1728.txt", gpus(4), "VF not allowed"),
    ("rocminfo/mi300x_vf_x1_rocm_issue5265.txt", gpus(1), "VF not allowed"),
    ("rocminfo/mi300x_cpx_partial_2agents_rocm_issue4750.txt", gpus(2), "GPU 0: partition CPX, expected SPX"),
    ("rocm-smi/mi300x_cpx_nps1_63part_issue4750_concise_and_vram.txt", FULL, "GPU count 63, expected 8"),
    ("rocm-smi/mi300x_cpx_nps4_63part_issue4750_concise_and_vram.txt", FULL, "partition CPX, expected SPX"),
    ("rocm-smi/mi300x_qpx_1gpu_issue4750_concise.txt", gpus(4), "partition QPX, expected SPX"),
    ("rocm-smi/mi300x_qpx_1gpu_issue4750_showmeminfo_vram.txt", gpus(1), "GPU count 4, expected 1"),
    ("rocm-smi/mi300a_spx_x1_issue4750_concise.txt", gpus(1), "product AMD Instinct MI300A"),
    ("rocm-smi/mi300a_spx_x1_issue4750_rocm-smi-i.txt", gpus(1), "expected one of MI300X"),
    (
        "rocm-smi/mi300a_spx_x1_issue4750_showmeminfo_vram.txt",
        p.Expectation(count=1, arch=None, products=None),
        "VRAM 93.82 GiB, expected at least 190.0 GiB",
    ),
    ("rocm-smi/mi300a_tpx_issue4750_concise.txt", gpus(3), "partition TPX, expected SPX"),
    (
        "rocm-smi/mi300a_tpx_issue4750_showmeminfo_vram.txt",
        p.Expectation(count=3, arch=None, products=None),
        "VRAM 31.27 GiB",
    ),
    (
        "rocm-smi/NEG_mi210_x8_rocmblogs_affinity2_concise.txt",
        FULL,
        "arch gfx90a (AMD Instinct MI210), expected gfx942",
    ),
    ("rocm-smi/NEG_mi210_x1_rocmblogs_chatglm_showproductname.txt", FULL, "arch gfx90a"),
    ("rocm-smi/NEG_mi250_x2_rocmblogs_llama2-lora_showproductname.txt", FULL, "arch gfx90a"),
    ("amd-smi/NEG_mi210_x2_amdsmi-issue38_static-asic.txt", gpus(2), "arch gfx90a"),
    ("amd-smi/NEG_mi300a_x4_amdsmi-readme_static.txt", gpus(4), "product AMD Instinct MI300A"),
    ("amd-smi/NEG_mi308x_amdsmi-changelog_static-asic.txt", gpus(1), "product AMD Instinct MI308X"),
    (
        "amd-smi/NEG_mi308x_x2_amdsmi-changelog_list.txt",
        gpus(2),
        "arch unknown (unknown product), expected gfx942",
    ),
    ("amd-smi/NEG_mi300x_vf_x1_guest_amd-smi_default.txt", gpus(1), "VF not allowed"),
    ("amd-smi/NEG_mi300x_vf_x1_guest_amd-smi_list.txt", gpus(1), "VF not allowed"),
]

# Files that are not device listings (no per-GPU identity): parsed to an empty list, never "accepted".
NOT_LISTINGS = [
    "amd-smi/mi300x_x8_rocmblogs_amd-smi-overview_process-csv.txt",
    "amd-smi/mi300x_rocmblogs_amd-smi-overview_static-json-jq-vram.txt",
]


def _with_count(expect: p.Expectation, count: int) -> p.Expectation:
    return dataclasses.replace(expect, count=count)


def test_every_capture_is_classified() -> None:
    listed = {c for c, _, _ in MI300X_CAPTURES} | {c for c, _, _ in NEGATIVE_CAPTURES} | set(NOT_LISTINGS)
    on_disk = {str(f.relative_to(FIXTURES)) for tool in PARSERS for f in (FIXTURES / tool).glob("*.txt")}
    assert on_disk - listed == set(), "a capture has no test"
    assert listed - on_disk == set(), "a test names a missing capture"


@pytest.mark.parametrize(("capture", "count", "expect"), MI300X_CAPTURES, ids=lambda v: str(v)[:60])
def test_mi300x_capture_accepted(capture: str, count: int, expect: p.Expectation) -> None:
    gpus = load(capture)
    assert len(gpus) == count
    assert [g.index for g in gpus] == list(range(count))
    assert p.check("host1", gpus, _with_count(expect, count)) == []
    assert p.check("host1", gpus, _with_count(expect, count + 1))[0].startswith(
        f"host1: GPU count {count}, expected {count + 1}"
    )


@pytest.mark.parametrize(("capture", "expect", "reason"), NEGATIVE_CAPTURES, ids=lambda v: str(v)[:60])
def test_negative_capture_rejected(capture: str, expect: p.Expectation, reason: str) -> None:
    failures = p.check("hostX", load(capture), expect)
    assert failures, "a negative capture was accepted"
    assert all(line.startswith("hostX: ") and "\n" not in line for line in failures)
    assert any(reason in line for line in failures), failures


@pytest.mark.parametrize("capture", NOT_LISTINGS)
def test_non_listing_yields_no_gpus(capture: str) -> None:
    assert load(capture) == []
    assert p.check("h", [], FULL) == [
        "h: GPU count 0, expected 8 (likely cause: amdgpu driver not loaded or the user is not in the "
        "render/video groups; check `dkms status`, `lsmod | grep amdgpu`, /dev/kfd)"
    ]


def test_rocminfo_counts_gpu_agents_not_isa_names() -> None:
    text = (FIXTURES / "rocminfo/mi300x_x8_rocm_issue4021.txt").read_text()
    assert text.count("Name:                    amdgcn-amd-amdhsa--gfx942") == 8
    gpus = p.parse_rocminfo(text)
    assert len(gpus) == 8  # 2 CPU agents and 8 ISA "Name:" lines are not GPUs
    first = gpus[0]
    assert (first.arch, first.product, first.device_id, first.compute_units) == (
        "gfx942",
        "AMD Instinct MI300X",
        "0x74a1",
        304,
    )
    assert first.vram_bytes == 201310208 * 1024
    assert first.vram_gib == 191.98
    assert first.compute_partition == "SPX"  # 304 CUs = one logical device per OAM


def test_flattened_mi250x_paste_is_split_into_agents() -> None:
    gpus = load("rocminfo/NEG_mi250x_x8gcd_flattened_rccl_issue1490.txt")
    assert len(gpus) == 8
    assert {g.arch for g in gpus} == {"gfx90a"}
    assert {g.product for g in gpus} == {"AMD Instinct MI250X"}


def test_mi250x_failure_line_is_exact() -> None:
    failures = p.check("host1", load("rocminfo/NEG_mi250x_x8gcd_flattened_rccl_issue1490.txt"), FULL)
    assert failures[0] == (
        "host1: GPU 0: arch gfx90a (AMD Instinct MI250X), expected gfx942 (likely cause: a GPU of another "
        "generation; code objects built for gfx942 (torch, flash-attn, DeepSpeed ops) fail on it with "
        "hipErrorNoBinaryForGPU; fix: use nodes with gfx942 GPUs, or set gpu_verify_expected_arch if this "
        "node is meant to differ)"
    )
    assert not any("is not an MI300X" in line for line in failures)
    assert "host1: GPU 2-7: same arch failure (6 more GPUs)" in failures


def test_cpx_node_reports_partition_and_count() -> None:
    gpus = p.merge(
        p.parse_rocminfo((FIXTURES / "rocminfo/mi300x_cpx_partial_2agents_rocm_issue4750.txt").read_text()),
        p.parse_rocm_smi(
            (FIXTURES / "rocm-smi/mi300x_cpx_nps1_63part_issue4750_concise_and_vram.txt").read_text()
        ),
    )
    failures = p.check("host3", gpus, FULL)
    assert failures[0].startswith("host3: GPU count 63, expected 8 (likely cause: the GPUs are in CPX")
    assert "CPX shows 64" in failures[0]
    assert failures[1].startswith("host3: GPU 0: partition CPX, expected SPX")
    assert gpus[0].compute_units == 38


def test_merge_fills_fields_from_every_tool_and_prints_table() -> None:
    gpus = p.merge(
        p.parse_rocminfo((FIXTURES / "rocminfo/mi300x_x8_rocm_issue4021.txt").read_text()),
        p.parse_rocm_smi((FIXTURES / "rocm-smi/mi300x_x8_rocm_issue4021_concise.txt").read_text()),
    )
    assert len(gpus) == 8
    assert gpus[0].sources == ["rocminfo", "rocm-smi"]
    assert (gpus[0].temperature_c, gpus[0].power_w, gpus[0].memory_partition) == (48.0, 145.0, "NPS1")
    table = p.format_table("host1", gpus).splitlines()
    assert table[0] == "host1: 8 GPUs"
    assert table[1].split() == ["GPU", "ARCH", "PRODUCT", "PART", "VRAM", "TEMP", "POWER"]
    assert table[2].split() == [
        "0",
        "gfx942",
        "AMD",
        "Instinct",
        "MI300X",
        "SPX",
        "191.98",
        "GiB",
        "48",
        "C",
        "145",
        "W",
    ]
    assert json.loads(json.dumps(gpus[0].as_dict()))["vram_gib"] == 191.98


def test_rocm_smi_vram_and_concise_in_one_capture() -> None:
    gpus = load("rocm-smi/mi300x_spx_x8_issue4750_concise_and_vram.txt")
    assert {g.vram_bytes for g in gpus} == {206141652992}
    assert {g.compute_partition for g in gpus} == {"SPX"}


def test_product_names_normalised() -> None:
    assert p.normalise_product("MI300X-O") == "AMD Instinct MI300X"
    assert p.normalise_product("AMD Instinct MI300X OAM") == "AMD Instinct MI300X"
    assert p.normalise_product("AMD Instinct MI300X VF") == "AMD Instinct MI300X VF"
    assert p.normalise_product("AMD INSTINCT MI250 (MCM) OAM AC MBA") == "AMD Instinct MI250"
    assert p.normalise_product("Radeon RX 7900 XTX") == "Radeon RX 7900 XTX"


# amd-smi --json: no full MI300X JSON capture exists (INDEX.md, "Gaps"). The two JSON shapes the
# CLI prints (a list, or {"gpu_data": [...]}) are built here around the one real JSON object we have
# (the captured `vram` object) and the ASIC values of the real `amd-smi static` text capture.
_REAL_VRAM = json.loads(
    (FIXTURES / "amd-smi/mi300x_rocmblogs_amd-smi-overview_static-json-jq-vram.txt").read_text()
)
_STATIC_GPU0 = {
    "gpu": 0,
    "asic": {"market_name": "MI300X-O", "device_id": "0x74a1", "target_graphics_version": "gfx942"},
    "vram": _REAL_VRAM,
    "partition": {"compute_partition": "SPX", "memory_partition": "NPS1"},
}


@pytest.mark.parametrize("shape", ["list", "gpu_data"])
def test_amd_smi_json_shapes(shape: str) -> None:
    items = [dict(_STATIC_GPU0, gpu=i) for i in range(8)]
    text = json.dumps(items if shape == "list" else {"gpu_data": items})
    gpus = p.merge(p.parse_amd_smi(text))
    assert len(gpus) == 8
    assert gpus[0].vram_bytes == 196592 * 1024**2
    assert gpus[0].product == "AMD Instinct MI300X"
    assert p.check("host1", gpus, FULL) == []


def test_amd_smi_list_json_uuid_gives_device_id() -> None:
    text = json.dumps([{"gpu": 0, "bdf": "0000:83:00.0", "uuid": "89ff74b5-0000-1000-80c1-fb66fcc143d2"}])
    gpus = p.merge(p.parse_amd_smi(text))
    assert gpus[0].device_id == "0x74b5"
    assert gpus[0].is_vf is True


def test_dkms_status_capture() -> None:
    entries = p.parse_dkms_status((FIXTURES / "dkms/mi300x_x8_ol9.6_cmontemuino_dkms_status.txt").read_text())
    assert entries == [
        p.DkmsEntry("amdgpu", "6.12.12-2187269.el9", "5.14.0-570.30.1.0.1.el9_6.x86_64", "installed")
    ]

"""Per-node acceptance: one line per bad node fact (RDMA ports, GID indexes, ECC, PCIe width, firmware).

Reads what preflight's probe hands back (``net``; with ``--gpu-tools`` the text ``amd-smi firmware`` and
``amd-smi metric --ecc --pcie`` print), parsed by :mod:`launcher.fabric.parsers`. A tool that is missing or
fails is not a bad node: it is a note saying what was not judged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launcher.fabric.env import node_fabric
from launcher.fabric.parsers import amd_smi_blocks, gpu_ecc, gpu_firmware, gpu_pcie

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# Firmware bundles (amd-smi firmware FW_ID PLDM_BUNDLE) AMD lists as supported for MI300X per ROCm release:
# the ROCm 7.2.x release notes / compatibility matrix (../shared/reference/fabric-facts.md, "Firmware"); a
# release not listed here is not judged (a note says so).
FIRMWARE_ALLOWLIST: dict[str, tuple[str, ...]] = {"7.2": ("01.25.02.04", "01.25.03.12", "01.25.06.04")}
FIRMWARE_BUNDLE_ID = "PLDM_BUNDLE"
# MI300X OAM: x16 at 32 GT/s (Gen 5), as amd-smi static reports it (real capture, tests/fixtures/gpu-tools/
# amd-smi/mi300x_x8_rocmblogs_amd-smi-overview_static.txt: MAX_PCIE_WIDTH 16, MAX_PCIE_SPEED 32 GT/s)
PCIE_WIDTH = 16
PCIE_SPEED_GTS = 32.0
# uncorrectable and deferred ECC errors since boot that make a node bad (correctable ones are not judged)
ECC_UNCORRECTABLE_MAX = 0


@dataclass
class Acceptance:
    """One line per bad node fact, and notes on what could not be judged."""

    bad: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _tool_text(tools: Mapping[str, Any], name: str, host: str, notes: list[str]) -> str | None:
    answer = tools.get(name)
    label = name.replace("_", " ").replace("amd smi", "amd-smi")
    if answer is None:
        notes.append(f"{host}: {label}: not installed, not judged")
        return None
    if answer.get("rc") != 0 or not str(answer.get("stdout", "")).strip():
        why = (str(answer.get("stderr") or "").strip().splitlines() or [f"exit status {answer.get('rc')}"])[
            -1
        ]
        notes.append(f"{host}: {label}: {why[:120]}, not judged")
        return None
    return str(answer["stdout"])


def gpu_lines(host: str, tools: Mapping[str, Any], rocm_release: str | None, out: Acceptance) -> None:
    """Judge a node's GPUs from amd-smi's firmware and metric output (lines into ``out``)."""
    metric = _tool_text(tools, "amd_smi_metric", host, out.notes)
    for gpu, tree in sorted(amd_smi_blocks(metric or "").items()):
        ecc = gpu_ecc(tree)
        bad = (ecc["uncorrectable"] or 0) + (ecc["deferred"] or 0)
        if bad > ECC_UNCORRECTABLE_MAX:
            out.bad.append(
                f"{host}: GPU {gpu}: {ecc['uncorrectable'] or 0} uncorrectable, "
                f"{ecc['deferred'] or 0} deferred ECC errors (amd-smi metric)"
            )
        pcie = gpu_pcie(tree)
        width, speed = pcie["width"], pcie["speed_gts"]
        if width is not None and width < PCIE_WIDTH:
            out.bad.append(
                f"{host}: GPU {gpu}: PCIe link x{width:.0f}, expected x{PCIE_WIDTH} (amd-smi metric)"
            )
        if speed is not None and speed < PCIE_SPEED_GTS:
            out.bad.append(
                f"{host}: GPU {gpu}: PCIe link at {speed:g} GT/s, expected {PCIE_SPEED_GTS:g} GT/s "
                "(amd-smi metric)"
            )
    firmware = _tool_text(tools, "amd_smi_firmware", host, out.notes)
    if firmware is None:
        return
    allowed = FIRMWARE_ALLOWLIST.get(".".join((rocm_release or "").split(".")[:2]))
    if allowed is None:
        out.notes.append(f"{host}: firmware: no allow-list for ROCm {rocm_release or 'unknown'}, not judged")
        return
    for gpu, tree in sorted(amd_smi_blocks(firmware).items()):
        bundle = gpu_firmware(tree).get(FIRMWARE_BUNDLE_ID)
        if bundle is not None and bundle not in allowed:
            out.bad.append(
                f"{host}: GPU {gpu}: firmware {FIRMWARE_BUNDLE_ID} {bundle} is not in the allow-list of ROCm "
                f"{rocm_release} ({', '.join(allowed)})"
            )


def accept_nodes(
    hosts: Sequence[str],
    train_address: Mapping[str, str],
    probe: Mapping[str, Mapping[str, Any]],
    rocm_release: Mapping[str, str | None] | None = None,
) -> Acceptance:
    """Return the acceptance of every node: RDMA ports not ACTIVE, RoCEv2 GID indexes that differ from the
    first node's, ECC errors, PCIe links below x16 / 32 GT/s, firmware outside the release's allow-list."""
    out = Acceptance()
    fabrics = {h: node_fabric(h, train_address[h], probe.get(h, {}).get("net") or {}) for h in hosts}
    for host in hosts:
        out.bad.extend(f"{host}: RDMA port {down}" for down in fabrics[host].down)
    with_gid = [h for h in hosts if fabrics[h].gid_index is not None]
    if with_gid:
        ref = with_gid[0]
        for host in with_gid[1:]:
            if fabrics[host].gid_index != fabrics[ref].gid_index:
                out.bad.append(
                    f"{host}: RoCEv2 GID index {fabrics[host].gid_index} ({ref}: {fabrics[ref].gid_index}); "
                    "NCCL_IB_GID_INDEX must be one value for every node"
                )
    for host in hosts:
        tools = probe.get(host, {}).get("gpu_tools")
        if isinstance(tools, dict):
            gpu_lines(host, tools, (rocm_release or {}).get(host), out)
    return out

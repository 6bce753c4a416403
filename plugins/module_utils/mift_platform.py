"""Platform state of an MI300X node as the OS exposes it, and where it differs from AMD's MI300X guide.

Stdlib only, pure functions over the text of files and tool output, so the unit tests feed real captures.
AMD's MI300X system optimization guide (ROCm/amdgpu-docs ``docs/system-optimization/mi300x.rst``, BIOS table
and kernel settings; summarised in the project's reference/fabric-facts.md): NPS1 ("other options ... should
not be used"), SMT off for compute-bound work, IOMMU enabled and ``iommu=pt`` on the kernel command line.
GPU memory partition NPS1 is the default of an MI300X in SPX (domain-facts §9.8).

Where each value comes from (kernel ABI documentation, Documentation/ABI/testing/):
- SMT: ``/sys/devices/system/cpu/smt/control`` (on, off, forceoff, notsupported, notimplemented) and
  ``/sys/devices/system/cpu/smt/active`` (1 or 0).
- NUMA nodes: ``/sys/devices/system/node/online`` (a cpulist such as ``0-1``); sockets: the distinct
  ``physical id`` lines of ``/proc/cpuinfo``; the CPU's NPS is nodes per socket (AMD EPYC BIOS setting).
- IOMMU: the entries of ``/sys/class/iommu`` (one per IOMMU the kernel enabled) and the default domain type of
  the IOMMU groups, ``/sys/kernel/iommu_groups/*/type`` (``identity`` = passthrough, ``DMA``/``DMA-FQ`` =
  translated); ``iommu=pt`` on ``/proc/cmdline``.
- GPU memory partition: ``amd-smi static --partition`` (``MEMORY_PARTITION: NPS1``), ``amd-smi partition``
  (``CURRENT_PARTITION`` table) or the ``amd-smi`` default view (``SPX/NPS1``); else rocm-smi's concise
  table (``NPS4, CPX``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_MEM_LINE = re.compile(r"^[ \t]*MEMORY_PARTITION:[ \t]*(NPS\d+|N/A)[ \t]*$", re.MULTILINE)
_DEFAULT_VIEW = re.compile(r"\b(?:SPX|DPX|TPX|QPX|CPX|N/A)/(NPS\d+|N/A)\b")
_CURRENT_ROW = re.compile(r"^\d+\s+(NPS\d+|N/A)\s+(?:SPX|DPX|TPX|QPX|CPX|N/A)\s", re.MULTILINE)
_ROCM_SMI = re.compile(r"\b(NPS\d+|N/A),\s*(?:SPX|DPX|TPX|QPX|CPX|N/A)\b")


def cpulist_count(text: str) -> int:
    """``0-1,4`` -> 3 (the kernel's cpulist format, also used for NUMA nodes)."""
    count = 0
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1
    return count


def sockets(cpuinfo: str) -> int:
    """Distinct ``physical id`` values of /proc/cpuinfo (0 when the kernel lists none)."""
    return len(set(re.findall(r"^physical id\s*:\s*(\d+)", cpuinfo, re.MULTILINE)))


def cpu_vendor(cpuinfo: str) -> str:
    """``AuthenticAMD``, ``GenuineIntel`` or empty."""
    match = re.search(r"^vendor_id\s*:\s*(\S+)", cpuinfo, re.MULTILINE)
    return match.group(1) if match else ""


def memory_partitions(amd_smi: str) -> list[str]:
    """GPU memory partition per logical GPU from amd-smi's text output (three layouts) or rocm-smi's concise
    table (``NPS1, SPX``), in GPU order.

    Secondary partitions of a partitioned GPU print ``N/A`` and are left out.
    """
    for pattern in (_MEM_LINE, _CURRENT_ROW, _DEFAULT_VIEW, _ROCM_SMI):
        found = [value for value in pattern.findall(amd_smi) if value != "N/A"]
        if found:
            return found
    return []


def iommu_mode(group_types: list[str], iommu_entries: int, cmdline: str) -> str:
    """``passthrough``, ``translated``, ``off`` or ``unknown``, from what the kernel exposes."""
    args = cmdline.split()
    if iommu_entries == 0 and not group_types:
        return "off"
    kinds = {kind.strip() for kind in group_types if kind.strip()}
    if kinds == {"identity"}:
        return "passthrough"
    if kinds and "identity" not in kinds:
        return "translated"
    if "iommu=pt" in args:
        return "passthrough"
    return "unknown"


@dataclass
class PlatformInputs:
    """The raw text the node exposes (empty string: not readable there)."""

    smt_control: str = ""
    smt_active: str = ""
    nodes_online: str = ""
    cpuinfo: str = ""
    cmdline: str = ""
    iommu_entries: int = 0
    iommu_group_types: list[str] = field(default_factory=list)
    amd_smi_partition: str = ""


def report(inputs: PlatformInputs) -> dict[str, Any]:
    """The platform values and one warning line per difference from AMD's MI300X guide."""
    warnings: list[str] = []
    smt = inputs.smt_control.strip() or "unknown"
    if smt == "on" or inputs.smt_active.strip() == "1":
        warnings.append(
            "SMT is on (/sys/devices/system/cpu/smt/control); AMD's MI300X guide turns SMT off "
            "in the BIOS for compute-bound workloads"
        )
    vendor = cpu_vendor(inputs.cpuinfo)
    nodes = cpulist_count(inputs.nodes_online) if inputs.nodes_online.strip() else 0
    socket_count = sockets(inputs.cpuinfo)
    nps = nodes // socket_count if nodes and socket_count and nodes % socket_count == 0 else None
    if vendor == "AuthenticAMD" and nps is not None and nps != 1:
        warnings.append(
            f"CPU NUMA nodes per socket {nps} (NPS{nps}: {nodes} nodes, {socket_count} sockets); "
            "AMD's MI300X guide sets NPS1 in the BIOS"
        )
    mode = iommu_mode(inputs.iommu_group_types, inputs.iommu_entries, inputs.cmdline)
    if mode == "off":
        warnings.append("IOMMU is off (no /sys/class/iommu entry); AMD's MI300X guide enables it in the BIOS")
    elif mode != "passthrough":
        warnings.append(
            f"IOMMU mode {mode}, not passthrough; AMD's MI300X guide adds iommu=pt to the kernel "
            "command line (host_tuning_kernel_args, applied at the next reboot)"
        )
    partitions = memory_partitions(inputs.amd_smi_partition)
    other = sorted({value for value in partitions if value != "NPS1"})
    if other:
        warnings.append(
            f"GPU memory partition {', '.join(other)} on {sum(v != 'NPS1' for v in partitions)} of "
            f"{len(partitions)} GPUs; an MI300X in SPX runs NPS1 (amd-smi set --memory-partition NPS1)"
        )
    return {
        "smt_control": smt,
        "smt_active": inputs.smt_active.strip() or "unknown",
        "cpu_vendor": vendor or "unknown",
        "sockets": socket_count,
        "numa_nodes": nodes,
        "cpu_nps": nps,
        "iommu_mode": mode,
        "iommu_pt_arg": "iommu=pt" in inputs.cmdline.split(),
        "gpu_memory_partitions": sorted(set(partitions)),
        "warnings": warnings,
    }

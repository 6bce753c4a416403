#!/usr/bin/python
"""Ansible module: report the node's platform state (SMT, NUMA/NPS, IOMMU, GPU memory partition)."""
# ruff: noqa: E402 - Ansible module layout: DOCUMENTATION/EXAMPLES/RETURN come before the imports

from __future__ import annotations

DOCUMENTATION = r"""
---
module: mift_platform_report
short_description: Report SMT, NUMA nodes per socket, IOMMU mode and the GPU memory partition of a node
description:
  - Reads what the OS exposes (C(/sys/devices/system/cpu/smt), C(/sys/devices/system/node/online),
    C(/proc/cpuinfo), C(/proc/cmdline), C(/sys/class/iommu), C(/sys/kernel/iommu_groups/*/type)) and the
    GPU memory partition from C(amd-smi static --partition), else C(rocm-smi); returns the values and one
    warning per difference from AMD's MI300X guide (C(mift_platform) module_utils). Never fails on a
    difference. Changes nothing, so it runs in check mode.
options:
  rocm_bin:
    description: Where amd-smi and rocm-smi live.
    type: path
    default: /opt/rocm/bin
author: mift
"""

EXAMPLES = r"""
- name: Report the platform
  mift_platform_report:
    rocm_bin: /opt/rocm/bin
  register: __gpu_verify_platform
"""

RETURN = r"""
report:
  description: The values (smt_control, cpu_nps, iommu_mode, gpu_memory_partitions, ...) and warnings.
  type: dict
  returned: always
"""

from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.mift.cluster.plugins.module_utils.mift_platform import (
    PlatformInputs,
    memory_partitions,
    report,
)

TOOL_TIMEOUT_S = 120


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _tool(module: AnsibleModule, argv: list[str]) -> str:
    if not Path(argv[0]).exists():
        return ""
    rc, out, _err = module.run_command(argv, environ_update={"LC_ALL": "C"})
    return out if rc == 0 else ""


def main() -> None:
    """Run the module."""
    module = AnsibleModule(
        argument_spec={"rocm_bin": {"type": "path", "default": "/opt/rocm/bin"}},
        supports_check_mode=True,
    )
    rocm_bin = Path(module.params["rocm_bin"])
    partition = _tool(module, [str(rocm_bin / "amd-smi"), "static", "--partition"])
    if not memory_partitions(partition):
        partition = _tool(module, [str(rocm_bin / "rocm-smi")])
    iommu = Path("/sys/class/iommu")
    groups = Path("/sys/kernel/iommu_groups")
    inputs = PlatformInputs(
        smt_control=_read("/sys/devices/system/cpu/smt/control"),
        smt_active=_read("/sys/devices/system/cpu/smt/active"),
        nodes_online=_read("/sys/devices/system/node/online"),
        cpuinfo=_read("/proc/cpuinfo"),
        cmdline=_read("/proc/cmdline"),
        iommu_entries=len(list(iommu.iterdir())) if iommu.is_dir() else 0,
        iommu_group_types=[_read(str(p)) for p in sorted(groups.glob("*/type"))] if groups.is_dir() else [],
        amd_smi_partition=partition,
    )
    result: dict[str, Any] = report(inputs)
    module.exit_json(changed=False, report=result)


if __name__ == "__main__":
    main()

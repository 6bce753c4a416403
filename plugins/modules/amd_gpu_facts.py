#!/usr/bin/python
"""Ansible module: run rocminfo / rocm-smi / amd-smi on the node, parse them, check the GPUs."""
# ruff: noqa: E402 - Ansible module layout: DOCUMENTATION/EXAMPLES/RETURN come before the imports

from __future__ import annotations

DOCUMENTATION = r"""
---
module: amd_gpu_facts
short_description: Inventory and verify AMD GPUs; rocminfo decides, rocm-smi and amd-smi are cross-checked
description:
  - Runs C(rocminfo) (required), C(rocm-smi), C(rocm-smi --showmeminfo vram) and
    C(amd-smi static --asic --vram --partition --json) from O(rocm_bin) where present and verifies the node
    with the C(amd_gpu_parse) module_utils (C(verify_node)).
  - rocminfo (the HSA runtime's view, what PyTorch sees) decides the GPU count and the arch of each GPU agent.
    rocm-smi and amd-smi must agree with it on the count, VRAM, partition mode and VF status.
  - Output that is cut short or does not parse rejects the node, naming the tool, the command and the parse
    error. So does any disagreement between the tools. A cross-check tool that is not installed (or exits 127)
    is skipped and recorded in RV(tools).
  - Never fails on a GPU mismatch; returns one-line messages in RV(failures) so that the caller can record
    the result before asserting. Read-only, so it runs in check mode.
options:
  host:
    description: Name used at the start of every failure line (the inventory host name).
    type: str
    required: true
  rocm_bin:
    description: Directory holding rocminfo, rocm-smi and amd-smi.
    type: path
    default: /opt/rocm/bin
  checks:
    description: Checks to run.
    type: list
    elements: str
    choices: [arch, count, product, vf, partition, vram]
    default: [arch, count, product, vf, partition, vram]
  expected_arch:
    description: LLVM target every GPU agent must report.
    type: str
    default: gfx942
  expected_count:
    description: Number of GPUs (logical devices) expected on the node.
    type: int
    default: 8
  allowed_products:
    description: Products allowed; a GPU passes when one entry is a whole word of its product name.
    type: list
    elements: str
    default: [MI300X]
  allow_vf:
    description: Accept SR-IOV virtual functions.
    type: bool
    default: false
  expected_partition:
    description: Compute partition mode every GPU must be in.
    type: str
    default: SPX
  min_vram_gib:
    description: Minimum VRAM per GPU in GiB.
    type: float
    default: 190.0
author: mift
"""

EXAMPLES = r"""
- name: Verify the node's GPUs
  amd_gpu_facts:
    host: "{{ inventory_hostname }}"
  register: __gpu_verify_result
"""

RETURN = r"""
gpus:
  description: One record per logical GPU (index, arch, product, device_id, is_vf, compute_partition,
    memory_partition, vram_bytes, vram_gib, compute_units, temperature_c, power_w, sources).
  type: list
  returned: always
inventory:
  description: The GPUs without values that change between runs (temperature, power), for local facts.
  type: list
  returned: always
count:
  description: Number of GPUs found.
  type: int
  returned: always
failures:
  description: 'One line per failed check, "host: GPU i: found X, expected Y (likely cause: ...)".'
  type: list
  returned: always
verified:
  description: True when no check failed.
  type: bool
  returned: always
table:
  description: Per-host table (GPU, arch, product, partition, VRAM, temperature, power).
  type: str
  returned: always
tools:
  description: Per command, its return code, the GPUs it listed and its error ("not installed" when skipped).
  type: dict
  returned: always
tools_missing:
  description: True when rocminfo is not installed (e.g. check mode before the rocm role ran).
  type: bool
  returned: always
"""

import os
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.mift.cluster.plugins.module_utils.amd_gpu_parse import (
    Expectation,
    ToolRun,
    format_table,
    verify_node,
)

CHECKS = ["arch", "count", "product", "vf", "partition", "vram"]
# Environment variables that hide GPUs from ROCm programs (ROCm docs, "GPU isolation techniques").
VISIBILITY_ENV = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")
COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("rocminfo", ()),
    ("rocm-smi", ()),
    ("rocm-smi", ("--showmeminfo", "vram")),
    # ROCm 7 amd-smi prints the partition only when asked (-p/--partition, amd-smi CHANGELOG for 7.0.0)
    ("amd-smi", ("static", "--asic", "--vram", "--partition", "--json")),
)


def _run(module: AnsibleModule, argv: list[str]) -> tuple[int, str, str]:
    """Run a read-only probe; LC_ALL=C keeps decimal points stable."""
    rc, out, err = module.run_command(argv, environ_update={"LC_ALL": "C", "LANG": "C"}, check_rc=False)
    return int(rc), str(out), str(err)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "host": {"type": "str", "required": True},
            "rocm_bin": {"type": "path", "default": "/opt/rocm/bin"},
            "checks": {"type": "list", "elements": "str", "choices": CHECKS, "default": CHECKS},
            "expected_arch": {"type": "str", "default": "gfx942"},
            "expected_count": {"type": "int", "default": 8},
            "allowed_products": {"type": "list", "elements": "str", "default": ["MI300X"]},
            "allow_vf": {"type": "bool", "default": False},
            "expected_partition": {"type": "str", "default": "SPX"},
            "min_vram_gib": {"type": "float", "default": 190.0},
        },
        supports_check_mode=True,
    )
    params: dict[str, Any] = module.params
    host: str = params["host"]
    checks: list[str] = params["checks"]
    rocm_bin = Path(params["rocm_bin"])

    if not os.access(rocm_bin / "rocminfo", os.X_OK):
        module.exit_json(
            changed=False,
            gpus=[],
            inventory=[],
            count=0,
            verified=False,
            tools={"rocminfo": {"rc": None, "error": "not installed"}},
            tools_missing=True,
            table=f"{host}: rocminfo not installed",
            failures=[
                f"{host}: rocminfo not found at {rocm_bin / 'rocminfo'} (likely cause: the rocm role has "
                "not run here, or rocm_packages lacks rocminfo; fix: run playbooks/rocm.yml)"
            ],
        )

    runs: list[ToolRun] = []
    for tool, args in COMMANDS:
        command = " ".join((tool, *args))
        binary = rocm_bin / tool
        if not os.access(binary, os.X_OK):
            runs.append(ToolRun(tool, command, None))
            continue
        rc, out, err = _run(module, [str(binary), *args])
        runs.append(ToolRun(tool, command, rc, out, err))

    expect = Expectation(
        arch=params["expected_arch"] if "arch" in checks else None,
        count=params["expected_count"] if "count" in checks else None,
        products=tuple(params["allowed_products"]) if "product" in checks else None,
        allow_vf=params["allow_vf"] or "vf" not in checks,
        partition=params["expected_partition"] if "partition" in checks else None,
        min_vram_gib=params["min_vram_gib"] if "vram" in checks else None,
    )
    visible = {key: os.environ[key] for key in VISIBILITY_ENV if key in os.environ}
    verdict = verify_node(host, runs, expect, visible_env=visible)
    stable = (
        "index",
        "arch",
        "product",
        "device_id",
        "is_vf",
        "compute_partition",
        "memory_partition",
        "vram_gib",
    )
    module.exit_json(
        changed=False,
        tools=verdict.tools,
        tools_missing=False,
        gpus=[g.as_dict() for g in verdict.gpus],
        inventory=[{key: g.as_dict()[key] for key in stable} for g in verdict.gpus],
        count=len(verdict.gpus),
        failures=verdict.failures,
        verified=not verdict.failures,
        table=format_table(host, verdict.gpus),
    )


if __name__ == "__main__":
    main()

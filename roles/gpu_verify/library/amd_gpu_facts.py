#!/usr/bin/python
"""Ansible module: run rocminfo / rocm-smi / amd-smi on the node, parse them, check the GPUs."""
# ruff: noqa: E402 - Ansible module layout: DOCUMENTATION/EXAMPLES/RETURN come before the imports

from __future__ import annotations

DOCUMENTATION = r"""
---
module: amd_gpu_facts
short_description: Inventory and verify AMD GPUs with rocminfo, rocm-smi and amd-smi
description:
  - Runs C(rocminfo) (required), C(rocm-smi), C(rocm-smi --showmeminfo vram) and C(amd-smi static --json)
    (falling back to C(amd-smi list)) from O(rocm_bin) where present, parses them with the
    C(amd_gpu_parse) module_utils and checks the GPUs against the expectation.
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
  expected_product:
    description: Product name (word) every GPU must carry.
    type: str
    default: MI300X
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
  description: One line per failed check, "host: GPU i: found X, expected Y (likely cause: ...)".
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
  description: Per command, its return code and first error line.
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

from ansible.module_utils.amd_gpu_parse import (
    Expectation,
    Gpu,
    check,
    format_table,
    merge,
    parse_amd_smi,
    parse_rocm_smi,
    parse_rocminfo,
)
from ansible.module_utils.basic import AnsibleModule

CHECKS = ["arch", "count", "product", "vf", "partition", "vram"]


def _run(module: AnsibleModule, argv: list[str]) -> tuple[int, str, str]:
    """Run a read-only probe; LC_ALL=C keeps decimal points stable. Bound it with the task's timeout."""
    rc, out, err = module.run_command(argv, environ_update={"LC_ALL": "C", "LANG": "C"}, check_rc=False)
    return int(rc), str(out), str(err)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "host": {"type": "str", "required": True},
            "rocm_bin": {"type": "path", "default": "/opt/rocm/bin"},
            "checks": {"type": "list", "elements": "str", "choices": CHECKS, "default": CHECKS},
            "expected_arch": {"type": "str", "default": "gfx942"},
            "expected_count": {"type": "int", "default": 8},
            "expected_product": {"type": "str", "default": "MI300X"},
            "allow_vf": {"type": "bool", "default": False},
            "expected_partition": {"type": "str", "default": "SPX"},
            "min_vram_gib": {"type": "float", "default": 190.0},
        },
        supports_check_mode=True,
    )
    params: dict[str, Any] = module.params
    host: str = params["host"]
    checks: list[str] = params["checks"]
    rocm_bin: str = params["rocm_bin"]
    tools: dict[str, dict[str, Any]] = {}
    result: dict[str, Any] = {"changed": False, "tools": tools, "tools_missing": False}

    rocminfo = str(Path(rocm_bin) / "rocminfo")
    if not os.access(rocminfo, os.X_OK):
        result.update(
            gpus=[],
            inventory=[],
            count=0,
            verified=False,
            tools_missing=True,
            table=f"{host}: rocminfo not installed",
            failures=[
                f"{host}: rocminfo not found at {rocminfo} (likely cause: the rocm role has not run here, "
                "or rocm_packages lacks rocminfo)"
            ],
        )
        module.exit_json(**result)

    sources: list[list[Gpu]] = []
    failures: list[str] = []
    rocm_smi, amd_smi = str(Path(rocm_bin) / "rocm-smi"), str(Path(rocm_bin) / "amd-smi")
    commands: list[tuple[str, list[str], Any]] = [
        ("rocminfo", [rocminfo], parse_rocminfo),
        ("rocm-smi", [rocm_smi], parse_rocm_smi),
        ("rocm-smi --showmeminfo vram", [rocm_smi, "--showmeminfo", "vram"], parse_rocm_smi),
        ("amd-smi static --json", [amd_smi, "static", "--json"], parse_amd_smi),
        ("amd-smi list", [amd_smi, "list"], parse_amd_smi),
    ]
    amd_smi_json_ok = False
    for name, argv, parser in commands:
        if name == "amd-smi list" and amd_smi_json_ok:
            continue
        if not os.access(argv[0], os.X_OK):
            tools[name] = {"rc": None, "error": "not installed"}
            continue
        rc, out, err = _run(module, argv)
        tools[name] = {"rc": rc, "error": _first_line(err) if rc else ""}
        if rc != 0:
            if name == "rocminfo":
                failures.append(
                    f"{host}: rocminfo failed (rc {rc}): {_first_line(err) or _first_line(out)} "
                    "(likely cause: amdgpu not loaded, or the user is not in the render/video groups)"
                )
            continue
        try:
            parsed = parser(out)
        except ValueError as exc:  # malformed JSON from a broken amd-smi
            tools[name]["error"] = f"unparsable output: {exc}"
            continue
        tools[name]["gpus"] = len(parsed)
        sources.append(parsed)
        if name == "amd-smi static --json" and parsed:
            amd_smi_json_ok = True

    gpus = merge(*sources)
    expect = Expectation(
        arch=params["expected_arch"] if "arch" in checks else None,
        count=params["expected_count"] if "count" in checks else None,
        product=params["expected_product"] if "product" in checks else None,
        allow_vf=params["allow_vf"] or "vf" not in checks,
        partition=params["expected_partition"] if "partition" in checks else None,
        min_vram_gib=params["min_vram_gib"] if "vram" in checks else None,
    )
    if not failures:
        failures = check(host, gpus, expect)
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
    result.update(
        gpus=[g.as_dict() for g in gpus],
        inventory=[{key: g.as_dict()[key] for key in stable} for g in gpus],
        count=len(gpus),
        failures=failures,
        verified=not failures,
        table=format_table(host, gpus),
    )
    module.exit_json(**result)


if __name__ == "__main__":
    main()

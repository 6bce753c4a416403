"""Parsers of the text the fabric and GPU tools print: ``ibv_devinfo -v``, ``rdma link``, ``amd-smi``.

What is parsed from real captures and what is not (tests/unit/test_fabric_parsers.py says the same):

- ``amd-smi`` text (``static``, ``metric``, ``firmware``): :func:`amd_smi_blocks` reads the indented
  ``KEY: value`` blocks per ``GPU: N``; tested on real MI300X captures of ``amd-smi static`` and ``amd-smi
  metric`` (tests/fixtures/gpu-tools/amd-smi, provenance in its INDEX.md). The ``metric`` capture there is
  cut before its ECC and PCIE sections, and no real ``amd-smi firmware`` capture exists in the repository or
  the shared fixtures: the ECC, PCIe and ``FW_LIST`` keys read here follow amd-smi's documented field names
  and are tested on TEST DOUBLES only.
- ``rocm-smi --showfwinfo`` / ``rocm-smi -a`` firmware lines (:func:`rocm_smi_firmware`): a real capture.
- ``ibv_devinfo -v`` and ``rdma link``: no real capture exists in the repository or the shared fixtures; the
  parsers follow rdma-core's and iproute2's output formats and are tested on TEST DOUBLES only. The launcher
  itself reads the same facts from sysfs (``mift_probe.rdma_ports``), which needs neither tool.
- ``amd-smi xgmi``: no real capture and no parser (its table layout could not be checked against one).
"""

from __future__ import annotations

import re
from typing import Any

_GPU_RE = re.compile(r"^GPU:\s*(\d+)\s*$")
_KV_RE = re.compile(r"^(\s*)([^:]+?):\s*(.*?)\s*$")


def amd_smi_blocks(text: str) -> dict[int, dict[str, Any]]:
    """Return GPU index -> its nested ``KEY: value`` tree from amd-smi's text output (``N/A`` kept as is).

    A key whose value is empty opens a block; indentation closes it. Lines that are not ``KEY: value`` are
    skipped.
    """
    gpus: dict[int, dict[str, Any]] = {}
    stack: list[tuple[int, dict[str, Any]]] = []
    for raw in text.splitlines():
        gpu = _GPU_RE.match(raw.strip()) if not raw.startswith((" ", "\t")) else None
        if gpu:
            tree: dict[str, Any] = {}
            gpus[int(gpu.group(1))] = tree
            stack = [(-1, tree)]
            continue
        match = _KV_RE.match(raw.expandtabs(4))
        if not match or not stack:
            continue
        indent, key, value = len(match.group(1)), match.group(2).strip(), match.group(3)
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if value == "":
            child: dict[str, Any] = {}
            parent[key] = child
            stack.append((indent, child))
        else:
            parent[key] = value
    return gpus


def _number(value: object) -> float | None:
    match = re.match(r"^\s*(-?\d+(?:\.\d+)?)", str(value))
    return float(match.group(1)) if match else None


def _block(tree: dict[str, Any], key: str) -> dict[str, Any]:
    value = tree.get(key)
    return value if isinstance(value, dict) else {}


def gpu_pcie(tree: dict[str, Any]) -> dict[str, float | None]:
    """Return a GPU's PCIe link from ``amd-smi metric`` (``PCIE: WIDTH, SPEED``) and its maximum from
    ``amd-smi static`` (``BUS: MAX_PCIE_WIDTH, MAX_PCIE_SPEED``), whichever the tree holds."""
    pcie, bus = _block(tree, "PCIE"), _block(tree, "BUS")
    return {
        "width": _number(pcie.get("WIDTH")),
        "speed_gts": _number(pcie.get("SPEED")),
        "max_width": _number(bus.get("MAX_PCIE_WIDTH")),
        "max_speed_gts": _number(bus.get("MAX_PCIE_SPEED")),
    }


def gpu_ecc(tree: dict[str, Any]) -> dict[str, int | None]:
    """Return a GPU's ECC totals from ``amd-smi metric`` (``ECC: TOTAL_CORRECTABLE_COUNT, ...``)."""
    ecc = _block(tree, "ECC")

    def count(key: str) -> int | None:
        value = _number(ecc.get(key))
        return int(value) if value is not None else None

    return {
        "correctable": count("TOTAL_CORRECTABLE_COUNT"),
        "uncorrectable": count("TOTAL_UNCORRECTABLE_COUNT"),
        "deferred": count("TOTAL_DEFERRED_COUNT"),
    }


def gpu_firmware(tree: dict[str, Any]) -> dict[str, str]:
    """Return FW_ID -> FW_VERSION from ``amd-smi firmware`` (``FW_LIST: FW 0: FW_ID, FW_VERSION``)."""
    fw_list = _block(tree, "FW_LIST")
    out = {}
    for entry in fw_list.values():
        if isinstance(entry, dict) and entry.get("FW_ID"):
            out[str(entry["FW_ID"])] = str(entry.get("FW_VERSION", ""))
    return out


_ROCM_SMI_FW_RE = re.compile(r"^GPU\[(\d+)\]\s*:\s*(.+?) firmware version:\s*(\S+)\s*$")


def rocm_smi_firmware(text: str) -> dict[int, dict[str, str]]:
    """Return GPU index -> firmware name -> version from ``rocm-smi -a`` / ``--showfwinfo`` lines (the ones
    ``Not supported on the given system`` are left out)."""
    out: dict[int, dict[str, str]] = {}
    for line in text.splitlines():
        match = _ROCM_SMI_FW_RE.match(line.strip())
        if match:
            out.setdefault(int(match.group(1)), {})[match.group(2).strip()] = match.group(3)
    return out


_HCA_RE = re.compile(r"^hca_id:\s*(\S+)")
_PORT_RE = re.compile(r"^\s*port:\s*(\d+)")
_FIELD_RE = re.compile(r"^\s*(state|link_layer|phys_state|active_mtu):\s*(.+?)\s*$")
_GID_RE = re.compile(r"^\s*GID\[\s*(\d+)\]:\s*([0-9a-fA-F:]+)(?:,\s*(.+?))?\s*$")
_STATE_RE = re.compile(r"^PORT_([A-Z_]+)")


def ibv_devinfo(text: str) -> list[dict[str, Any]]:
    """Return the ports of ``ibv_devinfo [-v]`` in the shape of ``mift_probe.rdma_ports``.

    ``state: PORT_ACTIVE (4)`` gives ``ACTIVE``; ``GID[  3]: <gid>, RoCE v2`` lines (``-v``) give the GID
    table with its types.
    """
    ports: list[dict[str, Any]] = []
    device = ""
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        if match := _HCA_RE.match(line.strip()):
            device, current = match.group(1), None
            continue
        if match := _PORT_RE.match(line):
            current = {
                "device": device,
                "port": int(match.group(1)),
                "state": "",
                "link_layer": None,
                "gids": [],
            }
            ports.append(current)
            continue
        if current is None:
            continue
        if match := _FIELD_RE.match(line):
            key, value = match.group(1), match.group(2)
            if key == "state":
                state = _STATE_RE.match(value)
                current["state"] = state.group(1) if state else value.split()[0]
            elif key == "link_layer":
                current["link_layer"] = value
        elif match := _GID_RE.match(line):
            current["gids"].append(
                {"index": int(match.group(1)), "gid": match.group(2), "type": match.group(3), "ndev": None}
            )
    return ports


_LINK_RE = re.compile(r"^link\s+(\S+?)/(\d+)\s+(.*)$")


def rdma_link(text: str) -> list[dict[str, Any]]:
    """Return ``rdma link`` lines (``link mlx5_0/1 state ACTIVE physical_state LINK_UP netdev ens1f0``) as
    device, port, state, physical state and netdev."""
    links = []
    for line in text.splitlines():
        match = _LINK_RE.match(line.strip())
        if not match:
            continue
        words = match.group(3).split()
        fields = dict(zip(words[0::2], words[1::2], strict=False))
        links.append(
            {
                "device": match.group(1),
                "port": int(match.group(2)),
                "state": fields.get("state", ""),
                "physical_state": fields.get("physical_state"),
                "netdev": fields.get("netdev"),
            }
        )
    return links

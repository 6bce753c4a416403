"""The probe's view of a node's network and GPU tools: the interfaces (``ip -j addr``), the RDMA ports from
``/sys/class/infiniband``, the GPU tools on PATH. Standard library only (``mift_node.pyz probe`` runs it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

SYSFS_INFINIBAND = Path("/sys/class/infiniband")
# GID table entries read per RDMA port (RoCEv2 lives at a low index: 3 on AMD's reference setup)
MAX_GIDS = 16
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def interfaces() -> dict[str, Any]:
    """Return the node's interfaces as ``ip -j addr`` reports them: name, state and addresses."""
    try:
        proc = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, timeout=10, check=False)
        data = json.loads(proc.stdout or "null")
    except (OSError, ValueError, subprocess.TimeoutExpired) as err:
        return {"error": f"ip -j addr: {str(err)[:200]}"}
    if not isinstance(data, list):
        return {"error": f"ip -j addr: exit status {proc.returncode}, no JSON list"}
    found = []
    for entry in data:
        if not isinstance(entry, dict) or "ifname" not in entry:
            continue
        found.append(
            {
                "name": str(entry["ifname"]),
                "state": str(entry.get("operstate", "UNKNOWN")),
                "addrs": [str(a.get("local")) for a in entry.get("addr_info") or [] if a.get("local")],
            }
        )
    return {"interfaces": found}


def rdma_ports(root: Path = SYSFS_INFINIBAND) -> list[dict[str, Any]]:
    """Return every RDMA port under ``root``: device, port, state, link layer and its non-zero GIDs."""
    ports = []
    try:
        devices = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        return []
    for dev in devices:
        try:
            port_dirs = sorted(
                (dev / "ports").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0
            )
        except OSError:
            continue
        for port in port_dirs:
            gids = []
            for index in range(MAX_GIDS):
                gid = _read(port / "gids" / str(index))
                if gid is None:
                    break
                if gid == ZERO_GID:
                    continue
                gids.append(
                    {
                        "index": index,
                        "gid": gid,
                        "type": _read(port / "gid_attrs" / "types" / str(index)),
                        "ndev": _read(port / "gid_attrs" / "ndevs" / str(index)),
                    }
                )
            state = _read(port / "state") or ""
            ports.append(
                {
                    "device": dev.name,
                    "port": int(port.name) if port.name.isdigit() else port.name,
                    "state": state.split(":", 1)[-1].strip(),
                    "link_layer": _read(port / "link_layer"),
                    "gids": gids,
                }
            )
    return ports


# where the loader finds libibverbs (RCCL dlopens it; without it RCCL uses sockets, silently)
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")


def net_facts() -> dict[str, Any]:
    """Return the fabric facts of the node: interfaces, RDMA ports, boot id."""
    return {
        **interfaces(),
        "rdma": rdma_ports(),
        "libibverbs": any(any(Path(d).glob("libibverbs.so*")) for d in LIB_DIRS),
        "boot_id": _read(Path("/proc/sys/kernel/random/boot_id")),
    }


# what `launcher check` reads from amd-smi (parsed on the controller: launcher.fabric.parsers)
GPU_TOOL_COMMANDS = {
    "amd_smi_firmware": ["amd-smi", "firmware"],
    "amd_smi_metric": ["amd-smi", "metric", "--ecc", "--pcie"],
}


def gpu_tools() -> dict[str, Any]:
    """Return what each GPU tool command printed (``None``: the tool is not installed)."""
    out: dict[str, Any] = {}
    for name, argv in GPU_TOOL_COMMANDS.items():
        if shutil.which(argv[0]) is None:
            out[name] = None
            continue
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
            out[name] = {
                "rc": proc.returncode,
                "stdout": proc.stdout[:200_000],
                "stderr": proc.stderr[-2000:],
            }
        except (OSError, subprocess.TimeoutExpired) as err:
            out[name] = {"rc": None, "stdout": "", "stderr": str(err)[:300]}
    return out

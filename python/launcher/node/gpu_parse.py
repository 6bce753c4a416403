"""What the GPU tools answer, read: ``amd-smi metric --json`` and ``nvidia-smi --query-gpu`` into one shape
of GPU entry (for :mod:`gpu`'s sampler). Standard library only.
"""

from __future__ import annotations

import json
import re
from typing import Any

# nvidia-smi --query-gpu fields, in the order of the CSV columns
NVIDIA_FIELDS = (
    "index",
    "uuid",
    "utilization.gpu",
    "power.draw",
    "temperature.gpu",
    "temperature.memory",
    "memory.used",
    "memory.total",
    "clocks.sm",
    "clocks.mem",
    "clocks_throttle_reasons.active",
    "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
)
# device files a process of a GPU holds open: ROCm opens /dev/kfd (and a render node), CUDA /dev/nvidia<N>
GPU_DEVICE_RE = re.compile(r"^/dev/(kfd|dri/renderD\d+|nvidia\d+)$")
NUMBER_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")
MIB_PER = {"B": 1 / 2**20, "KB": 1 / 1024, "MB": 1.0, "MIB": 1.0, "GB": 1024.0, "GIB": 1024.0}


# --- parsers ------------------------------------------------------------------------------------------


def number(value: object) -> float | None:
    """Return the number in an amd-smi / nvidia-smi value: ``5``, ``{"value": 5, "unit": "%"}``, ``"234 W"``;
    None for ``"N/A"``, ``"[N/A]"``, ``"[Not Supported]"``, lists and anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, dict):
        return number(value.get("value"))
    if isinstance(value, str):
        match = NUMBER_RE.match(value)
        return float(match.group(1)) if match else None
    return None


def _unit(value: object) -> str:
    if isinstance(value, dict):
        return str(value.get("unit") or "").upper()
    if isinstance(value, str):
        return value.strip().rpartition(" ")[2].upper() if " " in value.strip() else ""
    return ""


def _mib(value: object) -> float | None:
    """Return a memory value in MiB (amd-smi prints MB, meaning MiB)."""
    amount = number(value)
    if amount is None:
        return None
    return round(amount * MIB_PER.get(_unit(value), 1.0), 1)


def _section(gpu: dict[str, Any], *names: str) -> dict[str, Any]:
    """Return the first of ``names`` that is a dict in ``gpu`` (keys compared lower-case)."""
    lower = {str(k).lower(): v for k, v in gpu.items()}
    for name in names:
        found = lower.get(name)
        if isinstance(found, dict):
            return {str(k).lower(): v for k, v in found.items()}
    return {}


def _first(section: dict[str, Any], *keys: str) -> float | None:
    for key in keys:
        found = number(section.get(key))
        if found is not None:
            return found
    return None


def _json_document(text: str) -> object:
    """Return the JSON document in ``text``: amd-smi may print warning lines before it."""
    starts = [i for i in (text.find("["), text.find("{")) if i >= 0]
    if not starts:
        raise ValueError("no JSON document in the output")
    return json.loads(text[min(starts) :])


def amd_gpu(entry: dict[str, Any]) -> dict[str, Any]:
    """Return one GPU's sample from one object of ``amd-smi metric --json`` (keys of either ROCm's CLI)."""
    usage = _section(entry, "usage")
    power = _section(entry, "power")
    temp = _section(entry, "temperature")
    mem = _section(entry, "mem_usage")
    clock = _section(entry, "clock")
    ecc = _section(entry, "ecc")
    pcie = _section(entry, "pcie")
    gfx_clocks = [
        number(v.get("clk")) for k, v in clock.items() if k.startswith("gfx") and isinstance(v, dict)
    ]
    mem_clocks = [
        number(v.get("clk")) for k, v in clock.items() if k.startswith("mem") and isinstance(v, dict)
    ]
    blocks = _section(entry, "ecc_blocks")
    uncorrectable = _first(ecc, "total_uncorrectable_count", "uncorrectable_count")
    if uncorrectable is None and blocks:  # only the per-block counts: their sum
        counts = [number(b.get("uncorrectable_count")) for b in blocks.values() if isinstance(b, dict)]
        uncorrectable = (
            sum(c for c in counts if c is not None) if any(c is not None for c in counts) else None
        )
    throttle = power.get("throttle_status")
    pcie_errors = {
        k: int(v)
        for k in (
            "replay_count",
            "l0_to_recovery_count",
            "replay_roll_over_count",
            "nak_sent_count",
            "nak_received_count",
        )
        if (v := number(pcie.get(k))) is not None
    }
    xgmi = number({str(k).lower(): v for k, v in entry.items()}.get("xgmi_err"))
    gpu = number(entry.get("gpu"))
    return {
        "gpu": int(gpu) if gpu is not None else None,
        "util_pct": _first(usage, "gfx_activity", "gfx_usage"),
        "mem_util_pct": _first(usage, "umc_activity"),
        "power_w": _first(power, "socket_power", "average_socket_power", "current_socket_power"),
        "temp_c": _first(temp, "hotspot", "edge"),
        "temp_edge_c": _first(temp, "edge"),
        "temp_mem_c": _first(temp, "mem"),
        "vram_used_mib": _mib(mem.get("used_vram")),
        "vram_total_mib": _mib(mem.get("total_vram")),
        "gfx_clock_mhz": max((c for c in gfx_clocks if c is not None), default=None),
        "mem_clock_mhz": max((c for c in mem_clocks if c is not None), default=None),
        "throttle": throttle if isinstance(throttle, str) and throttle != "N/A" else None,
        "ecc_correctable": _first(ecc, "total_correctable_count", "correctable_count"),
        "ecc_uncorrectable": uncorrectable,
        "pcie_errors": pcie_errors or None,
        "xgmi_errors": xgmi,
    }


def parse_amd_metric(text: str) -> list[dict[str, Any]]:
    """Return one sample per GPU from ``amd-smi metric --json``: a list of GPU objects (ROCm 6) or
    ``{"gpu_data": [...]}`` (ROCm 7, amd-smi 26.x). Raise ValueError when the output is neither."""
    data = _json_document(text)
    if isinstance(data, dict) and isinstance(data.get("gpu_data"), list):
        data = data["gpu_data"]
    if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
        raise ValueError('neither a list of GPUs nor {"gpu_data": [...]}')
    gpus = [amd_gpu(entry) for entry in data]
    for index, gpu in enumerate(gpus):
        if gpu["gpu"] is None:
            gpu["gpu"] = index
    return gpus


def parse_nvidia_query(text: str) -> list[dict[str, Any]]:
    """Return one sample per GPU from ``nvidia-smi`` with :data:`NVIDIA_ARGV` (one CSV line per GPU, the
    fields in :data:`NVIDIA_FIELDS` order; ``[N/A]`` / ``[Not Supported]`` where a GPU has no value)."""
    gpus: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(NVIDIA_FIELDS):
            raise ValueError(f"{len(cells)} columns, expected {len(NVIDIA_FIELDS)}: {line.strip()!r}")
        row = dict(zip(NVIDIA_FIELDS, cells, strict=True))
        index = number(row["index"])
        reasons = row["clocks_throttle_reasons.active"]
        mask = int(reasons, 16) if reasons.lower().startswith("0x") else None
        gpus.append(
            {
                "gpu": int(index) if index is not None else len(gpus),
                "uuid": row["uuid"],
                "util_pct": number(row["utilization.gpu"]),
                "power_w": number(row["power.draw"]),
                "temp_c": number(row["temperature.gpu"]),
                "temp_mem_c": number(row["temperature.memory"]),
                "vram_used_mib": number(row["memory.used"]),
                "vram_total_mib": number(row["memory.total"]),
                "gfx_clock_mhz": number(row["clocks.sm"]),
                "mem_clock_mhz": number(row["clocks.mem"]),
                # bit 0: GPU idle; any other bit is a throttle reason (nvidia-smi --help-query-gpu)
                "throttle": None if mask is None else f"0x{mask:016x}",
                "ecc_correctable": number(row["ecc.errors.corrected.volatile.total"]),
                "ecc_uncorrectable": number(row["ecc.errors.uncorrected.volatile.total"]),
            }
        )
    if not gpus:
        raise ValueError("no GPU line in the output")
    return gpus


# --- tools --------------------------------------------------------------------------------------------

"""GPU telemetry on the test hosts: the ``amd-smi metric --json`` TEST DOUBLE with fault modes
(:mod:`mift_testsupport.amd_smi_double`) and the document it prints.

No real ``amd-smi metric --json`` dump of a bare-metal MI300X exists in the capture corpus
(tests/fixtures/gpu-tools/INDEX.md, "Gaps"). :func:`metric_document` puts the values of a real, complete
capture of an 8 x MI300X node (``amd-smi monitor --watch 5``, ROCm 6.4.2: power, hotspot and HBM temperature,
GFX clock, GFX and memory activity, VRAM used of every GPU) into the document amd-smi 26.x prints for ``metric
--json``: ``{"gpu_data": [...]}`` with ``{"value": N, "unit": U}`` values, the shape the real ROCm 7.0.2
capture of ROCm/amdsmi issue #134 shows. The ``ecc`` section (``total_correctable_count``,
``total_uncorrectable_count``, 0 on every GPU) is in no capture: its keys are those the parser reads, the
fault modes of the double change them.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mift_testsupport.paths import REPO_ROOT

if TYPE_CHECKING:
    from mift_testsupport.cluster import Cluster

WATCH_CAPTURE = REPO_ROOT / "tests/fixtures/gpu-tools/amd-smi/mi300x_x8_cmontemuino_monitor_watch5.txt"
DOUBLE = Path(__file__).resolve().parent / "amd_smi_double.py"
HOST_DOUBLE = "/usr/local/bin/amd-smi"
HOST_DOC = "/etc/mift-testdouble/amd-smi-metric.json"
HOST_MODE = "/etc/mift-testdouble/amd-smi-mode"
HOST_STATE = "/run/mift-testdouble"
ROW_RE = re.compile(
    r"^\s*\d+\s+(?P<gpu>\d+)\s+(?P<power>\d+) W\s+(?P<hot>\d+) °C\s+(?P<mem_t>\d+) °C\s+(?P<clk>\d+) MHz\s+"
    r"(?P<gfx>\d+) %\s+(?P<umc>\d+) %\s+(?:N/A|\d+ %)\s+(?:N/A|\d+ %)\s+"  # ENC%, DEC%
    r"(?P<used>[\d.]+)/(?P<total>[\d.]+) GB\s*$"
)


def _v(value: float, unit: str) -> dict[str, Any]:
    return {"value": int(value) if float(value).is_integer() else value, "unit": unit}


def metric_document(capture: Path = WATCH_CAPTURE) -> dict[str, Any]:
    """Return ``amd-smi metric --json`` of the 8 GPUs of the real ``monitor --watch 5`` capture."""
    gpus = []
    for line in capture.read_text(encoding="utf-8").splitlines():
        row = ROW_RE.match(line)
        if not row:
            continue
        gpus.append(
            {
                "gpu": int(row["gpu"]),
                "usage": {
                    "gfx_activity": _v(int(row["gfx"]), "%"),
                    "umc_activity": _v(int(row["umc"]), "%"),
                    "mm_activity": "N/A",
                },
                "power": {"socket_power": _v(int(row["power"]), "W"), "throttle_status": "N/A"},
                "clock": {"gfx_0": {"clk": _v(int(row["clk"]), "MHz")}},
                "temperature": {
                    "edge": "N/A",
                    "hotspot": _v(int(row["hot"]), "C"),
                    "mem": _v(int(row["mem_t"]), "C"),
                },
                "mem_usage": {
                    "total_vram": _v(round(float(row["total"]) * 1024), "MB"),
                    "used_vram": _v(round(float(row["used"]) * 1024), "MB"),
                },
                "ecc": {"total_correctable_count": 0, "total_uncorrectable_count": 0},
            }
        )
    if len(gpus) != 8:  # the capture shows 8 GPUs
        raise ValueError(f"{capture}: {len(gpus)} GPU rows, expected 8")
    return {"gpu_data": gpus}


def install_amd_smi_double(cluster: Cluster, host: int, mode: str) -> None:
    """Put the TEST DOUBLE on ``host`` as ``/usr/local/bin/amd-smi`` in ``mode`` (calls counted from 0)."""
    doc = json.dumps(metric_document())
    script = DOUBLE.read_text(encoding="utf-8")
    cluster.ssh(
        host,
        f"mkdir -p /etc/mift-testdouble && rm -rf {HOST_STATE} && "
        f"printf %s {shlex.quote(script)} > {HOST_DOUBLE} && chmod 0755 {HOST_DOUBLE} && "
        f"printf %s {shlex.quote(doc)} > {HOST_DOC} && printf '%s\\n' {shlex.quote(mode)} > {HOST_MODE}",
    )


def remove_amd_smi_double(cluster: Cluster, host: int) -> None:
    """Take the TEST DOUBLE and its files off ``host``."""
    cluster.ssh(host, f"rm -rf {HOST_DOUBLE} {HOST_DOC} {HOST_MODE} {HOST_STATE}", check=False)


def rose_at(cluster: Cluster, host: int) -> float | None:
    """Return when the double first answered with the raised ECC count (host clock), or None."""
    text = cluster.ssh(host, f"cat {HOST_STATE}/rose-at 2>/dev/null; true").strip()
    return float(text) if text else None

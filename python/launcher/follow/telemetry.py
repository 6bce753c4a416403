"""GPU telemetry on the controller: what the nodes' samplers (``launcher/node/gpu.py``) report, as the
launcher shows and records it.

* :func:`first_gpu_fault` -- a node whose GPU broke (the judge fails the run with it, naming host and GPU);
* :class:`WarningOnce` -- the follow loop prints a node's telemetry warning (a tool that hung or failed)
  once;
* :func:`gpu_lines` -- ``status``: per node, GPU utilization, power, temperature and memory of the latest
  sample;
* :func:`gpu_series` -- ``finalize``: each node's utilization and power over the run, for ``gpu.png``;
* :func:`after_fields` -- ``finalize``: each node's check after the run (GPUs idle and healthy), and the notes
  for the nodes that are not.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launcher.node import contract

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from pathlib import Path

    from launcher.backends.runner import PlaybookResult


def first_gpu_fault(hosts: Iterable[str], nodes: dict[str, contract.NodeStatus]) -> str:
    """Return the run's failure reason when a node reports a broken GPU ('' otherwise): host and GPU."""
    for host in hosts:
        fault = (nodes.get(host) or {}).get("gpu_fault")
        if fault:
            return f"{host}: {fault}; trainer stopped"
    return ""


@dataclass
class WarningOnce:
    """Remembers which node warnings were printed already."""

    seen: set[tuple[str, str]] = field(default_factory=set)

    def new_lines(self, nodes: dict[str, contract.NodeStatus]) -> list[str]:
        """Return ``warning: HOST: telemetry: ...`` for each warning not printed before."""
        lines = []
        for host, node in nodes.items():
            text = node.get("telemetry_warning")
            if text and (host, str(text)) not in self.seen:
                self.seen.add((host, str(text)))
                lines.append(f"warning: {host}: GPU telemetry: {text}")
        return lines


def _num(value: object, spec: str, unit: str) -> str:
    return f"{format(value, spec)}{unit}" if isinstance(value, int | float) else "-"


def _age(t: object) -> str:
    return f"{max(0.0, time.time() - t):.0f} s ago" if isinstance(t, int | float) else "-"


def gpu_lines(hosts: Iterable[str], nodes: Mapping[str, contract.NodeStatus]) -> list[str]:
    """Return the GPU table of ``status`` (empty when no node has a sample): per node the mean utilization,
    total power, hottest GPU (and HBM) and the memory used, from the latest sample."""
    rows = [("HOST", "GPUS", "UTIL", "POWER", "TEMP", "HBM TEMP", "MEMORY", "SAMPLED")]
    for host in hosts:
        node = nodes.get(host) or {}
        gpu = node.get("gpu")
        if not isinstance(gpu, dict):
            continue
        used, total = gpu.get("vram_used_mib"), gpu.get("vram_total_mib")
        memory = "-"
        if isinstance(used, int | float):
            memory = f"{used / 1024:.1f}" + (
                f"/{total / 1024:.0f} GiB" if isinstance(total, int | float) else " GiB"
            )
        rows.append(
            (
                host,
                str(gpu.get("gpus", "-")),
                _num(gpu.get("util_pct"), ".0f", "%"),
                _num(gpu.get("power_w"), ".0f", " W"),
                _num(gpu.get("temp_c"), ".0f", " C"),
                _num(gpu.get("temp_mem_c"), ".0f", " C"),
                memory,
                _age(gpu.get("t")),
            )
        )
    if len(rows) == 1:
        return []
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def after_fields(collected: PlaybookResult, hosts: Iterable[str]) -> tuple[dict[str, Any], list[str]]:
    """Return each node's check after the run (``collect``'s ``gpu_after``) and a note per node that failed
    it (GPUs not idle or not healthy)."""
    checks: dict[str, Any] = {}
    notes = []
    for host in hosts:
        report = collected.report(host, "collect")
        after = report.get("gpu_after") if isinstance(report, dict) else None
        if not isinstance(after, dict):
            continue
        checks[host] = after
        if not after.get("ok", True):
            notes.append(
                f"{host}: GPUs not idle or not healthy after the run: {'; '.join(after.get('problems', []))}"
            )
    return checks, notes


def gpu_series(
    nodes_dir: Path, hosts: Iterable[str]
) -> dict[str, list[tuple[float, float | None, float | None]]]:
    """Return host -> (seconds since the run's first sample, mean GPU util %, node power W) from the collected
    ``nodes/<host>/telemetry.jsonl`` (hosts without samples are left out)."""
    lines: dict[str, list[tuple[float, list[dict[str, Any]]]]] = {}
    for host in hosts:
        try:
            text = (nodes_dir / host / "telemetry.jsonl").read_text()
        except OSError:
            continue
        for raw in text.splitlines():
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            if (
                isinstance(entry, dict)
                and isinstance(entry.get("t"), int | float)
                and isinstance(entry.get("gpus"), list)
            ):
                lines.setdefault(host, []).append((float(entry["t"]), entry["gpus"]))
    if not lines:
        return {}
    start = min(t for samples in lines.values() for t, _ in samples)

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    series = {}
    for host, samples in lines.items():
        points = []
        for t, gpus in samples:
            util = [float(g["util_pct"]) for g in gpus if isinstance(g.get("util_pct"), int | float)]
            power = [float(g["power_w"]) for g in gpus if isinstance(g.get("power_w"), int | float)]
            points.append((round(t - start, 1), mean(util), sum(power) if power else None))
        series[host] = points
    return series

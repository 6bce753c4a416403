"""The GPU fabric as ``launcher check`` measures it on GPU nodes, and the bandwidths the planner takes from
it.

The node program's ``gpu-allreduce`` (``node/gpu_allreduce.py``) answers per node: the intra-node sweep over
its GPUs, the groups of the link test that name it (sweeps over every GPU of the group's nodes),
``all_reduce_perf``'s and ``ib_write_bw``'s raw output. This module turns the answers into

- one sweep table (bus bandwidth per size, nccl-tests' definition: ``busbw = algbw * 2(n-1)/n``);
- link results for :func:`launcher.fabric.links.judge` (each group's figures at its largest size);
- one line per tool output (``all_reduce_perf``, ``ib_write_bw``, parsed by :mod:`launcher.fabric.perftools`),
  a bad output being one ``bad:`` line naming node and tool;
- notes on what was not measured (one GPU, one node, a tool not on the node);
- the cache record (``<key>.gpu.json`` beside the TCP one), read by :func:`planner_bandwidth`.

The planner takes from a GPU record only: intra-node = the slowest node's intra-node bus bandwidth at the
largest size (needs 2 GPUs or more per node); inter-node per GPU = ``algbw * 2(n-1)/n / g`` of the group of
all nodes (else the slowest pair), n nodes of g GPUs: what each GPU's share of its NIC carried under the
planner's hierarchical model (a lower bound when the intra-node links bound that all-reduce). A TCP (gloo)
record is never read for it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launcher.fabric import links
from launcher.fabric.perftools import ToolOutputError, all_reduce_perf, ib_write_bw, tool_line

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

MIB = 1024 * 1024
# the sweep of sizes: 1 MiB to 1 GiB, doubling (nccl-tests' -b 1M -e 1G -f 2)
SWEEP_MIN_MIB = 1
SWEEP_MAX_MIB = 1024
ITERS = 20  # nccl-tests' defaults: 20 timed iterations after 5 warm-ups
WARMUP = 5
GROUP_TIMEOUT_S = 300  # one group's workers (NCCL's init, the sweep); a worker past it is killed: "hung"
IB_WRITE_SECONDS = 2
IB_PORT_OFFSET = 1000  # ib_write_bw's TCP port: the group's port + this + the RDMA port's index


def sweep_sizes(min_mib: int = SWEEP_MIN_MIB, max_mib: int = SWEEP_MAX_MIB) -> list[int]:
    """Return the sweep's sizes in bytes: ``min_mib`` MiB doubling up to ``max_mib`` MiB."""
    sizes, size = [], min_mib * MIB
    while size <= max_mib * MIB:
        sizes.append(size)
        size *= 2
    return sizes


def node_spec(
    hosts: Sequence[str],
    train_address: Mapping[str, str],
    planned: Sequence[Mapping[str, Any]],
    *,
    intra_port: int,
    rdma_ports: Mapping[str, Sequence[Mapping[str, Any]]],
    gid_index: Mapping[str, int | None],
    sizes: Sequence[int],
    iters: int = ITERS,
    warmup: int = WARMUP,
) -> dict[str, Any]:
    """Return the node script's spec: addresses, groups, sizes, the RDMA ports for ``ib_write_bw``."""
    return {
        "addrs": {h: train_address[h] for h in hosts},
        "rounds": [dict(g) for g in planned],
        "intra_port": intra_port,
        "sizes": list(sizes),
        "iters": iters,
        "warmup": warmup,
        "timeout_s": GROUP_TIMEOUT_S,
        "tools": {
            "all_reduce_perf": True,
            "ib_write_bw": {
                "ports": {h: [dict(p) for p in rdma_ports.get(h) or []] for h in hosts},
                "gid_index": {h: gid_index.get(h) for h in hosts},
                "seconds": IB_WRITE_SECONDS,
            },
        },
    }


def _size(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes < 1024 * MIB else f"{nbytes // (1024 * MIB)} GiB"


@dataclass
class GpuFabric:
    """What the nodes answered, judged: the sweep rows, the link results, tool lines, bad lines and notes."""

    intra: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> {"world", "rows" | "error"}
    groups: list[dict[str, Any]] = field(default_factory=list)  # planned groups with their answer
    results: list[links.LinkResult] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gpus: dict[str, int] = field(default_factory=dict)
    gpu_names: dict[str, list[str]] = field(default_factory=dict)
    library: str = "NCCL"


def _largest(answer: Mapping[str, Any]) -> dict[str, Any] | None:
    rows = answer.get("rows") or []
    return dict(rows[-1]) if rows else None


def _perf_line(host: str, answer: Mapping[str, Any], torch_row: Mapping[str, Any] | None) -> tuple[str, bool]:
    """Return the line of a node's ``all_reduce_perf`` run and whether it is bad."""
    if answer.get("timed_out"):
        return tool_line(
            host, "all_reduce_perf", f"hung: no result within {answer.get('timeout_s')} s (killed)"
        ), True
    try:
        parsed = all_reduce_perf(str(answer.get("output") or ""))
    except ToolOutputError as err:
        rc = answer.get("rc")
        return tool_line(host, "all_reduce_perf", f"{err}{'' if rc == 0 else f' (exit status {rc})'}"), True
    row = parsed.largest
    beside = ""
    if torch_row is not None and torch_row.get("bytes") == row.size_bytes:
        beside = f"; torch.distributed at that size: {torch_row['busbw_gbs']:.2f}"
    line = (
        f"{host}: all_reduce_perf ({parsed.version}, {parsed.ranks} ranks): busbw {row.busbw_gbs:.2f} GB/s "
        f"at {_size(row.size_bytes)} (in place {row.inplace_busbw_gbs:.2f}){beside}"
    )
    return line, False


def _ib_line(item: Mapping[str, Any]) -> tuple[str, bool]:
    host = item["hosts"][0] if item.get("side") == "server" else item["hosts"][1]
    label = f"{item['hosts'][0]}:{item['ports'][0]}-{item['hosts'][1]}:{item['ports'][1]}"
    if item.get("timed_out"):
        return tool_line(
            host, "ib_write_bw", f"{label}: hung: no result within {item.get('timeout_s')} s"
        ), True
    try:
        parsed = ib_write_bw(str(item.get("output") or ""))
    except ToolOutputError as err:
        return tool_line(host, "ib_write_bw", f"{label}: {err} (exit status {item.get('rc')})"), True
    return f"{label}: ib_write_bw {parsed.average:.2f} {parsed.unit} average ({parsed.link_type})", False


def _merge_node(host: str, answer: Mapping[str, Any], out: GpuFabric) -> None:
    """Take one node's answer: its intra-node sweep, what it could not measure, its tools' output."""
    out.library = str(answer.get("library") or out.library)
    out.gpus[host] = int(answer.get("gpus") or 0)
    out.gpu_names[host] = [str(n) for n in (answer.get("torch") or {}).get("names") or []]
    if answer.get("error"):
        out.bad.append(f"{host}: GPU all-reduce: {answer['error']}")
        return
    intra = dict(answer.get("intra") or {})
    out.intra[host] = intra
    if intra.get("error"):
        out.bad.append(f"{host}: GPU all-reduce inside the node: {intra['error']}")
    elif intra.get("wrong"):
        out.bad.append(f"{host}: GPU all-reduce inside the node: {intra['wrong']} wrong values")
    out.notes.extend(f"{host}: not measured: {what}" for what in answer.get("not_measured") or [])
    perf = answer.get("all_reduce_perf")
    if isinstance(perf, dict) and perf.get("missing"):
        out.notes.append(f"{host}: all_reduce_perf (rccl-tests / nccl-tests) is not on the node: not run")
    elif isinstance(perf, dict):
        line, bad = _perf_line(host, perf, _largest(intra))
        (out.bad if bad else out.tools).append(line)
    for item in answer.get("ib_write_bw") or []:
        if item.get("side") == "client" or item.get("rc") != 0:
            line, bad = _ib_line(item)
            (out.bad if bad else out.tools).append(line)


def _group_result(key: tuple[str, ...], got: Sequence[Mapping[str, Any]]) -> links.LinkResult:
    good = next((a for a in got if a.get("rows")), None)
    if good is not None and not good.get("wrong"):
        row = good["rows"][-1]
        return links.LinkResult(key, row["time_us"] / 1e6, row["busbw_gbs"])
    error = f"{good['wrong']} wrong values" if good is not None else ""
    error = error or next((str(a["error"]) for a in got if a.get("error")), "no answer from the nodes")
    return links.LinkResult(key, None, None, error=error)


def merge(answers: Mapping[str, Mapping[str, Any] | None], planned: Sequence[Mapping[str, Any]]) -> GpuFabric:
    """Judge the nodes' answers (host -> the node script's JSON) against the planned groups."""
    out = GpuFabric()
    for host, answer in answers.items():
        if answer:
            _merge_node(host, answer, out)
        else:
            out.bad.append(f"{host}: GPU all-reduce: no answer from the node")
    by_group: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for answer in answers.values():
        for item in (answer or {}).get("results") or []:
            by_group.setdefault(tuple(item.get("hosts") or ()), []).append(dict(item))
    for rnd in planned:
        key = tuple(rnd["hosts"])
        got = by_group.get(key) or []
        good = next((a for a in got if a.get("rows")), None)
        out.groups.append({**dict(rnd), **(good or {})})
        out.results.append(_group_result(key, got))
    return out


def sweep_table(fabric: GpuFabric) -> list[str]:
    """Return the sweep: one line per node (inside it) and per group, bus bandwidth (GB/s) per size."""
    scopes: list[tuple[str, int | None, list[dict[str, Any]]]] = []
    for host, intra in fabric.intra.items():
        scopes.append((f"{host} (inside)", intra.get("world"), intra.get("rows") or []))
    for group in fabric.groups:
        label = links.LinkResult(tuple(group["hosts"]), None, None).label
        scopes.append((label, group.get("world"), group.get("rows") or []))
    sizes = sorted({int(r["bytes"]) for _, _, rows in scopes for r in rows})
    if not scopes:
        return []
    width = max([len(s[0]) for s in scopes] + [5])
    head = "".join(f"{_size(s):>9}" for s in sizes)
    lines = [f"{'busbw':<{width}} {'ranks':>5}{head}"]
    for label, world, rows in scopes:
        by_size = {int(r["bytes"]): r for r in rows}
        cells = "".join(f"{by_size[s]['busbw_gbs']:>9.2f}" if s in by_size else f"{'-':>9}" for s in sizes)
        lines.append(f"{label:<{width}} {world if world is not None else '-'!s:>5}{cells}")
    return lines


def cache_path(key: str) -> Path:
    """Return the file of a GPU check's record (beside the TCP one, which the planner never reads)."""
    return links.cache_dir() / f"{key}.gpu.json"


def save(key: str, hosts: Sequence[str], fabric: GpuFabric, verdict: links.LinkVerdict) -> Path:
    """Write a GPU check's figures under the cache folder; return the file."""
    path = cache_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "key": key,
        "transport": "gpu",
        "library": fabric.library,
        "hosts": list(hosts),
        "measured_at": time.time(),
        "gpus": dict(fabric.gpus),
        "gpu_names": dict(fabric.gpu_names),
        "intra": {
            h: {k: v for k, v in i.items() if k in ("world", "rows", "error")}
            for h, i in fabric.intra.items()
        },
        "groups": [
            {k: g.get(k) for k in ("hosts", "round", "world", "rows", "error")} for g in fabric.groups
        ],
        "results": links.result_rows(verdict),
    }
    return links.write_record(path, record)


def load(key: str) -> dict[str, Any] | None:
    """Return the GPU record of ``key`` (None: none, or unreadable)."""
    try:
        data = json.loads(cache_path(key).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("transport") == "gpu" else None


@dataclass(frozen=True)
class Bandwidth:
    """One figure for the planner (GB/s; None: not measured) and the words that say where it came from."""

    gbs: float | None
    how: str


def intra_node(record: Mapping[str, Any]) -> Bandwidth:
    """Return the intra-node bus bandwidth of a GPU record: the slowest node's, at its largest size."""
    figures: dict[str, tuple[float, int, int]] = {}
    for host, intra in (record.get("intra") or {}).items():
        rows, world = intra.get("rows") or [], int(intra.get("world") or 0)
        if rows and world >= 2:
            figures[host] = (float(rows[-1]["busbw_gbs"]), world, int(rows[-1]["bytes"]))
    if not figures:
        gpus = sorted(set((record.get("gpus") or {}).values()))
        why = "one GPU per node" if gpus == [1] else "no intra-node all-reduce in the record"
        return Bandwidth(None, why)
    host = min(figures, key=lambda h: figures[h][0])
    gbs, world, size = figures[host]
    return Bandwidth(
        gbs, f"all-reduce bus bandwidth over the {world} GPUs of {host} (the slowest node) at {_size(size)}"
    )


def inter_node(record: Mapping[str, Any]) -> Bandwidth:
    """Return the inter-node bandwidth per GPU of a GPU record: ``algbw * 2(n-1)/n / g`` of the group of all
    nodes, else of the slowest pair, at its largest size."""
    gpus = record.get("gpus") or {}
    groups = [g for g in record.get("groups") or [] if g.get("rows") and len(g.get("hosts") or []) >= 2]
    if not groups:
        return Bandwidth(
            None, "one node" if len(record.get("hosts") or []) < 2 else "no inter-node all-reduce"
        )
    everyone = [g for g in groups if len(g["hosts"]) == len(record.get("hosts") or [])]

    def per_gpu(group: Mapping[str, Any]) -> float:
        n = len(group["hosts"])
        g = max(1, min(int(gpus.get(h) or 1) for h in group["hosts"]))
        return float(group["rows"][-1]["algbw_gbs"]) * 2 * (n - 1) / n / g

    group = everyone[0] if everyone else min(groups, key=per_gpu)
    n, row = len(group["hosts"]), group["rows"][-1]
    which = f"all {n} nodes" if everyone else f"the slowest pair {'-'.join(group['hosts'])}"
    return Bandwidth(
        per_gpu(group),
        f"algbw {row['algbw_gbs']:.2f} GB/s x 2(n-1)/n / GPUs per node, {which}, {group.get('world')} "
        f"ranks, at {_size(int(row['bytes']))}",
    )

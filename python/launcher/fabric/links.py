"""The links between nodes: the all-reduce test's table, slow pairs, the cache.

The groups come from :mod:`launcher.fabric.schedule` (rounds of disjoint pairs side by side, then all nodes at
once); on CPU nodes the test is ``mift_allreduce.py`` (gloo over TCP), on GPU nodes ``mift_gpu_allreduce.py``
(NCCL/RCCL, :mod:`launcher.fabric.gpulinks`). A pair is slow when its bus bandwidth is below ``SLOW_FRACTION``
of the best pair's or below the floor (``min_gbs``). A node in every slow pair, all of whose pairs are slow,
is named as the bad node; a slow pair not explained by a bad node is named as a bad link. Results are cached
per boot and node set (the hosts in order, each one's address and ``boot_id``): a second ``check`` on the same
boot is served from the cache (``--fresh`` measures again). The TCP figures are never the planner's: ``plan:
auto`` reads only the GPU record (:func:`launcher.fabric.gpulinks.intra_node`, ``inter_node``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# a pair below this fraction of the best pair's bus bandwidth is slow
SLOW_FRACTION = 0.5
# a pair below this bus bandwidth (GB/s) is slow whatever the others do (0: no floor)
MIN_GBS = 0.05
# how much each round moves (MiB) and how often
SIZE_MB = 8.0
ITERS = 3
ROUND_TIMEOUT_S = 120
CACHE_ENV = "MIFT_CHECK_CACHE"


def cache_dir() -> Path:
    """Return the folder of cached check results (``$MIFT_CHECK_CACHE``, else ``~/.cache/mift/check``)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "mift" / "check")


@dataclass(frozen=True)
class LinkResult:
    """One round: its hosts, seconds per all-reduce, bus bandwidth (GB/s) or an error."""

    hosts: tuple[str, ...]
    seconds: float | None
    busbw_gbs: float | None
    error: str = ""
    slow: bool = False

    @property
    def label(self) -> str:
        """Return ``a-b`` for a pair, ``ring(a,b,c)`` for the ring (``ring(a..z, N nodes)`` past 4 nodes)."""
        if len(self.hosts) == 2:
            return "-".join(self.hosts)
        if len(self.hosts) > 4:
            return f"ring({self.hosts[0]}..{self.hosts[-1]}, {len(self.hosts)} nodes)"
        return f"ring({','.join(self.hosts)})"


def merge(reports: Mapping[str, Any], planned: Sequence[Mapping[str, Any]]) -> list[LinkResult]:
    """Return one result per planned round from the nodes' reports (first host's answer; else any error)."""
    by_round: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for answer in reports.values():
        for item in (answer or {}).get("results") or []:
            by_round.setdefault(tuple(item.get("hosts") or ()), []).append(item)
    out = []
    for rnd in planned:
        key = tuple(rnd["hosts"])
        answers = by_round.get(key) or []
        good = [a for a in answers if a.get("busbw_gbs")]
        if good:
            out.append(LinkResult(key, float(good[0]["seconds"]), float(good[0]["busbw_gbs"])))
        else:
            error = next((str(a["error"]) for a in answers if a.get("error")), "no answer from the nodes")
            out.append(LinkResult(key, None, None, error=error))
    return out


@dataclass(frozen=True)
class LinkVerdict:
    """The judged rounds and one line per bad node or link."""

    results: tuple[LinkResult, ...]
    bad: tuple[str, ...]

    @property
    def pairs(self) -> list[LinkResult]:
        """Return the pair rounds."""
        return [r for r in self.results if _is_pair(r)]


def _is_pair(r: LinkResult) -> bool:
    return len(r.hosts) == 2


def judge(results: Sequence[LinkResult], *, min_gbs: float = MIN_GBS) -> LinkVerdict:
    """Flag slow rounds and name the bad nodes and links (one line each).

    A node is named when every pair it is in is slow while some pair is not (three nodes or more); every
    other slow pair is named as a link; a slow ring is named when nothing else explains it.
    """
    pairs = [r for r in results if _is_pair(r)]
    best = max((r.busbw_gbs or 0.0 for r in pairs), default=0.0)
    limit = max(best * SLOW_FRACTION, min_gbs)
    judged = [
        replace(r, slow=r.busbw_gbs is None or r.busbw_gbs < (limit if _is_pair(r) else min_gbs))
        for r in results
    ]
    judged_pairs = [r for r in judged if _is_pair(r)]
    hosts = list(dict.fromkeys(h for r in judged_pairs for h in r.hosts))
    bad: list[str] = []
    named: set[str] = set()
    if any(not r.slow for r in judged_pairs):
        for host in hosts:
            mine = [r for r in judged_pairs if host in r.hosts]
            if all(r.slow for r in mine):
                named.add(host)
                listing = ", ".join(f"{r.label} {_gbs(r)}" for r in mine)
                bad.append(f"{host}: every link of {host} is slow ({listing}; best pair {best:.3f} GB/s)")
    for r in judged_pairs:
        if r.slow and not named.intersection(r.hosts):
            bad.append(f"{r.label}: slow link ({r.error or _gbs(r)}; below {limit:.3f} GB/s)")
    for r in judged:
        if r.slow and not _is_pair(r) and not bad:
            bad.append(f"{r.label}: {r.error or _gbs(r)}, below {min_gbs:.3f} GB/s")
    return LinkVerdict(tuple(judged), tuple(bad))


def _gbs(r: LinkResult) -> str:
    return f"{r.busbw_gbs:.3f} GB/s" if r.busbw_gbs is not None else "failed"


def table(verdict: LinkVerdict) -> list[str]:
    """Return the table of rounds: link, seconds per all-reduce, bus bandwidth, flag."""
    width = max([len(r.label) for r in verdict.results] + [4])
    lines = [f"{'link':<{width}}  {'s/all-reduce':>12}  {'busbw GB/s':>10}  verdict"]
    for r in verdict.results:
        secs = f"{r.seconds:.4f}" if r.seconds is not None else "-"
        gbs = f"{r.busbw_gbs:.3f}" if r.busbw_gbs is not None else "-"
        flag = "SLOW" if r.slow else "ok"
        lines.append(f"{r.label:<{width}}  {secs:>12}  {gbs:>10}  {flag}{'  ' + r.error if r.error else ''}")
    return lines


def cache_key(
    hosts: Sequence[str], train_address: Mapping[str, str], probe: Mapping[str, Mapping[str, Any]]
) -> str | None:
    """Return the cache key of the links between ``hosts``: the hosts in order, each one's address and boot
    id (a reboot, another node or another address measures again). None when a node reports no boot id."""
    boots = {h: ((probe.get(h) or {}).get("net") or {}).get("boot_id") for h in hosts}
    if not all(boots.values()):
        return None
    data = [[h, train_address.get(h), boots[h]] for h in hosts]
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()[:24]


def save(key: str, hosts: Sequence[str], verdict: LinkVerdict, *, nproc_per_node: int | None) -> Path:
    """Write a check's results under the cache folder; return the file."""
    path = cache_dir() / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "key": key,
        "hosts": list(hosts),
        "measured_at": time.time(),
        "nproc_per_node": nproc_per_node,
        "results": result_rows(verdict),
    }
    return write_record(path, record)


def result_rows(verdict: LinkVerdict) -> list[dict[str, Any]]:
    """Return a verdict's link results as the cache records keep them (TCP and GPU alike)."""
    return [
        {"hosts": list(r.hosts), "seconds": r.seconds, "busbw_gbs": r.busbw_gbs, "error": r.error}
        for r in verdict.results
    ]


def write_record(path: Path, record: Mapping[str, Any]) -> Path:
    """Write a check's cache record to ``path`` in one step (a temporary file renamed); return the path."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)
    return path


def load(key: str) -> dict[str, Any] | None:
    """Return the cached record of ``key`` (None: none, or unreadable)."""
    try:
        data = json.loads((cache_dir() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def results_of(record: Mapping[str, Any]) -> list[LinkResult]:
    """Return the rounds of a cached record."""
    return [
        LinkResult(
            tuple(r["hosts"]),
            r.get("seconds"),
            r.get("busbw_gbs"),
            error=str(r.get("error") or ""),
        )
        for r in record.get("results") or []
    ]

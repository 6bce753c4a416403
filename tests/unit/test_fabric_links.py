"""Slow pairs, bad nodes and the cache (launcher.fabric.links); rounds: tests/unit/test_fabric_schedule.py;
the planner reads a GPU record only, never a TCP one: tests/unit/test_fabric_gpulinks.py."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from launcher.fabric import links, schedule
from launcher.fabric.links import LinkResult, judge
from launcher.preflight.checks import NodeFacts

if TYPE_CHECKING:
    import pytest

HOSTS = ["host1", "host2", "host3"]


def _results(gbs: dict[str, float]) -> list[LinkResult]:
    out = []
    for label, value in gbs.items():
        hosts = tuple(label.split("-")) if label != "ring" else tuple(HOSTS)
        out.append(LinkResult(hosts, 8 * 2**20 / value / 1e9, value))
    return out


def test_a_throttled_host2_is_named_and_its_pairs_flagged() -> None:
    verdict = judge(_results({"host1-host2": 0.006, "host1-host3": 1.9, "host2-host3": 0.006, "ring": 0.006}))
    assert [(r.label, r.slow) for r in verdict.pairs] == [
        ("host1-host2", True),
        ("host1-host3", False),
        ("host2-host3", True),
    ]
    assert verdict.bad == (
        "host2: every link of host2 is slow (host1-host2 0.006 GB/s, host2-host3 0.006 GB/s; best pair "
        "1.900 GB/s)",
    )
    table = links.table(verdict)
    assert table[1].split() == ["host1-host2", f"{8 * 2**20 / 0.006 / 1e9:.4f}", "0.006", "SLOW"]


def test_unthrottled_passes_and_one_slow_link_is_named_as_a_link() -> None:
    assert (
        judge(_results({"host1-host2": 1.8, "host1-host3": 1.9, "host2-host3": 1.7, "ring": 1.2})).bad == ()
    )
    verdict = judge(_results({"host1-host2": 1.8, "host1-host3": 0.4, "host2-host3": 1.7, "ring": 0.4}))
    assert verdict.bad == ("host1-host3: slow link (0.400 GB/s; below 0.900 GB/s)",)


def test_two_nodes_are_judged_by_the_floor_only() -> None:
    assert judge(_results({"host1-host2": 0.5})).bad == ()
    assert judge(_results({"host1-host2": 0.006})).bad == (
        "host1-host2: slow link (0.006 GB/s; below 0.050 GB/s)",
    )


def test_a_failed_round_is_slow_with_its_error() -> None:
    planned = schedule.planned_rounds(HOSTS[:2], 29510)
    merged = links.merge(
        {"host1": {"results": [{"hosts": ["host1", "host2"], "error": "timed out"}]}}, planned
    )
    assert judge(merged).bad == ("host1-host2: slow link (timed out; below 0.050 GB/s)",)


def _facts(boot: str = "b1", nproc: int = 8) -> NodeFacts:
    return NodeFacts(
        hosts=HOSTS[:2],
        train_address={"host1": "10.0.0.1", "host2": "10.0.0.2"},
        stack={},
        gpus={},
        probe={h: {"net": {"boot_id": f"{boot}-{h}"}} for h in HOSTS[:2]},
        nproc_per_node=nproc,
    )


def test_the_cache_is_per_boot_and_node_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(links.CACHE_ENV, str(tmp_path))
    facts = _facts()
    key = links.cache_key(facts.hosts, facts.train_address, facts.probe)
    assert key is not None
    verdict = judge(_results({"host1-host2": 3.2}))
    links.save(key, facts.hosts, verdict, nproc_per_node=8)
    record = links.load(key)
    assert record is not None and links.results_of(record)[0].busbw_gbs == 3.2
    rebooted = _facts(boot="b2")
    assert links.cache_key(rebooted.hosts, rebooted.train_address, rebooted.probe) != key
    swapped = links.cache_key(facts.hosts[::-1], facts.train_address, facts.probe)
    assert swapped != key

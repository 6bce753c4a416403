"""The rounds of ``launcher check``'s link test (launcher.fabric.schedule): every pair exactly once up to
FULL_PAIRS_MAX nodes, disjoint pairs within a round, the round counts; past it the ring and the bisections."""

from __future__ import annotations

from itertools import combinations

import pytest

from launcher.fabric import schedule


def _hosts(n: int) -> list[str]:
    return [f"host{i}" for i in range(1, n + 1)]


def _disjoint(rounds: list[list[tuple[str, str]]]) -> bool:
    return all(len({h for pair in r for h in pair}) == 2 * len(r) for r in rounds)


@pytest.mark.parametrize("n", range(2, 21))
def test_round_robin_has_every_pair_exactly_once_in_disjoint_rounds(n: int) -> None:
    rounds = schedule.round_robin(_hosts(n))
    pairs = [frozenset(p) for r in rounds for p in r]
    assert len(pairs) == len(set(pairs)) == n * (n - 1) // 2
    assert set(pairs) == {frozenset(p) for p in combinations(_hosts(n), 2)}
    assert _disjoint(rounds)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    assert all(len(r) == n // 2 for r in rounds)


def test_the_counts_before_and_after() -> None:
    """Rounds one after the other: before, every pair then the ring, one group a round; after, rounds of
    disjoint pairs then the ring."""
    before = {n: n * (n - 1) // 2 + 1 for n in (3, 8, 16, 128)}
    after = {n: schedule.round_count(schedule.planned_rounds(_hosts(n), 0)) for n in (3, 8, 16, 128)}
    assert before == {3: 4, 8: 29, 16: 121, 128: 8129}
    assert after == {3: 4, 8: 8, 16: 16, 128: 6}


@pytest.mark.parametrize("n", [17, 18, 31, 64, 127, 128])
def test_past_the_full_count_the_ring_and_bisections_in_disjoint_rounds(n: int) -> None:
    hosts = _hosts(n)
    rounds = schedule.pair_rounds(hosts)
    pairs = [frozenset(p) for r in rounds for p in r]
    assert len(pairs) == len(set(pairs))  # no pair twice
    assert _disjoint(rounds)
    ring = {frozenset((hosts[i], hosts[(i + 1) % n])) for i in range(n)}
    assert ring <= set(pairs)  # every link of the ring is measured, so a slow link is named by its pair
    ring_rounds = 2 if n % 2 == 0 else 3
    assert len(rounds) == ring_rounds + schedule.BISECTION_ROUNDS
    half = n // 2
    for bisection in rounds[ring_rounds:]:
        assert len(bisection) == half
        assert all(hosts.index(a) < half <= hosts.index(b) for a, b in bisection)  # across the halves


def test_planned_groups_have_their_round_a_port_each_and_all_nodes_last() -> None:
    groups = schedule.planned_rounds(_hosts(4), 29510)
    assert groups[-1] == {"round": 3, "hosts": _hosts(4), "port": 29516}
    assert [g["port"] for g in groups] == list(range(29510, 29517))
    assert [g["round"] for g in groups] == [0, 0, 1, 1, 2, 2, 3]
    assert schedule.planned_rounds(_hosts(2), 29510) == [
        {"round": 0, "hosts": ["host1", "host2"], "port": 29510}
    ]
    assert schedule.planned_rounds(_hosts(1), 29510) == []

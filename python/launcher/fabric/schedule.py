"""The rounds of ``launcher check``'s link test: disjoint pairs side by side, wall time in n, not n².

Up to :data:`FULL_PAIRS_MAX` nodes every pair is measured, in the rounds of a round-robin tournament (the
circle method): n-1 rounds of n/2 pairs for even n, n rounds of (n-1)/2 pairs for odd n (one node sits each
round out). Past it, only the ring's links (2 rounds of neighbour pairs for even n, 3 for odd) and
:data:`BISECTION_ROUNDS` rounds that pair each node of the first half with one of the second (a perfect
matching across the bisection, a different one each round). Then one round of all nodes at once (the ring of
the collective). Within a round no node is in two groups, so its groups run at the same time and share no
node's link; a slow link is still named by its pair.

Counts (pair rounds + the one of all nodes): 3 nodes 3 + 1, 8 nodes 7 + 1, 16 nodes 15 + 1, 128 nodes 2 + 3 +
1 (every pair of 128 nodes would be 127 + 1; one pair after the other, as before, 8,128 + 1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

# up to this many nodes every pair is measured (16 nodes: 15 rounds); past it the ring and the bisections
FULL_PAIRS_MAX = 16
# the matchings across the bisection measured past FULL_PAIRS_MAX
BISECTION_ROUNDS = 3

Pair = tuple[str, str]


def round_robin(hosts: Sequence[str]) -> list[list[Pair]]:
    """Return every pair of ``hosts`` exactly once, in rounds of disjoint pairs (the circle method).

    The first host stays put, the others turn one place per round; with an odd count a placeholder is added
    and whoever is paired with it sits the round out.
    """
    ring: list[str | None] = list(hosts)
    if len(ring) % 2:
        ring.append(None)
    n = len(ring)
    out: list[list[Pair]] = []
    for _ in range(n - 1):
        pairs = [(ring[i], ring[n - 1 - i]) for i in range(n // 2)]
        out.append([(a, b) for a, b in pairs if a is not None and b is not None])
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return [r for r in out if r]


def ring_rounds(hosts: Sequence[str]) -> list[list[Pair]]:
    """Return the links of the ring ``hosts[0] - hosts[1] - ... - hosts[-1] - hosts[0]`` in rounds of disjoint
    pairs: 2 rounds for an even count, 3 for an odd one (the closing link shares a node with both others)."""
    n = len(hosts)
    if n < 2:
        return []
    if n == 2:
        return [[(hosts[0], hosts[1])]]
    edges = [(hosts[i], hosts[(i + 1) % n]) for i in range(n)]
    if n % 2 == 0:
        return [edges[0::2], edges[1::2]]
    return [edges[0 : n - 1 : 2], edges[1 : n - 1 : 2], [edges[-1]]]


def bisection_rounds(hosts: Sequence[str], count: int = BISECTION_ROUNDS) -> list[list[Pair]]:
    """Return ``count`` perfect matchings between the first and the second half of ``hosts`` (an odd count
    leaves the last host out), each shifted by another offset; none repeats a pair of the ring."""
    half = len(hosts) // 2
    if half < 2:
        return []
    first, second = hosts[:half], hosts[half : 2 * half]
    ring = {frozenset(p) for r in ring_rounds(hosts) for p in r}
    candidates = dict.fromkeys([(k * half) // max(count, 1) for k in range(count)] + list(range(half)))
    offsets: list[int] = []
    for offset in candidates:
        pairs = [(first[i], second[(i + offset) % half]) for i in range(half)]
        if not any(frozenset(p) in ring for p in pairs):
            offsets.append(offset)
        if len(offsets) == count:
            break
    return [[(first[i], second[(i + off) % half]) for i in range(half)] for off in offsets]


def pair_rounds(hosts: Sequence[str], *, full_max: int = FULL_PAIRS_MAX) -> list[list[Pair]]:
    """Return the rounds of pairs the check measures: every pair up to ``full_max`` nodes, else the ring and
    the bisections."""
    if len(hosts) <= full_max:
        return round_robin(hosts)
    return ring_rounds(hosts) + bisection_rounds(hosts)


def planned_rounds(
    hosts: Sequence[str], base_port: int, *, full_max: int = FULL_PAIRS_MAX
) -> list[dict[str, Any]]:
    """Return the groups of the link test in order: each pair with its round number, then all hosts at once
    (more than two), each group with a port of its own (``base_port`` upwards)."""
    groups: list[dict[str, Any]] = []
    rounds = pair_rounds(hosts, full_max=full_max)
    for number, pairs in enumerate(rounds):
        groups.extend({"round": number, "hosts": list(pair)} for pair in pairs)
    if len(hosts) > 2:
        groups.append({"round": len(rounds), "hosts": list(hosts)})
    return [{**g, "port": base_port + i} for i, g in enumerate(groups)]


def round_count(groups: Sequence[dict[str, Any]]) -> int:
    """Return how many rounds ``groups`` (from :func:`planned_rounds`) take one after the other."""
    return len({g["round"] for g in groups})

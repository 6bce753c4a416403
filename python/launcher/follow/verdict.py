"""A run's state judged from one poll of its nodes: :class:`Verdict`, and :class:`Judge` for the node agents'
states (the ssh backend, and every backend's node-level checks)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from launcher.follow.recovery import cause_order
from launcher.follow.telemetry import first_gpu_fault
from launcher.node import contract

if TYPE_CHECKING:
    from collections.abc import Mapping

UNREACHABLE_LIMIT = 3  # consecutive polls without an answer before a node counts as vanished
# ... or this many seconds (and at least 2 polls) without an answer: a node cut off the network is given up
# quickly, so that the others are stopped within 30 s of the cut
UNREACHABLE_AFTER_S = 8.0


@dataclass
class Verdict:
    """The job's state judged from one poll of every node."""

    state: str  # running | succeeded | failed | stopped
    reason: str = ""
    # succeeded, but a node's trainer has not ended: the run ends with the same stop as a failure (finish)
    stop_lingering: bool = False


@dataclass
class Judge:
    """Turns node states into a job state, remembering what needs memory (grace periods, missed polls)."""

    hosts: list[str]
    teardown_grace_s: float = 10.0
    first_abort_seen: dict[str, float] = field(default_factory=dict)
    missed_polls: dict[str, int] = field(default_factory=dict)
    first_missed: dict[str, float] = field(default_factory=dict)
    lingering_since: float | None = None

    def __call__(  # noqa: PLR0911, PLR0912 - one return per way a job ends
        self, nodes: dict[str, contract.NodeStatus], now: float | None = None
    ) -> Verdict:
        """Return the verdict for this poll's node states (host -> agent status)."""
        now = time.monotonic() if now is None else now
        master = nodes.get(self.hosts[0], {})
        master_done = bool(master.get("outputs_complete"))
        if fault := first_gpu_fault(self.hosts, nodes):  # a broken GPU fails the run as a dead trainer does
            return Verdict("failed", fault)
        settled: list[str] = []
        failed: list[str] = []
        for host in self.hosts:
            node = nodes.get(host, {"state": contract.UNREACHABLE})
            state = node.get("state")
            if state == contract.UNREACHABLE:
                self.missed_polls[host] = self.missed_polls.get(host, 0) + 1
                first = self.first_missed.setdefault(host, now)
                missed = self.missed_polls[host]
                if missed >= UNREACHABLE_LIMIT or (missed >= 2 and now - first >= UNREACHABLE_AFTER_S):
                    return Verdict("failed", f"{host}: unreachable for {missed} polls ({now - first:.0f} s)")
                continue
            self.missed_polls[host] = 0
            self.first_missed.pop(host, None)
            if state == contract.STOPPED:
                return Verdict("stopped", f"{host}: stopped")
            if state in (contract.VANISHED, contract.ABSENT):
                return Verdict("failed", f"{host}: trainer vanished")
            if state == contract.FAILED:
                if master_done and (node.get("teardown_abort") or host == self.hosts[0]):
                    settled.append(host)  # every rank finished training; a rank aborted at interpreter exit
                    continue
                if node.get("teardown_abort"):
                    first = self.first_abort_seen.setdefault(host, now)
                    if now - first < self.teardown_grace_s:
                        continue
                failed.append(host)
            if state == contract.FINISHED:
                settled.append(host)
        if failed:
            host = first_cause(failed, nodes)
            return Verdict("failed", f"{host}: trainer exited rc={nodes[host].get('rc')}")
        if len(settled) == len(self.hosts):
            if master_done:
                return Verdict("succeeded")
            missing = [k for k, v in (master.get("outputs") or {}).items() if not v]
            return Verdict(
                "failed", f"{self.hosts[0]}: trainers exited but output_dir lacks {', '.join(missing)}"
            )
        return self._lingering_master(master, master_done, settled, now)

    def _lingering_master(
        self, master: contract.NodeStatus, master_done: bool, settled: list[str], now: float
    ) -> Verdict:
        """Training is over (the first node's outputs are complete, every other node ended) but the first
        node's trainer still runs: torchrun waits up to 300 s at exit for the other nodes' torchrun (its exit
        barrier), which a node whose rank aborted at exit never joins. After ``teardown_grace_s`` the run has
        succeeded and that trainer is stopped (``stop_lingering``) instead of idling for minutes."""
        # a running first node is not in settled: every other node is
        others_ended = len(settled) == len(self.hosts) - 1
        if not (master_done and others_ended and master.get("state") == contract.RUNNING):
            self.lingering_since = None
            return Verdict("running")
        if self.lingering_since is None:
            self.lingering_since = now
        waited = now - self.lingering_since
        if waited < self.teardown_grace_s:
            return Verdict("running")
        return Verdict(
            "succeeded",
            f"{self.hosts[0]}: training finished and every other node ended, but its trainer was still "
            f"running {waited:.0f} s later (torchrun's exit barrier); stopped",
            stop_lingering=True,
        )


def first_cause(failed: list[str], nodes: Mapping[str, contract.NodeStatus]) -> str:
    """Return the node whose failure caused the others' (``failed``: hosts in inventory order, each seen
    failed in the same poll). A rank killed on host2 makes host1's ranks fail on the broken collective a
    moment later: the cause ranks first (``recovery.cause_order``: a rank killed by a signal before one that
    failed by itself), then the node that ended first, then the inventory's order."""

    def rank(host: str) -> tuple[int, float]:
        node = nodes[host]
        ended = node.get("ended_at")
        return (cause_order(node), float(ended) if isinstance(ended, (int, float)) else float("inf"))

    return min(failed, key=rank)  # min keeps the inventory order among equals


def settled_notes(nodes: dict[str, contract.NodeStatus]) -> list[str]:
    """Return warnings for nodes that ended non-zero although the job succeeded."""
    return [
        f"{h}: rc={n.get('rc')} after training finished (gloo teardown abort at exit, known on CPU)"
        for h, n in nodes.items()
        if n.get("state") == contract.FAILED
    ]

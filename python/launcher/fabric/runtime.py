"""What collectives used at run time: RCCL/NCCL's ``Using network X`` line, judged while a run is followed.

Preflight predicts each node's transport from its facts (:mod:`launcher.fabric.env`); this module checks what
RCCL/NCCL actually chose. On a multi-node job where RDMA is expected and predicted on every node, the run's
environment asks RCCL/NCCL for its init and net lines (:data:`DEBUG_ENV`, under the inventory's and the job
spec's env, which win); each rank's init then prints ``NCCL INFO Using network <Name>`` (``Socket``: TCP
sockets; ``IB``, ``IBext_v8``, ...: RDMA through verbs or a net plugin). The node agent reports the names seen
in the current start (``net_transport``, ``launcher/node/status.py``); :class:`TransportWatch` names a node
that reports ``Socket`` in one line and, by ``fabric.socket_fallback``, fails the run (``fail``: recovery
never retries it, kind ``socket_fallback``) or goes on (``warn``). An environment that hides the line
(:func:`hidden_by`) makes the run say once that the transport is not judged; nothing ever says "ok".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from launcher.node import contract

# INFO shows the line (subsystem INIT); NET adds the chosen device ("NET/IB : Using [0]mlx5_0:1/RoCE"). Both
# print while communicators and their connections are set up, nothing per collective (docs/launcher.md
# "The transport at run time")
DEBUG_ENV: Mapping[str, str] = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
VISIBLE_LEVELS = ("INFO", "TRACE")  # NCCL_DEBUG levels that print INFO lines (compared without case)
LINE_SUBSYS = ("INIT", "ALL")  # NCCL_DEBUG_SUBSYS names that include the line's subsystem
SOCKET_NETWORK = "Socket"  # RCCL/NCCL's name of its TCP socket transport
# the words that name this failure in a verdict (launcher.follow.recovery classifies it as socket_fallback)
FALLBACK_PHRASE = "collectives fell back to TCP sockets at run time"


def hidden_by(env: Mapping[str, str]) -> str:
    """Return what in ``env`` (a node's trainer environment) hides the ``Using network`` line ('' if nothing).

    NCCL reads ``NCCL_DEBUG`` and ``NCCL_DEBUG_SUBSYS`` without case (``^`` first: the names are left out);
    ``NCCL_DEBUG_FILE`` sends the lines to files instead of the trainer's output.
    """
    level = env.get("NCCL_DEBUG", "")
    if level.upper() not in VISIBLE_LEVELS:
        return f"NCCL_DEBUG={level}" if level else "an empty NCCL_DEBUG"
    subsys = env.get("NCCL_DEBUG_SUBSYS")
    if subsys is not None:
        exclude = subsys.startswith("^")
        names = {n.strip().upper() for n in subsys.removeprefix("^").split(",")}
        if exclude == bool(names & set(LINE_SUBSYS)):
            return f"NCCL_DEBUG_SUBSYS={subsys}"
    if env.get("NCCL_DEBUG_FILE"):
        return f"NCCL_DEBUG_FILE={env['NCCL_DEBUG_FILE']}"
    return ""


@dataclass(frozen=True)
class TransportCheck:
    """What a run expects of its collectives' transport (decided with the fabric plan, before the start).

    Attributes:
        transport: the job spec's ``fabric.transport`` (``auto`` or ``rdma``: RDMA was expected).
        socket_fallback: the job spec's ``fabric.socket_fallback`` (``fail`` or ``warn``).
        hidden: host -> what in its environment hides the line (that node is not judged).
    """

    transport: str
    socket_fallback: str
    hidden: Mapping[str, str] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """Return the run record's ``transport`` fields (``used`` is added while the run is followed)."""
        return {
            "expected": "rdma",
            "fabric_transport": self.transport,
            "socket_fallback": self.socket_fallback,
            "not_judged": dict(self.hidden),
        }


def not_judged_notes(hidden: Mapping[str, str]) -> list[str]:
    """Return one note per reason the line is hidden, naming its nodes."""
    by_reason: dict[str, list[str]] = {}
    for host, why in hidden.items():
        by_reason.setdefault(why, []).append(host)
    return [
        f"fabric: the collectives' transport is not judged at run time on {', '.join(hosts)}: {why} hides "
        f'RCCL/NCCL\'s "Using network" line (leave NCCL_DEBUG/NCCL_DEBUG_SUBSYS to the launcher, or set '
        "NCCL_DEBUG=INFO)"
        for why, hosts in by_reason.items()
    ]


def fallback_line(host: str, transport: str) -> str:
    """Return the one line that names a node whose collectives use sockets where RDMA was expected."""
    return (
        f'{host}: {FALLBACK_PHRASE} (RCCL/NCCL: "Using network {SOCKET_NETWORK}") where RDMA was expected '
        f"(fabric.transport: {transport})"
    )


@dataclass
class TransportWatch:
    """Judges the networks the nodes report (``net_transport``) against the run's :class:`TransportCheck`."""

    check: TransportCheck
    used: dict[str, list[str]] = field(default_factory=dict)
    named: set[str] = field(default_factory=set)

    def observe(self, nodes: Mapping[str, contract.NodeStatus]) -> tuple[list[str], str]:
        """Take one poll's node states; return the lines to print now and the run's failure ('' if none).

        A node reporting ``Socket`` is named once: with ``socket_fallback: fail`` as the failure, with
        ``warn`` as a warning line.
        """
        lines: list[str] = []
        failure = ""
        for host, node in nodes.items():
            names = node.get("net_transport")
            if not isinstance(names, list) or not names:
                continue
            self.used[host] = [str(n) for n in names]
            if host in self.check.hidden or SOCKET_NETWORK not in names or host in self.named or failure:
                continue
            self.named.add(host)
            line = fallback_line(host, self.check.transport)
            if self.check.socket_fallback == "fail":
                failure = f"{line}; fabric.socket_fallback: fail"
            else:
                lines.append(f"warning: {line}; fabric.socket_fallback: warn: the run goes on")
        return lines, failure

    def record(self) -> dict[str, Any]:
        """Return the run record's ``transport`` fields: the expectation and what each node used."""
        return {**self.check.record(), "used": dict(self.used)}

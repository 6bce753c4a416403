"""Follow a started job: poll every node, show a live table, end on the first failure or Ctrl-C."""

from __future__ import annotations

import sys
import time
from typing import IO, TYPE_CHECKING, Any

from launcher.follow.telemetry import WarningOnce
from launcher.follow.verdict import Verdict
from launcher.follow.watchdog import HOLDING_STATES
from launcher.node import contract

if TYPE_CHECKING:
    import threading
    from collections.abc import Mapping

    from launcher.engine.job import Job
    from launcher.fabric.runtime import TransportWatch
    from launcher.follow.watchdog import ProgressWatch

# NODE: the node rank; RANKS: the global ranks of its trainer processes (a held one with its state letter)
COLUMNS = ("HOST", "NODE", "RANKS", "STATE", "STEP", "LOSS", "TOK/S", "ELAPSED", "ETA")


def _fmt(value: object, spec: str = "") -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float) and spec:
        return format(value, spec)
    return str(value)


def ranks_cell(node: contract.NodeStatus, node_rank: int, nproc: int | None = None) -> str:
    """Return a node's global ranks: ``2-3`` (from its node rank and ``nproc``) while its agent sees all of
    them running or reports none; else the ranks its agent sees, one stopped or in uninterruptible sleep with
    its state (``2,3:T``)."""
    first = node_rank * (nproc or 0)
    span = "-" if not nproc else str(first) if nproc == 1 else f"{first}-{first + nproc - 1}"
    watch = node.get("watch")
    seen = [r for r in (watch.get("ranks") or []) if isinstance(r, dict)] if isinstance(watch, dict) else []
    numbers = sorted(int(r["rank"]) for r in seen if str(r.get("rank", "")).isdigit())
    held = any(r.get("state") in HOLDING_STATES for r in seen)
    if not seen or (nproc and not held and numbers == list(range(first, first + nproc))):
        return span
    ranks = sorted(seen, key=lambda r: int(r["rank"]) if str(r.get("rank", "")).isdigit() else -1)
    return ",".join(
        f"{r.get('rank', '?')}" + (f":{r['state']}" if r.get("state") in HOLDING_STATES else "")
        for r in ranks
    )


def node_row(host: str, rank: int, node: contract.NodeStatus, nproc: int | None = None) -> tuple[str, ...]:
    """Return one table row for a node's agent status (``rank``: the node rank; ``nproc``: ranks per node)."""
    last = node.get("last_log") or {}
    step = f"{last['current_steps']}/{last.get('total_steps', '?')}" if "current_steps" in last else "-"
    state = str(node.get("state", "?"))
    if state == contract.FAILED and node.get("rc") is not None:
        state = f"{contract.FAILED}({node['rc']})"
    where = node.get("slurm_node")  # a rank of a login-host-only Slurm run: the node Slurm picked
    return (
        host if where in (None, host) else f"{host} ({where})",
        str(rank),
        ranks_cell(node, rank, nproc),
        state,
        step,
        _fmt(last.get("loss"), ".4f"),
        _fmt(last.get("throughput"), ".1f"),
        _fmt(last.get("elapsed_time")),
        _fmt(last.get("remaining_time")),
    )


def render_table(
    hosts: list[str], nodes: Mapping[str, contract.NodeStatus], nproc: int | None = None
) -> list[str]:
    """Return the lines of the node table (header first; ``nproc``: ranks per node, for nodes whose agent
    reports no running rank)."""
    rows = [COLUMNS] + [node_row(h, i, nodes.get(h, {}), nproc) for i, h in enumerate(hosts)]
    widths = [max(len(r[c]) for r in rows) for c in range(len(COLUMNS))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


class LiveView:
    """Redraws the table in place on a terminal; prints only changed rows otherwise (logs, CI)."""

    def __init__(self, run_id: str, out: IO[str] | None = None, nproc: int | None = None) -> None:
        self.out = out or sys.stdout
        self.run_id = run_id
        self.nproc = nproc
        self.tty = self.out.isatty()
        self._drawn = 0
        self._last: list[str] = []
        self._t0 = time.monotonic()

    def show(self, hosts: list[str], nodes: dict[str, contract.NodeStatus], verdict: Verdict) -> None:
        """Show one poll's table."""
        elapsed = int(time.monotonic() - self._t0)
        title = f"run {self.run_id}  {verdict.state}  {elapsed // 60:02d}:{elapsed % 60:02d}"
        lines = render_table(hosts, nodes, self.nproc)
        if self.tty:
            if self._drawn:
                self.out.write(f"\x1b[{self._drawn}F\x1b[J")
            self.out.write("\n".join([title, *lines]) + "\n")
            self._drawn = len(lines) + 1
        else:
            if not self._last:
                self.out.write(lines[0] + "\n")
            for old, new in zip([*self._last[1:], *([""] * len(lines))], lines[1:], strict=False):
                if old != new:
                    self.out.write(new + "\n")
            self._last = lines
        self.out.flush()


def queued(nodes: Mapping[str, contract.NodeStatus]) -> bool:
    """Return True while the job waits in Slurm's queue (every node shows ``pending(...)``)."""
    return bool(nodes) and all(str(n.get("state") or "").startswith(contract.PENDING) for n in nodes.values())


def follow(
    job: Job,
    *,
    interrupted: threading.Event,
    poll_interval_s: float,
    job_timeout_s: int = 0,
    out: IO[str] | None = None,
    watch: ProgressWatch | None = None,
    transport: TransportWatch | None = None,
) -> tuple[Verdict, dict[str, contract.NodeStatus]]:
    """Poll until the job ends, fails, stalls (``watch``: the progress watchdog) or is interrupted; return the
    verdict and the last node states. ``transport``: the collectives' transport is judged from what the nodes
    report (a node on sockets where RDMA was expected: one line; the run fails or goes on by policy).

    Stopping and collecting is left to the caller, which owns the run record.
    """
    nproc = job.run.record().nproc_per_node  # ranks per node (the table names each node's ranks)
    view = LiveView(job.run.run_id, out, nproc)
    started = time.monotonic()
    nodes: dict[str, contract.NodeStatus] = {}
    telemetry_warnings = WarningOnce()
    recorded: dict[str, Any] = {}
    restarts = 0  # a requeued Slurm job's restart count, as its nodes report it
    with job.polling(poll_interval_s) as poll:  # the ssh backend: one playbook for the whole follow
        while True:
            if interrupted.is_set():
                return Verdict("stopped", "interrupted (Ctrl-C)"), nodes
            t0 = time.monotonic()
            polled = poll()
            if interrupted.is_set():
                return Verdict("stopped", "interrupted (Ctrl-C)"), nodes or polled
            nodes = polled
            verdict = job.judge(nodes)
            lines, fell_back = transport.observe(nodes) if transport is not None else ([], "")
            if fell_back and verdict.state == "running":
                verdict = Verdict("failed", fell_back)
            elif (
                fell_back
            ):  # the run ended in this very poll: its verdict stands, the fall-back is still said
                lines.append(f"warning: {fell_back} (the run had ended: {verdict.state})")
            view.show(job.hosts, nodes, verdict)
            for line in [*telemetry_warnings.new_lines(nodes), *lines]:
                print(line, file=view.out, flush=True)
            job.run.update(
                nodes={h: {k: v for k, v in n.items() if k != "log_tail"} for h, n in nodes.items()}
            )
            if transport is not None and transport.record() != recorded:
                recorded = transport.record()
                job.run.update(transport=recorded)
            if verdict.state != "running":
                return verdict, nodes
            restarted = max(
                (n.get("restart") or 0 for n in nodes.values() if isinstance(n.get("restart"), int)),
                default=0,
            )
            if watch is not None and (queued(nodes) or restarted != restarts):
                watch.restart(time.monotonic())  # waiting in Slurm's queue, or starting over: no stall
            restarts = restarted
            stall = watch.observe(nodes, time.monotonic()) if watch is not None else None
            if stall is not None:
                job.run.update(stall=stall.as_dict())
                return Verdict("stalled", stall.reason), nodes
            if job_timeout_s and time.monotonic() - started > job_timeout_s:
                return Verdict("failed", f"job_s timeout of {job_timeout_s} s reached"), nodes
            interrupted.wait(max(0.0, poll_interval_s - (time.monotonic() - t0)))

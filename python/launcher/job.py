"""A started job: poll, judge, stop and collect it on every node; finalize its run directory.

Built from the run record alone, so ``status``, ``stop`` and ``logs`` use it after the launcher died.
"""

from __future__ import annotations

import json
import os
import tarfile
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from launcher.metrics import Summary, read_jsonl, summarize, write_metrics
from launcher.plot import plot_gpus, plot_loss
from launcher.runner import PlaybookResult, PlaybookRunner
from launcher.runs import FINAL_STATES, RunDir
from launcher.telemetry import after_fields, first_gpu_fault, gpu_series

RUNNING = ("starting", "running")
UNREACHABLE_LIMIT = 3  # consecutive polls without an answer before a node counts as vanished
# ... or this many seconds (and at least 2 polls) without an answer: a node cut off the network is given up
# quickly, so that the others are stopped within 30 s of the cut
UNREACHABLE_AFTER_S = 8.0
POLL_TIMEOUT_S = 8  # seconds a node has to answer one poll (poll.yml)


def agent_source() -> str:
    """Return the controller path of the node agent script (``mift_contract.py`` and ``mift_probe.py`` next
    to it)."""
    return str(resources.files("launcher") / "data" / "mift_agent.py")


@dataclass
class Verdict:
    """The job's state judged from one poll of every node."""

    state: str  # running | succeeded | failed | stopped
    reason: str = ""


@dataclass
class Judge:
    """Turns node states into a job state, remembering what needs memory (grace periods, missed polls)."""

    hosts: list[str]
    teardown_grace_s: float = 10.0
    first_abort_seen: dict[str, float] = field(default_factory=dict)
    missed_polls: dict[str, int] = field(default_factory=dict)
    first_missed: dict[str, float] = field(default_factory=dict)

    def __call__(  # noqa: PLR0911, PLR0912 - one return per way a job ends
        self, nodes: dict[str, dict[str, Any]], now: float | None = None
    ) -> Verdict:
        """Return the verdict for this poll's node states (host -> agent status)."""
        now = time.monotonic() if now is None else now
        master = nodes.get(self.hosts[0], {})
        master_done = bool(master.get("outputs_complete"))
        if fault := first_gpu_fault(self.hosts, nodes):  # a broken GPU fails the run as a dead trainer does
            return Verdict("failed", fault)
        settled: list[str] = []
        for host in self.hosts:
            node = nodes.get(host, {"state": "unreachable"})
            state = node.get("state")
            if state == "unreachable":
                self.missed_polls[host] = self.missed_polls.get(host, 0) + 1
                first = self.first_missed.setdefault(host, now)
                missed = self.missed_polls[host]
                if missed >= UNREACHABLE_LIMIT or (missed >= 2 and now - first >= UNREACHABLE_AFTER_S):
                    return Verdict("failed", f"{host}: unreachable for {missed} polls ({now - first:.0f} s)")
                continue
            self.missed_polls[host] = 0
            self.first_missed.pop(host, None)
            if state == "stopped":
                return Verdict("stopped", f"{host}: stopped")
            if state in ("vanished", "absent"):
                return Verdict("failed", f"{host}: trainer vanished")
            if state == "failed":
                if master_done and (node.get("teardown_abort") or host == self.hosts[0]):
                    settled.append(host)  # every rank finished training; a rank aborted at interpreter exit
                    continue
                if node.get("teardown_abort"):
                    first = self.first_abort_seen.setdefault(host, now)
                    if now - first < self.teardown_grace_s:
                        continue
                return Verdict("failed", f"{host}: trainer exited rc={node.get('rc')}")
            if state == "finished":
                settled.append(host)
        if len(settled) == len(self.hosts):
            if master_done:
                return Verdict("succeeded")
            missing = [k for k, v in (master.get("outputs") or {}).items() if not v]
            return Verdict(
                "failed", f"{self.hosts[0]}: trainers exited but output_dir lacks {', '.join(missing)}"
            )
        return Verdict("running")


def settled_notes(nodes: dict[str, dict[str, Any]]) -> list[str]:
    """Return warnings for nodes that ended non-zero although the job succeeded."""
    return [
        f"{h}: rc={n.get('rc')} after training finished (gloo teardown abort at exit, known on CPU)"
        for h, n in nodes.items()
        if n.get("state") == "failed"
    ]


class Job:
    """One run's nodes, reached through the run's own ansible-runner private data dir."""

    def __init__(self, run: RunDir, record: dict[str, Any] | None = None) -> None:
        self.run = run
        self.record = record or run.load()
        self.hosts: list[str] = list(self.record["hosts"])
        inventory = self.record.get("inventory")
        spec = self.record.get("spec", {})
        self.stop_grace_s = int(spec.get("timeouts", {}).get("stop_grace_s", 8))
        self.runner = PlaybookRunner(run.ansible_dir, inventory=Path(inventory) if inventory else None)
        self.node_judge = Judge(self.hosts, float(spec.get("timeouts", {}).get("teardown_grace_s", 10)))
        from launcher.backends import backend_of  # noqa: PLC0415 - the backends import this module

        self.backend = backend_of(self.record)
        self.judge = self.backend.judge(self)
        # the progress watchdog saw a stall: the stop dumps every trainer's stacks first (ssh backend)
        self.dump_stacks_on_stop = False

    @property
    def base_vars(self) -> dict[str, Any]:
        """Return the extra vars every run playbook takes."""
        return {"mift_hosts": ",".join(self.hosts), "mift_run_id": self.run.run_id}

    def poll(self) -> dict[str, dict[str, Any]]:
        """Return host -> the agent's status, through the run's backend."""
        return self.backend.poll(self)

    def stop(self) -> PlaybookResult:
        """Stop the trainer on every node through the run's backend (not interruptible)."""
        return self.backend.stop(self)

    def poll_nodes(self) -> dict[str, dict[str, Any]]:
        """Return host -> the agent's status (``state`` unreachable or absent when it gave none)."""
        result = self.runner.run(
            "poll",
            {**self.base_vars, "mift_poll_timeout_s": POLL_TIMEOUT_S},
            keep_events=False,
            ident="poll",
            timeout=60,
        )
        return nodes_from(result, self.hosts)

    def stop_nodes(self) -> PlaybookResult:
        """Stop the trainer on every node through its agent (not interruptible); return the result."""
        stop_vars = {**self.base_vars, "mift_stop_grace_s": self.stop_grace_s}
        if self.dump_stacks_on_stop:
            stop_vars["mift_stop_dump"] = True
        return self.runner.run("stop", stop_vars, cancellable=False, timeout=180)

    def collect(self) -> PlaybookResult:
        """Fetch node logs, state and metrics into ``nodes/<host>/`` through the run's backend (not
        interruptible).

        Each node's ``collect`` result (``mift_contract.CollectResult``) holds its ``status`` and ``outputs``.
        """
        self.run.nodes_dir.mkdir(exist_ok=True)
        result = self.backend.collect(self)
        for host in self.hosts:
            unpack_collected(self.run.nodes_dir / host)
        return result

    def collect_nodes(self) -> PlaybookResult:
        """Fetch every node's ``collect.tar.gz`` over ssh (collect.yml); the caller unpacks."""
        return self.runner.run(
            "collect",
            {**self.base_vars, "mift_collect_dir": str(self.run.nodes_dir)},
            cancellable=False,
            timeout=300,
        )

    def finalize(
        self, state: str, reason: str = "", nodes: dict[str, dict[str, Any]] | None = None
    ) -> Summary:
        """Collect, write metrics and the loss plot, record the final state; return the summary."""
        collected = self.collect()
        final_nodes = dict(nodes or {})
        outputs: dict[str, list[str]] = {}
        for host in self.hosts:
            report = collected.report(host, "collect")
            report = report if isinstance(report, dict) else {}
            status = report.get("status")
            if isinstance(status, dict) and "state" in status:
                final_nodes[host] = status
            files = report.get("outputs")
            outputs[host] = files if isinstance(files, list) else []
        master_dir = self.run.nodes_dir / self.hosts[0]
        log = read_jsonl(master_dir / "trainer_log.jsonl")
        try:
            results = json.loads((master_dir / "all_results.json").read_text())
        except (OSError, ValueError):
            results = {}
        summary = summarize(log, results if isinstance(results, dict) else {})
        write_metrics(log, self.run.path / "metrics.jsonl")
        plotted = plot_loss(summary.losses, self.run.path / "loss.png", f"{self.run.run_id} ({state})")
        gpu_plot = plot_gpus(
            gpu_series(self.run.nodes_dir, self.hosts),
            self.run.path / "gpu.png",
            f"{self.run.run_id} ({state})",
        )
        adapters = {
            h: str(Path(files[0]).parent)
            for h, files in (
                (h, [f for f in fs if f.endswith(("adapter_model.safetensors", "model.safetensors"))])
                for h, fs in outputs.items()
            )
            if files
        }
        notes = settled_notes(final_nodes) if state == "succeeded" else []
        gpu_after, gpu_notes = after_fields(collected, self.hosts)  # GPUs idle and healthy after the run
        self.run.update(
            nodes={h: _brief(n) for h, n in final_nodes.items()},
            summary={
                **summary.as_dict(),
                "loss_png": plotted,
                "gpu_png": gpu_plot,
                "adapter_dirs": adapters,
                "notes": notes + gpu_notes,
                "world_size": _world_size(final_nodes),
            },
            outputs=outputs,
            result_reason=reason,
            collect_rc=collected.rc,
            gpu_after=gpu_after,
        )
        self.run.set_status(state, reason)
        return summary


def nodes_from(result: PlaybookResult, hosts: list[str]) -> dict[str, dict[str, Any]]:
    """Return host -> the agent's status from a poll playbook's result (unreachable or absent when none)."""
    nodes: dict[str, dict[str, Any]] = {}
    for host in hosts:
        report = result.report(host, "status")
        if isinstance(report, dict) and "state" in report:
            nodes[host] = report
        elif host in result.unreachable:
            nodes[host] = {"state": "unreachable"}
        elif host in result.failures and _timed_out(result.failures[host]):
            nodes[host] = {"state": "unreachable", "error": result.failures[host]}  # poll.yml's timeout
        elif host in result.failures:
            nodes[host] = {"state": "absent", "error": result.failures[host]}
        else:
            nodes[host] = {"state": "unreachable"}
    return nodes


def _timed_out(failure: str) -> bool:
    """Return True for the failure of a task stopped by its ``timeout`` (ansible-core 2.19 and older)."""
    return "Timed out after" in failure or "expected time frame" in failure


def unpack_collected(host_dir: Path) -> None:
    """Unpack a node's ``collect.tar.gz`` (plain file names only) into ``host_dir`` and delete it."""
    archive = host_dir / "collect.tar.gz"
    if not archive.is_file():
        return
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar.getmembers():
                name = Path(member.name).name
                if not member.isfile() or name != member.name or name.startswith("."):
                    continue  # never a path out of host_dir, never a link
                source = tar.extractfile(member)
                if source is not None:
                    (host_dir / name).write_bytes(source.read())
    except (OSError, tarfile.TarError):
        return
    archive.unlink()


def _world_size(nodes: dict[str, dict[str, Any]]) -> int | None:
    sizes = [int(n["world_size"]) for n in nodes.values() if isinstance(n.get("world_size"), int)]
    return max(sizes) if sizes else None


def _brief(node: dict[str, Any]) -> dict[str, Any]:
    """Return a node status without the log tail (for the run record)."""
    return {k: v for k, v in node.items() if k != "log_tail"}


def launcher_alive(record: dict[str, Any]) -> bool:
    """Return True while the launcher process that follows this run is alive."""
    pid = record.get("launcher_pid")
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return b"launcher" in cmdline


def is_final(record: dict[str, Any]) -> bool:
    """Return True when the run record holds a final state."""
    return record.get("status") in FINAL_STATES

"""A started job: poll, judge, stop and collect it on every node; finalize its run directory.

Built from the run record alone, so ``status``, ``stop`` and ``logs`` use it after the launcher died.
"""

from __future__ import annotations

import contextlib
import json
import os
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.backends import backend_of
from launcher.backends.runner import PlaybookResult, make_runner
from launcher.engine.lease import LEASING_BACKENDS, release_argv, released
from launcher.follow.telemetry import after_fields, gpu_series
from launcher.follow.verdict import Judge, settled_notes
from launcher.node import contract
from launcher.rundir.failure_cause import find_cause, in_last_attempt, with_cause
from launcher.rundir.metrics import Summary, read_jsonl, summarize, write_metrics
from launcher.rundir.plot import plot_gpus, plot_loss
from launcher.rundir.runs import RunDir, RunRecord
from launcher.spec.jobspec import Timeouts

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


class Job:
    """One run's nodes, reached through the run's own ansible-runner private data dir."""

    def __init__(self, run: RunDir, record: RunRecord | None = None) -> None:
        self.run = run
        self.record = record or run.record()
        self.hosts: list[str] = list(self.record.hosts)
        inventory = self.record.inventory
        timeouts = Timeouts.model_validate(self.record.spec.get("timeouts") or {})  # the job spec's defaults
        self.stop_grace_s = timeouts.stop_grace_s
        self.runner = make_runner(run.ansible_dir, inventory=Path(inventory) if inventory else None)
        self.node_judge = Judge(self.hosts, float(timeouts.teardown_grace_s))
        self.backend = backend_of(self.record)
        self.judge = self.backend.judge(self)
        # the progress watchdog saw a stall: the stop dumps every trainer's stacks first (ssh backend)
        self.dump_stacks_on_stop = False

    @property
    def base_vars(self) -> dict[str, Any]:
        """Return the extra vars every run playbook takes."""
        return {"mift_hosts": ",".join(self.hosts), "mift_run_id": self.run.run_id}

    def poll(self) -> dict[str, contract.NodeStatus]:
        """Return host -> the agent's status, through the run's backend."""
        return self.backend.poll(self)

    @contextlib.contextmanager
    def polling(self, interval_s: float) -> Iterator[Callable[[], dict[str, contract.NodeStatus]]]:
        """Yield the poll of a follow that polls every ``interval_s`` seconds (the backend's poller: the ssh
        backend's runs one playbook for the whole follow); whatever polls between two polls ends with the
        block, however it ends."""
        poller = self.backend.poller(self, interval_s)
        try:
            yield poller.poll
        finally:
            poller.close()

    def stop(self) -> PlaybookResult:
        """Stop the trainer on every node through the run's backend (not interruptible)."""
        return self.backend.stop(self)

    def collect(self, *, release_lease: bool = False) -> PlaybookResult:
        """Fetch node logs, state and metrics into ``nodes/<host>/`` through the run's backend (not
        interruptible); ``release_lease``: then give the run's GPU lease back in the same playbook (the caller
        asks only where the run took one: :attr:`leased`).

        Each node's ``collect`` result (``mift_contract.CollectResult``) holds its ``status`` and ``outputs``.
        """
        self.run.nodes_dir.mkdir(exist_ok=True)
        lease_argv = release_argv(self.run.run_id) if release_lease else ()
        result = self.backend.collect(self, lease_argv=lease_argv)
        for host in self.hosts:
            unpack_collected(self.run.nodes_dir / host)
        return result

    @property
    def leased(self) -> bool:
        """Whether the run holds a GPU lease on its nodes (engine/lease.py: a backend that leases, and the
        run took one)."""
        return self.record.backend in LEASING_BACKENDS and bool(self.run.load().get("lease"))

    def finalize(
        self, state: str, reason: str = "", nodes: dict[str, contract.NodeStatus] | None = None
    ) -> Summary:
        """Collect (and give the GPU lease back), write metrics and the loss plot, record the final state;
        return the summary."""
        leased = self.leased
        collected = self.collect(release_lease=leased)
        final_nodes = dict(nodes or {})
        outputs: dict[str, list[str]] = {}
        for host in self.hosts:
            try:  # the node's answer, checked once here
                answer = contract.collect_result_from(collected.report(host, "collect"), f"{host}: collect")
            except contract.ContractError:
                outputs[host] = []  # no answer: the last poll's status stands
                continue
            final_nodes[host] = answer["status"]
            outputs[host] = answer["outputs"]
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
        # a failed trainer: the first rank's own exception, from the rank logs just collected
        cause = find_cause(self.run.path, self.hosts) if state == "failed" else None
        reason = with_cause(reason, cause, self.run.path)
        attempts = (
            {"attempts": in_last_attempt(self.run.load().get("attempts"), cause, self.run.path)}
            if cause
            else {}
        )
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
            failure_cause=cause.as_record() if cause else None,
            collect_rc=collected.rc,
            gpu_after=gpu_after,
            **({"lease_released": released(collected, self.hosts)} if leased else {}),
            **attempts,
        )
        self.run.set_status(state, reason)
        return summary


def unpack_collected(host_dir: Path) -> None:
    """Unpack a node's ``collect.tar.gz`` (plain file names only) into ``host_dir`` and delete it."""
    archive = host_dir / contract.COLLECT_ARCHIVE
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
                    os.utime(host_dir / name, (member.mtime, member.mtime))  # when the node wrote it
    except (OSError, tarfile.TarError):
        return
    archive.unlink()


def _world_size(nodes: dict[str, contract.NodeStatus]) -> int | None:
    sizes = [w for n in nodes.values() if isinstance(w := n.get("world_size"), int)]
    return max(sizes) if sizes else None


def _brief(node: contract.NodeStatus) -> dict[str, Any]:
    """Return a node status without the log tail (for the run record)."""
    return {k: v for k, v in node.items() if k != "log_tail"}


def launcher_alive(record: RunRecord) -> bool:
    """Return True while the launcher process that follows this run is alive."""
    pid = record.launcher_pid
    if pid is None:
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


def is_final(record: RunRecord) -> bool:
    """Return True when the run record holds a final state."""
    return record.final

"""The ``ssh`` backend: the launcher starts and stops the node agent on every node itself (over ssh)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

from launcher.backends.agent import collect_agents, poll_agents, stop_agents
from launcher.backends.agent_stream import AgentStream
from launcher.backends.base import Backend, Handle, recovery_or_note
from launcher.backends.ssh_stream import STREAM_FROM_NODES, SshStream
from launcher.node import contract

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from pathlib import Path
    from typing import IO

    from launcher.backends.base import RunNodes
    from launcher.backends.runner import PlaybookResult, PlaybookRunner
    from launcher.engine.plan import RunPlan
    from launcher.follow.verdict import Verdict
    from launcher.rundir.runs import RunDir
    from launcher.spec.jobspec import JobSpec


@dataclasses.dataclass(frozen=True)
class SshHandle(Handle):
    """An ssh run's handle: nothing beyond the run's hosts and inventory, which the record has anyway."""

    kind: ClassVar[str] = "ssh"
    backend: ClassVar[str] = "ssh"


class SshBackend(Backend):
    """Start through playbooks/launch.yml, poll through poll.yml (a follow: poll_stream.yml; of many nodes:
    one ssh session per node, ssh_stream.py), stop through stop.yml."""

    name: ClassVar[str] = "ssh"

    def __init__(self, handle: SshHandle | None = None) -> None:
        self.handle = handle or SshHandle()

    @classmethod
    def inventory_fields(cls, inventory: Mapping[str, Any], where: str) -> dict[str, Any]:
        """Nothing: the job's hosts are the inventory's nodes."""
        del inventory, where
        return {}

    @classmethod
    def takes(cls, spec: JobSpec) -> bool:
        """Every job that names its nodes (not ``slurm.shared_dir``: Slurm would pick them)."""
        return not spec.slurm.login_only

    @classmethod
    def prepare(
        cls, spec: JobSpec, chosen: Mapping[str, Any], where: Path, run_id: str, *, resume: bool
    ) -> SshHandle:
        """Return the (empty) handle."""
        del spec, chosen, where, run_id, resume
        return SshHandle()

    @classmethod
    def from_handle(cls, handle: Handle) -> SshBackend:
        """Return the backend of an ssh run."""
        assert isinstance(handle, SshHandle)
        return cls(handle)

    @classmethod
    def recovery(cls, spec: JobSpec, where: Path, *, detach: bool, out: IO[str]) -> bool:
        """The launcher retries failed attempts while it follows the run (not ``--detach``)."""
        why = "a detached run is not followed: nobody restarts it" if detach else ""
        return recovery_or_note(spec, where, why, out)

    def start(
        self, runner: PlaybookRunner, run: RunDir, plan: RunPlan, launch_vars: Mapping[str, Any]
    ) -> PlaybookResult:
        """Run the launch playbook: every node's agent starts its trainer."""
        del run  # the launch playbook reads the bundles named in launch_vars
        return runner.run("launch", dict(launch_vars), timeout=plan.spec.timeouts.start_s)

    def started(self, plan: RunPlan) -> tuple[str, str]:
        """Nothing more to say; the plan's MASTER_ADDR."""
        return "", plan.master_addr

    def poll(self, job: RunNodes) -> dict[str, contract.NodeStatus]:
        """Ask every node's agent."""
        return poll_agents(job)

    def poller(self, job: RunNodes, interval_s: float) -> AgentStream | SshStream:
        """Ask every node's agent through one playbook for the whole follow (poll_stream.yml); from
        STREAM_FROM_NODES nodes on through one ssh session per node (backends/ssh_stream.py)."""
        if len(job.hosts) >= STREAM_FROM_NODES:
            return SshStream(job, interval_s)
        return AgentStream(job, interval_s)

    def judge(self, job: RunNodes) -> Callable[[dict[str, contract.NodeStatus]], Verdict]:
        """The node judge: the first failed node ends the run."""
        return job.node_judge

    def stop(self, job: RunNodes) -> PlaybookResult:
        """Stop every node's trainer through its agent."""
        return stop_agents(job)

    def collect(self, job: RunNodes, *, lease_argv: Sequence[str] = ()) -> PlaybookResult:
        """Fetch every node's logs, state and metrics."""
        return collect_agents(job, lease_argv=lease_argv)

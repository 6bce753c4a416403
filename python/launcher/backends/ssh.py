"""The ``ssh`` backend: the launcher starts and stops the node agent on every node itself (over ssh)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.backends.agent import collect_agents, poll_agents, stop_agents

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from launcher.engine.plan import RunPlan
    from launcher.job import Job
    from launcher.runner import PlaybookResult, PlaybookRunner
    from launcher.runs import RunDir
    from launcher.verdict import Verdict


class SshBackend:
    """Start through playbooks/launch.yml, poll through poll.yml, stop through stop.yml."""

    name = "ssh"

    def start(
        self, runner: PlaybookRunner, run: RunDir, plan: RunPlan, launch_vars: Mapping[str, Any]
    ) -> PlaybookResult:
        """Run the launch playbook: every node's agent starts its trainer."""
        del run  # the launch playbook reads the bundles named in launch_vars
        return runner.run("launch", dict(launch_vars), timeout=plan.spec.timeouts.start_s)

    def poll(self, job: Job) -> dict[str, dict[str, Any]]:
        """Ask every node's agent."""
        return poll_agents(job)

    def judge(self, job: Job) -> Callable[[dict[str, dict[str, Any]]], Verdict]:
        """The node judge: the first failed node ends the run."""
        return job.node_judge

    def stop(self, job: Job) -> PlaybookResult:
        """Stop every node's trainer through its agent."""
        return stop_agents(job)

    def collect(self, job: Job) -> PlaybookResult:
        """Fetch every node's logs, state and metrics."""
        return collect_agents(job)

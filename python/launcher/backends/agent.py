"""The node agent over Ansible, for every backend that reaches the nodes: poll its status, stop its trainer,
fetch what it collected (playbooks/poll.yml, stop.yml, collect.yml, run through the run's own runner)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.node import contract

if TYPE_CHECKING:
    from collections.abc import Sequence

    from launcher.backends.base import RunNodes
    from launcher.backends.runner import PlaybookResult
    from launcher.engine.lease import LeaseRequest
    from launcher.engine.plan import RunPlan
    from launcher.rundir.runs import RunDir

POLL_TIMEOUT_S = 8  # seconds a node has to answer one poll (poll.yml)
START_WAIT_S = 30  # seconds the agent's start waits for the trainer to come up (launch.yml)


def launch_vars(run: RunDir, plan: RunPlan, lease: LeaseRequest | None = None) -> dict[str, Any]:
    """Return the extra vars of the playbook that gives every node the agent and its bundle (launch.yml, and
    the Slurm backends' prepare playbooks); ``lease``: the GPU lease it takes first (launch.yml)."""
    return {
        "mift_hosts": ",".join(plan.facts.hosts),
        "mift_run_id": run.run_id,
        "mift_files_dir": str(run.files_dir),
        "mift_stop_grace_s": plan.spec.timeouts.stop_grace_s,
        "mift_start_wait_s": START_WAIT_S,
        **(lease.extravars() if lease is not None else {}),
    }


def poll_agents(job: RunNodes) -> dict[str, contract.NodeStatus]:
    """Return host -> the agent's status (``state`` unreachable or absent when it gave none)."""
    result = job.runner.run(
        "poll",
        {**job.base_vars, "mift_poll_timeout_s": POLL_TIMEOUT_S},
        keep_events=False,
        ident="poll",
        timeout=60,
    )
    return nodes_from(result, job.hosts)


def stop_agents(job: RunNodes) -> PlaybookResult:
    """Stop the trainer on every node through its agent (not interruptible); return the result."""
    stop_vars = {**job.base_vars, "mift_stop_grace_s": job.stop_grace_s}
    if job.dump_stacks_on_stop:
        stop_vars["mift_stop_dump"] = True
    return job.runner.run("stop", stop_vars, cancellable=False, timeout=180)


def collect_agents(job: RunNodes, *, lease_argv: Sequence[str] = ()) -> PlaybookResult:
    """Fetch every node's ``collect.tar.gz`` over ssh (collect.yml); ``Job.collect`` (launcher/engine/job.py)
    unpacks. ``lease_argv``: the node program's ``lease`` arguments, run after the collect (the GPU lease
    given back by the run's finish)."""
    lease = {"mift_lease_argv": list(lease_argv)} if lease_argv else {}
    return job.runner.run(
        "collect",
        {**job.base_vars, "mift_collect_dir": str(job.run.nodes_dir), **lease},
        cancellable=False,
        timeout=300,
    )


def nodes_from(result: PlaybookResult, hosts: list[str]) -> dict[str, contract.NodeStatus]:
    """Return host -> the agent's status from a poll playbook's result (unreachable or absent when none).

    Each answer is checked here (:func:`mift_contract.node_status_from`); one that is not a status counts as
    no answer."""
    nodes: dict[str, contract.NodeStatus] = {}
    for host in hosts:
        try:
            nodes[host] = contract.node_status_from(result.report(host, "status"), host)
            continue
        except contract.ContractError:
            pass
        if host in result.unreachable:
            nodes[host] = {"state": contract.UNREACHABLE}
        elif host in result.failures and timed_out(result.failures[host]):  # poll.yml's timeout
            nodes[host] = {"state": contract.UNREACHABLE, "error": result.failures[host]}
        elif host in result.failures:
            nodes[host] = {"state": contract.ABSENT, "error": result.failures[host]}
        else:
            nodes[host] = {"state": contract.UNREACHABLE}
    return nodes


def timed_out(failure: str) -> bool:
    """Return True for the failure of a task stopped by its ``timeout`` (ansible-core 2.19 and older)."""
    return "Timed out after" in failure or "expected time frame" in failure

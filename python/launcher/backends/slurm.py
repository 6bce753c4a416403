"""The ``slurm`` backend: the same run handed to Slurm.

Start: check the request against the partition (``sinfo`` on the login host; one line and nothing
submitted when it cannot fit), give every node the agent and its bundle without starting anything
(launch.yml with the agent's ``prepare``), then ``sbatch`` on the login host (playbooks/slurm_submit.yml):
one task per node, each ``mift_node.pyz agent slurm-step`` under ``srun --kill-on-bad-exit=1``, with
``NODE_RANK`` from ``SLURM_NODEID`` and ``MASTER_ADDR`` from the allocation (the agent sets them).
Poll: the nodes' agents (as ssh) and ``scontrol show job`` on the login host (playbooks/slurm_poll.yml);
Slurm's job state decides how the run ended. Stop: ``scancel``, then the agent's stop on every node
(playbooks/slurm_stop.yml), which checks that nothing is left.
Recovery: the batch script requeues (node failure, preemption, the time limit; the job spec's ``recovery``
policy, :func:`launcher.backends.slurm_script.requeue_for`) and each restart resumes from the last checkpoint
complete on every node; each poll records a restart Slurm reports as an attempt (:func:`record_requeues`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, ClassVar

from launcher.backends.agent import POLL_TIMEOUT_S, collect_agents, nodes_from
from launcher.backends.base import HANDLE_KEY, Backend, Handle, PollEach
from launcher.backends.slurm_script import (
    ENDED_BADLY,
    QUEUED,
    Allocation,
    SlurmJob,
    budget_words,
    check_request,
    parse_sinfo,
    requeue_for,
    requeue_refusal,
    requeue_too_early,
    requeued_attempts,
    sbatch_script,
)
from launcher.exceptions import ConfigurationError
from launcher.follow.verdict import Verdict, first_cause
from launcher.node import contract
from launcher.spec.inventory import group_members, inventory_var
from launcher.spec.nodelayout import layout

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from pathlib import Path
    from typing import IO

    from launcher.backends.base import RunNodes
    from launcher.backends.runner import PlaybookResult, PlaybookRunner
    from launcher.engine.plan import RunPlan
    from launcher.rundir.runs import RunDir
    from launcher.spec.jobspec import JobSpec

# the inventory variable naming the host where sbatch, scontrol and scancel run, else the first host of:
LOGIN_VAR = "mift_slurm_login_host"
LOGIN_GROUPS = ("slurm_login", "slurm_controller")


def login_host(inventory_vars: Mapping[str, Any], groups: Mapping[str, list[str]], where: str) -> str:
    """Return the login host from the inventory (``mift_slurm_login_host``, else the first host of
    ``slurm_login`` or ``slurm_controller``); raise ConfigurationError when there is none."""
    named = inventory_vars.get(LOGIN_VAR)
    if isinstance(named, str) and named:
        return named
    for group in LOGIN_GROUPS:
        if groups.get(group):
            return groups[group][0]
    raise ConfigurationError(
        f"{where}: backend slurm: no login host (set {LOGIN_VAR} or put one host in group "
        f"{' or '.join(LOGIN_GROUPS)})"
    )


def run_root(shared_dir: str, run_id: str) -> str:
    """Return a login-host-only run's folder on the shared file system (the ranks' run directories)."""
    return f"{shared_dir.rstrip('/')}/{run_id}"


@dataclasses.dataclass(frozen=True)
class SlurmHandle(Handle):
    """A Slurm run's handle: the login host where sbatch, scontrol and scancel run; the job id once
    submitted."""

    kind: ClassVar[str] = "slurm"
    backend: ClassVar[str] = "slurm"

    login_host: str
    job_id: str | None = None

    def slurm_fields(self) -> dict[str, Any]:
        """Return the record's ``slurm`` fields the handle sets (the job's state is the backend's)."""
        return {"login_host": self.login_host}

    def record_fields(self) -> dict[str, Any]:
        """Return the record's fields: the handle, and its fields in ``slurm`` (``status``, ``list``)."""
        return {**super().record_fields(), "slurm": self.slurm_fields()}


@dataclasses.dataclass(frozen=True)
class SharedSlurmHandle(Handle):
    """A login-host-only Slurm run's handle (job spec ``slurm.shared_dir``): the login host, the run's folder
    on the shared file system, how many nodes Slurm picks; the job id once submitted."""

    kind: ClassVar[str] = "slurm_shared"
    backend: ClassVar[str] = "slurm"

    login_host: str
    shared_dir: str
    run_root: str
    nodes: int
    job_id: str | None = None

    @classmethod
    def of(cls, spec: JobSpec, login: str, run_id: str) -> SharedSlurmHandle:
        """Return the handle of run ``run_id`` of ``spec`` (which sets ``slurm.shared_dir``)."""
        assert spec.slurm.shared_dir is not None and spec.slurm.nodes is not None
        shared = spec.slurm.shared_dir
        return cls(login, shared, run_root(shared, run_id), spec.slurm.nodes)

    def slurm_fields(self) -> dict[str, Any]:
        """Return the record's ``slurm`` fields the handle sets (the job's state is the backend's)."""
        return {
            "login_host": self.login_host,
            "shared_dir": self.shared_dir,
            "run_root": self.run_root,
            "nodes": self.nodes,
        }

    def record_fields(self) -> dict[str, Any]:
        """Return the record's fields: the handle, and its fields in ``slurm`` (``status``, ``list``)."""
        return {**super().record_fields(), "slurm": self.slurm_fields()}


class SlurmBackend(Backend):
    """Submit with sbatch, follow with scontrol and the node agents, stop with scancel."""

    name: ClassVar[str] = "slurm"

    def __init__(self, handle: SlurmHandle | SharedSlurmHandle) -> None:
        self.handle = handle
        self.login = handle.login_host
        self.job_id = handle.job_id
        self.last: SlurmJob | None = None

    @classmethod
    def inventory_fields(cls, inventory: Mapping[str, Any], where: str) -> dict[str, Any]:
        """Return the login host (bad input raises ConfigurationError, one line)."""
        data = dict(inventory)
        login = login_host({LOGIN_VAR: inventory_var(data, LOGIN_VAR)}, group_members(data), where)
        return {"slurm": {"login_host": login}}

    @classmethod
    def takes(cls, spec: JobSpec) -> bool:
        """Every job: nodes the inventory names, or (``slurm.shared_dir``) nodes Slurm picks."""
        del spec
        return True

    @classmethod
    def prepare(
        cls, spec: JobSpec, chosen: Mapping[str, Any], where: Path, run_id: str, *, resume: bool
    ) -> SlurmHandle | SharedSlurmHandle:
        """Return the handle: the login host; with ``slurm.shared_dir`` also the run's shared folder."""
        login = str(chosen["slurm"]["login_host"])
        if not spec.slurm.login_only:
            return SlurmHandle(login)
        if resume:
            raise ConfigurationError(f"{where}: run --resume: not supported with slurm.shared_dir yet")
        return SharedSlurmHandle.of(spec, login, run_id)

    @classmethod
    def from_handle(cls, handle: Handle) -> SlurmBackend:
        """Return the backend of a Slurm run (its login host and job id)."""
        assert isinstance(handle, SlurmHandle)
        return cls(handle)

    @classmethod
    def recovery(cls, spec: JobSpec, where: Path, *, detach: bool, out: IO[str]) -> bool:
        """Slurm recovers by requeueing the batch job (docs/slurm.md "Requeue"); the launcher only records
        the attempts, so it never retries itself (returns False), followed or not. A policy Slurm cannot
        follow is refused in one line when the job spec names it, else noted as off."""
        del detach
        early = requeue_too_early(spec)
        if early:
            raise ConfigurationError(f"{where}: {early}")
        if spec.recovery.spares is not None:  # nothing would use them: refused, not ignored
            raise ConfigurationError.at(
                where,
                "recovery.spares",
                "spare nodes replace a lost node over ssh only; under Slurm the scheduler places the nodes "
                "(a requeued job runs again on its allocation's nodes): leave recovery.spares out",
                "recovery",
            )
        why = requeue_refusal(spec)
        if why and "recovery" in spec.model_fields_set:
            raise ConfigurationError.at(
                where, "recovery", f"{why}; or set recovery.max_restarts: 0", "recovery"
            )
        if why:
            print(f"note: recovery off: {why}; the first failure ends the run", file=out)
        requeue = requeue_for(spec)
        if requeue is not None:
            limit = f", {requeue.before_s} s before its time limit" if requeue.before_s else ""
            print(
                f"recovery: Slurm requeues the job on node failure and preemption{limit}, up to "
                f"{requeue.max_restarts} times; each restart resumes from the last checkpoint complete on "
                "every node",
                file=out,
            )
        return False

    def started(self, plan: RunPlan) -> tuple[str, str]:
        """Say the job id; the allocation's first node is the MASTER_ADDR (the agent's slurm-step sets it)."""
        del plan
        return f"submitted as slurm job {self.job_id} on {self.login}", "<the allocation's first node>"

    # --- start -------------------------------------------------------------------------------------------
    def allocation(self, plan: RunPlan) -> Allocation:
        """Return what the batch script asks for."""
        spec, facts = plan.spec, plan.facts
        gpus = spec.slurm.gpus_per_node
        if gpus is None:
            gpus = facts.nproc_per_node if facts.gpus else 0
        return Allocation(
            run_id=plan.run_id,
            run_dir=layout().run_dir(plan.run_id),
            nodes=tuple(facts.hosts),
            gpus_per_node=int(gpus),
            stop_grace_s=spec.timeouts.stop_grace_s,
            options=spec.slurm,
            requeue=requeue_for(spec),
        )

    def check(self, runner: PlaybookRunner, alloc: Allocation, where: str) -> str:
        """Ask sinfo on the login host; raise ConfigurationError (one line) when the request cannot fit.
        Returns the partition's name."""
        probe = runner.run("slurm_probe", {"mift_slurm_login": self.login}, timeout=120)
        answer = probe.report(self.login, "sinfo") or {}
        if not probe.ok or not isinstance(answer, dict) or answer.get("rc") != 0:
            why = probe.failures.get(self.login) or (answer or {}).get("stderr") or f"rc={probe.rc}"
            raise ConfigurationError(f"{self.login}: sinfo failed: {str(why).strip().splitlines()[-1]}")
        partitions = parse_sinfo(str(answer.get("stdout", "")))
        return check_request(partitions, alloc.options, len(alloc.nodes), alloc.gpus_per_node, where).name

    def start(
        self, runner: PlaybookRunner, run: RunDir, plan: RunPlan, launch_vars: Mapping[str, Any]
    ) -> PlaybookResult:
        """Check the partition, prepare every node, submit; return the nodes' and the login host's results."""
        alloc = self.allocation(plan)
        partition = self.check(runner, alloc, run.record().spec_path or plan.run_id)
        prepared = self.ship(runner, plan, launch_vars)
        if not prepared.ok:
            return prepared
        script = sbatch_script(alloc)
        (run.path / "job.sbatch").write_text(script)
        submitted = runner.run(
            "slurm_submit",
            {
                "mift_slurm_login": self.login,
                "mift_run_id": plan.run_id,
                "mift_sbatch_script": script,
                **self.extra_vars,
            },
            cancellable=False,  # a submitted job must be known, so that stop can cancel it
            timeout=120,
        )
        answer = submitted.report(self.login, "submit") or {}
        self.job_id = str(answer.get("job_id") or "") or None
        self.handle = dataclasses.replace(self.handle, job_id=self.job_id)
        run.update(
            **{HANDLE_KEY: self.handle.stored()},
            slurm={
                **(run.load().get("slurm") or {}),
                "login_host": self.login,
                "job_id": self.job_id,
                "partition": partition,
                "gpus_per_node": alloc.gpus_per_node,
                # None: never requeued (--no-requeue); else how many restarts the batch script allows
                "max_restarts": alloc.requeue.max_restarts if alloc.requeue else None,
                "state": "SUBMITTED" if self.job_id else "NOT SUBMITTED",
            },
        )
        failures = dict(submitted.failures)
        if not self.job_id and not failures:
            failures[self.login] = f"sbatch: {str(answer.get('stderr') or 'no job id').strip()}"
        return dataclasses.replace(
            prepared,
            rc=submitted.rc if failures else prepared.rc,
            failures={**prepared.failures, **failures},
        )

    def ship(self, runner: PlaybookRunner, plan: RunPlan, launch_vars: Mapping[str, Any]) -> PlaybookResult:
        """Give every node the agent and its bundle without starting anything (the agent's ``prepare``)."""
        return runner.run(
            "launch", {**launch_vars, "mift_agent_command": "prepare"}, timeout=plan.spec.timeouts.start_s
        )

    @property
    def extra_vars(self) -> dict[str, Any]:
        """Return the extra vars the run's Slurm playbooks take besides the job's (the login-host-only mode
        adds the shared run folder)."""
        return {"mift_slurm_login": self.login, "mift_slurm_job_id": self.job_id or ""}

    # playbooks that reach the nodes (ssh) or, in the login-host-only mode, only the login host
    POLL_PLAYBOOK = "slurm_poll"
    STOP_PLAYBOOK = "slurm_stop"

    # --- poll --------------------------------------------------------------------------------------------
    def poll(self, job: RunNodes) -> dict[str, contract.NodeStatus]:
        """Ask the node agents and slurmctld; a queued job shows its reason as every node's state."""
        result = job.runner.run(
            self.POLL_PLAYBOOK,
            {**job.base_vars, "mift_poll_timeout_s": POLL_TIMEOUT_S, **self.extra_vars},
            keep_events=False,
            ident="poll",
            timeout=60,
        )
        nodes = nodes_from(result, job.hosts)
        answer = result.report(self.login, "slurm")
        if isinstance(answer, dict):
            self.last = SlurmJob.from_scontrol(
                str(self.job_id),
                int(answer.get("rc", 1)),
                str(answer.get("stdout", "")),
                str(answer.get("stderr", "")),
            )
        else:
            self.last = SlurmJob(str(self.job_id), "UNKNOWN", f"{self.login}: no answer")
        slurm = dict(job.run.load().get("slurm") or {})
        slurm.update(state=self.last.state, reason=self.last.reason, exit_code=self.last.exit_code)
        if self.last.restarts:
            slurm["restarts"] = self.last.restarts
        job.run.set_slurm(slurm)
        record_master(job.run, nodes)
        record_requeues(job.run, self.last, nodes)
        if self.last.state in QUEUED:  # queued first, or again after a requeue
            shown = f"{contract.PENDING}({self.last.reason})" if self.last.reason else contract.PENDING
            nodes = {h: {**n, "state": shown} for h, n in nodes.items()}
        return nodes

    def poller(self, job: RunNodes, interval_s: float) -> PollEach:
        """One poll playbook a poll: each also asks slurmctld on the login host."""
        del interval_s  # the follow waits between two polls
        return PollEach(lambda: self.poll(job))

    def judge(self, job: RunNodes) -> Callable[[dict[str, contract.NodeStatus]], Verdict]:
        """Slurm's job state decides; the nodes say which trainer failed first, and whether a completed
        job left its outputs."""

        def verdict(nodes: dict[str, contract.NodeStatus]) -> Verdict:
            last = self.last
            if last is None or last.state not in ENDED_BADLY | {"COMPLETED", "GONE"}:
                return Verdict("running")
            if last.state == "COMPLETED":
                return job.node_judge(nodes)
            if last.state == "CANCELLED" and job.run.record().slurm.get("cancelled_by_launcher"):
                return Verdict("stopped", f"{last.describe()}: cancelled by `launcher stop`")
            first = first_failure(nodes)
            budget = budget_words(last, job.run.record().slurm.get("max_restarts"))
            return Verdict(
                "failed",
                last.describe()
                + (f"; first failure: {first}" if first else "")
                + (f"; {budget}" if budget else ""),
            )

        return verdict

    # --- stop --------------------------------------------------------------------------------------------
    def stop(self, job: RunNodes) -> PlaybookResult:
        """scancel the job (when it was submitted), then stop and check every node through its agent."""
        if self.last is None or self.last.state not in ENDED_BADLY | {"COMPLETED", "GONE"}:
            slurm = dict(job.run.load().get("slurm") or {})  # the job may still run: this scancel ends it
            slurm["cancelled_by_launcher"] = True
            job.run.set_slurm(slurm)
        return job.runner.run(
            self.STOP_PLAYBOOK,
            {**job.base_vars, "mift_stop_grace_s": job.stop_grace_s, **self.extra_vars},
            cancellable=False,
            timeout=180,
        )

    def collect(self, job: RunNodes, *, lease_argv: Sequence[str] = ()) -> PlaybookResult:
        """Fetch every node's logs, state and metrics (over ssh, as the ssh backend)."""
        return collect_agents(job, lease_argv=lease_argv)


def record_master(run: RunDir, nodes: Mapping[str, contract.NodeStatus]) -> None:
    """Put the rendezvous address the allocation gave the trainers (the allocation's first node, which a
    node's ``slurm-step`` reports) in the run's record, in place of the plan's: Slurm picked it."""
    placed = next((str(n["master_addr"]) for n in nodes.values() if n.get("master_addr")), None)
    record = run.load()
    if placed is None or record.get("master_addr") == placed:
        return
    node_env = {h: {**env, "MASTER_ADDR": placed} for h, env in (record.get("node_env") or {}).items()}
    run.update(master_addr=placed, node_env=node_env)


def record_requeues(run: RunDir, last: SlurmJob, nodes: Mapping[str, contract.NodeStatus]) -> None:
    """Keep one attempt per start of a requeued job in the run's record: Slurm's restart count, why each
    attempt ended (the batch output on the node that ran the batch script) and the step each restart resumed
    from (its nodes' state)."""
    record = run.record()
    max_restarts = record.slurm.get("max_restarts")
    attempts = record.data.get("attempts")
    if max_restarts is None or not isinstance(attempts, list) or last.state in ("UNKNOWN", "GONE"):
        return
    causes: dict[str, str] = {}
    resumed: dict[int, int | None] = {}
    for node in nodes.values():
        causes.update(node.get("requeues") or {})
        restart = node.get("restart")
        if isinstance(restart, int) and restart > 0:
            step = node.get("resume_step")
            resumed[restart] = step if isinstance(step, int) else None
    updated = requeued_attempts(attempts, last.restarts, causes, resumed, int(max_restarts), time.time())
    if updated != attempts:
        run.set_attempts(updated)


def first_failure(nodes: Mapping[str, contract.NodeStatus]) -> str:
    """Return ``host: trainer exited rc=N`` for the node whose failure caused the others' (``first_cause``;
    '' when none failed); a node that recorded why (the in-allocation preflight) says that instead, and a
    rank its Slurm node."""
    failed = sorted(
        h for h, n in nodes.items() if n.get("state") == contract.FAILED and n.get("rc") not in (0, None)
    )
    if not failed:
        return ""
    host = first_cause(failed, nodes)
    node = nodes[host]
    where = host if node.get("slurm_node") in (None, host) else f"{host} ({node['slurm_node']})"
    reason = node.get("reason") or f"trainer exited rc={node.get('rc')}"
    return f"{where}: {reason}"

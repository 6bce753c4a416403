"""The ``slurm`` backend with only the login host in the inventory (job spec ``slurm.shared_dir``).

Real Slurm clusters mount a shared file system (NFS, Lustre, GPFS) at the same path on the login host and on
every compute node, and their compute nodes are often not reachable from outside. So in this mode the launcher
reaches the login host alone:

* plan: preflight runs on the login host (its stack and GPU facts stand in for the nodes'); the job's
  ``slurm.nodes`` nodes are named by rank (``rank0``, ``rank1``, ...), Slurm picks them (no ``--nodelist``);
* start: the request checked against the partition (``sinfo``, as always), then the agent,
  ``expect.json`` (what the plan was made for) and every rank's bundle written through the login host into
  the run's shared folder ``<shared_dir>/<run_id>/`` (playbooks/slurm_shared_prepare.yml), then ``sbatch``:
  each node first checks itself (the agent's ``slurm-check``: a node that cannot run its rank ends the job
  with its reason), then runs ``slurm-step`` in ``rank<SLURM_NODEID>/``;
* poll, collect: the ranks' state files and logs read on the login host (playbooks/slurm_shared_poll.yml,
  slurm_shared_collect.yml), Slurm's job state from ``scontrol`` as always;
* stop: ``scancel``, wait until ``squeue`` no longer shows the job (Slurm ends every process of its
  steps), then the ranks still marked active are recorded stopped (playbooks/slurm_shared_stop.yml).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from launcher.backends.slurm import SharedSlurmHandle, SlurmBackend, run_root
from launcher.preflight.checks import GIB, NodeFacts
from launcher.spec.nodelayout import layout

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from launcher.backends.base import Handle, Preflight, RunNodes
    from launcher.backends.runner import PlaybookResult, PlaybookRunner
    from launcher.backends.slurm_script import Allocation
    from launcher.engine.plan import RunPlan
    from launcher.preflight.checks import NodePath
    from launcher.spec.jobspec import JobSpec


def rank_names(nodes: int) -> list[str]:
    """Return the names the launcher gives a login-host-only job's nodes: ``rank0`` ... (Slurm picks them)."""
    return [f"rank{i}" for i in range(nodes)]


def record_fields(spec: JobSpec, login: str, run_id: str) -> dict[str, Any]:
    """Return the run record's ``slurm`` fields of a login-host-only run (its handle's)."""
    return SharedSlurmHandle.of(spec, login, run_id).slurm_fields()


def preflight_spec(spec: JobSpec, login: str) -> JobSpec:
    """Return the spec preflight runs with: on the login host (the only host the launcher reaches)."""
    return spec.model_copy(update={"hosts": [login]})


def preflight_output_dir(spec: JobSpec, run_id: str) -> str:
    """Return where rank 0's outputs go (absolute: preflight checks the shared file system's free space)."""
    assert spec.slurm.shared_dir is not None
    output_dir = spec.node_output_dir(run_id)
    if output_dir.startswith("/"):
        return output_dir
    return f"{run_root(spec.slurm.shared_dir, run_id)}/rank0/{output_dir}"


def rank_facts(login_facts: NodeFacts, nodes: int) -> NodeFacts:
    """Return the facts the plan is made from: the login host's, once per rank.

    The ranks' train addresses are unknown until Slurm allocates them (the agent's ``slurm-step`` sets
    ``MASTER_ADDR`` from the allocation), and each node proves in the allocation that it matches these facts
    (the agent's ``slurm-check``).
    """
    login = login_facts.master
    ranks = rank_names(nodes)

    def each(values: Mapping[str, Any]) -> dict[str, Any]:
        return {r: values.get(login, {}) for r in ranks}

    return dataclasses.replace(
        login_facts,
        hosts=ranks,
        train_address=dict.fromkeys(ranks, login_facts.train_address.get(login, login)),
        stack=each(login_facts.stack),
        gpus=each(login_facts.gpus),
        probe=each(login_facts.probe),
        torch=each(login_facts.torch),
        node_env=each(login_facts.node_env),
        warnings=list(login_facts.warnings),
        notes=[
            *login_facts.notes,
            f"login host only: planned from {login}'s facts for {nodes} nodes Slurm picks; each checks "
            "itself in the allocation (slurm-check)",
        ],
    )


def expectations(plan: RunPlan) -> dict[str, Any]:
    """Return ``expect.json``: what every node must match (the stack versions the job was planned for, the
    free space its outputs need) and where it finds its local facts (the node layout)."""
    probe = plan.facts.probe.get(plan.facts.master, {})
    versions = probe.get("versions")
    return {
        "versions": versions if isinstance(versions, dict) else {},
        "min_free_bytes": int(plan.spec.min_free_disk_gb * GIB),
        "facts_dir": layout().facts_dir,
    }


class SharedSlurmBackend(SlurmBackend):
    """The slurm backend reaching only the login host; the nodes' run directories on a shared file system."""

    POLL_PLAYBOOK = "slurm_shared_poll"
    STOP_PLAYBOOK = "slurm_shared_stop"

    def __init__(self, handle: SharedSlurmHandle) -> None:
        super().__init__(handle)
        self.root = handle.run_root
        self.nodes = handle.nodes

    @classmethod
    def takes(cls, spec: JobSpec) -> bool:
        """Only a job that sets ``slurm.shared_dir``."""
        return spec.slurm.login_only

    @classmethod
    def from_handle(cls, handle: Handle) -> SharedSlurmBackend:
        """Return the backend of a login-host-only run."""
        assert isinstance(handle, SharedSlurmHandle)
        return cls(handle)

    def preflight(
        self,
        run_preflight: Preflight,
        runner: PlaybookRunner,
        spec: JobSpec,
        run_id: str,
        *,
        output_dir: str | None,
        checkpoints_of: str | None,
        requires: Sequence[NodePath],
    ) -> NodeFacts:
        """Preflight on the login host, which stands in for the nodes Slurm picks: its facts once per rank
        (``run --resume`` is refused in this mode: no checkpoint or resumed output_dir to look for)."""
        del output_dir, checkpoints_of, requires
        login_facts = run_preflight(
            runner,
            preflight_spec(spec, self.login),
            run_id,
            output_dir=preflight_output_dir(spec, run_id),
        )
        return rank_facts(login_facts, self.nodes)

    @property
    def extra_vars(self) -> dict[str, Any]:
        """Return the Slurm playbooks' extra vars, with the run's shared folder."""
        return {**super().extra_vars, "mift_slurm_run_root": self.root}

    def allocation(self, plan: RunPlan) -> Allocation:
        """Return what the batch script asks for: ``slurm.nodes`` ranks, no node list."""
        return dataclasses.replace(super().allocation(plan), run_dir=self.root, ranks=True)

    def ship(self, runner: PlaybookRunner, plan: RunPlan, launch_vars: Mapping[str, Any]) -> PlaybookResult:
        """Write the agent, ``expect.json`` and every rank's bundle into the shared folder, through the login
        host."""
        return runner.run(
            "slurm_shared_prepare",
            {**launch_vars, **self.extra_vars, "mift_slurm_expect": expectations(plan)},
            timeout=plan.spec.timeouts.start_s,
        )

    def collect(self, job: RunNodes, *, lease_argv: Sequence[str] = ()) -> PlaybookResult:
        """Pack every rank's logs and metrics in the shared folder and fetch them through the login host (the
        scheduler owns the GPUs: no lease, ``lease_argv`` is never given)."""
        del lease_argv
        return job.runner.run(
            "slurm_shared_collect",
            {**job.base_vars, **self.extra_vars, "mift_collect_dir": str(job.run.nodes_dir)},
            cancellable=False,
            timeout=300,
        )

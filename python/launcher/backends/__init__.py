"""Backends: how a run's trainers are started, polled and stopped; everything else is the one engine's.

* ``ssh`` (:mod:`.ssh`): the launcher starts the node agent on every node over ssh (playbooks/launch.yml)
  and follows it there.
* ``slurm`` (:mod:`.slurm`): the nodes get the same agent and bundle but start nothing; one ``sbatch``
  on the login host runs ``srun`` with one task per node, each the agent's ``slurm-step`` (the same
  supervisor, environment and node run directory), and Slurm's job state decides how the run ended.
  With ``slurm.shared_dir`` (:mod:`.slurm_shared`) only the login host is reached: the nodes' run
  directories are ranks of a folder on the cluster's shared file system.

A backend differs only in :meth:`Backend.start`, :meth:`Backend.poll` (with its :meth:`Backend.judge`),
:meth:`Backend.stop` and :meth:`Backend.collect`. Which one a run uses is recorded (``backend`` in
record.json), so ``status``, ``logs``, ``stop`` and ``list`` work on either after the launcher is gone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from launcher.engine.plan import RunPlan
    from launcher.job import Job
    from launcher.runner import PlaybookResult, PlaybookRunner
    from launcher.runs import RunDir
    from launcher.verdict import Verdict

BACKENDS = ("ssh", "slurm")
DEFAULT_BACKEND = "ssh"
# the inventory variable that chooses the backend (group all), overridden by `run --backend`
BACKEND_VAR = "mift_launcher_backend"


class Backend(Protocol):
    """Start, poll, judge and stop a run's trainers."""

    name: str

    def start(
        self, runner: PlaybookRunner, run: RunDir, plan: RunPlan, launch_vars: Mapping[str, Any]
    ) -> PlaybookResult:
        """Start the trainers (or hand them to the scheduler); per-host ``start`` reports and failures."""
        ...

    def poll(self, job: Job) -> dict[str, dict[str, Any]]:
        """Return host -> the node agent's status."""
        ...

    def judge(self, job: Job) -> Callable[[dict[str, dict[str, Any]]], Verdict]:
        """Return the function that turns one poll's node states into the run's state."""
        ...

    def stop(self, job: Job) -> PlaybookResult:
        """Stop every trainer of the run; per-host ``stop`` reports (what is left)."""
        ...

    def collect(self, job: Job) -> PlaybookResult:
        """Fetch every node's logs, state and metrics into ``nodes/<host>/``; per-host ``collect`` reports."""
        ...


def backend_named(name: str, record: Mapping[str, Any] | None = None) -> Backend:
    """Return the backend ``name`` (``record``: the run record, for a run already started)."""
    if name == "slurm":
        from launcher.backends.slurm import SlurmBackend  # noqa: PLC0415

        if ((record or {}).get("slurm") or {}).get("run_root"):
            from launcher.backends.slurm_shared import SharedSlurmBackend  # noqa: PLC0415

            return SharedSlurmBackend.from_record(record or {})
        return SlurmBackend.from_record(record or {})
    from launcher.backends.ssh import SshBackend  # noqa: PLC0415

    return SshBackend()


def backend_of(record: Mapping[str, Any]) -> Backend:
    """Return the backend a recorded run uses (runs recorded before backends existed: ssh)."""
    return backend_named(str(record.get("backend") or DEFAULT_BACKEND), record)

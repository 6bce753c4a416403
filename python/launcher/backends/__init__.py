"""Backends: the remote side of a run (how its trainers are started, polled and stopped); the rest is the one
engine's.

* ``ssh`` (:mod:`.ssh`): the launcher starts the node agent on every node over ssh (playbooks/launch.yml)
  and follows it there.
* ``slurm`` (:mod:`.slurm`): the nodes get the same agent and bundle but start nothing; one ``sbatch``
  on the login host runs ``srun`` with one task per node, each the agent's ``slurm-step`` (the same
  supervisor, environment and node run directory), and Slurm's job state decides how the run ended.
  With ``slurm.shared_dir`` (:mod:`.slurm_shared`) only the login host is reached: the nodes' run
  directories are ranks of a folder on the cluster's shared file system.

Every backend is a :class:`~launcher.backends.base.Backend`: :func:`prepare` returns its frozen
:class:`~launcher.backends.base.Handle`, which the run record stores (``handle``: its ``kind`` and fields,
beside ``backend``: the name), and :func:`backend_of` builds the backend back from it, so ``status``,
``logs``, ``stop`` and ``list`` work on either after the launcher is gone. The node agent over Ansible, which
ssh and Slurm share, is :mod:`.agent`. A new backend is one new module and one entry in :data:`BACKENDS`
and :data:`KINDS`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.backends.base import HANDLE_KEY, Backend, Handle
from launcher.backends.slurm import SharedSlurmHandle, SlurmBackend, SlurmHandle
from launcher.backends.slurm_shared import SharedSlurmBackend
from launcher.backends.ssh import SshBackend, SshHandle
from launcher.exceptions import ConfigurationError
from launcher.rundir.runs import RunRecord
from launcher.spec.inventory import default_inventory, inventory_list, inventory_var

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path
    from typing import IO

    from launcher.spec.jobspec import JobSpec

DEFAULT_BACKEND = "ssh"
# the inventory variable that chooses the backend (group all), overridden by `run --backend`
BACKEND_VAR = "mift_launcher_backend"

# name (`run --backend`, the inventory's mift_launcher_backend) -> its backends, the first that takes the job
BACKENDS: dict[str, tuple[type[Backend], ...]] = {
    "ssh": (SshBackend,),
    "slurm": (SharedSlurmBackend, SlurmBackend),
}
# a stored handle's kind -> the handle class and the backend built from it
KINDS: dict[str, tuple[type[Handle], type[Backend]]] = {
    SshHandle.kind: (SshHandle, SshBackend),
    SlurmHandle.kind: (SlurmHandle, SlurmBackend),
    SharedSlurmHandle.kind: (SharedSlurmHandle, SharedSlurmBackend),
}

__all__ = ["BACKENDS", "BACKEND_VAR", "DEFAULT_BACKEND", "Backend", "Handle", "backend_of", "prepare"]


def choose_backend(
    name: str | None, inventory: Path | None, where: Path, login_only: bool = False
) -> dict[str, Any]:
    """Return the backend's name and what it reads from the inventory: ``--backend``, else the inventory's
    ``mift_launcher_backend``, else ssh; for slurm also the login host (bad input raises ConfigurationError,
    one line). ``login_only``: the job spec sets ``slurm.shared_dir``, which only the slurm backend has."""
    inv = inventory or default_inventory()
    data = inventory_list(inv) if inv is not None and inv.exists() else {}
    chosen = name or inventory_var(data, BACKEND_VAR) or DEFAULT_BACKEND
    if chosen not in BACKENDS:
        raise ConfigurationError(
            f"{inv}: {BACKEND_VAR}: {chosen!r} is not a backend (choose from {', '.join(BACKENDS)})"
        )
    if login_only and not any(cls.name == "slurm" for cls in BACKENDS[str(chosen)]):
        raise ConfigurationError(
            f"{where}: slurm.shared_dir: the login-host-only mode needs backend slurm, not {chosen}; "
            f"run --backend slurm, or set {BACKEND_VAR}: slurm in the inventory"
        )
    return {"backend": str(chosen), **BACKENDS[str(chosen)][0].inventory_fields(data, str(where))}


def _backend_class(name: str, spec: JobSpec) -> type[Backend]:
    """Return the class of backend ``name`` that runs ``spec``."""
    return next(cls for cls in BACKENDS[name] if cls.takes(spec))


def prepare(
    name: str | None, inventory: Path | None, spec: JobSpec, where: Path, run_id: str, *, resume: bool
) -> Handle:
    """Choose the backend (:func:`choose_backend`) and return the handle of run ``run_id``; bad input raises
    ConfigurationError, one line."""
    chosen = choose_backend(name, inventory, where, spec.slurm.login_only)
    return _backend_class(chosen["backend"], spec).prepare(spec, chosen, where, run_id, resume=resume)


def check_recovery(spec: JobSpec, where: Path, name: str, *, detach: bool, out: IO[str]) -> bool:
    """Return True when the launcher retries failed attempts of ``spec`` run by backend ``name`` (see
    :meth:`Backend.recovery`)."""
    return _backend_class(name, spec).recovery(spec, where, detach=detach, out=out)


def nodes_in_inventory(spec: JobSpec) -> bool:
    """Return True when the job's nodes are hosts of the inventory (False with ``slurm.shared_dir``: Slurm
    picks them, only the login host is reached)."""
    return not spec.slurm.login_only


def handle_of(record: RunRecord | Mapping[str, Any]) -> Handle:
    """Return the handle a run record stores. A record written before handles existed: ``backend`` (ssh when
    none) and, under Slurm, the ``slurm`` fields (``run_root``: the login-host-only mode)."""
    record = record if isinstance(record, RunRecord) else RunRecord.of(record)
    stored = record.handle
    if stored is not None and stored.get("kind") in KINDS:
        fields = {k: v for k, v in stored.items() if k != "kind"}
        handle_class = KINDS[str(stored["kind"])][0]
        try:
            return handle_class(**fields)
        except TypeError as err:
            raise ConfigurationError(
                f"run record: {HANDLE_KEY}: not a {stored['kind']} handle: {err}"
            ) from None
    if (record.backend or DEFAULT_BACKEND) != "slurm":
        return SshHandle()
    slurm = record.slurm
    login, job_id = str(slurm.get("login_host") or ""), slurm.get("job_id")
    if slurm.get("run_root"):
        root = str(slurm["run_root"])
        shared = str(slurm.get("shared_dir") or root.rsplit("/", 1)[0])
        return SharedSlurmHandle(login, shared, root, int(slurm.get("nodes") or 0), job_id)
    return SlurmHandle(login, job_id)


def backend_of(record: RunRecord | Mapping[str, Any]) -> Backend:
    """Return the backend of a recorded run, built from its handle."""
    handle = handle_of(record)
    return KINDS[handle.kind][1].from_handle(handle)

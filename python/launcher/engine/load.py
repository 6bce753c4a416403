"""Load and check a job before anything reaches a node: the job spec and its configs validated, every host
found in the inventory, the folders every node must hold."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.backends import nodes_in_inventory
from launcher.engine.plan import (
    ResumeFrom,
)
from launcher.exceptions import ConfigurationError
from launcher.preflight.checks import node_paths
from launcher.spec.inventory import check_hosts, existing_inventory
from launcher.transfer.manifest import YAML_KEYS, stage_items
from launcher.validation import backends as validation_backends
from launcher.validation.files import validate_loaded
from launcher.validation.job import load_job

if TYPE_CHECKING:
    from launcher.preflight.checks import NodePath
    from launcher.problems import FileReport
    from launcher.spec.jobspec import JobSpec
    from launcher.validation.job import LoadedJob


def refuse(report: FileReport) -> None:
    errors = [p for p in report.problems if p.is_error]
    if errors:
        raise ConfigurationError(problems=errors)


def validate(job: LoadedJob) -> None:
    """Validate the loaded job; the shipped key lists answer first when they speak for the installed
    classes."""
    if not validation_backends.builtin_forced() and validation_backends.shipped_lists_match_installed():
        refuse(validate_loaded(job, builtin=True))
    refuse(validate_loaded(job))


def load_and_check(job_path: Path, inventory: Path | None) -> LoadedJob:
    """Load and validate the job and check its hosts against the inventory (in parallel); bad input raises."""
    job = load_job(job_path)
    if not nodes_in_inventory(job.spec):  # Slurm picks them: the backend reaches only its login host
        validate(job)
        return job
    with concurrent.futures.ThreadPoolExecutor(
        1
    ) as pool:  # ansible-inventory runs while the configs are checked
        hosts = pool.submit(check_hosts, job.spec, inventory, job_path)
        try:
            validate(job)
        finally:
            hosts_error = hosts.exception()
    if hosts_error is not None:
        raise hosts_error
    return job


def checkpoints_of(spec: JobSpec, run_id: str, resume: ResumeFrom | None) -> str | None:
    """The node folder whose complete checkpoints preflight lists: the resumed run's output_dir (``run
    --resume``), or the job's own with ``resume: true`` (absolute: validated); None otherwise."""
    if resume is not None:
        return resume.output_dir
    if spec.resume is True:
        return spec.node_output_dir(run_id)
    return None


def required_paths(job: LoadedJob, resume: ResumeFrom | None) -> list[NodePath]:
    """The folders every node must hold before the start (model, named resume checkpoint, dataset); a folder
    the job stages is not among them: staging, after preflight, puts it there and verifies it file by file."""
    deepspeed = None if job.deepspeed_from == "auto" else job.deepspeed is not None
    staged = {YAML_KEYS[item.key] for item in stage_items(job)}
    return [
        path
        for path in node_paths(job.train.data, job.spec, deepspeed=deepspeed, resume_run=resume is not None)
        if path.what not in staged
    ]


def load_for_run(job_path: Path, inventory: Path | None) -> tuple[LoadedJob, Path | None]:
    """``run``'s input checks, before any host is asked: the inventory named is there, the job loads and
    validates, its hosts are in the inventory, and every source it stages exists; return the job and the
    resolved inventory."""
    inv = existing_inventory(inventory)
    job = load_and_check(job_path, inv)
    stage_items(job)  # a missing source is bad input before any host is asked
    return job, inv

"""The run: load -> validate -> (preflight) -> plan -> ship -> follow -> finish, over one :class:`RunPlan`.

Nothing reaches a node before the job spec and its configs are validated and every host is found in the
inventory: the one ansible-runner wrapper (:class:`launcher.backends.runner.PlaybookRunner`) is constructed
only after.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

from launcher.backends import backend_of, check_recovery, prepare
from launcher.engine import attempt_log
from launcher.engine.attempts import attempt_loop
from launcher.engine.context import open_run
from launcher.engine.lease import LEASING_BACKENDS, LeaseRequest
from launcher.engine.load import checkpoints_of, load_for_run, refuse, required_paths
from launcher.engine.plan import (
    ResumeFrom,
    build_plan,
    validate_plan,
    with_tokenized_path,
)
from launcher.engine.signals import interrupt_guard
from launcher.engine.stage import stage_for_run
from launcher.exceptions import JobFailedError, LauncherError
from launcher.preflight.checks import PreflightOnce, run_preflight
from launcher.rundir.runs import new_run_id
from launcher.spec.inventory import spare_hosts

if TYPE_CHECKING:
    from launcher.planning.training import TrainingPlan
    from launcher.preflight.checks import NodeFacts
    from launcher.rundir.runs import RunDir
    from launcher.validation.job import LoadedJob


def run_job(
    job_path: Path,
    *,
    inventory: Path | None,
    detach: bool,
    out: IO[str] | None = None,
    resume: ResumeFrom | None = None,
    backend: str | None = None,
    preflight_once: PreflightOnce | None = None,
    force: bool = False,
) -> RunDir:
    """Run a job end to end; return its run directory (its record's status says how it ended,
    :func:`launcher.rundir.runs.exit_code_of` the exit code); bad input raises (2), as does a run rejected or
    failed
    before its trainers started (its record says so too).

    ``preflight_once``: facts one preflight learnt about exactly this job's hosts, reused instead of running
    preflight again (the probe's candidates, one after the other on the same node); kept there when empty.
    ``force``: take over the GPU lease of another live run (launcher.engine.lease).
    """
    out = out or sys.stdout
    job, inv = load_for_run(job_path, inventory)
    spec = job.spec
    run_id = new_run_id(spec.name)
    handle = prepare(backend, inv, spec, job_path, run_id, resume=resume is not None)
    recover = check_recovery(spec, job_path, handle.backend, detach=detach, out=out)
    interrupted = threading.Event()
    with interrupt_guard(interrupted):
        context = open_run(run_id, job, job_path, inv, handle, interrupted, detach=detach, resume=resume)
        run, runner = context.run, context.runner
        print(f"run {run_id}: {run.path}", file=out, flush=True)
        run.set_status("preflight")
        attempt_log.begin(run, 1, time.time())
        try:
            facts = preflight_once.reuse(spec.hosts) if preflight_once and not resume else None
            if facts is None:  # where the backend reaches (login host only: its facts once per rank)
                facts = backend_of(run.record()).preflight(
                    run_preflight,
                    runner,
                    spec,
                    run_id,
                    output_dir=resume.output_dir if resume else None,
                    checkpoints_of=checkpoints_of(spec, run_id, resume),
                    requires=required_paths(job, resume),
                )
                if preflight_once is not None:
                    preflight_once.keep(facts)
            training = _probe(job, facts, inv, run, out) if spec.plan == "probe" else None
            plan = build_plan(job, facts, run_id, resume, training)
            refuse(validate_plan(plan))
        except LauncherError as err:
            ended_before_start(run, "stopped" if interrupted.is_set() else "rejected", err)
            raise
        try:
            tokenized = stage_for_run(job, runner, run, interrupted, out, plan=plan)
            if tokenized is not None:  # the shipped YAML reads the tokenized copy (validated as shipped)
                plan = with_tokenized_path(plan, tokenized)
                refuse(validate_plan(plan))
        except LauncherError as err:
            failed = "failed" if isinstance(err, JobFailedError) else "rejected"
            ended_before_start(run, "stopped" if interrupted.is_set() else failed, err)
            raise
        # the nodes' GPUs are this run's from its first start to its finish (taken by the launch playbook)
        lease = LeaseRequest.for_run(run_id, force=force) if handle.backend in LEASING_BACKENDS else None
        spares = spare_hosts(spec, inv) if recover else []
        attempt_loop(
            run,
            runner,
            plan,
            interrupted=interrupted,
            detach=detach,
            out=out,
            resume=resume,
            recover=recover,
            spares=spares,
            lease=lease,
        )
        return run


def ended_before_start(run: RunDir, state: str, err: LauncherError) -> None:
    """Record a run (and its first attempt) that ended before its trainers started."""
    attempt_log.end(run, state, str(err))
    run.set_status(state, str(err))


def _probe(
    job: LoadedJob, facts: NodeFacts, inventory: Path | None, run: RunDir, out: IO[str]
) -> TrainingPlan:
    """``plan: probe`` (:func:`launcher.engine.probe.probe_before_run`, imported only for it)."""
    from launcher.engine.probe import probe_before_run  # noqa: PLC0415 - only for plan: probe

    return probe_before_run(job, facts, inventory, run, out, run_job)

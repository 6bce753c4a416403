"""Staging for a run (and ``launcher stage``): the job's folders on every node, then tokenize once."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path
from typing import IO, TYPE_CHECKING

from launcher.backends import runner as runner_module
from launcher.engine.load import load_and_check
from launcher.engine.plan import (
    RunPlan,
)
from launcher.engine.signals import interrupt_guard
from launcher.exceptions import ConfigurationError
from launcher.exit_codes import OK, ExitCode
from launcher.rundir.runs import RunDir
from launcher.spec.inventory import existing_inventory
from launcher.transfer.manifest import stage_items
from launcher.transfer.staging import stage, write_manifests
from launcher.transfer.tokenize_once import tokenize_for_run

if TYPE_CHECKING:
    from launcher.backends.runner import PlaybookRunner
    from launcher.validation.job import LoadedJob


def stage_for_run(
    job: LoadedJob,
    runner: PlaybookRunner,
    run: RunDir,
    interrupted: threading.Event,
    out: IO[str],
    *,
    plan: RunPlan | None = None,
) -> str | None:
    """Stage the job's folders on every node (status ``staging``, progress in the record); the manifests are
    kept in the run (``staging`` in record.json, ``staging/<key>.manifest.json``). With ``plan``, then
    tokenize once (launcher/transfer/tokenize_once.py): return the node path of the tokenized dataset, or
    None."""
    if not job.spec.stage.items():
        return None
    run.set_status("staging")
    outcome = stage(
        job, runner, out=out, stop=interrupted, progress=lambda state: run.set_staging({"progress": state})
    )
    if outcome is None:
        return None
    write_manifests(run.path, outcome)
    run.set_staging(outcome.record())
    if plan is None:
        return None
    train = plan.train
    done = tokenize_for_run(
        plan, runner, outcome, run.path / "tokenize", train=train, out=out, stop=interrupted
    )
    if done is None:
        return None
    run.update(tokenized=done[1])
    return done[0]


def stage_only(job_path: Path, *, inventory: Path | None, out: IO[str]) -> ExitCode:
    """``launcher stage``: load and check the job, then stage its folders on every node; no run is made."""
    inv = existing_inventory(inventory)
    job = load_and_check(job_path, inv)
    if not stage_items(job):
        raise ConfigurationError.at(job_path, "stage", "the job spec stages nothing", "stage")
    interrupted = threading.Event()
    with interrupt_guard(interrupted), tempfile.TemporaryDirectory(prefix="mift-stage-") as tmp:
        runner = runner_module.make_runner(Path(tmp), inventory=inv)
        runner.cancel_requested = interrupted
        stage(job, runner, out=out, stop=interrupted)
    return OK

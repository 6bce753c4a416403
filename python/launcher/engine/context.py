"""A run's frozen context: its directory (its record made once, from the loaded job) and its one runner."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING

from launcher.backends import runner as runner_module
from launcher.rundir.runs import RunDir
from launcher.spec.jobspec import mask_env

if TYPE_CHECKING:
    import threading
    from pathlib import Path

    from launcher.backends.base import Handle
    from launcher.backends.runner import PlaybookRunner
    from launcher.engine.plan import ResumeFrom
    from launcher.validation.job import LoadedJob


@dataclasses.dataclass(frozen=True)
class RunContext:
    """What every step of one run is handed: its run directory and the one runner of the run."""

    run: RunDir
    runner: PlaybookRunner


def open_run(  # noqa: PLR0917 - what a run's record is made of
    run_id: str,
    job: LoadedJob,
    job_path: Path,
    inventory: Path | None,
    handle: Handle,
    interrupted: threading.Event,
    *,
    detach: bool,
    resume: ResumeFrom | None,
) -> RunContext:
    """Create the run directory with its first record, and the run's runner (``interrupted`` cancels it)."""
    spec = job.spec
    run = RunDir.create(
        run_id,
        {
            "name": spec.name,
            "created_at": time.time(),
            "spec_path": str(job_path.resolve()),
            "spec": {**spec.model_dump(mode="json"), "env": mask_env(spec.env_strings())},
            "deepspeed_from": job.deepspeed_from,
            "inventory": str(inventory) if inventory else None,
            "launcher_pid": os.getpid(),
            "detached": detach,
            **({"resumed_from": resume.run_id} if resume else {}),
            **handle.record_fields(),
        },
    )
    runner = runner_module.make_runner(run.ansible_dir, inventory=inventory)
    runner.cancel_requested = interrupted
    return RunContext(run, runner)

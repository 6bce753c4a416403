"""``run JOB``: the adapter of :func:`launcher.engine.run.run_job` (validate, preflight, start, follow)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from launcher.rundir.runs import exit_code_of

if TYPE_CHECKING:
    import argparse

    from launcher.engine.plan import ResumeFrom
    from launcher.exit_codes import ExitCode


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``run`` subcommand."""
    p = subparsers.add_parser(
        "run",
        help="start a job on every node and follow it",
        description="Validate the job spec and its configs, check the nodes (preflight), start "
        "`llamafactory-cli train` on every node, then follow it: live per-node table, stop everywhere on the "
        "first failure or on Ctrl-C, fetch logs and metrics into runs/<run_id>/.",
    )
    p.add_argument("job", type=Path, nargs="?", help="job spec YAML (see configs/jobs/)")
    p.add_argument("-i", "--inventory", type=Path, help="Ansible inventory (default: the one in ansible.cfg)")
    p.add_argument("--detach", action="store_true", help="return once every trainer has started")
    p.add_argument(
        "--backend",
        choices=("ssh", "slurm"),
        help="how the trainers are started: ssh (the launcher on every node) or slurm (sbatch on the login "
        "host); default: the inventory's mift_launcher_backend, else ssh (docs/slurm.md)",
    )
    p.add_argument(
        "--resume",
        metavar="RUN",
        help="continue a stopped, failed or stalled run from its last checkpoint: a new run with RUN's job "
        "spec, output_dir and inventory, resume_from_checkpoint set to the last checkpoint on the nodes",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help='take over the GPU lease of another run that still holds a node (docs/launcher.md "GPU lease")',
    )
    p.set_defaults(func=_cmd_run, parser=p)
    return p


def _cmd_run(args: argparse.Namespace) -> ExitCode:
    from launcher.engine.run import run_job  # noqa: PLC0415 - `--help` imports no engine

    if args.resume is None and args.job is None:
        args.parser.error("the following arguments are required: job")
    if args.resume is not None:
        if args.job is not None:
            args.parser.error("argument --resume: give RUN or a job spec, not both")
        job, inventory, resume = _resume_source(args.resume, args.inventory)
        run = run_job(
            job,
            inventory=inventory,
            detach=args.detach,
            resume=resume,
            backend=args.backend,
            force=args.force,
        )
    else:
        run = run_job(
            args.job, inventory=args.inventory, detach=args.detach, backend=args.backend, force=args.force
        )
    return exit_code_of(run.record().status)


def _resume_source(ref: str, inventory: Path | None) -> tuple[Path, Path | None, ResumeFrom]:
    """Return the job spec, inventory and output_dir of the run ``ref`` to resume."""
    from launcher.engine.plan import ResumeFrom  # noqa: PLC0415
    from launcher.exceptions import ConfigurationError  # noqa: PLC0415
    from launcher.rundir.runs import find_run  # noqa: PLC0415

    old = find_run(ref)
    record = old.record()
    where = f"{old.path}/record.json"
    if record.status not in ("stopped", "failed", "stalled"):
        raise ConfigurationError.at(
            where,
            "status",
            f"{record.data.get('status')}: only a stopped, failed or stalled run can be resumed",
            "resume",
        )
    output_dir = record.output_dir
    if not record.hosts or output_dir is None:
        raise ConfigurationError.at(
            where, "hosts", "the run never started a trainer: nothing to resume", "resume"
        )
    spec_path = Path(record.spec_path)
    if not spec_path.is_file():
        raise ConfigurationError.at(where, "spec_path", f"{spec_path}: the run's job spec is gone", "resume")
    if inventory is None and record.inventory:
        inventory = Path(record.inventory)
    # a relative output_dir lives in the old node run directory, a sibling of the new one
    node_out = output_dir if output_dir.startswith("/") else f"../{old.run_id}/{output_dir}"
    return spec_path, inventory, ResumeFrom(old.run_id, node_out)

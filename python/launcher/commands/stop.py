"""``stop RUN``: stop a run's trainer on every node, fetch its logs, mark it stopped."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from launcher.commands.completion import add_run_argument
from launcher.exit_codes import JOB_FAILED, OK, ExitCode

if TYPE_CHECKING:
    import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``stop`` subcommand."""
    p = subparsers.add_parser(
        "stop",
        help="stop a run on every node",
        description="SIGTERM the trainer's process group and every process of the run on every node, SIGKILL "
        "what is left after the grace period, check nothing is left, fetch logs. Safe to repeat.",
    )
    add_run_argument(p, optional=False)
    p.set_defaults(func=_cmd_stop)
    return p


def _cmd_stop(args: argparse.Namespace) -> ExitCode:
    return stop_run(args.run)


def stop_run(ref: str) -> ExitCode:
    """Stop the run everywhere; exit 0 when nothing is left running on any node."""
    from launcher.engine.finish import finish  # noqa: PLC0415
    from launcher.engine.job import Job, is_final  # noqa: PLC0415
    from launcher.follow.verdict import Verdict  # noqa: PLC0415
    from launcher.rundir.report import print_summary  # noqa: PLC0415
    from launcher.rundir.runs import find_run  # noqa: PLC0415

    run = find_run(ref)
    record = run.record()
    if not record.hosts:
        print(f"run {run.run_id}: no trainer was started ({record.status})")
        return OK
    job = Job(run, record)
    result = job.stop()
    left = {
        h: r.get("left")
        for h in job.hosts
        if isinstance(r := result.report(h, "stop"), dict) and r.get("left")
    }
    for host, line in result.failures.items():
        print(f"{host}: {line}", file=sys.stderr)
    if is_final(record):
        print_summary(run, sys.stdout)
    else:
        finish(job, Verdict("stopped", "stopped by `launcher stop`"), out=sys.stdout, stopped=True)
    if left or result.failures:
        print(
            f"error: processes may be left on: {', '.join(sorted({*left, *result.failures}))}",
            file=sys.stderr,
        )
        return JOB_FAILED
    print(f"stopped on {len(job.hosts)} nodes; nothing left running")
    return OK

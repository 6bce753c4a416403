"""``status [RUN]``: the state of a run (the latest by default), refreshed from the nodes while it runs."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from launcher.commands.completion import add_run_argument
from launcher.exit_codes import JOB_FAILED, OK, ExitCode

if TYPE_CHECKING:
    import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``status`` subcommand."""
    p = subparsers.add_parser(
        "status",
        help="show a run's state (latest run by default)",
        description="Show a run's state and per-node table. While the run is active the nodes are polled; a "
        "run nobody follows (detached, or its launcher died) is finalized here once every node has ended. "
        "Exit code: 0 running or succeeded, 1 failed, stalled or stopped.",
    )
    add_run_argument(p)
    p.add_argument("--json", action="store_true", help='one JSON object (docs/launcher.md "JSON output")')
    p.set_defaults(func=_cmd_status)
    return p


def _cmd_status(args: argparse.Namespace) -> ExitCode:
    return show_status(args.run, as_json=args.json)


def show_status(ref: str | None, *, as_json: bool = False) -> ExitCode:
    """Print a run's status; poll and, when nobody follows it, finish an active run (the engine's finish
    step)."""
    from launcher.engine.finish import finish  # noqa: PLC0415
    from launcher.engine.job import Job, is_final, launcher_alive  # noqa: PLC0415
    from launcher.rundir.report import status_lines  # noqa: PLC0415
    from launcher.rundir.runs import find_run  # noqa: PLC0415

    run = find_run(ref)
    record = run.record()
    live = record.status in ("running", "stopping") or not launcher_alive(record)
    if not is_final(record) and record.hosts and live:
        job = Job(run, record)
        nodes = job.poll()
        run.set_nodes({h: {k: v for k, v in n.items() if k != "log_tail"} for h, n in nodes.items()})
        verdict = job.judge(nodes)
        if verdict.state != "running" and not launcher_alive(record):
            finish(job, verdict, nodes)
        record = run.record()
    elif not is_final(record) and not launcher_alive(record) and not record.hosts:
        run.set_status("rejected", "launcher ended before any trainer was started")
        record = run.record()
    if as_json:
        from launcher.rundir.json_out import run_object, write  # noqa: PLC0415

        write(run_object(record, run), sys.stdout)
    else:
        sys.stdout.write("\n".join(status_lines(record, run)) + "\n")
    return JOB_FAILED if record.status in ("failed", "stopped", "stalled", "rejected") else OK

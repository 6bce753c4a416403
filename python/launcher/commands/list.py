"""``list``: every run in the runs folder, oldest first."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from launcher.exit_codes import OK, ExitCode

if TYPE_CHECKING:
    from launcher.rundir.runs import RunRecord


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``list`` subcommand."""
    p = subparsers.add_parser(
        "list",
        help="list runs",
        description="List the runs in runs/ (or MIFT_RUNS_DIR). Exit code: 0, or 3 when there is none.",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='one JSON object per run, per line (docs/launcher.md "JSON output")',
    )
    p.set_defaults(func=_cmd_list)
    return p


def _cmd_list(args: argparse.Namespace) -> ExitCode:
    from launcher.exceptions import NoRunsError  # noqa: PLC0415
    from launcher.rundir.runs import list_runs, runs_root  # noqa: PLC0415 - `--help` imports no engine

    runs = list_runs()
    if not runs:
        raise NoRunsError(f"no runs in {runs_root()}")
    if args.json:
        from launcher.rundir.json_out import run_object, write  # noqa: PLC0415

        for run in runs:
            write(run_object(run.record(), run), sys.stdout)
        return OK
    rows = [("RUN", "STATUS", "BACKEND", "CREATED", "NODES", "STEPS", "LOSS", "ATTEMPTS")]
    for run in runs:
        rec = run.record()
        summary = rec.summary
        loss = summary.get("final_loss")
        rows.append(
            (
                run.run_id,
                rec.status,
                _backend(rec),
                time.strftime("%Y-%m-%d %H:%M", time.localtime(rec.created_at)),
                str(len(rec.hosts)),
                f"{summary.get('steps', '-')}/{summary.get('total_steps', '-')}" if summary else "-",
                f"{loss:.4f}" if isinstance(loss, float) else "-",
                _attempts(rec),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return OK


def _attempts(record: RunRecord) -> str:
    """Return the number of attempts and the failure kind of each failed one: ``2 (trainer_signal)``."""
    attempts = record.attempts
    kinds = [str(a["kind"]) for a in attempts if a.get("kind")]
    return f"{len(attempts) or 1}" + (f" ({', '.join(kinds)})" if kinds else "")


def _backend(record: RunRecord) -> str:
    """Return ``ssh`` or ``slurm:<job id>``."""
    if record.backend == "slurm":
        return f"slurm:{record.slurm.get('job_id') or '-'}"
    return record.backend or "ssh"

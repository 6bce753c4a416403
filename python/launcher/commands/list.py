"""``list``: every run in the runs folder, oldest first."""

from __future__ import annotations

import argparse
import time
from typing import Any

from launcher.exit_codes import OK, ExitCode


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``list`` subcommand."""
    p = subparsers.add_parser(
        "list", help="list runs", description="List the runs in runs/ (or MIFT_RUNS_DIR)."
    )
    p.set_defaults(func=_cmd_list)
    return p


def _cmd_list(_args: argparse.Namespace) -> ExitCode:
    from launcher.runs import list_runs, runs_root  # noqa: PLC0415 - `--help` imports no engine

    runs = list_runs()
    if not runs:
        print(f"no runs in {runs_root()}")
        return OK
    rows = [("RUN", "STATUS", "BACKEND", "CREATED", "NODES", "STEPS", "LOSS", "ATTEMPTS")]
    for run in runs:
        rec = run.load()
        summary = rec.get("summary") or {}
        loss = summary.get("final_loss")
        rows.append(
            (
                run.run_id,
                str(rec.get("status")),
                _backend(rec),
                time.strftime("%Y-%m-%d %H:%M", time.localtime(float(rec.get("created_at", 0)))),
                str(len(rec.get("hosts") or [])),
                f"{summary.get('steps', '-')}/{summary.get('total_steps', '-')}" if summary else "-",
                f"{loss:.4f}" if isinstance(loss, float) else "-",
                _attempts(rec),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return OK


def _attempts(record: dict[str, Any]) -> str:
    """Return the number of attempts and the failure kind of each failed one: ``2 (trainer_signal)``."""
    attempts = [a for a in record.get("attempts") or [] if isinstance(a, dict)]
    kinds = [str(a["kind"]) for a in attempts if a.get("kind")]
    return f"{len(attempts) or 1}" + (f" ({', '.join(kinds)})" if kinds else "")


def _backend(record: dict[str, Any]) -> str:
    """Return ``ssh`` or ``slurm:<job id>``."""
    slurm = record.get("slurm") or {}
    if record.get("backend") == "slurm":
        return f"slurm:{slurm.get('job_id') or '-'}"
    return str(record.get("backend") or "ssh")

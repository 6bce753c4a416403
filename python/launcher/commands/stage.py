"""``stage JOB``: the adapter of :func:`launcher.engine.stage.stage_only` (the job's folders on the nodes)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

    from launcher.exit_codes import ExitCode


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``stage`` subcommand."""
    p = subparsers.add_parser(
        "stage",
        help="put the job's model and dataset folders on every node, verified (run does it too)",
        description="Make every node of the job hold a verified copy of the folders the job spec's `stage` "
        "names: a manifest of sizes and sha256 made here (cached), what each node holds, free disk checked, "
        "then only the files that differ sent to every node in parallel, each renamed into place only when "
        "its checksum matches. Starts no trainer and makes no run.",
    )
    p.add_argument("job", type=Path, help="job spec YAML with a `stage` section")
    p.add_argument("-i", "--inventory", type=Path, help="Ansible inventory (default: the one in ansible.cfg)")
    p.set_defaults(func=_cmd_stage)
    return p


def _cmd_stage(args: argparse.Namespace) -> ExitCode:
    from launcher.engine.stage import stage_only  # noqa: PLC0415 - `--help` imports no engine

    return stage_only(args.job, inventory=args.inventory, out=sys.stdout)

"""``validate PATH...``: check job specs, LLaMA-Factory YAMLs and DeepSpeed JSONs; no remote side effects."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from launcher.exit_codes import BAD_INPUT, OK, ExitCode

if TYPE_CHECKING:
    import argparse

    from launcher.validation.problems import FileReport


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``validate`` subparser."""
    parser = subparsers.add_parser(
        "validate",
        help="check configs (job spec, LLaMA-Factory YAML, DeepSpeed JSON) before launching",
        description=(
            "Check job specs, LLaMA-Factory YAMLs and DeepSpeed JSONs (kind detected from content). "
            "Prints one line per problem as 'PATH: key: message' and exits 2 if any, else one ok line "
            "per file. Folders are searched for .json/.yaml/.yml files."
        ),
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="config files or folders")
    parser.add_argument(
        "--builtin",
        action="store_true",
        help="use the shipped key lists even when DeepSpeed/LLaMA-Factory import (MIFT_VALIDATE_BUILTIN=1)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print problems only, no ok lines")
    parser.set_defaults(func=_cmd_validate)


def print_reports(reports: list[FileReport], *, quiet: bool = False) -> bool:
    """Print each problem once (errors to stderr, warnings and ok lines to stdout); True if all ok."""
    seen: set[tuple[str, str, str]] = set()
    all_ok = True
    for report in reports:
        for problem in report.problems:
            if problem.identity in seen:
                continue
            seen.add(problem.identity)
            print(problem, file=sys.stderr if problem.is_error else sys.stdout)
        if report.ok and not quiet:
            print(report.ok_line())
        all_ok = all_ok and report.ok
    return all_ok


def _cmd_validate(args: argparse.Namespace) -> ExitCode:
    from launcher.validation.files import validate_files  # noqa: PLC0415 - keep `--help` fast

    reports = validate_files(args.paths, builtin=True if args.builtin else None)
    return OK if print_reports(reports, quiet=args.quiet) else BAD_INPUT

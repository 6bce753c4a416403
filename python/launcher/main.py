"""Build the argument parser and apply the entry-point error policy."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import TYPE_CHECKING

from launcher import __version__
from launcher.exceptions import LauncherError, interrupted_line
from launcher.exit_codes import BAD_INPUT, JOB_FAILED, ExitCode

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

LOG = logging.getLogger("launcher")

# Order is the order shown in --help.
COMMAND_MODULES = (
    "validate",
    "plan",
    "check",
    "stage",
    "run",
    "status",
    "logs",
    "stop",
    "list",
    "completion",
)


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with one subparser per command module."""
    parser = argparse.ArgumentParser(
        prog="python -m launcher",
        description="Validate, plan, run, follow, stop and report multi-node LLaMA-Factory ZeRO-3 jobs.",
        epilog="Exit codes: 0 ok, 1 job failed, 2 bad input, 3 no runs. Set LAUNCHER_DEBUG=1 for tracebacks.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.set_defaults(root_parser=parser)  # `completion` generates its script from this parser
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"launcher.commands.{name}")
        module.register(subparsers)
    return parser


def cli(argv: Sequence[str] | None = None) -> ExitCode:
    """Parse ``argv``, run the command, and turn domain errors into one line on stderr.

    A reader that closes stdout early (``python -m launcher plan JOB | head -1``) ends the command quietly,
    for every command: stdout is flushed here, so a closed pipe shows inside this function and not as a
    traceback when the interpreter exits; the rest of the output is dropped. The exit code is the command's
    when it had finished (the pipe closed only at the flush), else 1 (job failed: the command was cut short).
    """
    code: ExitCode | None = None
    try:
        code = _cli(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        # point stdout at /dev/null: the interpreter's own flush at exit would raise again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return code if code is not None else JOB_FAILED
    return code


def _cli(argv: Sequence[str] | None) -> ExitCode:
    debug = os.environ.get("LAUNCHER_DEBUG", "") not in ("", "0")
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(name)s: %(message)s")
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage, 0 on --help
        return ExitCode(int(exc.code or 0))
    func: Callable[[argparse.Namespace], ExitCode] = args.func
    try:
        return func(args)
    except LauncherError as err:
        LOG.debug("command failed", exc_info=True)
        # one line, whatever the error holds: several problems are joined, never printed as a block
        print(
            "error: " + "; ".join(line.strip() for line in str(err).splitlines() if line.strip()),
            file=sys.stderr,
        )
        return err.exit_code
    except KeyboardInterrupt as interrupted:
        print(interrupted_line(interrupted), file=sys.stderr)
        return JOB_FAILED
    except FileNotFoundError as err:
        if debug:
            raise
        print(f"error: {err.filename}: no such file", file=sys.stderr)
        return BAD_INPUT

"""The launcher's error hierarchy; every user-facing error is one of these.

An error carries typed :class:`~launcher.problems.Problem` objects (file, key path, message, rule) from where
they were found to where they are printed; ``str(err)`` is the one line the CLI shows.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

from launcher.exit_codes import BAD_INPUT, JOB_FAILED, NOTHING, ExitCode
from launcher.problems import Problem

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path


class LauncherError(Exception):
    """Base class: ``str(err)`` is the one line shown to the user.

    Args:
        message: the line, when the error is not about a file (a host, a run).
        problems: the problems found; the line joins the errors among them.
    """

    exit_code: ExitCode = JOB_FAILED

    def __init__(self, message: str = "", *, problems: Iterable[Problem] = ()) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        errors = [str(p) for p in self.problems if p.is_error] or [str(p) for p in self.problems]
        super().__init__(" ".join((message or "; ".join(errors)).split()))


class ConfigurationError(LauncherError):
    """Bad input: a config typo, a missing file, an unknown host. Nothing remote was touched."""

    exit_code = BAD_INPUT

    @classmethod
    def at(cls, path: str | Path, key: str, message: str, rule: str = "schema") -> ConfigurationError:
        """Return the error of one problem in one file."""
        return cls(problems=[Problem(str(path), key, message, rule)])


class NoRunsError(LauncherError):
    """Nothing there: the runs folder holds no run (``status``, ``logs``, ``list``)."""

    exit_code = NOTHING


class JobFailedError(LauncherError):
    """The job (or a remote step) failed; logs are kept in the run directory."""

    exit_code = JOB_FAILED


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached the launcher (raised once, by the entry point's handler).

    A subclass, so that every ``except KeyboardInterrupt`` that cleans up still runs; a type of its own, so
    that CPython never takes it for an unhandled KeyboardInterrupt (see ``launcher/__main__.py``).
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def interrupted_line(exc: KeyboardInterrupt) -> str:
    """The one line printed on stderr: ``interrupted``, ``interrupted (SIGTERM)`` when SIGTERM raised it."""
    if isinstance(exc, Interrupted) and exc.signum != signal.SIGINT:
        return f"interrupted ({signal.Signals(exc.signum).name})"
    return "interrupted"

"""The launcher's CLI entry point run in-process, with an Ansible runner that must not be called.

A bad input that needs no host must be rejected before any playbook runs. :func:`run_cli` calls
``launcher.main.cli(argv)`` in this process with ``launcher.backends.runner.PlaybookRunner`` replaced by
:class:`RunnerMustNotBeCalled`, a test double that records and refuses any construction or call (and so does
``ansible_runner.run``/``run_async``, the one library below it). The result says whether it was reached.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from mift_testsupport.paths import REPO_ROOT

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence


class RunnerReachedError(AssertionError):
    """The Ansible runner was constructed or called where no playbook may run."""


class RunnerMustNotBeCalled:
    """Test double for ``launcher.backends.runner.PlaybookRunner``: records the attempt, raises
    RunnerReachedError."""

    calls: ClassVar[list[str]] = []

    def __init__(self, *args: object, **kwargs: object) -> None:
        what = f"PlaybookRunner({', '.join([*map(repr, args), *(f'{k}={v!r}' for k, v in kwargs.items())])})"
        RunnerMustNotBeCalled.calls.append(what)
        raise RunnerReachedError(f"{what}: a playbook would run for an input that must be rejected first")

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401 - never reached: __init__ raises
        raise RunnerReachedError(f"PlaybookRunner.{name} called")


def _ansible_runner_must_not_be_called(*args: object, **kwargs: object) -> None:
    what = f"ansible_runner.run(playbook={kwargs.get('playbook')!r})"
    RunnerMustNotBeCalled.calls.append(what)
    raise RunnerReachedError(f"{what}: a playbook would run for an input that must be rejected first")


@contextlib.contextmanager
def runner_must_not_be_called() -> Iterator[list[str]]:
    """Replace the launcher's Ansible runner by :class:`RunnerMustNotBeCalled`; yield the list of attempts.

    The one seam where the launcher builds its runner (``launcher.backends.runner.make_runner`` builds the
    module's ``PlaybookRunner``) gets the double, and so do ``ansible_runner.run`` and ``run_async``.
    """
    import ansible_runner  # noqa: PLC0415 - the launcher's dependency, imported with it

    import launcher.backends.runner  # noqa: PLC0415 - imported here so that importing this module stays cheap

    patched: list[tuple[object, str, object]] = [
        (launcher.backends.runner, "PlaybookRunner", launcher.backends.runner.PlaybookRunner)
    ]
    patched += [(ansible_runner, n, getattr(ansible_runner, n)) for n in ("run", "run_async")]
    RunnerMustNotBeCalled.calls = []
    try:
        for obj, name, _ in patched:
            double = RunnerMustNotBeCalled if name == "PlaybookRunner" else _ansible_runner_must_not_be_called
            setattr(obj, name, double)
        yield RunnerMustNotBeCalled.calls
    finally:
        for obj, name, original in patched:
            setattr(obj, name, original)


@dataclass
class CliResult:
    """What one in-process CLI call did."""

    rc: int
    stdout: str
    stderr: str
    seconds: float
    runner_calls: list[str] = field(default_factory=list)


def _set_environ(values: Mapping[str, str | None]) -> None:
    """Set each variable (None: unset it)."""
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@contextlib.contextmanager
def _environ(values: Mapping[str, str | None]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    try:
        _set_environ(values)
        yield
    finally:
        _set_environ(saved)


def _exit_status(exc: SystemExit) -> int:
    """The exit status of a process ended by ``exc`` (a message is printed to stderr, status 1)."""
    if exc.code is None or isinstance(exc.code, int):
        return int(exc.code or 0)
    print(exc.code, file=sys.stderr)
    return 1


def run_cli(argv: Sequence[str], *, env: Mapping[str, str | None] | None = None) -> CliResult:
    """Run ``launcher.main.cli(argv)`` from the repository root, the runner replaced by the double.

    ``env`` sets (or, with None, unsets) environment variables for the call. stdout, stderr and the
    launcher's log lines are captured; ``SystemExit`` becomes the exit status a process would have; an
    exception other than these and the runner double's propagates.
    """
    from launcher.main import cli  # noqa: PLC0415 - the code under test

    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    root.handlers = []  # the CLI's logging.basicConfig then logs to the captured stderr, as in a process
    t0 = time.monotonic()
    try:
        with (
            _environ(env or {}),
            contextlib.chdir(REPO_ROOT),
            runner_must_not_be_called() as calls,
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            try:
                rc = int(cli(list(argv)))
            except SystemExit as exc:  # what `python -m launcher` (sys.exit(cli())) would exit with
                rc = _exit_status(exc)
            except RunnerReachedError:
                rc = -1
    finally:
        root.handlers, root.level = saved_handlers, saved_level
    return CliResult(rc, out.getvalue(), err.getvalue(), time.monotonic() - t0, list(calls))

"""Entry point: ``python -m launcher`` (and the ``mi300x-launcher`` console script).

The exit status never depends on the instant a SIGINT or SIGTERM lands (docs/launcher.md "Exit codes"):

- from the first line of :func:`main` until the command's outcome is decided, the first signal raises
  :class:`~launcher.exceptions.Interrupted` (a ``KeyboardInterrupt`` for every ``except`` that cleans up):
  the launcher prints ``interrupted`` and exits 1; later signals are noted, never raised a second time;
- once the outcome is decided (the exit path), both signals are ignored: the command's own code stands, also
  while the interpreter shuts down.

Why not Python's own ``KeyboardInterrupt``: CPython 3.11 marks "an unhandled KeyboardInterrupt" whenever one
leaves code run from a string (``exec`` of a string: dataclasses, namedtuple and pydantic build classes that
way), even when a caller catches it, and then ends the process by SIGINT after it exited 1 (return code -2).
It tests the exception's exact type, so a subclass is never marked. And the interpreter resets a Python-level
handler to the default one while it shuts down: a signal in that window killed a process whose command had
ended.
"""

from __future__ import annotations

import signal
import sys
import types

from launcher.exceptions import Interrupted, interrupted_line
from launcher.exit_codes import JOB_FAILED

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _FirstSignal:
    """The launcher's handler: the first signal raises :class:`Interrupted`, later ones are only counted."""

    def __init__(self) -> None:
        self.received: list[int] = []

    def __call__(self, signum: int, _frame: types.FrameType | None) -> None:
        self.received.append(signum)
        if len(self.received) == 1:
            raise Interrupted(signum)


def _ignore_signals() -> None:
    """The outcome is decided: from now on SIGINT and SIGTERM change nothing (SIG_IGN survives shutdown)."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def main() -> None:
    """Run the command line and exit with its code; a signal before the outcome is decided exits 1."""
    # Python leaves SIGINT ignored when it was ignored at start (a job started in the background of a
    # non-interactive shell, a CI runner): then a Ctrl-C or `kill -INT` during validation was lost and the job
    # started anyway. The launcher always answers SIGINT, and SIGTERM the same way.
    handler = _FirstSignal()
    code: int = JOB_FAILED
    try:
        # inside the try: a signal right after the first handler is set is caught too; SIGTERM first, so that
        # once SIGINT is caught (all a caller can see) SIGTERM is as well
        for sig in reversed(SIGNALS):
            signal.signal(sig, handler)
        from launcher.main import cli  # noqa: PLC0415 - a signal during the imports is caught too

        code = cli()
    except Interrupted as interrupted:  # the handler raises once: nothing raises again in here
        print(interrupted_line(interrupted), file=sys.stderr)
        code = JOB_FAILED
    try:  # the exit path
        _ignore_signals()
    except Interrupted as interrupted:  # the first signal landed after the outcome, before it was fixed
        print(interrupted_line(interrupted), file=sys.stderr)
        code = JOB_FAILED
        _ignore_signals()
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


if __name__ == "__main__":
    main()

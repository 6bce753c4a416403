"""Entry point: ``python -m launcher``."""

from __future__ import annotations

import signal
import sys


def main() -> None:
    """Run the command line and exit with its code; Ctrl-C before a command set its own handler exits 1."""
    # Python leaves SIGINT ignored when it was ignored at start (a job started in the background of a
    # non-interactive shell, a CI runner): then a Ctrl-C or `kill -INT` during validation was lost and the job
    # started anyway. The launcher always answers SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        from launcher.main import cli  # noqa: PLC0415 - a Ctrl-C during the imports is caught too

        code: int = cli()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()

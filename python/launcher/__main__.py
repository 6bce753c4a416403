"""Entry point: ``python -m launcher``."""

from __future__ import annotations

import sys


def main() -> None:
    """Run the command line and exit with its code; Ctrl-C before a command set its own handler exits 1."""
    try:
        from launcher.main import cli  # noqa: PLC0415 - a Ctrl-C during the imports is caught too

        code: int = cli()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()

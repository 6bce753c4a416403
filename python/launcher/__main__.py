"""Entry point: ``python -m launcher``."""

from __future__ import annotations

import sys

from launcher.main import cli


def main() -> None:
    """Run the command line and exit with its code."""
    sys.exit(cli())


if __name__ == "__main__":
    main()

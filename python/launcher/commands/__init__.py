"""One module per command; each exposes ``register(subparsers)``.

A command module adds its subparser and sets ``func`` to a function taking the parsed
``argparse.Namespace`` and returning an :class:`~launcher.exit_codes.ExitCode`.
"""

from __future__ import annotations

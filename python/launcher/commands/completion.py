"""``completion {bash,zsh}``: the shell completion script of ``mi300x-launcher``, generated from this parser
by shtab (docs/launcher.md "Shell completion"); run ids complete from the runs folder."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from launcher.exit_codes import OK, ExitCode

if TYPE_CHECKING:
    import argparse

PROG = "mi300x-launcher"  # the console script (pyproject.toml): the name a shell completes
SHELLS = ("bash", "zsh")
# the run-id positionals (``status``, ``logs``, ``stop``): each shell's function below, named by shtab's key
RUN_IDS = {"bash": "_mift_run_ids", "zsh": "_mift_run_ids"}


def _preamble(shell: str, root: str) -> str:
    """Return the shell function that lists the run ids (folders with a record.json) under the runs folder:
    ``MIFT_RUNS_DIR`` when set where the shell completes, else ``root`` (where this launcher keeps them)."""
    listing = (
        f'local root="${{MIFT_RUNS_DIR:-{shlex.quote(root)}}}" d; '
        'for d in "$root"/*/record.json; do [ -e "$d" ] && d="${d%/record.json}" && echo "${d##*/}"; done'
    )
    if shell == "bash":
        return f'_mift_run_ids() {{\n  compgen -W "$({{ {listing}; }} 2>/dev/null)" -- "$1"\n}}\n'
    ids = f'ids=(${{(f)"$({{ {listing}; }} 2>/dev/null)"}})'
    return f"_mift_run_ids() {{\n  local -a ids\n  {ids}\n  compadd -a ids\n}}\n"


def add_run_argument(parser: argparse.ArgumentParser, *, optional: bool = True) -> None:
    """Add the run positional (``optional``: the latest run when left out), completed from the runs folder
    (shtab reads the action's ``complete``)."""
    if optional:
        action = parser.add_argument(
            "run", nargs="?", help="run id or unique prefix (default: the latest run)"
        )
    else:
        action = parser.add_argument("run", help="run id or unique prefix")
    action.complete = RUN_IDS  # type: ignore[attr-defined]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``completion`` subcommand."""
    p = subparsers.add_parser(
        "completion",
        help="print the shell completion script (bash, zsh)",
        description=f"Print the completion script of {PROG} for SHELL: commands, options, choices, files, "
        'and run ids from the runs folder. bash: `eval "$(mi300x-launcher completion bash)"` in ~/.bashrc; '
        'zsh: `mi300x-launcher completion zsh > "${fpath[1]}/_mi300x-launcher"`.',
    )
    p.add_argument("shell", choices=SHELLS)
    p.set_defaults(func=_cmd_completion)
    return p


def _cmd_completion(args: argparse.Namespace) -> ExitCode:
    print(completion_script(args.shell, args.root_parser), end="")
    return OK


def completion_script(shell: str, parser: argparse.ArgumentParser) -> str:
    """Return the completion script of ``shell`` for the parser (``launcher.main.build_parser``)."""
    import copy  # noqa: PLC0415

    import shtab  # noqa: PLC0415 - only this command needs it

    from launcher.spec.repo import STATE_DIR  # noqa: PLC0415

    parser = copy.copy(parser)
    parser.prog = PROG
    script: str = shtab.complete(parser, shell=shell, preamble=_preamble(shell, str(STATE_DIR / "runs")))
    return script

"""Node side of the launch playbook: put the node program and the run's bundle in the run directory, then
start the trainer.

Run as ``python3 mift_node-<hash>.pyz install RUN_DIR COMMAND [AGENT_ARGS...]`` (COMMAND: ``start``, or
``prepare`` for the Slurm backend, which starts the trainer later through ``srun``; ``shared-prepare`` for
its login-host-only mode: RUN_DIR is the shared run root and the bundles are ``rank<N>/bundle.json``) with one
JSON object on stdin: file name -> text (``bundle.json``; ``expect.json`` and the ranks' bundles for
``shared-prepare``). The run directory is made 0700; the program this runs from is copied into it as
``mift_node.pyz`` (0700), every other file is written 0600 (the bundle holds the environment, which may hold
tokens). Then ``python3 RUN_DIR/mift_node.pyz agent COMMAND RUN_DIR ARGS`` replaces this process: its JSON
answer and exit status are the task's. Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

from .contract import PROGRAM_FILE

RANK_FILE_RE = re.compile(r"^rank[0-9]+/bundle\.json$")  # a rank's bundle under a shared run root
COMMANDS = ("start", "prepare", "shared-prepare")


def install(run_dir: Path, files: dict[str, str], ranks: bool = False) -> None:
    """Write ``files`` into ``run_dir`` (made 0700), each 0600; refuse a name that is a path (``ranks``:
    except ``rank<N>/bundle.json``, into the rank's folder, made 0700) or the program's own name."""
    bad = [
        name
        for name in files
        if not name
        or name.startswith(".")
        or name == PROGRAM_FILE
        or ("/" in name and not (ranks and RANK_FILE_RE.match(name)))
    ]
    if bad:
        raise SystemExit(f"mift_install: refusing file name {bad[0]!r}")
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    run_dir.chmod(0o700)
    for name, text in files.items():
        path = run_dir / name
        if "/" in name:
            path.parent.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        path.chmod(0o600)


def shipped_file() -> Path:
    """The zipapp this runs from (``<file>.pyz/mift_node/install.py`` -> ``<file>.pyz``)."""
    here = Path(__file__).parents[1]
    if not here.is_file():
        raise SystemExit(f"mift_install: runs from the shipped node program only, not from {here}")
    return here


def copy_program(run_dir: Path) -> Path:
    """Copy the node program into ``run_dir`` (0700, replaced atomically); return its path there."""
    target = run_dir / PROGRAM_FILE
    tmp = run_dir / f".{PROGRAM_FILE}.{os.getpid()}"
    shutil.copyfile(shipped_file(), tmp)
    tmp.chmod(0o700)
    tmp.replace(target)
    return target


def main(argv: list[str] | None = None) -> int:
    """Install from stdin, then exec the agent's COMMAND (``start``, ``prepare`` or ``shared-prepare``)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        raise SystemExit("usage: mift_node.pyz install RUN_DIR start|prepare|shared-prepare [AGENT_ARGS...]")
    run_dir, command = Path(args[0]), args[1]
    if command not in COMMANDS:
        raise SystemExit(f"mift_install: unknown agent command {command!r}")
    install(run_dir, json.load(sys.stdin), ranks=command == "shared-prepare")
    program = str(copy_program(run_dir))
    # the agent replaces this process (no shell: argv as given)
    os.execv(sys.executable, [sys.executable, program, "agent", command, str(run_dir), *args[2:]])  # noqa: S606
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())

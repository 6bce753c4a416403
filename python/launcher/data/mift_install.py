"""Node side of the launch playbook: write the node agent and the run's bundle, then start the trainer.

Run as ``python3 -c "<this file>" RUN_DIR COMMAND [AGENT_ARGS...]`` (COMMAND: ``start``, or ``prepare``
for the Slurm backend, which starts the trainer later through ``srun``; ``shared-prepare`` for its
login-host-only mode: RUN_DIR is the shared run root and the bundles are ``rank<N>/bundle.json``) with one
JSON object on stdin: file name -> text (``mift_agent.py``, ``mift_contract.py``, ``mift_probe.py``,
``mift_gpu.py``, ``bundle.json``). The run directory is made 0700; ``*.py`` files are written 0700, every
other file 0600 (the bundle holds the environment, which may hold tokens). Then
``mift_agent.py COMMAND RUN_DIR ARGS`` replaces this process: its JSON answer and exit status are the task's.
One task, one ssh round trip per node, instead of a directory, three copies and a command.
Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

RANK_FILE_RE = re.compile(r"^rank[0-9]+/bundle\.json$")  # a rank's bundle under a shared run root


def install(run_dir: Path, files: dict[str, str], ranks: bool = False) -> None:
    """Write ``files`` into ``run_dir`` (made 0700) with the modes above; refuse a name that is a path
    (``ranks``: except ``rank<N>/bundle.json``, into the rank's folder, made 0700)."""
    bad = [
        name
        for name in files
        if not name or name.startswith(".") or ("/" in name and not (ranks and RANK_FILE_RE.match(name)))
    ]
    if bad:
        raise SystemExit(f"mift_install: refusing file name {bad[0]!r}")
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    run_dir.chmod(0o700)
    for name, text in files.items():
        mode = 0o700 if name.endswith(".py") else 0o600
        path = run_dir / name
        if "/" in name:
            path.parent.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        path.chmod(mode)


def main() -> None:
    """Install from stdin, then exec the agent's COMMAND (``start`` or ``prepare``)."""
    run_dir = Path(sys.argv[1])
    command = sys.argv[2]
    install(run_dir, json.load(sys.stdin), ranks=command == "shared-prepare")
    agent = str(run_dir / "mift_agent.py")
    # the agent replaces this process (no shell: argv as given)
    if command not in ("start", "prepare", "shared-prepare"):
        raise SystemExit(f"mift_install: unknown agent command {command!r}")
    os.execv(sys.executable, [sys.executable, agent, command, str(run_dir), *sys.argv[3:]])  # noqa: S606


main()

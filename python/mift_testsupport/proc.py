"""Subprocesses with their output in the failure message, and the Ansible command-line tools."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping


def run(
    argv: list[str],
    *,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    timeout: float = 300,
    cwd: Path | None = None,
    stdin: int | None = subprocess.DEVNULL,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with text output captured; with ``check``, a failure raises and shows the output."""
    proc = subprocess.run(
        argv,
        env=dict(env) if env is not None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        stdin=stdin,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"command failed (rc={proc.returncode}): {' '.join(argv)}\n"
            f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
        )
    return proc


def ansible_bin(name: str) -> str:
    """Return the Ansible CLI ``name`` next to this interpreter (the project venv), else from PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found next to {sys.executable} nor on PATH")
    return found


def playbooks_against(inventory: Path) -> list[str]:
    """Return ``pid: command line`` of every ansible-playbook process (a playbook or one of its workers, which
    run in sessions of their own) still running against ``inventory``: after the launcher has exited, none
    may be (docs/launcher.md "Failure semantics": stopping a playbook)."""
    left = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            line = " ".join(a.decode(errors="replace") for a in argv)
            if "ansible-playbook" in line and str(inventory) in line:
                left.append(f"{entry.name}: {line}")
    return left

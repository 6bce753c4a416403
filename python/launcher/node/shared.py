"""The node agent on a Slurm login host (docs/slurm.md "Login host only"):
``shared-prepare|status|collect|stop``, the command for every rank folder of a shared run root. Standard
library only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import contract
from .bundle import cmd_prepare
from .collect import cmd_collect
from .common import STATE_FILE, _now, read_json, write_json
from .status import cmd_status

SHARED_COMMANDS = ("shared-prepare", "shared-status", "shared-collect", "shared-stop")


def rank_dirs(root: Path) -> list[Path]:
    """Return the node run directories under a shared run root (``rank0``, ``rank1``, ...), in rank order."""
    found = [p for p in root.glob("rank*") if p.is_dir() and p.name[4:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[4:]))


def cmd_shared(command: str, root: Path, grace: float, job_gone: bool) -> dict[str, Any]:
    """Run ``command`` (prepare, status, collect, stop) for every rank of a shared run root, on the login
    host: ``{"ok", "results": {rank: {command: answer}}}`` (the launcher's ``mift_results`` shape).

    On the login host no trainer process is visible: the ranks' state files (written by ``slurm-step`` on the
    nodes) are the truth, and ``stop`` (after ``scancel``) records a rank Slurm ended without its state
    written as stopped, and reports it left only while the job is still on its nodes (``job_gone`` False).
    """
    del grace  # the nodes' processes are Slurm's to end (scancel); nothing here signals them
    results: dict[str, dict[str, Any]] = {}
    ok = True
    for run_dir in rank_dirs(root):
        if command == "prepare":
            answer = cmd_prepare(run_dir)
            name = "start"
        elif command == "status":
            answer, name = {"ok": True, **cmd_status(run_dir, remote=True)}, "status"
        elif command == "collect":
            answer, name = cmd_collect(run_dir, remote=True), "collect"
        else:
            answer, name = _shared_stop(run_dir, job_gone), "stop"
        ok = ok and bool(answer.get("ok"))
        results[run_dir.name] = {name: answer}
    return {"ok": ok, "results": results}


def _shared_stop(run_dir: Path, job_gone: bool) -> dict[str, Any]:
    state = read_json(run_dir / STATE_FILE)
    active = state.get("state") in (contract.RUNNING, contract.STARTING, contract.QUEUED)
    if not active:
        return {"ok": True, "changed": False, "left": [], "state": state.get("state")}
    if not job_gone:
        return {"ok": False, "changed": False, "left": ["the slurm job is still on its nodes"], **state}
    state.update({"state": contract.STOPPED, "ended_at": _now(), "note": "ended by slurm (scancel)"})
    write_json(run_dir / STATE_FILE, state)
    return {"ok": True, "changed": True, "left": [], "state": contract.STOPPED}

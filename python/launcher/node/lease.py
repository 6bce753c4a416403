#!/usr/bin/env python3
"""Node side of the per-node GPU lease (engine/lease.py): one JSON file that says which run holds this
node's GPUs. Standard library only; run by the node's ``python3`` as the node program's ``lease``
(``playbooks/launch.yml`` takes, ``collect.yml`` gives back, ``lease.yml`` gives back after a failed start).

    python3 mift_node.pyz lease take LEASE_FILE RUNS_ROOT LEASE_JSON STALE_S [--force]
    python3 mift_node.pyz lease release LEASE_FILE RUN_ID

``take`` writes the lease (atomically: a temporary file renamed over it, under an flock of
``LEASE_FILE.lock``) when there is none, when it is this run's own (a retry), when the holder's lease is
stale, or with ``--force``; else it leaves the holder's lease alone and answers with it. A lease is stale
when its run ended on this node (its node run directory's state.json ended, or its ``rc`` file exists) or
when no process of its run is left on this node (``MIFT_AGENT_KEY=<run_id>@`` in a process's environment)
and it was taken more than STALE_S seconds ago (a controller killed between the lease and the start, or a
run whose trainers are gone). ``release`` removes the lease when this run holds it. Each prints one JSON
object.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

# the node run directory's state.json once its trainer ended (mift_contract: EXITED, STOPPED, FAILED,
# FINISHED)
ENDED = ("exited", "stopped", "failed", "finished")


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write(path: Path, lease: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w") as fh:
        json.dump(lease, fh)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "w") as fh:  # noqa: PTH123
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def processes_of(run_id: str) -> list[int]:
    """Return the pids of this node whose environment carries the run's agent key."""
    key = f"MIFT_AGENT_KEY={run_id}@".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if any(item.startswith(key) for item in environ.split(b"\0")):
            found.append(int(proc.name))
    return found


def stale_because(lease: dict[str, Any], runs_root: Path, stale_s: float, now: float) -> str:
    """Return why the lease of another run is stale ('' when it is live)."""
    run_id = str(lease.get("run_id") or "")
    run_dir = runs_root / run_id
    state = (_read(run_dir / "state.json") or {}).get("state")
    if run_id and (state in ENDED or (run_dir / "rc").exists()):
        return f"its run ended on this node ({state or 'rc written'})"
    age = now - float(lease.get("started_at") or 0)
    if age > stale_s and not processes_of(run_id):
        return f"no process of its run on this node, leased {age:.0f} s ago (over {stale_s:.0f} s)"
    return ""


def take(path: Path, runs_root: Path, lease: dict[str, Any], stale_s: float, force: bool) -> dict[str, Any]:
    with _locked(path):
        now = time.time()
        held = _read(path)
        if held is None or held.get("run_id") == lease["run_id"]:
            _write(path, {**lease, "taken_at": now})
            return {"taken": True, "changed": True}
        why = stale_because(held, runs_root, stale_s, now)
        if why or force:
            _write(path, {**lease, "taken_at": now})
            return {"taken": True, "changed": True, "took_over": held, "why": why or "--force"}
        return {"taken": False, "changed": False, "holder": held}


def release(path: Path, run_id: str) -> dict[str, Any]:
    with _locked(path):
        held = _read(path)
        if held is not None and held.get("run_id") == run_id:
            path.unlink()
            return {"released": True, "changed": True}
        return {"released": False, "changed": False, "holder": held}


def main(argv: list[str]) -> int:
    if len(argv) >= 5 and argv[0] == "take":
        answer = take(
            Path(argv[1]), Path(argv[2]), json.loads(argv[3]), float(argv[4]), "--force" in argv[5:]
        )
    elif len(argv) == 3 and argv[0] == "release":
        answer = release(Path(argv[1]), argv[2])
    else:
        print(json.dumps({"error": f"usage: take|release ..., got {argv[:1]}"}))
        return 2
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

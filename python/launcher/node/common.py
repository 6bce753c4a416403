"""What every command of the node agent shares: the run directory's state files, process identity (boot id and
start time), the run's marker in every process's environment and the sweep that ends them. Standard library
only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

from . import contract

MARKER = contract.MARKER
STATE_FILE = contract.STATE_FILE
LOG_TAIL_BYTES = 4096
GIB = 1024**3
# printed by a ZeRO-3 rank on CPU when a gloo thread races interpreter teardown after training finished
TEARDOWN_ABORT = "terminate called without an active exception"
WORLD_SIZE_RE = re.compile(r"world size: (\d+)")
JOINED_RE = re.compile(r"Process rank: (\d+), world size: (\d+)")
# lines that tell how a trainer failed (the launcher's recovery classifies them): torchrun's report of a rank
# killed by a signal, out of memory, GPU and collective errors; the last FAILURE_LINES of them are reported
FAILURE_RE = re.compile(
    r"Signal \d+ \(SIG|exitcode\s*:\s*-?\d+|out of memory|OutOfMemoryError|HIP error|CUDA error|hipError|"
    r"cudaError|NCCL error|RCCL error|ECC error|GPU Hang|stalled"
)
FAILURE_LINES = 12
# torchrun's failure report (``<entrypoint> FAILED``): each failed rank's global rank and exit status
# (negative: the signal that killed it). After one rank fails, torchrun stops its siblings with SIGTERM, and
# they appear there as ``exitcode : -15``: the launcher's recovery tells them from a rank killed from outside
REPORT_START = "\nFailures:\n"
REPORT_RANK_RE = re.compile(
    r"^\s*rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", re.MULTILINE
)
# RCCL/NCCL's init line naming the network its collectives use between nodes (NCCL_DEBUG=INFO, subsystem
# INIT; ``INFO(NCCL_INIT, "Using network %s", ...)`` in init.cc): ``Socket`` is TCP sockets; ``IB``,
# ``IBext_v8``, ... RDMA through verbs or a net plugin. The launcher judges it (launcher/fabric/runtime.py).
NET_RE = re.compile(r"NCCL INFO Using network (\S+)")


def _now() -> float:
    return round(time.time(), 3)


def write_json(path: Path, data: dict[str, Any], mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    tmp.replace(path)


def read_json(path: Path) -> dict[str, Any]:
    """Return the JSON object in ``path`` ({} when absent or unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _alive(pid: int | None) -> bool:
    """Return True when ``pid`` exists and is not a zombie."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _identity(pid: int | None) -> str | None:
    """Return ``<boot id>:<start time>`` of a live ``pid``: what tells a process from a later one that got its
    pid (pids are reused; a reboot restarts the count), else None."""
    if not pid:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return f"{boot}:{fields[19]}" if len(fields) > 19 and fields[0] != "Z" else None  # field 22: starttime


def _supervisor_alive(state: dict[str, Any]) -> bool:
    """Return True when the state file's supervisor still runs: its pid is alive and, when the state file
    recorded its identity, is the same process (not a later one that got the pid)."""
    pid = state.get("supervisor_pid")
    recorded = state.get("supervisor_id")
    if recorded is None:  # written by an agent of before the identity: the pid is all there is
        return _alive(pid)
    return bool(_identity(pid) == recorded)


def agent_key(run_id: str, run_dir: Path) -> str:
    """Return the marker value of this node's processes of a run."""
    return f"{run_id}@{run_dir}"


def marked_pids(key: str) -> list[int]:
    """Return the live processes whose environment carries the marker ``key``."""
    needle = f"{MARKER}={key}".encode()
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0") and _alive(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def _ours(pid: int | None, key: str) -> bool:
    """Return True when ``pid`` is a live process of this run (it carries the run's marker ``key``).

    A pid read from the state file may name a process that ended long ago and whose pid now belongs to
    another program (pids are reused; a busy node wraps ``pid_max`` quickly): only a process that carries the
    marker is this run's, to signal or to count as its trainer."""
    if not pid or not _alive(pid):
        return False
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{MARKER}={key}".encode() in env.split(b"\0")


def _signal_all(pgid: int | None, key: str, sig: int) -> None:
    if pgid is not None and _ours(pgid, key):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for pid in marked_pids(key):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def sweep(pgid: int | None, key: str, grace: float) -> list[int]:
    """SIGTERM everything of the run, SIGKILL what is left after ``grace`` s; return pids still alive."""
    _signal_all(pgid, key, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not marked_pids(key) and not _ours(pgid, key):
            return []
        time.sleep(0.2)
    _signal_all(pgid, key, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = marked_pids(key)
        if not left:
            return []
        time.sleep(0.2)
    return marked_pids(key)


def output_dir_of(run_dir: Path, job: dict[str, Any]) -> Path:
    """Return the job's output directory on this node (relative to the run dir, or absolute)."""
    return run_dir / str(job.get("output_dir") or "output")

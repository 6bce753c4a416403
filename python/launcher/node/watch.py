"""What the progress watchdog reads on a node (``status`` -> ``watch``): the newest checkpoint, every rank's
process and state, the flight recorder's environment and files. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from .common import agent_key, marked_pids, output_dir_of

# --- the progress watchdog (launcher/watchdog.py decides; here: what this node shows, the stack dumps) ---
STACK_PREFIX = "stack-"  # stack-<rank N | program>-<pid>.txt in the node run directory
# PyTorch's flight recorder (ProcessGroupNCCL, RCCL on ROCm): the launcher asks for it with
# TORCH_NCCL_TRACE_BUFFER_SIZE on GPU runs; its dumps (on a collective's timeout, or when a byte is written to
# the rank's pipe) land in the node run directory as nccl-trace-rank<N>
FLIGHT_RECORDER_DUMP = "nccl-trace-rank"
FLIGHT_RECORDER_PIPE = "nccl-trace-pipe-rank"  # <this><N>.pipe, a FIFO made by the rank
PY_SPY_TIMEOUT_S = 20.0


def flight_recorder_env(env: dict[str, str], run_dir: Path) -> None:
    """Point the flight recorder's dump files and dump pipe into the run directory (when it is on)."""
    try:
        size = int(env.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or 0)
    except ValueError:
        size = 0
    if size > 0:
        env.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", str(run_dir / FLIGHT_RECORDER_DUMP))
        env.setdefault(
            "TORCH_FR_DUMP_TEMP_FILE", env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
        )  # torch >= 2.7's name
        env.setdefault("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", str(run_dir / FLIGHT_RECORDER_PIPE))


def _proc_environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _proc_state(pid: int) -> str:
    """Return the process state letter (R, S, D, T, Z, ...; '' when gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return ""


def _proc_cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def rank_processes(key: str) -> list[dict[str, Any]]:
    """Return the run's training ranks on this host (torchrun's workers: RANK in their environment)."""
    ranks = []
    for pid in marked_pids(key):
        env = _proc_environ(pid)
        if "RANK" in env:
            ranks.append(
                {
                    "pid": pid,
                    "rank": env["RANK"],
                    "local_rank": env.get("LOCAL_RANK"),
                    "state": _proc_state(pid),
                }
            )
    return ranks


def checkpoint_fact(output_dir: Path) -> dict[str, Any] | None:
    """Return the newest checkpoint-N of output_dir: its step, whether it is complete (trainer_state.json,
    written last) and the newest write in it (a save in progress keeps moving it)."""
    try:
        found = [(int(p.name[11:]), p) for p in output_dir.glob("checkpoint-*") if p.name[11:].isdigit()]
    except OSError:
        return None
    if not found:
        return None
    step, folder = max(found)
    newest = 0.0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                newest = max(newest, os.stat(os.path.join(root, name)).st_mtime)  # noqa: PTH116,PTH118
    return {"step": step, "complete": (folder / "trainer_state.json").is_file(), "mtime": round(newest, 3)}


def watch_facts(run_dir: Path, job: dict[str, Any]) -> dict[str, Any]:
    """What the progress watchdog needs of this node besides the logged step: the newest checkpoint and the
    state of every training rank."""
    run_id = str(job.get("run_id") or "")
    return {
        "checkpoint": checkpoint_fact(output_dir_of(run_dir, job)),
        "ranks": rank_processes(agent_key(run_id, run_dir)) if run_id else [],
    }

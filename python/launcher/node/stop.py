"""The node agent's ``stop``: SIGTERM the trainer's group and every marked process, SIGKILL after the grace
period; with ``--dump-stacks`` first the stacks of every process of the run (py-spy, the kernel's view) and a
poke of the flight recorder. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from . import contract
from .common import (
    STATE_FILE,
    _now,
    _ours,
    _supervisor_alive,
    agent_key,
    marked_pids,
    read_json,
    sweep,
    write_json,
)
from .watch import (
    FLIGHT_RECORDER_DUMP,
    FLIGHT_RECORDER_PIPE,
    PY_SPY_TIMEOUT_S,
    STACK_PREFIX,
    _proc_cmd,
    _proc_environ,
    _proc_state,
)


def _py_spy(job: dict[str, Any]) -> str | None:
    argv = job.get("argv") or []
    beside = Path(str(argv[0])).parent / "py-spy" if argv else None
    if beside is not None and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def _kernel_view(pid: int) -> str:
    """Per thread: state, wait channel and kernel stack (works on any process, stopped or blocked)."""
    lines = []
    for task in sorted(
        Path(f"/proc/{pid}/task").glob("*"), key=lambda p: int(p.name) if p.name.isdigit() else 0
    ):
        try:
            comm = (task / "comm").read_text().strip()
            state = (task / "stat").read_text().rsplit(")", 1)[-1].split()[0]
            wchan = (task / "wchan").read_text().strip()
        except (OSError, IndexError):
            continue
        lines.append(f"thread {task.name} ({comm}) state {state} wchan {wchan or '-'}")
        with contextlib.suppress(OSError):
            lines.extend("    " + line for line in (task / "stack").read_text().splitlines())
    return "\n".join(lines)


def poke_flight_recorder(run_dir: Path) -> list[str]:
    """Write a byte into every rank's flight-recorder pipe (the rank dumps its trace); return the pipes."""
    poked = []
    for pipe in sorted(run_dir.glob(FLIGHT_RECORDER_PIPE + "*.pipe")):
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue  # no reader: the rank is gone
        with contextlib.suppress(OSError):
            os.write(fd, b"1")
        os.close(fd)
        poked.append(pipe.name)
    return poked


def dump_stacks(run_dir: Path, job: dict[str, Any]) -> list[str]:
    """Write ``stack-<label>-<pid>.txt`` for every process of the run: py-spy's Python stacks (read without
    stopping the process, ``--nonblocking``: py-spy's default mode pauses the process, which fails on a
    SIGSTOPped one) and the kernel's view of every thread; poke the flight recorder.
    Return the files written."""
    run_id = str(job.get("run_id") or "")
    if not run_id:
        return []
    spy = _py_spy(job)
    poke_flight_recorder(run_dir)
    written = []
    for pid in marked_pids(agent_key(run_id, run_dir)):
        env = _proc_environ(pid)
        cmd = _proc_cmd(pid)
        label = (
            f"rank{env['RANK']}"
            if "RANK" in env
            else re.sub(r"[^A-Za-z0-9_.-]", "_", Path(cmd.split(" ")[0] or "proc").name)
        )
        head = [
            f"pid {pid} state {_proc_state(pid)} rank {env.get('RANK', '-')} local_rank "
            f"{env.get('LOCAL_RANK', '-')}",
            f"cmd {cmd[:500]}",
            "",
        ]
        if spy is None:
            body = "py-spy: not installed in the node venv nor on PATH"
        else:
            try:
                out = subprocess.run(
                    [spy, "dump", "--pid", str(pid), "--nonblocking"],
                    capture_output=True,
                    text=True,
                    timeout=PY_SPY_TIMEOUT_S,
                    check=False,
                )
                body = f"py-spy dump --nonblocking (rc {out.returncode}):\n{out.stdout}{out.stderr}"
            except (OSError, subprocess.TimeoutExpired) as err:
                body = f"py-spy dump --nonblocking failed: {err}"
        path = run_dir / f"{STACK_PREFIX}{label}-{pid}.txt"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write("\n".join([*head, body, "", "kernel (/proc/PID/task/*):", _kernel_view(pid), ""]))
        written.append(path.name)
    return written


def watch_files(run_dir: Path) -> list[Path]:
    """Return the stack dumps and flight-recorder traces of the run directory (for collect)."""
    found = [*run_dir.glob(STACK_PREFIX + "*.txt"), *run_dir.glob(FLIGHT_RECORDER_DUMP + "*")]
    return sorted(p for p in found if p.is_file())


def cmd_stop(run_dir: Path, grace: float, dump: bool = False) -> dict[str, Any]:
    """Stop every process of the run on this node; safe to call again (``dump``: write stack dumps of every
    process of the run first, :func:`dump_stacks`)."""
    job = read_json(run_dir / contract.JOB_FILE)
    run_id = str(job.get("run_id") or "")
    if not run_id:
        return {"ok": True, "changed": False, "left": [], "note": "no job here"}
    state = read_json(run_dir / STATE_FILE)
    key = agent_key(run_id, run_dir)
    before = marked_pids(key)
    pgid = state.get("pid")
    running = bool(before) or _ours(pgid, key)
    stacks = dump_stacks(run_dir, job) if dump and running else []
    if running:
        (run_dir / contract.STOP_FILE).write_text(f"{_now()}\n")
    left = sweep(pgid, key, grace) if running else []
    # wait for the supervisor to record the end, so status reads "stopped" right after
    deadline = time.monotonic() + 5
    while running and time.monotonic() < deadline and _supervisor_alive(state):
        time.sleep(0.1)
    state = read_json(run_dir / STATE_FILE)
    if state.get("state") in (
        contract.RUNNING,
        contract.STARTING,
    ):  # the supervisor is gone too: record it here
        state.update({"state": contract.STOPPED, "ended_at": _now(), "rc": state.get("rc")})
        write_json(run_dir / STATE_FILE, state)
    return {
        "ok": not left,
        "changed": running,
        "killed": before,
        "left": left,
        "state": state.get("state"),
        **({"stacks": stacks} if dump else {}),
    }

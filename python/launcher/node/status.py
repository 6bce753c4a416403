"""The node agent's ``status``: the trainer's state, liveness and exit status, the last logged step, the
failure lines, NCCL's network and which expected outputs exist. Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from . import contract
from . import gpu as mift_gpu
from .common import (
    FAILURE_LINES,
    FAILURE_RE,
    JOINED_RE,
    LOG_TAIL_BYTES,
    NET_RE,
    REPORT_RANK_RE,
    REPORT_START,
    STATE_FILE,
    TEARDOWN_ABORT,
    WORLD_SIZE_RE,
    _ours,
    _supervisor_alive,
    agent_key,
    marked_pids,
    output_dir_of,
    read_json,
)
from .slurm import requeue_causes
from .watch import watch_facts


def _last_jsonl(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 8192))
            lines = fh.read().splitlines()
    except OSError:
        return {}
    last: dict[str, Any] = {}
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        if not last:
            last = entry
        if "loss" in entry:  # the final line of a run has no loss: show the last one logged
            return {**entry, **last} if "loss" in last else {**last, "loss": entry["loss"]}
    return last


def rank_exits(text: str) -> list[dict[str, int]]:
    """Return each failed rank's exit status from the last torchrun failure report in ``text``, by rank
    (``[]`` when there is none: the trainer still runs, ended well, or torchrun itself was killed)."""
    start = text.rfind(REPORT_START)
    if start < 0:
        return []
    found = {int(m.group(1)): int(m.group(2)) for m in REPORT_RANK_RE.finditer(text, start)}
    return [{"rank": rank, "exitcode": code} for rank, code in sorted(found.items())]


def _log_facts(log: Path, offset: int = 0) -> dict[str, Any]:
    """Return what the trainer log says: ranks that joined, world size, a teardown abort, how it failed, the
    last lines, the networks RCCL/NCCL chose; ``offset``: where the current start's output begins (earlier
    starts are not judged)."""
    try:
        with log.open("rb") as fh:
            fh.seek(offset if 0 < offset <= log.stat().st_size else 0)
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return {
            "ranks_joined": [],
            "world_size": None,
            "teardown_abort": False,
            "failure_lines": [],
            "rank_exits": [],
            "log_tail": "",
            "net_transport": None,
        }
    joined = sorted({int(m.group(1)) for m in JOINED_RE.finditer(text)})
    sizes = [int(m) for m in WORLD_SIZE_RE.findall(text)]
    failures = [line.strip()[:300] for line in text[-65536:].splitlines() if FAILURE_RE.search(line)]
    return {
        "ranks_joined": joined,
        "world_size": sizes[-1] if sizes else None,
        "teardown_abort": TEARDOWN_ABORT in text,
        "failure_lines": failures[-FAILURE_LINES:],
        "rank_exits": rank_exits(text),
        "log_tail": "\n".join(text[-LOG_TAIL_BYTES:].splitlines()[-8:]),
        "net_transport": net_transport(text),
    }


def net_transport(text: str) -> list[str] | None:
    """Return the networks RCCL/NCCL said it uses (``Using network X``), in the order first seen; None when
    no rank printed the line (not initialized yet, NCCL_DEBUG not INFO, or no RCCL/NCCL: gloo)."""
    names = list(dict.fromkeys(NET_RE.findall(text)))
    return names or None


def _processes(job: dict[str, Any], run_dir: Path) -> int:
    """Return how many processes carry the run's marker on this host."""
    return len(marked_pids(agent_key(str(job["run_id"]), run_dir))) if job.get("run_id") else 0


def cmd_status(run_dir: Path, remote: bool = False) -> dict[str, Any]:
    """Report the node's view of the run (``remote``: read on another host through a shared folder, where
    the pids mean nothing: the state file is the answer)."""
    job = read_json(run_dir / contract.JOB_FILE)
    state = read_json(run_dir / STATE_FILE)
    name = state.get("state", contract.ABSENT)
    if remote:
        trainer_alive = name == contract.RUNNING
    else:
        run_id = str(job.get("run_id") or "")
        trainer_alive = bool(run_id) and _ours(state.get("pid"), agent_key(run_id, run_dir))
        if name == contract.RUNNING and not _supervisor_alive(state):
            name = contract.RUNNING if trainer_alive else contract.VANISHED
    if name == contract.STARTING and time.time() - float(state.get("started_at") or 0) > 60:
        name = contract.VANISHED
    output_dir = output_dir_of(run_dir, job)
    expect = [str(e) for e in job.get("expect_outputs", [])]
    outputs = {e: (output_dir / e).exists() for e in expect}
    rc = state.get("rc")
    if name == contract.EXITED:
        name = contract.FINISHED if rc == 0 else contract.FAILED
    return {
        "run_id": job.get("run_id"),
        "node_rank": job.get("node_rank"),
        "state": name,
        "rc": rc,
        "reason": state.get("reason"),
        "pid": state.get("pid"),
        "trainer_alive": trainer_alive,
        "started_at": state.get("started_at"),
        "ended_at": state.get("ended_at"),
        "last_log": _last_jsonl(output_dir / "trainer_log.jsonl"),
        "outputs": outputs,
        "outputs_complete": bool(expect) and all(outputs.values()),
        "output_dir": str(output_dir),
        "processes": None if remote else _processes(job, run_dir),
        **{k: state[k] for k in ("slurm_node", "master_addr") if state.get(k)},  # a Slurm task's placement
        **({k: state.get(k) for k in ("restart", "resume_step")} if state.get("restart") else {}),
        **_requeues(run_dir),
        **_log_facts(run_dir / "trainer.log", int(state.get("log_offset") or 0)),
        **({} if remote else {"watch": watch_facts(run_dir, job)}),
        **mift_gpu.status_fields(run_dir),
    }


def _requeues(run_dir: Path) -> dict[str, Any]:
    """Return ``{"requeues": {attempt: cause}}`` from the batch output on the node that ran the batch script
    of a requeued job, else {}."""
    try:
        text = (run_dir / "slurm.out").read_text(errors="replace")
    except OSError:
        return {}
    causes = requeue_causes(text)
    return {"requeues": causes} if causes else {}


def cmd_watch(run_dir: Path, every: float, seconds: float) -> int:
    """``status`` every ``every`` s, one JSON line each, for ``seconds`` s or until nobody reads them (the
    controller's ssh session ended: the next write fails) -- the launcher's streamed follow
    (launcher/backends/ssh_stream.py): one ssh session per node for a whole follow, no Ansible task a poll."""
    deadline = time.monotonic() + seconds
    while True:
        t0 = time.monotonic()
        try:
            sys.stdout.write(json.dumps({"ok": True, **cmd_status(run_dir)}) + "\n")
            sys.stdout.flush()
        except OSError:  # BrokenPipeError: the session is gone
            return 0
        if t0 + every >= deadline:
            return 0
        time.sleep(max(0.0, every - (time.monotonic() - t0)))

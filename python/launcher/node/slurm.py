"""The node agent under Slurm: ``slurm-step`` (one srun task: rank and master from the allocation),
``slurm-check`` (login host only: a node checks itself), requeue causes, ``slurm-checkpoints`` and
``resume-step``. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import contract
from .bundle import SLURM_GPU_ENV, mark_latest
from .common import GIB, STATE_FILE, _now, agent_key, output_dir_of, read_json, sweep, write_json
from .probe import free_bytes, installed_versions, local_facts
from .probe_paths import checkpoints
from .supervise import _supervise


def slurm_nodes(nodelist: str) -> list[str]:
    """Return the node names of a Slurm node list (``scontrol show hostnames``), in allocation order."""
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True, timeout=30
    )
    return out.stdout.split()


def slurm_placement(environ: dict[str, str], nodes: list[str]) -> dict[str, str]:
    """Return the environment a Slurm task sets for its trainer: rank, node count, master, GPU binding."""
    placed = {
        "NODE_RANK": environ["SLURM_NODEID"],
        "NNODES": str(len(nodes)),
        "MASTER_ADDR": nodes[0],
    }
    placed.update({k: environ[k] for k in SLURM_GPU_ENV if k in environ})
    return placed


def rank_dir(root: Path, environ: dict[str, str]) -> Path:
    """Return this task's node run directory under a shared run root: ``rank<SLURM_NODEID>``."""
    return root / f"rank{int(environ['SLURM_NODEID'])}"


def slurm_node(environ: dict[str, str]) -> str:
    """Return the Slurm node this task runs on."""
    return environ.get("SLURMD_NODENAME") or socket.gethostname()


def cmd_slurm_checkpoints(run_dir: Path) -> dict[str, Any]:
    """Return this node's Slurm name and the steps of the complete checkpoints in the job's output_dir."""
    job = read_json(run_dir / contract.JOB_FILE)
    steps = checkpoints(output_dir_of(run_dir, job)) if job.get("run_id") else []
    return {"ok": bool(job.get("run_id")), "node": slurm_node(dict(os.environ)), "checkpoints": steps}


def resume_step(lines: list[str], nodes: int) -> int | None:
    """Return the newest checkpoint step every one of ``nodes`` nodes listed (``slurm-checkpoints`` lines),
    None when they hold none in common; raise ValueError when fewer than ``nodes`` nodes answered."""
    found: dict[str, set[int]] = {}
    for line in lines:
        with contextlib.suppress(ValueError):
            answer = json.loads(line)
            if isinstance(answer, dict) and answer.get("ok"):
                found[str(answer.get("node"))] = {int(x) for x in answer.get("checkpoints") or []}
    if len(found) < nodes:
        raise ValueError(f"{len(found)} of {nodes} nodes listed their checkpoints")
    common = set.intersection(*found.values()) if found else set()
    return max(common) if common else None


def resume_argv(argv: list[str], output_dir: Path, step: int | None) -> list[str]:
    """Return the trainer's command line for a restart: from ``checkpoint-<step>`` of the output_dir
    (LLaMA-Factory merges ``key=value`` arguments after the YAML into it), or as the first attempt's when no
    checkpoint is complete on every node."""
    if step is None:
        return list(argv)
    return [*argv, f"resume_from_checkpoint={output_dir}/checkpoint-{step}", "overwrite_output_dir=false"]


# slurm.out lines (slurmstepd's, the batch script's) that say why an attempt of a requeued job ended
REQUEUE_CAUSE_RE = re.compile(
    r"mift: time limit: requeued|DUE TO (NODE FAILURE|PREEMPTION|JOB REQUEUE|TIME LIMIT)"
)
REQUEUE_CAUSES = {
    "NODE FAILURE": "node failure",
    "PREEMPTION": "preemption",
    "JOB REQUEUE": "requeue",
    "TIME LIMIT": "time limit",
}
ATTEMPT_RE = re.compile(r"^mift: attempt (\d+) of slurm job")


def requeue_causes(text: str) -> dict[str, str]:
    """Return attempt number -> why it ended (``node failure``, ``preemption``, ``time limit``,
    ``requeue``: scontrol requeue) from the batch output of a requeued job; the first cause of an attempt
    wins (the time-limit trap's requeue shows as ``JOB REQUEUE`` after its own line)."""
    causes: dict[str, str] = {}
    attempt = 0
    for line in text.splitlines():
        start = ATTEMPT_RE.match(line)
        if start:
            attempt = int(start.group(1))
            continue
        match = REQUEUE_CAUSE_RE.search(line)
        if match and attempt:
            cause = REQUEUE_CAUSES[match.group(1)] if match.group(1) else "time limit"
            causes.setdefault(str(attempt), cause)
    return causes


def cmd_slurm_step(
    run_dir: Path, grace: float, ranks: bool = False, restart: int = 0, step: int | None = None
) -> dict[str, Any]:
    """Run this node's trainer as one task of a Slurm step (foreground); return how it ended.

    ``ranks``: RUN_DIR is a shared run root (login host only); this node's run directory is its rank's.
    ``restart``: Slurm's restart count (0: the first attempt); a restart resumes from ``checkpoint-<step>``
    (None: from where the first attempt began).
    """
    if ranks:
        run_dir = rank_dir(run_dir, dict(os.environ))
    job = read_json(run_dir / contract.JOB_FILE)
    if not job.get("run_id"):
        return {"ok": False, "error": f"{run_dir}/{contract.JOB_FILE}: no job here (not prepared)"}
    env = read_json(run_dir / contract.ENV_FILE)
    placed = slurm_placement(dict(os.environ), slurm_nodes(os.environ["SLURM_JOB_NODELIST"]))
    # the node's state says where Slurm put it and the rendezvous it used (the launcher's record takes them)
    extra: dict[str, Any] = {"slurm_node": slurm_node(dict(os.environ)), "master_addr": placed["MASTER_ADDR"]}
    env.update({k: v for k, v in placed.items() if k not in SLURM_GPU_ENV or k not in env})
    write_json(run_dir / contract.ENV_FILE, env, 0o600)
    job["node_rank"] = int(placed["NODE_RANK"])
    write_json(run_dir / contract.JOB_FILE, job, 0o600)
    for name in (STATE_FILE, contract.RC_FILE, contract.PID_FILE, contract.STOP_FILE):
        with contextlib.suppress(FileNotFoundError):
            (run_dir / name).unlink()
    key = agent_key(str(job["run_id"]), run_dir)

    def on_term(signum: int, _frame: object) -> None:
        # scancel, a time limit or another node's failure (--kill-on-bad-exit): stop the trainer; the
        # supervisor's wait then returns and records the run as stopped
        (run_dir / contract.STOP_FILE).write_text(f"{_now()} slurm {signal.Signals(signum).name}\n")
        state = read_json(run_dir / STATE_FILE)
        sweep(state.get("pid"), key, grace)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if restart:
        extra.update(restart=restart, resume_step=step)
        output_dir = output_dir_of(run_dir, job)
        if step is not None:  # DeepSpeed's `latest` on the nodes that lack it (every one but rank 0's)
            mark_latest(run_dir, {**job, "resume_from": f"{output_dir}/checkpoint-{step}"})
        job = {**job, "argv": resume_argv([str(a) for a in job["argv"]], output_dir, step)}
    _supervise(run_dir, job, grace, extra)
    state = read_json(run_dir / STATE_FILE)
    return {"ok": state.get("rc") == 0, **state}


EXPECT_FILE = "expect.json"  # shared run root: what the plan was made for (the login host's probe)


def node_check(run_dir: Path, expect: dict[str, Any], local: dict[str, dict[str, Any]]) -> str:
    """Return why this node cannot run its rank of the job ('' when it can): the bundle unpacked, the trainer
    entry point, the stack versions the plan was made for, GPUs verified, free disk for the outputs."""
    job = read_json(run_dir / contract.JOB_FILE)
    if not job.get("run_id"):
        return f"{run_dir}/{contract.JOB_FILE}: no job here (not prepared)"
    cli = Path(str(job["argv"][0]))
    if not os.access(cli, os.X_OK):
        return f"{cli} not found: provision the node (ansible-playbook provision.yml)"
    wanted = expect.get("versions")
    if isinstance(wanted, dict) and wanted:
        found = installed_versions(cli.parent.parent, tuple(sorted(wanted))) or {}
        for dist in sorted(wanted):
            if str(found.get(dist)) != str(wanted[dist]):
                return (
                    f"{dist} is {found.get(dist) or 'not installed'}, the job was planned for "
                    f"{wanted[dist]} (the login host's); re-run provision.yml"
                )
    gpus = local.get("mift_gpus") or {}
    if str(gpus.get("verified", "")).lower() in ("false", "0", "no"):
        return f"GPUs not verified (ansible_local.mift_gpus, arch {gpus.get('arch') or 'unknown'})"
    need = int(expect.get("min_free_bytes") or 0)
    free = free_bytes(run_dir)
    if free < need:
        return f"only {free / GIB:.1f} GiB free for output_dir, the job spec asks for {need / GIB:g} GiB"
    return ""


def cmd_slurm_check(root: Path) -> dict[str, Any]:
    """The in-allocation preflight of the login-host-only mode (one task per node, before any trainer):
    check this node (:func:`node_check`); a node that fails records why as its rank's state and exits 1."""
    environ = dict(os.environ)
    run_dir = rank_dir(root, environ)
    node = slurm_node(environ)
    if not run_dir.is_dir():
        why = f"{run_dir}: no such run directory (not prepared)"
        print(f"mift_agent: {node}: preflight: {why}", file=sys.stderr)
        return {"ok": False, "error": why, "slurm_node": node}
    expect = read_json(root / EXPECT_FILE)
    facts_dir = expect.get("facts_dir")  # the node layout's, from the launcher (no copy of it here)
    why = (
        node_check(run_dir, expect, local_facts(Path(str(facts_dir))))
        if facts_dir
        else f"{root / EXPECT_FILE}: no facts_dir (written by an older launcher): submit the run again"
    )
    state = read_json(run_dir / STATE_FILE)
    if why:
        state = {"state": contract.EXITED, "rc": 3, "reason": f"preflight: {why}", "ended_at": _now()}
        state["slurm_node"] = node
        print(f"mift_agent: {node} (rank {environ['SLURM_NODEID']}): preflight: {why}", file=sys.stderr)
    else:
        state = {**state, "preflight": "ok", "slurm_node": node}
    write_json(run_dir / STATE_FILE, state)
    return {"ok": not why, **state}

"""The node agent's bundle: ``bundle.json`` unpacked into the run directory (checked against the contract),
the ``latest`` mark, and ``prepare`` (the Slurm backends: unpack, record ``queued``). Standard library only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from . import contract
from .common import STATE_FILE, _now, output_dir_of, read_json, write_json
from .probe_paths import checkpoints


def unpack_bundle(run_dir: Path) -> str | None:
    """Write the files of ``bundle.json`` (``mift_contract.Bundle``) into the run dir, then delete it.

    Every file is written 0600. Returns why the bundle is unusable (None: unpacked, or no bundle).
    """
    bundle_path = run_dir / contract.BUNDLE_FILE
    if not bundle_path.exists():
        return None
    try:
        bundle = contract.bundle_from(json.loads(bundle_path.read_text()))
    except (OSError, ValueError) as err:
        return str(err)
    for name, text in bundle["files"].items():
        fd = os.open(run_dir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
    write_json(run_dir / contract.JOB_FILE, dict(bundle["job"]), 0o600)
    write_json(run_dir / contract.ENV_FILE, dict(bundle["env"]), 0o600)
    bundle_path.unlink()
    return None


def mark_latest(run_dir: Path, job: dict[str, Any]) -> str | None:
    """Give the checkpoint this node resumes from a DeepSpeed ``latest`` file when it lacks one.

    DeepSpeed writes ``latest`` (the tag to load) on global rank 0's node only; on every other node's own copy
    of the checkpoint the load would fail ("Unable to find latest file"). The tag is the checkpoint's only
    ``global_step*`` folder. Returns the tag written, or None.
    """
    resume = job.get("resume_from")
    if not resume:
        return None
    output_dir = output_dir_of(run_dir, job)
    if resume == "last":
        steps = checkpoints(output_dir)
        if not steps:
            return None
        ckpt = output_dir / f"checkpoint-{steps[-1]}"
    else:
        ckpt = run_dir / str(resume)
    tags = sorted(p.name for p in ckpt.glob("global_step*") if p.is_dir())
    if len(tags) != 1 or (ckpt / "latest").exists():
        return None
    (ckpt / "latest").write_text(tags[0])
    return tags[0]


def _unpacked_job(run_dir: Path) -> tuple[dict[str, Any], str]:
    """Unpack the bundle; return the run's job (mift_contract.Job) and '' or ({}, why it is unusable)."""
    bad = unpack_bundle(run_dir)
    if bad:
        return {}, f"{run_dir}/{bad}"
    try:
        job: dict[str, Any] = dict(contract.job_from(read_json(run_dir / contract.JOB_FILE)))
    except contract.ContractError as err:
        return {}, f"{run_dir}/{err}"
    mark_latest(run_dir, job)
    return job, ""


def cmd_prepare(run_dir: Path) -> dict[str, Any]:
    """Unpack the bundle and record the run as queued; the trainer is started later by ``slurm-step``."""
    job, bad = _unpacked_job(run_dir)
    if bad:
        return {"ok": False, "error": bad}
    state = read_json(run_dir / STATE_FILE)
    if state.get("state") == contract.QUEUED:
        return {"ok": True, "changed": False, **state}
    state = {"state": contract.QUEUED, "queued_at": _now(), "node_rank": job.get("node_rank")}
    write_json(run_dir / STATE_FILE, state)
    return {"ok": True, "changed": True, **state}


# Slurm's GPU binding of the step, passed to the trainer unless the job's environment sets them itself
SLURM_GPU_ENV = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")

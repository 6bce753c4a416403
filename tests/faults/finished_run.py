"""The faults suite's one uninterrupted run of the recovery job, shared by the cases that only read it: the
recovery cases compare their losses with its (the same job, seed and checkpoints, nothing injected but the
slow step they share), and ``secret-env`` checks that the hub token in its environment appears nowhere but
the node env file. Before, ``secret-env`` started a run of its own (one run more per CI: a trainer start on 2
hosts and 8 steps, about 60 CPU-s).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass

from mift_testsupport.cluster import INJECT_DIR, Cluster

NAME = "faults-rec-ref"
# the resume cases' length: the kill comes at step 6, checkpoints every 4; the resumed attempt's 16 steps
# (5-20) are compared with the reference's (40 before 2026-12-06: 40 unpaced steps cost about 1.5 cores for
# 30 s, and the reference, the killed and the spare runs each ran them)
STEPS = 20
SAVE_STEPS = 4
KILL_AT = 6
# the tiny model steps every ~0.7 s: the 7th training step of each process sleeps 8 s first (inject/, a TEST
# DOUBLE), so step 6 stays the last logged long enough for the kill from outside to land there; the losses
# are not touched, and the reference run gets the same environment
SLOW_ENV = {
    "OMP_NUM_THREADS": 1,
    "DS_ACCELERATOR": "cpu",
    "PYTHONPATH": INJECT_DIR,
    "MIFT_FAULTS_SLOW_STEPS": f"{KILL_AT + 1}:8",
}


@dataclass(frozen=True)
class Finished:
    """The finished run: its launcher output, its run id, host1's step -> loss, and the secret it carried."""

    run_id: str
    out: subprocess.CompletedProcess[str]
    losses: dict[int, float]
    secret: str


def logged_losses(cluster: Cluster, run_id: str) -> tuple[list[int], dict[int, float]]:
    """Host1's logged steps in order (every attempt appends) and step -> loss (the last logged for a step)."""
    entries = cluster.trainer_log(1, f"/var/lib/mift/runs/{run_id}/output")
    steps = [int(entry["current_steps"]) for entry in entries]
    losses = {
        int(entry["current_steps"]): float(entry["loss"])
        for entry in entries
        if isinstance(entry.get("loss"), int | float)
    }
    return steps, losses


def finish_a_run(cluster: Cluster) -> Finished:
    """Run the recovery job (STEPS steps, a checkpoint every SAVE_STEPS) to its end, a hub token (HF_TOKEN, a
    secret the launcher must mask) in its environment; the slow-step test double installed first."""
    cluster.install_injection()
    secret = f"hf_faultsSECRET{int(time.time())}"
    job = cluster.job(NAME, max_steps=STEPS, save_steps=SAVE_STEPS, env={**SLOW_ENV, "HF_TOKEN": secret})
    out = cluster.run("run", str(job), "-i", str(cluster.inventory), timeout=1200)
    run_id = str(cluster.record(NAME).get("run_id", ""))
    return Finished(run_id=run_id, out=out, losses=logged_losses(cluster, run_id)[1], secret=secret)

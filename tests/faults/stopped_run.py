"""The faults suite's one stopped run, shared by three cases: a job Ctrl-C'd (SIGINT to ``launcher run``)
while following it, once checkpoint-4 exists. ``ctrl-c-follow`` checks the stop (no trainer within 30 s, the
launcher's exit, the logs kept); ``resume-run-option`` resumes it and ``resume-job-spec`` resumes a copy of
its output_dir. Before, ``ctrl-c-follow`` started a run of its own for the same SIGINT (one run more per CI:
its trainer start on 2 hosts, about 50 CPU-s).
"""

from __future__ import annotations

import re
import signal
import time
from dataclasses import dataclass

from mift_testsupport.cluster import Cluster
from mift_testsupport.launcher import finish

NAME = "faults-resume"
RESUME_OUT = "/var/lib/mift/output/faults-resume"
# the job-spec route resumes a copy of the stopped run's output_dir (the same files, another folder)
RESUME_COPY = f"{RESUME_OUT}-copy"
# about a step a second here: enough steps that the Ctrl-C (which takes seconds to reach the nodes) lands
# before the end, few enough that the resumed run finishes soon. It is sent once checkpoint-4 exists; at load
# 8-12 on the 2-core controller the runs stopped at steps 21 and 24 (with 30 steps: too little slack)
RESUME_STEPS = 40


@dataclass(frozen=True)
class Stopped:
    """The stopped run: how its Ctrl-C ended it, and what the resume cases continue."""

    run_id: str
    rc: int  # the launcher's exit status
    took: float  # seconds from the SIGINT to the last trainer process seen on any host
    ended: float  # seconds from the SIGINT to the launcher's exit
    status: str  # the run's status in its record
    out: str  # the launcher's output, its end
    last: int  # the last checkpoint complete on every node
    stopped_at: int  # the last step it logged
    logged: int  # the lines of its trainer_log.jsonl


def logged_steps(cluster: Cluster, host: int, output_dir: str = RESUME_OUT) -> list[int]:
    """Return the steps ``output_dir``'s trainer_log.jsonl holds on ``host``, in order."""
    return [int(entry["current_steps"]) for entry in cluster.trainer_log(host, output_dir)]


def last_complete_checkpoint(cluster: Cluster) -> int:
    """The step a resume must start after: the last checkpoint complete (trainer_state.json written) on every
    node. A Ctrl-C that lands while a checkpoint is being saved leaves that folder cut short on one node or
    both (CI saw checkpoint-16 listed, 12 the last complete one); docs/launcher.md: resume skips such folders.
    """
    complete = []
    for host in cluster.hosts:
        listed = cluster.ssh(host, f"ls {RESUME_OUT}/checkpoint-*/trainer_state.json 2>/dev/null; true")
        complete.append({int(m) for m in re.findall(r"checkpoint-(\d+)/trainer_state\.json", listed)})
    return max(set.intersection(*complete), default=0)


def stop_a_run(cluster: Cluster) -> Stopped:
    """Run a RESUME_STEPS-step job saving every 4 steps into RESUME_OUT; SIGINT the launcher once checkpoint-4
    exists, watching the hosts until no trainer is left; copy its output_dir to RESUME_COPY on every node."""
    for host in cluster.hosts:
        cluster.ssh(host, f"rm -rf {RESUME_OUT} {RESUME_COPY}")
    job = cluster.job(NAME, max_steps=RESUME_STEPS, save_steps=4, output_dir=RESUME_OUT)
    proc, log = cluster.start("run", str(job), "-i", str(cluster.inventory))
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if cluster.ssh(1, f"test -d {RESUME_OUT}/checkpoint-4 && echo yes", check=False).strip():
            break
        time.sleep(0.5)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    took, ended = cluster.watch_until_clean(proc, t0)
    out = finish(proc, log, timeout=10)
    record = cluster.record(NAME)
    for host in cluster.hosts:
        cluster.ssh(host, f"cp -a {RESUME_OUT} {RESUME_COPY}")
    steps = logged_steps(cluster, 1)
    return Stopped(
        run_id=str(record.get("run_id", "")),
        rc=int(proc.returncode),
        took=took,
        ended=ended,
        status=str(record.get("status")),
        out=out[-3000:],
        last=last_complete_checkpoint(cluster),
        stopped_at=max(steps or [0]),
        logged=len(steps),
    )

"""The faults suite's one stopped run, shared by four cases: a job Ctrl-C'd (SIGINT to ``launcher run``)
while following it, once checkpoint-4 exists. ``ctrl-c-follow`` checks the stop (no trainer within 30 s, the
launcher's exit, the logs kept); ``resume-run-option`` resumes it and ``resume-job-spec`` resumes a copy of
its output_dir; ``env-value-metachar-as-data`` reads, while its trainers run, how an env value full of shell
code (``EVIL``, in the job's env) reached them. Before, ``ctrl-c-follow`` and the env case each started a run
of their own (one run more per CI each: a trainer start on 2 hosts, 20-50 CPU-s).
"""

from __future__ import annotations

import json
import re
import signal
import time
from dataclasses import dataclass

import yaml

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
# a valid env value full of shell code: it must reach the trainers verbatim and run nowhere
EVIL = "$(touch /tmp/pwned) `touch /tmp/pwned2`; touch /tmp/pwned3 && echo 'q\"uote' | sh #"


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
    # host -> (EVIL verbatim in the node env file, verbatim in the trainer's environ, files it planted)
    evil: dict[int, tuple[bool, bool, list[str]]]


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


def evil_seen(cluster: Cluster, run_id: str) -> dict[int, tuple[bool, bool, list[str]]]:
    """Host -> whether EVIL is verbatim in the node env file and in the running trainer's environ, and the
    /tmp/pwned* files on the host."""
    seen = {}
    for host in cluster.hosts:
        env_file = json.loads(cluster.node_file(host, run_id, "env.json") or "{}")
        pid = cluster.node_state(host, run_id).get("pid")
        environ = cluster.ssh(host, f"tr '\\0' '\\n' < /proc/{int(pid or 0)}/environ", check=False)
        planted = cluster.ssh(host, "ls /tmp/pwned* 2>/dev/null || true").split()
        verbatim = f"MIFT_FAULTS_EVIL={EVIL}" in environ
        seen[host] = (env_file.get("MIFT_FAULTS_EVIL") == EVIL, verbatim, planted)
    return seen


def stop_a_run(cluster: Cluster) -> Stopped:
    """Run a RESUME_STEPS-step job saving every 4 steps into RESUME_OUT, EVIL in its env; once checkpoint-4
    exists, read how EVIL reached the trainers, then SIGINT the launcher, watching the hosts until no trainer
    is left; copy its output_dir to RESUME_COPY on every node."""
    for host in cluster.hosts:
        cluster.ssh(host, f"rm -rf {RESUME_OUT} {RESUME_COPY}")
    env = {**(yaml.safe_load(cluster.base.job.read_text()).get("env") or {}), "MIFT_FAULTS_EVIL": EVIL}
    job = cluster.job(NAME, max_steps=RESUME_STEPS, save_steps=4, output_dir=RESUME_OUT, env=env)
    proc, log = cluster.start("run", str(job), "-i", str(cluster.inventory))
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if cluster.ssh(1, f"test -d {RESUME_OUT}/checkpoint-4 && echo yes", check=False).strip():
            break
        time.sleep(0.5)
    evil = evil_seen(cluster, str(cluster.record(NAME).get("run_id", "")))
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
        evil=evil,
    )

"""The progress watchdog on 2 test hosts x 2 ranks (``RANKS_PER_HOST``): a trainer rank that stops making
progress (SIGSTOP) ends the run as ``stalled`` within its window, naming the node and the rank, with one stack
dump per rank of every node in the run directory; a slow checkpoint save and a slow first step (both injected)
are no stall.

The slowness is injected by ``inject/sitecustomize.py`` (a TEST DOUBLE, put first on the trainer's
PYTHONPATH through the job spec's ``env``): HF's Trainer sleeps in its first ``training_step`` or its first
``_save_checkpoint``.
The windows are short (job spec ``watchdog``), so that each case takes about 2 minutes.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path
from typing import Any

import pytest

from launcher.spec.jobspec import JobSpec
from mift_testsupport.cluster import INJECT_DIR, RANKS_PER_HOST, Cluster
from mift_testsupport.launcher import finish

from .conftest import HOSTS
from .test_faults import LONG_STEPS

pytestmark = [pytest.mark.rig, pytest.mark.slow]

# short windows: 20 s between steps (the tiny model steps every 1-3 s here), 5 minutes for the first step (the
# trainer's start-up on the shared 2 cores), 60 s for a save
WATCHDOG = {"k": 5, "floor_s": 20, "first_step_s": 300, "save_s": 60, "eval_s": 60}
SLOW_S = 45  # the injected slowness: more than the 20 s step window, less than first_step_s and save_s
# the stall is seen at the first poll after the window ran out: a poll period (the job spec's default) and a
# poll's own time (ansible-playbook on the loaded 2 cores: up to ~10 s) after it
POLL_SLACK_S = JobSpec.model_fields["poll_interval_s"].default + 10.0
ENV = {"OMP_NUM_THREADS": 1, "DS_ACCELERATOR": "cpu"}


def _host_step(cluster: Cluster, host: int, run_id: str) -> int:
    tail = cluster.ssh(
        host, f"tail -n 1 /var/lib/mift/runs/{shlex.quote(run_id)}/output/trainer_log.jsonl", check=False
    )
    try:
        return int(json.loads(tail).get("current_steps", 0))
    except (ValueError, AttributeError):
        return 0


def _wait_host_step(cluster: Cluster, host: int, run_id: str, step: int, seconds: float = 600) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen = _host_step(cluster, host, run_id)
        if seen >= step:
            return seen
        time.sleep(0.3)
    raise AssertionError(f"host{host}: step {step} not logged within {seconds:.0f} s")


# run on a host with the run id: one line "RANK PID LOCAL_RANK" per training rank of that run (torchrun's
# workers carry RANK and LOCAL_RANK in their environment)
RANK_PROBE = """python3 - {run_id} <<'EOF'
import os, sys
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        raw = open(f"/proc/{{pid}}/environ", "rb").read().decode(errors="replace")
    except OSError:
        continue
    env = dict(item.split("=", 1) for item in raw.split("\\0") if "=" in item)
    if env.get("MIFT_AGENT_KEY", "").startswith(sys.argv[1] + "@") and "RANK" in env:
        print(env["RANK"], pid, env.get("LOCAL_RANK", "-"))
EOF"""


def _rank_pids(cluster: Cluster, host: int, run_id: str) -> dict[int, tuple[int, int]]:
    """Return global rank -> (pid, local rank) of the run's training ranks on ``host``."""
    found = {}
    for line in cluster.ssh(host, RANK_PROBE.format(run_id=shlex.quote(run_id))).splitlines():
        rank, pid, local = line.split()
        found[int(rank)] = (int(pid), int(local))
    return found


def _stack_ranks(folder: Path) -> list[int]:
    """Return the global ranks that have a stack file (``stack-rank<N>-<pid>.txt``) in ``folder``."""
    names = (re.match(r"stack-rank(\d+)-\d+\.txt$", p.name) for p in folder.glob("stack-rank*.txt"))
    return sorted(int(m[1]) for m in names if m)


def test_sigstop_of_a_trainer_ends_the_run_stalled(cluster: Cluster, fault_record: dict[str, Any]) -> None:
    """SIGSTOP host2's second rank after step 3: stalled within the window, host2 and the rank named, one
    stack file per rank of both hosts kept, no process left."""
    world = len(HOSTS) * RANKS_PER_HOST
    fault_record.update(
        case="stall-sigstop",
        group="6 watchdog",
        input=f"{len(HOSTS)} hosts x {RANKS_PER_HOST} ranks; SIGSTOP to host2's last local rank after its "
        f"step 3; watchdog {WATCHDOG}",
        expected="launcher exits 1, status stalled naming host2 and the stopped rank (host2/rankN), within "
        f"the window (+ one poll) of the SIGSTOP; one stack file per rank ({world}) in nodes/<host>/; "
        "per-rank logs kept; no process left",
    )
    name = "faults-stall"
    # recovery off: this case shows the stop that ends a stalled run (recovery, on by default, retries it)
    job = cluster.job(
        name, max_steps=LONG_STEPS, paced=True, env=ENV, watchdog=WATCHDOG, recovery={"max_restarts": 0}
    )
    proc, log = cluster.start("run", str(job), "-i", str(cluster.inventory))
    run_id = cluster.wait_step(cluster.run_id_of(name), proc)
    at = _wait_host_step(cluster, 2, run_id, 3)
    ranks = _rank_pids(cluster, 2, run_id)
    assert sorted(ranks) == list(range(RANKS_PER_HOST, 2 * RANKS_PER_HOST)), ranks  # host2: node rank 1
    rank = max(ranks)
    pid, local = ranks[rank]
    cluster.ssh(2, f"kill -STOP {pid}")
    stopped_at = time.time()
    out = finish(proc, log, timeout=600)
    left = cluster.wait_no_trainers(60)
    rec = cluster.record(name)
    stall = rec.get("stall") or {}
    stalled_at = next((e["t"] for e in rec.get("timeline", []) if e["status"] == "stopping"), None)
    took = stalled_at - stopped_at if stalled_at else None
    run = cluster.run_dir(name)
    stacks = {h: _stack_ranks(run / "nodes" / f"host{h}") for h in HOSTS}
    rank_stack = run / "nodes" / "host2" / f"stack-rank{rank}-{pid}.txt"
    rank_text = rank_stack.read_text() if rank_stack.is_file() else ""
    rank_logs = sorted(p.relative_to(run).as_posix() for p in run.glob("nodes/*/rank*.stderr.log"))
    status = cluster.run("status", run_id)
    fault_record["observed"] = (
        f"SIGSTOP to host2/rank{rank} (local rank {local}, pid {pid}) after host2 logged step {at}; "
        f"launcher exit {proc.returncode}; status {rec.get('status')} ({rec.get('result_reason')}); window "
        f"{stall.get('window_s')} s, stalled {took:.1f} s after the SIGSTOP; lagging {stall.get('lagging')} "
        f"ranks {stall.get('lagging_ranks')}; stack files by rank: host1 {stacks[1]}, host2 {stacks[2]}; "
        f"host2/rank{rank} stack py-spy {'ok' if 'py-spy dump --nonblocking (rc 0)' in rank_text else 'NO'}; "
        f"per-rank logs {rank_logs}; no trainer process {left:.1f} s after the launcher ended"
        if took is not None
        else f"launcher exit {proc.returncode}; status {rec.get('status')}; timeline {rec.get('timeline')}"
    )
    print(fault_record["observed"])
    print("\n".join(line for line in status.stdout.splitlines() if "host" in line or "stall" in line))
    assert proc.returncode == 1, out[-3000:]
    assert rec.get("status") == "stalled", rec.get("timeline")
    assert stall.get("lagging") == ["host2"], stall
    assert stall.get("lagging_ranks") == [f"host2/rank{rank}"], stall
    assert f"host2/rank {rank} (pid {pid}) stopped (local rank {local})" in str(rec.get("result_reason"))
    assert took is not None and took <= float(stall["window_s"]) + POLL_SLACK_S, (took, stall)
    expected = {h: list(range((h - 1) * RANKS_PER_HOST, h * RANKS_PER_HOST)) for h in HOSTS}
    assert stacks == expected, stacks  # one stack file per rank, every rank of every node
    assert rank_text.startswith(f"pid {pid} state T rank {rank} local_rank {local}"), rank_text[:300]
    assert "py-spy dump --nonblocking (rc 0)" in rank_text and "Thread" in rank_text, rank_text[:2000]
    assert rank_logs == sorted(f"nodes/host{h}/rank{r}.stderr.log" for h in HOSTS for r in expected[h])
    assert f"lagging     host2: host2/rank {rank} (pid {pid}) stopped (local rank {local})" in status.stdout
    assert not any(cluster.trainer_processes().values())


def test_a_slow_first_step_and_a_slow_save_are_no_stall(
    cluster: Cluster, fault_record: dict[str, Any]
) -> None:
    """A first step and a checkpoint save each slower than the step window, in one run: it succeeds, no
    stall (one run shows both allowances: the first step's, then the save's, with step windows between)."""
    fault_record.update(
        case="no-stall-slow-first-step-and-save",
        group="6 watchdog",
        input=f"a {SLOW_S} s sleep injected into every rank's first step and another into its first "
        f"checkpoint save (save_steps 4 of 8 steps); watchdog {WATCHDOG}",
        expected="run exits 0, status succeeded (no stall); both injected sleeps ran on every rank",
    )
    cluster.install_injection()
    name = "faults-slow-first-step-and-save"
    env = {
        **ENV,
        "PYTHONPATH": INJECT_DIR,
        "MIFT_FAULTS_SLOW_FIRST_STEP_S": SLOW_S,
        "MIFT_FAULTS_SLOW_SAVE_S": SLOW_S,
    }
    job = cluster.job(name, max_steps=8, save_steps=4, env=env, watchdog=WATCHDOG)
    t0 = time.monotonic()
    out = cluster.run("run", str(job), "-i", str(cluster.inventory), timeout=900)
    took = time.monotonic() - t0
    rec = cluster.record(name)
    logs = "".join((p.read_text(errors="replace")) for p in cluster.run_dir(name).glob("nodes/*/trainer.log"))
    slept = {what: logs.count(f"mift-faults: slow {what}") for what in ("first step", "checkpoint save")}
    window = next((line for line in out.stdout.splitlines() if line.startswith("watchdog:")), "")
    fault_record["observed"] = (
        f"run exit {out.returncode} after {took:.0f} s; status {rec.get('status')}"
        f"{' (' + str(rec.get('result_reason')) + ')' if rec.get('result_reason') else ''}; "
        f"injected sleeps seen in the trainer logs: {slept}; steps {rec.get('summary', {}).get('steps')}"
    )
    print(window)
    print(fault_record["observed"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert rec.get("status") == "succeeded" and "stall" not in rec, rec.get("timeline")
    assert all(slept.values()), f"an injected sleep never ran (sitecustomize not picked up?): {slept}"
    assert not any(cluster.trainer_processes().values())

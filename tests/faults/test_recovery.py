"""Recovery on the test hosts: a run whose trainer is killed resumes by itself from the last
checkpoint complete on every node and finishes, with the losses of an uninterrupted run; a run out of retries
ends ``failed`` listing every attempt; a failure of the job itself is never retried; a node whose network is
cut is excluded and a spare takes its place.

The uninterrupted reference run (the same job, seed and checkpoints, nothing injected) is made once per
session and shared (``finished_run``, with the secrets case): its per-step losses are what the recovered run's
losses are compared with. The spare case runs on
3 hosts of its own rig (``FAULTS_SPARES_RIG_ID``, default 5) sharing one folder (the output_dir on a shared
file system that spares need), taken down after it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from mift_testsupport.cluster import Cluster
from mift_testsupport.image import provisioned_rig
from mift_testsupport.launcher import finish
from mift_testsupport.rig import rig_id_from_env

from .conftest import JOBS
from .finished_run import KILL_AT, SAVE_STEPS, SLOW_ENV, STEPS, Finished, logged_losses

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.rig, pytest.mark.slow]

LOSS_TOLERANCE = 0.01  # relative: the recovered run's loss at each step after the resume vs the reference's
FAST = {"backoff_s": 1}  # the suite's retries wait 1 s, not the default 30
# the spare case: 2 trainers and 1 spare of their own rig, the output_dir in a folder all 3 share
# (default 5; CI's faults-recovery stage runs after molecule kernel_upgrade and plan-global-batch in the same
# lane: FAULTS_SPARES_RIG_ID=7, FAULTS_RIG_ID=8)
SPARES_RIG_ID = rig_id_from_env("FAULTS_SPARES_RIG_ID", 5)
SHARED = Path(f"/srv/mift{SPARES_RIG_ID}-shared")  # the same path on the controller and in every host


def _rank_pid(cluster: Cluster, host: int, run_id: str) -> int | None:
    """The pid of the run's training rank on ``host`` (LLaMA-Factory's launcher.py under torchrun), if any."""
    probe = (
        "for p in $(pgrep -f 'llamafactory/launcher.py'); do "
        f"grep -qs 'MIFT_AGENT_KEY={run_id}@' /proc/$p/environ && echo $p; done; true"
    )
    pids = [int(p) for p in cluster.ssh(host, probe).split()]
    return max(pids) if pids else None


def _kill_at_step(
    cluster: Cluster, run_id: str, step: int, proc: Any, seconds: float = 900
) -> tuple[int, int]:
    """SIGKILL host2's training rank once host1 logged ``step``; return the step logged then and the pid."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"launcher ended (rc={proc.returncode}) before step {step}")
        steps = logged_losses(cluster, run_id)[0]
        if steps and steps[-1] >= step:
            pid = _rank_pid(cluster, 2, run_id)
            if pid is not None:
                cluster.ssh(2, f"kill -KILL {pid}")
                return steps[-1], pid
        time.sleep(0.3)
    raise AssertionError(f"step {step} not logged within {seconds:.0f} s")


def _kill_next_rank(cluster: Cluster, name: str, run_id: str, proc: Any, seconds: float = 600) -> None:
    """SIGKILL host2's training rank of attempt 2 after that attempt's first logged step (host1's
    trainer_log.jsonl written after attempt 2 began: the attempt starts from step 0 and rewrites it), so that
    both ranks run and the kill is the first failure every node sees."""
    log = f"/var/lib/mift/runs/{run_id}/output/trainer_log.jsonl"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"launcher ended (rc={proc.returncode}) before attempt 2's first step")
        attempts = cluster.record(name).get("attempts") or []
        if len(attempts) >= 2 and attempts[-1].get("state") == "running":
            mtime = cluster.ssh(1, f"stat -c %Y {log} 2>/dev/null; true").strip()
            steps = logged_losses(cluster, run_id)[0]
            pid = _rank_pid(cluster, 2, run_id)
            if mtime and float(mtime) > float(attempts[-1]["started_at"]) and steps and pid is not None:
                cluster.ssh(2, f"kill -KILL {pid}", check=False)
                return
        time.sleep(0.3)
    raise AssertionError(f"no logged step of attempt 2 within {seconds:.0f} s")


def _run_id(cluster: Cluster, name: str, proc: Any, seconds: float = 600) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        run_id = cluster.record(name).get("run_id")
        if run_id:
            return str(run_id)
        if proc.poll() is not None:
            raise AssertionError(f"launcher ended (rc={proc.returncode}) before its run existed")
        time.sleep(0.5)
    raise AssertionError(f"no run record for {name}")


def _attempts(record: dict[str, Any]) -> list[str]:
    return [
        f"#{a.get('attempt')} {a.get('state')} nodes={','.join(a.get('hosts') or [])} "
        f"resume={a.get('resume_step')} kind={a.get('kind')}"
        for a in record.get("attempts") or []
    ]


@pytest.fixture
def reference(finished: Finished) -> dict[int, float]:
    """The uninterrupted run of the resume job (same seed and checkpoints; ``finished_run``): step -> loss."""
    assert finished.out.returncode == 0, finished.out.stdout[-3000:] + finished.out.stderr[-2000:]
    assert sorted(finished.losses) == list(range(1, STEPS + 1)), sorted(finished.losses)
    return finished.losses


def test_killed_trainer_resumes_by_itself(
    cluster: Cluster, reference: dict[int, float], fault_record: dict[str, Any]
) -> None:
    """SIGKILL host2's rank at step 6: the run resumes from checkpoint-4 by itself and reaches 20/20 with the
    reference run's losses."""
    fault_record.update(
        case="recovery-trainer-sigkill",
        group="6 recovery",
        input=f"a {STEPS}-step job (checkpoints every {SAVE_STEPS}, default recovery policy, backoff 1 s); "
        f"SIGKILL to host2's training rank at step {KILL_AT}",
        expected=f"the run resumes by itself from the last checkpoint complete on both nodes (4), reaches "
        f"{STEPS}/{STEPS}, exit 0; the record lists 2 attempts (trainer_signal on host2, then succeeded); "
        f"the losses after the resume within {LOSS_TOLERANCE:.0%} of an uninterrupted run's",
    )
    name = "faults-rec-kill"
    job = cluster.job(name, max_steps=STEPS, save_steps=SAVE_STEPS, recovery=FAST, env=SLOW_ENV)
    proc, log = cluster.start("run", str(job), "-i", str(cluster.inventory))
    run_id = _run_id(cluster, name, proc)
    killed_at, _pid = _kill_at_step(cluster, run_id, KILL_AT, proc)
    out = finish(proc, log, timeout=1200)
    rec = cluster.record(name)
    steps, losses = logged_losses(cluster, run_id)
    attempts = rec.get("attempts") or []
    resume = attempts[-1].get("resume_step") if attempts else None
    after = [s for s in sorted(reference) if isinstance(resume, int) and s > resume]
    rows = [(s, reference[s], losses.get(s)) for s in after]
    worst = max((abs(b - a) / abs(a) for _, a, b in rows if b is not None), default=float("nan"))
    print(f"\n{name}: killed at step {killed_at}; attempts {_attempts(rec)}")
    print("step  uninterrupted  recovered  rel.diff")
    for s, a, b in rows:
        diff = f"{abs(b - a) / abs(a):.2e}" if b is not None else "-"
        print(f"{s:4d}  {a:13.6f}  {'-' if b is None else f'{b:9.6f}'}  {diff}")
    # every attempt appends to the log: the resumed attempt's steps begin where a step is not above the last
    restart = next((i for i in range(1, len(steps)) if steps[i] <= steps[i - 1]), len(steps))
    resumed_steps = steps[restart:]
    fault_record["observed"] = (
        f"killed at step {killed_at}; launcher exit {proc.returncode}, status {rec.get('status')}; attempts: "
        f"{'; '.join(_attempts(rec))}; host1's steps after the resume "
        f"{resumed_steps[:2]}...{resumed_steps[-1:]}; "
        f"losses of steps {after[:1]}..{after[-1:]} vs the uninterrupted run: max relative difference "
        f"{worst:.2e}"
    )
    assert proc.returncode == 0, out[-4000:]
    assert rec.get("status") == "succeeded", rec.get("timeline")
    assert len(attempts) == 2, attempts
    assert (attempts[0].get("kind"), attempts[0].get("failed_host")) == ("trainer_signal", "host2"), attempts[
        0
    ]
    assert (killed_at, resume) == (KILL_AT, 4), (killed_at, resume)
    assert resumed_steps and resumed_steps[0] == resume + 1 and resumed_steps[-1] == STEPS, steps
    assert all(b is not None for _, _, b in rows) and worst <= LOSS_TOLERANCE, rows
    assert "attempt 1 failed (trainer_signal on host2): retrying" in out, out[-3000:]


def test_retry_budget_used_up(cluster: Cluster, fault_record: dict[str, Any]) -> None:
    """max_restarts 1, host2's rank killed in both attempts: the run ends failed with both attempts listed."""
    fault_record.update(
        case="recovery-budget-used-up",
        group="6 recovery",
        input="recovery max_restarts 1 (backoff 1 s, same_failure_limit 5); host2's training rank SIGKILLed "
        "after the first logged step of each attempt (no checkpoint yet)",
        expected="attempt 2 starts again from step 0 (said); after its kill: exit 1, status failed, the "
        "record and `status` list both attempts, the last decision says the budget is used up",
    )
    name = "faults-rec-budget"
    policy = {**FAST, "max_restarts": 1, "same_failure_limit": 5}
    job = cluster.job(name, max_steps=STEPS, recovery=policy, paced=True)
    proc, log = cluster.start("run", str(job), "-i", str(cluster.inventory))
    run_id = _run_id(cluster, name, proc)
    _kill_at_step(cluster, run_id, 1, proc)
    _kill_next_rank(cluster, name, run_id, proc)
    out = finish(proc, log, timeout=600)
    rec = cluster.record(name)
    status = cluster.run("status", run_id, timeout=300)
    attempts = rec.get("attempts") or []
    listed = [line.strip() for line in status.stdout.splitlines() if re.match(r"\s+attempt \d", line)]
    fault_record["observed"] = (
        f"launcher exit {proc.returncode}, status {rec.get('status')}; "
        f"attempts: {'; '.join(_attempts(rec))}; "
        f"last decision: {attempts[-1].get('decision') if attempts else None}; "
        f"`status` lists {len(listed)} attempts"
    )
    print("\n" + "\n".join(listed))
    assert proc.returncode == 1, out[-3000:]
    assert rec.get("status") == "failed", rec.get("timeline")
    assert len(attempts) == 2 and len(listed) == 2, (attempts, status.stdout)
    assert "the retry budget is used up (1 of 1 restarts)" in str(attempts[-1].get("decision")), attempts[-1]
    assert "starts again from step 0" in out, out[-3000:]


def test_failure_of_the_job_itself_is_never_retried(cluster: Cluster, fault_record: dict[str, Any]) -> None:
    """A training YAML naming a model the nodes do not have: the trainers fail by themselves, once."""
    fault_record.update(
        case="recovery-config-error",
        group="6 recovery",
        input="the training YAML's lora_target names a module the model lacks (passes validation and "
        "preflight: only PEFT, in the trainer, knows the model's modules); the default recovery policy",
        expected="the trainers exit non-zero by themselves (trainer_error): not retried; exit 1, status "
        "failed, one attempt",
    )
    name = "faults-rec-config"
    job = cluster.job(name, max_steps=STEPS)
    text = job.parent / "configs" / "train" / f"{name}.yaml"
    # a missing model folder no longer reaches the trainer: preflight refuses it (never retried either)
    text.write_text(text.read_text().replace("lora_target: all", "lora_target: no_such_module"))
    out = cluster.run("run", str(job), "-i", str(cluster.inventory), timeout=900)
    rec = cluster.record(name)
    attempts = rec.get("attempts") or []
    fault_record["observed"] = (
        f"launcher exit {out.returncode}, status {rec.get('status')} ({rec.get('result_reason')}); attempts: "
        f"{'; '.join(_attempts(rec))}; decision: {attempts[-1].get('decision') if attempts else None}"
    )
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-2000:]
    assert rec.get("status") == "failed" and len(attempts) == 1, attempts
    assert attempts[0].get("kind") == "trainer_error", attempts[0]
    assert "not retried: trainer_error is not in recovery.retry_on" in out.stdout, out.stdout[-3000:]


def _spares_inventory(rig_inventory: Path, path: Path) -> Path:
    """The rig's inventory with host3 moved from ``trainers`` to the group ``spares``."""
    data = yaml.safe_load(rig_inventory.read_text())
    groups = data["all"]["children"]
    groups["spares"] = {"hosts": {"host3": groups["trainers"]["hosts"].pop("host3")}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _shared_log(run_id: str) -> list[tuple[int, float | None]]:
    """Rank 0's logged (step, loss) in order (every attempt appends), read in the shared output_dir on the
    controller."""
    log = SHARED / run_id / "output" / "trainer_log.jsonl"
    logged: list[tuple[int, float | None]] = []
    for line in log.read_text().splitlines() if log.exists() else []:
        try:
            entry = json.loads(line)
            loss = entry.get("loss")
            logged.append(
                (int(entry["current_steps"]), float(loss) if isinstance(loss, int | float) else None)
            )
        except (ValueError, KeyError, TypeError):
            continue
    return logged


def _shared_steps(run_id: str) -> list[int]:
    return [step for step, _ in _shared_log(run_id)]


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """The spare case's shared folder (bind-mounted into its 3 hosts), empty at the start, gone at the end."""
    shutil.rmtree(SHARED, ignore_errors=True)  # this rig's own folder, from an earlier run killed midway
    SHARED.mkdir(parents=True)
    try:
        yield SHARED
    finally:
        shutil.rmtree(SHARED, ignore_errors=True)


def test_spare_replaces_lost_node(tmp_path: Path, shared_folder: Path, fault_record: dict[str, Any]) -> None:
    """Cut host2's network at step 6: host2 is excluded, the spare host3 passes preflight and takes its rank
    slots, and the run resumes from checkpoint-4 in the shared output_dir and reaches 20/20."""
    fault_record.update(
        case="recovery-spare-replaces-lost-node",
        group="6 recovery",
        input=f"3 hosts of their own rig (trainers host1, host2; inventory group spares: host3), output_dir "
        f"in a folder all share (output_shared: true), recovery.spares: spares, backoff 1 s; a {STEPS}-step "
        f"job, checkpoints every {SAVE_STEPS}; `ip link set eth0 down` in host2's namespace at step "
        f"{KILL_AT}",
        expected=f"attempt 1 fails node_lost on host2; host2 excluded; host3 passes preflight and runs in "
        f"host2's place (node rank 1); attempt 2 on host1,host3 resumes from checkpoint-4 and reaches "
        f"{STEPS}/{STEPS}, exit 0; the record and the final report list the nodes of each attempt",
    )
    with provisioned_rig(SPARES_RIG_ID, 3, log=tmp_path / "image.log", shared_dir=str(shared_folder)) as rig:
        cluster = Cluster(rig, tmp_path, real_backend=False, base=JOBS)
        cluster.install_injection()  # hosts 1-3: the slow 7th step (a TEST DOUBLE): the cut lands at step 6
        inventory = _spares_inventory(rig.inventory, tmp_path / "spares.yml")
        name = "faults-rec-spare"
        job = cluster.job(
            name,
            max_steps=STEPS,
            save_steps=SAVE_STEPS,
            recovery={**FAST, "spares": "spares"},
            output_dir=f"{SHARED}/{{run_id}}/output",
            output_shared=True,
            env=SLOW_ENV,
        )
        proc, log = cluster.start("run", str(job), "-i", str(inventory))
        run_id = _run_id(cluster, name, proc)
        ns = f"mift{SPARES_RIG_ID}h2"
        deadline = time.monotonic() + 900
        while not (_shared_steps(run_id)[-1:] and _shared_steps(run_id)[-1] >= KILL_AT):
            assert proc.poll() is None and time.monotonic() < deadline, (
                f"no step {KILL_AT} (rc {proc.poll()})"
            )
            time.sleep(0.3)
        cut_at = _shared_steps(run_id)[-1]
        subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "down"], check=True)
        try:
            out = finish(proc, log, timeout=1200)
        finally:
            subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "up"], check=True)
        rec = cluster.record(name)
        status = cluster.run("status", run_id, timeout=300)
    attempts = rec.get("attempts") or []
    steps = _shared_steps(run_id)
    restart = next((i for i in range(1, len(steps)) if steps[i] <= steps[i - 1]), len(steps))
    nodes = [line.strip() for line in status.stdout.splitlines() if re.match(r"\s+attempt \d", line)]
    said = [line for line in out.splitlines() if re.match(r"(spare |attempt \d|resuming from)", line)]
    resumed = [f"{step}: {loss:.6f}" for step, loss in _shared_log(run_id)[restart:] if loss is not None]
    print(f"\n{name}: network cut at step {cut_at}\n" + "\n".join(said) + "\n" + "\n".join(nodes))
    print(f"losses after the resume (step: loss): {', '.join(resumed[:3])} ... {', '.join(resumed[-2:])}")
    fault_record["observed"] = (
        f"cut at step {cut_at}; launcher exit {proc.returncode}, status {rec.get('status')}; attempts: "
        f"{'; '.join(_attempts(rec))}; excluded {rec.get('excluded')}; replaced "
        f"{attempts[-1].get('replaced') if attempts else None}; rank 0's steps after the resume "
        f"{steps[restart : restart + 2]}...{steps[-1:]}; losses {', '.join(resumed[:1] + resumed[-1:])}"
    )
    assert proc.returncode == 0, out[-4000:]
    assert rec.get("status") == "succeeded", rec.get("timeline")
    assert len(attempts) == 2, attempts
    assert (attempts[0].get("kind"), attempts[0].get("failed_host")) == ("node_lost", "host2"), attempts[0]
    assert attempts[0].get("hosts") == ["host1", "host2"], attempts[0]
    assert attempts[1].get("hosts") == ["host1", "host3"], attempts[1]
    assert attempts[1].get("replaced") == {"host2": "host3"}, attempts[1]
    assert "host2" in (rec.get("excluded") or {}), rec.get("excluded")
    resume = attempts[1].get("resume_step")
    assert cut_at == KILL_AT and resume == SAVE_STEPS, (cut_at, resume)
    assert steps[restart] == resume + 1 and steps[-1] == STEPS, steps
    assert "spare host3 takes host2's place (node rank 1)" in out, out[-3000:]
    assert len(nodes) == 2 and "host1,host3 (host3 in host2's place)" in nodes[1], status.stdout

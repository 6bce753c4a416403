"""Resume from a checkpoint, a drifted node stack caught by preflight, and provisioning with a host down then
twice in a row (the second run changes nothing).
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from mift_testsupport.cluster import Cluster
from mift_testsupport.paths import REPO_ROOT
from mift_testsupport.provision import provision_argv, recap, tiny_model

from .stopped_run import RESUME_COPY, RESUME_STEPS, Stopped, logged_steps

pytestmark = [pytest.mark.rig, pytest.mark.slow]


def test_resume_run_option(cluster: Cluster, stopped: Stopped, fault_record: dict[str, Any]) -> None:
    """`run --resume RUN` continues a stopped run from its last checkpoint and finishes it."""
    fault_record.update(
        case="resume-run-option",
        group="3 resume",
        input=f"a {RESUME_STEPS}-step job stopped (Ctrl-C) after checkpoint-4, then `run --resume RUN`",
        expected=f"the resumed run starts at the step after the last checkpoint (on every node), reaches "
        f"{RESUME_STEPS}/{RESUME_STEPS}, exit 0",
    )
    helptext = cluster.run("run", "--help", timeout=120).stdout
    if "--resume" not in helptext:
        fault_record["observed"] = "`python -m launcher run --help` has no --resume option; not tried"
        pytest.fail("`run` has no --resume option")
    assert stopped.status == "stopped", stopped.out
    run_id, last, stopped_at, logged = stopped.run_id, stopped.last, stopped.stopped_at, stopped.logged
    out = cluster.run("run", "--resume", run_id, "-i", str(cluster.inventory), timeout=900)
    new = logged_steps(cluster, 1)[logged:]
    fault_record["observed"] = (
        f"first run stopped at step {stopped_at}, checkpoints up to {last}; `run --resume` exit "
        f"{out.returncode}; its logged steps {new[:2]}...{new[-1:]}"
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert last < RESUME_STEPS and stopped_at < RESUME_STEPS, (last, stopped_at)
    assert new and new[0] == last + 1 and new[-1] == RESUME_STEPS, (last, new)


def test_resume_via_job_spec(cluster: Cluster, stopped: Stopped, fault_record: dict[str, Any]) -> None:
    """The job spec route: the stopped run's output_dir (a copy of it), `resume: true` -> LLaMA-Factory's last
    checkpoint."""
    fault_record.update(
        case="resume-job-spec",
        group="3 resume",
        input=f"a {RESUME_STEPS}-step job stopped (Ctrl-C) after checkpoint-4 (the run of resume-run-option, "
        "its output_dir copied first), then the same job on the copy with `resume: true`",
        expected=f"the second run starts at the step after the last checkpoint, reaches {RESUME_STEPS}/"
        f"{RESUME_STEPS}, exit 0",
    )
    assert stopped.status == "stopped", stopped.out
    name = "faults-resume2"
    last, stopped_at, logged = stopped.last, stopped.stopped_at, stopped.logged
    # the second run only has to continue: no checkpoints of its own (the first run's are what it resumes)
    job2 = cluster.job(f"{name}-b", max_steps=RESUME_STEPS, output_dir=RESUME_COPY, resume=True)
    out = cluster.run("run", str(job2), "-i", str(cluster.inventory), timeout=900)
    # LLaMA-Factory appends to trainer_log.jsonl when resuming: lines after the first run's are the new ones
    new = logged_steps(cluster, 1, RESUME_COPY)[logged:]
    fault_record["observed"] = (
        f"first run stopped at step {stopped_at} with checkpoints up to {last}; "
        f"second run exit {out.returncode}, "
        f"status {cluster.record(f'{name}-b').get('status')}, its logged steps {new[:2]}...{new[-1:]}"
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert last < RESUME_STEPS and stopped_at < RESUME_STEPS, (last, stopped_at)
    assert new and new[0] == last + 1 and new[-1] == RESUME_STEPS, (last, new)


def test_drifted_stack_is_reported_by_preflight(cluster: Cluster, fault_record: dict[str, Any]) -> None:
    """Uninstall peft from host2's venv after provisioning: preflight must refuse naming host2 and peft."""
    fault_record.update(
        case="stack-drift",
        group="4 provisioning",
        input="`pip uninstall peft` in host2's venv after provisioning, then `run`",
        expected="exit 2, one stderr line naming host2 and peft; nothing started",
    )
    version = cluster.ssh(
        2, "/opt/mift/venv/bin/python -c 'import importlib.metadata as m; print(m.version(\"peft\"))'"
    )
    cluster.ssh(2, "/opt/mift/venv/bin/pip uninstall -y -q peft")
    before = cluster.run_dirs()
    try:
        out = cluster.run("run", str(cluster.job("faults-drift")), "-i", str(cluster.inventory), "--detach")
        stopped = cluster.stop_leftover_runs(before)
    finally:
        cluster.ssh(2, f"/opt/mift/venv/bin/pip install -q --no-deps peft=={version.strip()}", timeout=600)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    fault_record["observed"] = f"exit {out.returncode}; stderr: {' | '.join(lines[:3])}" + (
        f"; started and stopped {stopped}" if stopped else ""
    )
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert "host2" in lines[0] and "peft" in lines[0], lines[0]


def _provision(cluster: Cluster, log: Path, *extra_args: str) -> subprocess.Popen[str]:
    with log.open("w") as fh:
        return subprocess.Popen(
            provision_argv(cluster.inventory, tiny_model(), *extra_args),
            env=cluster.rig.env(),
            cwd=REPO_ROOT,
            stdout=fh,
            stderr=subprocess.STDOUT,
            text=True,
            stdin=subprocess.DEVNULL,
        )


def test_provision_host_down_then_rerun_changes_nothing(
    cluster: Cluster, fault_record: dict[str, Any]
) -> None:
    """Cut host2 while provision.yml runs: it fails naming host2; the re-run completes with changed=0."""
    fault_record.update(
        case="provision-host-down-rerun",
        group="4 provisioning",
        input="host2's link down 15 s into `ansible-playbook provision.yml -e mift_defaults_verify=true` "
        "(every part again), back after; then provision.yml again",
        expected="first run fails with host2 unreachable (host1 completes); the re-run exits 0 with "
        "failed=0 on every host; no role changes anything (only host2's fingerprint records are written)",
    )
    ns = f"mift{cluster.rig.rig_id}h2"
    log1 = cluster.work / "provision-down.log"
    # The hosts come provisioned from the image: a plain re-run skips every part in seconds
    # (playbooks/state.yml), before the cut. mift_defaults_verify=true provisions and verifies every part
    # again, so the cut lands mid-run.
    proc = _provision(cluster, log1, "-e", '{"mift_defaults_verify": true}')
    time.sleep(15)
    subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "down"], check=True)
    try:
        proc.wait(timeout=1800)
    finally:
        subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "up"], check=True)
        subprocess.run(
            ["ip", "-n", ns, "route", "replace", "default", "via", f"{cluster.rig.net}.254", "dev", "eth0"],
            check=False,
        )
    first = recap(log1.read_text())
    log2 = cluster.work / "provision-rerun.log"
    proc2 = _provision(cluster, log2)
    proc2.wait(timeout=1800)
    second = recap(log2.read_text())
    changes = changed_tasks(log2.read_text())
    other = [c for c in changes if not c[1].startswith(BOOKKEEPING)]
    fault_record["observed"] = (
        f"first exit {proc.returncode} {first}; re-run exit {proc2.returncode} {second}; "
        f"changed by the re-run: {changes or 'nothing'}"
    )
    assert proc.returncode != 0 and first.get("host2", {}).get("unreachable", 0) > 0, first
    assert first.get("host1", {}).get("failed") == 0, first
    assert proc2.returncode == 0, log2.read_text()[-4000:]
    assert all(v["failed"] == 0 for v in second.values()) and len(second) == 2, second
    # nothing changes but host2's fingerprint records (the parts the cut run did not finish there)
    assert not other and all(host == "host2" for host, _ in changes), changes


# The one change the re-run may make: the fingerprint record of a part it ran (mift_defaults, bookkeeping).
# host2 was cut before its parts were recorded in this boot (a systemd-mode test host gets its own boot id at
# every boot, and the rocm part's fingerprint holds the boot id: a reboot verifies the driver and the GPUs
# again), so the re-run runs its parts, whose roles change nothing, and records them.
BOOKKEEPING = ("mift_defaults : Record the fingerprint of the host",)


def changed_tasks(log: str) -> list[tuple[str, str]]:
    """Return (host, task) for every ``changed: [host]`` line of an ansible-playbook log."""
    found: list[tuple[str, str]] = []
    task = ""
    for line in log.splitlines():
        if m := re.match(r"^TASK \[(.+?)\]", line):
            task = m.group(1)
        elif m := re.match(r"^changed: \[([^\]]+)\]", line):
            found.append((m.group(1), task))
    return found

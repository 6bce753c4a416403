"""Slurm requeue (docs/slurm.md "Requeue"): the batch script's recovery lines from the job spec's recovery
policy, what is refused, the attempts a requeued job leaves in the record, the node agent's restart (which
checkpoint every node holds, the trainer's command line, why an attempt ended), and the watchdog's restart.
The agent runs with a ``scontrol`` TEST DOUBLE (this machine runs no Slurm)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from node_agent import AGENT, run_agent
from test_slurm_backend import alloc

from launcher.backends import check_recovery as _check_recovery
from launcher.backends.slurm import record_requeues
from launcher.backends.slurm_script import (
    Requeue,
    SlurmJob,
    budget_words,
    requeue_for,
    requeue_refusal,
    requeue_too_early,
    requeued_attempts,
    sbatch_script,
    time_limit_s,
)
from launcher.exceptions import ConfigurationError
from launcher.follow.live import queued
from launcher.follow.watchdog import ProgressWatch, Schedule, WatchdogOptions
from launcher.node import contract
from launcher.node import slurm as node_slurm
from launcher.rundir.runs import RunDir
from launcher.spec.jobspec_load import parse_job_spec
from mift_testsupport.slurm import srun_task_env


def spec(tmp_path: Path, **fields: Any) -> Any:
    train = tmp_path / "t.yaml"
    train.write_text("stage: sft\n")
    return parse_job_spec({"name": "j", "train_config": str(train), **fields}, tmp_path / "job.yaml")


# --- the batch script --------------------------------------------------------------------------------------
def test_a_requeued_job_asks_slurm_for_requeue_and_the_time_limit_signal() -> None:
    script = sbatch_script(alloc(Requeue(max_restarts=3, before_s=120)))
    lines = script.splitlines()
    for line in (
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",  # slurm.out keeps every attempt (the agent reads why each ended)
        "#SBATCH --signal=B:USR1@120",
        "restarts=${SLURM_RESTART_COUNT:-0}",
        'if [ "$restarts" -gt 3 ]; then',
        '  echo "mift: not retried: the retry budget is used up ($restarts of 3 restarts)"',
        "  exit 4",
        "trap at_time_limit USR1",
        '  if [ "$restarts" -lt 3 ]; then',
        '    scontrol requeue "$SLURM_JOB_ID"',
        "srun --kill-on-bad-exit=1 --nodes=2 --ntasks=2 --ntasks-per-node=1 python3 /var/lib/mift/runs/r1/"
        'mift_node.pyz agent slurm-step /var/lib/mift/runs/r1 --grace 8 "${resume[@]}" &',
        'exit "$rc"',
    ):
        assert line in lines, line
    # a restart asks every node for its complete checkpoints and resumes from the newest all of them hold
    gather = next(x for x in lines if "slurm-checkpoints" in x)
    assert (
        "set -o pipefail" in gather
        and 'resume-step /var/lib/mift/runs/r1 --nodes "$SLURM_JOB_NUM_NODES"' in gather
    )
    assert '  resume=(--restart "$restarts" --resume-step "$found")' in lines
    assert not any(x.startswith("exec ") for x in lines)  # the trap needs the shell
    assert "--no-requeue" not in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)  # the script parses
    if shutil.which("shellcheck"):  # tools/lint's shell linter, where installed
        subprocess.run(["shellcheck", "-"], input=script, text=True, check=True)
    no_signal = sbatch_script(alloc(Requeue(max_restarts=1, before_s=0)))
    assert (
        "--signal" not in no_signal
        and "trap at_time_limit" not in no_signal
        and "#SBATCH --requeue" in no_signal
    )


def test_the_time_limit_signal_is_trapped_before_the_restart_looks_for_its_checkpoint(tmp_path: Path) -> None:
    """An attempt that starts within requeue_before_s of its time limit gets Slurm's USR1 at once, while the
    restart still asks the nodes for their checkpoints: the trap must already be set, or bash's default action
    ends the batch script (the job fails instead of requeueing). ``srun`` and ``scontrol`` are TEST DOUBLEs
    (no Slurm here); the script, bash and the agent's resume-step are real."""
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    shutil.copy(AGENT, run_dir / contract.PROGRAM_FILE)  # as launch.yml's install puts it there
    two_restarts = alloc(Requeue(max_restarts=2, before_s=120))
    script = sbatch_script(dataclasses.replace(two_restarts, run_dir=str(run_dir)))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    answers = "".join(
        json.dumps({"ok": True, "node": n, "checkpoints": [4, 8]}) + "\\n" for n in ("node1", "node2")
    )
    (bin_dir / "srun").write_text(
        "#!/bin/bash\n# TEST DOUBLE of Slurm's srun: the checkpoint lookup meets USR1 to the batch shell\n"
        'case "$*" in\n'
        f"  *slurm-checkpoints*) kill -USR1 \"$BATCH_PID\"; sleep 0.3; printf '{answers}' ;;\n"
        '  *slurm-step*) echo "step: $*" ;;\n'
        "esac\n"
    )
    (bin_dir / "scontrol").write_text(
        '#!/bin/bash\n# TEST DOUBLE of Slurm\'s scontrol\necho "scontrol $*" >> "$SCONTROL_LOG"\n'
    )
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    (tmp_path / "job.sbatch").write_text(script)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SCONTROL_LOG": str(tmp_path / "scontrol.log"),
        "SLURM_RESTART_COUNT": "1",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_JOB_NUM_NODES": "2",
    }
    proc = subprocess.run(
        ["bash", "-c", f"export BATCH_PID=$$; exec bash {tmp_path / 'job.sbatch'}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert "mift: time limit: requeued (restart 2 of 2)" in proc.stdout, proc.stdout
    assert "mift: restart 1 resumes from: 8" in proc.stdout and "--resume-step 8" in proc.stdout, proc.stdout
    assert (tmp_path / "scontrol.log").read_text() == "scontrol requeue 7\n"


def test_a_job_that_may_not_restart_is_never_requeued() -> None:
    script = sbatch_script(alloc(None))
    assert "#SBATCH --no-requeue" in script.splitlines()  # whatever the cluster's JobRequeue says
    assert "SLURM_RESTART_COUNT" not in script and "--signal" not in script
    assert script.splitlines()[-1].startswith("exec srun --kill-on-bad-exit=1")


def test_the_requeue_follows_the_recovery_policy(tmp_path: Path) -> None:
    default = requeue_for(spec(tmp_path))
    assert default == Requeue(max_restarts=3, before_s=120)
    assert requeue_for(spec(tmp_path, recovery={"max_restarts": 0})) is None
    assert requeue_for(
        spec(tmp_path, recovery={"max_restarts": 1}, slurm={"requeue_before_s": 0})
    ) == Requeue(1, 0)
    assert requeue_for(spec(tmp_path, recovery={"retry_on": ["trainer_signal"]})) is None
    assert requeue_refusal(spec(tmp_path)) == ""
    assert "add node_lost to recovery.retry_on" in requeue_refusal(
        spec(tmp_path, recovery={"retry_on": ["trainer_signal"]})
    )
    assert requeue_refusal(spec(tmp_path, recovery={"max_restarts": 0, "retry_on": []})) == ""


def test_slurm_time_limits_in_seconds() -> None:
    assert [time_limit_s(x) for x in ("1", "90", "5:30", "1:00:00", "2-0", "2-3:04", "1-00:00:10")] == [
        60,
        5400,
        330,
        3600,
        172800,
        183840,
        86410,
    ]


def test_a_time_limit_requeue_that_would_fire_at_the_start_is_refused(tmp_path: Path) -> None:
    assert requeue_too_early(spec(tmp_path, slurm={"time_limit": "15:00"})) == ""
    assert requeue_too_early(spec(tmp_path, slurm={"time_limit": "1"}, recovery={"max_restarts": 0})) == ""
    assert requeue_too_early(spec(tmp_path, slurm={"time_limit": "1", "requeue_before_s": 0})) == ""
    why = requeue_too_early(spec(tmp_path, slurm={"time_limit": "2"}))
    assert why.startswith("slurm.requeue_before_s: 120 s is not below slurm.time_limit 2 (120 s)"), why
    with pytest.raises(ConfigurationError, match="requeue_before_s: 120 s is not below"):
        _check_recovery(
            spec(tmp_path, slurm={"time_limit": "2"}),
            tmp_path / "job.yaml",
            "slurm",
            detach=False,
            out=sys.stdout,
        )


def test_the_launcher_leaves_retries_to_slurm_and_refuses_what_slurm_cannot_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.yaml"
    # the launcher never retries a Slurm job itself (detached or not): Slurm requeues it
    assert _check_recovery(spec(tmp_path), job, "slurm", detach=True, out=sys.stdout) is False
    assert "Slurm requeues the job on node failure and preemption, 120 s before its time limit, up to 3" in (
        capsys.readouterr().out
    )
    with pytest.raises(ConfigurationError, match=r"add node_lost to recovery\.retry_on"):
        _check_recovery(
            spec(tmp_path, recovery={"retry_on": ["stall"]}), job, "slurm", detach=False, out=sys.stdout
        )
    login_only = {"slurm": {"shared_dir": "/scratch/mift", "nodes": 2}}
    with pytest.raises(ConfigurationError, match="not built for the login-host-only mode"):
        _check_recovery(
            spec(tmp_path, recovery={"max_restarts": 2}, **login_only),
            job,
            "slurm",
            detach=False,
            out=sys.stdout,
        )
    assert _check_recovery(spec(tmp_path, **login_only), job, "slurm", detach=False, out=sys.stdout) is False
    shared = {"output_dir": "/shared/{run_id}/output", "output_shared": True}
    with pytest.raises(
        ConfigurationError, match=r"recovery\.spares: spare nodes replace a lost node over ssh"
    ):
        _check_recovery(
            spec(tmp_path, recovery={"spares": "spares"}, **shared),
            job,
            "slurm",
            detach=False,
            out=sys.stdout,
        )
    assert (
        "note: recovery off: Slurm requeue is not built for the login-host-only mode"
        in capsys.readouterr().out
    )
    assert requeue_for(spec(tmp_path, **login_only)) is None
    # no restarts: nothing said, nothing requeued
    assert (
        _check_recovery(
            spec(tmp_path, recovery={"max_restarts": 0}), job, "slurm", detach=False, out=sys.stdout
        )
        is False
    )
    assert capsys.readouterr().out == ""


# --- the attempts in the record --------------------------------------------------------------------------
FIRST = {"attempt": 1, "started_at": 100.0, "state": "running", "hosts": ["h1", "h2"], "resume_step": None}


def test_each_requeue_ends_an_attempt_and_begins_the_next() -> None:
    assert requeued_attempts([FIRST], 0, {}, {}, 2, 150.0) == [FIRST]  # not requeued: as it was
    seen = requeued_attempts([FIRST], 1, {}, {}, 2, 150.0)  # Slurm's Restarts=1, its cause not read yet
    assert seen[0] == {
        **FIRST,
        "state": "requeued",
        "ended_at": 150.0,
        "reason": "Slurm requeued the job",
        "decision": "requeued: restart 1 of 2; resumes from the last checkpoint complete on every node",
    }
    assert seen[1] == {"attempt": 2, "started_at": 150.0, "state": "running", "hosts": ["h1", "h2"]}
    # a later poll: host1's batch output says why, the nodes say where restart 1 resumed from
    later = requeued_attempts(seen, 1, {"1": "node failure"}, {1: 8}, 2, 160.0)
    assert (later[0]["kind"], later[0]["reason"]) == ("node_lost", "a node failed; Slurm requeued the job")
    assert later[0]["ended_at"] == 150.0 and later[1]["resume_step"] == 8
    # two requeues seen in one poll (the first one's cause and step never read: said so, not guessed)
    both = requeued_attempts([FIRST], 2, {"2": "time limit"}, {2: 12}, 2, 170.0)
    assert [a["state"] for a in both] == ["requeued", "requeued", "running"]
    assert both[0]["reason"] == "Slurm requeued the job" and "kind" not in both[0]
    assert (both[1]["kind"], both[2]["resume_step"]) == ("timeout", 12)
    assert "resume_step" not in both[1]
    # a restart that found no checkpoint common to every node starts from step 0: recorded as None
    none = requeued_attempts([FIRST], 1, {"1": "preemption"}, {1: None}, 3, 150.0)
    assert none[1]["resume_step"] is None and none[0]["kind"] == "preempted"


def test_the_poll_records_the_requeues_slurm_and_the_nodes_report(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r1")
    run.path.mkdir()
    run.save({"run_id": "r1", "slurm": {"job_id": "4", "max_restarts": 2}, "attempts": [FIRST]})
    nodes = {
        "h1": {"state": "running", "restart": 1, "resume_step": 8, "requeues": {"1": "requeue"}},
        "h2": {"state": "running", "restart": 1, "resume_step": 8},
    }
    record_requeues(run, SlurmJob("4", "RUNNING", restarts=1), nodes)
    attempts = run.load()["attempts"]
    assert [(a["attempt"], a["state"], a.get("kind"), a.get("resume_step")) for a in attempts] == [
        (1, "requeued", "requeued", None),
        (2, "running", None, 8),
    ]
    # a run that is never requeued (max_restarts None in its record) keeps its attempts as the engine wrote
    run.save({"run_id": "r1", "slurm": {"job_id": "4", "max_restarts": None}, "attempts": [FIRST]})
    record_requeues(run, SlurmJob("4", "RUNNING", restarts=1), nodes)
    assert run.load()["attempts"] == [FIRST]


def test_scontrol_restarts_and_the_budget_line() -> None:
    job = SlurmJob.from_scontrol(
        "4", 0, "JobId=4 JobState=TIMEOUT Reason=TimeLimit Requeue=1 Restarts=2 ExitCode=0:0", ""
    )
    assert job.restarts == 2
    assert budget_words(job, 2) == "not requeued: the retry budget is used up (2 of 2 restarts)"
    assert budget_words(job, 3) == "" and budget_words(job, None) == ""
    past = SlurmJob("4", "FAILED", "NonZeroExitCode", "4:0", restarts=3)  # the script's budget exit
    assert budget_words(past, 2) == "not requeued: the retry budget is used up (2 of 2 restarts)"
    failed = SlurmJob("4", "FAILED", "NonZeroExitCode", "1:0", restarts=2)  # a trainer failed: not the budget
    assert budget_words(failed, 2) == ""


# --- the node agent --------------------------------------------------------------------------------------
SLURM_OUT = """mift: attempt 1 of slurm job 4 on host[1-2]
srun: error: Node failure on host2
slurmstepd-host1: error: *** STEP 4.0 ON host1 CANCELLED AT 2026-12-05T09:33:29 DUE TO NODE FAILURE, \
SEE SLURMCTLD LOG FOR DETAILS ***
mift: attempt 2 of slurm job 4 on host[1-2]
mift: restart 1 resumes from: 8
mift: time limit: requeued (restart 2 of 2)
slurmstepd-host1: error: *** JOB 4 ON host1 CANCELLED AT 2026-12-05T09:34:08 DUE TO JOB REQUEUE ***
mift: attempt 3 of slurm job 4 on host[1-2]
mift: restart 2 resumes from: 8
"""


def test_the_agent_reads_why_each_attempt_ended_from_the_batch_output() -> None:
    # the lines are a real slurm.out of the e2e case (Slurm 22.05.8 on the test hosts)
    assert node_slurm.requeue_causes(SLURM_OUT) == {"1": "node failure", "2": "time limit"}
    requeued = "mift: attempt 1 of slurm job 5 on h1\n*** JOB 5 ON h1 CANCELLED AT x DUE TO JOB REQUEUE ***\n"
    assert node_slurm.requeue_causes(requeued) == {"1": "requeue"}
    assert node_slurm.requeue_causes("mift: attempt 1 of slurm job 5 on h1\n") == {}


def test_the_resume_step_is_the_newest_checkpoint_every_node_holds() -> None:
    def line(node: str, steps: list[int]) -> str:
        return json.dumps({"ok": True, "node": node, "checkpoints": steps})

    assert node_slurm.resume_step([line("h1", [4, 8, 12]), line("h2", [4, 8])], 2) == 8
    assert node_slurm.resume_step([line("h1", [4]), line("h2", [])], 2) is None
    with pytest.raises(ValueError, match="1 of 2 nodes listed their checkpoints"):
        node_slurm.resume_step([line("h1", [4]), "srun: error: host2: task 1: Exited"], 2)
    argv = ["/opt/mift/venv/bin/llamafactory-cli", "train", "train.yaml"]
    out = Path("/var/lib/mift/runs/r1/output")
    assert node_slurm.resume_argv(argv, out, 8) == [
        *argv,
        "resume_from_checkpoint=/var/lib/mift/runs/r1/output/checkpoint-8",
        "overwrite_output_dir=false",
    ]
    assert node_slurm.resume_argv(argv, out, None) == argv  # nothing common: as the first attempt began


def prepared(tmp_path: Path) -> Path:
    """A node run directory whose 'trainer' writes its command line to argv.json (TEST DOUBLE)."""
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    out = run_dir / "output"
    for step in (4, 8):
        (out / f"checkpoint-{step}" / f"global_step{step}").mkdir(parents=True)
        (out / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    (out / "checkpoint-12").mkdir()  # cut short while saving: not complete
    trainer = "import json, sys; open('argv.json', 'w').write(json.dumps(sys.argv[1:]))"
    job = {
        "run_id": "r1",
        "node_rank": 0,
        "output_dir": str(out),
        "expect_outputs": [],
        "argv": [sys.executable, "-c", trainer],
    }
    (run_dir / "bundle.json").write_text(json.dumps({"files": {}, "job": job, "env": {}}))
    assert json.loads(run_agent("prepare", str(run_dir)).stdout)["ok"]
    return run_dir


def test_a_restarted_slurm_step_resumes_its_trainer_from_the_step_given(tmp_path: Path) -> None:
    run_dir = prepared(tmp_path)
    env = srun_task_env(tmp_path, "1", ("nodeA", "nodeB"))
    listed = json.loads(run_agent("slurm-checkpoints", str(run_dir), env=env).stdout)
    assert listed == {"ok": True, "node": "nodeB", "checkpoints": [4, 8]}
    both = "\n".join([json.dumps(listed), json.dumps({**listed, "node": "nodeA", "checkpoints": [4]})])
    assert run_agent("resume-step", str(run_dir), "--nodes", "2", stdin=both).stdout == "4\n"
    assert run_agent("resume-step", str(run_dir), "--nodes", "3", stdin=both).returncode == 1
    proc = run_agent("slurm-step", str(run_dir), "--restart", "1", "--resume-step", "8", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((run_dir / "argv.json").read_text()) == [
        f"resume_from_checkpoint={run_dir}/output/checkpoint-8",
        "overwrite_output_dir=false",
    ]
    assert (run_dir / "output" / "checkpoint-8" / "latest").read_text() == "global_step8"  # DeepSpeed's tag
    status = json.loads(run_agent("status", str(run_dir)).stdout)
    assert (status["state"], status["restart"], status["resume_step"]) == ("finished", 1, 8)
    # the first attempt: the trainer's own command line, no restart in the status
    proc = run_agent("slurm-step", str(run_dir), env=env)
    assert proc.returncode == 0 and json.loads((run_dir / "argv.json").read_text()) == []
    assert "restart" not in json.loads(run_agent("status", str(run_dir)).stdout)
    (run_dir / "slurm.out").write_text(SLURM_OUT)  # the node that ran the batch script
    assert json.loads(run_agent("status", str(run_dir)).stdout)["requeues"] == {
        "1": "node failure",
        "2": "time limit",
    }


# --- following a requeued job ------------------------------------------------------------------------------
def test_the_watchdog_starts_over_while_queued_and_after_a_restart() -> None:
    watch = ProgressWatch(WatchdogOptions(), Schedule(), ["h1"], 0.0)
    watch.observe({"h1": {"state": "running", "last_log": {"current_steps": 10}}}, 10.0)
    assert watch.step == 10
    watch.restart(500.0)
    assert (watch.step, watch.last_progress) == (None, 500.0)
    assert watch.window().why == "first step (first_step_s)"
    assert queued({"h1": {"state": "pending(BeginTime)"}, "h2": {"state": "pending(BeginTime)"}})
    assert not queued({"h1": {"state": "pending(BeginTime)"}, "h2": {"state": "running"}})
    assert not queued({})

"""Shipping a planned attempt: the node files written, the node programs launched, then followed to a
verdict."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import IO, TYPE_CHECKING

from launcher.backends import backend_of
from launcher.backends.agent import launch_vars
from launcher.engine import attempt_log
from launcher.engine.job import Job
from launcher.engine.lease import LeaseRequest, accept
from launcher.engine.split import record_of, summary_line
from launcher.exceptions import LauncherError
from launcher.exit_codes import OK, ExitCode
from launcher.fabric.runtime import TransportWatch
from launcher.follow.live import follow
from launcher.follow.verdict import Verdict
from launcher.follow.watchdog import ProgressWatch, Schedule
from launcher.node import contract
from launcher.preflight.nodeenv import masked

if TYPE_CHECKING:
    from launcher.backends.runner import PlaybookRunner
    from launcher.engine.plan import RunPlan
    from launcher.rundir.runs import RunDir


def _write_node_files(run: RunDir, plan: RunPlan) -> None:
    """Write ``files/<host>/``: the plan's files and job.json (kept), and ``bundle.json`` (0600).

    The bundle is the one file the launch playbook copies per node (the plan's file bytes, job, env); the
    agent unpacks it. It holds the environment in clear, so it is deleted once the nodes have it.
    """
    for host in plan.hosts:
        host_dir = run.files_dir / host
        host_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for name, data in plan.files.items():
            (host_dir / name).write_bytes(data)
        job = plan.jobs[host]
        (host_dir / contract.JOB_FILE).write_text(json.dumps(job, indent=2) + "\n")
        bundle = contract.Bundle(
            files={name: data.decode("utf-8") for name, data in plan.files.items()},  # rendered: UTF-8
            job=job,
            env=dict(plan.envs[host]),
        )
        fd = os.open(host_dir / contract.BUNDLE_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(bundle, fh)


def _remove_bundles(run: RunDir) -> None:
    """Delete the controller copies of the node bundles (secrets in clear; the record has them masked)."""
    for path in run.files_dir.glob(f"*/{contract.BUNDLE_FILE}"):
        path.unlink()


def ship_and_follow(
    run: RunDir,
    runner: PlaybookRunner,
    plan: RunPlan,
    *,
    interrupted: threading.Event,
    detach: bool,
    out: IO[str],
    lease: LeaseRequest | None = None,
) -> ExitCode | tuple[Verdict, dict[str, contract.NodeStatus], Job]:
    """Start the plan's trainers and follow them; return the verdict, the last node states and the job (the
    caller finishes or retries), or OK once a detached run started. ``lease``: the GPU lease the start takes
    first (the run's first attempt; a node leased by another run refuses the run, nothing started)."""
    spec, facts = plan.spec, plan.facts
    _write_node_files(run, plan)
    for note in facts.notes:
        print(f"note: {note}", file=out)
    if plan.training is not None:
        print(summary_line(plan.training), file=out)
    for warning in facts.warnings:
        print(f"warning: {warning}", file=out)
    run.update(
        hosts=facts.hosts,
        master_addr=plan.master_addr,
        master_port=spec.master_port,
        nproc_per_node=facts.nproc_per_node,
        node_env=masked(plan.envs),
        versions=facts.stack,
        gpus=facts.gpus,
        deepspeed=plan.deepspeed_name,
        plan=record_of(plan.training),
        output_dir=plan.output_dir,
        warnings=facts.warnings,
        notes=facts.notes,
        torch=facts.torch,
        transport=plan.transport.record() if plan.transport is not None else None,
    )
    run.set_status("starting")
    t_start = time.monotonic()
    backend = backend_of(run.record())
    try:
        launch = backend.start(runner, run, plan, launch_vars(run, plan, lease))
        if lease is not None:
            accept(lease, runner, run, launch, facts.hosts, out)
    except LauncherError as err:  # refused before anything started: the scheduler, a node's GPU lease
        state = "stopped" if interrupted.is_set() else "rejected"
        attempt_log.end(run, state, str(err))
        run.set_status(state, str(err))
        raise
    finally:
        _remove_bundles(run)
    job = Job(run)
    job.runner.cancel_requested = interrupted  # Ctrl-C ends a poll's wait and the follow's poll playbook
    started = {h: launch.report(h, "start") for h in facts.hosts}
    run.update(start_s=round(time.monotonic() - t_start, 2), started={h: s for h, s in started.items() if s})
    if interrupted.is_set() or not launch.ok:
        if interrupted.is_set():
            return Verdict("stopped", "interrupted (Ctrl-C) while starting"), {}, job
        return Verdict("failed", _launch_failure(launch.failures)), {}, job
    run.set_status("running")
    said, master_addr = backend.started(plan)  # Slurm: the job id; MASTER_ADDR is the allocation's
    if said:
        print(said, file=out, flush=True)
    print(
        f"started on {len(facts.hosts)} nodes in {time.monotonic() - t_start:.1f} s "
        f"(MASTER_ADDR={master_addr} MASTER_PORT={spec.master_port} "
        f"NPROC_PER_NODE={facts.nproc_per_node})",
        file=out,
        flush=True,
    )
    if detach:
        run.update(launcher_pid=None)
        print(
            f"detached; follow with: python -m launcher status {run.run_id} | logs {run.run_id} --follow | "
            f"stop {run.run_id}",
            file=out,
        )
        return OK

    watch = _progress_watch(plan, job.hosts, out)
    verdict, nodes = follow(
        job,
        interrupted=interrupted,
        poll_interval_s=spec.poll_interval_s,
        job_timeout_s=spec.timeouts.job_s,
        out=out,
        watch=watch,
        transport=TransportWatch(plan.transport) if plan.transport is not None else None,
    )
    return verdict, nodes, job


def _progress_watch(plan: RunPlan, hosts: list[str], out: IO[str]) -> ProgressWatch | None:
    """Return the run's progress watchdog (None: switched off in the job spec), announced in one line."""
    options = plan.spec.watchdog
    if not options.enabled:
        print("watchdog: off (job spec watchdog.enabled: false)", file=out, flush=True)
        return None
    train = plan.train or {}
    schedule = Schedule.from_training(train if isinstance(train, dict) else {})
    print(
        f"watchdog: a stall is no optimizer step within {options.first_step_s:g} s of the start, then "
        f"within max({options.k:g} x p95 of the step intervals, {options.floor_s:g} s), "
        f"+ {options.save_s:g} s after a checkpoint save (save_steps {schedule.save_steps or '-'}), "
        f"+ {options.eval_s:g} s after an evaluation (eval_steps {schedule.eval_steps or '-'})",
        file=out,
        flush=True,
    )
    return ProgressWatch(options, schedule, hosts, time.monotonic())


def _launch_failure(failures: dict[str, str]) -> str:
    if not failures:
        return "launch playbook failed"
    host, line = next(iter(failures.items()))
    return f"{host}: start failed: {line}"

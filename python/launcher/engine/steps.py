"""The run: load -> validate -> (preflight) -> plan -> ship -> follow -> finish, over one :class:`RunPlan`.

Nothing reaches a node before the job spec and its configs are validated and every host is found in the
inventory: the one ansible-runner wrapper (:class:`launcher.runner.PlaybookRunner`) is constructed only after.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import yaml

from launcher import runner as runner_module
from launcher.backends import backend_of, check_recovery, nodes_in_inventory, prepare
from launcher.backends.agent import launch_vars
from launcher.data import mift_contract as contract
from launcher.engine import attempts
from launcher.engine.finish import finish
from launcher.engine.plan import (
    TRAIN_FILE,
    ResumeFrom,
    RunPlan,
    build_plan,
    last_common_checkpoint,
    require_liger,
    validate_plan,
    with_tokenized_path,
)
from launcher.engine.split import record_of, summary_line
from launcher.exceptions import ConfigurationError, JobFailedError, LauncherError
from launcher.exit_codes import OK, ExitCode
from launcher.fabric.runtime import TransportWatch
from launcher.follow import follow
from launcher.inventory import check_hosts, spare_hosts
from launcher.job import Job
from launcher.jobspec import mask_env
from launcher.lease import BACKENDS, take_leases
from launcher.merge import merge_after_run
from launcher.nodeenv import masked
from launcher.planning.training import out_of_memory_line, replan_after_oom
from launcher.preflight import PreflightOnce, facts_of_host, node_paths, run_preflight
from launcher.recovery import (
    NEVER_RETRIED,
    Decision,
    Failure,
    classify,
    decide,
    excluded_after,
    fewer_nodes_line,
    replace_host,
    spare_candidates,
    stall_failure,
)
from launcher.runs import FINAL_STATES, RunDir, new_run_id
from launcher.staging import YAML_KEYS, stage, stage_items, write_manifests
from launcher.tokenize_once import tokenize_for_run
from launcher.validation import backends as validation_backends
from launcher.validation.files import validate_loaded
from launcher.validation.job import load_job
from launcher.verdict import Verdict
from launcher.watchdog import ProgressWatch, Schedule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from launcher.jobspec import JobSpec
    from launcher.planning.training import TrainingPlan
    from launcher.preflight import NodeFacts, NodePath
    from launcher.problems import FileReport
    from launcher.runner import PlaybookRunner
    from launcher.validation.job import LoadedJob


@contextlib.contextmanager
def interrupt_guard(event: threading.Event) -> Iterator[threading.Event]:
    """Turn SIGINT and SIGTERM into ``event`` (no exception), so cleanup always runs; restore on exit."""

    def handler(signum: int, _frame: object) -> None:
        if not event.is_set():
            print(f"\n{signal.Signals(signum).name}: stopping the job on every node ...", file=sys.stderr)
        event.set()

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield event
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def _refuse(report: FileReport) -> None:
    errors = [p for p in report.problems if p.is_error]
    if errors:
        raise ConfigurationError(problems=errors)


def validate(job: LoadedJob) -> None:
    """Validate the loaded job; the shipped key lists answer first when they speak for the installed
    classes."""
    if not validation_backends.builtin_forced() and validation_backends.shipped_lists_match_installed():
        _refuse(validate_loaded(job, builtin=True))
    _refuse(validate_loaded(job))


def load_and_check(job_path: Path, inventory: Path | None) -> LoadedJob:
    """Load and validate the job and check its hosts against the inventory (in parallel); bad input raises."""
    job = load_job(job_path)
    if not nodes_in_inventory(job.spec):  # Slurm picks them: the backend reaches only its login host
        validate(job)
        return job
    with concurrent.futures.ThreadPoolExecutor(
        1
    ) as pool:  # ansible-inventory runs while the configs are checked
        hosts = pool.submit(check_hosts, job.spec, inventory, job_path)
        try:
            validate(job)
        finally:
            hosts_error = hosts.exception()
    if hosts_error is not None:
        raise hosts_error
    return job


def _checkpoints_of(spec: JobSpec, run_id: str, resume: ResumeFrom | None) -> str | None:
    """The node folder whose complete checkpoints preflight lists: the resumed run's output_dir (``run
    --resume``), or the job's own with ``resume: true`` (absolute: validated); None otherwise."""
    if resume is not None:
        return resume.output_dir
    if spec.resume is True:
        return spec.node_output_dir(run_id)
    return None


def _node_paths(job: LoadedJob, resume: ResumeFrom | None) -> list[NodePath]:
    """The folders every node must hold before the start (model, named resume checkpoint, dataset); a folder
    the job stages is not among them: staging, after preflight, puts it there and verifies it file by file."""
    deepspeed = None if job.deepspeed_from == "auto" else job.deepspeed is not None
    staged = {YAML_KEYS[item.key] for item in stage_items(job)}
    return [
        path
        for path in node_paths(job.train.data, job.spec, deepspeed=deepspeed, resume_run=resume is not None)
        if path.what not in staged
    ]


def run_job(
    job_path: Path,
    *,
    inventory: Path | None,
    detach: bool,
    out: IO[str] | None = None,
    resume: ResumeFrom | None = None,
    backend: str | None = None,
    preflight_once: PreflightOnce | None = None,
    force: bool = False,
) -> RunDir:
    """Run a job end to end; return its run directory (its record's status says how it ended,
    :func:`launcher.runs.exit_code_of` the exit code); bad input raises (2), as does a run rejected or failed
    before its trainers started (its record says so too).

    ``preflight_once``: facts one preflight learnt about exactly this job's hosts, reused instead of running
    preflight again (the probe's candidates, one after the other on the same node); kept there when empty.
    ``force``: take over the GPU lease of another live run (launcher.lease).
    """
    out = out or sys.stdout
    inv = inventory.resolve() if inventory else None
    if inv is not None and not inv.exists():
        raise ConfigurationError.at(inventory or inv, "(file)", "inventory not found", "file")
    job = load_and_check(job_path, inv)
    stage_items(job)  # a missing source is bad input before any host is asked
    spec = job.spec
    run_id = new_run_id(spec.name)
    handle = prepare(backend, inv, spec, job_path, run_id, resume=resume is not None)
    recover = check_recovery(spec, job_path, handle.backend, detach=detach, out=out)
    interrupted = threading.Event()
    with interrupt_guard(interrupted):
        run = RunDir.create(
            run_id,
            {
                "name": spec.name,
                "created_at": time.time(),
                "spec_path": str(job_path.resolve()),
                "spec": {**spec.model_dump(mode="json"), "env": mask_env(spec.env_strings())},
                "deepspeed_from": job.deepspeed_from,
                "inventory": str(inv) if inv else None,
                "launcher_pid": os.getpid(),
                "detached": detach,
                **({"resumed_from": resume.run_id} if resume else {}),
                **handle.record_fields(),
            },
        )
        print(f"run {run_id}: {run.path}", file=out, flush=True)
        runner = runner_module.PlaybookRunner(run.ansible_dir, inventory=inv)
        runner.cancel_requested = interrupted
        run.set_status("preflight")
        attempts.begin(run, 1, time.time())
        try:
            facts = preflight_once.reuse(spec.hosts) if preflight_once and not resume else None
            if facts is None:  # where the backend reaches (login host only: its facts once per rank)
                facts = backend_of(run.record()).preflight(
                    run_preflight,
                    runner,
                    spec,
                    run_id,
                    output_dir=resume.output_dir if resume else None,
                    checkpoints_of=_checkpoints_of(spec, run_id, resume),
                    requires=_node_paths(job, resume),
                )
                if preflight_once is not None:
                    preflight_once.keep(facts)
            training = probe_before_run(job, facts, inv, run, out) if spec.plan == "probe" else None
            plan = build_plan(job, facts, run_id, resume, training)
            _refuse(validate_plan(plan))
        except LauncherError as err:
            _ended_before_start(run, "stopped" if interrupted.is_set() else "rejected", err)
            raise
        try:
            tokenized = stage_for_run(job, runner, run, interrupted, out, plan=plan)
            if tokenized is not None:  # the shipped YAML reads the tokenized copy (validated as shipped)
                plan = with_tokenized_path(plan, tokenized)
                _refuse(validate_plan(plan))
        except LauncherError as err:
            failed = "failed" if isinstance(err, JobFailedError) else "rejected"
            _ended_before_start(run, "stopped" if interrupted.is_set() else failed, err)
            raise
        if handle.backend in BACKENDS:
            try:  # the nodes' GPUs are this run's from here to its finish
                take_leases(runner, run, facts.hosts, force=force, out=out)
            except LauncherError as err:
                _ended_before_start(run, "stopped" if interrupted.is_set() else "rejected", err)
                raise
        spares = spare_hosts(spec, inv) if recover else []
        _attempt_loop(
            run,
            runner,
            plan,
            interrupted=interrupted,
            detach=detach,
            out=out,
            resume=resume,
            recover=recover,
            spares=spares,
        )
        return run


def _ended_before_start(run: RunDir, state: str, err: LauncherError) -> None:
    """Record a run (and its first attempt) that ended before its trainers started."""
    attempts.end(run, state, str(err))
    run.set_status(state, str(err))


def _next_plan(  # noqa: PLR0917 - the attempt loop's state
    run: RunDir,
    runner: PlaybookRunner,
    previous: RunPlan,
    resume: ResumeFrom | None,
    out: IO[str],
    training: TrainingPlan | None,
    spare: tuple[str, str] | None = None,
) -> RunPlan:
    """Preflight again and plan the next attempt: ``training`` (the same training plan, or the one re-planned
    after out of memory: the same global batch either way), the same output_dir, resuming from the last
    checkpoint complete on every node (none: from step 0, said). ``spare``: (excluded node, spare): the spare
    runs in the excluded node's rank slots, after its preflight with the others."""
    job = previous.job
    if spare is not None:
        hosts = replace_host(previous.hosts, *spare)
        job = dataclasses.replace(job, spec=job.spec.model_copy(update={"hosts": hosts}))
    spec = job.spec
    facts = run_preflight(
        runner,
        spec,
        run.run_id,
        output_dir=previous.output_dir,
        checkpoints_of=previous.output_dir,
        requires=_node_paths(job, resume),
    )
    if spare is not None:
        _check_spare(facts, spare[1], previous)
    step = last_common_checkpoint(facts)
    source = None
    if step is not None or resume is not None:  # `run --resume` without one: refused (nothing to resume)
        source = ResumeFrom(resume.run_id if resume else run.run_id, previous.output_dir)
    if step is not None:
        print(f"resuming from {previous.output_dir}/checkpoint-{step} (complete on every node)", file=out)
    elif resume is None:
        print("no checkpoint complete on every node: the next attempt starts again from step 0", file=out)
    plan = build_plan(job, facts, run.run_id, source, training)
    tokenized = (yaml.safe_load(previous.files[TRAIN_FILE]) or {}).get("tokenized_path")
    if tokenized:  # tokenize once: the nodes keep the tokenized copy the first attempt read
        plan = with_tokenized_path(plan, str(tokenized))
    _refuse(validate_plan(plan))
    return plan


def _check_spare(facts: NodeFacts, spare: str, previous: RunPlan) -> None:
    """Refuse a spare that would change the world size (another rank count per node) or lacks a checkpoint
    the other nodes see (output_dir is not shared after all)."""
    if facts.nproc_per_node != previous.facts.nproc_per_node:
        raise ConfigurationError(
            f"{spare}: {facts.nproc_per_node} ranks per node where the run has "
            f"{previous.facts.nproc_per_node}: the world size would change"
        )
    others = [set(facts.probe[h].get("checkpoints") or []) for h in facts.hosts if h != spare]
    theirs = set.intersection(*others) if others else set()
    lacking = theirs - set(facts.probe.get(spare, {}).get("checkpoints") or [])
    if lacking:
        raise ConfigurationError(
            f"{spare}: does not see checkpoint-{max(lacking)} in {previous.output_dir}, which the others "
            "have: output_dir is not on a file system every node sees (output_shared: true says it is)"
        )


def _with_spare(  # noqa: PLR0917 - the attempt loop's state
    run: RunDir,
    runner: PlaybookRunner,
    previous: RunPlan,
    resume: ResumeFrom | None,
    out: IO[str],
    training: TrainingPlan | None,
    *,
    gone: str,
    spares: list[str],
    excluded: dict[str, str],
) -> RunPlan:
    """Plan the next attempt with a spare in the place of ``gone`` (excluded): the first spare, in inventory
    order, that passes preflight with the other nodes; a spare that does not is excluded too. None passes:
    JobFailedError with the line that says why the run does not go on with fewer nodes."""
    tried: dict[str, str] = {}
    for spare in spare_candidates(spares, previous.hosts, list(excluded)):
        print(f"spare {spare}: preflight in {gone}'s place ...", file=out, flush=True)
        try:
            plan = _next_plan(run, runner, previous, resume, out, training, spare=(gone, spare))
        except LauncherError as err:
            if runner.cancel_requested.is_set():
                raise
            why = str(err).removeprefix(f"{spare}: ")
            tried[spare] = why
            excluded[spare] = f"failed preflight: {why}"
            run.update(excluded=dict(excluded))
            print(f"spare {spare}: excluded: {why}", file=out, flush=True)
            continue
        print(
            f"spare {spare} takes {gone}'s place (node rank {plan.hosts.index(spare)}); "
            f"nodes: {', '.join(plan.hosts)}",
            file=out,
            flush=True,
        )
        attempts.note(run, replaced={gone: spare})
        return plan
    raise JobFailedError(fewer_nodes_line(gone, previous.hosts, previous.facts.nproc_per_node, tried))


def _attempt_loop(  # noqa: PLR0911 - one return per way a run ends; the loop reads in one place
    run: RunDir,
    runner: PlaybookRunner,
    plan: RunPlan,
    *,
    interrupted: threading.Event,
    detach: bool,
    out: IO[str],
    resume: ResumeFrom | None,
    recover: bool,
    spares: list[str],
) -> None:
    """Run attempts until one succeeds, is stopped, or fails in a way the recovery policy does not retry
    (``recover`` False: the first failure ends the run, as it is judged); the record's status says which.
    ``spares``: the hosts of ``recovery.spares`` (none: a failed node is not excluded, the next attempt runs
    on the same nodes)."""
    earlier: list[Failure] = []
    excluded: dict[str, str] = {}  # host -> why, for the rest of the run (recovery.spares)
    number = 1
    while True:
        attempts.planned(run, plan)
        outcome = _ship_and_follow(run, runner, plan, interrupted=interrupted, detach=detach, out=out)
        if not isinstance(outcome, tuple):
            return  # detached: the trainers run on
        verdict, nodes, job = outcome
        if verdict.state not in ("failed", "stalled") or not recover:
            attempts.end(run, verdict.state, verdict.reason)
            finish(job, verdict, nodes, out=out, announce=True)
            if verdict.state == "succeeded":
                merge_after_run(run, plan, runner, train=yaml.safe_load(plan.files[TRAIN_FILE]), out=out)
            return
        failure, nodes = _failure_of(run, job, verdict, nodes, spec=plan.spec, interrupted=interrupted)
        decision = decide(plan.spec.recovery, earlier, failure, replan=plan.training is not None)
        training, decision = _replanned(plan, failure, decision)
        gone, decision = _exclusion(run, plan, failure, earlier, decision, spares=spares, excluded=excluded)
        attempts.end(run, verdict.state, verdict.reason, failure, decision)
        print(
            f"attempt {number} failed ({failure.kind}"
            f"{' on ' + failure.host if failure.host else ''}): {decision.why}",
            file=out,
            flush=True,
        )
        if not decision.retry:
            final = Verdict(verdict.state, f"{failure.reason}; {decision.why}")
            finish(job, final, nodes, out=out, announce=True)
            return
        if training is not plan.training and training is not None:
            print(
                f"re-planned after out of memory: {_replan_words(plan.training, training)}",
                file=out,
                flush=True,
            )
        print(f"{verdict.state}: {verdict.reason}; stopping every node ...", file=out, flush=True)
        run.set_status("stopping", verdict.reason)
        job.dump_stacks_on_stop = verdict.state == "stalled"  # as finish() does: the stacks tell who hung
        job.stop()
        job.dump_stacks_on_stop = False
        if _ended_elsewhere(run, out):
            return
        run.update(nodes={h: _brief(n) for h, n in nodes.items()})
        run.set_status("recovering", decision.why)
        if interrupted.wait(decision.backoff_s):
            verdict = Verdict("stopped", "interrupted (Ctrl-C) while waiting to retry")
            finish(job, verdict, nodes, out=out, stopped=True)
            return
        if _ended_elsewhere(run, out):
            return
        earlier.append(failure)
        number += 1
        print(f"attempt {number}: preflight ...", file=out, flush=True)
        run.set_status("preflight", f"attempt {number}")
        attempts.begin(run, number, time.time())
        try:
            plan = (
                _next_plan(run, runner, plan, resume, out, training)
                if gone is None
                else _with_spare(
                    run, runner, plan, resume, out, training, gone=gone, spares=spares, excluded=excluded
                )
            )
        except LauncherError as err:
            stopped = interrupted.is_set()
            why = f"attempt {number}: {err}"
            never = Failure("preflight", "", str(err))
            attempts.end(run, "stopped" if stopped else "failed", str(err), None if stopped else never)
            finish(
                job,
                Verdict("stopped" if stopped else "failed", why),
                nodes,
                out=out,
                stopped=True,
                announce=True,
            )
            return


def _exclusion(
    run: RunDir,
    plan: RunPlan,
    failure: Failure,
    earlier: list[Failure],
    decision: Decision,
    *,
    spares: list[str],
    excluded: dict[str, str],
) -> tuple[str | None, Decision]:
    """Return the node ``failure`` excludes for the rest of the run (added to ``excluded`` and the record;
    None: no spares, none excluded, or not retried anyway) and the decision with its fate: a spare is tried
    next, or, none left, the run ends with the line that says why it does not go on with fewer nodes."""
    gone = excluded_after(failure, earlier) if decision.retry and spares else None
    if gone is None:
        return None, decision
    excluded[gone] = f"{failure.kind}: {failure.reason}"
    run.update(excluded=dict(excluded))
    left = spare_candidates(spares, plan.hosts, list(excluded))
    if not left:
        return gone, Decision(False, fewer_nodes_line(gone, plan.hosts, plan.facts.nproc_per_node, {}))
    why = f"{decision.why}; {gone} excluded, spare {left[0]} next (of {', '.join(left)})"
    return gone, Decision(True, why, decision.backoff_s)


def _replanned(plan: RunPlan, failure: Failure, decision: Decision) -> tuple[TrainingPlan | None, Decision]:
    """Return the next attempt's training plan and the decision. Unless ``plan`` ran out of memory and is
    retried: its own plan, the decision as it is. After out of memory: the next plan that fits with a larger
    margin (:func:`launcher.planning.training.replan_after_oom`), else no plan and a decision that ends the
    run with the memory numbers in one line."""
    if not decision.retry or failure.kind != "oom":
        return plan.training, decision
    ran = plan.training
    assert ran is not None and ran.choice is not None  # decide() re-plans only a plan the launcher chose
    again = replan_after_oom(ran)
    if again.choice is None:
        return None, Decision(False, f"not retried: {out_of_memory_line(ran.choice, again)}")
    return again, decision


def _replan_words(ran: TrainingPlan | None, again: TrainingPlan) -> str:
    """Return the next plan against the one that ran out, in words (global batch kept)."""
    assert again.choice is not None
    was = f"; was {ran.choice.describe()}, margin {ran.margin:.0%}" if ran and ran.choice else ""
    return f"{again.choice.describe()} (global batch {again.global_batch}, margin {again.margin:.0%}{was})"


def _failure_of(
    run: RunDir,
    job: Job,
    verdict: Verdict,
    nodes: dict[str, contract.NodeStatus],
    *,
    spec: JobSpec,
    interrupted: threading.Event,
) -> tuple[Failure, dict[str, contract.NodeStatus]]:
    """Return what failed in a ``failed`` or ``stalled`` attempt, and the node states it was judged from."""
    if verdict.state == "stalled":  # the watchdog's verdict; the record's `stall` names the lagging nodes
        stall = run.load().get("stall") or {}
        return stall_failure(verdict.reason, [str(h) for h in stall.get("lagging") or []]), nodes
    failure = classify(verdict.reason, nodes)
    for _ in range(SETTLE_POLLS):
        if failure.kind in spec.recovery.retry_on or failure.kind in NEVER_RETRIED or not _running(nodes):
            break
        # the cause may not have reached every node's state yet (a rank killed on host2 makes host1's
        # rank fail first; host2's torchrun ends a moment later): poll again before judging what failed
        nodes = _settled(job, nodes, spec.poll_interval_s, interrupted)
        failure = classify(verdict.reason, nodes)
    return failure, nodes


# polls, at most, for the nodes still running after one failed to end (their ranks fail within seconds when a
# peer is gone; a node whose ranks hang in a collective is judged as it is then)
SETTLE_POLLS = 3


def _running(nodes: dict[str, contract.NodeStatus]) -> bool:
    return any(n.get("state") == contract.RUNNING for n in nodes.values())


def _settled(
    job: Job, nodes: dict[str, contract.NodeStatus], wait_s: float, interrupted: threading.Event
) -> dict[str, contract.NodeStatus]:
    """Return ``nodes`` with the nodes that were still running polled once more (after ``wait_s``)."""
    if interrupted.wait(wait_s):
        return nodes
    later = job.poll()
    return {h: later.get(h, n) if n.get("state") == contract.RUNNING else n for h, n in nodes.items()}


def _ended_elsewhere(run: RunDir, out: IO[str]) -> bool:
    """Return True (and say so) when ``launcher stop`` ended the run while it was between attempts."""
    status = run.record().status
    if status not in FINAL_STATES:
        return False
    print(f"run {run.run_id}: {status} while waiting to retry; no next attempt", file=out)
    return True


def _brief(node: contract.NodeStatus) -> dict[str, Any]:
    return {k: v for k, v in node.items() if k != "log_tail"}


def stage_for_run(
    job: LoadedJob,
    runner: PlaybookRunner,
    run: RunDir,
    interrupted: threading.Event,
    out: IO[str],
    *,
    plan: RunPlan | None = None,
) -> str | None:
    """Stage the job's folders on every node (status ``staging``, progress in the record); the manifests are
    kept in the run (``staging`` in record.json, ``staging/<key>.manifest.json``). With ``plan``, then
    tokenize once (launcher/tokenize_once.py): return the node path of the tokenized dataset, or None."""
    if not job.spec.stage.items():
        return None
    run.set_status("staging")
    outcome = stage(
        job, runner, out=out, stop=interrupted, progress=lambda state: run.update(staging={"progress": state})
    )
    if outcome is None:
        return None
    write_manifests(run.path, outcome)
    run.update(staging=outcome.record())
    if plan is None:
        return None
    train = yaml.safe_load(plan.files[TRAIN_FILE])
    done = tokenize_for_run(
        plan, runner, outcome, run.path / "tokenize", train=train, out=out, stop=interrupted
    )
    if done is None:
        return None
    run.update(tokenized=done[1])
    return done[0]


def stage_only(job_path: Path, *, inventory: Path | None, out: IO[str]) -> ExitCode:
    """``launcher stage``: load and check the job, then stage its folders on every node; no run is made."""
    inv = inventory.resolve() if inventory else None
    if inv is not None and not inv.exists():
        raise ConfigurationError.at(inventory or inv, "(file)", "inventory not found", "file")
    job = load_and_check(job_path, inv)
    if not stage_items(job):
        raise ConfigurationError.at(job_path, "stage", "the job spec stages nothing", "stage")
    interrupted = threading.Event()
    with interrupt_guard(interrupted), tempfile.TemporaryDirectory(prefix="mift-stage-") as tmp:
        runner = runner_module.PlaybookRunner(Path(tmp), inventory=inv)
        runner.cancel_requested = interrupted
        stage(job, runner, out=out, stop=interrupted)
    return OK


def probe_before_run(
    job: LoadedJob, facts: NodeFacts, inventory: Path | None, run: RunDir, out: IO[str]
) -> TrainingPlan:
    """``plan: probe``: plan as ``auto``, run the best candidates for a few steps on the first node, pick by
    measurement (:mod:`launcher.planning.probe`); the probe runs are runs of their own, named
    ``<name>-probe<i>``.
    """
    from launcher.engine.probe import LauncherProber  # noqa: PLC0415 - only for plan: probe
    from launcher.engine.split import auto_plan  # noqa: PLC0415
    from launcher.planning.probe import run_probe  # noqa: PLC0415

    if job.spec.plan_liger:  # before the probe's minutes: its candidates would all fail at start
        require_liger(facts, "plan_liger: true lets the plan switch liger kernels on")
    training = auto_plan(job, dict(job.train.data), facts)
    run.set_status("probing")
    workdir = run.path / "probe"
    prober = LauncherProber(job, facts.master, inventory, workdir, out, run_job)
    prober.preflight = PreflightOnce(facts_of_host(facts, facts.master))  # checked a moment ago
    probed = run_probe(training, prober, clock=time.monotonic)
    assert probed.probe is not None
    print(probed.probe.reason(), file=out, flush=True)
    run.set_status("preflight")
    return probed


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


def _ship_and_follow(
    run: RunDir,
    runner: PlaybookRunner,
    plan: RunPlan,
    *,
    interrupted: threading.Event,
    detach: bool,
    out: IO[str],
) -> ExitCode | tuple[Verdict, dict[str, contract.NodeStatus], Job]:
    """Start the plan's trainers and follow them; return the verdict, the last node states and the job (the
    caller finishes or retries), or OK once a detached run started."""
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
        launch = backend.start(runner, run, plan, launch_vars(run, plan))
    except LauncherError as err:  # the scheduler refused the request before anything was submitted
        run.set_status("rejected", str(err))
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
    train = yaml.safe_load(plan.files[TRAIN_FILE]) or {}
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

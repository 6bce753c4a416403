"""The attempt loop: all of recovery's control flow in one room.

A run that fails is classified and judged by the pure policy of :mod:`launcher.follow.recovery`; here the
engine acts on it: it waits, stops what is left, takes a spare in place of a lost node (preflight on the
spare, a re-plan), re-plans after out of memory, and starts the next attempt. The attempts' record:
:mod:`launcher.engine.attempt_log`."""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from typing import IO, TYPE_CHECKING, Any

from launcher.engine import attempt_log
from launcher.engine.finish import finish
from launcher.engine.job import Job
from launcher.engine.load import refuse, required_paths
from launcher.engine.plan import (
    ResumeFrom,
    RunPlan,
    build_plan,
    last_common_checkpoint,
    validate_plan,
    with_tokenized_path,
)
from launcher.engine.shipping import ship_and_follow
from launcher.exceptions import ConfigurationError, JobFailedError, LauncherError
from launcher.follow.recovery import (
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
from launcher.follow.verdict import Verdict
from launcher.node import contract
from launcher.planning.training import out_of_memory_line, replan_after_oom
from launcher.preflight.checks import run_preflight
from launcher.rundir.runs import FINAL_STATES, RunDir
from launcher.transfer.merge import merge_after_run

if TYPE_CHECKING:
    from launcher.backends.runner import PlaybookRunner
    from launcher.engine.lease import LeaseRequest
    from launcher.planning.training import TrainingPlan
    from launcher.preflight.checks import NodeFacts
    from launcher.spec.jobspec import JobSpec


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
        requires=required_paths(job, resume),
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
    tokenized = (previous.train or {}).get("tokenized_path")
    if tokenized:  # tokenize once: the nodes keep the tokenized copy the first attempt read
        plan = with_tokenized_path(plan, str(tokenized))
    refuse(validate_plan(plan))
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
            run.set_excluded(excluded)
            print(f"spare {spare}: excluded: {why}", file=out, flush=True)
            continue
        print(
            f"spare {spare} takes {gone}'s place (node rank {plan.hosts.index(spare)}); "
            f"nodes: {', '.join(plan.hosts)}",
            file=out,
            flush=True,
        )
        attempt_log.note(run, replaced={gone: spare})
        return plan
    raise JobFailedError(fewer_nodes_line(gone, previous.hosts, previous.facts.nproc_per_node, tried))


def attempt_loop(  # noqa: PLR0911 - one return per way a run ends; the loop reads in one place
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
    lease: LeaseRequest | None = None,
) -> None:
    """Run attempts until one succeeds, is stopped, or fails in a way the recovery policy does not retry
    (``recover`` False: the first failure ends the run, as it is judged); the record's status says which.
    ``spares``: the hosts of ``recovery.spares`` (none: a failed node is not excluded, the next attempt runs
    on the same nodes). ``lease``: the GPU lease the first attempt's start takes (engine/lease.py; held to the
    run's finish)."""
    earlier: list[Failure] = []
    excluded: dict[str, str] = {}  # host -> why, for the rest of the run (recovery.spares)
    number = 1
    ship = functools.partial(ship_and_follow, interrupted=interrupted, detach=detach, out=out)
    while True:
        attempt_log.planned(run, plan)
        outcome = ship(run, runner, plan, lease=lease)
        lease = None  # taken by the first start, held to the run's finish
        if not isinstance(outcome, tuple):
            return  # detached: the trainers run on
        verdict, nodes, job = outcome
        if verdict.state not in ("failed", "stalled") or not recover:
            attempt_log.end(run, verdict.state, verdict.reason)
            finish(job, verdict, nodes, out=out, announce=True)
            if verdict.state == "succeeded":
                merge_after_run(run, plan, runner, train=plan.train, out=out)
            return
        failure, nodes = _failure_of(run, job, verdict, nodes, spec=plan.spec, interrupted=interrupted)
        decision = decide(plan.spec.recovery, earlier, failure, replan=plan.training is not None)
        training, decision = _replanned(plan, failure, decision)
        gone, decision = _exclusion(run, plan, failure, earlier, decision, spares=spares, excluded=excluded)
        attempt_log.end(run, verdict.state, verdict.reason, failure, decision)
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
        _stop_for_retry(job, verdict, out)
        if _ended_elsewhere(run, out):
            return
        run.set_nodes({h: _brief(n) for h, n in nodes.items()})
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
        attempt_log.begin(run, number, time.time())
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
            attempt_log.end(run, "stopped" if stopped else "failed", str(err), None if stopped else never)
            finish(
                job,
                Verdict("stopped" if stopped else "failed", why),
                nodes,
                out=out,
                stopped=True,
                announce=True,
            )
            return


def _stop_for_retry(job: Job, verdict: Verdict, out: IO[str]) -> None:
    """Stop every node of the failed attempt before the next one (a stalled one dumps its stacks first, as
    :func:`launcher.engine.finish.finish` does: the stacks tell who hung)."""
    print(f"{verdict.state}: {verdict.reason}; stopping every node ...", file=out, flush=True)
    job.run.set_status("stopping", verdict.reason)
    job.dump_stacks_on_stop = verdict.state == "stalled"
    job.stop()
    job.dump_stacks_on_stop = False


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
    run.set_excluded(excluded)
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

"""The attempts of a run, kept in its record (``attempts``): one entry per start of the trainers.

A run that recovers from a failure (``launcher.follow.recovery``) starts its trainers again in the same node
run
directories, from the last checkpoint complete on every node; each start is an attempt with its nodes, the
step it resumed from, its start and end times, how it ended, the failure kind and the recovery decision.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launcher.engine.plan import RunPlan
    from launcher.follow.recovery import Decision, Failure
    from launcher.planning.training import TrainingPlan
    from launcher.rundir.runs import RunDir

_CHECKPOINT_RE = re.compile(r"checkpoint-(\d+)/?$")


def resume_step(plan: RunPlan) -> int | None:
    """Return the checkpoint step the plan's trainers resume from (None: from the start, or the trainer's own
    choice with ``resume: true`` and no checkpoint listed)."""
    resume_from = next(iter(plan.jobs.values()))["resume_from"] if plan.jobs else None
    match = _CHECKPOINT_RE.search(str(resume_from or ""))
    return int(match.group(1)) if match else None


def begin(run: RunDir, number: int, started_at: float) -> None:
    """Record that attempt ``number`` began (at ``started_at``, before its preflight)."""
    attempts = _attempts(run)
    attempts.append({"attempt": number, "started_at": round(started_at, 3), "state": "preflight"})
    run.set_attempts(attempts)


def planned(run: RunDir, plan: RunPlan) -> None:
    """Record the current attempt's nodes, resume step and, with ``plan: auto``, the plan it runs."""
    fields: dict[str, Any] = {"hosts": list(plan.hosts), "resume_step": resume_step(plan), "state": "running"}
    if plan.training is not None:
        fields["plan"] = plan_brief(plan.training)
    _update_last(run, **fields)


def note(run: RunDir, **fields: Any) -> None:  # noqa: ANN401 - JSON values
    """Add ``fields`` to the current attempt's entry (a spare's place: ``replaced``)."""
    _update_last(run, **fields)


def plan_brief(training: TrainingPlan) -> dict[str, Any]:
    """Return what an attempt's record keeps of its training plan (``plan: auto``): the split, the offload
    and the margin it was chosen with, so that a re-planned attempt shows what changed."""
    choice = training.choice
    assert choice is not None  # auto_plan and the re-plan after out of memory refuse a plan without one
    strategy = choice.strategy
    offload = "optimizer and parameters" if strategy.offload_params else "optimizer"
    return {
        "strategy": strategy.value,
        "micro_batch": choice.split.micro_batch,
        "gradient_accumulation_steps": choice.split.accumulation,
        "gradient_checkpointing": choice.split.checkpointing,
        "offload": offload if strategy.offload_optimizer else "none",
        "margin": round(training.margin, 4),
        "global_batch": training.global_batch,
    }


def end(
    run: RunDir,
    state: str,
    reason: str = "",
    failure: Failure | None = None,
    decision: Decision | None = None,
) -> None:
    """Record how the current attempt ended."""
    fields: dict[str, Any] = {"state": state, "ended_at": round(time.time(), 3)}
    if reason:
        fields["reason"] = reason
    if failure is not None:
        fields.update(kind=failure.kind, failed_host=failure.host or None)
    if decision is not None:
        fields["decision"] = decision.why
    _update_last(run, **fields)


def _attempts(run: RunDir) -> list[dict[str, Any]]:
    value = run.load().get("attempts")
    return [dict(a) for a in value if isinstance(a, dict)] if isinstance(value, list) else []


def _update_last(run: RunDir, **fields: Any) -> None:  # noqa: ANN401 - JSON values
    attempts = _attempts(run)
    if attempts:
        attempts[-1].update(fields)
        run.set_attempts(attempts)

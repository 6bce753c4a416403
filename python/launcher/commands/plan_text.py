"""What ``plan`` says: the one decision `run` would apply, the DeepSpeed choice in one line, the tables.

`run` applies, under ``plan: as_written``, the job's strategy at the training YAML's own split: the DeepSpeed
file the job spec or the YAML names (none: plain DDP), or with ``deepspeed: auto`` the fastest strategy that
fits (:func:`launcher.engine.plan._deepspeed`); under ``plan: auto``/``probe`` the training plan's choice.
The output states that one decision; the other table is shown for reference, never as a second choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.planning.dsconfig import strategy_of_config
from launcher.planning.memory import GIB

if TYPE_CHECKING:
    from launcher.commands.plan_cluster import PlannedCluster
    from launcher.planning.memory import Strategy
    from launcher.planning.training import TrainingPlan
    from launcher.validation.job import LoadedJob

RUN_APPLIES = "`run` applies"


def shown(path: str | Path) -> str:
    """A path as the user would type it: relative to the working directory where it is below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class Applied:
    """The decision `run` would apply, and the DeepSpeed source in one line."""

    plan_mode: str
    deepspeed: str  # "auto", the file's label, or "none"
    deepspeed_line: str
    strategy: Strategy | None
    fits: bool
    summary: str

    def as_json(self) -> dict[str, Any]:
        """The decision for ``plan --json``."""
        return {
            "plan_mode": self.plan_mode,
            "deepspeed": self.deepspeed,
            "strategy": self.strategy.value if self.strategy is not None else None,
            "fits": self.fits,
            "summary": self.summary,
        }


def deepspeed_line(job: LoadedJob) -> tuple[str, str]:
    """(``auto`` / the file / ``none``, one line saying where the run's DeepSpeed config comes from)."""
    named = job.train.data.get("deepspeed")
    if job.deepspeed_from == "auto":
        return "auto", "DeepSpeed: auto (the job spec): the planner picks the fastest strategy that fits"
    if job.deepspeed is not None and job.deepspeed_from == "job spec":
        line = f"DeepSpeed: {shown(job.deepspeed.path)} (the job spec's deepspeed)"
        if named:
            yaml_ds = named if isinstance(named, str) else "its inline config"
            line += f", replacing the training YAML's deepspeed: {yaml_ds}"
        return shown(job.deepspeed.path), line
    if job.deepspeed is not None:
        label = (
            shown(job.deepspeed.path)
            if job.deepspeed.label == str(job.deepspeed.path)
            else job.deepspeed.label
        )
        return label, f"DeepSpeed: {label} (the training YAML's deepspeed)"
    return "none", "DeepSpeed: none (neither the job spec nor the training YAML names one): plain DDP"


def applied_of(job: LoadedJob, plan: TrainingPlan, training: TrainingPlan) -> Applied:
    """The one decision `run` would apply (``plan`` is the fixed-split plan, ``training`` the whole one)."""
    ds, line = deepspeed_line(job)
    mode = job.spec.plan
    if mode != "as_written":
        choice = training.choice
        return Applied(
            mode,
            ds,
            line,
            choice.strategy if choice else None,
            choice is not None,
            training.reason(RUN_APPLIES),
        )
    if job.deepspeed_from == "auto":
        choice = plan.choice
        return Applied(
            mode, ds, line, choice.strategy if choice else None, choice is not None, plan.reason(RUN_APPLIES)
        )
    strategy = strategy_of_config(dict(job.deepspeed.data) if job.deepspeed is not None else None)
    row = next(c for c in plan.at_split(plan.as_written) if c.strategy is strategy)
    cap = plan.cluster.gpu_mem_gib
    where = f"{RUN_APPLIES} {strategy.label} ({ds}) at the YAML's split ({plan.as_written.describe()})"
    if row.fits:
        need = row.estimate.gpu_total * (1 + plan.margin) / GIB
        text = f"{where}: it fits in {need:.1f} of {cap:.1f} GiB per GPU with the {plan.margin:.0%} margin."
    else:
        gpu = not row.fits_gpu
        need = (row.estimate.gpu_total if gpu else row.estimate.host) / GIB
        limit = cap if gpu else plan.cluster.host_mem_gib
        text = (
            f"{where}: it does not fit: {need:.1f} GiB per {'GPU' if gpu else 'host'} "
            f"(+{plan.margin:.0%} margin) of {limit:.1f}; pin a strategy that fits (the table) or "
            "deepspeed: auto."
        )
    return Applied(mode, ds, line, strategy, row.fits, text)


def render_plan(
    job: LoadedJob, planned: PlannedCluster, plan: TrainingPlan, training: TrainingPlan, applied: Applied
) -> str:
    """The text of ``plan``: inputs, the strategy table, the training plan, one decision."""
    from launcher.planning.report import render, render_training  # noqa: PLC0415

    spec = job.spec
    if applied.plan_mode == "as_written":
        strategies = render(plan, marked=applied.strategy, mark=" <- run", reason=applied.summary)
        how = (
            "not applied: the job spec runs the YAML's split as written (plan: as_written); "
            "with plan: auto, `run` would re-split as below"
        )
        whole = render_training(training, mark=" <- plan: auto", verb="plan: auto would choose")
    else:
        strategies = render(
            plan,
            mark="",
            reason=f"(At the YAML's own split, for reference: the job spec says plan: {spec.plan}, so `run` "
            "re-splits the global batch as below.)",
        )
        how = f"the job spec says plan: {spec.plan}: " + (
            "the decision below" if spec.plan == "auto" else "`run` probes the best candidates first"
        )
        whole = render_training(training, verb=RUN_APPLIES)
    head, _, rest = strategies.partition("\n\n")
    inputs = f"{head}\n{planned.line()}\n{applied.deepspeed_line}"
    return f"{inputs}\n\n{rest}\n\nWhole training plan ({how})\n{whole}"

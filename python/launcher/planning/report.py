"""The plan as a text table: one row per strategy, GiB per component, fit, and the choice."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.planning.memory import GIB

if TYPE_CHECKING:
    from launcher.planning.memory import Strategy
    from launcher.planning.training import TrainingPlan

COLUMNS = ("strategy", "weights", "grads", "optim", "activ", "buffers", "runtime", "GPU", "host", "fits")


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    )


def render(
    plan: TrainingPlan, *, marked: Strategy | None = None, mark: str = " <- choice", reason: str | None = None
) -> str:
    """Return the human plan of a fixed split (:func:`launcher.planning.training_yaml.plan_as_written`):
    inputs, the per-strategy table (GiB per GPU / per host), the choice and why. ``marked``/``mark``: the row
    to mark and how (default: the plan's own choice); ``reason``: the closing paragraph (default: the
    plan's)."""
    w, c = plan.workload, plan.cluster
    head = (
        f"model {w.model.total_params() / 1e9:.2f} B params "
        f"({w.model.layers} layers, hidden {w.model.hidden}), "
        f"{w.finetuning}"
        + (f" r={w.lora_rank} on {len(w.lora_targets)} modules" if w.finetuning == "lora" else "")
        + f", {w.trainable_params / 1e6:.1f} M trainable; micro-batch {w.micro_batch}, "
        f"cutoff_len {w.cutoff_len}, "
        f"gradient checkpointing {'on' if w.gradient_checkpointing else 'off'}\n"
        f"cluster {c.nodes} node(s) x {c.gpus_per_node} GPU(s), {c.gpu_mem_gib:.1f} GiB per GPU, "
        f"{c.host_mem_gib:.0f} GiB per host; safety margin {plan.margin:.0%}"
    )
    rows = [list(COLUMNS)]
    choice = plan.choice
    for one in plan.at_split(plan.as_written):
        picked = one is choice if marked is None else one.strategy is marked
        e = one.estimate
        gib = [e.weights, e.gradients, e.optimizer, e.activations, e.buffers, e.runtime, e.gpu_total, e.host]
        fit = "yes" if one.fits else ("no (GPU)" if not one.fits_gpu else "no (host)")
        rows.append([one.strategy.label, *(f"{v / GIB:.1f}" for v in gib), fit + (mark if picked else "")])
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    table = "\n".join(_row(r, widths) for r in rows)
    return f"{head}\n\nGiB per GPU (host: per node)\n{table}\n\n{plan.reason() if reason is None else reason}"


TRAINING_COLUMNS = (
    "strategy",
    "micro-batch",
    "accumulation",
    "checkpointing",
    "liger",
    "GPU GiB",
    "host GiB",
    "tokens/s",
    "MFU",
    "fits",
)


def render_training(
    plan: TrainingPlan, limit: int | None = 20, *, mark: str = " <- choice", verb: str = "Chose"
) -> str:
    """Return the candidate table, fastest first (at most ``limit`` rows, plus the choice and the YAML split).

    Columns: strategy, micro-batch, accumulation, checkpointing, memory estimate per GPU and per host (GiB),
    predicted tokens/s of the whole job, predicted MFU, and whether it fits; then why the choice won.
    """
    choice = plan.choice
    ordered = sorted(plan.candidates, key=lambda c: -c.tokens_per_s)
    keep = ordered if limit is None else ordered[:limit]
    extra = [c for c in ordered if c not in keep and (c is choice or c.split == plan.as_written)]
    shown = [c for c in ordered if c in keep or c in extra]
    rows = [list(TRAINING_COLUMNS)]
    for c in shown:
        fit = "yes" if c.fits else ("no (GPU)" if not c.fits_gpu else "no (host)")
        marks = (mark if c is choice else "") + (" (YAML's split)" if c.split == plan.as_written else "")
        rows.append(
            [
                c.strategy.label,
                str(c.split.micro_batch),
                str(c.split.accumulation),
                "on" if c.split.checkpointing else "off",
                "on" if c.split.liger else "off",
                f"{c.estimate.gpu_total / GIB:.1f}",
                f"{c.estimate.host / GIB:.1f}",
                f"{c.tokens_per_s:,.0f}",
                f"{c.mfu:.0%}",
                fit + marks,
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(TRAINING_COLUMNS))]
    table = "\n".join(_row(r, widths) for r in rows)
    hidden = len(ordered) - len(shown)
    more = f"\n({hidden} slower candidates not shown; --json lists all)" if hidden else ""
    cl = plan.cluster
    head = (
        f"global batch {plan.global_batch} = micro-batch x accumulation x {cl.world} GPU(s) "
        f"({cl.nodes} node(s) x {cl.gpus_per_node}, {cl.gpu_mem_gib:.1f} GiB each, {plan.accelerator.name}); "
        f"cutoff_len {plan.workload.cutoff_len}; safety margin {plan.margin:.0%}"
    )
    probe = f"\n\n{render_probe(plan)}" if plan.probe is not None else ""
    return f"{head}\n\n{table}{more}{probe}\n\n{plan.reason(verb)}"


PROBE_COLUMNS = (
    "probed",
    "status",
    "predicted tokens/s",
    "measured tokens/s",
    "measured/predicted",
    "wall s",
)


def render_probe(plan: TrainingPlan) -> str:
    """Return the probe's table: each probed candidate, predicted next to measured tokens/s."""
    probe = plan.probe
    if probe is None:
        return ""
    pick = probe.pick
    rows = [list(PROBE_COLUMNS)]
    for m, t in zip(probe.measures, probe.job_tokens_per_s, strict=True):
        c = m.candidate
        rows.append(
            [
                c.describe() + (" <- pick" if c is pick else ""),
                m.status,
                f"{c.tokens_per_s:,.0f}",
                f"{t:,.0f}" if t is not None else "-",
                f"{t / c.tokens_per_s:.2f}" if t is not None else "-",
                f"{m.wall_s:.0f}" if m.wall_s is not None else "-",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(PROBE_COLUMNS))]
    return f"Probe ({probe.steps} steps each, budget {probe.budget_s:.0f} s)\n" + "\n".join(
        _row(r, widths) for r in rows
    )

"""The plan as a text table: one row per strategy, GiB per component, fit, and the choice."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.planning.memory import GIB

if TYPE_CHECKING:
    from launcher.plan import Plan

COLUMNS = ("strategy", "weights", "grads", "optim", "activ", "buffers", "runtime", "GPU", "host", "fits")


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    )


def render(plan: Plan) -> str:
    """Return the human plan: inputs, the per-strategy table (GiB per GPU / per host), the choice and why."""
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
    for e in plan.estimates:
        gib = [e.weights, e.gradients, e.optimizer, e.activations, e.buffers, e.runtime, e.gpu_total, e.host]
        fit = "yes" if plan.fits(e) else ("no (GPU)" if not plan.fits_gpu(e) else "no (host)")
        mark = " <- choice" if e.strategy is choice else ""
        rows.append([e.strategy.label, *(f"{v / GIB:.1f}" for v in gib), fit + mark])
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    table = "\n".join(_row(r, widths) for r in rows)
    return f"{head}\n\nGiB per GPU (host: per node)\n{table}\n\n{plan.reason()}"

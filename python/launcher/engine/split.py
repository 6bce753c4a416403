"""``plan: auto``: the whole training plan (strategy, micro-batch, accumulation, checkpointing) for a run.

The job spec's ``plan`` key (docs/planner.md, "Opting in"):

* ``as_written`` (the default): the training YAML runs as written; ``deepspeed: auto`` picks only a
  strategy at the YAML's own split (the fixed-split plan,
  :func:`launcher.planning.training_yaml.choose_deepspeed_config`);
* ``auto``: the planner (:func:`launcher.planning.training.plan_training`) re-splits the YAML's global batch
  (micro-batch x gradient accumulation x GPUs, kept exactly) and the engine's plan step writes its
  ``per_device_train_batch_size``, ``gradient_accumulation_steps`` and ``disable_gradient_checkpointing`` into
  the shipped training YAML; with ``deepspeed: auto`` the strategy is searched too, otherwise the pinned one
  (``none``, or the strategy a named DeepSpeed file amounts to) is kept and only the split is planned.

The shipped bytes are validated after the rewrite (:func:`launcher.engine.plan.validate_plan`), so what ships
is what was validated.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from launcher.exceptions import ConfigurationError
from launcher.planning.dsconfig import strategy_of_config
from launcher.planning.hardware import DEFAULT_GPU_MEM_GIB, MI300X, Accelerator, accelerator_named
from launcher.planning.memory import SAFETY_MARGIN, SPEED_RANK, Cluster, Strategy
from launcher.planning.model import resolve_shape
from launcher.planning.training import TrainingPlan
from launcher.planning.training_yaml import plan_training_from_yaml

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from launcher.preflight.checks import NodeFacts
    from launcher.validation.job import LoadedJob

PLAN_MODES = ("as_written", "auto", "probe")
# DeepSpeed keys that fix the batch split; a pinned DeepSpeed file must leave them "auto" (or out) under
# plan: auto, or the trainer would refuse the re-split YAML (DeepSpeed checks micro x accumulation x world).
DS_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def planned_strategies(job: LoadedJob) -> tuple[Strategy, ...]:
    """Return the strategies the plan may choose: all with ``deepspeed: auto``, else the one the job pins."""
    if job.deepspeed_from == "auto":
        return SPEED_RANK
    if job.deepspeed is None:
        return (Strategy.NONE,)
    return (strategy_of_config(dict(job.deepspeed.data)),)


def check_pinned_batch(job: LoadedJob) -> None:
    """Refuse ``plan: auto`` with a DeepSpeed file that fixes the batch split (one line at the job spec)."""
    if job.deepspeed is None:
        return
    fixed = [k for k in DS_BATCH_KEYS if k in job.deepspeed.data and job.deepspeed.data[k] != "auto"]
    if fixed:
        raise ConfigurationError.at(
            job.spec_path,
            "plan",
            f'auto, but {job.deepspeed.label} fixes {", ".join(fixed)}: set them to "auto" there or use '
            "plan: as_written",
            "plan-pinned-batch",
        )


def gpu_name(facts: NodeFacts) -> str:
    """Return the first node's GPU model as preflight found it (``mift_gpus``, else torch), or ''."""
    host = facts.master
    gpus = facts.gpus.get(host) or {}
    for key in ("product", "name", "marketing_name", "model"):
        if gpus.get(key):
            return str(gpus[key])
    devices = (facts.torch.get(host) or {}).get("devices")
    if isinstance(devices, list) and devices and isinstance(devices[0], dict):
        return str(devices[0].get("name") or "")
    return ""


def cluster_of(facts: NodeFacts) -> Cluster:
    """Return the cluster preflight found: nodes, GPUs per node, memory per GPU and per host."""
    master = facts.probe.get(facts.master) or {}
    return Cluster(
        nodes=len(facts.hosts),
        gpus_per_node=max(1, facts.nproc_per_node),
        gpu_mem_gib=facts.gpu_mem_gib(facts.master) or DEFAULT_GPU_MEM_GIB,  # mift_gpus, else torch
        host_mem_gib=float(master.get("mem_total_bytes") or 0) / 1024**3,
    )


def plan_job(
    job: LoadedJob,
    train: Mapping[str, Any],
    cluster: Cluster,
    *,
    accelerator: Accelerator = MI300X,
    model_config: str | Path | None = None,
    margin: float = SAFETY_MARGIN,
) -> TrainingPlan:
    """Plan the job's training YAML on ``cluster`` over the strategies the job allows."""
    shape = resolve_shape(model_config, dict(train))
    return plan_training_from_yaml(
        shape,
        dict(train),
        cluster,
        accelerator=accelerator,
        strategies=planned_strategies(job),
        margin=margin,
        liger=job.spec.plan_liger,
    )


def measured_links(accelerator: Accelerator, facts: NodeFacts) -> Accelerator:
    """Return ``accelerator`` with the intra-node and the inter-node bandwidth ``launcher check`` measured on
    the GPUs of exactly these nodes on this boot (its GPU record, :mod:`launcher.fabric.gpulinks`), each where
    it was measured; one note per figure says which one the plan used (measured, or the preset and why). A TCP
    (gloo) measurement is never used: it is the management path, not the GPUs' fabric."""
    from launcher.fabric import gpulinks, links  # noqa: PLC0415

    multi_node, multi_gpu = len(facts.hosts) > 1, (facts.nproc_per_node or 1) > 1
    if not multi_node and not multi_gpu:
        return accelerator
    key = links.cache_key(facts.hosts, facts.train_address, facts.probe)
    record = gpulinks.load(key) if key else None
    if record is None:
        tcp = links.load(key) if key else None
        why = (
            "launcher check measured these nodes over TCP (gloo) only: not a GPU figure"
            if tcp
            else "launcher check measured no GPU all-reduce on these nodes on this boot"
        )
        record = {}
    else:
        why = ""
    changes: dict[str, float] = {}
    for scope, wanted, figure, preset, field_name, unit in (
        (
            "intra-node",
            multi_gpu,
            gpulinks.intra_node(record),
            accelerator.intra_node_gbs,
            "intra_node_gbs",
            "",
        ),
        (
            "inter-node",
            multi_node,
            gpulinks.inter_node(record),
            accelerator.inter_node_gbs,
            "inter_node_gbs",
            " per GPU",
        ),
    ):
        if not wanted:
            continue
        if figure.gbs is not None and figure.gbs > 0:
            changes[field_name] = figure.gbs
            facts.notes.append(
                f"plan: {scope} bandwidth {figure.gbs:.2f} GB/s{unit}, measured by launcher check "
                f"({figure.how}; instead of the {accelerator.name} preset's {preset:g})"
            )
        else:
            facts.notes.append(
                f"plan: {scope} bandwidth {preset:g} GB/s{unit}, the {accelerator.name} preset's "
                f"({why or figure.how}: not measured)"
            )
    return replace(
        accelerator,
        intra_node_gbs=changes.get("intra_node_gbs", accelerator.intra_node_gbs),
        inter_node_gbs=changes.get("inter_node_gbs", accelerator.inter_node_gbs),
    )


def auto_plan(job: LoadedJob, train: Mapping[str, Any], facts: NodeFacts) -> TrainingPlan:
    """Return the training plan a ``plan: auto`` run applies; nothing fitting is one line at ``plan``."""
    check_pinned_batch(job)
    accelerator = measured_links(accelerator_named(gpu_name(facts), default=MI300X), facts)
    plan = plan_job(
        job, train, cluster_of(facts), accelerator=accelerator, model_config=job.spec.plan_model_config
    )
    if plan.choice is None:
        raise ConfigurationError.at(job.spec_path, "plan", f"auto: {plan.reason()}", "plan-nothing-fits")
    return plan


def record_of(plan: TrainingPlan | None) -> dict[str, Any]:
    """Return what the run record keeps of the plan (``plan`` in record.json)."""
    if plan is None:
        return {"mode": "as_written"}
    choice = plan.choice
    assert choice is not None  # auto_plan refuses a plan without a choice
    return {
        "mode": "probe" if plan.probe is not None else "auto",
        "global_batch": plan.global_batch,
        "margin": plan.margin,
        "choice": choice.as_json(),
        "as_written": plan.yaml_best.as_json() if plan.yaml_best else None,
        "yaml_overrides": plan.yaml_overrides(),
        "predicted_gain": round(plan.gain, 3) if plan.gain else None,
        "accelerator": plan.accelerator.name,
        "reason": plan.reason(),
        "probe": plan.probe.as_json() if plan.probe else None,
    }


def summary_line(plan: TrainingPlan) -> str:
    """Return the one line ``run`` prints about the applied plan."""
    choice = plan.choice
    assert choice is not None
    gain = f", predicted {plan.gain:.2f}x the YAML's split" if plan.gain else ""
    mode = "auto"
    if plan.probe is not None:
        rate = plan.probe.pick_tokens_per_s
        mode = (
            f"probe ({rate:,.0f} tokens/s measured)" if rate else "probe (nothing measured: model's choice)"
        )
    return (
        f"plan: {mode}: {choice.describe()} (global batch {plan.global_batch}; "
        f"{choice.tokens_per_s:,.0f} tokens/s predicted on {plan.accelerator.name}{gain})"
    )

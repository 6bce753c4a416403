"""The training YAML's side of the plan: the workload it asks for, the plan as written, the DeepSpeed config
chosen for it, and the config written for an automatic plan."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from launcher.exceptions import ConfigurationError
from launcher.planning.dsconfig import deepspeed_config
from launcher.planning.hardware import MI300X, Accelerator
from launcher.planning.memory import (
    SAFETY_MARGIN,
    SPEED_RANK,
    Cluster,
    Strategy,
    Workload,
)
from launcher.planning.model import LINEAR_MODULES, ModelShape, resolve_shape
from launcher.planning.training import ATTENTION, TrainingPlan, plan_training

if TYPE_CHECKING:
    from pathlib import Path


# LLaMA-Factory's flash_attn values (0.9.5: auto, disabled, sdpa, fa2, fa3) -> the attention the memory model
# knows. "auto" leaves transformers' default, sdpa (LLaMA-Factory model_utils/attention.py).


def positive_int(train: dict[str, Any], key: str, default: int) -> int:
    value = train.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigurationError(f"{key}: expected a positive integer, got {value!r}")
    return value


def lora_targets(value: object) -> tuple[str, ...]:
    if value is None or value == "all":
        return LINEAR_MODULES
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise ConfigurationError(f"lora_target: expected 'all' or module names, got {value!r}")
    return tuple(n.strip() for n in names if n.strip())


def base_workload(shape: ModelShape, train: dict[str, Any]) -> Workload:
    """Return the memory-relevant keys of a LLaMA-Factory training YAML as a workload.

    Defaults (LLaMA-Factory's): ``finetuning_type`` lora, ``lora_rank`` 8, ``lora_target`` all,
    ``per_device_train_batch_size`` 8, ``cutoff_len`` 2048, gradient checkpointing on; attention and dropout
    keep the workload's defaults.
    """
    finetuning = str(train.get("finetuning_type", "lora"))
    if finetuning not in ("lora", "full", "freeze"):
        raise ConfigurationError(f"finetuning_type: {finetuning!r}: the planner knows lora, full and freeze")
    rank, targets = positive_int(train, "lora_rank", 8), lora_targets(train.get("lora_target", "all"))
    if finetuning == "lora":
        shape.lora_params(rank, targets)  # raises on a module name the model does not have
    return Workload(
        model=shape,
        finetuning="lora" if finetuning == "lora" else "full",
        lora_rank=rank,
        lora_targets=targets,
        micro_batch=positive_int(train, "per_device_train_batch_size", 8),  # HF TrainingArguments default
        cutoff_len=positive_int(train, "cutoff_len", 2048),  # LLaMA-Factory default
        gradient_checkpointing=not bool(train.get("disable_gradient_checkpointing", False)),
        liger=bool(train.get("enable_liger_kernel", False)),
    )


def read_training_yaml(shape: ModelShape, train: dict[str, Any]) -> tuple[Workload, int]:
    """Return the workload and gradient accumulation a LLaMA-Factory training YAML asks for (its defaults).

    Defaults: those of :func:`base_workload`, ``lora_dropout`` 0, ``gradient_accumulation_steps`` 1
    (transformers' TrainingArguments), ``flash_attn`` auto (sdpa).
    """
    workload = base_workload(shape, train)
    attention = ATTENTION.get(str(train.get("flash_attn", "auto")))
    if attention is None:
        raise ConfigurationError(
            f"flash_attn: {train.get('flash_attn')!r}: expected one of {', '.join(sorted(ATTENTION))}"
        )
    dropout = train.get("lora_dropout", 0.0)
    if not isinstance(dropout, int | float) or isinstance(dropout, bool) or not 0 <= dropout < 1:
        raise ConfigurationError(f"lora_dropout: expected a number in [0, 1), got {dropout!r}")
    workload = replace(workload, attention=attention, lora_dropout=float(dropout))
    return workload, positive_int(train, "gradient_accumulation_steps", 1)


def plan_training_from_yaml(
    shape: ModelShape,
    train: dict[str, Any],
    cluster: Cluster,
    *,
    accelerator: Accelerator = MI300X,
    global_batch: int | None = None,
    strategies: tuple[Strategy, ...] = SPEED_RANK,
    margin: float = SAFETY_MARGIN,
    liger: bool = False,
) -> TrainingPlan:
    """Read the training YAML and plan it (see :func:`plan_training`)."""
    workload, accumulation = read_training_yaml(shape, train)
    return plan_training(
        workload,
        cluster,
        accumulation=accumulation,
        global_batch=global_batch,
        accelerator=accelerator,
        strategies=strategies,
        margin=margin,
        liger=liger,
    )


def _written_accumulation(train: dict[str, Any]) -> int:
    """Return the YAML's gradient accumulation for the fixed split (1 when missing or not a positive int).

    Only the predicted speed reads it; the strategy choice does not, so a value the validator or the trainer
    refuses does not stop the choice.
    """
    value = train.get("gradient_accumulation_steps", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def plan_as_written(
    shape: ModelShape,
    train: dict[str, Any],
    cluster: Cluster,
    *,
    accelerator: Accelerator = MI300X,
    margin: float = SAFETY_MARGIN,
) -> TrainingPlan:
    """Plan the training YAML's own split under each strategy (``plan: as_written``; ``deepspeed: auto``).

    The workload is the YAML's memory keys (:func:`base_workload`; ``flash_attn`` and ``lora_dropout`` are
    not read at the fixed split); the choice is the first strategy in :data:`SPEED_RANK` that fits.
    """
    return plan_training(
        base_workload(shape, train),
        cluster,
        accumulation=_written_accumulation(train),
        accelerator=accelerator,
        margin=margin,
        fixed_split=True,
    )


def choose_deepspeed_config(  # noqa: PLR0917 - the positional signature agreed with the job engine
    model_dir_or_config: str | Path | None,
    train_yaml_dict: dict[str, Any],
    gpus_per_node: int,
    nodes: int,
    gpu_mem_gib: float,
    host_mem_gib: float,
) -> tuple[str, dict[str, Any]]:
    """Return ``(strategy name, DeepSpeed config)`` of the fastest strategy that fits at the YAML's split.

    The config is {} for ``none`` (no DeepSpeed: no ``deepspeed:`` key in the training YAML).
    ``model_dir_or_config``: see :func:`launcher.planning.model.resolve_shape`; ``host_mem_gib <= 0`` means
    unknown (not checked). Raises ConfigurationError when no strategy fits.
    """
    cluster = Cluster(nodes, gpus_per_node, gpu_mem_gib, host_mem_gib)
    plan = plan_as_written(resolve_shape(model_dir_or_config, train_yaml_dict), train_yaml_dict, cluster)
    choice = plan.choice
    if choice is None:
        raise ConfigurationError(f"deepspeed: auto: {plan.reason()}")
    return choice.strategy.value, deepspeed_config(choice.strategy) or {}


def write_auto_config(plan: TrainingPlan, run_dir: Path) -> Path | None:
    """Write ``plan.json`` and, unless the choice is ``none``, ``deepspeed_auto.json`` into ``run_dir``.

    Returns the DeepSpeed JSON's path (None for ``none``); raises ConfigurationError when nothing fits.
    """
    (run_dir / "plan.json").write_text(json.dumps(plan.as_json(), indent=2) + "\n")
    if plan.choice is None:
        raise ConfigurationError(f"deepspeed: auto: {plan.reason()}")
    config = plan.deepspeed_config()
    if config is None:
        return None
    path = run_dir / "deepspeed_auto.json"
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path

"""Pick the fastest training strategy whose memory fits, and explain the choice.

Public API (used by ``python -m launcher plan`` and by the job engine for ``deepspeed: auto``)::

    choose_deepspeed_config(model_dir_or_config, train_yaml_dict, gpus_per_node, nodes,
                            gpu_mem_gib, host_mem_gib) -> tuple[str, dict]

returns the chosen strategy's name (``none``, ``zero2``, ``zero3``, ``zero3_offload_opt``,
``zero3_offload_all``) and its DeepSpeed config; the dict is empty for ``none`` (run without DeepSpeed: no
``deepspeed:`` key in the training YAML). ``model_dir_or_config`` is a model folder or ``config.json`` on this
machine, a name/node path matching a bundled public config (such as ``.../Meta-Llama-3-70B``), or None to use
the training YAML's ``model_name_or_path`` the same way. ``host_mem_gib <= 0`` means unknown (not checked).
Raises :class:`~launcher.exceptions.ConfigurationError` when no strategy fits.
:func:`write_auto_config` does the same and writes ``deepspeed_auto.json`` and ``plan.json`` into a run
directory.

The memory model is in :mod:`launcher.planning.memory`; its constants are calibrated against the H200
measurements in ``docs/gpu-results.md`` and documented there and in ``docs/planner.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.exceptions import ConfigurationError
from launcher.planning.dsconfig import deepspeed_config
from launcher.planning.memory import (
    GIB,
    SAFETY_MARGIN,
    SPEED_RANK,
    Cluster,
    Estimate,
    Strategy,
    Workload,
    estimate,
)
from launcher.planning.model import ModelShape, bundled_config_for, load_shape
from launcher.planning.training import base_workload


@dataclass(frozen=True)
class Plan:
    """Every strategy's estimate, which fit, and the choice (None when nothing fits)."""

    workload: Workload
    cluster: Cluster
    estimates: tuple[Estimate, ...]
    margin: float

    def fits_gpu(self, e: Estimate) -> bool:
        """Return True when the GPU estimate plus margin is within one GPU's memory."""
        return e.gpu_total * (1 + self.margin) <= self.cluster.gpu_mem_gib * GIB

    def fits_host(self, e: Estimate) -> bool:
        """Return True when the host estimate plus margin fits one host's memory (0: unknown, unchecked)."""
        if self.cluster.host_mem_gib <= 0:
            return True
        return e.host * (1 + self.margin) <= self.cluster.host_mem_gib * GIB

    def fits(self, e: Estimate) -> bool:
        """Return True when both GPU and host estimates fit."""
        return self.fits_gpu(e) and self.fits_host(e)

    @property
    def choice(self) -> Strategy | None:
        """Return the fastest strategy that fits (order: :data:`SPEED_RANK`)."""
        for e in self.estimates:
            if self.fits(e):
                return e.strategy
        return None

    def reason(self) -> str:
        """Return one paragraph saying why the choice was made."""
        choice = self.choice
        skipped = []
        for e in self.estimates:
            if e.strategy is choice:
                break
            where = "GPU" if not self.fits_gpu(e) else "host"
            need = e.gpu_total if where == "GPU" else e.host
            cap = self.cluster.gpu_mem_gib if where == "GPU" else self.cluster.host_mem_gib
            skipped.append(
                f"{e.strategy.label} needs {need / GIB:.1f} GiB per {where} (+{self.margin:.0%} margin) "
                f"> {cap:.1f} GiB"
            )
        lead = "; ".join(skipped) + ". " if skipped else ""
        if self.cluster.host_mem_gib <= 0:
            lead += "Host RAM unknown: host memory not checked. "
        if choice is None:
            return lead + "Nothing fits: add GPUs or nodes, lower micro-batch or cutoff_len, or use LoRA."
        faster = "it is the fastest strategy" if not skipped else "it is the fastest of those that fit"
        return (
            f"{lead}Chose {choice.label}: {faster} (speed order {' > '.join(s.value for s in SPEED_RANK)})."
        )

    def as_json(self) -> dict[str, Any]:
        """Return the machine-readable plan (``--json``)."""
        strategies = [
            {
                "name": e.strategy.value,
                "gpu_mem_gib": round(e.gpu_total / GIB, 2),
                "host_mem_gib": round(e.host / GIB, 2),
                "fits": self.fits(e),
                "model_states_gib": round(e.model_states / GIB, 2),
                "components_gib": {
                    k: round(getattr(e, k) / GIB, 2)
                    for k in ("weights", "gradients", "optimizer", "activations", "buffers", "runtime")
                },
            }
            for e in self.estimates
        ]
        choice = self.choice
        return {
            "strategies": strategies,
            "choice": choice.value if choice else None,
            "reason": self.reason(),
            "inputs": {
                "total_params": self.workload.model.total_params(),
                "trainable_params": self.workload.trainable_params,
                "finetuning": self.workload.finetuning,
                "micro_batch": self.workload.micro_batch,
                "cutoff_len": self.workload.cutoff_len,
                "gradient_checkpointing": self.workload.gradient_checkpointing,
                "nodes": self.cluster.nodes,
                "gpus_per_node": self.cluster.gpus_per_node,
                "gpu_mem_gib": self.cluster.gpu_mem_gib,
                "host_mem_gib": self.cluster.host_mem_gib,
                "margin": self.margin,
            },
        }


def make_plan(workload: Workload, cluster: Cluster, margin: float = SAFETY_MARGIN) -> Plan:
    """Estimate every strategy, fastest first."""
    return Plan(workload, cluster, tuple(estimate(workload, s, cluster) for s in SPEED_RANK), margin)


def workload_from_train(shape: ModelShape, train: dict[str, Any]) -> Workload:
    """Read the memory-relevant keys of a LLaMA-Factory training YAML (with LLaMA-Factory's defaults)."""
    return base_workload(shape, train)


def resolve_shape(model_dir_or_config: str | Path | None, train: dict[str, Any]) -> ModelShape:
    """Find the model's config.json: the given path, ``model_name_or_path`` if local, or a bundled config."""
    name = str(model_dir_or_config or train.get("model_name_or_path") or "")
    if name and Path(name).exists():
        return load_shape(Path(name))
    bundled = bundled_config_for(name)  # a node path or hub name not present here, e.g. .../Meta-Llama-3-70B
    if bundled is not None:
        return load_shape(bundled)
    raise ConfigurationError(
        f"model_name_or_path: {name or '(missing)'}: no config.json on this machine; pass --model-config "
        "(launcher plan) or set plan_model_config in the job spec"
    )


def choose_deepspeed_config(  # noqa: PLR0917 - the positional signature agreed with the job engine
    model_dir_or_config: str | Path | None,
    train_yaml_dict: dict[str, Any],
    gpus_per_node: int,
    nodes: int,
    gpu_mem_gib: float,
    host_mem_gib: float,
) -> tuple[str, dict[str, Any]]:
    """Return ``(strategy name, DeepSpeed config)`` of the fastest strategy that fits ({} for ``none``)."""
    plan = plan_for(
        model_dir_or_config, train_yaml_dict, Cluster(nodes, gpus_per_node, gpu_mem_gib, host_mem_gib)
    )
    choice = plan.choice
    if choice is None:
        raise ConfigurationError(f"deepspeed: auto: {plan.reason()}")
    return choice.value, deepspeed_config(choice) or {}


def plan_for(model_dir_or_config: str | Path | None, train: dict[str, Any], cluster: Cluster) -> Plan:
    """Build the plan of a training YAML on a cluster."""
    return make_plan(workload_from_train(resolve_shape(model_dir_or_config, train), train), cluster)


def write_auto_config(plan: Plan, run_dir: Path) -> Path | None:
    """Write ``plan.json`` and, unless the choice is ``none``, ``deepspeed_auto.json`` into ``run_dir``.

    Returns the DeepSpeed JSON's path (None for ``none``); raises ConfigurationError when nothing fits.
    """
    choice = plan.choice
    (run_dir / "plan.json").write_text(json.dumps(plan.as_json(), indent=2) + "\n")
    if choice is None:
        raise ConfigurationError(f"deepspeed: auto: {plan.reason()}")
    config = deepspeed_config(choice)
    if config is None:
        return None
    path = run_dir / "deepspeed_auto.json"
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path

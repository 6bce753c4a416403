"""The DeepSpeed JSON of each strategy (LLaMA-Factory's bundled configs, with keys DeepSpeed 0.19 accepts).

``"auto"`` values are filled by the Hugging Face integration from the training arguments; every
``zero_optimization`` key here is a real DeepSpeed key (DeepSpeed rejects unknown ones).
"""

from __future__ import annotations

from typing import Any

from launcher.planning.memory import (
    Z2_ALLGATHER_BUCKET,
    Z3_MAX_LIVE_PARAMETERS,
    Z3_MAX_REUSE_DISTANCE,
    Strategy,
)


def _base() -> dict[str, Any]:
    return {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": "auto"},
    }


def deepspeed_config(strategy: Strategy) -> dict[str, Any] | None:
    """Return the DeepSpeed config of ``strategy``, or None for plain DDP (no DeepSpeed)."""
    if strategy is Strategy.NONE:
        return None
    config = _base()
    if strategy is Strategy.ZERO2:
        config["zero_optimization"] = {
            "stage": 2,
            "allgather_partitions": True,
            "allgather_bucket_size": Z2_ALLGATHER_BUCKET,
            "overlap_comm": False,
            "reduce_scatter": True,
            "reduce_bucket_size": "auto",
            "contiguous_gradients": True,
            "round_robin_gradients": True,
        }
        return config
    zero: dict[str, Any] = {
        "stage": 3,
        "overlap_comm": False,
        "contiguous_gradients": True,
        "sub_group_size": 1_000_000_000,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": Z3_MAX_LIVE_PARAMETERS,
        "stage3_max_reuse_distance": Z3_MAX_REUSE_DISTANCE,
        "stage3_gather_16bit_weights_on_model_save": True,
    }
    if strategy.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if strategy.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config["zero_optimization"] = zero
    return config


def strategy_of_config(config: dict[str, Any] | None) -> Strategy:
    """Return the planner strategy a DeepSpeed JSON amounts to (for planning the split of a pinned config).

    No config, or ZeRO stage 0/1, is planned as ``none`` (DeepSpeed without sharded gradients holds what DDP
    holds); stage 2 as ``zero2``; stage 3 as ``zero3`` with its ``offload_optimizer`` / ``offload_param`` to
    ``cpu`` (NVMe offload is planned as CPU offload).
    """
    zero = (config or {}).get("zero_optimization") or {}
    stage = int(zero.get("stage", 0) or 0)
    if stage < 2:
        return Strategy.NONE
    if stage == 2:
        return Strategy.ZERO2

    def offloaded(key: str) -> bool:
        return str((zero.get(key) or {}).get("device", "none")) in ("cpu", "nvme")

    if offloaded("offload_param"):
        return Strategy.ZERO3_OFFLOAD_ALL
    return Strategy.ZERO3_OFFLOAD_OPT if offloaded("offload_optimizer") else Strategy.ZERO3

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

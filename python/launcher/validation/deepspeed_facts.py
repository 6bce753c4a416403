"""What the cross-field rules know about a DeepSpeed config: its ZeRO stage, offload devices and precision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping


@dataclass(frozen=True)
class DeepSpeedFacts:
    """What the cross-field rules need to know about a DeepSpeed config.

    Attributes:
        stage: ZeRO stage (0 when there is no ``zero_optimization``).
        offload_param: Device of ``offload_param`` (``cpu``, ``nvme``) or None.
        offload_optimizer: Device of ``offload_optimizer`` or None.
        fp16: ``fp16.enabled`` as written (True, False, "auto") or None.
        bf16: ``bf16.enabled`` as written or None.
        values: The raw top-level dict (batch sizes, clipping).
    """

    stage: int
    offload_param: str | None
    offload_optimizer: str | None
    fp16: object
    bf16: object
    values: Mapping[str, Any]

    @property
    def summary(self) -> str:
        """Return ``ZeRO-3 + offload`` style text for the ok line."""
        text = f"ZeRO-{self.stage}"
        if self.offload_param or self.offload_optimizer:
            text += " + offload"
        return text


def _offload_device(zero: Mapping[str, Any], key: str) -> str | None:
    block = zero.get(key)
    if isinstance(block, dict):
        device = block.get("device", "none")
        return str(device) if device not in (None, "none") else None
    return None


def _enabled(block: object) -> object:
    return block.get("enabled") if isinstance(block, dict) else None


def deepspeed_facts(config: Mapping[str, Any]) -> DeepSpeedFacts:
    """Extract the facts the rules use from a parsed DeepSpeed config (no validation)."""
    zero = config.get("zero_optimization")
    zero = zero if isinstance(zero, dict) else {}
    stage = zero.get("stage", 0)
    return DeepSpeedFacts(
        stage=int(stage) if isinstance(stage, int | float) and not isinstance(stage, bool) else 0,
        offload_param=_offload_device(zero, "offload_param"),
        offload_optimizer=_offload_device(zero, "offload_optimizer"),
        fp16=_enabled(config.get("fp16")),
        bf16=_enabled(config.get("bf16", config.get("bfloat16"))),
        values=config,
    )

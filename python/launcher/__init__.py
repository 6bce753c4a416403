"""Launch and follow multi-node LLaMA-Factory + DeepSpeed jobs on provisioned MI300X nodes."""

from __future__ import annotations

__version__ = "0.1.0"

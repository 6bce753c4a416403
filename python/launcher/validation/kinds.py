"""Tell what a config file is from its extension and top-level keys."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.validation.problems import ConfigKind

if TYPE_CHECKING:
    from pathlib import Path

DEEPSPEED_MARKERS = frozenset(
    {
        "zero_optimization",
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "zero_allow_untested_optimizer",
        "fp16",
        "bf16",
        "optimizer",
        "scheduler",
    }
)
LLAMAFACTORY_MARKERS = frozenset({"stage", "model_name_or_path", "finetuning_type"})
JOBSPEC_MARKERS = frozenset({"train_config"})
ACCELERATE_MARKERS = frozenset({"compute_environment", "distributed_type"})
YAML_SUFFIXES = (".yaml", ".yml")
CONFIG_SUFFIXES = (".json", *YAML_SUFFIXES)


def detect_kind(path: Path, data: object) -> ConfigKind:
    """Return the kind of a parsed config file.

    JSON with DeepSpeed keys is a DeepSpeed config; YAML (or JSON) with ``stage``/``model_name_or_path``/
    ``finetuning_type`` is a LLaMA-Factory config; YAML with ``train_config`` is a job spec; YAML with
    ``compute_environment``/``distributed_type`` is an accelerate config.
    """
    if not isinstance(data, dict):
        return ConfigKind.UNKNOWN
    keys = set(data)
    # first: a job spec's ``stage`` (the folders it stages) is also LLaMA-Factory's marker, and no
    # LLaMA-Factory config has ``train_config``
    if keys & JOBSPEC_MARKERS and path.suffix.lower() != ".json":
        return ConfigKind.JOBSPEC
    if keys & LLAMAFACTORY_MARKERS:
        return ConfigKind.LLAMAFACTORY
    if path.suffix.lower() == ".json":
        return ConfigKind.DEEPSPEED if keys & DEEPSPEED_MARKERS else ConfigKind.UNKNOWN
    if keys & ACCELERATE_MARKERS:
        return ConfigKind.ACCELERATE
    return ConfigKind.UNKNOWN

"""The accepted keys of a DeepSpeed JSON: live from DeepSpeed's pydantic models, or the shipped list.

DeepSpeed checks only its pydantic sections (``zero_optimization``, ``offload_*``, ``fp16``, ``bf16``,
...) and silently ignores unknown top-level keys. The top-level list here is recorded by running
DeepSpeed's own config parser over a dict that notes every key looked up, so it follows the installed
version.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from launcher.validation.quiet import quiet_import
from launcher.validation.schema import FieldSpec, spec_from_annotation

DATA_FILE = "deepspeed_keys.json"

# Keys seen in published configs (LLaMA-Factory's ds_z3_fp8_config.json) that DeepSpeed ignores:
# accepted with a warning naming the key DeepSpeed does read.
IGNORED_TOP_LEVEL = {
    "comms_config": "not read by DeepSpeed (ignored); the comms logger is configured by 'comms_logger'",
    "monitor_config": "not read by DeepSpeed (ignored); monitors are 'tensorboard', 'wandb', 'csv_monitor'",
}


@dataclass
class SectionSpec:
    """The keys of one strict (pydantic) section.

    Attributes:
        fields: Accepted key (field name or alias) to its value spec.
        deprecated: Deprecated key to the message shown for it.
        nested: Keys whose value is itself a strict section.
    """

    fields: dict[str, FieldSpec] = field(default_factory=dict)
    deprecated: dict[str, str] = field(default_factory=dict)
    nested: dict[str, SectionSpec] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Return the stored form."""
        return {
            "fields": {k: v.to_json() for k, v in sorted(self.fields.items())},
            "deprecated": dict(sorted(self.deprecated.items())),
            "nested": {k: v.to_json() for k, v in sorted(self.nested.items())},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SectionSpec:
        """Build from the stored form."""
        return cls(
            {k: FieldSpec.from_json(v) for k, v in data["fields"].items()},
            dict(data["deprecated"]),
            {k: cls.from_json(v) for k, v in data["nested"].items()},
        )


@dataclass
class DeepSpeedSchema:
    """Everything the DeepSpeed check needs to know about one DeepSpeed version."""

    version: str
    top_level: frozenset[str]
    sections: dict[str, SectionSpec]
    removed_top_level: dict[str, str] = field(default_factory=dict)
    removed_zero: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Return the stored form."""
        return {
            "deepspeed_version": self.version,
            "top_level": sorted(self.top_level),
            "sections": {k: v.to_json() for k, v in sorted(self.sections.items())},
            "removed_top_level": dict(sorted(self.removed_top_level.items())),
            "removed_zero": dict(sorted(self.removed_zero.items())),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeepSpeedSchema:
        """Build from the stored form."""
        return cls(
            data["deepspeed_version"],
            frozenset(data["top_level"]),
            {k: SectionSpec.from_json(v) for k, v in data["sections"].items()},
            dict(data["removed_top_level"]),
            dict(data["removed_zero"]),
        )


def _strict_sections() -> dict[str, Any]:
    """Return top-level key -> DeepSpeed pydantic model class for every strict section."""
    from deepspeed.comm.config import CommsLoggerConfig  # noqa: PLC0415 - heavy, imported on demand
    from deepspeed.compile.config import CompileConfig  # noqa: PLC0415
    from deepspeed.monitor.config import CometConfig, CSVConfig, TensorBoardConfig, WandbConfig  # noqa: PLC0415
    from deepspeed.runtime.config import HybridEngineConfig  # noqa: PLC0415
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config  # noqa: PLC0415
    from deepspeed.runtime.tensor_parallel.config import TPTrainingConfig  # noqa: PLC0415
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig  # noqa: PLC0415

    return {
        "zero_optimization": DeepSpeedZeroConfig,
        "fp16": DeepSpeedFP16Config,
        "bf16": DeepSpeedBF16Config,
        "bfloat16": DeepSpeedBF16Config,
        "tensorboard": TensorBoardConfig,
        "wandb": WandbConfig,
        "csv_monitor": CSVConfig,
        "comet": CometConfig,
        "comms_logger": CommsLoggerConfig,
        "compile": CompileConfig,
        "hybrid_engine": HybridEngineConfig,
        "tensor_parallel": TPTrainingConfig,
    }


def _model_section(model: Any) -> SectionSpec:  # noqa: ANN401 - a pydantic model class
    from pydantic import BaseModel  # noqa: PLC0415

    section = SectionSpec()
    for name, info in model.model_fields.items():
        annotation = info.annotation
        inner = [a for a in (getattr(annotation, "__args__", None) or (annotation,)) if a is not type(None)]
        spec = spec_from_annotation(annotation)
        nested = None
        if len(inner) == 1 and isinstance(inner[0], type) and issubclass(inner[0], BaseModel):
            nested = _model_section(inner[0])
            spec = FieldSpec(frozenset({"dict", "null"}))
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        for key in {name, info.alias or name}:
            section.fields[key] = spec
            if nested is not None:
                section.nested[key] = nested
            if extra.get("deprecated"):
                new = extra.get("new_param")
                section.deprecated[key] = f"deprecated; use {new!r}" if new else "deprecated"
    return section


class _Recorder(dict[str, Any]):
    """A dict that notes every key looked up in it (to list the top-level keys DeepSpeed reads)."""

    seen: set[str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401
        super().__init__(*args, **kwargs)
        self.seen = set()

    def get(self, key: str, default: Any = None) -> Any:  # noqa: ANN401
        self.seen.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.seen.add(str(key))
        return super().__contains__(key)

    def __getitem__(self, key: str) -> Any:  # noqa: ANN401
        self.seen.add(key)
        return super().__getitem__(key)

    def keys(self) -> Any:  # noqa: ANN401
        recorder = self

        class _Keys:
            def __contains__(self, key: object) -> bool:
                return recorder.__contains__(key)

            def __iter__(self) -> Any:  # noqa: ANN401
                return iter(dict.keys(recorder))

        return _Keys()

    def __copy__(self) -> _Recorder:
        # DeepSpeedConfig copies its input; the copy must keep recording into the same set.
        clone = _Recorder(self)
        clone.seen = self.seen
        return clone


@functools.cache
def live_schema() -> DeepSpeedSchema:
    """Return the schema of the installed DeepSpeed (derived once per version, then from the cache)."""
    from launcher.validation.cache import cached  # noqa: PLC0415

    return cached(
        "deepspeed-schema",
        None,
        _derive_schema,
        encode=DeepSpeedSchema.to_json,
        decode=DeepSpeedSchema.from_json,
    )


def _derive_schema() -> DeepSpeedSchema:
    """Derive the schema from the installed DeepSpeed (imports it: ~3 s)."""
    with quiet_import():
        import deepspeed.runtime.config as ds_config  # noqa: PLC0415

        import deepspeed  # noqa: PLC0415

        sections = {key: _model_section(model) for key, model in _strict_sections().items()}
        recorder = _Recorder({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1})
        ds_config.DeepSpeedConfig(recorder)
    top = set(recorder.seen) | set(sections)
    return DeepSpeedSchema(
        version=str(deepspeed.__version__),
        top_level=frozenset(top),
        sections=sections,
        removed_top_level=dict(getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {})),
        removed_zero=dict(getattr(ds_config, "_REMOVED_ZERO_CONFIG_KEYS", {})),
    )


@functools.cache
def shipped_schema() -> DeepSpeedSchema:
    """Read the schema shipped with the launcher (``launcher/data/deepspeed_keys.json``)."""
    text = resources.files("launcher").joinpath("data", DATA_FILE).read_text(encoding="utf-8")
    return DeepSpeedSchema.from_json(json.loads(text))

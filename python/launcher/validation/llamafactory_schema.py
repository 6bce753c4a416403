"""The accepted keys of a LLaMA-Factory training YAML: live from its dataclasses, or the shipped list.

LLaMA-Factory parses a training YAML with ``HfArgumentParser.parse_dict(allow_extra_keys=False)`` over
``ModelArguments, DataArguments, TrainingArguments, FinetuningArguments, GeneratingArguments``; the
accepted keys are the ``init`` fields of those dataclasses. ``parse_dict`` does not convert values, so
the types here are checked as the YAML gives them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from dataclasses import dataclass
from importlib import resources
from typing import Any

from launcher.validation.quiet import quiet_import
from launcher.validation.schema import ANY, FieldSpec, spec_from_annotation

DATA_FILE = "llamafactory_keys.json"
TRAIN_CLASSES = (
    "ModelArguments",
    "DataArguments",
    "TrainingArguments",
    "FinetuningArguments",
    "GeneratingArguments",
)
# Classes whose __post_init__ is cheap and free of side effects (TrainingArguments' sets up devices
# and reads the DeepSpeed file, so it is checked by key and type only).
LIGHT_CLASSES = ("ModelArguments", "DataArguments", "FinetuningArguments", "GeneratingArguments")


@dataclass(frozen=True)
class LlamaFactorySchema:
    """Accepted keys of one LLaMA-Factory version.

    Attributes:
        version: LLaMA-Factory version the keys come from.
        transformers_version: transformers version (TrainingArguments' fields come from it).
        fields: Key to (dataclass name, value spec).
    """

    version: str
    transformers_version: str
    fields: dict[str, tuple[str, FieldSpec]]

    def to_json(self) -> dict[str, Any]:
        """Return the stored form."""
        return {
            "llamafactory_version": self.version,
            "transformers_version": self.transformers_version,
            "fields": {k: {"group": g, **s.to_json()} for k, (g, s) in sorted(self.fields.items())},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LlamaFactorySchema:
        """Build from the stored form."""
        fields = {k: (v["group"], FieldSpec.from_json(v)) for k, v in data["fields"].items()}
        return cls(data["llamafactory_version"], data["transformers_version"], fields)


def train_classes() -> dict[str, type]:
    """Import LLaMA-Factory's argument dataclasses (slow: ~5 s, pulls in torch and transformers)."""
    with quiet_import():
        from llamafactory import hparams  # noqa: PLC0415 - heavy, imported only for LLaMA-Factory files
    return {name: getattr(hparams, name) for name in TRAIN_CLASSES}


def _class_fields(cls: type) -> dict[str, FieldSpec]:
    try:
        hints = typing.get_type_hints(cls)
    except Exception:
        hints = {}
    return {
        f.name: spec_from_annotation(hints[f.name]) if f.name in hints else ANY
        for f in dataclasses.fields(cls)
        if f.init
    }


@functools.cache
def live_schema() -> LlamaFactorySchema:
    """Return the schema of the installed LLaMA-Factory (derived once per version, then from the cache)."""
    from launcher.validation.cache import cached  # noqa: PLC0415

    return cached(
        "llamafactory-schema",
        None,
        _derive_schema,
        encode=LlamaFactorySchema.to_json,
        decode=LlamaFactorySchema.from_json,
    )


def _derive_schema() -> LlamaFactorySchema:
    """Derive the schema from the installed LLaMA-Factory and transformers."""
    classes = train_classes()
    import transformers  # noqa: PLC0415

    import llamafactory  # noqa: PLC0415

    fields: dict[str, tuple[str, FieldSpec]] = {}
    for name, cls in classes.items():
        for key, spec in _class_fields(cls).items():
            fields.setdefault(key, (name, spec))
    return LlamaFactorySchema(str(llamafactory.__version__), str(transformers.__version__), fields)


@functools.cache
def shipped_schema() -> LlamaFactorySchema:
    """Read the schema shipped with the launcher (``launcher/data/llamafactory_keys.json``)."""
    text = resources.files("launcher").joinpath("data", DATA_FILE).read_text(encoding="utf-8")
    return LlamaFactorySchema.from_json(json.loads(text))

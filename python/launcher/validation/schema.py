"""A small, JSON-serialisable description of a config field, and the value check built on it.

The same :class:`FieldSpec` is derived live from LLaMA-Factory's dataclasses (or DeepSpeed's pydantic
models) when they are importable, and read from the shipped key files otherwise, so both paths apply
the same checks.
"""

from __future__ import annotations

import enum
import types
import typing
from dataclasses import dataclass
from typing import Any

from launcher.validation.suggest import nearest

TYPE_NAMES = ("bool", "int", "float", "str", "dict", "list", "null", "any")


@dataclass(frozen=True)
class FieldSpec:
    """The accepted values of one key.

    Attributes:
        types: Accepted value types, names from :data:`TYPE_NAMES`.
        choices: When set, the only accepted values (from a ``Literal`` or an ``Enum``).
    """

    types: frozenset[str]
    choices: tuple[Any, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the form stored in the shipped key files."""
        out: dict[str, Any] = {"types": sorted(self.types)}
        if self.choices is not None:
            out["choices"] = list(self.choices)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FieldSpec:
        """Build from the form stored in the shipped key files."""
        choices = data.get("choices")
        return cls(frozenset(data["types"]), tuple(choices) if choices is not None else None)


ANY = FieldSpec(frozenset({"any"}))


def _merge(specs: list[FieldSpec]) -> FieldSpec:
    # ``SomeEnum | str`` means "a SomeEnum value, given as a string" (transformers converts in
    # __post_init__), so a plain ``str`` does not widen the choices of an enum or Literal.
    with_choices = [s for s in specs if s.choices is not None]
    kinds: set[str] = set()
    for spec in specs:
        if with_choices and spec.choices is None and spec.types == {"str"}:
            continue
        kinds |= spec.types
    if "any" in kinds:
        return ANY
    choices: tuple[Any, ...] | None = None
    if with_choices and all(s.choices is not None or s.types in ({"null"}, {"str"}) for s in specs):
        choices = tuple(c for s in with_choices for c in s.choices or ())
    return FieldSpec(frozenset(kinds), choices)


def spec_from_annotation(annotation: Any) -> FieldSpec:  # noqa: ANN401, PLR0911 - typing objects are untyped
    """Return the :class:`FieldSpec` of a resolved type annotation (unknown types accept anything)."""
    if annotation is None or annotation is type(None):
        return FieldSpec(frozenset({"null"}))
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return _merge([spec_from_annotation(arg) for arg in typing.get_args(annotation)])
    if origin is typing.Literal:
        values = typing.get_args(annotation)
        kinds = {_json_type(v) for v in values}
        return FieldSpec(frozenset(kinds), tuple(values))
    if origin is typing.Annotated:
        return spec_from_annotation(typing.get_args(annotation)[0])
    base = origin or annotation
    if isinstance(base, type):
        if issubclass(base, enum.Enum):
            values = tuple(m.value for m in base)
            return FieldSpec(frozenset({_json_type(v) for v in values}), values)
        for python_type, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str")):
            if base is python_type:
                return FieldSpec(frozenset({name}))
        if issubclass(base, dict):
            return FieldSpec(frozenset({"dict"}))
        if issubclass(base, list | tuple | set):
            return FieldSpec(frozenset({"list"}))
    return ANY


def _json_type(value: object) -> str:  # noqa: PLR0911 - one return per JSON type
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, dict):
        return "dict"
    if isinstance(value, list | tuple):
        return "list"
    return "any"


def _type_ok(value: object, kinds: frozenset[str], lax: bool) -> bool:
    actual = _json_type(value)
    if actual in kinds:
        return True
    if actual == "int" and "float" in kinds:
        return True
    # pydantic's lax mode (DeepSpeed) takes 1e9 for an int; dataclasses (LLaMA-Factory) do not convert.
    return lax and actual == "float" and "int" in kinds and float(value).is_integer()  # type: ignore[arg-type]


def check_value(value: object, spec: FieldSpec, *, lax: bool = False) -> str | None:
    """Return why ``value`` does not fit ``spec``, or None when it does.

    Args:
        value: The value read from the file.
        spec: What the key accepts.
        lax: Accept integral floats for int keys, as pydantic does.
    """
    if "any" in spec.types:
        return None
    if not _type_ok(value, spec.types, lax):
        wanted = " or ".join(sorted(t for t in spec.types if t != "null"))
        return f"expected {wanted or 'null'}, got {_json_type(value)} {value!r}"
    if spec.choices is not None and value is not None and value not in spec.choices:
        shown = ", ".join(str(c) for c in spec.choices)
        near = nearest(str(value), [str(c) for c in spec.choices])
        hint = f"; did you mean {near!r}?" if near else ""
        return f"{value!r} is not one of: {shown}{hint}"
    return None

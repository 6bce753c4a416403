"""Validate a DeepSpeed JSON config, stricter than DeepSpeed itself.

DeepSpeed's pydantic sections reject unknown keys, but unknown top-level keys are silently ignored and
the failure only shows after the model has started loading on every node. Here every unknown key is an
error with the nearest valid key, found before anything is launched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.validation import backends, rules
from launcher.validation.deepspeed_facts import DeepSpeedFacts, deepspeed_facts
from launcher.validation.deepspeed_schema import (
    IGNORED_TOP_LEVEL,
    DeepSpeedSchema,
    SectionSpec,
    live_schema,
    shipped_schema,
)
from launcher.validation.problems import ConfigKind, FileReport, Problem, Severity
from launcher.validation.quiet import quiet_import
from launcher.validation.schema import check_value
from launcher.validation.suggest import unknown_key_message

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = ["DeepSpeedFacts", "deepspeed_facts", "validate_deepspeed"]

AUTO = "auto"
# Keys that circulate in blog posts but were never DeepSpeed options: say so instead of guessing.
NOT_DEEPSPEED_KEYS = {
    "stage3_parition_grads": "not a DeepSpeed option (a typo circulating in blog posts); ZeRO-3 always "
    "partitions gradients: remove it",
    "stage3_partition_grads": "not a DeepSpeed option; ZeRO-3 always partitions gradients: remove it",
}


def _unknown(key: str, candidates: Iterable[str], what: str = "unknown key") -> str:
    if key in NOT_DEEPSPEED_KEYS:
        return f"{what}; {NOT_DEEPSPEED_KEYS[key]}"
    return unknown_key_message(key, candidates, what)


def _check_section_builtin(
    path: str, prefix: str, data: Mapping[str, Any], section: SectionSpec
) -> list[Problem]:
    problems: list[Problem] = []
    for key, value in data.items():
        dotted = f"{prefix}.{key}"
        if key not in section.fields:
            problems.append(Problem(path, dotted, _unknown(key, section.fields), "unknown-key"))
            continue
        if value == AUTO:
            continue
        if key in section.nested and isinstance(value, dict):
            problems.extend(_check_section_builtin(path, dotted, value, section.nested[key]))
            continue
        why = check_value(value, section.fields[key], lax=True)
        if why:
            problems.append(Problem(path, dotted, why, "value-type"))
    return problems


def _section_for(schema: DeepSpeedSchema, top: str, loc: tuple[str, ...]) -> SectionSpec | None:
    section = schema.sections.get(top)
    for part in loc:
        if section is None:
            return None
        section = section.nested.get(part)
    return section


def _check_section_real(
    path: str, top: str, data: Mapping[str, Any], schema: DeepSpeedSchema
) -> list[Problem]:
    """Build DeepSpeed's own model of one section (cached per content and versions: :mod:`.cache`)."""
    from launcher.validation.cache import cached  # noqa: PLC0415

    found = cached("deepspeed-section", [top, data], lambda: _section_verdict(top, data, schema))
    return [Problem(path, key, message, rule) for key, message, rule in found]


def _section_verdict(
    top: str, data: Mapping[str, Any], schema: DeepSpeedSchema
) -> list[tuple[str, str, str]]:
    from pydantic import ValidationError  # noqa: PLC0415

    from launcher.validation.deepspeed_schema import _strict_sections  # noqa: PLC0415

    model = _strict_sections()[top]
    try:
        with quiet_import():
            model(**data)
    except ValidationError as err:
        found = []
        for item in err.errors():
            loc = tuple(str(p) for p in item["loc"])
            dotted = ".".join((top, *loc))
            if item["type"] == "extra_forbidden":
                parent = _section_for(schema, top, loc[:-1])
                found.append((dotted, _unknown(loc[-1], parent.fields if parent else ()), "unknown-key"))
            else:
                found.append((dotted, " ".join(str(item["msg"]).split()), "value-type"))
        return found
    except Exception as err:
        return [(top, " ".join(str(err).split()) or type(err).__name__, "value-type")]
    return []


def _deprecations(path: str, prefix: str, data: Mapping[str, Any], section: SectionSpec) -> list[Problem]:
    found = []
    for key, value in data.items():
        if key in section.deprecated:
            found.append(
                Problem(path, f"{prefix}.{key}", section.deprecated[key], "deprecated", Severity.WARNING)
            )
        if key in section.nested and isinstance(value, dict):
            found.extend(_deprecations(path, f"{prefix}.{key}", value, section.nested[key]))
    return found


def _check_top_level(path: str, config: Mapping[str, Any], schema: DeepSpeedSchema) -> list[Problem]:
    problems = []
    for key in config:
        if not isinstance(key, str):
            problems.append(Problem(path, repr(key), "keys must be strings", "value-type"))
            continue
        if key.startswith("_"):
            continue  # "_comment" style keys are comments by convention
        if key in schema.removed_top_level:
            problems.append(Problem(path, key, schema.removed_top_level[key], "removed-key"))
        elif key in IGNORED_TOP_LEVEL:
            problems.append(Problem(path, key, IGNORED_TOP_LEVEL[key], "ignored-key", Severity.WARNING))
        elif key not in schema.top_level:
            message = _unknown(key, schema.top_level, "unknown key (DeepSpeed would silently ignore it)")
            problems.append(Problem(path, key, message, "unknown-key"))
    zero = config.get("zero_optimization")
    if isinstance(zero, dict):
        for key in zero:
            if key in schema.removed_zero:
                problems.append(
                    Problem(path, f"zero_optimization.{key}", schema.removed_zero[key], "removed-key")
                )
    return problems


def validate_deepspeed(config: object, path: str, *, builtin: bool | None = None) -> FileReport:
    """Validate a parsed DeepSpeed config.

    Args:
        config: The parsed JSON.
        path: The file name used in problems.
        builtin: Force the shipped key lists (True) or the real DeepSpeed classes (False); None: real
            classes when importable unless ``MIFT_VALIDATE_BUILTIN=1``.

    Returns:
        A report whose summary reads ``ZeRO-3 + offload``.
    """
    report = FileReport(path, ConfigKind.DEEPSPEED)
    if not isinstance(config, dict):
        report.problems.append(Problem(path, "(file)", "a DeepSpeed config must be a JSON object"))
        return report
    real = not backends.builtin_forced(builtin) and backends.importable("deepspeed")
    schema = live_schema() if real else shipped_schema()
    report.problems.extend(_check_top_level(path, config, schema))
    removed_zero = set(schema.removed_zero)
    for top, section in schema.sections.items():
        if top not in config:
            continue
        data = config[top]
        if not isinstance(data, dict):
            report.problems.append(Problem(path, top, f"must be a mapping, got {data!r}", "value-type"))
            continue
        if top == "zero_optimization":
            data = {k: v for k, v in data.items() if k not in removed_zero}
        if real:
            report.problems.extend(_check_section_real(path, top, data, schema))
        else:
            report.problems.extend(_check_section_builtin(path, top, data, section))
        report.problems.extend(_deprecations(path, top, data, section))
    facts = deepspeed_facts(config)
    report.problems.extend(rules.deepspeed_rules(path, facts))
    report.summary = facts.summary
    return report

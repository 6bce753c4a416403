"""Reading a job spec: its YAML parsed and validated into :class:`launcher.spec.jobspec.JobSpec`, each of
pydantic's errors turned into one problem line at its key."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from launcher.exceptions import ConfigurationError
from launcher.problems import Problem
from launcher.spec.config_io import decode_text, load_yaml_text, read_config_bytes
from launcher.spec.jobspec import JobSpec


def _field_names(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """Return the valid keys at ``loc``'s parent (for suggestions)."""
    current: type[BaseModel] = model
    for part in loc[:-1]:
        info = current.model_fields.get(str(part))
        ann = info.annotation if info else None
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            current = ann
        else:
            return []
    return list(current.model_fields)


_TYPE_WORDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean"}


def _union_groups(errors: list[Any]) -> list[tuple[tuple[int | str, ...], list[Any]]]:
    """Group pydantic errors by location, folding the members of a union into one entry.

    A value that fits no member of a union (``str | int | float | bool``) gives one error per member, whose
    location ends with the member's tag: those are one problem, at the location without the tag.
    """
    groups: dict[tuple[int | str, ...], list[Any]] = {}
    for item in errors:
        loc = tuple(item["loc"])
        if len(loc) > 1 and str(loc[-1]) in _TYPE_WORDS and item["type"].endswith(("_type", "_parsing")):
            loc = loc[:-1]
        groups.setdefault(loc, []).append(item)
    return list(groups.items())


def _problems(source: Path, err: ValidationError) -> list[Problem]:
    """Return one problem per pydantic error, each with its own key path."""
    problems = []
    for loc, items in _union_groups(err.errors()):
        item = items[0]
        dotted = ".".join(str(p) for p in loc) or "(top)"
        rule = "job-spec"
        if item["type"] == "extra_forbidden":
            key = str(loc[-1])
            near = difflib.get_close_matches(key, _field_names(JobSpec, loc), n=1, cutoff=0.5)
            msg = "unknown key" + (f"; did you mean {near[0]!r}?" if near else "")
            rule = "unknown-key"
        elif item["type"] == "missing":
            msg, rule = "required key missing", "required-key"
        elif len(items) > 1:
            words = [_TYPE_WORDS.get(str(i["loc"][-1]), str(i["loc"][-1])) for i in items]
            got = type(item.get("input")).__name__
            msg = f"must be {', '.join(words[:-1])} or {words[-1]}, not a {got}"
        else:
            msg = str(item["msg"]).removeprefix("Value error, ")
            key, sep, rest = msg.partition(": ")
            # a check across keys names the key at fault (a nested one dotted: recovery.spares)
            if not loc and sep and key.split(".")[0] in JobSpec.model_fields:
                dotted, msg = key, rest
        problems.append(Problem(str(source), dotted, msg, rule))
    return problems


def parse_job_spec(data: object, source: Path) -> JobSpec:
    """Validate ``data`` (parsed YAML) as a job spec; relative paths are taken from ``source``'s folder."""
    if not isinstance(data, dict):
        raise ConfigurationError.at(
            source, "(file)", "a job spec must be a mapping of keys to values", "kind"
        )
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as err:
        raise ConfigurationError(problems=_problems(source, err)) from None
    base = source.parent
    updates: dict[str, Any] = {"train_config": (base / spec.train_config).resolve()}
    if isinstance(spec.deepspeed, Path):
        updates["deepspeed"] = (base / spec.deepspeed).resolve()
    if spec.plan_model_config is not None:
        updates["plan_model_config"] = (base / spec.plan_model_config).resolve()
    sources = {
        key: source.model_copy(update={"controller": (base / source.controller).resolve()})
        for key, source in spec.stage.items()
        if source.controller is not None
    }
    if sources:
        updates["stage"] = spec.stage.model_copy(update=sources)
    return spec.model_copy(update=updates)


def load_job_spec_bytes(raw: bytes, path: Path) -> JobSpec:
    """Validate the bytes of a job spec file (as read once by the engine); every problem raises."""
    data = load_yaml_text(decode_text(raw, path), path)  # duplicate keys are errors too
    return parse_job_spec(data, path)


def load_job_spec(path: Path) -> JobSpec:
    """Read and validate a job spec file; every problem raises :class:`ConfigurationError`."""
    return load_job_spec_bytes(read_config_bytes(path, "job spec"), path)

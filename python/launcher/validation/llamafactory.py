"""Validate a LLaMA-Factory training YAML: keys, value types, referenced files and cross-field rules."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.exceptions import ConfigurationError
from launcher.spec.config_io import load_config_file
from launcher.validation import backends, rules
from launcher.validation.deepspeed import DeepSpeedFacts, deepspeed_facts, validate_deepspeed
from launcher.validation.llamafactory_schema import (
    LIGHT_CLASSES,
    LlamaFactorySchema,
    live_schema,
    shipped_schema,
    train_classes,
)
from launcher.validation.paths import (
    config_root_for,
    display,
    is_node_path,
    resolve_referenced,
    to_controller,
)
from launcher.validation.problems import ConfigKind, FileReport, Problem
from launcher.validation.quiet import quiet_import
from launcher.validation.schema import check_value
from launcher.validation.suggest import unknown_key_message

if TYPE_CHECKING:
    from collections.abc import Mapping

DEFAULT_DATASET_DIR = "data"  # LLaMA-Factory's own data/ folder, relative to where it runs
REMOTE_PREFIX = "REMOTE:"
REQUIRED_KEYS = ("model_name_or_path",)
_BACKTICK_KEY = re.compile(r"`(\w+)`")


def _schema(builtin: bool | None) -> tuple[LlamaFactorySchema, bool]:
    real = not backends.builtin_forced(builtin) and backends.importable("llamafactory")
    return (live_schema() if real else shipped_schema()), real


def _check_keys(path: str, cfg: Mapping[str, Any], schema: LlamaFactorySchema) -> list[Problem]:
    problems = []
    for key, value in cfg.items():
        if not isinstance(key, str):
            problems.append(Problem(path, repr(key), "keys must be strings", "value-type"))
            continue
        if key not in schema.fields:
            problems.append(
                Problem(path, str(key), unknown_key_message(str(key), schema.fields), "unknown-key")
            )
            continue
        why = check_value(value, schema.fields[key][1])
        if why:
            problems.append(Problem(path, key, why, "value-type"))
    problems.extend(
        Problem(path, key, "required key missing", "required-key") for key in REQUIRED_KEYS if key not in cfg
    )
    return problems


def _run_post_init(path: str, cfg: Mapping[str, Any], schema: LlamaFactorySchema) -> list[Problem]:
    """Build LLaMA-Factory's cheap argument dataclasses so their own checks run (no model, no hub).

    The verdict is cached per content and versions (:mod:`launcher.validation.cache`).
    """
    from launcher.validation.cache import cached  # noqa: PLC0415

    kwargs = {
        name: {k: v for k, v in cfg.items() if k in schema.fields and schema.fields[k][0] == name}
        for name in LIGHT_CLASSES
    }
    found = cached("llamafactory-post-init", kwargs, lambda: _post_init_verdict(kwargs, schema))
    return [Problem(path, key, message, "llamafactory-check") for key, message in found]


def _post_init_verdict(
    kwargs_by_class: Mapping[str, Mapping[str, Any]], schema: LlamaFactorySchema
) -> list[tuple[str, str]]:
    found = []
    classes = train_classes()
    for name in LIGHT_CLASSES:
        kwargs = kwargs_by_class[name]
        if name == "ModelArguments" and "model_name_or_path" not in kwargs:
            continue  # reported as a missing required key
        try:
            with quiet_import():
                classes[name](**kwargs)
        except (ValueError, AssertionError, TypeError) as err:
            message = " ".join(str(err).split()) or f"{name} refused these values"
            named = [k for k in _BACKTICK_KEY.findall(message) if k in schema.fields]
            found.append((named[0] if named else name, message))
    return found


def _deepspeed(
    path: str, value: object, yaml_path: Path, config_root: Path | None, builtin: bool | None
) -> tuple[list[Problem], DeepSpeedFacts | None, str]:
    if isinstance(value, dict):
        report = validate_deepspeed(value, f"{path}: deepspeed", builtin=builtin)
        return report.problems, deepspeed_facts(value), report.summary
    if not isinstance(value, str) or not value:
        return [], None, ""
    found, why = resolve_referenced(value, yaml_path, config_root)
    if found is None:
        return [Problem(path, "deepspeed", why, "deepspeed-path-exists")], None, ""
    try:
        data = load_config_file(found)
    except ConfigurationError as err:
        return list(err.problems), None, ""
    report = validate_deepspeed(data, str(found), builtin=builtin)
    facts = deepspeed_facts(data) if isinstance(data, dict) else None
    return report.problems, facts, report.summary


def _chosen(
    label: str, data: Mapping[str, Any] | None, builtin: bool | None
) -> tuple[list[Problem], DeepSpeedFacts | None, str]:
    if data is None:
        return [], None, ""
    report = validate_deepspeed(dict(data), label, builtin=builtin)
    return report.problems, deepspeed_facts(data), report.summary


def _dataset_dir(  # noqa: PLR0911 - one return per kind of dataset_dir
    value: str, yaml_path: Path, config_root: Path | None
) -> tuple[Path | None, str]:
    """Return the local dataset folder to check (None: not local, not checked) or why it is missing."""
    if value.startswith(REMOTE_PREFIX) or value == DEFAULT_DATASET_DIR:
        return None, ""
    if value.startswith("/"):
        if Path(value).is_dir():
            return Path(value), ""
        local = to_controller(value, config_root)
        if local is not None:
            if local.is_dir():
                return Path(display(local)), ""
            return None, f"{value}: no such folder (controller copy {display(local)})"
        if is_node_path(value):
            return None, f"{value}: node path, but this YAML is not in a configs/train/ folder"
        return None, ""  # a node-only path the controller cannot see
    local = (yaml_path.resolve().parent / value).resolve()
    return (Path(display(local)), "") if local.is_dir() else (None, "")


def _names(value: object) -> list[str]:
    if isinstance(value, str):
        return [n.strip() for n in value.split(",") if n.strip()]
    if isinstance(value, list):
        return [str(n).strip() for n in value]
    return []


def _datasets(  # noqa: PLR0911 - each early return is a different missing piece
    path: str, cfg: Mapping[str, Any], yaml_path: Path, config_root: Path | None
) -> list[Problem]:
    """Dataset names must be entries of ``dataset_info.json`` when the dataset folder is local."""
    dir_value = cfg.get("dataset_dir", DEFAULT_DATASET_DIR)
    if not isinstance(dir_value, str):
        return []
    folder, why = _dataset_dir(dir_value, yaml_path, config_root)
    if why:
        return [Problem(path, "dataset_dir", why, "dataset-exists")]
    if folder is None:
        return []
    info_path = folder / "dataset_info.json"
    if not info_path.is_file():
        return [
            Problem(path, "dataset_dir", f"{dir_value}: no dataset_info.json in {folder}", "dataset-exists")
        ]
    try:
        info = load_config_file(info_path)
    except ConfigurationError as err:
        return [Problem(path, "dataset_dir", str(err.problems[0]), "dataset-exists")]
    if not isinstance(info, dict):
        return [Problem(path, "dataset_dir", f"{info_path}: must be a JSON object", "dataset-exists")]
    problems = []
    for key in ("dataset", "eval_dataset"):
        for name in _names(cfg.get(key)):
            entry = info.get(name)
            if entry is None:
                message = unknown_key_message(name, info, f"dataset {name!r} is not in {info_path}")
                problems.append(Problem(path, key, message, "dataset-exists"))
            elif (
                isinstance(entry, dict)
                and isinstance(entry.get("file_name"), str)
                and not (folder / entry["file_name"]).exists()
            ):
                problems.append(
                    Problem(
                        path,
                        key,
                        f"{name}: {folder / entry['file_name']}: no such file",
                        "dataset-exists",
                    )
                )
    return problems


def validate_llamafactory(
    cfg: object,
    path: str,
    base_dir: Path | None = None,
    *,
    builtin: bool | None = None,
    config_root: Path | None = None,
    chosen_deepspeed: tuple[str, Mapping[str, Any] | None] | None = None,
) -> FileReport:
    """Validate a parsed LLaMA-Factory training YAML.

    Args:
        cfg: The parsed YAML.
        path: The file name used in problems.
        base_dir: Folder of the YAML (relative references are looked up from it); defaults to
            ``Path(path).parent``.
        builtin: Force the shipped key list (True) or LLaMA-Factory's own dataclasses (False); None:
            the dataclasses when importable unless ``MIFT_VALIDATE_BUILTIN=1``.
        config_root: Controller folder mirroring ``/opt/mift/configs``; default: found from the YAML.
        chosen_deepspeed: The DeepSpeed config the run uses, already read (label, mapping; mapping None: no
            DeepSpeed), instead of the one the YAML's ``deepspeed:`` names (:mod:`launcher.validation.job`).

    Returns:
        A report whose summary reads ``sft lora, ZeRO-3 + offload``.
    """
    report = FileReport(path, ConfigKind.LLAMAFACTORY)
    if not isinstance(cfg, dict):
        report.problems.append(Problem(path, "(file)", "a LLaMA-Factory config must be a mapping of keys"))
        return report
    yaml_path = (base_dir / Path(path).name) if base_dir is not None else Path(path)
    root = config_root if config_root is not None else config_root_for(yaml_path)
    schema, real = _schema(builtin)
    report.problems.extend(_check_keys(path, cfg, schema))
    if real and not report.problems:
        report.problems.extend(_run_post_init(path, cfg, schema))
    if chosen_deepspeed is not None:
        label, ds_data = chosen_deepspeed
        ds_value: object = ds_data
        ds_problems, facts, ds_summary = _chosen(label, ds_data, builtin)
    else:
        ds_value = cfg.get("deepspeed")
        ds_problems, facts, ds_summary = _deepspeed(path, ds_value, yaml_path, root, builtin)
    report.problems.extend(ds_problems)
    report.problems.extend(_datasets(path, cfg, yaml_path, root))
    report.problems.extend(rules.llamafactory_rules(path, cfg, facts))
    stage, method = cfg.get("stage", "sft"), cfg.get("finetuning_type", "lora")
    report.summary = f"{stage} {method}, " + (ds_summary if ds_value else "no DeepSpeed")
    return report

"""Load: read the job spec, its training YAML and the DeepSpeed JSON once each, as bytes, and parse them.

Everything after this step (validation, planning, shipping) works on these objects; no file is read again.
The DeepSpeed file is chosen here by one rule (docs/launcher.md, "Which DeepSpeed config a run uses"):

* the job spec names a file: that file (the training YAML's own ``deepspeed:``, if any, is replaced);
* the job spec leaves ``deepspeed`` out: the file the training YAML names, if any, else no DeepSpeed;
* the job spec says ``none`` or ``auto`` while the training YAML names a DeepSpeed config: refused, one line
  (the two files contradict each other; a 70B job silently run without ZeRO-3 runs out of memory).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from launcher.exceptions import ConfigurationError
from launcher.spec.config_io import parse_config, read_config_bytes
from launcher.spec.jobspec_load import load_job_spec_bytes
from launcher.validation.paths import config_root_for, resolve_referenced

if TYPE_CHECKING:
    from collections.abc import Mapping

    from launcher.spec.jobspec import JobSpec


@dataclass(frozen=True)
class ConfigFile:
    """One config as read: its controller path, the bytes read and the mapping parsed from them.

    ``label`` names it in problems (the path, or ``train.yaml: deepspeed`` for a config written inline).
    """

    path: Path
    raw: bytes
    data: Mapping[str, Any]
    label: str

    @classmethod
    def read(cls, path: Path, what: str) -> ConfigFile:
        """Read and parse ``path``; it must hold a mapping."""
        raw = read_config_bytes(path, what)
        data = parse_config(raw, path)
        if not isinstance(data, dict):
            raise ConfigurationError.at(
                path, "(file)", f"a {what} must be a mapping of keys to values", "kind"
            )
        return cls(path, raw, MappingProxyType(data), str(path))


@dataclass(frozen=True)
class LoadedJob:
    """A job spec and the configs it uses, each read once.

    Attributes:
        spec_path: the job spec file.
        spec: the validated job spec (controller paths resolved from its folder).
        train: the training YAML.
        deepspeed: the DeepSpeed config the run uses (None: no DeepSpeed, or ``auto``: chosen after
        preflight). deepspeed_from: where the choice came from: ``job spec``, ``training YAML``, ``none`` or
        ``auto``.
    """

    spec_path: Path
    spec: JobSpec
    train: ConfigFile
    deepspeed: ConfigFile | None
    deepspeed_from: str


def _referenced(spec_path: Path, key: str, target: Path, what: str) -> ConfigFile:
    """Read a file the job spec names; a file that cannot be read is the job spec's problem at ``key``."""
    try:
        raw = read_config_bytes(target, what)
    except ConfigurationError as err:
        raise ConfigurationError.at(spec_path, key, f"{target}: {err.problems[0].message}", "file") from None
    data = parse_config(raw, target)  # a syntax error is the file's own problem
    if not isinstance(data, dict):
        raise ConfigurationError.at(target, "(file)", f"a {what} must be a mapping of keys to values", "kind")
    return ConfigFile(target, raw, MappingProxyType(data), str(target))


def yaml_deepspeed(train: ConfigFile) -> ConfigFile | None:
    """Return the DeepSpeed config the training YAML names (a file, or a mapping written inline), or None."""
    value = train.data.get("deepspeed")
    if value is None or value == "":
        return None
    if isinstance(value, dict):
        raw = json.dumps(value, indent=2).encode()
        return ConfigFile(train.path, raw, MappingProxyType(dict(value)), f"{train.label}: deepspeed")
    if not isinstance(value, str):
        raise ConfigurationError.at(
            train.label, "deepspeed", f"must be a file name or a mapping, got {value!r}", "value-type"
        )
    found, why = resolve_referenced(value, train.path, config_root_for(train.path))
    if found is None:
        raise ConfigurationError.at(train.label, "deepspeed", why, "deepspeed-path-exists")
    try:
        return ConfigFile.read(found, "DeepSpeed config")
    except ConfigurationError as err:
        problem = err.problems[0]
        if problem.rule == "file":
            raise ConfigurationError.at(
                train.label, "deepspeed", f"{found}: {problem.message}", "deepspeed-path-exists"
            ) from None
        raise


def choose_deepspeed(spec_path: Path, spec: JobSpec, train: ConfigFile) -> tuple[ConfigFile | None, str]:
    """Apply the DeepSpeed rule (module docstring); return the config and where it came from."""
    if isinstance(spec.deepspeed, Path):
        return _referenced(spec_path, "deepspeed", spec.deepspeed, "DeepSpeed config"), "job spec"
    named = train.data.get("deepspeed")
    if spec.deepspeed is None:
        return yaml_deepspeed(train), "training YAML" if named else "none"
    if named:
        shown = named if isinstance(named, str) else "an inline DeepSpeed config"
        raise ConfigurationError.at(
            spec_path,
            "deepspeed",
            f"{spec.deepspeed}, but {train.label} names {shown}: leave deepspeed out of the job spec to use "
            "it, or remove it from the training YAML",
            "deepspeed-choice",
        )
    return None, spec.deepspeed


def load_job(spec_path: Path) -> LoadedJob:
    """Read the job spec and every config it uses once; the first problem found raises."""
    spec = load_job_spec_bytes(read_config_bytes(spec_path, "job spec"), spec_path)
    train = _referenced(spec_path, "train_config", spec.train_config, "training YAML")
    deepspeed, source = choose_deepspeed(spec_path, spec, train)
    return LoadedJob(spec_path, spec, train, deepspeed, source)

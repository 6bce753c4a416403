"""Prepare the LLaMA-Factory training YAML and the DeepSpeed JSON that a run ships to its nodes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from launcher.exceptions import ConfigurationError
from launcher.validation.loading import load_config_file

if TYPE_CHECKING:
    from launcher.jobspec import JobSpec

TRAIN_FILE = "train.yaml"
DS_FILE = "ds_config.json"


@dataclass(frozen=True)
class RunConfigs:
    """The files of one run, as they will be on every node (relative to the node run directory)."""

    train: dict[str, Any]
    deepspeed: dict[str, Any] | None
    deepspeed_name: str
    output_dir: str
    expect_outputs: tuple[str, ...]


def _load_mapping(path: Path, what: str) -> dict[str, Any]:
    """Read a config with the validator's own loader (one-line errors, duplicate keys refused)."""
    data = load_config_file(path)
    if not isinstance(data, dict):
        raise ConfigurationError(f"{path}: a {what} must be a mapping")
    return data


def expected_outputs(train: dict[str, Any]) -> tuple[str, ...]:
    """Return the files whose presence in output_dir (on the first node) means the training finished."""
    if str(train.get("finetuning_type", "lora")) == "lora":
        return ("adapter_model.safetensors", "all_results.json")
    return ("config.json", "all_results.json")


def prepare(spec: JobSpec, run_id: str, deepspeed: tuple[str, dict[str, Any]] | None = None) -> RunConfigs:
    """Return the run's training config with deepspeed, output_dir and resume set by the job spec.

    Args:
        spec: the job spec.
        run_id: fills ``{run_id}`` in the spec's ``output_dir``.
        deepspeed: a (name, config) chosen elsewhere (``deepspeed: auto``); else the spec's file is read.
    """
    train = _load_mapping(spec.train_config, "LLaMA-Factory config")
    ds: dict[str, Any] | None = None
    ds_name = "none"
    if deepspeed is not None:
        ds_name, chosen = deepspeed
        ds = chosen or None  # the planner returns ("none", {}) when plain DDP is fastest
    elif isinstance(spec.deepspeed, Path):
        ds, ds_name = _load_mapping(spec.deepspeed, "DeepSpeed config"), spec.deepspeed.name
    if ds is not None:
        train["deepspeed"] = DS_FILE  # relative: the trainer runs in the node run directory
    else:
        train.pop("deepspeed", None)
    output_dir = spec.output_dir.format(run_id=run_id)
    train["output_dir"] = output_dir
    if spec.resume is False:
        train["overwrite_output_dir"] = True
        train.pop("resume_from_checkpoint", None)
    else:
        train["overwrite_output_dir"] = False
        if isinstance(spec.resume, str):
            train["resume_from_checkpoint"] = spec.resume
    return RunConfigs(train, ds, ds_name, output_dir, expected_outputs(train))


def write_files(configs: RunConfigs, files_dir: Path) -> None:
    """Write the node files of the run into ``files_dir`` (copied as they are to every node)."""
    files_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    (files_dir / TRAIN_FILE).write_text(yaml.safe_dump(configs.train, sort_keys=False))
    if configs.deepspeed is not None:
        (files_dir / DS_FILE).write_text(json.dumps(configs.deepspeed, indent=2) + "\n")

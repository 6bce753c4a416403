"""Validation of job specs, LLaMA-Factory YAMLs and DeepSpeed JSONs before anything is launched.

Cheap to import: DeepSpeed and LLaMA-Factory are imported only when a file of their kind is validated.
"""

from __future__ import annotations

from launcher.validation.deepspeed import DeepSpeedFacts, deepspeed_facts, validate_deepspeed
from launcher.validation.files import expand, validate_file, validate_files, validate_jobspec, validate_paths
from launcher.validation.kinds import detect_kind
from launcher.validation.llamafactory import validate_llamafactory
from launcher.validation.problems import ConfigKind, FileReport, Problem, Severity

__all__ = [
    "ConfigKind",
    "DeepSpeedFacts",
    "FileReport",
    "Problem",
    "Severity",
    "deepspeed_facts",
    "detect_kind",
    "expand",
    "validate_deepspeed",
    "validate_file",
    "validate_files",
    "validate_jobspec",
    "validate_llamafactory",
    "validate_paths",
]

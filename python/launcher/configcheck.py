"""Check a job's LLaMA-Factory YAML and DeepSpeed JSON before anything starts (:mod:`launcher.validation`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.exceptions import ConfigurationError
from launcher.validation import validate_jobspec

if TYPE_CHECKING:
    from pathlib import Path


def check_configs(job_path: Path) -> None:
    """Raise ConfigurationError listing every ``PATH: key: message`` error of the job spec and its configs."""
    report = validate_jobspec(job_path)
    errors = [str(p) for p in report.problems if p.is_error]
    if errors:
        raise ConfigurationError("\n".join(errors))

"""The problems model: one :class:`Problem` per finding, one :class:`FileReport` per validated file.

Typed from where a problem is found (a loader, the job spec model, a validator, preflight) to where it is
printed: :class:`~launcher.exceptions.LauncherError` carries them, the CLI prints them. Standard library only,
so that the CLI can import it without the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path


class Severity(StrEnum):
    """How bad a finding is: errors fail validation (exit 2), warnings are printed only."""

    ERROR = "error"
    WARNING = "warning"


class ConfigKind(StrEnum):
    """What a config file is, as detected from its content and extension."""

    DEEPSPEED = "deepspeed config"
    LLAMAFACTORY = "llamafactory config"
    JOBSPEC = "job spec"
    ACCELERATE = "accelerate config"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Problem:
    """One finding in one file.

    Attributes:
        path: The file, as given by the user.
        key: Dotted key inside the file (``zero_optimization.stage3_parition_grads``), or ``(file)``.
        message: One line saying what is wrong and, where known, what to write instead.
        rule: Name of the rule that found it (``unknown-key``, ``pure-bf16-zero3``, ...).
        severity: Errors fail validation; warnings do not.
    """

    path: str
    key: str
    message: str
    rule: str = "schema"
    severity: Severity = Severity.ERROR

    def __str__(self) -> str:
        """Return the one-line form ``PATH: key: message`` (warnings say so; no key: ``PATH: message``)."""
        prefix = "warning: " if self.severity is Severity.WARNING else ""
        key = f"{self.key}: " if self.key else ""
        return f"{self.path}: {key}{prefix}{' '.join(self.message.split())}"

    @property
    def identity(self) -> tuple[str, str, str]:
        """Return what makes two findings the same (the file compared by absolute path)."""
        return (str(Path(self.path).absolute()), self.key, self.message)

    @property
    def is_error(self) -> bool:
        """Return True when this finding fails validation."""
        return self.severity is Severity.ERROR


@dataclass
class FileReport:
    """The result of validating one file.

    Attributes:
        path: The file, as given by the user.
        kind: The detected kind.
        summary: Short description for the ok line (``ZeRO-3 + offload``), empty when none.
        problems: Every finding, errors and warnings.
        validated: False for kinds that are recognised but not checked (accelerate configs).
    """

    path: str
    kind: ConfigKind
    summary: str = ""
    problems: list[Problem] = field(default_factory=list)
    validated: bool = True

    @property
    def ok(self) -> bool:
        """Return True when no finding is an error."""
        return not any(p.is_error for p in self.problems)

    def ok_line(self) -> str:
        """Return ``PATH: ok (kind, summary)`` for a file without errors."""
        detail = str(self.kind)
        if not self.validated:
            detail += ", not validated"
        elif self.summary:
            detail += f", {self.summary}"
        return f"{self.path}: ok ({detail})"

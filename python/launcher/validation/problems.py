"""The problems model lives in :mod:`launcher.problems` (the CLI and the engine share it); re-exported
here."""

from __future__ import annotations

from launcher.problems import ConfigKind, FileReport, Problem, Severity

__all__ = ["ConfigKind", "FileReport", "Problem", "Severity"]

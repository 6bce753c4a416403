"""The launcher's error hierarchy; every user-facing error is one of these."""

from __future__ import annotations

from launcher.exit_codes import BAD_INPUT, JOB_FAILED, ExitCode


class LauncherError(Exception):
    """Base class: ``str(err)`` is the one line shown to the user."""

    exit_code: ExitCode = JOB_FAILED


class ConfigurationError(LauncherError):
    """Bad input: a config typo, a missing file, an unknown host. Nothing remote was touched."""

    exit_code = BAD_INPUT


class JobFailedError(LauncherError):
    """The job (or a remote step) failed; logs are kept in the run directory."""

    exit_code = JOB_FAILED

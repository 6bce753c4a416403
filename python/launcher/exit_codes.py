"""Exit codes of every command: 0 ok, 1 job failed, 2 bad input."""

from __future__ import annotations

from typing import NewType

ExitCode = NewType("ExitCode", int)

OK = ExitCode(0)
JOB_FAILED = ExitCode(1)
BAD_INPUT = ExitCode(2)

"""Exit codes of every command: 0 ok, 1 job failed, 2 bad input, 3 nothing there (docs/launcher.md "Exit codes
and signals")."""

from __future__ import annotations

from typing import NewType

ExitCode = NewType("ExitCode", int)

OK = ExitCode(0)
JOB_FAILED = ExitCode(1)
BAD_INPUT = ExitCode(2)
# no run to show: the runs folder holds none (a run id that matches nothing is BAD_INPUT)
NOTHING = ExitCode(3)

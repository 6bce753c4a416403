"""TEST DOUBLE of a slow import: on this directory's ``PYTHONPATH``, the first import of DeepSpeed or
LLaMA-Factory writes ``$MIFT_IMPORT_HOLD_MARKER`` and then waits (at most ``HOLD_S``) before importing it.

``mift_testsupport.signal_instants.run_once(..., at_import=True)`` puts it there, waits for the marker and
sends its signal: the signal then lands while validation is importing the real classes, whatever the machine's
speed (a signal at a fixed instant can land after a warm, fast validation has already decided the outcome).
Nothing else changes: the hold is a ``time.sleep`` that the launcher's signal handler interrupts.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

HELD = frozenset({"deepspeed", "llamafactory"})
HOLD_S = 60.0


class _HoldFirstImport(importlib.abc.MetaPathFinder):
    """Hold the first import of a module of ``HELD``, once per process; find nothing itself."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker
        self.done = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not self.done and fullname in HELD:
            self.done = True
            self.marker.write_text(f"{os.getpid()} {fullname}\n")
            time.sleep(HOLD_S)
        return None


if os.environ.get("MIFT_IMPORT_HOLD_MARKER"):
    sys.meta_path.insert(0, _HoldFirstImport(Path(os.environ["MIFT_IMPORT_HOLD_MARKER"])))

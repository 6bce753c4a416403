"""Bench-only hook: at exit, write this process's torch.cuda peak memory to $MIFT_MEMHOOK_DIR/<pid>.json.

Loaded through PYTHONPATH by every Python process of a bench run (torchrun's workers too); does nothing
unless MIFT_MEMHOOK_DIR is set and the process used CUDA.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path


def _dump() -> None:
    out = os.environ.get("MIFT_MEMHOOK_DIR")
    torch = sys.modules.get("torch")
    if not out or torch is None or not torch.cuda.is_initialized():
        return
    peaks = {"allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved()}
    Path(out, f"{os.getpid()}.json").write_text(json.dumps(peaks))


atexit.register(_dump)

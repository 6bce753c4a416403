"""Bench-only hook: at exit, write this process's torch.cuda peak memory to $MIFT_MEMHOOK_DIR/<pid>.json.

Loaded through PYTHONPATH by every Python process of a bench run (torchrun's workers too); does nothing
unless MIFT_MEMHOOK_DIR is set and the process used CUDA. With MIFT_STEP_TIMES=1 it also records the wall
time after every optimizer step (a global ``torch.optim`` step post-hook, which every optimizer under
LLaMA-Factory and DeepSpeed runs once per optimizer step), so bench/gpu/plan_grid.py can take the steady-state
step time without the first step's warm-up.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from pathlib import Path

_STEPS: list[float] = []


def _dump() -> None:
    out = os.environ.get("MIFT_MEMHOOK_DIR")
    torch = sys.modules.get("torch")
    if not out or torch is None or not torch.cuda.is_initialized():
        return
    peaks = {
        "allocated": torch.cuda.max_memory_allocated(),
        "reserved": torch.cuda.max_memory_reserved(),
        "step_times": _STEPS,
    }
    Path(out, f"{os.getpid()}.json").write_text(json.dumps(peaks))


def _step_hook(_optimizer: object, _args: object, _kwargs: object) -> None:
    torch = sys.modules["torch"]
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    _STEPS.append(time.time())
    # appended as it happens: a trainer ended by a signal runs no atexit
    with Path(os.environ["MIFT_MEMHOOK_DIR"], f"{os.getpid()}.steps").open("a") as fh:
        fh.write(f"{_STEPS[-1]}\n")


if os.environ.get("MIFT_MEMHOOK_DIR"):
    atexit.register(_dump)
    if os.environ.get("MIFT_STEP_TIMES") == "1":
        from torch.optim.optimizer import register_optimizer_step_post_hook  # only in bench trainers

        register_optimizer_step_post_hook(_step_hook)

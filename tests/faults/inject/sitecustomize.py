"""TEST DOUBLE of a slow trainer, for the progress watchdog's faults cases (tests/faults/test_watchdog.py).

Copied to the test hosts and put first on the trainer's PYTHONPATH by the job spec's ``env``, so every
Python process of the run imports it at start-up. Once ``transformers.trainer`` is imported, it makes HF's
Trainer (the base of LLaMA-Factory's, which overrides neither method) slow where the environment asks:

* ``MIFT_FAULTS_SLOW_FIRST_STEP_S``: the first ``training_step`` sleeps that long first (a long compilation);
* ``MIFT_FAULTS_SLOW_SAVE_S``: the first ``_save_checkpoint`` sleeps that long first (a slow file system): the
  step is logged, then nothing is written while it sleeps.
* ``MIFT_FAULTS_SLOW_STEPS``: ``A-B:S``, the A-th to B-th ``training_step`` calls of each process (1-based)
  sleep S seconds first: the step before them stays the last logged for S seconds, so that a kill from
  outside lands there (tests/faults/test_recovery.py).

Without either variable it does nothing. Standard library only.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import time
from typing import Any

FIRST_STEP_S = float(os.environ.get("MIFT_FAULTS_SLOW_FIRST_STEP_S") or 0)
SAVE_S = float(os.environ.get("MIFT_FAULTS_SLOW_SAVE_S") or 0)
_CALLS, _, _SLEEP = (os.environ.get("MIFT_FAULTS_SLOW_STEPS") or "0-0:0").partition(":")
_FIRST, _, _LAST = _CALLS.partition("-")
SLOW_FROM, SLOW_TO = int(_FIRST), int(_LAST or _FIRST)
SLOW_STEP_S = float(_SLEEP or 0)


def _slow(module: Any) -> None:
    trainer = module.Trainer
    if FIRST_STEP_S > 0:
        step = trainer.training_step
        done: list[bool] = []

        def training_step(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not done:
                done.append(True)
                print(f"mift-faults: slow first step: sleeping {FIRST_STEP_S:g} s", flush=True)
                time.sleep(FIRST_STEP_S)
            return step(self, *args, **kwargs)

        trainer.training_step = training_step
    if SLOW_TO > 0 and SLOW_STEP_S > 0:
        each_step = trainer.training_step
        calls: list[bool] = []

        def slow_training_step(self: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append(True)
            if SLOW_FROM <= len(calls) <= SLOW_TO:
                print(f"mift-faults: slow step call {len(calls)}: sleeping {SLOW_STEP_S:g} s", flush=True)
                time.sleep(SLOW_STEP_S)
            return each_step(self, *args, **kwargs)

        trainer.training_step = slow_training_step
    if SAVE_S > 0:
        save = trainer._save_checkpoint
        saved: list[bool] = []

        def _save_checkpoint(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not saved:
                saved.append(True)
                print(f"mift-faults: slow checkpoint save: sleeping {SAVE_S:g} s", flush=True)
                time.sleep(SAVE_S)
            return save(self, *args, **kwargs)

        trainer._save_checkpoint = _save_checkpoint


class _AfterTrainerImport(importlib.abc.MetaPathFinder):
    """Wraps the loader of ``transformers.trainer`` so that the module is made slow right after it ran."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        del path, target
        if name != "transformers.trainer":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _slow(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if FIRST_STEP_S > 0 or SAVE_S > 0 or SLOW_TO > 0:
    sys.meta_path.insert(0, _AfterTrainerImport())

"""Ctrl-C reaches the launcher even when it was started with SIGINT ignored (background of a script, CI)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.validation import backends

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not (backends.importable("deepspeed") and backends.importable("llamafactory")),
    reason="needs the real classes: their imports keep validation busy long enough to interrupt it",
)


def test_sigint_during_validation_exits_1_although_inherited_ignored(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != backends.BUILTIN_ENV}
    env["MIFT_CACHE_DIR"] = str(tmp_path)  # empty: the real classes are imported, which takes seconds
    proc = subprocess.Popen(
        [
            "/bin/sh",
            "-c",
            f'trap "" INT; exec "{sys.executable}" -m launcher validate configs/jobs/tiny-lora-z3.yaml',
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(2)
    assert proc.poll() is None, "validation ended before the SIGINT: nothing was tested"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, out + err
    assert err.strip().splitlines()[-1] == "interrupted"

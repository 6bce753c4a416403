#!/usr/bin/env python3
"""amd-smi TEST DOUBLE (mift test rig) - NOT AMD SOFTWARE: ``amd-smi metric --json`` with fault modes.

Installed by the tests as ``/usr/local/bin/amd-smi`` on a test host (ahead of the AMD repository test double's
``/opt/rocm/bin/amd-smi`` in PATH, so no image rebuild is needed); every other ``amd-smi`` command is handed
to that one. ``metric --json`` prints the document in ``DOC_FILE`` (written by the test:
``mift_testsupport.gpu_telemetry.metric_document``, the values of a real capture), changed by the mode in
``MODE_FILE`` (one line, read on every call, so a test switches modes mid-run):

* ``ok`` (or no file): the document as it is;
* ``ecc-rising N``: from the N-th call on, GPU 3's uncorrectable ECC count is 1 (the time of the first such
  answer is written to ``STATE_DIR/rose-at``);
* ``gone N``: from the N-th call on, GPU 7 is missing;
* ``hang``: sleeps until killed, with a child that sleeps too, as a tool stuck in the driver would;
* ``fail``: exits 1 with one line on stderr.

Standard library only (the test hosts' python3).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

MODE_FILE = Path(os.environ.get("MIFT_AMD_SMI_MODE_FILE", "/etc/mift-testdouble/amd-smi-mode"))
DOC_FILE = Path(os.environ.get("MIFT_AMD_SMI_DOC_FILE", "/etc/mift-testdouble/amd-smi-metric.json"))
STATE_DIR = Path(os.environ.get("MIFT_AMD_SMI_STATE_DIR", "/run/mift-testdouble"))
REAL_DOUBLE = "/opt/rocm/bin/amd-smi"
ECC_GPU = 3
GONE_GPU = 7


def _calls() -> int:
    """Count this call; return how many calls of ``metric --json`` there were, this one included."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    counter = STATE_DIR / "calls"
    try:
        count = int(counter.read_text()) + 1
    except (OSError, ValueError):
        count = 1
    counter.write_text(f"{count}\n")
    return count


def main(argv: list[str]) -> int:
    """Answer ``metric --json`` by the mode; hand anything else to the repository test double."""
    if argv != ["metric", "--json"]:
        if os.access(REAL_DOUBLE, os.X_OK):
            os.execv(REAL_DOUBLE, [REAL_DOUBLE, *argv])  # noqa: S606 - the other test double, argv as given
        print(f"TEST DOUBLE (mift): no capture of 'amd-smi {' '.join(argv)}'", file=sys.stderr)
        return 127
    words = (MODE_FILE.read_text().split() if MODE_FILE.is_file() else []) or ["ok"]
    mode, after = words[0], int(words[1]) if len(words) > 1 and words[1].isdigit() else 1
    count = _calls()
    if mode == "hang":  # a hung tool with a helper process of its own: its caller must kill both
        subprocess.Popen(["sleep", "100000"], stdin=subprocess.DEVNULL)
        os.execvp("sleep", ["sleep", "100000"])  # noqa: S606 - a hung tool: killed by its caller
    if mode == "fail":
        print("TEST DOUBLE (mift): amd-smi failed (mode fail)", file=sys.stderr)
        return 1
    doc = json.loads(DOC_FILE.read_text())
    gpus = doc["gpu_data"]
    if mode == "ecc-rising" and count >= after:
        gpus[ECC_GPU]["ecc"]["total_uncorrectable_count"] = 1
        rose = STATE_DIR / "rose-at"
        if not rose.exists():
            rose.write_text(f"{time.time():.3f}\n")
    if mode == "gone" and count >= after:
        doc["gpu_data"] = [g for g in gpus if g["gpu"] != GONE_GPU]
    print(json.dumps(doc, indent=4))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

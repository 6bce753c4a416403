"""A file the shipped key lists reject is reported without importing DeepSpeed or LLaMA-Factory.

Each case runs in a fresh interpreter so that ``sys.modules`` tells whether the heavy libraries were imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from launcher.validation import backends

REPO = Path(__file__).resolve().parents[2]
SEED = REPO / "tests" / "fixtures" / "seed" / "ds_seed.json"
GOOD = REPO / "configs" / "deepspeed" / "ds_z3.json"

pytestmark = pytest.mark.skipif(
    not (backends.importable("deepspeed") and backends.importable("llamafactory"))
    or not backends.shipped_lists_match_installed(),
    reason="needs DeepSpeed and LLaMA-Factory of the versions the shipped key lists come from",
)

PROBE = """
import json, sys
from pathlib import Path
from launcher.validation import backends, validate_file
if sys.argv[2] == "mismatch":
    backends.shipped_lists_match_installed = lambda: False
report = validate_file(Path(sys.argv[1]))
print(json.dumps({"ok": report.ok, "keys": [p.key for p in report.problems if p.is_error],
                  "deepspeed_imported": "deepspeed" in sys.modules}))
"""


def probe(path: Path, mode: str = "match") -> dict[str, object]:
    with tempfile.TemporaryDirectory() as cache:  # an empty cache of the real classes' verdicts
        out = subprocess.run(
            [sys.executable, "-c", PROBE, str(path), mode],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
            env={**os.environ, "MIFT_CACHE_DIR": cache},
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_seed_typo_is_rejected_without_importing_deepspeed() -> None:
    result = probe(SEED)
    assert result["ok"] is False
    assert "zero_optimization.stage3_parition_grads" in result["keys"]  # type: ignore[operator]
    assert result["deepspeed_imported"] is False


def test_a_file_the_lists_accept_is_checked_with_the_real_classes() -> None:
    result = probe(GOOD)
    assert result == {"ok": True, "keys": [], "deepspeed_imported": True}


def test_lists_of_other_versions_give_no_fast_answer() -> None:
    result = probe(SEED, "mismatch")
    assert result["ok"] is False
    assert "zero_optimization.stage3_parition_grads" in result["keys"]  # type: ignore[operator]
    assert result["deepspeed_imported"] is True

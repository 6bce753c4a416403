"""Every LLaMA-Factory example (YAML and DeepSpeed JSON) passes; accelerate configs are recognised."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.validation import ConfigKind, validate_file

EXAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "llamafactory-examples" / "examples"
FILES = sorted(p for p in EXAMPLES.rglob("*") if p.suffix in (".yaml", ".json")) if EXAMPLES.is_dir() else []

pytestmark = pytest.mark.skipif(not FILES, reason="LLaMA-Factory examples fixture not present")


def test_all_examples_pass(builtin):
    reports = [validate_file(p, builtin=builtin) for p in FILES]
    failed = [str(p) for r in reports for p in r.problems if p.is_error]
    assert failed == []
    kinds = [r.kind for r in reports]
    assert len(reports) == 32
    assert kinds.count(ConfigKind.ACCELERATE) == 6
    assert kinds.count(ConfigKind.DEEPSPEED) == 7
    assert kinds.count(ConfigKind.LLAMAFACTORY) == 19
    assert all(r.validated for r in reports if r.kind is not ConfigKind.ACCELERATE)

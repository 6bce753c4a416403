"""Shared fixtures of the unit tests."""

from __future__ import annotations

import pytest

from launcher.validation import backends


@pytest.fixture(
    params=[
        pytest.param(
            False,
            id="real",
            marks=pytest.mark.skipif(
                not (backends.importable("deepspeed") and backends.importable("llamafactory")),
                reason="DeepSpeed/LLaMA-Factory not installed",
            ),
        ),
        pytest.param(True, id="builtin"),
    ]
)
def builtin(request: pytest.FixtureRequest) -> bool:
    """Validate with DeepSpeed's and LLaMA-Factory's own classes (``real``) or the shipped key lists."""
    return bool(request.param)

"""Shared fixtures of the unit tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from launcher.validation import backends

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture(autouse=True, scope="session")
def _private_validation_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keep the real classes' cached verdicts (launcher.validation.cache) out of the user's cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("MIFT_CACHE_DIR", str(tmp_path_factory.mktemp("mift-cache")))
    yield
    mp.undo()


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

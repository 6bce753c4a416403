"""Choose between the tools' own config classes and the shipped built-in key lists.

The real classes are used when importable; ``MIFT_VALIDATE_BUILTIN=1`` (or ``builtin=True``) forces the
built-in lists, which is how the fallback is tested without uninstalling anything.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import logging
import os
from typing import TYPE_CHECKING

from launcher.validation.cache import installed_version

if TYPE_CHECKING:
    from collections.abc import Iterator

BUILTIN_ENV = "MIFT_VALIDATE_BUILTIN"


def builtin_forced(builtin: bool | None = None) -> bool:
    """Return True when the built-in lists must be used (argument first, then the environment)."""
    if builtin is not None:
        return builtin
    return os.environ.get(BUILTIN_ENV, "") not in ("", "0")


def importable(module: str) -> bool:
    """Return True when ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


@contextlib.contextmanager
def quiet_import() -> Iterator[None]:
    """Swallow what a heavy library prints while it is imported, and keep its loggers quiet after.

    DeepSpeed logs "Setting accelerator to CPU" to stdout at import; validation output must stay
    one line per problem.
    """
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield
    for name in ("DeepSpeed", "llamafactory", "transformers"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.ERROR)
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is sink:
                handler.setStream(io.StringIO())


@functools.cache
def shipped_lists_match_installed() -> bool:
    """Return True when the shipped key lists come from the DeepSpeed, LLaMA-Factory and transformers versions
    installed here, so that what they reject the real classes reject too.

    Reads package metadata only: nothing heavy is imported.
    """
    from launcher.validation.deepspeed_schema import shipped_schema as ds_schema  # noqa: PLC0415
    from launcher.validation.llamafactory_schema import shipped_schema as lf_schema  # noqa: PLC0415

    ds, lf = ds_schema(), lf_schema()
    return (
        installed_version("deepspeed") == ds.version
        and installed_version("llamafactory") == lf.version
        and installed_version("transformers") == lf.transformers_version
    )

"""Choose between the tools' own config classes and the shipped built-in key lists.

The real classes are used when importable; ``MIFT_VALIDATE_BUILTIN=1`` (or ``builtin=True``) forces the
built-in lists, which is how the fallback is tested without uninstalling anything.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import TYPE_CHECKING

from launcher.validation.cache import installed_version
from launcher.validation.deepspeed_schema import shipped_schema as ds_schema
from launcher.validation.llamafactory_schema import shipped_schema as lf_schema

if TYPE_CHECKING:
    pass

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


@functools.cache
def shipped_lists_match_installed() -> bool:
    """Return True when the shipped key lists come from the DeepSpeed, LLaMA-Factory and transformers versions
    installed here, so that what they reject the real classes reject too.

    Reads package metadata only: nothing heavy is imported.
    """
    ds, lf = ds_schema(), lf_schema()
    return (
        installed_version("deepspeed") == ds.version
        and installed_version("llamafactory") == lf.version
        and installed_version("transformers") == lf.transformers_version
    )

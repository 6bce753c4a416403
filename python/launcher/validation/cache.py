"""The controller's cache of what DeepSpeed's and LLaMA-Factory's own classes said about a config.

Importing those classes (torch, transformers) takes 5-50 s; their verdict on a config depends only on the
config's content and the installed versions. Each verdict is stored as JSON under
``$MIFT_CACHE_DIR/validation/`` (default ``$XDG_CACHE_HOME/mift-launcher``, else ``~/.cache/mift-launcher``),
keyed by the SHA-256 of (what was checked, the content, the versions of deepspeed, llamafactory, transformers,
torch and pydantic, and the launcher's validation code). A hit imports nothing heavy. An unreadable or corrupt
entry is a miss; a cache that cannot be written is skipped (the check still runs).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")
CACHE_ENV = "MIFT_CACHE_DIR"
DISTRIBUTIONS = ("deepspeed", "llamafactory", "transformers", "torch", "pydantic")
# the code whose answers are cached: a change to it invalidates every entry
_CODE = ("deepspeed.py", "deepspeed_schema.py", "llamafactory.py", "llamafactory_schema.py", "schema.py")


def cache_root() -> Path:
    """Return the launcher's cache folder on the controller (``$MIFT_CACHE_DIR``, else the XDG default)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mift-launcher"


def cache_dir() -> Path:
    """Return the folder of cached verdicts."""
    return cache_root() / "validation"


def installed_version(dist: str) -> str | None:
    """Return the installed version of ``dist`` (package metadata only), or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def environment_key() -> str:
    """Return what a verdict depends on besides the content: package versions and the validation code."""
    here = Path(__file__).parent
    code = hashlib.sha256()
    for name in _CODE:
        code.update((here / name).read_bytes())
    versions = {dist: installed_version(dist) for dist in DISTRIBUTIONS}
    return json.dumps({"versions": versions, "code": code.hexdigest()}, sort_keys=True)


def _key(what: str, content: object) -> str:
    text = json.dumps([what, content, environment_key()], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _read(path: Path) -> Any:  # noqa: ANN401 - a stored JSON value
    try:
        return json.loads(path.read_text(encoding="utf-8"))["value"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, value: object) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"value": value}, fh)
        Path(tmp).replace(path)
    except OSError:
        return


def cached(
    what: str,
    content: object,
    compute: Callable[[], T],
    *,
    encode: Callable[[T], object] = lambda v: v,
    decode: Callable[[Any], T] = lambda v: v,
) -> T:
    """Return ``compute()``'s verdict on ``content``, from the cache when the same check ran before.

    Args:
        what: which check (part of the key).
        content: the checked content (JSON-serialisable; other values by ``repr``).
        compute: runs the check (imports the heavy classes).
        encode: the verdict as JSON; ``decode`` turns it back.
    """
    path = cache_dir() / f"{_key(what, content)}.json"
    stored = _read(path)
    if stored is not None:
        try:
            return decode(stored)
        except (KeyError, TypeError, ValueError):
            pass
    value = compute()
    _write(path, encode(value))
    return value

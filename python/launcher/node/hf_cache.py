"""The Hugging Face hub cache's layout, read the same way on the controller (staging a cached model) and on
the nodes (preflight's offline check): where the cache is and which snapshot folder a revision names.
Standard library only (part of the node program)."""

from __future__ import annotations

import os
from pathlib import Path


def hub_cache(cache: object = None) -> Path:
    """The hub cache: ``cache`` when given (the job's), else ``$HF_HUB_CACHE``, ``$HF_HOME/hub`` or the
    default ``~/.cache/huggingface/hub``."""
    if isinstance(cache, str) and cache:
        return Path(cache)
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(home) / "hub"


def repo_folder(repo: str, cache: object = None) -> Path:
    """The cache folder of a model repo (``models--ORG--NAME``; it may not exist)."""
    return hub_cache(cache) / f"models--{repo.replace('/', '--')}"


def snapshot_folder(root: Path, revision: str) -> Path:
    """The snapshot folder ``revision`` names in a repo folder: the commit its ref holds, or the revision
    itself taken as a commit (it may not exist)."""
    ref = root / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    return root / "snapshots" / commit

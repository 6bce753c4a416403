"""Print the sha256 of a source tree (paths and contents, sorted) for the wheel_cache key.

Run on the controller by the wheel_cache role for ``wheel_cache_source_type: path``. Skips build output and
VCS/cache directories so that a build in place does not change the key.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

SKIP = {".git", "__pycache__", "build", "dist", ".eggs", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def tree_hash(root: Path) -> str:
    """Return the hex sha256 over the relative paths and bytes of every file under root."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in SKIP or part.endswith(".egg-info") for part in rel.parts) or not path.is_file():
            continue
        digest.update(str(rel).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


if __name__ == "__main__":
    print(tree_hash(Path(sys.argv[1])))

"""Nearest-valid-key suggestions for unknown keys and bad choices."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable


def nearest(word: str, candidates: Iterable[str], cutoff: float = 0.6) -> str | None:
    """Return the candidate closest to ``word`` (difflib ratio at least ``cutoff``), or None."""
    pool = list(candidates)
    found = difflib.get_close_matches(word, pool, n=1, cutoff=cutoff)
    if not found:
        # Typos in long snake_case names often hide in one part: compare without separators too.
        squashed = {c.replace("_", ""): c for c in pool}
        found = difflib.get_close_matches(word.replace("_", ""), list(squashed), n=1, cutoff=cutoff)
        return squashed[found[0]] if found else None
    return found[0]


def unknown_key_message(word: str, candidates: Iterable[str], what: str = "unknown key") -> str:
    """Return ``unknown key; did you mean 'x'?`` (the hint only when something is close)."""
    near = nearest(word, candidates)
    return f"{what}; did you mean {near!r}?" if near else what

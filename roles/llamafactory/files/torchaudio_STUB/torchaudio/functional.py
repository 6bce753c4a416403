"""STUB of torchaudio.functional (see torchaudio/__init__.py): every call raises."""

from __future__ import annotations


def resample(*args: object, **kwargs: object) -> None:
    """Raise: audio inputs are not supported with the torchaudio stub."""
    raise RuntimeError("torchaudio stub (mift): audio inputs are not supported in this environment")

"""STUB of torchaudio, installed by the mift llamafactory role only when llamafactory_torchaudio: stub.

This is NOT torchaudio. LLaMA-Factory 0.9.5 imports torchaudio at module level
(llamafactory/data/mm_plugin.py) but uses it only for audio inputs (torchaudio.load,
torchaudio.functional.resample). No torchaudio wheel matches torch 2.13.0+cpu (the newest, 2.11.1,
fails with "Could not load this library _torchaudio.so"), so on CPU test hosts this stub satisfies the
import and every real audio use raises. See docs/stack.md.
"""

from __future__ import annotations

__version__ = "0.0.0+mift.stub"
MIFT_STUB = True


def load(*args: object, **kwargs: object) -> None:
    """Raise: audio inputs are not supported with the torchaudio stub."""
    raise RuntimeError("torchaudio stub (mift): audio inputs are not supported in this environment")


from . import functional  # noqa: E402,F401

"""Probe the node Python stack and print one JSON object (stack_check role; run with the venv python).

Reports torch (version, cuda available, HIP/CUDA versions, device count), the versions of the stack's
distributions (None when absent), whether the imports work, and DeepSpeed's installed ops.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import platform
import sys
import warnings
from typing import Any

DISTS = (
    "torch",
    "deepspeed",
    "llamafactory",
    "flash_attn",
    "transformers",
    "datasets",
    "accelerate",
    "peft",
    "trl",
)
IMPORTS = {"deepspeed": "deepspeed", "llamafactory": "llamafactory", "flash_attn": "flash_attn"}


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def probe() -> dict[str, Any]:
    """Collect the stack's state."""
    warnings.filterwarnings("ignore")
    import torch  # noqa: PLC0415  (imported here so the probe reports, not crashes)

    out: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": bool(torch.cuda.is_available()),
        "hip": getattr(torch.version, "hip", None),
        "cuda": torch.version.cuda,
        "device_count": int(torch.cuda.device_count()),
        "versions": {dist: _version(dist.replace("_", "-")) or _version(dist) for dist in DISTS},
        "imports": {},
    }
    for name, module in IMPORTS.items():
        try:
            importlib.import_module(module)
            out["imports"][name] = "ok"
        except Exception as exc:
            out["imports"][name] = f"error: {type(exc).__name__}: {exc}"[:300]
    try:
        import torchaudio  # noqa: PLC0415  (may be absent or the stub)

        out["torchaudio"] = getattr(torchaudio, "__version__", None)
        out["torchaudio_stub"] = bool(getattr(torchaudio, "MIFT_STUB", False))
    except Exception:
        out["torchaudio"] = None
        out["torchaudio_stub"] = False
    try:
        from deepspeed.git_version_info import installed_ops  # noqa: PLC0415  (may be absent)

        out["deepspeed_installed_ops"] = sorted(op for op, built in installed_ops.items() if built)
    except Exception:
        out["deepspeed_installed_ops"] = []
    return out


if __name__ == "__main__":
    json.dump(probe(), sys.stdout, sort_keys=True)
    sys.stdout.write("\n")

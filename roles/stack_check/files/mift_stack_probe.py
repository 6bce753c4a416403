"""Probe the node Python stack and print one JSON object (stack_check role; run with the venv python).

Reports torch (version, cuda available, HIP/CUDA versions, device count), the versions of the stack's
distributions (``--dists``, the node layout's list; None when absent), whether the imports work, and
DeepSpeed's installed ops. With ``--gpu-matmul`` (ROCm and CUDA nodes) it also multiplies a 512x512 float32
matrix on every visible GPU and compares the result with the CPU's, so that a GPU torch lists but cannot run
kernels on is found before the first job.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import json
import platform
import sys
import warnings
from typing import Any

MATMUL_SIZE = 512
MATMUL_TOLERANCE = 1e-2  # TF32/rocBLAS vs CPU float32 sums of 512 products of N(0,1) values

IMPORTS = {"deepspeed": "deepspeed", "llamafactory": "llamafactory", "flash_attn": "flash_attn"}


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def gpu_matmul(torch: Any) -> list[dict[str, Any]]:  # noqa: ANN401 - the torch module
    """One small matmul per visible GPU, checked against the CPU result; never raises."""
    results: list[dict[str, Any]] = []
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=generator)
    want = a @ a
    for index in range(int(torch.cuda.device_count())):
        entry: dict[str, Any] = {"device": index, "name": None, "ok": False, "error": None}
        try:
            entry["name"] = torch.cuda.get_device_name(index)
            device = torch.device("cuda", index)
            got = (a.to(device) @ a.to(device)).cpu()
            torch.cuda.synchronize(device)
            diff = float((got - want).abs().max())
            entry["ok"] = diff <= MATMUL_TOLERANCE * float(want.abs().max())
            if not entry["ok"]:
                entry["error"] = f"result differs from the CPU's by {diff:.3g}"
        except Exception as exc:  # a broken GPU raises HIP/CUDA errors of many types
            entry["error"] = f"{type(exc).__name__}: {exc}"[:300]
        results.append(entry)
    return results


def probe(dists: list[str], *, matmul: bool = False) -> dict[str, Any]:
    """Collect the stack's state; ``dists``: the distributions whose versions are reported (the node layout's
    ``mift_defaults_stack_packages``, passed by the role)."""
    warnings.filterwarnings("ignore")
    import torch  # noqa: PLC0415  (imported here so the probe reports, not crashes)

    out: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": bool(torch.cuda.is_available()),
        "hip": getattr(torch.version, "hip", None),
        "cuda": torch.version.cuda,
        "device_count": int(torch.cuda.device_count()),
        "gpu_matmul": gpu_matmul(torch) if matmul and torch.cuda.is_available() else [],
        "versions": {dist: _version(dist.replace("_", "-")) or _version(dist) for dist in dists},
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


def main(argv: list[str]) -> int:
    """``mift_stack_probe.py --dists torch,deepspeed,... [--gpu-matmul]``: print the probe's JSON object."""
    parser = argparse.ArgumentParser(prog="mift_stack_probe.py", description=__doc__.splitlines()[0])
    parser.add_argument("--dists", required=True, help="comma-separated distributions to report")
    parser.add_argument("--gpu-matmul", action="store_true", help="one checked matmul per visible GPU")
    args = parser.parse_args(argv)
    dists = [d for d in args.dists.split(",") if d]
    json.dump(probe(dists, matmul=args.gpu_matmul), sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

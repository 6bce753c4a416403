#!/usr/bin/env python3
"""The per-node GPU part of ``launcher check``: bf16 matmul TFLOP/s and memory copy bandwidth of every GPU of
this node, against thresholds.

Standard library and torch only (``torch.cuda`` is HIP on ROCm): run with the trainer's interpreter, alone on
the node (a process already on a GPU is reported, and skews the numbers). Prints one JSON line::

    {"ok": true, "backend": "cuda", "gpus": [{"gpu": 0, "name": "...", "tflops": 790.1, "membw_gbs": 4310.2}],
     "tflops": 790.1, "membw_gbs": 4310.2, "problems": [], "wall_s": 3.2, "allocated_after_mib": 0.0,
     "reserved_after_mib": 0.0, "processes": [], "thresholds": {...}}

``tflops`` and ``membw_gbs`` at the top are the node's slowest GPU. A GPU is bad when it is below an absolute
floor (``--min-tflops``, ``--min-membw-gbs``; 0 = none) or below ``--slow-fraction`` of the node's best GPU (a
GPU slower than its siblings). The copy bandwidth counts bytes read and written, as a device-to-device copy
moves them. After the measurement every tensor is freed and the cache emptied; ``allocated_after_mib`` and
``reserved_after_mib`` say what the allocator still holds (0 when nothing is left), the process's own context
goes when it exits. Exit code 0 when ok, 1 otherwise.

    VENV/bin/python3 mift_node.pyz gpu-check [--size 8192] [--iters 50] [--copy-mib 1024] [--min-tflops X] ...
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

MATMUL_SIZE = 8192  # n of the n x n x n bf16 product: well past launch overhead, data several times the L2
MATMUL_ITERS = 50
COPY_MIB = 1024  # the copy's buffer: far larger than any L2 or Infinity Cache
COPY_ITERS = 20
WARMUP = 3
# a GPU below this fraction of the node's best GPU (TFLOP/s or bandwidth) is slow
SLOW_FRACTION = 0.8
# device files a process of a GPU holds open (the same pattern as mift_gpu.GPU_DEVICE_RE; a unit test holds
# them equal: this script travels alone)
GPU_DEVICE_RE = re.compile(r"^/dev/(kfd|dri/renderD\d+|nvidia\d+)$")
MIB = 2**20


def judge(
    gpus: list[dict[str, Any]],
    *,
    min_tflops: float = 0.0,
    min_membw_gbs: float = 0.0,
    slow_fraction: float = SLOW_FRACTION,
) -> list[str]:
    """Return one line per bad GPU (below a floor, or below ``slow_fraction`` of the node's best); [] when all
    are good. A GPU whose measurement failed (``error``) is bad; no GPU at all is bad."""
    if not gpus:
        return ["no GPU visible to torch"]
    problems = [f"GPU {g['gpu']}: {g['error']}" for g in gpus if g.get("error")]
    measured = [g for g in gpus if not g.get("error")]
    for key, floor, unit, label in (
        ("tflops", min_tflops, "TFLOP/s", "bf16 matmul"),
        ("membw_gbs", min_membw_gbs, "GB/s", "memory copy"),
    ):
        best = max((float(g[key]) for g in measured), default=0.0)
        for g in measured:
            value = float(g[key])
            if floor > 0 and value < floor:
                problems.append(f"GPU {g['gpu']}: {label} {value:.0f} {unit} below the floor {floor:.0f}")
            elif len(measured) > 1 and value < slow_fraction * best:
                problems.append(
                    f"GPU {g['gpu']}: {label} {value:.0f} {unit} below {slow_fraction:.0%} of the best GPU's "
                    f"{best:.0f}"
                )
    return problems


def gpu_processes(proc_root: Path = Path("/proc"), exclude: int | None = None) -> list[str]:
    """Return ``pid (name)`` for every process (but ``exclude``) holding a GPU device file open."""
    found = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit() or int(entry.name) == exclude:
            continue
        try:
            targets = [str(fd.readlink()) for fd in (entry / "fd").iterdir()]
        except OSError:
            continue
        if any(GPU_DEVICE_RE.match(t) for t in targets):
            try:
                name = (entry / "comm").read_text().strip()
            except OSError:
                name = "?"
            found.append(f"{entry.name} ({name})")
    return found


def measure_gpu(index: int, size: int, iters: int, copy_mib: int) -> dict[str, Any]:
    """Return one GPU's bf16 matmul TFLOP/s and copy bandwidth (GB/s, bytes read + written)."""
    import torch  # noqa: PLC0415 - the module stays importable without torch (unit tests of judge)

    device = torch.device("cuda", index)
    result: dict[str, Any] = {"gpu": index, "name": torch.cuda.get_device_name(index)}
    with torch.cuda.device(device):
        a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        c = torch.empty(size, size, device=device, dtype=torch.bfloat16)
        for _ in range(WARMUP):
            torch.matmul(a, b, out=c)
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        for _ in range(iters):
            torch.matmul(a, b, out=c)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1000
        result["tflops"] = round(2 * size**3 * iters / seconds / 1e12, 1)
        del a, b, c
        src = torch.empty(copy_mib * MIB, device=device, dtype=torch.uint8).fill_(1)
        dst = torch.empty_like(src)
        for _ in range(WARMUP):
            dst.copy_(src)
        start.record()
        for _ in range(COPY_ITERS):
            dst.copy_(src)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1000
        result["membw_gbs"] = round(2 * src.numel() * COPY_ITERS / seconds / 1e9, 1)
        del src, dst
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every GPU; return the JSON line's object."""
    began = time.monotonic()
    others = gpu_processes(exclude=os.getpid())
    import torch  # noqa: PLC0415

    hip, cuda = getattr(torch.version, "hip", None), getattr(torch.version, "cuda", None)
    backend = "rocm" if hip else "cuda" if cuda else "cpu"  # cpu: a build without a GPU backend
    gpus: list[dict[str, Any]] = []
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for index in range(count):
        try:
            gpus.append(measure_gpu(index, args.size, args.iters, args.copy_mib))
        except RuntimeError as err:  # out of memory, a GPU that fails: named, the others still measured
            gpus.append({"gpu": index, "error": str(err).splitlines()[0][:200]})
    allocated = reserved = 0.0
    for index in range(count):
        with torch.cuda.device(index):
            clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            if clear is not None:  # cuBLAS keeps its workspace in the caching allocator (32 MiB on an H200)
                clear()
            torch.cuda.empty_cache()
        allocated += torch.cuda.memory_allocated(index) / MIB
        reserved += torch.cuda.memory_reserved(index) / MIB
    problems = [f"process on a GPU before the check: {p}" for p in others]
    problems += judge(
        gpus,
        min_tflops=args.min_tflops,
        min_membw_gbs=args.min_membw_gbs,
        slow_fraction=args.slow_fraction,
    )
    good = [g for g in gpus if not g.get("error")]
    return {
        "ok": not problems,
        "backend": backend,
        "gpus": gpus,
        "tflops": min((g["tflops"] for g in good), default=None),
        "membw_gbs": min((g["membw_gbs"] for g in good), default=None),
        "problems": problems,
        "wall_s": round(time.monotonic() - began, 2),
        "allocated_after_mib": round(allocated, 1),
        "reserved_after_mib": round(reserved, 1),
        "processes": others,
        "thresholds": {
            "min_tflops": args.min_tflops,
            "min_membw_gbs": args.min_membw_gbs,
            "slow_fraction": args.slow_fraction,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size", type=int, default=MATMUL_SIZE, help="n of the n x n x n bf16 matmul")
    parser.add_argument("--iters", type=int, default=MATMUL_ITERS, help="timed matmuls per GPU")
    parser.add_argument("--copy-mib", type=int, default=COPY_MIB, help="the copy's buffer in MiB")
    parser.add_argument("--min-tflops", type=float, default=0.0, help="floor per GPU (0: none)")
    parser.add_argument("--min-membw-gbs", type=float, default=0.0, help="floor per GPU (0: none)")
    parser.add_argument("--slow-fraction", type=float, default=SLOW_FRACTION, help="of the node's best GPU")
    result = run(parser.parse_args(argv))
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

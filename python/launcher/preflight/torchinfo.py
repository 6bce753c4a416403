"""What a node's torch reports (preflight's ``mift_torch_probe.py``): CUDA or ROCm build, GPU count, memory.

The launcher was written for ROCm nodes that ``provision.yml`` verified (``ansible_local.mift_gpus``:
gfx942 MI300X; ``mift_stack``: the ROCm stack). On a node where torch reports CUDA (``torch.version.hip`` is
None, ``torch.version.cuda`` set) those provisioning facts do not apply: the ROCm-specific checks are skipped
with one note, and the GPU count and memory come from torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

GIB = 1024**3


def torch_backend(info: Mapping[str, Any] | None) -> str | None:
    """Return ``"rocm"``, ``"cuda"`` or ``"cpu"`` from a torch probe; None when torch could not be asked."""
    if not info or info.get("error") or not info.get("torch"):
        return None
    if info.get("hip"):
        return "rocm"
    if info.get("cuda"):
        return "cuda"
    return "cpu"


def torch_gpu_count(info: Mapping[str, Any] | None) -> int | None:
    """Return the number of GPUs torch sees (None: no probe)."""
    if torch_backend(info) is None or info is None:
        return None
    count = info.get("device_count")
    return count if isinstance(count, int) and not isinstance(count, bool) else None


def torch_gpu_mem_gib(info: Mapping[str, Any] | None) -> float | None:
    """Return the smallest GPU's total memory in GiB as torch reports it (None: no GPU seen)."""
    devices = (info or {}).get("devices")
    if not isinstance(devices, list):
        return None
    sizes = [
        d["total_memory"]
        for d in devices
        if isinstance(d, dict) and isinstance(d.get("total_memory"), int) and d["total_memory"] > 0
    ]
    return round(min(sizes) / GIB, 2) if sizes else None


def cuda_hosts(hosts: Sequence[str], torch_by_host: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Return the hosts whose torch reports CUDA, in rank order; refuse a job mixing CUDA and ROCm nodes."""
    backends = {h: torch_backend(torch_by_host.get(h)) for h in hosts}
    cuda = [h for h in hosts if backends[h] == "cuda"]
    rocm = [h for h in hosts if backends[h] == "rocm"]
    if cuda and rocm:
        raise ConfigurationError(
            f"{rocm[0]}: torch reports ROCm but {cuda[0]}: torch reports CUDA; a job runs on one kind of GPU"
        )
    return cuda


def torch_stack(info: Mapping[str, Any]) -> dict[str, Any]:
    """Return a ``mift_stack``-like fact from a torch probe (compared across nodes instead of mift_stack)."""
    return {
        "backend": torch_backend(info),
        "source": "torch probe (no mift_stack fact)",
        "versions": {"torch": info.get("torch"), "cuda": info.get("cuda")},
    }


def cuda_note(hosts: Sequence[str], torch_by_host: Mapping[str, Mapping[str, Any]]) -> str:
    """Return the one note printed when the job's nodes run CUDA torch."""
    first = torch_by_host[hosts[0]]
    devices = first.get("devices") or []
    name = devices[0].get("name") if devices and isinstance(devices[0], dict) else "no GPU"
    mem = torch_gpu_mem_gib(first)
    where = hosts[0] if len(hosts) == 1 else f"{hosts[0]} (+{len(hosts) - 1} more)"
    size = f" ({mem:.1f} GiB)" if mem else ""
    return (
        f"{where}: torch {first.get('torch')} reports CUDA {first.get('cuda')} (torch.version.hip is None), "
        f"{torch_gpu_count(first)} x {name}{size}: ROCm-specific checks skipped (gfx942 GPU verification, "
        "the mift_gpus/mift_stack facts of provision.yml); GPU count and memory from torch"
    )

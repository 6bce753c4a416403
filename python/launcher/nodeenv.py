"""Render the per-node environment of a job: torchrun's rendezvous variables plus the job's extra env."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.exceptions import ConfigurationError
from launcher.jobspec import mask_env

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from launcher.jobspec import JobSpec

# LLaMA-Factory keeps model and data local; never reach out to the hub from a training node
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def gpu_count(gpus_fact: Mapping[str, object]) -> int | None:
    """Return the verified GPU count from the ``mift_gpus`` local fact, or None when it has none."""
    if gpus_fact.get("verified") is False:
        return None
    for key in ("count", "gpu_count", "num_gpus"):
        value = gpus_fact.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.isdigit():
            return int(value)
    listed = gpus_fact.get("gpus")
    return len(listed) if isinstance(listed, list) else None


def resolve_nproc(
    spec: JobSpec,
    gpus_by_host: Mapping[str, Mapping[str, object]],
    hosts: Sequence[str],
    stacks: Mapping[str, Mapping[str, object]],
) -> int:
    """Return processes per node: the spec's value, else the verified GPU count (identical on every node)."""
    if spec.nproc_per_node is not None:
        return spec.nproc_per_node
    cpu = [h for h in hosts if stacks.get(h, {}).get("backend") == "cpu"]
    if cpu:
        raise ConfigurationError(
            f"{cpu[0]}: cpu backend (no GPU to count): set nproc_per_node in the job spec"
        )
    counts = {host: gpu_count(gpus_by_host.get(host, {})) for host in hosts}
    missing = [h for h, c in counts.items() if not c]
    if missing:
        raise ConfigurationError(
            f"{missing[0]}: no verified GPUs (ansible_local.mift_gpus): set nproc_per_node in the job spec "
            "(required on CPU nodes)"
        )
    if len(set(counts.values())) > 1:
        listing = ", ".join(f"{h}: {c}" for h, c in counts.items())
        raise ConfigurationError(
            f"verified GPU counts differ ({listing}): set nproc_per_node in the job spec"
        )
    return next(iter(counts.values())) or 1


def render_node_env(
    spec: JobSpec,
    *,
    hosts: Sequence[str],
    master_addr: str,
    nproc_per_node: int,
    run_id: str,
) -> dict[str, dict[str, str]]:
    """Return host -> environment for the trainer (values in clear; mask before recording)."""
    extra = {**OFFLINE_ENV, **spec.env_strings()}
    out: dict[str, dict[str, str]] = {}
    for rank, host in enumerate(hosts):
        out[host] = {
            **extra,
            "NNODES": str(len(hosts)),
            "NODE_RANK": str(rank),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(spec.master_port),
            "NPROC_PER_NODE": str(nproc_per_node),
            "FORCE_TORCHRUN": "1",
            "MIFT_RUN_ID": run_id,
        }
    return out


def masked(envs: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, str]]:
    """Return the per-node environments with secret values masked (for the run record)."""
    return {host: mask_env(dict(env)) for host, env in envs.items()}

"""Render the per-node environment of a job: torchrun's rendezvous variables plus the job's extra env."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.exceptions import ConfigurationError
from launcher.preflight.torchinfo import cuda_hosts, torch_gpu_count
from launcher.spec.jobspec import mask_env

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from launcher.spec.jobspec import JobSpec

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
    torch_by_host: Mapping[str, Mapping[str, Any]] | None = None,
) -> int:
    """Return processes per node: the spec's value, else the GPU count (identical on every node).

    The count is the verified one (``mift_gpus``, ROCm nodes) or, on a node whose torch reports CUDA, the
    number of GPUs torch sees.
    """
    if spec.nproc_per_node is not None:
        return spec.nproc_per_node
    torch_by_host = torch_by_host or {}
    cuda = set(cuda_hosts(hosts, torch_by_host))
    cpu = [h for h in hosts if h not in cuda and stacks.get(h, {}).get("backend") == "cpu"]
    if cpu:
        raise ConfigurationError(
            f"{cpu[0]}: cpu backend (no GPU to count): set nproc_per_node in the job spec"
        )
    counts = {
        host: torch_gpu_count(torch_by_host.get(host))
        if host in cuda
        else gpu_count(gpus_by_host.get(host, {}))
        for host in hosts
    }
    no_cuda_gpu = [h for h in hosts if h in cuda and not counts[h]]
    if no_cuda_gpu:
        raise ConfigurationError(
            f"{no_cuda_gpu[0]}: torch reports CUDA but sees no GPU: set nproc_per_node in the job spec or "
            "check CUDA_VISIBLE_DEVICES"
        )
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


def provisioned_env(flash_attn_fact: Mapping[str, object] | None) -> dict[str, str]:
    """Return the environment provisioning says a trainer on the node needs (``mift_flash_attn`` local fact).

    The flash_attn role records ``runtime_env``: flash-attn's Triton backend is only used when
    ``FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE`` is set at run time, not only at build time (otherwise
    ``flash_attn`` imports the CK extension, absent from a Triton build). A fact written before
    ``runtime_env`` existed still gets the variable when its backend is ``triton``.
    """
    fact = flash_attn_fact or {}
    if fact.get("enabled") not in (True, "true", "True"):
        return {}
    runtime = fact.get("runtime_env")
    env = {str(k): str(v) for k, v in runtime.items()} if isinstance(runtime, dict) else {}
    if fact.get("backend") == "triton":
        env.setdefault("FLASH_ATTENTION_TRITON_AMD_ENABLE", "TRUE")
    return env


# AMD's run-time settings for MI300X (docs/stack.md "MI300X run-time settings" gives the source of
# each), exported on ROCm nodes under the inventory's mift_node_env and the job spec's env (both win);
# the inventory's mift_mi300x_env changes or drops one (null or "" drops it).
MI300X_ENV: Mapping[str, str] = {
    # RCCL channels for end-to-end workloads on 8 MI300X (ROCm workload.rst); set only on 8-GPU nodes: RCCL's
    # usage tips give 32 for fewer GPUs
    "NCCL_MIN_NCHANNELS": "112",
    "HSA_OVERRIDE_CPU_AFFINITY_DEBUG": "0",  # ROCm workload.rst
    "TORCH_BLAS_PREFER_HIPBLASLT": "1",  # hipBLASLt before rocBLAS for torch's GEMMs (ROCm workload.rst)
}
MI300X_CHANNELS_GPUS = 8
# PyTorch TunableOp (opt-in, mift_tunableop): "tune" records the fastest GEMM solutions of this node's
# GPUs in a file kept between runs (PyTorch inserts the GPU ordinal into the name), "use" reads it
# without tuning again.
TUNABLEOP_MODES = ("off", "tune", "use")
TUNABLEOP_FILE = "/var/lib/mift/tunableop/tunableop_results.csv"


def is_rocm_node(stack: Mapping[str, object]) -> bool:
    """Whether the node's recorded stack (``mift_stack``) is ROCm's."""
    return stack.get("backend") == "rocm" or bool(stack.get("hip"))


def mi300x_env(
    host: str,
    *,
    stack: Mapping[str, object],
    gpus: Mapping[str, object],
    overrides: Mapping[str, object] | None = None,
    tunableop: object = "",
) -> dict[str, str]:
    """Return AMD's MI300X run-time settings for one node ({} on a node without ROCm).

    ``overrides`` is the inventory's ``mift_mi300x_env`` (a value replaces the default, null or "" drops it);
    ``tunableop`` the inventory's ``mift_tunableop`` (off, tune, use; empty: off).
    """
    mode = str(tunableop or "off")
    if mode not in TUNABLEOP_MODES:
        raise ConfigurationError(
            f"{host}: mift_tunableop {tunableop!r} is not one of {', '.join(TUNABLEOP_MODES)}"
        )
    if not isinstance(overrides or {}, dict):
        raise ConfigurationError(f"{host}: mift_mi300x_env must be a mapping of variable -> value")
    if not is_rocm_node(stack):
        return {}
    env = dict(MI300X_ENV)
    if gpu_count(gpus) != MI300X_CHANNELS_GPUS:
        env.pop("NCCL_MIN_NCHANNELS")
    if mode != "off":
        env.update(
            PYTORCH_TUNABLEOP_ENABLED="1",
            PYTORCH_TUNABLEOP_TUNING="1" if mode == "tune" else "0",
            PYTORCH_TUNABLEOP_FILENAME=TUNABLEOP_FILE,
        )
    for name, value in (overrides or {}).items():
        if value is None or value == "":
            env.pop(str(name), None)
        else:
            env[str(name)] = str(value)
    return env


def render_node_env(
    spec: JobSpec,
    *,
    hosts: Sequence[str],
    master_addr: str,
    nproc_per_node: int,
    run_id: str,
    node_env: Mapping[str, Mapping[str, object]] | None = None,
    fabric_env: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, dict[str, str]]:
    """Return host -> environment for the trainer (values in clear; mask before recording).

    ``fabric_env`` is each host's NCCL/Gloo variables derived from its facts (:mod:`launcher.fabric.env`);
    ``node_env`` each host's environment from provisioning (:func:`provisioned_env`) under its inventory
    ``mift_node_env`` (e.g. PYTHONPATH of a ``pip --target`` stack) wins over it; the job spec's ``env`` wins
    over both, the launcher's rendezvous variables over all.
    """
    extra = {**OFFLINE_ENV, **spec.env_strings()}
    out: dict[str, dict[str, str]] = {}
    for rank, host in enumerate(hosts):
        inventory_env = {str(k): str(v) for k, v in ((node_env or {}).get(host) or {}).items()}
        out[host] = {
            **dict((fabric_env or {}).get(host) or {}),
            **inventory_env,
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

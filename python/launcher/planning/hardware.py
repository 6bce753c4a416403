"""What one GPU and its links can do: peak bf16 compute and the bandwidths that collectives run over.

Every number is a per-GPU, per-direction figure, with its source. ``efficiency_scale`` carries the measured
H200 efficiency (see :mod:`launcher.planning.speed`) over to another GPU; it is 1.0 on the H200 by definition.

MI300X (all unmeasured here; the project had no MI300X to run on):

- peak bf16 1307.4 TFLOPS dense: ROCm docs, "AMD Instinct MI300 series microarchitecture"
  (docs/conceptual/gpu-arch/mi300.md, table "Peak-performance capabilities of the MI300X": Matrix BF16 2048
  FLOPS/clock/CU, 1307.4 TFLOPS); HBM3 5.3 TB/s (same page).
- intra-node 336 GB/s: the same page, "seven high-bandwidth, low-latency AMD Infinity Fabric links ... to form
  a fully connected 8-GPU system"; RCCL models each gfx94x xGMI link at 48 GB/s per direction "after protocol
  and error correction overheads" (ROCm/rccl issue #1210, ``ncclTopoXGMISpeed``; the MI300X platform data
  sheet says 128 GB/s bidirectional per link): 7 x 48 = 336 GB/s per GPU.
- inter-node 48 GB/s: one 400 Gb/s NIC per GPU (ROCm docs, "vLLM distributed inference with MoRI": "8x NVIDIA
  Mellanox ConnectX-7 (CX7) NICs per node, providing a dedicated 1:1 mapping between GPUs and network
  interfaces"; Pollara 400 / Thor 2 in the MI355X guides); a 400G NIC delivers "up to 48-49GB/s"
  (NVIDIA/nccl-tests issue #267). Check: :func:`launcher.planning.speed.collective_seconds` with these two
  numbers gives 89.5 ms for a 17.2 GB all-reduce over 2 x 8 MI300X; ROCm/rccl PR #2078 measured 89.2 ms
  (Pollara 400 NICs, busbw 361 GB/s).
- host link 50 GB/s: PCIe Gen5 x16 (ROCm docs above: "The MI300X OAMs attach to the host system via PCIe Gen 5
  x16 links"), 63 GB/s per direction on paper, 80% assumed achievable.
- efficiency_scale 0.56: a single-GPU comparison with the same software on both
  (alpharomercoma/MI300X-vs-H200, REPORT.md: "Training, 8B, BF16: H200 1.32x to 1.40x" faster although the
  MI300X's paper bf16 peak is 1.32x the H200's): 1 / (1.32 x 1.36) = 0.56 of the H200's fraction of peak.
  Third-party, one stack; re-measure.

H200 (the lent machine; only one GPU, so no link was measured):

- peak bf16 989.4 TFLOPS dense (H100/H200 SXM; the same report's specification table), HBM3e 4.8 TB/s.
- intra-node 370 GB/s: NVLink 4, 450 GB/s per direction on paper; an 8-GPU DGX reaches "nearly 370 GB/s" of
  all-reduce bus bandwidth in a single node (NVIDIA/nccl-tests issue #309).
- inter-node 48 GB/s and host link 50 GB/s: as above (400G NIC per GPU, PCIe Gen5 x16).
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.exceptions import ConfigurationError
from launcher.planning.memory import Cluster


@dataclass(frozen=True)
class Accelerator:
    """One GPU model: peak bf16 compute and the per-GPU, per-direction bandwidths of its links."""

    name: str
    peak_bf16_tflops: float
    hbm_tbs: float
    intra_node_gbs: float  # collective bus bandwidth between the GPUs of one node
    inter_node_gbs: float  # per GPU, through its NIC
    host_link_gbs: float  # GPU <-> host RAM (offload copies)
    efficiency_scale: float = 1.0  # achieved fraction of peak relative to the H200 measurements
    measured: bool = False  # whether the speed constants were measured on this GPU

    @property
    def peak_flops(self) -> float:
        """Return peak dense bf16 FLOP/s."""
        return self.peak_bf16_tflops * 1e12


MI300X = Accelerator(
    name="MI300X",
    peak_bf16_tflops=1307.4,
    hbm_tbs=5.3,
    intra_node_gbs=7 * 48.0,
    inter_node_gbs=48.0,
    host_link_gbs=50.0,
    efficiency_scale=0.56,
)
H200 = Accelerator(
    name="H200",
    peak_bf16_tflops=989.4,
    hbm_tbs=4.8,
    intra_node_gbs=370.0,
    inter_node_gbs=48.0,
    host_link_gbs=50.0,
    measured=True,
)
ACCELERATORS = {a.name.lower(): a for a in (MI300X, H200)}


@dataclass(frozen=True)
class NodePreset:
    """One node of a kind: GPUs, usable memory per GPU and host RAM (GiB); what ``plan --hardware``
    assumes and what a run falls back to when preflight learnt no GPU memory."""

    gpus: int
    gpu_mem_gib: float
    host_mem_gib: float

    def cluster(self, nodes: int = 1) -> Cluster:
        """Return ``nodes`` such nodes as the planner's cluster."""
        return Cluster(nodes, self.gpus, self.gpu_mem_gib, self.host_mem_gib)


NODE_PRESETS = {
    "mi300x": NodePreset(8, 191.98, 1536.0),  # rocminfo pool 201,310,208 KB; typical 8x MI300X host RAM
    "h200": NodePreset(1, 140.4, 125.0),  # the lent H200 machine: nvidia-smi 143771 MiB, 128 GiB RAM
}
# a node whose GPU memory preflight did not learn (no mift_gpus fact, no torch answer): one MI300X's
DEFAULT_GPU_MEM_GIB = NODE_PRESETS["mi300x"].gpu_mem_gib


def accelerator_named(name: str, default: Accelerator | None = None) -> Accelerator:
    """Return the accelerator whose name appears in ``name`` (e.g. "AMD Instinct MI300X", "NVIDIA H200").

    An unknown name returns ``default`` when one is given (the CPU test hosts: plan with the MI300X model,
    whose reason says its speeds are unmeasured), else is a ConfigurationError.
    """
    lowered = name.lower()
    for key, accelerator in ACCELERATORS.items():
        if key in lowered:
            return accelerator
    if default is not None:
        return default
    raise ConfigurationError(
        f"GPU {name!r}: no speed model (known: {', '.join(a.name for a in ACCELERATORS.values())})"
    )

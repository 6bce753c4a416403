"""Per-GPU and per-host memory of one training strategy, component by component.

Byte counts per parameter (P = all parameters, T = trainable, N = GPUs in the job, n = nodes, g = GPUs/node):

- weights: frozen bf16 2 B. Without DeepSpeed LLaMA-Factory upcasts trainable params to fp32 (4 B); with
  DeepSpeed the engine keeps bf16 weights and the fp32 copy lives in the optimizer. ZeRO-3 divides by N.
- gradients: without DeepSpeed fp32 4 B per trainable param. With DeepSpeed 4 B per trainable param, as
  DeepSpeed's own estimator counts them (ZeRO-2/-3 divide them by N; optimizer offload moves them to host).
- optimizer: Adam m and v, 8 B; with DeepSpeed plus the fp32 master copy, 12 B (/N for ZeRO; host with
  offload). DeepSpeed's estimator (``estimate_zero3_model_states_mem_needs``) is exactly 2 + 4 + 12 = 18 B
  per param for full fine-tuning plus ``4 x largest module`` gathered: :attr:`Estimate.model_states`.
- activations with gradient checkpointing (LLaMA-Factory's default): each layer's bf16 input is stored
  (``tokens x hidden x 2 x layers``), one layer is recomputed at a time, and the loss holds the logits
  (bf16 logits, fp32 upcast, log-softmax and its gradient: ~14 B per token per vocab entry). Without
  checkpointing every layer keeps its activations. ``tokens = micro_batch x cutoff_len`` (the worst case).
- buffers: ZeRO-2 reduce/all-gather buckets; ZeRO-3 the gathered working set (4 x the largest module, as
  DeepSpeed counts, plus the reuse window of parameters it keeps gathered when they are sharded or
  offloaded) and the prefetch/reduce buckets.
- parameter offload on ONE GPU (measured, docs/gpu-results.md): with LLaMA-Factory 0.9.5, DeepSpeed
  0.19.8 and gradient checkpointing on one H200, ``offload_param`` did not lower the GPU peak: torch's
  peak allocation was the whole bf16 model plus 0.6-0.9 GiB, byte-identical for
  ``stage3_max_live_parameters`` / ``stage3_max_reuse_distance`` of 1e8/1e8, 1e9/0 and 1e9/1e9 (the
  gathered parameters stay resident for the step). The planner counts the whole bf16 model on the GPU
  for param offload when the job has one GPU (``Z3_OFFLOAD_RESIDENT_1GPU``). With several GPUs it uses
  DeepSpeed's design (only the gathered working set is resident); that case is not measured here.
- runtime: CUDA/HIP context, kernels, cuBLAS workspaces and allocator slack, a constant calibrated on the
  H200 (see ``RUNTIME_GIB``).
- host per node: each rank's process (torch, libraries, tokenizer, dataset; ``HOST_RANK_GIB``), the
  checkpoint shards in flight while loading, and with offload the pinned optimizer states (16 B per
  trainable param / n) and bf16 parameters (2 B per param / n).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from launcher.planning.model import ModelShape

GIB = 1024**3
# a strategy or split fits when its estimate x (1 + margin) <= capacity: the planner's default
# (launcher.planning.training: plan: auto and the fixed split of plan: as_written) and `plan --margin`'s
SAFETY_MARGIN = 0.10
# after an attempt ran out of GPU memory, a plan: auto run is planned again with the margin raised by this
# much (per out-of-memory failure): the estimates were within 6% of every measured peak (docs/gpu-results.md),
# so a plan that ran out met something the model does not hold; one step of 10 points asks for a clearly
# smaller plan without ruling out every split at once (launcher.planning.training.replan_after_oom)
OOM_MARGIN_STEP = 0.10
# CUDA context + loaded kernels + cuBLAS workspace + caching-allocator slack, measured on one H200
# (torch 2.11, cu130): 3B-shape LoRA without DeepSpeed peaked at 7779 MiB with 5417 MiB of weights,
# 186 MiB of LoRA state and ~800 MiB of activations (gpu-lab README); the bench confirms it
# (docs/gpu-results.md: estimates within 6% of every measured peak).
RUNTIME_GIB = 1.3
# Caching allocator fragmentation on activations (blocks of many sizes are freed and re-used per step).
ACTIVATION_SLACK = 1.15
# Without gradient checkpointing the per-layer count of layer_activation_bytes_per_token is the whole
# peak: the measured slope over micro-batches is 0.97 of it without DeepSpeed, and 0.83 under DeepSpeed
# (ZeRO-2), on the H200 (8B shape, micro-batch 4 and 8 without DeepSpeed, 8 with ZeRO-2;
# bench/gpu/results/grid1/, docs/planner.md "Calibration without checkpointing"); checked out of sample on
# 8B micro-batch 16 and 3B 4/8/16 (0.99-1.03).
# ZeRO-3 without checkpointing peaked far higher (3B micro-batch 16: 107,249 MiB measured): 1.49 of the count,
# fitted on that one run (bench/gpu/results/grid3/), in-sample only; every ZeRO-3 variant takes it.
NO_CHECKPOINTING_SLACK = 0.97
NO_CHECKPOINTING_SLACK_DEEPSPEED = 0.83
NO_CHECKPOINTING_SLACK_ZERO3 = 1.49
# LLaMA-Factory's enable_liger_kernel (liger-kernel 0.8.5: fused RMSNorm, SwiGLU, RoPE, cross-entropy) without
# checkpointing: the activation peak measured 0.79 of the estimate's activation term on the H200 (8B and 3B
# micro-batch 16 without DeepSpeed: 0.793 and 0.792; 8B ZeRO-2: 0.746, so the estimate is 5% high there;
# bench/gpu/results/grid4/, grid5/). With checkpointing it is unmeasured and no saving is assumed.
LIGER_ACTIVATION_FACTOR = 0.79
# Resident memory of one training rank on the host (python, torch with CUDA/ROCm libraries, tokenizer,
# the tokenized dataset, dataloader).
HOST_RANK_GIB = 4.0
# Bytes per token per vocabulary entry held by the loss: bf16 logits 2 + fp32 upcast 4 + log-softmax 4 +
# its gradient 4.
LOGIT_BYTES = 14
# Bytes per head per key that eager attention keeps per token: the fp32 softmax output (4, saved by softmax
# for its backward; transformers' eager_attention_forward upcasts to fp32) and its bf16 copy (2, saved by
# the matmul with V).
EAGER_ATTENTION_BYTES = 6
# DeepSpeed ZeRO-3 knobs the planner writes (see launcher.planning.dsconfig): parameters whose next use lies
# within this many elements stay gathered; at most this many elements are gathered ahead.
Z3_MAX_REUSE_DISTANCE = 1_000_000_000
Z3_MAX_LIVE_PARAMETERS = 1_000_000_000
# Fraction of the bf16 weights resident on the GPU at the step's peak with offload_param on one GPU (measured
# 0.96-1.0 on the H200 for 3B and 7B shapes; DeepSpeed's design value would be ~0).
Z3_OFFLOAD_RESIDENT_1GPU = 1.0
# ZeRO-2 all-gather bucket (elements, LLaMA-Factory's ds_z2 config).
Z2_ALLGATHER_BUCKET = 500_000_000


class Strategy(Enum):
    """The strategies the planner compares, fastest first (see :data:`SPEED_RANK`)."""

    NONE = "none"
    ZERO2 = "zero2"
    ZERO3 = "zero3"
    ZERO3_OFFLOAD_OPT = "zero3_offload_opt"
    ZERO3_OFFLOAD_ALL = "zero3_offload_all"

    @property
    def label(self) -> str:
        """Return the human name used in tables."""
        return LABELS[self]

    @property
    def is_deepspeed(self) -> bool:
        """Return True when the strategy runs under DeepSpeed."""
        return self is not Strategy.NONE

    @property
    def zero3(self) -> bool:
        """Return True for ZeRO stage 3 (parameters sharded)."""
        return self in (Strategy.ZERO3, Strategy.ZERO3_OFFLOAD_OPT, Strategy.ZERO3_OFFLOAD_ALL)

    @property
    def offload_optimizer(self) -> bool:
        """Return True when optimizer states and gradients live in host memory."""
        return self in (Strategy.ZERO3_OFFLOAD_OPT, Strategy.ZERO3_OFFLOAD_ALL)

    @property
    def offload_params(self) -> bool:
        """Return True when the bf16 parameters live in host memory between uses."""
        return self is Strategy.ZERO3_OFFLOAD_ALL

    @property
    def checkpoint_layout(self) -> str:
        """Return what a checkpoint of this strategy holds: ``none`` (the Trainer's own ``optimizer.pt``),
        ``zero2`` or ``zero3`` (DeepSpeed's per-rank ZeRO files of that stage). Offload is where the states
        live while training, not how they are saved: a ZeRO-3 checkpoint resumes with or without it at the
        same world size; a checkpoint of another stage does not (docs/launcher.md "Recovery")."""
        return "zero3" if self.zero3 else self.value


LABELS = {
    Strategy.NONE: "no DeepSpeed (DDP)",
    Strategy.ZERO2: "ZeRO-2",
    Strategy.ZERO3: "ZeRO-3",
    Strategy.ZERO3_OFFLOAD_OPT: "ZeRO-3 + optimizer offload",
    Strategy.ZERO3_OFFLOAD_ALL: "ZeRO-3 + optimizer + param offload",
}
# Fastest first. Measured on one H200, LoRA r8, micro-batch 2, cutoff 1024 (docs/gpu-results.md), tokens/s:
#   3B: none 2351, ZeRO-2 1740, ZeRO-3 588, + opt offload 728, + opt+param offload 620
#   7B: none 3552, ZeRO-2 954, ZeRO-3 553, + opt offload 616, + opt+param offload 599
# no DeepSpeed is fastest; ZeRO-2 next (whole bf16 weights on every GPU, gradients and optimizer sharded);
# the three ZeRO-3 variants are within 25% of each other on one GPU with LoRA (the CPU Adam step on a few
# million LoRA params is cheap), with offload also costing pinned host RAM and, unless the op is prebuilt,
# ~45 s of cpu_adam JIT build at start. With several GPUs ZeRO-3 all-gathers every layer twice per step and
# param offload adds host-to-device copies per step, so ZeRO-3 stays ahead of its offload variants here.
SPEED_RANK = (
    Strategy.NONE,
    Strategy.ZERO2,
    Strategy.ZERO3,
    Strategy.ZERO3_OFFLOAD_OPT,
    Strategy.ZERO3_OFFLOAD_ALL,
)


@dataclass(frozen=True)
class Workload:
    """What is trained and how: the parts of the training YAML that memory depends on."""

    model: ModelShape
    finetuning: str  # "lora" or "full" ("freeze" is planned as full: an upper bound)
    lora_rank: int = 8
    lora_targets: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    micro_batch: int = 1
    cutoff_len: int = 2048
    gradient_checkpointing: bool = True
    # "sdpa" (LLaMA-Factory's flash_attn auto / sdpa) and "fa2"/"fa3" keep O(seq) per token; "eager"
    # (flash_attn: disabled) keeps each layer's attention probabilities, O(seq) per token per head.
    attention: str = "sdpa"
    lora_dropout: float = 0.0  # > 0: peft adds a Dropout per targeted module, which saves a mask and a copy
    liger: bool = False  # LLaMA-Factory's enable_liger_kernel (liger-kernel's fused Llama kernels)

    @property
    def trainable_params(self) -> int:
        """Return the parameters the optimizer updates."""
        if self.finetuning == "lora":
            return self.model.lora_params(self.lora_rank, self.lora_targets)
        return self.model.total_params()

    @property
    def frozen_params(self) -> int:
        """Return the parameters that only take part in forward/backward (the LoRA base model)."""
        return self.model.total_params() if self.finetuning == "lora" else 0


@dataclass(frozen=True)
class Cluster:
    """Where the job runs: nodes x GPUs, HBM per GPU and RAM per host."""

    nodes: int
    gpus_per_node: int
    gpu_mem_gib: float
    host_mem_gib: float

    @property
    def world(self) -> int:
        """Return the number of ranks (one per GPU)."""
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Estimate:
    """Bytes per GPU (and per host) of one strategy, by component."""

    strategy: Strategy
    weights: float
    gradients: float
    optimizer: float
    activations: float
    buffers: float
    runtime: float
    host: float
    gathered_largest: float = 0.0  # part of ``buffers``: DeepSpeed's 4 x largest module

    @property
    def gpu_total(self) -> float:
        """Return the estimated peak bytes on one GPU."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.buffers + self.runtime

    @property
    def model_states(self) -> float:
        """Return weights + gradients + optimizer + gathered largest module (what DeepSpeed estimates)."""
        return self.weights + self.gradients + self.optimizer + self.gathered_largest


def layer_activation_bytes_per_token(
    m: ModelShape, *, attention: str = "sdpa", seq: int = 0, lora_dropout_modules: tuple[str, ...] = ()
) -> int:
    """Return the bytes one decoder layer keeps per token for backward (bf16; RMSNorm saves fp32 inputs).

    Per token: norm outputs, q/k/v, rotary q/k, repeated k/v, attention output, residuals
    (9 x hidden + 3 x kv) and the MLP's gate, up, activation and product (4 x intermediate), at 2 B
    each; plus the two RMSNorms' fp32 inputs (8 x hidden). ``eager`` attention also keeps, per head,
    the fp32 softmax output and its bf16 copy over ``seq`` keys (6 B x heads x seq; sdpa and
    flash-attention recompute them in backward). Each LoRA module with dropout keeps its input's dropout
    mask (1 B) and the dropped copy (2 B) per input feature.
    """
    per_token = (9 * m.hidden + 3 * m.kv_dim + 4 * m.intermediate) * 2 + 8 * m.hidden
    if attention == "eager":
        per_token += EAGER_ATTENTION_BYTES * m.heads * seq
    shapes = m.linear_shapes()
    per_token += sum(3 * shapes[t][0] for t in lora_dropout_modules)
    return per_token


def activation_bytes(w: Workload, s: Strategy | None = None) -> float:
    """Return the activation peak of one micro-batch on one GPU (``s``: the strategy, None: no DeepSpeed)."""
    tokens = w.micro_batch * w.cutoff_len
    m = w.model
    dropout = w.lora_targets if w.finetuning == "lora" and w.lora_dropout > 0 else ()
    per_layer = (
        layer_activation_bytes_per_token(
            m, attention=w.attention, seq=w.cutoff_len, lora_dropout_modules=dropout
        )
        * tokens
    )
    logits = tokens * m.vocab * LOGIT_BYTES
    if w.gradient_checkpointing:
        stored = tokens * m.hidden * 2 * m.layers
        body = stored + per_layer  # one layer recomputed at a time
        return (body + logits) * ACTIVATION_SLACK
    if s is not None and s.zero3:
        slack = NO_CHECKPOINTING_SLACK_ZERO3
    elif s is not None and s.is_deepspeed:
        slack = NO_CHECKPOINTING_SLACK_DEEPSPEED
    else:
        slack = NO_CHECKPOINTING_SLACK
    liger = LIGER_ACTIVATION_FACTOR if w.liger else 1.0
    return (per_layer * m.layers + logits) * slack * liger


def _split(w: Workload, s: Strategy, c: Cluster) -> tuple[float, float, float]:
    """Return (weights, gradients, optimizer) bytes per GPU before offload."""
    trainable, frozen = w.trainable_params, w.frozen_params
    n = c.world
    if not s.is_deepspeed:
        # HF Trainer: frozen bf16, trainable upcast to fp32 (LLaMA-Factory), fp32 grads, Adam m + v
        return frozen * 2 + trainable * 4, trainable * 4.0, trainable * 8.0
    weights = (frozen + trainable) * 2.0
    grads = trainable * 4.0
    optim = trainable * 12.0
    if s.zero3:
        return weights / n, grads / n, optim / n
    return weights, grads / n, optim / n  # ZeRO-2


def _buffers(w: Workload, s: Strategy, c: Cluster) -> tuple[float, float]:
    """Return (buffer bytes, gathered-largest-module bytes) per GPU."""
    m = w.model
    h2 = m.hidden * m.hidden
    trainable = w.trainable_params
    if s is Strategy.ZERO2:
        # reduce bucket (auto = hidden^2) bf16 + fp32, all-gather bucket bf16; lazily sized to what exists
        return min(trainable, h2) * 6.0 + min(trainable, Z2_ALLGATHER_BUCKET) * 2.0, 0.0
    if not s.zero3:
        return 0.0, 0.0
    largest = 4.0 * m.largest_module_params()  # DeepSpeed's estimator: gathered bf16 params + their grads
    total = m.total_params()
    # parameters kept gathered between uses; none when one GPU holds every shard and nothing is offloaded
    resident = total / c.world if not s.offload_params or c.world == 1 else 0
    not_resident = total - resident
    window = min(not_resident, Z3_MAX_REUSE_DISTANCE + Z3_MAX_LIVE_PARAMETERS) * 2.0
    buckets = 0.9 * h2 * 2.0 + min(trainable, h2) * 6.0  # prefetch bucket (bf16) + reduce bucket
    return largest + window + buckets, largest


def _host(w: Workload, s: Strategy, c: Cluster) -> float:
    """Return the bytes one host needs."""
    m = w.model
    ranks = c.gpus_per_node
    load = 4.0 * m.largest_module_params() * ranks  # checkpoint shards in flight per rank while loading
    host = HOST_RANK_GIB * GIB * ranks + load
    if s.offload_optimizer:
        host += w.trainable_params * 16.0 / c.nodes  # fp32 master + m + v + fp32 grads, pinned
    if s.offload_params:
        host += m.total_params() * 2.0 / c.nodes  # bf16 parameter partitions, pinned
    return host


def estimate(w: Workload, s: Strategy, c: Cluster) -> Estimate:
    """Return the memory estimate of strategy ``s`` for workload ``w`` on cluster ``c``."""
    weights, grads, optim = _split(w, s, c)
    if s.offload_optimizer:
        grads, optim = 0.0, 0.0
    if s.offload_params:
        # measured on one GPU: the gathered bf16 weights stay resident (see the module docstring)
        weights = weights * Z3_OFFLOAD_RESIDENT_1GPU if c.world == 1 else 0.0
    buffers, gathered = _buffers(w, s, c)
    runtime = RUNTIME_GIB * GIB
    return Estimate(
        strategy=s,
        weights=weights,
        gradients=grads,
        optimizer=optim,
        activations=activation_bytes(w, s),
        buffers=buffers,
        runtime=runtime,
        host=_host(w, s, c),
        gathered_largest=gathered,
    )

"""Predicted training speed of one plan: compute, fixed overheads, communication, optimizer step.

One optimizer step on one GPU takes ``accumulation x t_micro + t_optimizer + t_step_comm`` where

- ``t_micro = layers x (LAYER_OVERHEAD_S + strategy overhead) + FLOPs(micro-batch) / (peak x EFFICIENCY) +
  per-micro-batch communication``. The fixed part per layer is the host side of a step (Python, autograd,
  PEFT's LoRA modules, kernel launches; DeepSpeed's per-module hooks): it does not grow with the micro-batch,
  so the achieved fraction of peak (:func:`achieved_efficiency`) rises with micro-batch tokens, which is why a
  larger micro-batch with less accumulation is faster at the same global batch.
- FLOPs per token (:func:`flops_per_token`): the forward pass is 2 FLOPs per weight of every matmul (lm_head
  included, embedding lookups not) plus causal attention, 2 x seq x hidden per layer. Full fine-tuning's
  backward is twice the forward (input and weight gradients); LoRA's backward is one forward for the input
  gradients of the frozen weights plus the LoRA weights' own gradients (2 x trainable). Gradient checkpointing
  recomputes the forward once more.
- communication (:func:`collective_seconds`): ring collectives over the node's links and, between nodes, over
  one NIC per GPU, pipelined (the slower level bounds the time). Per strategy: DDP all-reduces the (fp32)
  trainable gradients once per optimizer step (no_sync while accumulating); ZeRO-2 reduce-scatters bf16
  gradients every micro-batch and all-gathers the updated bf16 trainable parameters once per step; ZeRO-3
  all-gathers every bf16 parameter once per pass (forward, backward, and the recomputation with checkpointing)
  and reduce-scatters the gradients every micro-batch; optimizer offload copies gradients to the host and
  parameters back once per step and runs Adam on the CPU; parameter offload (with more than one GPU) copies
  each GPU's parameter shard from the host once per pass. No overlap of communication with compute is assumed
  (unmeasured; conservative).
- optimizer: Adam touches ~36 B per trainable parameter it owns (fp32 weight, gradient, m, v read and written,
  bf16 weight written), bounded by HBM bandwidth on the GPU (50% achievable assumed) and by ``HOST_ADAM_GBS``
  on the host with optimizer offload.

Constants calibrated on the H200 (``launcher.planning.calibration`` fits them and prints estimate vs measured;
docs/planner.md has the table): ``EFFICIENCY`` and ``LAYER_OVERHEAD_S`` from the no-DeepSpeed runs, the
strategy overheads from the ZeRO runs. On another GPU the efficiency is scaled by
:attr:`~launcher.planning.hardware.Accelerator.efficiency_scale` (MI300X: unmeasured).
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.planning.hardware import Accelerator
from launcher.planning.memory import Cluster, Strategy, Workload

# Fraction of peak bf16 the matmul-bound part reaches at large micro-batches on the H200 (fitted).
EFFICIENCY = 0.34
# Host-side seconds per decoder layer per micro-batch without DeepSpeed (fitted on the H200).
LAYER_OVERHEAD_S = 0.0055
# Extra host-side seconds per layer per micro-batch under each DeepSpeed strategy, fitted on the H200 runs at
# micro-batch 2 with checkpointing (ZeRO-2 on its 4 runs; one constant for the 3 ZeRO-3 variants on their 16,
# which overlap on one GPU). Every measured run had accumulation 1, so per-micro-batch and per-step costs
# cannot be told apart: they are charged per micro-batch (ZeRO-3's parameter hooks do run per pass), which
# favours fewer, larger micro-batches. ZeRO-3's overhead is scaled by passes / 3 without checkpointing.
ZERO3_LAYER_OVERHEAD_S = 0.079
STRATEGY_LAYER_OVERHEAD_S = {
    Strategy.NONE: 0.0,
    # ZeRO-2: -1 ms, refitted with its steady runs without checkpointing (grid3-5; DeepSpeed's first step
    # separated: launcher.planning.calibration.DEEPSPEED_WARMUP_S_PER_BPARAM): no more host time than DDP
    Strategy.ZERO2: -0.001,
    Strategy.ZERO3: ZERO3_LAYER_OVERHEAD_S,
    Strategy.ZERO3_OFFLOAD_OPT: ZERO3_LAYER_OVERHEAD_S,
    Strategy.ZERO3_OFFLOAD_ALL: ZERO3_LAYER_OVERHEAD_S,
}
# LLaMA-Factory's enable_liger_kernel without checkpointing: steady tokens/s over the same configuration
# without it, measured on the H200 at micro-batch 16 (3B DDP 24,179 / 19,607 = 1.23; 8B ZeRO-2 15,080 /
# 12,538 = 1.20; 8B DDP 13,014 / 11,597, the latter from the probe's 4 steps = 1.12; bench/gpu/results/grid4/,
# grid5/): the compute term is divided by 1.20, the two grid-cell pairs. With checkpointing: unmeasured.
LIGER_SPEEDUP = 1.20
# Adam's bytes touched per trainable parameter and step (see module docstring), and achievable fractions.
ADAM_BYTES_PER_PARAM = 36
HBM_ACHIEVABLE = 0.5
# Host memory bandwidth CPU Adam achieves per node (GB/s). An assumption (DeepSpeedCPUAdam is memory-bound;
# DeepSpeed reports it 5-7x faster than PyTorch's CPU Adam); unmeasured.
HOST_ADAM_GBS = 100.0
# Bytes per element on the wire: DDP all-reduces fp32 gradients (LLaMA-Factory upcasts trainable parameters to
# fp32), DeepSpeed communicates bf16.
DDP_GRAD_BYTES = 4
ZERO_BYTES = 2


def passes(w: Workload) -> int:
    """Return the forward-equivalent passes over the weights per micro-batch: 2, or 3 with recomputation."""
    return 3 if w.gradient_checkpointing else 2


def flops_per_token(w: Workload) -> float:
    """Return the training FLOPs per token actually executed (recomputation included)."""
    forward = forward_flops_per_token(w)
    backward = forward + 2.0 * w.trainable_params if w.finetuning == "lora" else 2.0 * forward
    recompute = forward if w.gradient_checkpointing else 0.0
    return forward + backward + recompute


def model_flops_per_token(w: Workload) -> float:
    """Return the FLOPs per token without recomputation (what MFU counts)."""
    forward = forward_flops_per_token(w)
    return forward + (forward + 2.0 * w.trainable_params if w.finetuning == "lora" else 2.0 * forward)


def forward_flops_per_token(w: Workload) -> float:
    """Return the forward FLOPs per token: matmul weights (lm_head included) and causal attention."""
    m = w.model
    matmul = m.layers * sum(a * b for a, b in m.linear_shapes().values()) + m.hidden * m.vocab
    lora = w.trainable_params if w.finetuning == "lora" else 0
    attention = 2.0 * m.layers * w.cutoff_len * m.hidden
    return 2.0 * (matmul + lora) + attention


def collective_seconds(
    size_bytes: float, cluster: Cluster, accelerator: Accelerator, *, all_reduce: bool
) -> float:
    """Return the seconds of a reduce-scatter or all-gather (all-reduce: twice) of ``size_bytes``.

    Hierarchical ring: within a node each GPU moves ``size x (g-1)/g`` over its links, between nodes
    ``size / g x (n-1)/n`` over its NIC; the two levels are pipelined, so the slower one bounds the time.
    """
    g, n = cluster.gpus_per_node, cluster.nodes
    if g * n <= 1:
        return 0.0
    intra = size_bytes * (g - 1) / g / (accelerator.intra_node_gbs * 1e9)
    inter = size_bytes / g * (n - 1) / n / (accelerator.inter_node_gbs * 1e9)
    return (2.0 if all_reduce else 1.0) * max(intra, inter)


@dataclass(frozen=True)
class StepTime:
    """Seconds of one optimizer step on one GPU, by part."""

    compute: float
    overhead: float
    communication: float
    optimizer: float
    tokens: int  # tokens one GPU processes per optimizer step

    @property
    def total(self) -> float:
        """Return the seconds of one optimizer step."""
        return self.compute + self.overhead + self.communication + self.optimizer


def step_time(w: Workload, s: Strategy, c: Cluster, accelerator: Accelerator, accumulation: int) -> StepTime:
    """Return the predicted time of one optimizer step of micro-batch ``w.micro_batch`` x ``accumulation``."""
    m = w.model
    tokens_micro = w.micro_batch * w.cutoff_len
    efficiency = EFFICIENCY * accelerator.efficiency_scale
    compute = tokens_micro * flops_per_token(w) / (accelerator.peak_flops * efficiency)
    if w.liger and not w.gradient_checkpointing:
        compute /= LIGER_SPEEDUP
    strategy_overhead = STRATEGY_LAYER_OVERHEAD_S[s] * (passes(w) / 3 if s.zero3 else 1.0)
    overhead = m.layers * (LAYER_OVERHEAD_S + strategy_overhead)
    trainable, total = w.trainable_params, m.total_params()
    micro_comm, step_comm = 0.0, 0.0
    if s is Strategy.NONE:
        step_comm = collective_seconds(trainable * DDP_GRAD_BYTES, c, accelerator, all_reduce=True)
    elif s is Strategy.ZERO2:
        micro_comm = collective_seconds(trainable * ZERO_BYTES, c, accelerator, all_reduce=False)
        step_comm = collective_seconds(trainable * ZERO_BYTES, c, accelerator, all_reduce=False)
    else:
        gather = collective_seconds(total * ZERO_BYTES, c, accelerator, all_reduce=False)
        reduce = collective_seconds(trainable * ZERO_BYTES, c, accelerator, all_reduce=False)
        micro_comm = passes(w) * gather + reduce
        if s.offload_params and c.world > 1:
            micro_comm += passes(w) * total * ZERO_BYTES / c.world / (accelerator.host_link_gbs * 1e9)
    owned = trainable if not s.is_deepspeed else trainable / c.world
    if s.offload_optimizer:
        copies = owned * (4 + ZERO_BYTES) / (accelerator.host_link_gbs * 1e9)
        optimizer = copies + trainable / c.nodes * ADAM_BYTES_PER_PARAM / (HOST_ADAM_GBS * 1e9)
    else:
        optimizer = owned * ADAM_BYTES_PER_PARAM / (accelerator.hbm_tbs * 1e12 * HBM_ACHIEVABLE)
    return StepTime(
        compute=accumulation * compute,
        overhead=accumulation * overhead,
        communication=accumulation * micro_comm + step_comm,
        optimizer=optimizer,
        tokens=accumulation * tokens_micro,
    )


def achieved_efficiency(
    w: Workload, s: Strategy, c: Cluster, accelerator: Accelerator, accumulation: int
) -> float:
    """Return the predicted model FLOPs utilisation (MFU: no recomputation counted) of one GPU."""
    t = step_time(w, s, c, accelerator, accumulation)
    return t.tokens * model_flops_per_token(w) / (t.total * accelerator.peak_flops)


def tokens_per_second(
    w: Workload, s: Strategy, c: Cluster, accelerator: Accelerator, accumulation: int
) -> float:
    """Return the predicted training tokens per second of the whole job (every GPU)."""
    t = step_time(w, s, c, accelerator, accumulation)
    return c.world * t.tokens / t.total

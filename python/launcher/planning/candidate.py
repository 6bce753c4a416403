"""The types the planner and the probe share: a :class:`Candidate` (one strategy and :class:`Split`, its
memory and predicted speed) and what the probe measured of candidates (:class:`ProbeMeasure`,
:class:`ProbeOutcome`).

Their own module so that :mod:`launcher.planning.training` (a :class:`TrainingPlan` holds its probe's outcome)
and :mod:`launcher.planning.probe` (which runs candidates of a plan) do not import each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from launcher.planning.memory import GIB, Estimate, Strategy
from launcher.planning.speed import StepTime


@dataclass(frozen=True)
class Split:
    """How one GPU's share of the global batch is processed."""

    micro_batch: int
    accumulation: int
    checkpointing: bool
    liger: bool = False  # LLaMA-Factory's enable_liger_kernel

    def describe(self) -> str:
        """Return e.g. ``micro-batch 8 x accumulation 2, checkpointing off`` (``, liger`` when on)."""
        return (
            f"micro-batch {self.micro_batch} x accumulation {self.accumulation}, "
            f"checkpointing {'on' if self.checkpointing else 'off'}{', liger' if self.liger else ''}"
        )


@dataclass(frozen=True)
class Candidate:
    """One strategy and split: its memory, predicted speed, and whether it fits."""

    strategy: Strategy
    split: Split
    estimate: Estimate
    step: StepTime
    tokens_per_s: float  # the whole job
    mfu: float  # model FLOPs (no recomputation) / peak, per GPU
    fits_gpu: bool
    fits_host: bool

    @property
    def fits(self) -> bool:
        """Return True when both the GPU and the host estimates fit with the margin."""
        return self.fits_gpu and self.fits_host

    def describe(self) -> str:
        """Return the strategy and split in words."""
        return f"{self.strategy.label}, {self.split.describe()}"

    def as_json(self) -> dict[str, Any]:
        """Return one row of the candidate table."""
        return {
            "strategy": self.strategy.value,
            "micro_batch": self.split.micro_batch,
            "gradient_accumulation_steps": self.split.accumulation,
            "gradient_checkpointing": self.split.checkpointing,
            "liger": self.split.liger,
            "gpu_mem_gib": round(self.estimate.gpu_total / GIB, 2),
            "host_mem_gib": round(self.estimate.host / GIB, 2),
            "tokens_per_s": round(self.tokens_per_s, 1),
            "mfu": round(self.mfu, 4),
            "step_s": round(self.step.total, 4),
            "fits": self.fits,
        }

    def strategy_row(self) -> dict[str, Any]:
        """Return the candidate's memory by component (one row of the per-strategy table, ``strategies``)."""
        e = self.estimate
        return {
            "name": self.strategy.value,
            "gpu_mem_gib": round(e.gpu_total / GIB, 2),
            "host_mem_gib": round(e.host / GIB, 2),
            "fits": self.fits,
            "model_states_gib": round(e.model_states / GIB, 2),
            "components_gib": {
                k: round(getattr(e, k) / GIB, 2)
                for k in ("weights", "gradients", "optimizer", "activations", "buffers", "runtime")
            },
        }


@dataclass(frozen=True)
class ProbeMeasure:
    """What one probed candidate did on the first node."""

    candidate: Candidate
    status: str  # measured | failed | skipped
    node_tokens_per_s: float | None = None  # steady state, the first node's GPUs together
    wall_s: float | None = None  # the whole probe run, start-up included
    note: str = ""


@dataclass(frozen=True)
class ProbeOutcome:
    """Every probed candidate and the pick (None: nothing measured, the model's choice stands)."""

    measures: tuple[ProbeMeasure, ...]
    job_tokens_per_s: tuple[float | None, ...]  # per measure, the job-wide estimate from its measurement
    steps: int
    budget_s: float

    @property
    def pick(self) -> Candidate | None:
        """Return the measured candidate with the highest job tokens/s."""
        best = self._best()
        return best[1].candidate if best else None

    @property
    def pick_tokens_per_s(self) -> float | None:
        """Return the pick's job tokens/s from its measurement."""
        best = self._best()
        return best[0] if best else None

    def _best(self) -> tuple[float, ProbeMeasure] | None:
        scored = [(t, m) for m, t in zip(self.measures, self.job_tokens_per_s, strict=True) if t is not None]
        return max(scored, key=lambda tm: tm[0]) if scored else None

    def reason(self) -> str:
        """Return one paragraph: what was probed, what each measured, what won."""
        parts = []
        for m, t in zip(self.measures, self.job_tokens_per_s, strict=True):
            what = m.candidate.describe()
            if t is not None:
                parts.append(f"{what}: {t:,.0f} measured (predicted {m.candidate.tokens_per_s:,.0f})")
            else:
                parts.append(f"{what}: {m.status}{' (' + m.note + ')' if m.note else ''}")
        pick = self.pick
        head = f"Probe ({self.steps} steps each on the first node): " + "; ".join(parts) + "."
        if pick is None:
            return head + " Nothing was measured: the model's choice stands."
        return head + f" Picked by measurement: {pick.describe()}."

    def as_json(self) -> dict[str, Any]:
        """Return the probe as ``launcher plan --json`` and record.json carry it."""
        pick = self.pick
        return {
            "steps": self.steps,
            "budget_s": self.budget_s,
            "pick": pick.as_json() if pick else None,
            "runs": [
                {
                    **m.candidate.as_json(),
                    "status": m.status,
                    "predicted_tokens_per_s": round(m.candidate.tokens_per_s, 1),
                    "node_tokens_per_s": round(m.node_tokens_per_s, 1) if m.node_tokens_per_s else None,
                    "measured_tokens_per_s": round(t, 1) if t is not None else None,
                    "wall_s": round(m.wall_s, 1) if m.wall_s is not None else None,
                    "note": m.note,
                }
                for m, t in zip(self.measures, self.job_tokens_per_s, strict=True)
            ],
        }

"""The whole training plan at the user's global batch: strategy, micro-batch, accumulation, checkpointing.

The global batch (micro-batch x gradient accumulation x GPUs, from the training YAML and the cluster) is kept
exactly; the plan only re-splits it. Every candidate (each strategy x each micro-batch that divides the
per-GPU batch x gradient checkpointing on/off) gets a memory estimate (:mod:`launcher.planning.memory`) and a
predicted speed (:mod:`launcher.planning.speed`); the choice is the fastest candidate whose GPU and host
estimates, plus the safety margin, fit. Nothing that does not fit is ever chosen.

A fixed split is the same plan with one candidate split: ``fixed_split=True``
(:func:`launcher.planning.training_yaml.plan_as_written`, for
``plan: as_written``, where ``deepspeed: auto`` picks only a strategy) keeps the YAML's micro-batch,
accumulation and checkpointing, builds one candidate per strategy at that split with the same memory estimate
and margin, and picks the first that fits in the measured speed rank (:data:`SPEED_RANK`), not by predicted
tokens/s. Its ``reason()`` and ``as_json()`` are the per-strategy view (``launcher plan``'s first table).

Entry points for the engine and the CLI (the YAML's side: :mod:`launcher.planning.training_yaml`)::

    workload, accumulation = read_training_yaml(shape, train_yaml_dict)
    plan = plan_training(workload, cluster, accumulation=accumulation, accelerator=MI300X)
    plan.choice            # the chosen Candidate (None: nothing fits)
    plan.yaml_overrides()  # per_device_train_batch_size, gradient_accumulation_steps,
                           # disable_gradient_checkpointing for the run's training YAML
    plan.reason()          # one paragraph: why it won, the gain over the YAML's split, what did not fit
    plan.as_json()         # keys "strategies" and "choice" as `launcher plan --json` has them, plus the rest

    fixed = plan_as_written(shape, train_yaml_dict, cluster)   # the YAML's split, one candidate per strategy
    choose_deepspeed_config(model, train_yaml_dict, gpus_per_node, nodes, gpu_mem_gib, host_mem_gib)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from launcher.exceptions import ConfigurationError
from launcher.planning.candidate import Candidate, Split
from launcher.planning.dsconfig import deepspeed_config
from launcher.planning.hardware import MI300X, Accelerator
from launcher.planning.memory import (
    GIB,
    OOM_MARGIN_STEP,
    SAFETY_MARGIN,
    SPEED_RANK,
    Cluster,
    Strategy,
    Workload,
    estimate,
)
from launcher.planning.speed import achieved_efficiency, step_time

if TYPE_CHECKING:
    from launcher.planning.candidate import ProbeOutcome

# LLaMA-Factory's flash_attn values (0.9.5: auto, disabled, sdpa, fa2, fa3) -> the attention the memory model
# knows. "auto" leaves transformers' default, sdpa (LLaMA-Factory model_utils/attention.py).
ATTENTION = {"auto": "sdpa", "sdpa": "sdpa", "fa2": "fa2", "fa3": "fa2", "disabled": "eager", "off": "eager"}


def divisors(n: int) -> list[int]:
    """Return the divisors of ``n``, smallest first."""
    return [d for d in range(1, n + 1) if n % d == 0]


def per_gpu_batch(global_batch: int, cluster: Cluster) -> int:
    """Return the sequences each GPU processes per optimizer step; one clear line when it is not whole."""
    world = cluster.world
    if global_batch <= 0:
        raise ConfigurationError(f"global batch: expected a positive number of sequences, got {global_batch}")
    if global_batch % world:
        low, high = global_batch // world * world, (global_batch // world + 1) * world
        nearest = f"{low} or {high}" if low else f"{high}"
        raise ConfigurationError(
            f"global batch {global_batch} is not a multiple of the {world} GPUs ({cluster.nodes} node(s) x "
            f"{cluster.gpus_per_node}): nearest valid global batch {nearest} "
            f"(micro-batch x accumulation x {world})"
        )
    return global_batch // world


@dataclass(frozen=True)
class TrainingPlan:
    """Every candidate at one global batch, and the choice.

    ``fixed_split``: the candidates are the YAML's own split under each strategy (``plan: as_written``); the
    choice is the first that fits in :data:`SPEED_RANK`, and ``reason()`` / ``as_json()`` are the
    per-strategy view.
    """

    workload: Workload  # as the YAML wrote it (micro-batch, checkpointing)
    cluster: Cluster
    accelerator: Accelerator
    global_batch: int
    as_written: Split
    candidates: tuple[Candidate, ...]
    margin: float
    probe: ProbeOutcome | None = None  # set by launcher.planning.probe.run_probe: the choice is measured
    fixed_split: bool = False  # the YAML's split only: the first strategy that fits in SPEED_RANK wins

    @property
    def predicted_choice(self) -> Candidate | None:
        """Return the model's choice: the fastest predicted candidate that fits (fixed split: the first
        strategy in :data:`SPEED_RANK` that fits)."""
        fitting = [c for c in self.candidates if c.fits]
        if not fitting:
            return None
        if self.fixed_split:
            return min(fitting, key=lambda c: _rank(c.strategy))
        return max(fitting, key=lambda c: (c.tokens_per_s, c.split == self.as_written, -_rank(c.strategy)))

    @property
    def choice(self) -> Candidate | None:
        """Return the probe's measured pick when probed, else :attr:`predicted_choice`.

        Ties of the prediction: the YAML's split, then the earlier strategy.
        """
        if self.probe is not None and self.probe.pick is not None:
            return self.probe.pick
        return self.predicted_choice

    def shortlist(self, count: int = 3) -> list[Candidate]:
        """Return the ``count`` fastest candidates that fit, fastest first (what a probe should run)."""
        fitting = [c for c in self.candidates if c.fits]
        return sorted(fitting, key=lambda c: (-c.tokens_per_s, _rank(c.strategy)))[:count]

    def at_split(self, split: Split) -> list[Candidate]:
        """Return the candidates of one split, in speed-rank order of strategies."""
        return [c for c in self.candidates if c.split == split]

    @property
    def yaml_best(self) -> Candidate | None:
        """Return the fastest fitting candidate at the YAML's own split (what ``deepspeed: auto`` runs)."""
        fitting = [c for c in self.at_split(self.as_written) if c.fits]
        return max(fitting, key=lambda c: (c.tokens_per_s, -_rank(c.strategy))) if fitting else None

    @property
    def gain(self) -> float | None:
        """Return the choice's predicted tokens/s over the YAML's split (None when either is missing)."""
        choice, yaml = self.choice, self.yaml_best
        if choice is None or yaml is None:
            return None
        return choice.tokens_per_s / yaml.tokens_per_s

    def yaml_overrides(self) -> dict[str, Any]:
        """Return the training-YAML keys that apply the choice (empty when nothing fits)."""
        choice = self.choice
        if choice is None:
            return {}
        overrides: dict[str, Any] = {
            "per_device_train_batch_size": choice.split.micro_batch,
            "gradient_accumulation_steps": choice.split.accumulation,
            "disable_gradient_checkpointing": not choice.split.checkpointing,
        }
        if choice.split.liger or self.workload.liger:
            overrides["enable_liger_kernel"] = choice.split.liger
        return overrides

    def deepspeed_config(self) -> dict[str, Any] | None:
        """Return the chosen strategy's DeepSpeed JSON (None for no DeepSpeed or when nothing fits)."""
        choice = self.choice
        return deepspeed_config(choice.strategy) if choice else None

    def reason(self, verb: str = "Chose") -> str:
        """Return one paragraph: what won and why, vs the YAML's split and the faster misfits.

        ``verb`` starts the sentence naming the choice (``plan``: "plan: auto would choose" where `run` does
        not apply it)."""
        if self.fixed_split:
            return self._strategy_reason(verb)
        cap = self.cluster.gpu_mem_gib
        choice, yaml = self.choice, self.yaml_best
        unmeasured = (
            ""
            if self.accelerator.measured
            else f" Speeds are predictions, unmeasured on {self.accelerator.name} "
            "(constants fitted on the H200)."
        )
        if choice is None:
            smallest = min(self.candidates, key=lambda c: c.estimate.gpu_total)
            return (
                f"Nothing fits at global batch {self.global_batch}: the smallest, {smallest.describe()}, "
                f"needs {smallest.estimate.gpu_total / GIB:.1f} GiB per GPU (+{self.margin:.0%} margin) of "
                f"{cap:.1f}"
                f"{'' if smallest.fits_host else ' and more host RAM than the node has'}. "
                "Add GPUs or nodes, lower cutoff_len, or use LoRA."
            )
        need = choice.estimate.gpu_total * (1 + self.margin) / GIB
        text = (
            f"{verb} {choice.describe()} ({choice.split.micro_batch} x {choice.split.accumulation} x "
            f"{self.cluster.world} GPU(s) = global batch {self.global_batch}): "
            f"{choice.tokens_per_s:,.0f} tokens/s "
            f"predicted ({choice.mfu:.0%} MFU); it fits in {need:.1f} of {cap:.1f} GiB per GPU with the "
            f"{self.margin:.0%} margin."
        )
        if yaml is None:
            text += f" The YAML's own split ({self.as_written.describe()}) does not fit with any strategy."
        elif yaml is choice:
            text += " The YAML's own split is already the fastest that fits."
        else:
            text += (
                f" That is {self.gain or 0:.1f}x the YAML's split ({self.as_written.describe()}, "
                f"{yaml.strategy.label}: {yaml.tokens_per_s:,.0f} tokens/s)."
            )
        faster = [c for c in self.candidates if not c.fits and c.tokens_per_s > choice.tokens_per_s]
        if faster:
            # the one that comes closest to fitting says most about the limit
            best = min(faster, key=lambda c: c.estimate.gpu_total if not c.fits_gpu else c.estimate.host)
            where = "GPU" if not best.fits_gpu else "host"
            amount = best.estimate.gpu_total if where == "GPU" else best.estimate.host
            text += (
                f" Faster but too big, the closest: {best.describe()} ({best.tokens_per_s:,.0f} tokens/s) "
                f"needs {amount / GIB:.1f} GiB per {where}."
            )
        if self.probe is not None:
            text += " " + self.probe.reason()
        return text + unmeasured

    def _strategy_reason(self, verb: str = "Chose") -> str:
        """Return why the fixed split's strategy won: the faster strategies that do not fit, and where."""
        choice = self.choice
        skipped = []
        for c in sorted(self.candidates, key=lambda c: _rank(c.strategy)):
            if c is choice:
                break
            where = "GPU" if not c.fits_gpu else "host"
            need = c.estimate.gpu_total if where == "GPU" else c.estimate.host
            cap = self.cluster.gpu_mem_gib if where == "GPU" else self.cluster.host_mem_gib
            skipped.append(
                f"{c.strategy.label} needs {need / GIB:.1f} GiB per {where} (+{self.margin:.0%} margin) "
                f"> {cap:.1f} GiB"
            )
        lead = "; ".join(skipped) + ". " if skipped else ""
        if self.cluster.host_mem_gib <= 0:
            lead += "Host RAM unknown: host memory not checked. "
        if choice is None:
            return lead + "Nothing fits: add GPUs or nodes, lower micro-batch or cutoff_len, or use LoRA."
        faster = "it is the fastest strategy" if not skipped else "it is the fastest of those that fit"
        return (
            f"{lead}{verb} {choice.strategy.label}: {faster} "
            f"(speed order {' > '.join(s.value for s in SPEED_RANK)})."
        )

    def _strategy_json(self) -> dict[str, Any]:
        """Return the fixed split's machine-readable plan: each strategy's memory, the choice, the inputs."""
        choice, w, c = self.choice, self.workload, self.cluster
        return {
            "strategies": [
                x.strategy_row() for x in sorted(self.candidates, key=lambda x: _rank(x.strategy))
            ],
            "choice": choice.strategy.value if choice else None,
            "reason": self.reason(),
            "inputs": {
                "total_params": w.model.total_params(),
                "trainable_params": w.trainable_params,
                "finetuning": w.finetuning,
                "micro_batch": w.micro_batch,
                "cutoff_len": w.cutoff_len,
                "gradient_checkpointing": w.gradient_checkpointing,
                "nodes": c.nodes,
                "gpus_per_node": c.gpus_per_node,
                "gpu_mem_gib": c.gpu_mem_gib,
                "host_mem_gib": c.host_mem_gib,
                "margin": self.margin,
            },
        }

    def as_json(self) -> dict[str, Any]:
        """Return the machine-readable plan; ``strategies`` and ``choice`` keep their old meaning."""
        if self.fixed_split:
            return self._strategy_json()
        choice, yaml = self.choice, self.yaml_best
        strategies = [
            {**c.strategy_row(), "tokens_per_s": round(c.tokens_per_s, 1)}
            for c in self.at_split(self.as_written)
        ]
        return {
            "strategies": strategies,  # the YAML's split, one entry per strategy (as before)
            "choice": choice.strategy.value if choice else None,
            "plan": {**choice.as_json(), "yaml_overrides": self.yaml_overrides()} if choice else None,
            "as_written": yaml.as_json() if yaml else None,
            "predicted_gain": round(self.gain, 3) if self.gain else None,
            "global_batch": self.global_batch,
            "reason": self.reason(),
            "accelerator": {"name": self.accelerator.name, "measured": self.accelerator.measured},
            "candidates": [c.as_json() for c in self.candidates],
            "margin": self.margin,
            "probe": self.probe.as_json() if self.probe else None,
        }


def _rank(s: Strategy) -> int:
    return SPEED_RANK.index(s)


def plan_training(
    workload: Workload,
    cluster: Cluster,
    *,
    accumulation: int,
    global_batch: int | None = None,
    accelerator: Accelerator = MI300X,
    strategies: tuple[Strategy, ...] = SPEED_RANK,
    margin: float = SAFETY_MARGIN,
    liger: bool = False,
    fixed_split: bool = False,
) -> TrainingPlan:
    """Build every candidate at the global batch and pick the fastest that fits.

    ``workload`` holds the YAML's micro-batch and checkpointing, ``accumulation`` its gradient accumulation;
    ``global_batch`` defaults to micro-batch x accumulation x GPUs. ``strategies`` limits the search (e.g. to
    the one a job spec pins). ``liger``: the nodes have liger-kernel, so the plan may switch LLaMA-Factory's
    ``enable_liger_kernel`` on (job spec ``plan_liger``); a YAML that already enables it keeps it on.
    ``fixed_split``: the only candidate split is the YAML's own (``global_batch`` and ``liger`` must be left
    out); one candidate per strategy, the first in :data:`SPEED_RANK` that fits is the choice.
    """
    if accumulation <= 0:
        raise ConfigurationError(
            f"gradient_accumulation_steps: expected a positive integer, got {accumulation}"
        )
    as_written = Split(workload.micro_batch, accumulation, workload.gradient_checkpointing, workload.liger)
    if fixed_split:
        if global_batch is not None or liger:
            raise ValueError("plan_training: a fixed split takes no global_batch and no liger search")
        batch, splits = workload.micro_batch * accumulation * cluster.world, [as_written]
    else:
        batch = (
            global_batch if global_batch is not None else workload.micro_batch * accumulation * cluster.world
        )
        splits = _splits(per_gpu_batch(batch, cluster), liger and not workload.liger, workload.liger)
    return TrainingPlan(
        workload=workload,
        cluster=cluster,
        accelerator=accelerator,
        global_batch=batch,
        as_written=as_written,
        candidates=tuple(
            _candidate(workload, strategy, split, cluster, accelerator, margin)
            for strategy in strategies
            for split in splits
        ),
        margin=margin,
        fixed_split=fixed_split,
    )


def _splits(per_gpu: int, search_liger: bool, liger: bool) -> list[Split]:
    """Return every split of ``per_gpu`` sequences: micro-batch x accumulation x checkpointing (x liger)."""
    kernels = (False, True) if search_liger else (liger,)
    return [
        Split(micro, per_gpu // micro, checkpointing, on)
        for micro in divisors(per_gpu)
        for checkpointing in (True, False)
        for on in kernels
    ]


def replan_after_oom(plan: TrainingPlan, step: float = OOM_MARGIN_STEP) -> TrainingPlan:
    """Return the plan of the next attempt after ``plan``'s choice ran out of GPU memory.

    The planner runs again on the same inputs (workload, cluster, global batch, the strategies it could
    choose) with the margin raised by ``step``, over the candidates that need less GPU memory than the one
    that ran out (by the model: one that needs as much or more would run out too) and keep its checkpoint
    layout (:attr:`Strategy.checkpoint_layout`: the next attempt resumes from the last checkpoint). Its
    ``choice`` is None when nothing fits; :func:`out_of_memory_line` says why, with the numbers.
    """
    ran_out = plan.choice
    if ran_out is None:
        raise ValueError("replan_after_oom: the plan that ran out has no choice")
    strategies = tuple(dict.fromkeys(c.strategy for c in plan.candidates))
    again = plan_training(
        plan.workload,
        plan.cluster,
        accumulation=plan.as_written.accumulation,
        global_batch=plan.global_batch,
        accelerator=plan.accelerator,
        strategies=strategies,
        margin=plan.margin + step,
        liger=any(c.split.liger for c in plan.candidates),
    )
    smaller = tuple(
        c
        for c in again.candidates
        if c.estimate.gpu_total < ran_out.estimate.gpu_total
        and c.strategy.checkpoint_layout == ran_out.strategy.checkpoint_layout
    )
    return replace(again, candidates=smaller)


def out_of_memory_line(ran_out: Candidate, replanned: TrainingPlan) -> str:
    """Return one line with the memory numbers when nothing fits after an out-of-memory failure: what the plan
    that ran out needed (by the model) against each GPU's memory, and what the smallest plan left needs with
    the larger margin."""
    cap, margin = replanned.cluster.gpu_mem_gib, replanned.margin
    head = (
        f"out of memory with {ran_out.describe()} (the model said {ran_out.estimate.gpu_total / GIB:.1f} GiB "
        f"per GPU of {cap:.1f} GiB)"
    )
    if not replanned.candidates:
        return (
            f"{head}; no plan at global batch {replanned.global_batch} needs less GPU memory with the same "
            f"checkpoint layout ({ran_out.strategy.checkpoint_layout}): lower cutoff_len, add GPUs or nodes"
        )
    smallest = min(replanned.candidates, key=lambda c: c.estimate.gpu_total)
    need = smallest.estimate.gpu_total / GIB
    where = f"{need:.1f} GiB per GPU (+{margin:.0%} margin: {need * (1 + margin):.1f}) of {cap:.1f} GiB"
    if smallest.fits_gpu:  # it fits the GPU: the host's memory is what it lacks
        host = smallest.estimate.host / GIB
        where = (
            f"{host:.1f} GiB per host (+{margin:.0%} margin: {host * (1 + margin):.1f}) of "
            f"{replanned.cluster.host_mem_gib:.1f} GiB"
        )
    return (
        f"{head}; nothing smaller fits at global batch {replanned.global_batch} with a {margin:.0%} margin: "
        f"the smallest, {smallest.describe()}, needs {where}"
    )


def _candidate(  # noqa: PLR0917 - private helper, called once
    workload: Workload, s: Strategy, split: Split, c: Cluster, accelerator: Accelerator, margin: float
) -> Candidate:
    w = replace(
        workload,
        micro_batch=split.micro_batch,
        gradient_checkpointing=split.checkpointing,
        liger=split.liger,
    )
    e = estimate(w, s, c)
    t = step_time(w, s, c, accelerator, split.accumulation)
    return Candidate(
        strategy=s,
        split=split,
        estimate=e,
        step=t,
        tokens_per_s=c.world * t.tokens / t.total,
        mfu=achieved_efficiency(w, s, c, accelerator, split.accumulation),
        fits_gpu=e.gpu_total * (1 + margin) <= c.gpu_mem_gib * GIB,
        fits_host=c.host_mem_gib <= 0 or e.host * (1 + margin) <= c.host_mem_gib * GIB,
    )

"""The probe: a few training steps of the planner's best candidates on the first node, picked by measurement.

The model of :mod:`launcher.planning.speed` ranks every candidate; the probe runs the ``count`` fastest that
fit (:meth:`TrainingPlan.shortlist`) for a few optimizer steps each on the job's first node, measures their
steady-state tokens/s, and picks the fastest measured one. What the probe cannot see on one node, the
communication between nodes, is added from the model: a candidate's job step time is its measured step time
on the node plus the model's step time on the whole cluster minus the model's step time on one node.

Pure logic here (no processes, no files): the engine's :mod:`launcher.engine.probe` runs the candidates
through ``python -m launcher run`` and hands back what it measured as :class:`ProbeMeasure`.

Steady-state tokens/s come from LLaMA-Factory's ``trainer_log.jsonl`` with ``logging_steps: 1`` and
``include_num_input_tokens_seen: true``: each entry's ``throughput`` is ``total_tokens`` / seconds since
training began (LLaMA-Factory 0.9.5 ``LogCallback.on_log``), so the seconds at each step are
``total_tokens / throughput``, and the rate between the first logged step and the last leaves the first
step's warm-up (CUDA graphs, allocator growth, DeepSpeed's first step) out.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from launcher.planning.candidate import ProbeMeasure, ProbeOutcome
from launcher.planning.memory import Cluster
from launcher.planning.speed import step_time

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from launcher.planning.candidate import Candidate
    from launcher.planning.training import TrainingPlan

# How many candidates a probe runs: the model's choice and the best of the next strategy. 2 keeps the 8B probe
# under 2 minutes on the H200 (each run starts a trainer: ~35-45 s with 4 steps); 3 took 133 s there.
DEFAULT_CANDIDATES = 2
DEFAULT_STEPS = 4  # optimizer steps per candidate: the first is warm-up, steps 2..4 are measured
DEFAULT_BUDGET_S = 120.0  # wall seconds for the whole probe; candidates that no longer fit in it are skipped
# Another strategy's best split is probed when the model predicts it at least this share of the leader's
# tokens/s. The model's ranking of splits within one strategy matched every measured grid on the H200; its
# ranking across strategies did not (3B ZeRO-2 micro-batch 16 measured 1.17x DDP, predicted 0.56x), so the
# probe spends its runs across strategies first. 0.5 keeps that ZeRO-2 case in and ZeRO-3 (0.33) out.
OTHER_STRATEGY_SHARE = 0.5
# A candidate is not started with less budget left than this: a trainer start alone took 35-45 s on the H200
# (a run started with 8 s left measured nothing; bench/gpu/results/grid4/).
MIN_RUN_S = 30.0


class Prober(Protocol):
    """Runs one candidate for ``steps`` optimizer steps on the first node within ``timeout_s``."""

    def __call__(self, candidate: Candidate, steps: int, timeout_s: float) -> ProbeMeasure:
        """Return what the run measured (status ``failed`` with a note when it did not finish)."""
        ...


def steady_tokens_per_s(trainer_log: Iterable[Mapping[str, Any]]) -> tuple[float, int] | None:
    """Return (tokens/s between the first and last logged step, steps measured), or None with < 2 steps.

    Entries without ``throughput`` and ``total_tokens`` (``include_num_input_tokens_seen`` off) are ignored.
    """
    points: dict[int, tuple[float, float]] = {}
    for entry in trainer_log:
        step, rate, tokens = entry.get("current_steps"), entry.get("throughput"), entry.get("total_tokens")
        if not isinstance(step, int) or not _positive(rate) or not _positive(tokens):
            continue
        assert isinstance(rate, int | float) and isinstance(tokens, int | float)
        points[step] = (float(tokens), float(tokens) / float(rate))  # (tokens so far, seconds so far)
    if len(points) < 2:
        return None
    first, last = points[min(points)], points[max(points)]
    seconds = last[1] - first[1]
    if seconds <= 0 or last[0] <= first[0]:
        return None
    return (last[0] - first[0]) / seconds, max(points) - min(points)


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def job_tokens_per_s(plan: TrainingPlan, candidate: Candidate, node_tokens_per_s: float) -> float:
    """Return the job's tokens/s from one node's measurement plus the model's inter-node communication.

    Measured step seconds on the node = tokens per GPU per step / (node tokens/s / GPUs per node); the job's
    step adds ``model(cluster) - model(one node)`` (0 on one node).
    """
    c = plan.cluster
    per_gpu = node_tokens_per_s / c.gpus_per_node
    measured_step = candidate.step.tokens / per_gpu
    workload = replace(
        plan.workload,
        micro_batch=candidate.split.micro_batch,
        gradient_checkpointing=candidate.split.checkpointing,
        liger=candidate.split.liger,
    )
    one_node = Cluster(1, c.gpus_per_node, c.gpu_mem_gib, c.host_mem_gib)
    local = step_time(workload, candidate.strategy, one_node, plan.accelerator, candidate.split.accumulation)
    extra = max(0.0, candidate.step.total - local.total)
    return c.world * candidate.step.tokens / (measured_step + extra)


def probe_shortlist(plan: TrainingPlan, count: int = DEFAULT_CANDIDATES) -> list[Candidate]:
    """Return the candidates a probe runs, in order: the model's choice, then the best split of every other
    strategy predicted within :data:`OTHER_STRATEGY_SHARE` of it (fastest first), then the next fastest
    candidates overall, ``count`` in all.
    """
    fitting = plan.shortlist(len(plan.candidates))
    if not fitting:
        return []
    leader = fitting[0]
    picked = [leader]
    for c in fitting[1:]:
        if len(picked) >= count:
            break
        if c.tokens_per_s < OTHER_STRATEGY_SHARE * leader.tokens_per_s:
            break
        if all(c.strategy is not p.strategy for p in picked):
            picked.append(c)
    picked.extend(c for c in fitting if c not in picked)
    return picked[:count]


def run_probe(
    plan: TrainingPlan,
    prober: Prober,
    *,
    count: int = DEFAULT_CANDIDATES,
    steps: int = DEFAULT_STEPS,
    budget_s: float = DEFAULT_BUDGET_S,
    clock: Callable[[], float],
) -> TrainingPlan:
    """Probe ``count`` candidates (:func:`probe_shortlist`) within ``budget_s``; return the plan with it.

    Candidates run in the model's order; each gets the budget left as its timeout, and one not started
    because less than :data:`MIN_RUN_S` of it is left is ``skipped``. The returned plan's ``choice`` is the
    measured pick.
    """
    start = clock()
    measures: list[ProbeMeasure] = []
    for candidate in probe_shortlist(plan, count):
        left = budget_s - (clock() - start)
        if left < min(MIN_RUN_S, budget_s):
            measures.append(
                ProbeMeasure(candidate, "skipped", note=f"probe budget of {budget_s:.0f} s spent")
            )
            continue
        measures.append(prober(candidate, steps, left))
    rates = tuple(
        job_tokens_per_s(plan, m.candidate, m.node_tokens_per_s)
        if m.status == "measured" and m.node_tokens_per_s
        else None
        for m in measures
    )
    return replace(plan, probe=ProbeOutcome(tuple(measures), rates, steps, budget_s))

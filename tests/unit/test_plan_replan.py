"""Re-planning after out of memory: the planner's inputs -> the next attempt's plan, and the
one line with the memory numbers when nothing smaller fits."""

from __future__ import annotations

from dataclasses import replace

import pytest

from launcher.planning.calibration import SHAPE_8B
from launcher.planning.hardware import H200
from launcher.planning.memory import GIB, OOM_MARGIN_STEP, SAFETY_MARGIN, Cluster, Strategy, Workload
from launcher.planning.training import (
    Split,
    TrainingPlan,
    out_of_memory_line,
    plan_training,
    replan_after_oom,
)

ONE_H200 = Cluster(1, 1, 140.4, 125)
# docs/gpu-results.md's workload: 8B LoRA, cutoff 1024, LLaMA-Factory's split 2 x 8 (global batch 16)
WORKLOAD = Workload(SHAPE_8B, "lora", micro_batch=2, cutoff_len=1024)


def _plan(cluster: Cluster = ONE_H200, strategies: tuple[Strategy, ...] | None = None) -> TrainingPlan:
    if strategies is None:
        return plan_training(WORKLOAD, cluster, accumulation=8, accelerator=H200)
    return plan_training(WORKLOAD, cluster, accumulation=8, accelerator=H200, strategies=strategies)


def test_one_margin_step_lives_in_the_memory_module():
    assert (SAFETY_MARGIN, OOM_MARGIN_STEP) == (0.10, 0.10)


def test_the_next_plan_is_smaller_at_the_same_global_batch_with_a_larger_margin():
    first = _plan()
    ran_out = first.choice
    assert ran_out is not None
    assert (ran_out.strategy, ran_out.split) == (Strategy.ZERO2, Split(16, 1, checkpointing=False))
    again = replan_after_oom(first)
    nxt = again.choice
    assert nxt is not None
    print(
        f"\nran out: {ran_out.describe()} {ran_out.estimate.gpu_total / GIB:.1f} GiB, margin {first.margin}"
    )
    print(f"next:    {nxt.describe()} {nxt.estimate.gpu_total / GIB:.1f} GiB, margin {again.margin}")
    # the same global batch: micro-batch x accumulation x GPUs, so the resumed schedule continues
    assert again.global_batch == first.global_batch == 16
    assert nxt.split.micro_batch * nxt.split.accumulation * again.cluster.world == 16
    assert again.margin == pytest.approx(SAFETY_MARGIN + OOM_MARGIN_STEP)
    # smaller by the model, the same checkpoint layout (ZeRO-2 resumes ZeRO-2's files), fits with 20%
    assert nxt.estimate.gpu_total < ran_out.estimate.gpu_total
    assert nxt.strategy.checkpoint_layout == ran_out.strategy.checkpoint_layout == "zero2"
    assert nxt.estimate.gpu_total * (1 + again.margin) <= ONE_H200.gpu_mem_gib * GIB
    assert (nxt.strategy, nxt.split) == (Strategy.ZERO2, Split(8, 2, checkpointing=False))
    # the shipped YAML keys of the next plan: the same product, another split
    assert again.yaml_overrides() == {
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "disable_gradient_checkpointing": True,
    }


def test_each_out_of_memory_raises_the_margin_once_more_and_shrinks_the_plan_until_nothing_fits():
    plan, margins, needs = _plan(), [], []
    while plan.choice is not None:
        margins.append(round(plan.margin, 2))
        needs.append(plan.choice.estimate.gpu_total)
        assert plan.global_batch == 16
        last = plan
        plan = replan_after_oom(plan)
    assert margins[:3] == [0.1, 0.2, 0.3]
    assert needs == sorted(needs, reverse=True) and len(set(needs)) == len(
        needs
    )  # strictly smaller each time
    assert last.choice is not None
    assert out_of_memory_line(last.choice, plan).startswith(f"out of memory with {last.choice.describe()}")


def test_nothing_smaller_fits_with_the_larger_margin_is_one_line_with_the_numbers():
    # DDP only; each GPU 1.15 x the smallest split's estimate: at 10% the two smallest fit, at 20% none does
    smallest = min(_plan(strategies=(Strategy.NONE,)).candidates, key=lambda c: c.estimate.gpu_total)
    cap = round(smallest.estimate.gpu_total * 1.15 / GIB, 1)
    first = _plan(Cluster(1, 1, cap, 0), (Strategy.NONE,))
    ran_out = first.choice
    assert ran_out is not None and ran_out.split == Split(2, 8, checkpointing=True)
    again = replan_after_oom(first)
    assert again.choice is None
    line = out_of_memory_line(ran_out, again)
    print("\n" + line)
    need = smallest.estimate.gpu_total / GIB
    assert line == (
        f"out of memory with no DeepSpeed (DDP), micro-batch 2 x accumulation 8, checkpointing on (the model "
        f"said {ran_out.estimate.gpu_total / GIB:.1f} GiB per GPU of {cap:.1f} GiB); nothing smaller fits at "
        "global batch 16 with a 20% margin: the smallest, no DeepSpeed (DDP), micro-batch 1 x accumulation "
        f"16, checkpointing on, needs {need:.1f} GiB per GPU (+20% margin: {need * 1.2:.1f}) of {cap:.1f} GiB"
    )
    assert "\n" not in line


def test_when_the_plan_that_ran_out_was_already_the_smallest_the_line_says_so():
    smallest = min(_plan(strategies=(Strategy.NONE,)).candidates, key=lambda c: c.estimate.gpu_total)
    cap = round(smallest.estimate.gpu_total * 1.12 / GIB, 1)  # only the smallest fits at 10%
    first = _plan(Cluster(1, 1, cap, 0), (Strategy.NONE,))
    assert first.choice is not None and first.choice.split == Split(1, 16, checkpointing=True)
    again = replan_after_oom(first)
    assert again.choice is None and not again.candidates
    assert out_of_memory_line(first.choice, again).endswith(
        f"of {cap:.1f} GiB); no plan at global batch 16 needs less GPU memory with the same checkpoint "
        "layout (none): lower cutoff_len, add GPUs or nodes"
    )


def test_a_checkpoint_layout_is_the_zero_stage_offload_is_not_part_of_it():
    layouts = {s: s.checkpoint_layout for s in Strategy}
    assert layouts == {
        Strategy.NONE: "none",
        Strategy.ZERO2: "zero2",
        Strategy.ZERO3: "zero3",
        Strategy.ZERO3_OFFLOAD_OPT: "zero3",
        Strategy.ZERO3_OFFLOAD_ALL: "zero3",
    }


def test_a_zero3_plan_that_ran_out_may_move_to_offload_but_never_to_another_stage():
    first = _plan(strategies=(Strategy.ZERO2, Strategy.ZERO3, Strategy.ZERO3_OFFLOAD_OPT))
    # as if a probe had picked ZeRO-3: the fitting ZeRO-2 splits left out (ZeRO-2 stays among the strategies)
    zero3 = replace(
        first, candidates=tuple(c for c in first.candidates if c.strategy is not Strategy.ZERO2 or not c.fits)
    )
    assert zero3.choice is not None and zero3.choice.strategy is Strategy.ZERO3
    again = replan_after_oom(zero3)
    assert again.choice is not None
    # a ZeRO-2 split would resume from ZeRO-3's per-rank files: never chosen, though ZeRO-2 fits and is faster
    assert {c.strategy for c in again.candidates} == {Strategy.ZERO3, Strategy.ZERO3_OFFLOAD_OPT}
    assert any(c.strategy is Strategy.ZERO2 and c.fits for c in first.candidates)

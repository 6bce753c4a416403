"""The planner's memory and speed model against the H200 measurements it is calibrated on."""

from __future__ import annotations

import pytest

from launcher.planning import calibration, speed
from launcher.planning.calibration import RUNS, estimated_peak_mib, predicted_tokens_per_s
from launcher.planning.hardware import MI300X
from launcher.planning.memory import Cluster, Strategy


def test_every_memory_estimate_is_within_15_percent_of_the_measured_peak():
    print("\n" + calibration.comparison_table())
    measured = [r for r in RUNS if r.peak_mib]
    assert len(measured) == 29
    ratios = {f"{r.shape} {r.strategy.value} mb{r.micro_batch} {r.source}": estimated_peak_mib(r) / r.peak_mib
              for r in measured}  # fmt: skip
    assert all(0.85 <= v <= 1.15 for v in ratios.values()), ratios
    assert max(ratios.values()) < 1.07  # as documented in docs/planner.md (0.97-1.06)


def test_the_committed_speed_constants_are_the_fit():
    base = calibration.fit_speed_constants()
    print(f"\nfit: {base}")
    assert base.efficiency == pytest.approx(speed.EFFICIENCY)
    assert base.layer_overhead_s == pytest.approx(speed.LAYER_OVERHEAD_S)
    assert base.warmup_s == pytest.approx(calibration.WARMUP_S)
    zero2, zero3 = (calibration.fit_strategy_overhead(g, base) for g in calibration.OVERHEAD_GROUPS)
    assert zero2 == pytest.approx(speed.STRATEGY_LAYER_OVERHEAD_S[Strategy.ZERO2])
    assert zero3 == pytest.approx(speed.ZERO3_LAYER_OVERHEAD_S)


def test_predicted_tokens_per_s_follow_the_measured_runs():
    # Short runs scatter (the 8B no-DeepSpeed run measured 3552 tokens/s in 8 steps and 3078 in 14): every
    # prediction is within 0.6x-1.6x of its run and the predictions are unbiased overall.
    ratios = [predicted_tokens_per_s(r) / r.tokens_per_s for r in RUNS if r.tokens_per_s]
    assert all(0.6 <= x <= 1.6 for x in ratios), ratios
    geometric_mean = 1.0
    for x in ratios:
        geometric_mean *= x ** (1 / len(ratios))
    assert 0.9 < geometric_mean < 1.1


@pytest.mark.parametrize("source", ["bench", "launcher"])
@pytest.mark.parametrize("shape", ["3b", "8b"])
def test_predicted_strategy_order_matches_each_session(shape, source):
    runs = {r.strategy: r for r in RUNS if r.shape == shape and r.source == source and r.tokens_per_s}
    measured = {s: r.tokens_per_s for s, r in runs.items()}
    predicted = {s: predicted_tokens_per_s(r) for s, r in runs.items()}
    zero3 = [s for s in runs if s.zero3]
    for values in (measured, predicted):
        assert values[Strategy.NONE] > values[Strategy.ZERO2] > max(values[s] for s in zero3)


def test_the_quoted_8b_and_3b_gains_are_predicted():
    # quoted in issue #16: 8B ~4,500 tokens/s as micro-batch 2 x 8 with checkpointing and ~2x with larger
    # micro-batches without; 3B ~2.5x the same way
    yaml, split = (r for r in RUNS if r.source.startswith("issue"))
    assert predicted_tokens_per_s(yaml) == pytest.approx(4500, rel=0.1)
    assert predicted_tokens_per_s(split) / predicted_tokens_per_s(yaml) == pytest.approx(2.0, rel=0.1)
    assert 2.0 < calibration.issue_3b_gain(calibration.fit_speed_constants()) < 3.0


def test_collectives_match_a_measured_two_node_mi300x_all_reduce():
    # ROCm/rccl PR #2078: all_reduce_perf, 2 nodes x 8 MI300X with Pollara 400 NICs, 17179869184 B: 89235 us
    seconds = speed.collective_seconds(17_179_869_184, Cluster(2, 8, 191.98, 0), MI300X, all_reduce=True)
    assert seconds == pytest.approx(0.089235, rel=0.05)


def test_one_gpu_has_no_communication():
    assert speed.collective_seconds(1e9, Cluster(1, 1, 140.4, 0), MI300X, all_reduce=True) == 0.0

"""The statistic behind every claim's verdict: Student's paired t interval."""

import math

import numpy as np
import pytest
from scipy import stats

from hashlearn.experiments._stats import paired_differences, paired_t_interval, verdict


def test_t_interval_matches_a_hand_computed_oracle():
    # d = 1..5: mean 3, sd sqrt(2.5), se sqrt(0.5); t_{0.975, 4} = 2.7764451051977987
    got = paired_t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.7764451051977987 * math.sqrt(0.5)
    assert got.n == 5 and got.mean == 3.0
    assert got.low == pytest.approx(3.0 - half, rel=1e-12)
    assert got.high == pytest.approx(3.0 + half, rel=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_t_interval_matches_scipy(seed):
    rng = np.random.RandomState(seed)
    a, b = rng.randn(7), rng.randn(7) + 0.3
    want = stats.ttest_rel(a, b).confidence_interval(0.95)
    got = paired_t_interval(a - b)
    assert (got.low, got.high) == pytest.approx((want.low, want.high), rel=1e-10)


def test_degenerate_inputs():
    one = paired_t_interval([0.2])
    assert one.mean == 0.2 and math.isnan(one.low) and math.isnan(one.high)
    assert verdict(one.low, one.high) == "tie"
    same = paired_t_interval([0.5, 0.5, 0.5])
    assert (same.low, same.high) == (0.5, 0.5) and verdict(same.low, same.high) == "holds"
    for bad in ([], [[1.0, 2.0]], [1.0, np.nan]):
        with pytest.raises(ValueError):
            paired_t_interval(bad)
    with pytest.raises(ValueError, match="confidence"):
        paired_t_interval([1.0, 2.0], confidence=1.0)


def test_verdict_needs_the_interval_to_exclude_zero():
    assert verdict(0.01, 0.2) == "holds"
    assert verdict(-0.2, -0.01) == "fails"
    assert verdict(-0.01, 0.2) == "tie"
    assert verdict(0.0, 0.2) == "tie"


def test_paired_differences_pair_by_seed_and_broadcast_a_deterministic_baseline():
    records = [{"method": "A", "bits": 8, "seed": s, "v": 0.5 + 0.1 * s} for s in range(3)] + [
        {"method": "B", "bits": 8, "seed": s, "v": 0.4 + 0.2 * s} for s in (2, 0, 1)
    ]
    records += [{"method": "SH", "bits": 8, "seed": 0, "v": 0.45}]
    records += [{"method": "A", "bits": 16, "seed": 0, "v": 9.0}]
    d = paired_differences(records, "A", "B", "v", bits=8)
    assert d == pytest.approx([0.1, 0.0, -0.1])
    assert paired_differences(records, "A", "B", "v", bits=8, sign=-1) == pytest.approx(-d)
    assert paired_differences(records, "A", "SH", "v", bits=8) == pytest.approx([0.05, 0.15, 0.25])
    with pytest.raises(ValueError, match="no records"):
        paired_differences(records, "A", "C", "v")

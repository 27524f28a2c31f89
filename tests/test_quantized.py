"""The 8-bit screening copy (hashlearn.rerank._quantized): exact code distances, certified errors,
and the screened re-ranking that keeps the exact kernel's top k."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from numba import njit

from hashlearn.rerank._kernels import (
    COSINE,
    EUCLIDEAN,
    NEG_INNER,
    SQEUCLIDEAN,
    distance_kernel,
    quantized_screen_kernel,
    rescore_runner,
)
from hashlearn.rerank._quantized import (
    COLUMN_BLOCK,
    MAX_WIDE_COLUMNS,
    WIDE_LEVELS,
    code_sqdist,
    quantize,
    quantize_rows,
)


@njit
def _all_code_distances(A, B):
    out = np.empty((A.shape[0], B.shape[0]), np.int64)
    for i in range(A.shape[0]):
        for p in range(B.shape[0]):
            out[i, p] = code_sqdist(A, i, B, p)
    return out


@pytest.mark.parametrize("width", [32, 64, 96, 128, 160, 800, 4096])
@pytest.mark.parametrize("wide", [False, True])
def test_code_distances_are_the_exact_integer_sums(width, wide):
    """Every unroll remainder (4 blocks a round, then single blocks), and the extremes 0 vs
    the largest code in every column (the largest lane sums; uint16 codes up to
    ``WIDE_LEVELS`` over ``MAX_WIDE_COLUMNS`` columns)."""
    rng = np.random.default_rng(width)
    top = WIDE_LEVELS if wide else 255
    dtype = np.uint16 if wide else np.uint8
    A = rng.integers(0, top + 1, (9, width)).astype(dtype)
    B = rng.integers(0, top + 1, (7, width)).astype(dtype)
    A[0], B[0] = 0, top
    A[1], B[1] = top, 0
    want = ((A[:, None, :].astype(np.int64) - B[None].astype(np.int64)) ** 2).sum(2)
    np.testing.assert_array_equal(_all_code_distances(A, B), want)
    assert want[0, 0] == want[1, 1] == width * top**2
    assert width <= MAX_WIDE_COLUMNS


def _within(x, lo, step, codes, bound):
    """``|x - (lo + step c)| <= bound``, decided in exact rational arithmetic."""
    total = Fraction(0)
    for xj, lj, cj in zip(x.tolist(), lo.tolist(), codes.tolist(), strict=True):
        r = Fraction(xj) - (Fraction(lj) + Fraction(step) * cj)
        total += r * r
    return total <= Fraction(bound) ** 2


@pytest.mark.parametrize(
    "case", ["gaussian", "integers", "mixed magnitudes", "tiny", "constant columns", "nan row"]
)
def test_quantization_error_bounds_hold_exactly(case):
    """``err`` bounds ``|x - x_hat|`` computed in exact rational arithmetic (rows and
    clamped out-of-range queries); integer data on a unit grid is lossless (err ~ 0)."""
    rng = np.random.default_rng(1)
    V = rng.standard_normal((40, 37))
    if case == "integers":
        V = rng.integers(0, 256, (40, 37)).astype(np.float32)
        V[0] = 0.0
        V[1] = 255.0
    elif case == "mixed magnitudes":
        V *= 10.0 ** rng.integers(-30, 30, (1, 37))
    elif case == "tiny":
        V *= 1e-310  # subnormal
    elif case == "constant columns":
        V[:, :5] = 3.25
    elif case == "nan row":
        V[3, 7] = np.nan
        V[4, 2] = np.inf
    sq = quantize(V)
    assert sq.codes.shape == (40, 64) and sq.codes.shape[1] % COLUMN_BLOCK == 0
    assert not sq.codes[:, 37:].any()  # zero padding
    d = V.shape[1]
    for i in range(40):
        if not np.isfinite(V[i]).all():
            assert sq.err[i] == np.inf
            continue
        assert _within(V[i], sq.lo, sq.step, sq.codes[i, :d], sq.err[i])
    np.testing.assert_allclose(sq.sqnorm[np.isfinite(sq.err)], (V**2).sum(1)[np.isfinite(sq.err)])
    assert sq.err_cap == sq.err[np.isfinite(sq.err)].max()
    if case == "integers":
        assert sq.step == 1.0 and sq.err.max() < 1e-9
    Q = rng.standard_normal((10, d)) * 4 * (np.abs(V[np.isfinite(V)]).max() + 1)  # out of range
    q_codes, q_err, _ = quantize_rows(Q, sq.lo, sq.step, sq.codes.shape[1])
    for i in range(10):
        assert _within(Q[i], sq.lo, sq.step, q_codes[i, :d], q_err[i])
    # 12-bit codes on a 16x finer grid: the same guarantee, clamped at WIDE_LEVELS
    fine = sq.step / 16
    w_codes, w_err, _ = quantize_rows(np.vstack([V, Q]), sq.lo, fine, sq.codes.shape[1], True)
    assert w_codes.dtype == np.uint16 and w_codes.max() <= WIDE_LEVELS
    for i, x in enumerate(np.vstack([V, Q])):
        if np.isfinite(x).all():
            assert _within(x, sq.lo, fine, w_codes[i, :d], w_err[i])


def test_quantize_declines_an_overflowing_range():
    V = np.array([[-1e308, 0.0], [1e308, 1.0]])
    assert quantize(V) is None


def _screened(Q, V, cand, kind, k, screen):
    m = Q.shape[0]
    want = np.full((m, k), np.inf), np.full((m, k), -1, np.int64)
    distance_kernel(Q, V, cand, kind, k, *want, 0, m)
    got = np.full((m, k), np.inf), np.full((m, k), -1, np.int64)
    rescore_runner(Q, V, cand, kind, k, *got, screen=screen)(0, m)
    return want, got


@pytest.mark.parametrize("kind", [SQEUCLIDEAN, EUCLIDEAN, NEG_INNER, COSINE])
@pytest.mark.parametrize(
    "case",
    ["gaussian", "integers", "one-ulp neighbours", "huge", "tiny", "float64 queries", "nan row"],
)
def test_8bit_screen_keeps_the_exact_kernels_top_k(kind, case):
    """Rows exactly and distances to rounding, as the float64 kernel: near-ties the codes
    cannot tell apart (neighbours 1 ulp apart, duplicates), |x| ~ 1e150 (float64 sums of
    squares near overflow), |x| ~ 1e-160 (squares underflow), queries off the grid, a NaN
    row, rows listed twice, fewer than k candidates."""
    rng = np.random.default_rng(11)
    n, d, m, c, k = 300, 40, 30, 60, 7
    V = rng.standard_normal((n, d)).astype(np.float32)
    if case == "integers":
        V = rng.integers(0, 256, (n, d)).astype(np.float32)
    elif case == "one-ulp neighbours":
        V[100:200] = np.nextafter(V[:100], np.float32(np.inf))
        V[200:] = V[:100]
    elif case == "huge":
        V = V.astype(np.float64) * 1e150
    elif case == "tiny":
        V = V.astype(np.float64) * 1e-160
    elif case == "nan row":
        V[5] = np.nan
    Q = V[rng.integers(0, n, m)].astype(np.float64)
    if case in ("float64 queries", "gaussian"):
        Q += rng.standard_normal(Q.shape) * (1e-4 if case == "float64 queries" else 0.3)
    cand = np.stack([rng.permutation(n)[:c] for _ in range(m)])
    cand[:, ::5] = -1
    cand[4, 3:] = -1  # fewer than k candidates
    cand[0, :10] = 5  # a row listed for several queries... and twice for one
    cand[1, :10] = 5
    screen = quantize(V)
    want, got = _screened(Q, V, cand, kind, k, screen)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=0)


def _assert_same_float32(got, want):
    """Float32 results equal to the exact kernel's rounded to float32, give or take one
    float32 ulp: a pair scored exactly is summed in float64 by a separately compiled loop
    (reassociated), whose last bit may differ by CPU and can tip a float32 rounding."""
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2.0**-23)


def test_8bit_screen_prunes_to_about_k_pairs_per_query():
    """Called directly (the test fails if the runner stops choosing it): integer data is
    quantized losslessly, so only the k nearest and ties with the k-th survive, and when
    only float32 distances are wanted almost none needs its row read; on Gaussian data the
    interval of the quantization error (about step sqrt(d / 12) per vector) leaves a few
    times k, whose float32 distances are not settled by the bounds."""
    rng = np.random.default_rng(2)
    k, m, c = 10, 50, 200
    for data, most, most32 in (("integers", 1.2, 0.1), ("gaussian", 3.0, 3.0)):
        if data == "integers":
            V = rng.integers(0, 256, (2000, 64)).astype(np.float32)
            Q = np.clip(np.rint(V[:m] + rng.standard_normal((m, 64)) * 3), 0, 255)  # on the grid
        else:
            V = rng.standard_normal((2000, 64)).astype(np.float32)
            Q = V[:m] + rng.standard_normal((m, 64)).astype(np.float32) * 0.3
        cand = np.stack([rng.permutation(2000)[:c] for _ in range(m)])
        screen = quantize(V)
        want, _ = _screened(Q, V, cand, SQEUCLIDEAN, k, screen)
        q_screen = quantize_rows(Q, screen.lo, screen.step, screen.codes.shape[1])
        x_screen = (screen.codes, screen.err, screen.sqnorm)
        for settle32, limit in ((False, most), (True, most32)):
            direct = np.full((m, k), np.inf), np.full((m, k), -1, np.int64)
            args = (Q, V, q_screen, x_screen, screen.step, screen.err_cap, cand, SQEUCLIDEAN)
            scored = quantized_screen_kernel(*args, k, *direct, 0, m, settle32)
            assert (0 if settle32 else m * k) <= scored <= limit * m * k, (data, settle32)
            np.testing.assert_array_equal(direct[1], want[1])
            _assert_same_float32(direct[0], want[0])


@pytest.mark.parametrize("kind", [SQEUCLIDEAN, EUCLIDEAN, NEG_INNER, COSINE])
@pytest.mark.parametrize("case", ["integers", "gaussian", "duplicates", "near float32 ties"])
def test_settled_float32_results_match_the_exact_kernel(kind, case):
    """With float32 results wanted, ids equal the exact kernel's and distances equal its
    float32 roundings: duplicates (equal distances, ranked by row: never settled), rows
    whose distances differ in float64 but not in float32, continuous data (wide bounds)."""
    rng = np.random.default_rng(21)
    n, d, m, c, k = 400, 24, 40, 80, 8
    V = rng.integers(0, 256, (n, d)).astype(np.float32)
    if case == "gaussian":
        V = rng.standard_normal((n, d)).astype(np.float32)
    elif case == "duplicates":
        V[200:] = V[:200]
    elif case == "near float32 ties":
        V = V.astype(np.float64)
        V[200:] = V[:200] + 2.0**-30  # distances apart in float64, often equal in float32
    Q = np.clip(np.rint(V[rng.integers(0, n, m)] + rng.standard_normal((m, d)) * 2), 0, 255)
    if case == "gaussian":
        Q = V[rng.integers(0, n, m)] + rng.standard_normal((m, d)) * 0.3
    cand = np.stack([rng.permutation(n)[:c] for _ in range(m)])
    cand[:, ::9] = -1
    want = np.full((m, k), np.inf), np.full((m, k), -1, np.int64)
    distance_kernel(Q, V, cand, kind, k, *want, 0, m)
    got = np.full((m, k), np.inf), np.full((m, k), -1, np.int64)
    rescore_runner(Q, V, cand, kind, k, *got, screen=quantize(V), float32_results=True)(0, m)
    np.testing.assert_array_equal(got[1], want[1])
    _assert_same_float32(got[0], want[0])


def test_code_cutoff_is_the_last_sum_whose_bound_can_reach_the_threshold():
    """Every code sum above the cutoff bounds the distance above the threshold (the test
    pass 1 skips pairs by), and the cutoff itself still may not: the integer shortcut drops
    exactly the pairs the bounds would."""
    from hashlearn.rerank._kernels import _code_cutoff, _code_interval

    rng = np.random.default_rng(8)
    out_rel = 2.0 * (784 + 8) * 2.0**-53
    for _ in range(300):
        step = float(10.0 ** rng.uniform(-3, 2))
        slack = float(rng.choice([0.0, 1e-12, 10.0 ** rng.uniform(-3, 1)]))
        threshold = float(10.0 ** rng.uniform(-2, 8))
        cut = _code_cutoff(threshold, step, slack, 784, out_rel)
        lo_next = _code_interval(SQEUCLIDEAN, cut + 1, step, slack, 0.0, 0.0, 784, out_rel)[0]
        assert lo_next > threshold
        if cut >= 0:
            lo_cut = _code_interval(SQEUCLIDEAN, cut, step, slack, 0.0, 0.0, 784, out_rel)[0]
            assert lo_cut <= threshold
    assert _code_cutoff(np.inf, 1.0, 0.0, 784, out_rel) == np.iinfo(np.int64).max

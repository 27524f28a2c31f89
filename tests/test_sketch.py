"""The bucket-norm sketch of CSR vectors (hashlearn.rerank._sketch): its width, its buckets, its
certified errors, and the lower bound it gives, checked in 60-digit decimal arithmetic."""

from __future__ import annotations

from decimal import Decimal, localcontext

import numpy as np
import pytest
import scipy.sparse as sp
from numba import njit

from hashlearn.rerank._quantized import NO_TAG, WIDE_LEVELS, tagged_sqdist
from hashlearn.rerank._sketch import build_sketch, sketch_rows, sketch_width


def _arrays(X):
    X = sp.csr_matrix(X)
    X.sort_indices()
    return X.data, X.indices.astype(np.int32), X.indptr.astype(np.int64)


def test_width_is_four_non_zeros_a_row_within_limits():
    assert sketch_width(56.4, 65536) == 256  # the bag-of-patches histograms
    assert sketch_width(3.0, 65536) == 64
    assert sketch_width(5000.0, 65536) == 1024
    assert sketch_width(30.0, 40) == 64  # no wider than the columns (rounded up)
    assert sketch_width(30.0, 20) == 32
    assert sketch_width(0.0, 10) == 32


def test_the_most_frequent_columns_lead_buckets_of_their_own():
    rng = np.random.default_rng(0)
    n, d = 500, 3000
    weights = 1.0 / np.arange(1, d + 1)  # column j is used about 1 / j as often
    X = sp.random(n, d, density=0.01, random_state=1, format="lil")
    for i in range(n):
        X[i, rng.choice(d, 10, replace=False, p=weights / weights.sum())] = 1.0
    X = sp.csr_matrix(X)
    sketch = build_sketch(*_arrays(X), d)
    w = sketch.codes.shape[1]
    counts = np.bincount(X.indices, minlength=d)
    top = np.argsort(-counts, kind="stable")[:w]
    assert len(np.unique(sketch.bucket_of[top])) == w
    assert sketch.bucket_of.min() >= 0 and sketch.bucket_of.max() < w


def _exact_norms(x, bucket_of, w):
    """Each bucket's norm of the CSR row ``x``, in 60-digit decimals."""
    sums = [Decimal(0)] * w
    for j, v in zip(x.indices.tolist(), x.data.tolist(), strict=True):
        sums[bucket_of[j]] += Decimal(v) * Decimal(v)
    return [s.sqrt() for s in sums]


def _distance(f, g):
    return sum(((a - b) * (a - b) for a, b in zip(f, g, strict=True)), Decimal(0)).sqrt()


@pytest.mark.parametrize(
    "case", ["gaussian", "non-negative", "mixed magnitudes", "tiny", "huge", "nan row"]
)
def test_sketch_errors_and_lower_bounds_hold_exactly(case):
    """``err`` bounds ``|f(x) - step codes|`` for the real bucket norms ``f(x)`` (database
    rows, and queries beyond the grid, which are clamped); a bucket with one non-zero
    carries its column's tag; and ``step sqrt(S) - err_q - err_x <= |q - x|`` for every
    pair, ``S`` the tagged code distance: the sketch is a contraction, and buckets whose
    tags differ hold different columns."""
    rng = np.random.default_rng(2)
    n, d = 60, 400
    X = sp.random(n, d, density=0.05, random_state=3, format="csr")
    X.data = rng.standard_normal(X.nnz)
    if case == "non-negative":
        X.data = np.abs(X.data)
    elif case == "mixed magnitudes":
        X.data *= 10.0 ** rng.integers(-30, 30, X.nnz)
    elif case == "tiny":
        X.data *= 1e-160  # squares underflow
    elif case == "huge":
        X.data *= 1e150
    elif case == "nan row":
        X.data[X.indptr[4]] = np.nan
    Q = sp.csr_matrix(X[:20].multiply(3.0) + sp.random(20, d, density=0.02, random_state=4))
    sketch = build_sketch(*_arrays(X), d)
    w = sketch.codes.shape[1]
    assert sketch.codes.dtype == np.uint16 and (sketch.codes & 0x0FFF).max() <= WIDE_LEVELS
    q_codes, q_err, q_code_sq = sketch_rows(sketch, *_arrays(Q))
    assert (q_code_sq == ((q_codes & WIDE_LEVELS).astype(np.int64) ** 2).sum(1)).all()
    step = Decimal(sketch.step)
    with localcontext() as ctx:
        ctx.prec = 60
        rows = []
        matrices = (X, sketch.codes, sketch.err, sketch.code_sq), (Q, q_codes, q_err, q_code_sq)
        for M, codes, err, code_sq in matrices:
            for i in range(M.shape[0]):
                x = M[i]
                if not np.isfinite(x.data).all():
                    assert err[i] == np.inf
                    continue
                f = _exact_norms(x, sketch.bucket_of, w)
                grid = [step * (int(c) & WIDE_LEVELS) for c in codes[i]]
                tags = codes[i] >> 12
                per_bucket = np.bincount(sketch.bucket_of[x.indices], minlength=w)
                alone = per_bucket == 1
                assert (tags[~alone] == NO_TAG).all()
                lone = x.indices[alone[sketch.bucket_of[x.indices]]]
                assert (tags[sketch.bucket_of[lone]] == sketch.tag_of[lone]).all()
                assert _distance(f, grid) <= Decimal(err[i])
                rows.append((x, codes, i, Decimal(err[i]), code_sq))
        for x, xc, i, e_x, x_sq in rows[:40]:
            for q, qc, j, e_q, q_sq in rows[-20:]:
                true = _distance(
                    [Decimal(v) for v in x.toarray().ravel()],
                    [Decimal(v) for v in q.toarray().ravel()],
                )
                total = int(_pair_sum(qc, j, xc, i, q_sq, x_sq))
                assert step * Decimal(total).sqrt() - e_q - e_x <= true


@njit
def _pair_sum(A, i, B, p, a_sq, b_sq):
    return tagged_sqdist(A, i, B, p, a_sq, b_sq)


@njit
def _all_tagged(A, B, a_sq, b_sq):
    out = np.empty((A.shape[0], B.shape[0]), np.int64)
    for i in range(A.shape[0]):
        for p in range(B.shape[0]):
            out[i, p] = tagged_sqdist(A, i, B, p, a_sq, b_sq)
    return out


@pytest.mark.parametrize("width", [32, 64, 96, 128, 160, 256, 800, 4096])
def test_tagged_code_distances_are_the_exact_integer_sums(width):
    """``tagged_sqdist`` against numpy: ``(a - c)^2`` where the tags agree or either is
    ``NO_TAG``, ``a^2 + c^2`` where they differ; every unroll remainder, and the largest
    lane sums (``WIDE_LEVELS`` against ``WIDE_LEVELS`` in every column with equal tags,
    and with different tags, over ``MAX_WIDE_COLUMNS`` columns)."""
    rng = np.random.default_rng(width)
    values = lambda n: rng.integers(0, WIDE_LEVELS + 1, (n, width))  # noqa: E731
    tags = lambda n: rng.choice([0, 1, 2, 14, NO_TAG], (n, width))  # noqa: E731
    a_val, a_tag, c_val, c_tag = values(9), tags(9), values(7), tags(7)
    a_val[0], a_tag[0], c_val[0], c_tag[0] = WIDE_LEVELS, 3, WIDE_LEVELS, 3  # kept: 0 apart
    a_val[1], a_tag[1], c_val[1], c_tag[1] = WIDE_LEVELS, 2, WIDE_LEVELS, 5  # all apart
    a_val[2], a_tag[2], c_val[2], c_tag[2] = WIDE_LEVELS, NO_TAG, 0, 5
    A = (a_val | a_tag << 12).astype(np.uint16)
    C = (c_val | c_tag << 12).astype(np.uint16)
    a, c = a_val[:, None, :], c_val[None]
    apart = (a_tag[:, None, :] != c_tag[None]) & (a_tag[:, None, :] != NO_TAG)
    apart &= c_tag[None] != NO_TAG
    want = np.where(apart, a * a + c * c, (a - c) ** 2).sum(2)
    got = _all_tagged(A, C, (a_val**2).sum(1), (c_val**2).sum(1))
    np.testing.assert_array_equal(got, want)
    assert want[0, 0] == 0 and want[1, 1] == 2 * width * WIDE_LEVELS**2
    assert want[2, 2] == width * WIDE_LEVELS**2

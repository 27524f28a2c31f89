"""CSR re-ranking: the sketch-screened kernel keeps exactly what the exact kernel keeps."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from numba import njit

from hashlearn.rerank._csr_kernels import (
    _sketch_radii,
    csr_distance_kernel,
    csr_scratch,
    csr_sketch_kernel,
    row_sqnorms,
)
from hashlearn.rerank._kernels import COSINE, EUCLIDEAN, NEG_INNER, SQEUCLIDEAN
from hashlearn.rerank._quantized import tagged_sqdist
from hashlearn.rerank._sketch import build_sketch, sketch_rows


def _arrays(X):
    X = sp.csr_matrix(X)
    X.sort_indices()
    return X.data, X.indices.astype(np.int32), X.indptr.astype(np.int64)


def _both(Q, V, cand, kind, k):
    """``(want, got, n_exact)``: the exact kernel's top k, the sketch kernel's, and the
    number of pairs the sketch kernel scored exactly."""
    d = V.shape[1]
    q, v = _arrays(Q), _arrays(V)
    m = Q.shape[0]
    want = np.full((m, k), np.inf), np.full((m, k), -1, np.int64)
    side = np.zeros((m, 0)), np.zeros((V.shape[0], 0)), np.zeros(0)
    scratch = lambda: csr_scratch(d, q[2])  # noqa: E731
    csr_distance_kernel(q, v, side, cand, kind, k, *want, 0, m, scratch())
    got = np.full((m, k), np.inf), np.full((m, k), -1, np.int64)
    sketch = build_sketch(*v, d)
    x_sq = row_sqnorms(v[0], v[2])
    x_sketch = (sketch.codes, sketch.err, sketch.code_sq)
    sketches = (sketch_rows(sketch, *q), x_sketch, x_sq, sketch.step)
    n_exact = csr_sketch_kernel(q, v, sketches, cand, kind, k, *got, 0, m, scratch())
    return want, got, n_exact


@pytest.mark.parametrize("kind", [SQEUCLIDEAN, EUCLIDEAN, NEG_INNER, COSINE])
@pytest.mark.parametrize(
    "case", ["random", "close rows", "duplicates", "huge", "tiny", "nan row", "non-negative"]
)
def test_csr_sketch_screen_keeps_the_exact_kernels_top_k(kind, case):
    """Identical ids and distances (both score a pair with the same loop): rows a relative
    2^-40 apart, duplicate rows, values near 1e200 (squares overflow: no bound) and 1e-160
    (squares underflow), a NaN row, an empty row, rows listed twice for one query, fewer
    than k candidates, padding."""
    rng = np.random.default_rng(3)
    n, d, m, c, k = 400, 500, 25, 60, 6
    V = sp.random(n, d, density=0.05, random_state=4, format="csr")
    V.data = rng.standard_normal(V.nnz)
    V = V.toarray()
    if case == "close rows":
        V[100:200] = V[:100] * (1 + 2.0**-40)
    elif case == "duplicates":
        V[100:300] = V[:200]
    elif case == "huge":
        V[:50] *= 1e200
    elif case == "tiny":
        V[:300] *= 1e-160
    elif case == "nan row":
        V[7, 3] = np.nan
    elif case == "non-negative":
        V = np.abs(V)
    V[9] = 0.0  # an empty row
    Q = V[rng.integers(0, n, m)] + (rng.random((m, d)) < 0.02) * 0.1
    if case == "tiny":
        Q[:10] *= 1e-160
    cand = np.stack([rng.permutation(n)[:c] for _ in range(m)])
    cand[:, ::7] = -1
    cand[2, 4:] = -1
    cand[0, :8] = 7
    cand[1, :8] = 9
    want, got, n_exact = _both(Q, V, cand, kind, k)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    assert n_exact <= np.count_nonzero(cand >= 0)


@pytest.mark.parametrize("kind", [SQEUCLIDEAN, EUCLIDEAN, NEG_INNER, COSINE])
def test_csr_sketch_screen_prunes(kind):
    """Clusters of sparse non-negative unit rows (as normalised histograms are), each query
    near one cluster of 15 among 200 candidates: the exact kernel's results from scoring
    about k candidates a query."""
    rng = np.random.default_rng(5)
    centres = sp.random(200, 2000, density=0.02, random_state=6, format="csr").toarray()
    V = np.repeat(centres, 15, axis=0)
    V += (rng.random(V.shape) < 0.002) * rng.random(V.shape)
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    Q = centres[:40] + (rng.random((40, 2000)) < 0.002) * rng.random((40, 2000))
    Q /= np.linalg.norm(Q, axis=1, keepdims=True)
    cand = np.stack([rng.permutation(3000)[:200] for _ in range(40)])
    cand[:, :15] = np.arange(40)[:, None] * 15 + np.arange(15)
    want, got, n_exact = _both(Q, V, cand, kind, 10)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    assert 40 * 10 <= n_exact <= 40 * 20  # of 40 * 200 pairs


@pytest.mark.parametrize("kind", [SQEUCLIDEAN, EUCLIDEAN, NEG_INNER, COSINE])
def test_csr_sketch_screen_keeps_rows_without_a_bound(kind):
    """Rows with NaN or huge values have no sketch bound; with fewer than k finite
    candidates they are kept (at distance inf or NaN -> inf) exactly as the exact kernel
    keeps them."""
    rng = np.random.default_rng(8)
    V = np.abs(rng.standard_normal((30, 50))) * (rng.random((30, 50)) < 0.2)
    V[3, 4] = np.nan
    V[5] *= 1e200
    Q = V[[0, 1, 2]] + 0.01
    cand = np.full((3, 12), -1, np.int64)
    cand[:, :6] = [3, 5, 0, 1, 2, 7]
    cand[2, 6:] = np.arange(10, 16)
    want, got, _ = _both(Q, V, cand, kind, 8)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])


@njit
def _radii_pair_by_pair(q_sketch, x_sketch, step, cand):
    q_codes, _, q_sq = q_sketch
    x_codes, x_err, x_sq = x_sketch
    out = np.full(cand.shape, np.nan)
    for i in range(cand.shape[0]):
        for j in range(cand.shape[1]):
            p = cand[i, j]
            if p >= 0:
                total = tagged_sqdist(q_codes, i, x_codes, p, q_sq, x_sq)
                out[i, j] = step * np.sqrt(np.float64(total)) * (1.0 - 16.0 * 2.0**-53) - x_err[p]
    return out


def test_sketch_radii_are_those_of_each_pair():
    """The first pass groups pairs by windows of rows, packs a row's low bits and the pair's
    slot in an int32 key (in batches of queries when the slots need more bits) and finds
    the query from the slot in float64: the radii are those computed pair by pair,
    NaN for padding. 20k queries x 64 candidates needs two batches at this width."""
    rng = np.random.default_rng(7)
    n, d, m, c = 3000, 300, 20_000, 64
    V = sp.random(n, d, density=0.02, random_state=8, format="csr")
    Q = sp.random(m, d, density=0.02, random_state=9, format="csr")
    v, q = _arrays(V), _arrays(Q)
    sketch = build_sketch(*v, d)
    assert sketch.codes.shape[1] == 64
    cand = rng.integers(0, n, (m, c))
    cand[rng.random((m, c)) < 0.1] = -1
    cand[:, 0] = n - 1  # the last window
    x_sketch = (sketch.codes, sketch.err, sketch.code_sq)
    q_sketch = sketch_rows(sketch, *q)
    want = _radii_pair_by_pair(q_sketch, x_sketch, sketch.step, cand)
    for start, stop in ((0, m), (5, 17_000)):
        got = _sketch_radii(q_sketch, x_sketch, sketch.step, cand, start, stop)
        np.testing.assert_array_equal(got, want[start:stop])

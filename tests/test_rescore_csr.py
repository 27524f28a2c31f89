"""CSR re-ranking: the float32-screened kernel keeps exactly what the exact kernel keeps."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from hashlearn._rescore import COSINE, EUCLIDEAN, NEG_INNER, SQEUCLIDEAN
from hashlearn._rescore_csr import compact_copy, csr_distance_kernel, csr_screened_kernel


def _arrays(X):
    X = sp.csr_matrix(X)
    X.sort_indices()
    return X.data, X.indices.astype(np.int64), X.indptr.astype(np.int64)


def _both(Q, V, cand, kind, k, settle32=False):
    d = V.shape[1]
    q, v = _arrays(Q), _arrays(V)
    m = Q.shape[0]
    want = np.full((m, k), np.inf), np.full((m, k), -1, np.int64)
    side = np.zeros((m, 0)), np.zeros((V.shape[0], 0)), np.zeros(0)
    scratch = lambda: (np.zeros(d), np.zeros(d, np.int64))  # noqa: E731
    csr_distance_kernel(q, v, side, cand, kind, k, *want, 0, m, scratch())
    got = np.full((m, k), np.inf), np.full((m, k), -1, np.int64)
    compact = compact_copy(*v, d)
    args = (q, v, compact, cand, kind, k, *got, 0, m)
    n_exact = csr_screened_kernel(*args, scratch(), settle32)
    return want, got, n_exact


@pytest.mark.parametrize("kind", [SQEUCLIDEAN, EUCLIDEAN, NEG_INNER, COSINE])
@pytest.mark.parametrize("case", ["random", "float32 ties", "duplicates", "huge", "nan row"])
def test_csr_screen_keeps_the_exact_kernels_top_k(kind, case):
    """Identical ids and distances (both score a pair with the same loop): rows whose
    float64 values round to the same float32 (the copy cannot tell them apart), duplicate
    rows, values near 1e200 (float32 overflows: no bound), a NaN row, an empty row, rows
    listed twice for one query, fewer than k candidates."""
    rng = np.random.default_rng(3)
    n, d, m, c, k = 400, 500, 25, 60, 6
    V = sp.random(n, d, density=0.05, random_state=4, format="csr")
    V.data = rng.standard_normal(V.nnz)
    V = V.toarray()
    if case == "float32 ties":
        V[100:200] = V[:100] * (1 + 2.0**-40)
    elif case == "duplicates":
        V[100:300] = V[:200]
    elif case == "huge":
        V[:50] *= 1e200
    elif case == "nan row":
        V[7, 3] = np.nan
    V[9] = 0.0  # an empty row
    Q = V[rng.integers(0, n, m)] + (rng.random((m, d)) < 0.02) * 0.1
    cand = np.stack([rng.permutation(n)[:c] for _ in range(m)])
    cand[:, ::7] = -1
    cand[2, 4:] = -1
    cand[0, :8] = 7
    cand[1, :8] = 9
    want, got, _ = _both(Q, V, cand, kind, k)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    # float32 results settled from the bounds where they fix them: the same float32 values
    _, settled, _ = _both(Q, V, cand, kind, k, settle32=True)
    np.testing.assert_array_equal(settled[1], want[1])
    with np.errstate(over="ignore"):  # |x| ~ 1e200: float32 results are inf for both
        np.testing.assert_array_equal(settled[0].astype(np.float32), want[0].astype(np.float32))


def test_csr_screen_prunes():
    rng = np.random.default_rng(5)
    V = sp.random(3000, 2000, density=0.02, random_state=6, format="csr")
    V.data = rng.random(V.nnz)
    V = V.toarray()
    Q = V[:40] + (rng.random((40, 2000)) < 0.01) * 0.3
    cand = np.stack([rng.permutation(3000)[:200] for _ in range(40)])
    cand[:, 0] = np.arange(40)
    want, got, n_exact = _both(Q, V, cand, SQEUCLIDEAN, 10)
    assert 40 * 10 <= n_exact <= 40 * 12  # of 40 * 200 pairs
    np.testing.assert_array_equal(got[1], want[1])
    _, settled, n_exact = _both(Q, V, cand, SQEUCLIDEAN, 10, settle32=True)
    assert n_exact <= 40  # float32 rounding errors are far below the float32 result's ulp
    np.testing.assert_array_equal(settled[1], want[1])

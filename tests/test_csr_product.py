"""The CSR x dense product of sparse encoding (hashlearn.hashers._csr_product): scipy's arithmetic,
bit for bit, on any CPU (each output summed over the stored non-zeros in their order, a
product then a sum)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from hashlearn.hashers._csr_product import csr_dense_product


def _in_order(X, start, stop, dense):
    """The reference: numpy's separate products and sums, non-zero by non-zero."""
    out = np.zeros((stop - start, dense.shape[1]), np.result_type(X.dtype, dense.dtype))
    for i in range(start, stop):
        for b in range(X.indptr[i], X.indptr[i + 1]):
            out[i - start] = out[i - start] + X.data[b] * dense[X.indices[b]]
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_product_matches_the_in_order_sums_bit_for_bit(dtype, index_dtype):
    rng = np.random.default_rng(0)
    X = sp.random(40, 300, density=0.05, random_state=1, format="csr", dtype=dtype)
    data = rng.standard_normal(X.nnz) * 10.0 ** rng.integers(-3, 3, X.nnz)
    ends = zip(X.indptr[:-1], X.indptr[1:], strict=True)
    rows = [list(zip(X.indices[a:b], data[a:b], strict=True)) for a, b in ends]
    rows[0] = [(5, 1.5), (2, -2.0), (5, 0.25), (299, 3.0)]  # unsorted, a duplicate column
    rows[7] = []  # an empty row
    X = sp.csr_matrix(
        (
            np.array([v for row in rows for _, v in row], dtype),
            np.array([j for row in rows for j, _ in row], index_dtype),
            np.cumsum([0] + [len(row) for row in rows]).astype(index_dtype),
        ),
        shape=(40, 300),
    )
    assert not X.has_canonical_format
    dense = rng.standard_normal((300, 24)).astype(dtype)
    for start, stop in ((0, 40), (3, 17), (39, 40), (5, 5)):
        out = np.full((stop - start + 2, 24), np.nan, dtype)
        csr_dense_product(X, start, stop, dense, out)
        np.testing.assert_array_equal(out[: stop - start], _in_order(X, start, stop, dense))

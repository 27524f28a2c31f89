"""The product of CSR rows with a dense matrix, for encoding sparse input
(:class:`hashlearn.hashers._linear.LinearForm`): ``out = X[start:stop] @ dense``.

The same arithmetic as scipy's ``csr_matrix @ ndarray`` (each output is summed over the
row's stored non-zeros in their stored order, a product then a sum, no fused multiply-add),
so the bits are scipy's; it is faster because the rows of ``dense`` that the next non-zeros
will read are prefetched (a row of 64 float64 weights is 8 cache lines, and for 2^16
features the weights do not fit in cache), and because it reads the rows in place instead of
slicing a block of ``X`` first.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from hashlearn._utils.primitives import prefetch

__all__ = ["csr_dense_product"]

_AHEAD = 6  # non-zeros ahead whose row of ``dense`` is prefetched


@njit(nogil=True, cache=True)
def _product(data, indices, indptr, start, stop, dense, out):  # pragma: no cover - compiled
    width = dense.shape[1]
    line = max(1, 64 // dense.itemsize)
    last = indptr[stop]
    for i in range(start, stop):
        row = out[i - start]
        row[:] = 0
        for b in range(indptr[i], indptr[i + 1]):
            if b + _AHEAD < last:
                ahead = indices[b + _AHEAD] * width
                for t in range(0, width, line):
                    prefetch(dense, ahead + t)
            v = data[b]
            w = dense[indices[b]]
            for j in range(width):
                row[j] += v * w[j]


def csr_dense_product(X, start: int, stop: int, dense: np.ndarray, out: np.ndarray) -> None:
    """``out[: stop - start] = X[start:stop] @ dense`` for a CSR matrix ``X`` and a
    C-ordered ``dense`` of ``X``'s dtype (``out`` of that dtype too)."""
    _product(X.data, X.indices, X.indptr, start, stop, dense, out)

"""Dense linear-algebra loops shared by numba kernels (ITML's projections, MLH's training,
the boosted search forest's Lanczos steps): one home for the dot product, the
matrix-vector product and the rank-one update. Written as loops: numba compiles array
expressions (``a[:] = b``, ``np.sum(a * b)``) much more slowly.

Both reorder their sums (``fastmath`` ``reassoc`` and ``contract``: vectorised, fused
multiply-adds), so results agree with numpy to rounding, not to the last bit.
"""

from __future__ import annotations

import numba

__all__ = ["dot", "matvec", "rank_one_update"]


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def dot(x, y):
    """``x^T y`` for vectors of equal length."""
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * y[i]
    return s


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def matvec(M, x, out):
    """``out = M x`` for ``M`` (q, d), ``x`` (d,), ``out`` (q,)."""
    q, d = M.shape
    for k in range(q):
        s = 0.0
        for t in range(d):
            s += M[k, t] * x[t]
        out[k] = s


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def rank_one_update(M, scale, x, y):
    """``M += scale * x y^T`` in place for ``M`` (q, d), ``x`` (q,), ``y`` (d,)."""
    q, d = M.shape
    for k in range(q):
        sk = scale * x[k]
        for t in range(d):
            M[k, t] += sk * y[t]

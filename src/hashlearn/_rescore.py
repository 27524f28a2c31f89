"""Exact rescoring of Hamming candidates by inner product: the numba kernel of
:class:`hashlearn.embeddings.EmbeddingIndex`.

A query's candidates are rows scattered over a float matrix that is usually far larger than
the caches (120k x 384 float32 is 184 MB, often a memory map), so rescoring is bound by memory
latency, not arithmetic: each row is 24 cache lines that the hardware prefetcher only starts
fetching after the first misses. The kernel asks for the rows a few candidates ahead with
LLVM's ``prefetch`` intrinsic (a hint: it never faults and changes no result), so their loads
overlap the dot products of the rows before them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from hashlearn._kernels import prefetch

__all__ = ["rescore_kernel"]

_LOOKAHEAD = 4  # candidates fetched ahead of the one being scored
_LINE_FLOATS = 16  # float32 values per 64-byte cache line


@njit(nogil=True, inline="always")
def _prefetch_row(V, row):
    d = V.shape[1]
    base = row * d
    for t in range(0, d, _LINE_FLOATS):
        prefetch(V, base + t)


@njit(nogil=True, inline="always")
def _dot(Q, i, V, p):
    """``Q[i] . V[p]`` accumulated in float64 (vectorised: the kernel allows reassociation)."""
    acc = 0.0
    for t in range(Q.shape[1]):
        acc += np.float64(Q[i, t]) * np.float64(V[p, t])
    return acc


# reassociation lets LLVM split the sum over SIMD lanes; no "no-NaN/no-inf" flags, so the
# comparisons with the -inf padding stay exact
@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def rescore_kernel(Q, V, cand, k, out_s, out_i, start, stop):  # pragma: no cover - compiled
    """Exact inner products of queries ``start:stop`` with their candidates; keep the best
    ``k`` by (score descending, id ascending) in ``out_s`` / ``out_i``.

    ``V`` is C-contiguous; ``cand`` rows are row numbers of ``V``, -1 for none.
    """
    c = cand.shape[1]
    for i in range(start, stop):
        for j in range(min(_LOOKAHEAD, c)):
            if cand[i, j] >= 0:
                _prefetch_row(V, cand[i, j])
        filled = 0
        for j in range(c):
            if j + _LOOKAHEAD < c and cand[i, j + _LOOKAHEAD] >= 0:
                _prefetch_row(V, cand[i, j + _LOOKAHEAD])
            p = cand[i, j]
            if p < 0:
                continue
            s = _dot(Q, i, V, p)
            if filled == k:
                last_s = out_s[i, k - 1]
                if s < last_s or (s == last_s and p > out_i[i, k - 1]):
                    continue
                pos = k - 1
            else:
                pos = filled
                filled += 1
            while pos > 0 and (
                out_s[i, pos - 1] < s or (out_s[i, pos - 1] == s and out_i[i, pos - 1] > p)
            ):
                out_s[i, pos] = out_s[i, pos - 1]
                out_i[i, pos] = out_i[i, pos - 1]
                pos -= 1
            out_s[i, pos] = s
            out_i[i, pos] = p

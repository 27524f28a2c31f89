"""Exact rescoring of Hamming candidates by a distance (``distance_kernel``), keeping each
query's top k as it scores: :class:`hashlearn.Searcher`'s re-ranking, and
:class:`hashlearn.embeddings.EmbeddingIndex`'s by inner product (``NEG_INNER``).

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

from hashlearn._primitives import prefetch

__all__ = [
    "distance_kernel",
    "keep_smallest",
    "SQEUCLIDEAN",
    "EUCLIDEAN",
    "NEG_INNER",
    "COSINE",
]

_LOOKAHEAD = 4  # candidates fetched ahead of the one being scored
_LINE_BYTES = 64  # one cache line


@njit(nogil=True, inline="always")
def _prefetch_row(V, row):
    d = V.shape[1]
    base = row * d
    for t in range(0, d, _LINE_BYTES // V.itemsize):
        prefetch(V, base + t)


@njit(nogil=True, inline="always")
def _dot(Q, i, V, p):
    """``Q[i] . V[p]`` accumulated in float64 (vectorised: the kernel allows reassociation)."""
    acc = 0.0
    for t in range(Q.shape[1]):
        acc += np.float64(Q[i, t]) * np.float64(V[p, t])
    return acc


# ----------------------------------------------------------------------- distances, top-k

SQEUCLIDEAN, EUCLIDEAN, NEG_INNER, COSINE = 0, 1, 2, 3  # ``distance_kernel``'s kinds


@njit(nogil=True, inline="always")
def _sqdist(Q, i, V, p):
    """``|Q[i] - V[p]|^2`` accumulated in float64."""
    acc = 0.0
    for t in range(Q.shape[1]):
        diff = np.float64(Q[i, t]) - np.float64(V[p, t])
        acc += diff * diff
    return acc


@njit(nogil=True, inline="always")
def _sqnorm(V, p):
    acc = 0.0
    for t in range(V.shape[1]):
        x = np.float64(V[p, t])
        acc += x * x
    return acc


@njit(nogil=True, inline="always")
def keep_smallest(out_d, out_i, i, k, filled, dist, p):
    """Insert ``(dist, p)`` into row ``i`` of an ascending top-``k`` by (distance, ``p``)
    holding ``filled`` entries; returns the new count. NaN ranks as ``inf``."""
    if dist != dist:
        dist = np.inf
    if filled == k:
        last = out_d[i, k - 1]
        if dist > last or (dist == last and p > out_i[i, k - 1]):
            return filled
        pos = k - 1
    else:
        pos = filled
        filled += 1
    while pos > 0 and (
        out_d[i, pos - 1] > dist or (out_d[i, pos - 1] == dist and out_i[i, pos - 1] > p)
    ):
        out_d[i, pos] = out_d[i, pos - 1]
        out_i[i, pos] = out_i[i, pos - 1]
        pos -= 1
    out_d[i, pos] = dist
    out_i[i, pos] = p
    return filled


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def distance_kernel(Q, V, cand, kind, k, out_d, out_i, start, stop):  # pragma: no cover
    """Exact distances of queries ``start:stop`` to their candidates, the ``k`` nearest kept
    by (distance ascending, row ascending) in ``out_d`` / ``out_i`` (rows of ``V``; filled
    with ``inf`` / -1 beforehand).

    ``kind``: ``SQEUCLIDEAN``, ``EUCLIDEAN``, ``NEG_INNER`` (``-q.x``) or ``COSINE``
    (``1 - cos``, 1 where a norm is 0). ``V`` is C-contiguous, float32 or float64, with the
    columns of ``Q``; ``cand`` rows are row numbers of ``V``, -1 for none. Each row is
    prefetched ``_LOOKAHEAD`` candidates ahead. Reassociation lets LLVM split the sums over
    SIMD lanes; there are no "no-NaN/no-inf" flags, so comparisons with the padding stay exact.
    """
    c = cand.shape[1]
    for i in range(start, stop):
        for j in range(min(_LOOKAHEAD, c)):
            if cand[i, j] >= 0:
                _prefetch_row(V, cand[i, j])
        qq = _sqnorm(Q, i) if kind == COSINE else 0.0
        filled = 0
        for j in range(c):
            if j + _LOOKAHEAD < c and cand[i, j + _LOOKAHEAD] >= 0:
                _prefetch_row(V, cand[i, j + _LOOKAHEAD])
            p = cand[i, j]
            if p < 0:
                continue
            if kind == SQEUCLIDEAN:
                dist = _sqdist(Q, i, V, p)
            elif kind == EUCLIDEAN:
                dist = np.sqrt(_sqdist(Q, i, V, p))
            elif kind == NEG_INNER:
                dist = -_dot(Q, i, V, p)
            else:
                xx = _sqnorm(V, p)
                if qq == 0.0 or xx == 0.0:
                    dist = 1.0
                else:
                    dist = 1.0 - _dot(Q, i, V, p) / (np.sqrt(qq) * np.sqrt(xx))
            filled = keep_smallest(out_d, out_i, i, k, filled, dist, p)

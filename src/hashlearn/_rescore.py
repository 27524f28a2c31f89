"""Exact rescoring of Hamming candidates by a distance (``distance_kernel``), keeping each
query's top k as it scores: :class:`hashlearn.Searcher`'s re-ranking, and
:class:`hashlearn.embeddings.EmbeddingIndex`'s by inner product (``NEG_INNER``).

A query's candidates are rows scattered over a float matrix that is usually far larger than
the caches (120k x 384 float32 is 184 MB, often a memory map), so rescoring is bound by memory
latency, not arithmetic: each row is 24 cache lines that the hardware prefetcher only starts
fetching after the first misses. The kernel asks for the rows a few candidates ahead with
LLVM's ``prefetch`` intrinsic (a hint: it never faults and changes no result), so their loads
overlap the dot products of the rows before them.

A batch of queries is scored *row by row*: its (query, candidate) pairs are sorted by
candidate row (a radix sort, linear in the pairs), then each row is read once and scored
against every query of the batch that lists it, while those queries stay in cache. Rows are
then visited in ascending order (a forward sweep that the hardware prefetcher follows) and a
row shared by several queries is fetched once, not once per query. The top k of a query
does not depend on the order its candidates are scored in (ties go to the smaller row), so
the result is the same as scoring query by query.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from hashlearn._primitives import prefetch

__all__ = [
    "distance_kernel",
    "pairs_by_row",
    "queries_per_call",
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


_RADIX_BITS = 11  # digits of the row sort: 2048 buckets, two passes up to 4M rows
#: (query, candidate) pairs scored per call: the more queries a call holds, the more often a
#: row fetched from memory serves several of them (2000 queries x 100 candidates over 60k
#: Fashion-MNIST rows: 226 ns per pair in one call, 469 in chunks of 256 queries); a call
#: keeps about 40 bytes per pair while it runs (the pairs sorted by row, and their groups)
MAX_PAIRS = 1 << 20


def queries_per_call(n_candidates: int) -> int:
    """Queries per :func:`distance_kernel` call: ``MAX_PAIRS`` pairs at most."""
    return max(1, MAX_PAIRS // max(1, n_candidates))


@njit(nogil=True, cache=True)
def pairs_by_row(cand, start, stop):
    """The (row, query) pairs of queries ``start:stop`` (rows of ``cand``, -1 skipped),
    sorted by row, queries ascending within a row: ``(rows int64, queries int64)``.

    A least-significant-digit radix sort (stable), so its cost is linear in the pairs.
    """
    c = cand.shape[1]
    n, top = 0, 0
    for i in range(start, stop):
        for j in range(c):
            p = cand[i, j]
            if p >= 0:
                n += 1
                top = max(top, p)
    rows = np.empty(n, np.int64)
    queries = np.empty(n, np.int64)
    t = 0
    for i in range(start, stop):
        for j in range(c):
            if cand[i, j] >= 0:
                rows[t], queries[t] = cand[i, j], i
                t += 1
    rows_tmp = np.empty(n, np.int64)
    queries_tmp = np.empty(n, np.int64)
    counts = np.empty(1 << _RADIX_BITS, np.int64)
    mask = (1 << _RADIX_BITS) - 1
    shift = 0
    while n > 1 and (top >> shift) > 0:
        counts[:] = 0
        for t in range(n):
            counts[(rows[t] >> shift) & mask] += 1
        total = 0
        for b in range(counts.shape[0]):
            total, counts[b] = total + counts[b], total
        for t in range(n):
            b = (rows[t] >> shift) & mask
            rows_tmp[counts[b]], queries_tmp[counts[b]] = rows[t], queries[t]
            counts[b] += 1
        rows, rows_tmp = rows_tmp, rows
        queries, queries_tmp = queries_tmp, queries
        shift += _RADIX_BITS
    return rows, queries


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def distance_kernel(Q, V, cand, kind, k, out_d, out_i, start, stop):  # pragma: no cover
    """Exact distances of queries ``start:stop`` to their candidates, the ``k`` nearest kept
    by (distance ascending, row ascending) in ``out_d`` / ``out_i`` (rows of ``V``; filled
    with ``inf`` / -1 beforehand).

    ``kind``: ``SQEUCLIDEAN``, ``EUCLIDEAN``, ``NEG_INNER`` (``-q.x``) or ``COSINE``
    (``1 - cos``, 1 where a norm is 0). ``V`` is C-contiguous, float32 or float64, with the
    columns of ``Q``; ``cand`` rows are row numbers of ``V``, -1 for none. The pairs are
    scored row by row (:func:`pairs_by_row`), each distinct row prefetched ``_LOOKAHEAD``
    rows ahead. Reassociation lets LLVM split the sums over SIMD lanes; there are no
    "no-NaN/no-inf" flags, so comparisons with the padding stay exact.
    """
    rows, queries = pairs_by_row(cand, start, stop)
    n = rows.shape[0]
    # the first pair of each distinct row, and an end marker
    first = np.empty(n + 1, np.int64)
    n_rows = 0
    for t in range(n):
        if t == 0 or rows[t] != rows[t - 1]:
            first[n_rows] = t
            n_rows += 1
    first[n_rows] = n
    filled = np.zeros(stop - start, np.int64)
    qq = np.zeros(stop - start)
    if kind == COSINE:
        for i in range(start, stop):
            qq[i - start] = _sqnorm(Q, i)
    for g in range(min(_LOOKAHEAD, n_rows)):
        _prefetch_row(V, rows[first[g]])
    for g in range(n_rows):
        if g + _LOOKAHEAD < n_rows:
            _prefetch_row(V, rows[first[g + _LOOKAHEAD]])
        p = rows[first[g]]
        xx = _sqnorm(V, p) if kind == COSINE else 0.0
        for t in range(first[g], first[g + 1]):
            i = queries[t]
            if kind == SQEUCLIDEAN:
                dist = _sqdist(Q, i, V, p)
            elif kind == EUCLIDEAN:
                dist = np.sqrt(_sqdist(Q, i, V, p))
            elif kind == NEG_INNER:
                dist = -_dot(Q, i, V, p)
            elif qq[i - start] == 0.0 or xx == 0.0:
                dist = 1.0
            else:
                dist = 1.0 - _dot(Q, i, V, p) / (np.sqrt(qq[i - start]) * np.sqrt(xx))
            filled[i - start] = keep_smallest(out_d, out_i, i, k, filled[i - start], dist, p)

"""Exhaustive Hamming distances: pairwise distance matrices and range search (all codes within
a radius), serial ``nogil`` loops over a range of queries (codes as in
:mod:`hashlearn._utils.primitives`). The k-NN scan is :mod:`hashlearn.index._knn_scan`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from hashlearn._utils.popcount import popcount64


@njit(nogil=True, inline="always")
def _hamming(a, ao, b, bo, n_words):
    """Hamming distance between ``a[ao:ao+W]`` and ``b[bo:bo+W]`` (word arrays, int offsets).

    A plain word loop: with ``W`` known only at run time (range search, MIH verification)
    it beats :func:`hashlearn._utils.popcount.code_distance`, which is for kernels compiled per
    code width (on read-only arrays the vector form ran 12x slower here).
    """
    d = 0
    for w in range(n_words):
        d += popcount64(a[ao + w] ^ b[bo + w])
    return d


# ---------------------------------------------------------------------------------------
# pairwise distances
# ---------------------------------------------------------------------------------------


@njit(nogil=True, cache=True)
def hamming_cdist(a, b, n_words, out, q_start, q_end):
    """Rows ``q_start:q_end`` of ``out[i, j] = popcount(a_i XOR b_j)`` (word arrays)."""
    n = out.shape[1]
    for i in range(q_start, q_end):
        ao = i * n_words
        for j in range(n):
            out[i, j] = _hamming(a, ao, b, j * n_words, n_words)


# ---------------------------------------------------------------------------------------
# range search: all items with distance <= radius
# ---------------------------------------------------------------------------------------


@njit(nogil=True, cache=True)
def range_count(db, n, queries, n_words, radius, counts, q_start, q_end):
    """``counts[q]`` = number of database codes within Hamming distance ``<= radius``."""
    for qi in range(q_start, q_end):
        qo = qi * n_words
        c = 0
        for i in range(n):
            if _hamming(db, i * n_words, queries, qo, n_words) <= radius:
                c += 1
        counts[qi] = c


@njit(nogil=True, cache=True)
def range_fill(db, n, queries, n_words, radius, n_bits, lims, out_d, out_p, q_start, q_end):
    """Fill the CSR results of :func:`range_count`, each query sorted by (distance, position)."""
    for qi in range(q_start, q_end):
        qo = qi * n_words
        start = lims[qi]
        stop = lims[qi + 1]
        hist = np.zeros(n_bits + 2, np.int64)
        tmp_d = np.empty(stop - start, np.int32)
        tmp_p = np.empty(stop - start, np.int64)
        c = 0
        for i in range(n):
            d = _hamming(db, i * n_words, queries, qo, n_words)
            if d <= radius:
                tmp_d[c] = d
                tmp_p[c] = i
                hist[d + 1] += 1
                c += 1
        for d in range(1, n_bits + 2):
            hist[d] += hist[d - 1]
        for j in range(c):
            d = tmp_d[j]
            slot = start + hist[d]
            hist[d] += 1
            out_d[slot] = d
            out_p[slot] = tmp_p[j]

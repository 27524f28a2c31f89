"""Numba hot loops, and nothing else.

Every function here works on plain arrays: packed codes as C-contiguous ``uint64`` words
(code ``i`` occupies ``words[i * W:(i + 1) * W]``, bit ``j`` in word ``j // 64`` at bit
``j % 64``, which is exactly the LSB-first byte layout read as little-endian words), ids as
``int64``. Callers in the public API validate inputs first; kernels trust them.

Here: pairwise distances, range search and the shared bit and hash helpers. The exhaustive
k-NN scan of :class:`hashlearn.index.FlatIndex` lives in :mod:`hashlearn._knn_scan`,
multi-index hashing's kernels in :mod:`hashlearn._mih_kernels`, the popcount primitives in
:mod:`hashlearn._popcount`.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from hashlearn._popcount import popcount64

#: splitmix64's increment, the golden ratio as a 64-bit fraction
GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)


@intrinsic
def prefetch(typingctx, array, offset):
    """Hint the CPU to load the cache line holding ``array.flat[offset]`` (read, keep)."""
    sig = types.void(array, offset)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        ptr = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32]),
            "llvm.prefetch.p0i8",
        )
        # rw = 0 (read), locality = 3 (keep in all levels), cache type = 1 (data)
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@njit(nogil=True, inline="always")
def mix64(z):
    """splitmix64's finaliser (Steele, Lea & Flood, *Fast Splittable Pseudorandom Number
    Generators*, 2014): a bijective scramble of a uint64 in which every input bit reaches
    every output bit."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(nogil=True, inline="always")
def splitmix64(x):
    """One splitmix64 output for state ``x``: ``mix64(x + GOLDEN_GAMMA)`` (uint64)."""
    return mix64(x + GOLDEN_GAMMA)


@njit(nogil=True, inline="always")
def grow_hits(pos, dist, total, needed):
    """``(pos, dist)`` (int64 positions, int32 distances) with room for ``needed`` entries:
    the capacity doubled as often as it takes, the first ``total`` entries kept."""
    cap = pos.shape[0]
    if needed <= cap:
        return pos, dist
    while cap < needed:
        cap *= 2
    new_pos = np.empty(cap, np.int64)
    new_dist = np.empty(cap, np.int32)
    new_pos[:total] = pos[:total]
    new_dist[:total] = dist[:total]
    return new_pos, new_dist


@njit(nogil=True, inline="always")
def _hamming(a, ao, b, bo, n_words):
    """Hamming distance between ``a[ao:ao+W]`` and ``b[bo:bo+W]`` (word arrays, int offsets).

    A plain word loop: with ``W`` known only at run time (range search, MIH verification)
    it beats :func:`hashlearn._popcount.code_distance`, which is for kernels compiled per
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


# ---------------------------------------------------------------------------------------
# structural checks of loaded arrays (O(n): no kernel sees an array before it is checked)
# ---------------------------------------------------------------------------------------


@njit(nogil=True, cache=True)
def strictly_increasing(a):
    """Whether ``a[i - 1] < a[i]`` for every ``i``."""
    for i in range(1, a.shape[0]):
        if a[i] <= a[i - 1]:
            return False
    return True


@njit(nogil=True, cache=True)
def any_bits(values, mask):
    """Whether some ``values[i] & mask`` is non-zero."""
    for i in range(values.shape[0]):
        if values[i] & mask:
            return True
    return False

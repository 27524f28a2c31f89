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

Over float32 vectors :func:`rescore_runner` usually picks :func:`screened_distance_kernel`:
a float32 pass bounds every distance, and only the pairs that can still reach a top k are
scored in float64 -- the top k by those float64 distances, as :func:`distance_kernel`
keeps them (the float32 bound holds whatever order the float64 loop sums in).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from hashlearn._utils.primitives import prefetch
from hashlearn.rerank._quantized import Quantized, code_sqdist, quantize_rows

__all__ = [
    "distance_kernel",
    "screened_distance_kernel",
    "quantized_screen_kernel",
    "packed_pairs_by_row",
    "rescore_runner",
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


@njit(nogil=True, inline="always")
def _exact(Q, i, V, p, kind, qq, xx):
    """The distance ``distance_kernel`` ranks by, in float64."""
    if kind == SQEUCLIDEAN:
        return _sqdist(Q, i, V, p)
    if kind == EUCLIDEAN:
        return np.sqrt(_sqdist(Q, i, V, p))
    if kind == NEG_INNER:
        return -_dot(Q, i, V, p)
    if qq == 0.0 or xx == 0.0:
        return 1.0
    return 1.0 - _dot(Q, i, V, p) / (np.sqrt(qq) * np.sqrt(xx))


#: (query, candidate) pairs scored per call: the more queries a call holds, the more often a
#: row fetched from memory serves several of them (2000 queries x 100 candidates over 60k
#: Fashion-MNIST rows: 226 ns per pair in one call, 469 in chunks of 256 queries); a call
#: keeps about 24 bytes per pair while it runs (the pairs sorted by row, and their groups)
MAX_PAIRS = 1 << 20


def queries_per_call(n_candidates: int, max_pairs: int = MAX_PAIRS) -> int:
    """Queries per :func:`distance_kernel` call: ``max_pairs`` pairs at most."""
    return max(1, max_pairs // max(1, n_candidates))


_WINDOWS = 4096  # buckets of the first pass of :func:`packed_pairs_by_row`


@njit(nogil=True, inline="always")
def window_ends(cand, start, stop, shift, n_windows):
    """Where each window of ``2^shift`` rows starts when the candidates of queries
    ``start:stop`` (-1 skipped) are grouped by window: ``ends[b]`` pairs fall in windows
    before ``b``, ``ends[n_windows]`` is their number (the first pass of a counting sort)."""
    c = cand.shape[1]
    ends = np.zeros(n_windows + 1, np.int64)
    for i in range(start, stop):
        for j in range(c):
            p = cand[i, j]
            if p >= 0:
                ends[(p >> shift) + 1] += 1
    for b in range(n_windows):
        ends[b + 1] += ends[b]
    return ends


@njit(nogil=True, cache=True)
def packed_pairs_by_row(cand, start, stop, n_rows):  # pragma: no cover
    """The (row, query) pairs of queries ``start:stop`` (-1 skipped; rows below
    ``n_rows``) as packed keys ``row << qbits | (query - start)``, sorted by row, queries
    ascending within a row: ``(keys, qbits)``.

    A most-significant-digit counting sort: one pass counts the pairs of each window of
    ``2^shift`` consecutive rows (at most ``_WINDOWS`` windows), one scatters them by
    window, then each window (a few hundred keys, in cache) is sorted by its low ``shift``
    bits. Stable, linear in the pairs, one int64 per pair moved."""
    c = cand.shape[1]
    m = stop - start
    qbits = 1
    while (1 << qbits) < m:
        qbits += 1
    top = max(n_rows, 1) - 1
    shift = 0
    while (top >> shift) >= _WINDOWS:
        shift += 1
    n_windows = (top >> shift) + 1
    ends = window_ends(cand, start, stop, shift, n_windows)
    n = ends[n_windows]
    fill = ends[:-1].copy()
    by_window = np.empty(n, np.int64)
    for i in range(start, stop):
        for j in range(c):
            p = cand[i, j]
            if p >= 0:
                b = p >> shift
                by_window[fill[b]] = (p << qbits) | (i - start)
                fill[b] += 1
    if shift == 0:
        return by_window, qbits
    keys = np.empty(n, np.int64)
    low = (1 << shift) - 1
    counts = np.empty(low + 2, np.int64)
    for b in range(n_windows):  # each window by the rows' low bits
        a, z = ends[b], ends[b + 1]
        counts[:] = 0
        for t in range(a, z):
            counts[((by_window[t] >> qbits) & low) + 1] += 1
        for r in range(low + 1):
            counts[r + 1] += counts[r]
        for t in range(a, z):
            r = (by_window[t] >> qbits) & low
            keys[a + counts[r]] = by_window[t]
            counts[r] += 1
    return keys, qbits


def pairs_by_row(cand, start, stop):
    """:func:`packed_pairs_by_row` unpacked: ``(rows int64, queries int64)``."""
    keys, qbits = packed_pairs_by_row(cand, start, stop, int(cand.max(initial=-1)) + 1)
    return keys >> qbits, (keys & ((1 << qbits) - 1)) + start


@njit(nogil=True, cache=True)
def _row_groups(cand, start, stop, n_vectors):
    """:func:`packed_pairs_by_row` of queries ``start:stop`` and the first pair of each
    distinct row: ``(keys, qbits, first, n_rows)``, ``first[n_rows]`` the end marker."""
    keys, qbits = packed_pairs_by_row(cand, start, stop, n_vectors)
    n = keys.shape[0]
    first = np.empty(n + 1, np.int64)
    n_rows = 0
    for t in range(n):
        if t == 0 or (keys[t] >> qbits) != (keys[t - 1] >> qbits):
            first[n_rows] = t
            n_rows += 1
    first[n_rows] = n
    return keys, qbits, first, n_rows


@njit(nogil=True, inline="always")
def _prefetch_group_rows(V, keys, qbits, first, g, n_rows):
    """Before scoring entry ``g`` of ``first`` (indices of packed pairs: the first pair of
    each row group, or the pairs a screen kept): the row ``_LOOKAHEAD`` entries ahead (at
    ``g = 0``, the first ``_LOOKAHEAD`` rows too)."""
    if g == 0:
        for h in range(min(_LOOKAHEAD, n_rows)):
            _prefetch_row(V, keys[first[h]] >> qbits)
    if g + _LOOKAHEAD < n_rows:
        _prefetch_row(V, keys[first[g + _LOOKAHEAD]] >> qbits)


@njit(nogil=True, inline="always")
def _query_sqnorms(Q, start, stop, kind):
    """``|Q[i]|^2`` of queries ``start:stop`` for ``COSINE`` (zeros otherwise)."""
    qq = np.zeros(stop - start)
    if kind == COSINE:
        for i in range(start, stop):
            qq[i - start] = _sqnorm(Q, i)
    return qq


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def distance_kernel(Q, V, cand, kind, k, out_d, out_i, start, stop):  # pragma: no cover
    """Exact distances of queries ``start:stop`` to their candidates, the ``k`` nearest kept
    by (distance ascending, row ascending) in ``out_d`` / ``out_i`` (rows of ``V``; filled
    with ``inf`` / -1 beforehand).

    ``kind``: ``SQEUCLIDEAN``, ``EUCLIDEAN``, ``NEG_INNER`` (``-q.x``) or ``COSINE``
    (``1 - cos``, 1 where a norm is 0). ``V`` is C-contiguous, float32 or float64, with the
    columns of ``Q``; ``cand`` rows are row numbers of ``V``, -1 for none. The pairs are
    scored row by row (:func:`packed_pairs_by_row`), each distinct row prefetched
    ``_LOOKAHEAD`` rows ahead. Reassociation lets LLVM split the sums over SIMD lanes; there are no
    "no-NaN/no-inf" flags, so comparisons with the padding stay exact.
    """
    keys, qbits, first, n_rows = _row_groups(cand, start, stop, V.shape[0])
    mask = (1 << qbits) - 1
    filled = np.zeros(stop - start, np.int64)
    qq = _query_sqnorms(Q, start, stop, kind)
    for g in range(n_rows):
        _prefetch_group_rows(V, keys, qbits, first, g, n_rows)
        p = keys[first[g]] >> qbits
        xx = _sqnorm(V, p) if kind == COSINE else 0.0
        for t in range(first[g], first[g + 1]):
            j = keys[t] & mask
            dist = _exact(Q, start + j, V, p, kind, qq[j], xx)
            filled[j] = keep_smallest(out_d, out_i, start + j, k, filled[j], dist, p)


# ------------------------------------------------------------- float32 screening, exact top-k

_U32 = 2.0**-24  # unit roundoff of float32
_U64 = 2.0**-53  # unit roundoff of float64
_TINY32 = 2.0**-150  # the largest error of one float32 rounding that underflows
#: the screen's relative error bound must stay below this to prune anything
_MAX_SCREEN_ERROR = 0.01


@njit(nogil=True, inline="always")
def _sqdist32(Q32, i, V, p):
    """``|Q32[i] - V[p]|^2`` in float32 (approximate; see ``screened_distance_kernel``)."""
    acc = np.float32(0.0)
    for t in range(Q32.shape[1]):
        diff = Q32[i, t] - V[p, t]
        acc += diff * diff
    return acc


@njit(nogil=True, inline="always")
def _dot32(Q32, i, V, p):
    """``(Q32[i] . V[p], sum_t |Q32[i, t] V[p, t]|)`` in float32."""
    acc = np.float32(0.0)
    mag = np.float32(0.0)
    for t in range(Q32.shape[1]):
        prod = Q32[i, t] * V[p, t]
        acc += prod
        mag += abs(prod)
    return acc, mag


@njit(nogil=True, inline="always")
def _sqnorm32(V, p):
    acc = np.float32(0.0)
    for t in range(V.shape[1]):
        acc += V[p, t] * V[p, t]
    return acc


@njit(nogil=True, inline="always")
def _keep_bound(bound, i, k, filled, hi):
    """Insert ``hi`` into row ``i`` of the ascending ``k`` smallest upper bounds."""
    if filled == k:
        if hi >= bound[i, k - 1]:
            return filled
        pos = k - 1
    else:
        pos = filled
        filled += 1
    while pos > 0 and bound[i, pos - 1] > hi:
        bound[i, pos] = bound[i, pos - 1]
        pos -= 1
    bound[i, pos] = hi
    return filled


@njit(nogil=True, inline="always")
def _note_bounds(bound, n_bound, j, k, lo, hi, t, maybe, maybe_bounds, n_maybe):
    """Pass 1 of the screened kernels, for pair ``t`` of query ``j`` with bounds ``(lo,
    hi)``: ``hi`` joins the query's k smallest upper bounds (``bound[j]``), and the pair is
    noted in ``maybe`` (with ``(lo, hi)`` in ``maybe_bounds``) unless ``lo`` already
    exceeds the k-th of them -- the k-th only decreases, so a pair not noted can never be
    kept. Returns the new count."""
    n_bound[j] = _keep_bound(bound, j, k, n_bound[j], hi)
    if lo <= bound[j, k - 1]:
        maybe[n_maybe] = t
        maybe_bounds[n_maybe, 0] = lo
        maybe_bounds[n_maybe, 1] = hi
        n_maybe += 1
    return n_maybe


@njit(nogil=True, inline="always")
def _settled_value(kind, lo, hi):
    """A value inside ``[lo, hi]`` (the bounds of a pair's computed distance; squared for
    ``EUCLIDEAN``, see :func:`_distance_interval`) that rounds to float32 exactly as every
    distance inside does, or NaN where the bounds straddle a float32 rounding boundary."""
    if kind == EUCLIDEAN:
        low, high = np.sqrt(lo) * (1.0 - 4.0 * _U64), np.sqrt(hi) * (1.0 + 4.0 * _U64)
        value = np.sqrt(lo)
    else:
        low, high, value = lo, hi, lo
    if np.float32(low) == np.float32(high) and low > -np.inf and high < np.inf:
        return value
    return np.nan


@njit(nogil=True, inline="always")
def _settle_sorted(kind, order, a, b, bounds, needs, values):
    """For one query's kept pairs ``order[a:b]`` (rows of ``bounds``, ascending by lower
    bound): ``needs[s]`` False and ``values[s]`` its settled distance where pair ``s``'s
    bounds fix its float32 distance (:func:`_settled_value`) and are apart, by a few
    float64 ulps, from those of every other pair of the query -- its rank is then certain
    too; ``needs[s]`` True otherwise."""
    reach = -np.inf  # the largest upper bound of the query's pairs so far
    for r in range(a, b):
        s = order[r]
        lo, hi = bounds[s, 0], bounds[s, 1]
        gap = 8.0 * _U64 * (abs(lo) + abs(hi))
        apart = r == a or reach + gap < lo
        if r + 1 < b:
            apart = apart and hi + gap < bounds[order[r + 1], 0]
        reach = max(reach, hi)
        needs[s] = True
        if apart:
            values[s] = _settled_value(kind, lo, hi)
            needs[s] = values[s] != values[s]


@njit(nogil=True, inline="always")
def _insert_by_lower(order, a, end, s, bounds):
    """Insert pair ``s`` into ``order[a:end]`` (ascending by ``bounds[., 0]``)."""
    pos = end
    while pos > a and bounds[order[pos - 1], 0] > bounds[s, 0]:
        order[pos] = order[pos - 1]
        pos -= 1
    order[pos] = s


@njit(nogil=True, inline="always")
def _needs_exact(kind, keys, qbits, kept, kept_bounds, n_kept, m):
    """Which kept pairs must be scored exactly when only the float32 results matter
    (:func:`_settle_sorted`, per query): ``(needs, values)``."""
    mask = (1 << qbits) - 1
    ends = np.zeros(m + 1, np.int64)
    for s in range(n_kept):
        ends[(keys[kept[s]] & mask) + 1] += 1
    for j in range(m):
        ends[j + 1] += ends[j]
    fill = ends[:-1].copy()
    order = np.empty(n_kept, np.int64)  # kept pairs grouped by query, by lower bound
    for s in range(n_kept):
        j = keys[kept[s]] & mask
        _insert_by_lower(order, ends[j], fill[j], s, kept_bounds)
        fill[j] += 1
    needs = np.ones(n_kept, np.bool_)
    values = np.empty(n_kept)
    for j in range(m):
        _settle_sorted(kind, order, ends[j], ends[j + 1], kept_bounds, needs, values)
    return needs, values


@njit(nogil=True, inline="always")
def _score_survivors(Q, V, kind, k, keys, qbits, notes, qq, start, out_d, out_i, settle32):
    """The second pass of the screened kernels: of the pairs noted by :func:`_note_bounds`
    (``notes = (maybe, maybe_bounds, n_maybe, bound)``: pair ``keys[maybe[s]]``, packed as
    by :func:`packed_pairs_by_row`, with its bounds; the k smallest upper bounds of each
    query), those whose lower bound does not exceed their query's final k-th smallest
    upper bound are scored in float64 exactly as :func:`distance_kernel` scores them, in
    their order, each row prefetched ``_LOOKAHEAD`` survivors ahead; the top k by
    (distance, row) kept. With ``settle32`` (the caller keeps float32 distances) the pairs
    :func:`_needs_exact` settles are kept with their settled value instead, without
    reading their rows. Returns the number of pairs scored exactly."""
    maybe, maybe_bounds, n_maybe, bound = notes
    mask = (1 << qbits) - 1
    kept = np.empty(n_maybe, np.int64)
    kept_bounds = np.empty((n_maybe, 2))
    n_kept = 0
    for s in range(n_maybe):
        if maybe_bounds[s, 0] <= bound[keys[maybe[s]] & mask, k - 1]:
            kept[n_kept] = maybe[s]
            kept_bounds[n_kept] = maybe_bounds[s]
            n_kept += 1
    filled = np.zeros(bound.shape[0], np.int64)
    if settle32:
        needs, values = _needs_exact(kind, keys, qbits, kept, kept_bounds, n_kept, bound.shape[0])
        n_exact = 0
        for s in range(n_kept):
            if needs[s]:
                kept[n_exact] = kept[s]
                n_exact += 1
            else:
                p = keys[kept[s]] >> qbits
                j = keys[kept[s]] & mask
                filled[j] = keep_smallest(out_d, out_i, start + j, k, filled[j], values[s], p)
        n_kept = n_exact
    xx = 0.0
    last = -1
    for s in range(n_kept):
        _prefetch_group_rows(V, keys, qbits, kept, s, n_kept)
        p = keys[kept[s]] >> qbits
        j = keys[kept[s]] & mask
        if kind == COSINE and p != last:
            xx = _sqnorm(V, p)
        last = p
        dist = _exact(Q, start + j, V, p, kind, qq[j], xx)
        filled[j] = keep_smallest(out_d, out_i, start + j, k, filled[j], dist, p)
    return n_kept


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def screened_distance_kernel(
    Q, Q32, q_err, V, cand, kind, k, out_d, out_i, start, stop
):  # pragma: no cover
    """:func:`distance_kernel`'s result -- the top k by the float64 distance, computed by
    the same inlined loop -- in two passes over float32 vectors ``V``.

    Pass 1 scores every pair in float32 (twice the SIMD lanes of float64, half the bytes per
    query) and turns each score into an interval certain to hold the float64 distance:
    Higham's bound on a floating-point sum of ``n`` terms in any order ("Accuracy and
    Stability of Numerical Algorithms", 2002, eq. 3.5), ``|err| <= gamma_n sum_t |term_t|``
    with ``gamma_n = n u / (1 - n u)``, doubled here to cover the float64 side too, plus
    ``3 n 2^-150`` for gradual underflow; a pair whose score overflows gets ``(-inf, inf)``.
    ``Q32`` is ``Q`` rounded to float32 and ``q_err[i] = |Q[i] - Q32[i]|`` (float64); for
    the Euclidean kinds the triangle inequality widens the interval by it, the inner-product
    kinds need ``q_err == 0``. Per query, ``T`` is the k-th smallest upper bound: a pair
    whose lower bound exceeds ``T`` has k pairs strictly nearer and cannot be kept.
    Pass 2 computes the float64 distance of the other pairs, exactly as
    :func:`distance_kernel` does, and keeps the top k by (distance, row). Both passes go
    row by row (:func:`pairs_by_row`). Returns the number of pairs scored in float64.

    Where it pays: the float32 pass reads half the query bytes and runs twice the SIMD
    lanes, so it gains where the arithmetic shows, when each row serves several queries
    (Fashion-MNIST 60k, 1000 candidates per query: 121 vs 165 ns per pair); when every
    pair is a row fetched from memory (100 candidates) both kernels wait on the same
    loads (see ``docs/results.md``, issue 14 item 6).
    """
    keys, qbits, first, n_rows = _row_groups(cand, start, stop, V.shape[0])
    n = keys.shape[0]
    mask = (1 << qbits) - 1
    m = stop - start
    d = V.shape[1]
    rel = 2.0 * (d + 4) * _U32 / (1.0 - (d + 4) * _U32)  # relative bound of a float32 sum
    tiny = 3.0 * (d + 1) * _TINY32
    out_rel = 2.0 * (d + 8) * _U64  # float64 rounding of the exact side
    qq = _query_sqnorms(Q, start, stop, kind)
    # pass 1: float32 scores -> (lower, upper) bounds; the k smallest upper bounds per query
    maybe = np.empty(n, np.int64)  # pages only touched where pairs are noted
    maybe_bounds = np.empty((n, 2))
    n_maybe = 0
    bound = np.full((m, k), np.inf)
    n_bound = np.zeros(m, np.int64)
    for g in range(n_rows):
        _prefetch_group_rows(V, keys, qbits, first, g, n_rows)
        p = keys[first[g]] >> qbits
        xx_lo = xx_hi = 0.0
        if kind == COSINE:
            xx32 = np.float64(_sqnorm32(V, p))
            xx_lo = xx32 * (1.0 - rel) - tiny
            xx_hi = xx32 * (1.0 + rel) + tiny
        for t in range(first[g], first[g + 1]):
            j = keys[t] & mask
            i = start + j
            lo = -np.inf
            hi = np.inf
            if kind == SQEUCLIDEAN or kind == EUCLIDEAN:
                a = np.float64(_sqdist32(Q32, i, V, p))
                if a < np.inf:
                    r_lo = np.sqrt(max(0.0, a * (1.0 - rel) - tiny)) - q_err[i]
                    r_hi = np.sqrt(a * (1.0 + rel) + tiny) + q_err[i]
                    r_lo = max(0.0, r_lo)
                    lo = r_lo * r_lo * (1.0 - out_rel)
                    hi = r_hi * r_hi * (1.0 + out_rel)
                    if kind == EUCLIDEAN:
                        lo, hi = np.sqrt(lo), np.sqrt(hi)
            else:
                a32, mag32 = _dot32(Q32, i, V, p)
                a = np.float64(a32)
                err = np.float64(mag32) * rel + tiny
                if a < np.inf and a > -np.inf and err < np.inf:
                    dot_lo = a - err
                    dot_hi = a + err
                    if kind == NEG_INNER:
                        lo = -dot_hi - out_rel * np.float64(mag32)
                        hi = -dot_lo + out_rel * np.float64(mag32)
                    elif qq[j] > 0.0 and xx_lo > 0.0 and xx_hi < np.inf:
                        nq = np.sqrt(qq[j])
                        nx_lo, nx_hi = np.sqrt(xx_lo), np.sqrt(xx_hi)
                        cos_hi = dot_hi / (nq * (nx_lo if dot_hi >= 0.0 else nx_hi))
                        cos_lo = dot_lo / (nq * (nx_hi if dot_lo >= 0.0 else nx_lo))
                        lo = 1.0 - cos_hi - out_rel * 4.0
                        hi = 1.0 - cos_lo + out_rel * 4.0
            n_maybe = _note_bounds(bound, n_bound, j, k, lo, hi, t, maybe, maybe_bounds, n_maybe)
    notes = (maybe, maybe_bounds, n_maybe, bound)
    return _score_survivors(Q, V, kind, k, keys, qbits, notes, qq, start, out_d, out_i, False)


# ------------------------------------------------------------ 8-bit screening, exact top-k

_SUBNORMAL_SLACK = 2.0**-1068  # per column: float64 sums whose terms underflow
_NORMAL_SQNORM = 2.0**-1000  # squared norms above this are float64 sums accurate to gamma_d


@njit(nogil=True, inline="always")
def _distance_interval(kind, r_lo, r_hi, q_sq, x_sq, d, out_rel):
    """Bounds on the float64 distance :func:`_exact` computes for a pair whose Euclidean
    distance lies in ``[r_lo, r_hi]``, given ``|q|^2`` and ``|x|^2`` as float64 sums
    (``(-inf, inf)`` where anything is not finite). The inner-product kinds use ``q . x =
    (|q|^2 + |x|^2 - |q - x|^2) / 2``; ``out_rel`` (twice Higham's ``gamma_d`` of float64)
    covers the rounding of every float64 sum involved, and ``_SUBNORMAL_SLACK`` times
    ``d`` its absolute error where terms underflow; a cosine with a squared norm below
    ``_NORMAL_SQNORM`` (whose float64 sum may be off by much more than ``gamma_d``
    relatively) is left unbounded.

    ``EUCLIDEAN`` is bounded in the squared domain, saving two square roots a pair: the
    computed distance (the rounded root of the computed square) lies within the real roots
    of the two bounds (``out_rel`` covers the root's rounding too), so comparing squared
    bounds prunes exactly the pairs that comparing their roots would."""
    if not (r_hi < np.inf and q_sq < np.inf and x_sq < np.inf):
        return -np.inf, np.inf
    tiny = d * _SUBNORMAL_SLACK
    if kind == SQEUCLIDEAN or kind == EUCLIDEAN:  # squared for both (see the docstring)
        return r_lo * r_lo * (1.0 - out_rel) - tiny, r_hi * r_hi * (1.0 + out_rel) + tiny
    slack = out_rel * (q_sq + x_sq + r_hi * r_hi) + tiny
    dot_lo = 0.5 * (q_sq + x_sq - r_hi * r_hi) - slack
    dot_hi = 0.5 * (q_sq + x_sq - r_lo * r_lo) + slack
    if kind == NEG_INNER:
        return -dot_hi, -dot_lo
    if q_sq == 0.0 or x_sq == 0.0:  # exactly when _exact's norms are 0 (sums of squares)
        return 1.0, 1.0
    norms = np.sqrt(q_sq) * np.sqrt(x_sq)
    if not (norms < np.inf and q_sq >= _NORMAL_SQNORM and x_sq >= _NORMAL_SQNORM):
        return -np.inf, np.inf
    return 1.0 - dot_hi / norms - 8.0 * out_rel, 1.0 - dot_lo / norms + 8.0 * out_rel


@njit(nogil=True, inline="always")
def _code_interval(kind, total, step, slack, q_sq, x_sq, d, out_rel):
    """:func:`_distance_interval` of a pair whose codes are ``total = sum_j (a_j - c_j)^2``
    apart and whose quantization errors add up to ``slack``: ``|q - x|`` lies within
    ``step sqrt(total) +- slack`` (the float64 rounding of ``step sqrt(total)`` covered).
    """
    r = step * np.sqrt(np.float64(total))
    r_lo = max(0.0, r * (1.0 - 16.0 * _U64) - slack)
    r_hi = r * (1.0 + 16.0 * _U64) + slack
    return _distance_interval(kind, r_lo, r_hi, q_sq, x_sq, d, out_rel)


_NO_CUTOFF = np.iinfo(np.int64).max


@njit(nogil=True, inline="always")
def _code_cutoff(threshold, step, slack, d, out_rel):
    """The largest code sum ``S`` whose Euclidean-kind lower bound (:func:`_code_interval`
    with error ``slack``) may not exceed ``threshold``: every sum above it bounds the
    distance above ``threshold`` (the bound is non-decreasing in ``S``, and the loop
    checks ``S + 1`` with the very function pass 1 uses)."""
    if not (threshold < np.inf and slack < np.inf):
        return _NO_CUTOFF
    guess = (np.sqrt(max(threshold, 0.0) / (1.0 - out_rel)) + slack) / step
    guess = guess * guess * (1.0 - 1e-9)
    if not guess < 2.0**60:
        return _NO_CUTOFF
    cut = np.int64(guess)
    while _code_interval(SQEUCLIDEAN, cut + 1, step, slack, 0.0, 0.0, d, out_rel)[0] <= threshold:
        cut += 1
    return cut


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def quantized_screen_kernel(
    Q, V, q_screen, x_screen, step, err_cap, cand, kind, k, out_d, out_i, start, stop, settle32
):  # pragma: no cover
    """:func:`distance_kernel`'s result -- the top k by the float64 distance, computed by
    the same inlined loop -- screened by 8-bit codes (:mod:`hashlearn.rerank._quantized`).

    Pass 1 reads each pair's codes (``d`` bytes of the row instead of ``4d`` or ``8d``),
    computes the exact integer ``S = sum_j (a_j - c_j)^2`` and bounds the Euclidean
    distance by the triangle inequality, ``|q - x| in step sqrt(S) +- (q_err + x_err)``
    (``q_err``, ``x_err``: the certified quantization errors), then the float64 distance of
    ``kind`` by :func:`_distance_interval`. Per query, ``T`` is the k-th smallest upper
    bound; pass 2 (:func:`_score_survivors`) scores in float64 only the pairs whose lower
    bound does not exceed ``T`` -- the others have k pairs strictly nearer. Pairs go by
    row (:func:`packed_pairs_by_row`). ``q_screen = (codes, err, sqnorm)`` of the queries
    (:func:`hashlearn.rerank._quantized.quantize_rows`), ``x_screen`` the same of the rows of ``V``
    (:func:`hashlearn.rerank._quantized.quantize`), on the grid of step ``step``; ``err_cap`` the
    largest finite row error (``Quantized.err_cap``). With ``settle32`` (the caller keeps
    float32 distances, as :class:`hashlearn.Searcher` does) a kept pair whose bounds settle
    its float32 distance and its rank is not scored (see :func:`_needs_exact`): on data the
    8-bit grid holds exactly (8-bit images, SIFT) pass 2 then reads almost no rows. Returns
    the number of pairs scored in float64.
    """
    q_codes, q_err, q_sq = q_screen
    x_codes, x_err, x_sq = x_screen
    keys, qbits = packed_pairs_by_row(cand, start, stop, V.shape[0])
    n = keys.shape[0]
    m = stop - start
    mask = (1 << qbits) - 1
    d = V.shape[1]
    out_rel = 2.0 * (d + 8) * _U64
    maybe = np.empty(n, np.int64)  # pages only touched where pairs are noted
    maybe_bounds = np.empty((n, 2))
    n_maybe = 0
    bound = np.full((m, k), np.inf)
    n_bound = np.zeros(m, np.int64)
    # Euclidean kinds: code sums above cutoff[j] certainly bound the distance above query
    # j's current T, for any row whose error is at most err_cap -- an integer comparison
    # that spares most pairs the bounds once T has settled
    cutoff = np.full(m, _NO_CUTOFF)
    if kind != SQEUCLIDEAN and kind != EUCLIDEAN:
        err_cap = -1.0
    for t in range(n):
        p = keys[t] >> qbits
        j = keys[t] & mask
        i = start + j
        total = code_sqdist(q_codes, i, x_codes, p)
        if total > cutoff[j] and x_err[p] <= err_cap:
            continue
        slack = q_err[i] + x_err[p]
        lo, hi = _code_interval(kind, total, step, slack, q_sq[i], x_sq[p], d, out_rel)
        before = bound[j, k - 1]
        n_maybe = _note_bounds(bound, n_bound, j, k, lo, hi, t, maybe, maybe_bounds, n_maybe)
        if err_cap >= 0.0 and bound[j, k - 1] < before:
            cutoff[j] = _code_cutoff(bound[j, k - 1], step, q_err[i] + err_cap, d, out_rel)
    qq = _query_sqnorms(Q, start, stop, kind)
    notes = (maybe, maybe_bounds, n_maybe, bound)
    return _score_survivors(Q, V, kind, k, keys, qbits, notes, qq, start, out_d, out_i, settle32)


@njit(nogil=True, cache=True)
def _rounded_queries(Q):  # pragma: no cover
    """``(Q32, q_err)``: float64 queries rounded to float32 and each row's rounding error
    ``|Q[i] - Q32[i]|``, slightly enlarged (``inf`` where a value is not finite in float32)."""
    Q32 = np.empty(Q.shape, np.float32)
    q_err = np.zeros(Q.shape[0])
    for i in range(Q.shape[0]):
        acc = 0.0
        for t in range(Q.shape[1]):
            r = np.float32(Q[i, t])
            Q32[i, t] = r
            diff = Q[i, t] - np.float64(r)
            acc += diff * diff
            if not np.isfinite(r):
                acc = np.inf
        q_err[i] = np.sqrt(acc) * (1.0 + 1e-9)
    return Q32, q_err


def rescore_runner(
    Q, V, cand, kind, k, out_d, out_i, screen: Quantized | None = None, float32_results=False
):
    """``run(start, stop)`` scoring queries ``start:stop`` of ``Q`` against their candidate
    rows ``cand`` of ``V`` into ``out_d`` / ``out_i`` (see :func:`distance_kernel`).

    With at least 2k candidates per query: the 8-bit screen
    (:func:`quantized_screen_kernel`) when ``screen``, the 8-bit copy of ``V``
    (:func:`hashlearn.rerank._quantized.quantize`), is given; else, over float32 ``V``, the
    float32 screen where it applies -- a screen tight enough to prune (``d`` below ~20k
    columns), finite float32 queries, and for the inner-product kinds queries exact in
    float32; else the float64 kernel. The top k by float64 distance either way; with
    ``float32_results`` the 8-bit screen may leave a distance exact only to its float32
    rounding (the caller rounds them so), never a different top k."""
    d = V.shape[1]
    if screen is not None and cand.shape[1] >= 2 * k:
        if screen.codes.shape[0] != V.shape[0] or screen.lo.shape[0] != d:
            raise ValueError("the 8-bit screen does not match the vectors")
        q_screen = quantize_rows(Q, screen.lo, screen.step, screen.codes.shape[1])
        x_screen, step, cap = (screen.codes, screen.err, screen.sqnorm), screen.step, screen.err_cap
        settle32 = bool(float32_results)
        return lambda start, stop: quantized_screen_kernel(
            Q, V, q_screen, x_screen, step, cap, cand, kind, k, out_d, out_i, start, stop, settle32
        )
    screened = (
        V.dtype == np.float32
        and cand.shape[1] >= 2 * k
        and 2.0 * (d + 4) * _U32 < _MAX_SCREEN_ERROR
    )
    if screened:
        if Q.dtype == np.float32:
            Q32, q_err = Q, np.zeros(Q.shape[0])
            screened = bool(np.isfinite(Q).all())
        else:
            Q32, q_err = _rounded_queries(Q)
            screened = bool(np.isfinite(q_err).all())
            screened = screened and (kind in (SQEUCLIDEAN, EUCLIDEAN) or not q_err.any())
    if not screened:
        return lambda start, stop: distance_kernel(Q, V, cand, kind, k, out_d, out_i, start, stop)
    return lambda start, stop: screened_distance_kernel(
        Q, Q32, q_err, V, cand, kind, k, out_d, out_i, start, stop
    )

"""Exact re-ranking over CSR vectors (:class:`hashlearn.Searcher` with scipy.sparse input):
:func:`csr_distance_kernel` scores every (query, candidate) pair, and
:func:`csr_sketch_kernel` first bounds every pair from below by a dense sketch
(:mod:`hashlearn.rerank._sketch`) and scores exactly only the pairs that can still be among the k
nearest. Both keep each query's top k by (distance, row) as they score, and both score a
pair with the same inlined loop (:func:`_pair_distance`), so their results agree.

Each query is scattered once into a map from columns to its values (:func:`csr_scratch`), so a
candidate ``x`` costs O(nnz(x) + nnz(q)) branch-free steps instead of a merge of two index
lists.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from hashlearn._utils.primitives import prefetch
from hashlearn.rerank._kernels import (
    _SUBNORMAL_SLACK,
    _U64,
    EUCLIDEAN,
    NEG_INNER,
    SQEUCLIDEAN,
    _distance_interval,
    keep_smallest,
    window_ends,
)
from hashlearn.rerank._quantized import tagged_sqdist

__all__ = [
    "SKETCH_PAIRS",
    "csr_distance_kernel",
    "csr_scratch",
    "csr_sketch_kernel",
    "row_sqnorms",
]

#: (query, candidate) pairs per :func:`csr_sketch_kernel` call: each call streams the rows'
#: sketch codes once (about 30 MB for 60k Fashion-MNIST bags of patches), so larger calls
#: share that among more queries (1000 candidates: 2000 queries a call 0.94x the time of
#: 1048, 700 queries 1.08x); a call keeps 12 bytes per pair (the bounds and the grouped keys)
SKETCH_PAIRS = 1 << 21

_LOOKAHEAD = 4  # candidate rows prefetched ahead of the one being scored
_LOOKAHEAD_PAIRS = 8  # pairs ahead whose row's sketch codes start loading
_WINDOW_BYTES = 256 * 1024  # sketch codes of the rows of one window of pairs


@njit(nogil=True, cache=True)
def _finish(kind, sq, dot, qq, xx):  # pragma: no cover - compiled
    if kind == SQEUCLIDEAN:
        return sq
    if kind == EUCLIDEAN:
        return np.sqrt(sq)
    if kind == NEG_INNER:
        return -dot
    if qq == 0.0 or xx == 0.0:
        return 1.0
    return 1.0 - dot / (np.sqrt(qq) * np.sqrt(xx))


@njit(nogil=True, inline="always")
def _prefetch_csr_row(v_data, v_ind, v_ptr, p):
    if p >= 0:
        for b in range(v_ptr[p], v_ptr[p + 1], 64 // v_data.itemsize):  # one line of values
            prefetch(v_data, b)
            prefetch(v_ind, b)


@njit(nogil=True, inline="always")
def _prefetch_ahead(data, ind, ptr, cand, i, j):
    """Before scoring candidate ``j`` of query ``i``: the row ``_LOOKAHEAD`` candidates
    ahead (at ``j = 0``, the first ``_LOOKAHEAD`` rows too)."""
    c = cand.shape[1]
    if j == 0:
        for h in range(min(_LOOKAHEAD, c)):
            _prefetch_csr_row(data, ind, ptr, cand[i, h])
    if j + _LOOKAHEAD < c:
        _prefetch_csr_row(data, ind, ptr, cand[i, j + _LOOKAHEAD])


def csr_scratch(n_cols: int, q_ptr: np.ndarray) -> tuple:
    """The working arrays of the CSR kernels for queries with row pointers ``q_ptr``:
    ``(slot_of, q_vals, matched)``: per column, the 1-based position of the query's non-zero
    in it (0: none; ``np.zeros`` maps untouched pages lazily, so the array costs only the
    columns queries use), the query's values after a 0 for slot 0, and each slot's last
    stamp."""
    width = int(np.diff(q_ptr).max(initial=0)) + 1
    return np.zeros(n_cols, np.int32), np.zeros(width), np.zeros(width, np.int64)


@njit(nogil=True, inline="always")
def _scatter_query(q_data, q_ind, q0, q1, scratch):
    """Query non-zeros ``q0:q1`` into ``scratch`` (:func:`csr_scratch`); returns ``|q|^2``."""
    slot_of, q_vals, _ = scratch
    qq = 0.0
    for a in range(q0, q1):
        qa = np.float64(q_data[a])
        slot_of[q_ind[a]] = a - q0 + 1
        q_vals[a - q0 + 1] = qa
        qq += qa * qa
    return qq


@njit(nogil=True, inline="always")
def _clear_query(q_ind, q0, q1, scratch):
    slot_of = scratch[0]
    for a in range(q0, q1):
        slot_of[q_ind[a]] = 0


@njit(nogil=True, cache=True, fastmath={"reassoc"})
def _unmatched_sq(q_vals, matched, n_q, stamp):  # pragma: no cover - compiled
    """``sum q_a^2`` over the query's slots ``1..n_q`` not marked with ``stamp``: non-negative
    terms, so any order of summation (vectorised) keeps the relative error below ``n_q u``."""
    sq = 0.0
    for a in range(1, n_q + 1):
        qa = q_vals[a]
        sq += qa * qa * np.float64(matched[a] != stamp)
    return sq


@njit(nogil=True, inline="always")
def _pair_distance(n_q, vectors, p, side, i, kind, qq, scratch, stamp):
    """The distance of query ``i`` (``n_q`` non-zeros, scattered in ``scratch`` by
    :func:`_scatter_query`) to row ``p`` of ``vectors = (data, indices, indptr)``:
    ``|x - q|^2 = sum_{j in x} (x_j - q_j)^2 + sum_{j in q, j not in x} q_j^2``, the second
    sum over the query's non-zeros that no non-zero of the candidate marked with ``stamp``
    (every term is a square: no cancellation). The candidate's columns find the query's
    values through ``slot_of`` (slot 0 holds 0.0: a column the query lacks); the marks go to
    the small ``matched`` array. With side features (``f_w`` non-empty; kind ``SQEUCLIDEAN``
    only) plus ``sum_t f_w[t] (f_v[p, t] - f_q[i, t])^2``, the implicit learned metric
    (``side = (f_q, f_v, f_w)``)."""
    v_data, v_ind, v_ptr = vectors
    f_q, f_v, f_w = side
    slot_of, q_vals, matched = scratch
    sq = 0.0
    dot = 0.0
    xx = 0.0
    for b in range(v_ptr[p], v_ptr[p + 1]):
        t = slot_of[v_ind[b]]
        xb = np.float64(v_data[b])
        qa = q_vals[t]
        diff = xb - qa
        sq += diff * diff
        dot += qa * xb
        xx += xb * xb
        matched[t] = stamp
    sq += _unmatched_sq(q_vals, matched, n_q, stamp)
    for t in range(f_w.shape[0]):
        diff = f_q[i, t] - f_v[p, t]
        sq += f_w[t] * (diff * diff)
    return _finish(kind, sq, dot, qq, xx)


@njit(nogil=True, cache=True)
def csr_distance_kernel(
    queries, vectors, side, cand, kind, k, out_d, out_i, start, stop, scratch
):  # pragma: no cover - compiled
    """``rerank._kernels.distance_kernel`` for CSR queries and vectors, ``queries`` and ``vectors``
    each ``(data, indices int32 or int64, indptr int64)`` (canonical: sorted, distinct column
    indices), ``side = (f_q, f_v, f_w)`` the side features (zero-width without);
    ``scratch`` the working arrays (:func:`csr_scratch`). The rows of the candidates
    ``_LOOKAHEAD`` ahead are prefetched."""
    q_data, q_ind, q_ptr = queries
    v_data, v_ind, v_ptr = vectors
    c = cand.shape[1]
    stamp = 0  # matched[t]: the last candidate (numbered from 1) with a non-zero in slot t
    for i in range(start, stop):
        q0, q1 = q_ptr[i], q_ptr[i + 1]
        qq = _scatter_query(q_data, q_ind, q0, q1, scratch)
        filled = 0
        for j in range(c):
            _prefetch_ahead(v_data, v_ind, v_ptr, cand, i, j)
            p = cand[i, j]
            if p < 0:
                continue
            stamp += 1
            dist = _pair_distance(q1 - q0, vectors, p, side, i, kind, qq, scratch, stamp)
            filled = keep_smallest(out_d, out_i, i, k, filled, dist, p)
        _clear_query(q_ind, q0, q1, scratch)


# ------------------------------------------------------------------ the screened kernel


@njit(nogil=True, cache=True)
def row_sqnorms(data, indptr):  # pragma: no cover - compiled
    """Each CSR row's ``|x|^2`` as a float64 sum."""
    out = np.empty(indptr.shape[0] - 1)
    for p in range(out.shape[0]):
        sq = 0.0
        for b in range(indptr[p], indptr[p + 1]):
            x = np.float64(data[b])
            sq += x * x
        out[p] = sq
    return out


@njit(nogil=True, inline="always")
def _sketch_lower(kind, radius, q_err, qq, x_sq, p, d, out_rel):
    """A lower bound on the float64 distance of ``kind`` (squared for ``EUCLIDEAN``, see
    ``rerank._kernels._distance_interval``) of a pair with ``|q - x| >= radius - q_err``
    (:func:`_sketch_radii`) and ``|q - x| <= |q| + |x|``; row ``p``'s ``|x|^2``
    (``x_sq[p]``) is read only for the inner-product kinds."""
    r_lo = max(0.0, radius - q_err)
    if kind == SQEUCLIDEAN or kind == EUCLIDEAN:
        return _distance_interval(kind, r_lo, 0.0, qq, 0.0, d, out_rel)[0]
    xx = x_sq[p]
    r_hi = (np.sqrt(qq) + np.sqrt(xx)) * (1.0 + out_rel)
    return _distance_interval(kind, r_lo, r_hi, qq, xx, d, out_rel)[0]


@njit(nogil=True, inline="always")
def _radius_cut(kind, reach, q_err, qq, d, out_rel):
    """A radius (:func:`_sketch_radii`) above which :func:`_sketch_lower` exceeds ``reach``
    for the Euclidean kinds, with a margin of 1e-9 relative to cover its roundings
    (``inf`` for the other kinds, or while the query's ``|q|^2`` or ``reach`` is not
    finite): the candidates beyond it are skipped without computing their bounds."""
    if not (kind == SQEUCLIDEAN or kind == EUCLIDEAN) or not (reach < np.inf and qq < np.inf):
        return np.inf
    r_lo = np.sqrt(max(0.0, reach + d * _SUBNORMAL_SLACK) / (1.0 - out_rel))
    return (r_lo + q_err) * (1.0 + 1e-9)


@njit(nogil=True, inline="always")
def _reach(kind, out_d, i, k, filled):
    """The k-th distance kept for query ``i`` in the domain of :func:`_sketch_lower`
    (squared for ``EUCLIDEAN``, enlarged to cover the rounding of the square); ``inf``
    while fewer than k are kept. A pair whose lower bound exceeds it cannot be kept."""
    if filled < k:
        return np.inf
    t = out_d[i, k - 1]
    if kind == EUCLIDEAN:
        return t * t * (1.0 + 4.0 * _U64)
    return t


@njit(nogil=True, cache=True)
def _slots_by_window(cand, start, stop, n_rows, shift, radii):  # pragma: no cover
    """The candidates of queries ``start:stop`` (rows below ``n_rows``) grouped by windows
    of ``2^shift`` rows (a counting sort, queries ascending within a window): ``(keys,
    ends, slot_bits)``, each int32 key ``(row mod 2^shift) << slot_bits | slot`` (``slot =
    (i - start) c + j``, the pair's flat position), window ``b``'s keys
    ``keys[ends[b]:ends[b + 1]]``. Padding is left out, its ``radii[slot]`` set to NaN.
    Needs ``slot_bits + shift <= 31``."""
    c = cand.shape[1]
    n_windows = ((max(n_rows, 1) - 1) >> shift) + 1
    ends = window_ends(cand, start, stop, shift, n_windows)
    fill = ends[:-1].copy()
    keys = np.empty(ends[n_windows], np.int32)
    slot_bits = 1
    while (1 << slot_bits) < (stop - start) * c:
        slot_bits += 1
    low = (1 << shift) - 1
    for i in range(start, stop):
        for j in range(c):
            p = cand[i, j]
            if p >= 0:
                b = p >> shift
                keys[fill[b]] = ((p & low) << slot_bits) | ((i - start) * c + j)
                fill[b] += 1
            else:
                radii[(i - start) * c + j] = np.nan
    return keys, ends, slot_bits


@njit(nogil=True, cache=True)
def _sketch_radii(q_sketch, x_sketch, step, cand, start, stop):  # pragma: no cover
    """``radii[i - start, j]``: a lower bound on ``|q - x| + q_err`` for query ``i`` and its
    candidate ``j`` (NaN for padding): ``step sqrt(S) - x_err`` (the sketch is a
    contraction; ``S`` the exact integer distance of the codes, the roundings of the root
    and the product covered; ``-inf`` for a row without a bound). Pairs are taken by
    windows of rows whose codes fit in about a quarter of a 1 MB cache
    (:func:`_slots_by_window`), so each row's codes are read from memory once for all the
    queries that list it. ``q_sketch``, ``x_sketch``: ``(codes, err, code_sq)`` of the
    queries and the rows (:func:`hashlearn.rerank._sketch.sketch_rows`)."""
    q_codes, _, q_code_sq = q_sketch
    x_codes, x_err, x_code_sq = x_sketch
    c = cand.shape[1]
    n_rows, width = x_codes.shape
    radii = np.empty((stop - start) * c)
    shift = 0
    while (width * 2) << (shift + 1) <= _WINDOW_BYTES:
        shift += 1
    c_bits = 0
    while (1 << c_bits) < c:
        c_bits += 1
    shift = min(shift, 31 - c_bits)  # a key holds a row's low bits and a slot
    per_batch = max(1, (1 << (31 - shift)) // max(c, 1))
    inv_c = 1.0 / max(c, 1)  # floor((slot + 1/2) / c) in float64 is slot // c (slot < 2^31)
    for first in range(start, stop, per_batch):
        last = min(stop, first + per_batch)
        at = (first - start) * c
        keys, ends, slot_bits = _slots_by_window(cand, first, last, n_rows, shift, radii[at:])
        slot_mask = (1 << slot_bits) - 1
        n = keys.shape[0]
        for b in range(ends.shape[0] - 1):
            base = b << shift
            for t in range(ends[b], ends[b + 1]):
                if t + _LOOKAHEAD_PAIRS < n:  # its first line (the cache streams the others)
                    ahead = base + (keys[t + _LOOKAHEAD_PAIRS] >> slot_bits)  # a row < n_rows
                    prefetch(x_codes, ahead * width)
                slot = keys[t] & slot_mask
                p = base + (keys[t] >> slot_bits)
                i = first + int((slot + 0.5) * inv_c)
                total = tagged_sqdist(q_codes, i, x_codes, p, q_code_sq, x_code_sq)
                r = step * np.sqrt(np.float64(total)) * (1.0 - 16.0 * _U64) - x_err[p]
                radii[at + slot] = r
    return radii.reshape(stop - start, c)


@njit(nogil=True, inline="always")
def _nearest_by_sketch(radii, cand_row, k, first, first_radii, vectors):
    """The (at most k) candidates with the smallest ``radii`` into ``first``, ascending,
    their rows prefetched; returns how many."""
    v_data, v_ind, v_ptr = vectors
    n_first = 0
    worst = np.inf
    for j in range(radii.shape[0]):
        r = radii[j]
        if not r < worst:  # NaN (padding), or no nearer than the k kept
            continue
        if n_first < k:
            pos = n_first
            n_first += 1
        else:
            pos = k - 1
        while pos > 0 and first_radii[pos - 1] > r:
            first_radii[pos] = first_radii[pos - 1]
            first[pos] = first[pos - 1]
            pos -= 1
        first_radii[pos] = r
        first[pos] = j
        if n_first == k:
            worst = first_radii[k - 1]
    for r in range(n_first):
        _prefetch_csr_row(v_data, v_ind, v_ptr, cand_row[first[r]])
    return n_first


@njit(nogil=True, inline="always")
def _sift_down(heap, n, pos, lows):
    """Restore the min-heap order of ``heap[:n]`` (keyed by ``lows``) below ``pos``."""
    j = heap[pos]
    while True:
        child = 2 * pos + 1
        if child >= n:
            break
        if child + 1 < n and lows[heap[child + 1]] < lows[heap[child]]:
            child += 1
        if lows[heap[child]] >= lows[j]:
            break
        heap[pos] = heap[child]
        pos = child
    heap[pos] = j


@njit(nogil=True, inline="always")
def _score_one(j, n_q, vectors, cand, i, kind, k, qq, out):
    """Score candidate ``j`` of query ``i`` exactly, keeping the top k in ``out = (out_d,
    out_i, scratch, state, no_side)``; ``state = [filled, stamp, n_exact]`` is updated."""
    out_d, out_i, scratch, state, no_side = out
    p = cand[i, j]
    state[1] += 1
    state[2] += 1
    dist = _pair_distance(n_q, vectors, p, no_side, 0, kind, qq, scratch, state[1])
    state[0] = keep_smallest(out_d, out_i, i, k, state[0], dist, p)


@njit(nogil=True, cache=True)
def csr_sketch_kernel(
    queries, vectors, sketches, cand, kind, k, out_d, out_i, start, stop, scratch
):  # pragma: no cover - compiled
    """:func:`csr_distance_kernel`'s result (without side features), screened by the
    bucket-norm sketch (:mod:`hashlearn.rerank._sketch`), whose distances bound every candidate's
    distance from below: the multi-step k-nearest-neighbour search of Seidl & Kriegel,
    "Optimal Multi-Step k-Nearest Neighbor Search" (SIGMOD 1998).

    1. A lower bound on every pair's distance from the sketch: an exact integer sum over
       ``w`` 12-bit codes (one read of a few hundred bytes instead of a gather per
       non-zero), pairs taken by windows of rows (:func:`_sketch_radii`).
    2. Per query, the k candidates nearest by sketch are scored exactly
       (:func:`_pair_distance`, the exact kernel's loop); the k-th distance kept is ``T``.
       Their rows are prefetched while the previous query is scored.
    3. The other candidates whose lower bound does not exceed ``T`` are scored in ascending
       order of their bounds until a bound exceeds the k-th distance kept (``T`` shrinks as
       they are kept); the rest have k candidates strictly nearer.

    ``sketches = (q_sketch, x_sketch, x_sq, step)``: the queries' and the rows' ``(codes,
    err, code_sq)`` (:func:`hashlearn.rerank._sketch.sketch_rows`), the rows' ``|x|^2``
    (:func:`row_sqnorms`) and the grid step; the other arguments as for
    :func:`csr_distance_kernel`. Returns the number of pairs scored exactly."""
    q_data, q_ind, q_ptr = queries
    v_data, v_ind, v_ptr = vectors
    q_sketch, x_sketch, x_sq, step = sketches
    q_err = q_sketch[1]
    c = cand.shape[1]
    d = scratch[0].shape[0]
    out_rel = 2.0 * (d + 8) * _U64
    all_radii = _sketch_radii(q_sketch, x_sketch, step, cand, start, stop)
    first = np.empty(k, np.int64)
    first_next = np.empty(k, np.int64)
    first_radii = np.empty(k)
    rest = np.empty(c, np.int64)
    lows = np.full(c, -np.inf)
    state = np.zeros(3, np.int64)  # filled, stamp, n_exact
    no_side = (np.zeros((1, 0)), np.zeros((1, 0)), np.zeros(0))
    out = (out_d, out_i, scratch, state, no_side)
    n_next = 0
    if start < stop:
        n_next = _nearest_by_sketch(all_radii[0], cand[start], k, first_next, first_radii, vectors)
    for i in range(start, stop):
        radii = all_radii[i - start]
        n_first = n_next
        first[:n_first] = first_next[:n_first]
        if i + 1 < stop:  # the next query's rows load while this one is scored
            after = all_radii[i + 1 - start]
            n_next = _nearest_by_sketch(after, cand[i + 1], k, first_next, first_radii, vectors)
        q0, q1 = q_ptr[i], q_ptr[i + 1]
        qq = _scatter_query(q_data, q_ind, q0, q1, scratch)
        state[0] = 0
        for r in range(n_first):
            _score_one(first[r], q1 - q0, vectors, cand, i, kind, k, qq, out)
            radii[first[r]] = np.nan  # scored
        reach = _reach(kind, out_d, i, k, state[0])
        cut = _radius_cut(kind, reach, q_err[i], qq, d, out_rel)
        n_rest = 0
        for j in range(c):
            radius = radii[j]
            if not radius <= cut:  # padding or scored (NaN), or its bound exceeds reach
                continue
            p = cand[i, j]
            low = _sketch_lower(kind, radius, q_err[i], qq, x_sq, p, d, out_rel)
            if low <= reach:
                lows[j] = low
                rest[n_rest] = j
                n_rest += 1
        for h in range(n_rest // 2 - 1, -1, -1):
            _sift_down(rest, n_rest, h, lows)
        n_heap = n_rest  # scored in ascending order of their bounds (a binary heap)
        while n_heap:
            j = rest[0]
            if lows[j] > _reach(kind, out_d, i, k, state[0]):
                break  # and so do all the others
            n_heap -= 1
            rest[0] = rest[n_heap]
            rest[n_heap] = j
            _sift_down(rest, n_heap, 0, lows)
            if n_heap:  # the next to score, most likely
                _prefetch_csr_row(v_data, v_ind, v_ptr, cand[i, rest[0]])
            _score_one(j, q1 - q0, vectors, cand, i, kind, k, qq, out)
        for r in range(n_rest):
            lows[rest[r]] = -np.inf  # stage 2 of the next query reads no bounds
        _clear_query(q_ind, q0, q1, scratch)
    return state[2]

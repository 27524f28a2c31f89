"""Exact re-ranking over CSR vectors (:class:`hashlearn.Searcher` with scipy.sparse input):
:func:`csr_distance_kernel` scores every (query, candidate) pair, and
:func:`csr_screened_kernel` first bounds every pair by a cheaper formula (one loop, no
stamps, int32 column indices: :func:`compact_copy`) and scores exactly only the pairs that
can still be among the k nearest. Both keep each query's top k by (distance, row) as they
score, and both score a pair with the same inlined loop (:func:`_pair_distance`), so their
results agree.

Each query is scattered once into a dense vector (``dense_q``), so a candidate ``x`` costs
O(nnz(x) + nnz(q)) branch-free steps instead of a merge of two index lists.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from hashlearn._primitives import prefetch
from hashlearn._rescore import (
    _SUBNORMAL_SLACK,
    _U64,
    EUCLIDEAN,
    NEG_INNER,
    SQEUCLIDEAN,
    _distance_interval,
    _insert_by_lower,
    _keep_bound,
    _settle_sorted,
    keep_smallest,
)

__all__ = ["compact_copy", "csr_distance_kernel", "csr_screened_kernel"]

_LOOKAHEAD = 4  # candidate rows prefetched ahead of the one being scored


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


@njit(nogil=True, inline="always")
def _scatter_query(q_data, q_ind, q0, q1, dense_q):
    """Query non-zeros ``q0:q1`` into ``dense_q``; returns ``|q|^2``."""
    qq = 0.0
    for a in range(q0, q1):
        qa = np.float64(q_data[a])
        dense_q[q_ind[a]] = qa
        qq += qa * qa
    return qq


@njit(nogil=True, inline="always")
def _pair_distance(query, q0, q1, vectors, p, side, i, kind, qq, scratch, stamp):
    """The distance of query ``i`` (non-zeros ``q0:q1`` of ``query = (data, indices)``,
    scattered in ``scratch = (dense_q, stamp_of)``) to row ``p`` of ``vectors = (data,
    indices, indptr)``:
    ``|x - q|^2 = sum_{j in x} (x_j - q_j)^2 + sum_{j in q, j not in x} q_j^2``, the second
    sum over the query's non-zeros that the candidate does not stamp (``stamp_of[j] ==
    stamp``; every term is a square: no cancellation). With side features (``f_w``
    non-empty; kind ``SQEUCLIDEAN`` only) plus ``sum_t f_w[t] (f_v[p, t] - f_q[i, t])^2``,
    the implicit learned metric (``side = (f_q, f_v, f_w)``)."""
    q_data, q_ind = query
    v_data, v_ind, v_ptr = vectors
    f_q, f_v, f_w = side
    dense_q, stamp_of = scratch
    sq = 0.0
    dot = 0.0
    xx = 0.0
    for b in range(v_ptr[p], v_ptr[p + 1]):
        col = v_ind[b]
        xb = np.float64(v_data[b])
        qa = dense_q[col]
        diff = xb - qa
        sq += diff * diff
        dot += qa * xb
        xx += xb * xb
        stamp_of[col] = stamp
    for a in range(q0, q1):  # the query's non-zeros outside the candidate
        qa = np.float64(q_data[a])
        sq += qa * qa * np.float64(stamp_of[q_ind[a]] != stamp)
    for t in range(f_w.shape[0]):
        diff = f_q[i, t] - f_v[p, t]
        sq += f_w[t] * (diff * diff)
    return _finish(kind, sq, dot, qq, xx)


@njit(nogil=True, cache=True)
def csr_distance_kernel(
    queries, vectors, side, cand, kind, k, out_d, out_i, start, stop, scratch
):  # pragma: no cover - compiled
    """``_rescore.distance_kernel`` for CSR queries and vectors, ``queries`` and ``vectors``
    each ``(data, indices int32 or int64, indptr int64)`` (canonical: sorted, distinct column
    indices), ``side = (f_q, f_v, f_w)`` the side features (zero-width without);
    ``scratch = (dense_q float64, stamp_of int64)`` zeroed arrays with one entry per column
    (``np.zeros`` maps untouched pages lazily, so their size costs only the columns the
    queries and candidates use). The rows of the candidates ``_LOOKAHEAD`` ahead are
    prefetched."""
    q_data, q_ind, q_ptr = queries
    v_data, v_ind, v_ptr = vectors
    dense_q = scratch[0]
    c = cand.shape[1]
    stamp = 0  # stamp_of[j]: the last candidate (numbered from 1) with a non-zero in column j
    for i in range(start, stop):
        q0, q1 = q_ptr[i], q_ptr[i + 1]
        qq = _scatter_query(q_data, q_ind, q0, q1, dense_q)
        filled = 0
        for j in range(c):
            _prefetch_ahead(v_data, v_ind, v_ptr, cand, i, j)
            p = cand[i, j]
            if p < 0:
                continue
            stamp += 1
            query = (q_data, q_ind)
            dist = _pair_distance(query, q0, q1, vectors, p, side, i, kind, qq, scratch, stamp)
            filled = keep_smallest(out_d, out_i, i, k, filled, dist, p)
        for a in range(q0, q1):
            dense_q[q_ind[a]] = 0.0


# -------------------------------------------------------------------- the screening copy


@njit(nogil=True, cache=True)
def _row_sqnorms(data, indptr):  # pragma: no cover - compiled
    out = np.empty(indptr.shape[0] - 1)
    for p in range(out.shape[0]):
        sq = 0.0
        for b in range(indptr[p], indptr[p + 1]):
            x = np.float64(data[b])
            sq += x * x
        out[p] = sq
    return out


def compact_copy(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, n_cols: int):
    """What :func:`csr_screened_kernel` reads in pass 1: ``(values, indices, sq)``, the
    values as they are, the column indices as int32 (int64 beyond 2^31 columns; no copy
    where they already are) and each row's float64 ``|x|^2``."""
    narrow = np.int32 if n_cols < 2**31 else np.int64
    return data, indices.astype(narrow, copy=False), _row_sqnorms(data, indptr)


@njit(nogil=True, fastmath={"reassoc", "contract"})
def _compact_dot(values, indices, b0, b1, dense_q):  # pragma: no cover - compiled
    """``sum_b values[b] dense_q[indices[b]]`` over ``b0:b1`` in float64, in any order (four
    partial sums, so the gathers overlap: about 15 % faster than one)."""
    a0 = a1 = a2 = a3 = 0.0
    b = b0
    while b + 4 <= b1:
        a0 += np.float64(values[b]) * dense_q[indices[b]]
        a1 += np.float64(values[b + 1]) * dense_q[indices[b + 1]]
        a2 += np.float64(values[b + 2]) * dense_q[indices[b + 2]]
        a3 += np.float64(values[b + 3]) * dense_q[indices[b + 3]]
        b += 4
    while b < b1:
        a0 += np.float64(values[b]) * dense_q[indices[b]]
        b += 1
    return (a0 + a1) + (a2 + a3)


@njit(nogil=True, cache=True)
def csr_screened_kernel(
    queries, vectors, compact, cand, kind, k, out_d, out_i, start, stop, scratch, settle32
):  # pragma: no cover - compiled
    """:func:`csr_distance_kernel`'s result (without side features) in two passes per
    query.

    Pass 1 bounds each candidate with one loop over its non-zeros and no stamps
    (:func:`compact_copy`: int32 column indices): ``|q - x|^2 = |q|^2 + |x|^2 - 2 q . x`` in
    float64 is exact to ``out_rel (|q|^2 + |x|^2)`` (Higham's bound on a sum in any order,
    doubled), which bounds the distance of ``kind`` by ``_rescore._distance_interval``.
    ``T`` is the k-th smallest upper bound; pass 2 scores exactly (:func:`_pair_distance`)
    the candidates whose lower bound does not exceed ``T`` -- the others have k candidates
    strictly nearer. ``compact = (values, indices, sq)``; the other arguments as for
    :func:`csr_distance_kernel`. With ``settle32`` (the caller keeps float32 distances) a
    survivor whose bounds fix its float32 distance and its rank
    (``_rescore._settle_sorted``) is kept with that distance instead of being scored. Returns the number of pairs scored exactly."""
    q_data, q_ind, q_ptr = queries
    v_data, v_ind, v_ptr = vectors
    s_data, s_ind, x_sq = compact
    dense_q = scratch[0]
    c = cand.shape[1]
    d = dense_q.shape[0]
    out_rel = 2.0 * (d + 8) * _U64
    tiny = d * _SUBNORMAL_SLACK
    bounds = np.empty((c, 2))  # each candidate's (lower, upper) bounds
    order = np.empty(c, np.int64)  # the survivors, ascending by lower bound
    needs = np.ones(c, np.bool_)
    values = np.empty(c)
    bound = np.empty((1, k))
    no_side = (np.zeros((1, 0)), np.zeros((1, 0)), np.zeros(0))
    stamp = 0
    n_exact = 0
    for i in range(start, stop):
        q0, q1 = q_ptr[i], q_ptr[i + 1]
        qq = _scatter_query(q_data, q_ind, q0, q1, dense_q)
        bound[0, :] = np.inf
        n_bound = 0
        for j in range(c):
            _prefetch_ahead(s_data, s_ind, v_ptr, cand, i, j)
            p = cand[i, j]
            bounds[j, 0] = np.inf
            if p < 0:
                continue
            dot = _compact_dot(s_data, s_ind, v_ptr[p], v_ptr[p + 1], dense_q)
            sum_sq = qq + x_sq[p]
            approx = sum_sq - 2.0 * dot
            eps = out_rel * sum_sq + tiny
            r_lo = np.sqrt(max(0.0, approx - eps)) * (1.0 - 4.0 * _U64)
            r_hi = np.sqrt(max(0.0, approx + eps)) * (1.0 + 4.0 * _U64)
            if not (approx == approx):  # NaN: no bound
                r_lo, r_hi = 0.0, np.inf
            lo, hi = _distance_interval(kind, r_lo, r_hi, qq, x_sq[p], d, out_rel)
            bounds[j, 0], bounds[j, 1] = lo, hi
            n_bound = _keep_bound(bound, 0, k, n_bound, hi)
        threshold = bound[0, k - 1]
        n_survivors = 0
        for j in range(c):
            if cand[i, j] >= 0 and bounds[j, 0] <= threshold:
                _insert_by_lower(order, 0, n_survivors, j, bounds)
                n_survivors += 1
                needs[j] = True
        if settle32:
            _settle_sorted(kind, order, 0, n_survivors, bounds, needs, values)
        filled = 0
        for r in range(n_survivors):  # the rows to score, fetched together
            if needs[order[r]]:
                _prefetch_csr_row(v_data, v_ind, v_ptr, cand[i, order[r]])
        for r in range(n_survivors):
            j = order[r]
            p = cand[i, j]
            if not needs[j]:
                filled = keep_smallest(out_d, out_i, i, k, filled, values[j], p)
                continue
            stamp += 1
            n_exact += 1
            query = (q_data, q_ind)
            dist = _pair_distance(query, q0, q1, vectors, p, no_side, 0, kind, qq, scratch, stamp)
            filled = keep_smallest(out_d, out_i, i, k, filled, dist, p)
        for a in range(q0, q1):
            dense_q[q_ind[a]] = 0.0
    return n_exact

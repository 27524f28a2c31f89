"""Numba kernels of :class:`~hashlearn.index.ivf.IVFIndex`: k-majority training, probing,
the scan of the probed lists and the rewrite of the lists on a write.

Layout (see :mod:`hashlearn.index.ivf`): the codes are C-contiguous ``uint64`` words grouped
by list, list ``l`` holding rows ``offsets[l]:offsets[l+1]`` with their ids ascending; the
centroids are ``n_lists`` codes in the same word layout. Every kernel is serial and GIL-free;
the query kernels work on a range of queries ``q_start:q_end`` and callers run chunks of
queries on several threads (:func:`hashlearn._utils.parallel.parallel_chunks`).

The scan reuses the mini-block distances of :mod:`hashlearn.index._knn_scan` (64 codes'
distances computed branch-free, then only the codes that pass are looked at). Unlike the flat
scan, the codes of the probed lists are not visited in id order, so the top k is kept by
(distance, id) explicitly: an item enters when its distance is below the current k-th, or
equal to it with a smaller id, and a full buffer is cut back to exactly the k smallest
(distance, id) pairs (a histogram over the ``b + 1`` distances, a sort of the ties only).
A list's ids ascend, so a mini-block whose first id is past the k-th item's admits only
distances below it. On the wide path (:func:`hashlearn._utils.popcount.kernel_path`) whole
mini-blocks go through :func:`hashlearn._utils.popcount.wide_mini_block`, reading past a
list's end into the next list's codes (masked off), never past the array.

Probing (:func:`_probe`) compares the query with every centroid by the same mini-blocks,
finds the centroid distance at which the budget is reached by branch-free sums over eight
distances a pass, and counting-sorts only the lists within it.

For k >= 32 a query's top k starts from a sampled bound (:func:`_sample_rank`: every 8th
mini-block of its probed lists first, as the flat scan's ``sample_plan``); a bound that leaves
fewer than k codes is dropped and the query scanned again, so results stay exact. A batch is
scanned list by list (:func:`_ivf_knn_group`): each probed list is read from memory once for
all the queries that probe it; a lone query is scanned on its own (:func:`_ivf_knn_one`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from hashlearn._utils.popcount import popcount64, trailing_zeros64, wide_mini_block
from hashlearn.index._asymmetric import _emit as _emit_scores
from hashlearn.index._asymmetric import _heapify as _heapify_scores
from hashlearn.index._asymmetric import _keep_best as _keep_best_scores
from hashlearn.index._asymmetric import _offer as _offer_score
from hashlearn.index._asymmetric import _score, byte_tables
from hashlearn.index._knn_scan import (
    _MASK_FIRST_MAX_WORDS,
    _MINI_BLOCK,
    _SAMPLE_MIN_BLOCKS,
    _SAMPLE_MIN_K,
    _SAMPLE_STRIDE,
    _mini_block_distances,
    _rank_bound,
)

__all__ = [
    "assign_any_width",
    "assign_fixed_width",
    "bit_counts",
    "ivf_knn_fixed_width",
    "ivf_knn_any_width",
    "ivf_knn_wide",
    "ivf_range_count",
    "ivf_range_fill",
    "merge_lists",
    "query_planes",
    "residual_knn_any_width",
    "residual_knn_fixed_width",
    "lists_sorted",
]

_ID_MAX = np.iinfo(np.int64).max
#: the sampled starting bound (:func:`_sample_rank`) only where the probed lists hold at
#: least this many codes per neighbour kept (fewer: the bound would often leave fewer than k)
_SAMPLE_MIN_CODES_PER_K = 8


# ----------------------------------------------------------------------------- training


@njit(nogil=True, inline="always")
def _assign_core(words, centroids, n_lists, out_list, out_dist, start, stop, n_words, vector):
    dist = np.empty(_MINI_BLOCK, np.int64)
    wu = np.uint64(n_words)
    for i in range(start, stop):
        oq = np.uint64(i) * wu
        best, best_d = 0, 1 << 30
        for c0 in range(0, n_lists, _MINI_BLOCK):  # 64 centroids' distances, branch-free
            m = min(_MINI_BLOCK, n_lists - c0)
            _mini_block_distances(centroids, c0, m, words, oq, n_words, vector, dist)
            low = best_d
            for u in range(m):
                low = min(low, dist[u])
            if low < best_d:  # the first centroid at the new minimum
                for u in range(m):
                    if dist[u] == low:
                        best, best_d = c0 + u, low
                        break
        out_list[i] = best
        out_dist[i] = best_d


@njit(nogil=True, cache=True)
def assign_fixed_width(words, centroids, n_lists, out_list, out_dist, start, stop, width):
    """Nearest centroid (Hamming; ties to the smaller list) of codes ``start:stop``, the
    word count the length of ``width`` (a compile-time constant)."""
    n_words = len(width)
    _assign_core(words, centroids, n_lists, out_list, out_dist, start, stop, n_words, True)


@njit(nogil=True, cache=True)
def assign_any_width(words, centroids, n_lists, out_list, out_dist, start, stop, n_words):
    """:func:`assign_fixed_width` for word counts without a specialisation."""
    _assign_core(words, centroids, n_lists, out_list, out_dist, start, stop, n_words, False)


@njit(nogil=True, cache=True)
def bit_counts(words, n, n_words, lists, counts, sizes):
    """``counts[l, j]`` += how many codes of list ``l`` have bit ``j`` set; ``sizes[l]`` +=
    the codes of list ``l`` (the votes of the majority centroid)."""
    for i in range(n):
        lst = lists[i]
        sizes[lst] += 1
        o = i * n_words
        for w in range(n_words):
            x = words[o + w]
            while x:
                counts[lst, w * 64 + trailing_zeros64(x)] += 1
                x &= x - np.uint64(1)


# ------------------------------------------------------------------------------ probing


_LEVELS = 8  # centroid distances whose lists' weights one pass sums


@njit(nogil=True, inline="always")
def _probe(
    centroids, n_lists, offsets, queries, oq, n_words, vector, n_bits, n_probe, min_codes,
    cdist, counts, order, width, wide,
):  # fmt: skip
    """The lists a query scans, nearest centroid first (ties to the smaller list), in
    ``order[:n]`` (``order`` has room for ``2 n_lists``); returns ``n``: ``n_probe`` lists when it is positive, else the fewest
    nearest lists holding at least ``min_codes`` codes (all lists when they hold fewer).

    No sort of all lists: from the smallest centroid distance up, each pass sums the weights
    (lists, or codes) at ``_LEVELS`` distances branch-free until the target is reached at
    distance ``t`` (a histogram's scattered increments cost 3x more); only the lists within
    ``t`` are then counting-sorted.
    """
    for c0 in range(0, n_lists, _MINI_BLOCK):  # the flat scan's mini-block distances
        m = min(_MINI_BLOCK, n_lists - c0)
        if wide and m == _MINI_BLOCK:  # a compile-time branch: 8 centroids a 512-bit step
            o = np.uint64(c0) * np.uint64(n_words)
            wide_mini_block(centroids, o, queries, oq, n_bits + 1, cdist[c0:], width)
        else:
            _mini_block_distances(centroids, c0, m, queries, oq, n_words, vector, cdist[c0:])
    unit = n_probe > 0
    target = min(n_probe, n_lists) if unit else min(min_codes, offsets[n_lists])
    low = n_bits
    for c in range(n_lists):
        low = min(low, cdist[c])
    t, total, base = n_bits, 0, low
    while base <= n_bits:
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0
        for c in range(n_lists):
            d = cdist[c] - base
            w = 1 if unit else offsets[c + 1] - offsets[c]
            s0 += w * (d == 0)
            s1 += w * (d == 1)
            s2 += w * (d == 2)
            s3 += w * (d == 3)
            s4 += w * (d == 4)
            s5 += w * (d == 5)
            s6 += w * (d == 6)
            s7 += w * (d == 7)
        sums = (s0, s1, s2, s3, s4, s5, s6, s7)
        reached = False
        for j in range(_LEVELS):
            total += sums[j]
            if total >= target:
                t, reached = min(base + j, n_bits), True
                break
        if reached:
            break
        base += _LEVELS
    # the lists within t (one pass, rarely taken branch), counting-sorted by distance; the
    # second half of ``order`` holds them in list order meanwhile
    n_within = 0
    for c in range(n_lists):
        if cdist[c] <= t:
            order[n_lists + n_within] = c
            n_within += 1
    counts[low : t + 2] = 0
    for j in range(n_within):
        counts[cdist[order[n_lists + j]] + 1] += 1
    counts[low] = 0
    for d in range(low, t):
        counts[d + 1] += counts[d]
    for j in range(n_within):
        c = order[n_lists + j]
        d = cdist[c]
        order[counts[d]] = c
        counts[d] += 1
    if n_probe > 0:
        return min(n_probe, n_within)
    return _lists_reaching(order, n_within, offsets, min_codes) or n_within


@njit(nogil=True, inline="always")
def _lists_reaching(order, size, offsets, min_codes):
    """The fewest of the lists ``order[:size]`` (in that order) holding at least
    ``min_codes`` codes; 0 when all of them hold fewer."""
    got = 0
    for j in range(size):
        c = order[j]
        got += offsets[c + 1] - offsets[c]
        if got >= min_codes:
            return j + 1
    return 0


#: about this many centroid distances of a query, evenly strided, set :func:`_nearest_lists`'
#: threshold
_SELECT_SAMPLE = 256
#: sample ranks above the expected one (of ``g`` in ``n_lists``) the threshold sits at
_SELECT_SLACK = 3


@njit(nogil=True, inline="always")
def _sample_threshold(row, n_lists, stride, rank, buf):
    """The ``rank``-th smallest (from 0) of ``row[0], row[stride], row[2 stride], ...``,
    kept in the ascending scratch ``buf[:rank + 1]`` by insertion."""
    kept = 0
    for c in range(0, n_lists, stride):
        d = row[c]
        if kept <= rank:
            kept += 1
        elif not d < buf[rank]:
            continue
        j = kept - 1
        while j > 0 and buf[j - 1] > d:
            buf[j] = buf[j - 1]
            j -= 1
        buf[j] = d
    return buf[min(rank, kept - 1)]


@njit(nogil=True, inline="always")
def _nearest_lists(row, n_lists, g, heap_d, order):
    """The ``g`` lists of smallest float distance ``row[c]`` (ties to the smaller list),
    ascending, in ``order[:g]`` (``order`` holds ``2 n_lists``; ``heap_d`` ``n_lists``
    scratch values); returns ``g``.

    A sampled threshold: of about ``_SELECT_SAMPLE`` evenly strided distances the one at
    ``_SELECT_SLACK`` ranks above where the ``g``-th is expected sets ``tau``; one
    branch-free pass gathers every list with ``row[c] <= tau`` (about ``g + 4 n_lists /
    _SELECT_SAMPLE``, in list order), a stable sort of those by distance gives the ``g``.
    Too few gathered (rare): ``tau`` is raised to twice the rank, up to the sample's
    largest, and then every list is sorted. Any ``tau`` gives the exact ``g``: it only sets
    how many are sorted. At 4,000 lists 5.5-6 us a query for ``g`` = 1-24 and 9 us for 64
    (Zen 4, development timing), against 13-16 us for the 512-bin histogram select before
    it (three passes over the distances)."""
    g = min(g, n_lists)
    if g <= 0:
        return 0
    stride = max(n_lists // _SELECT_SAMPLE, 1)
    n_sample = (n_lists + stride - 1) // stride
    rank = min(-(-g * n_sample // n_lists) + _SELECT_SLACK, n_sample - 1)
    n = 0
    while True:
        tau = _sample_threshold(row, n_lists, stride, rank, heap_d)
        n = 0
        for c in range(n_lists):  # branch-free: the slot is overwritten unless kept
            order[n_lists + n] = c
            n += row[c] <= tau
        if n >= g:
            break
        if rank == n_sample - 1:  # tau was the sample's largest: sort them all
            for c in range(n_lists):
                order[n_lists + c] = c
            n = n_lists
            break
        rank = min(2 * rank + 1, n_sample - 1)
    for t in range(n):
        heap_d[t] = row[order[n_lists + t]]
    by_distance = np.argsort(heap_d[:n], kind="mergesort")  # stable: ties to the smaller list
    for t in range(g):
        order[t] = order[n_lists + by_distance[t]]
    return g


@njit(nogil=True, inline="always")
def _probe_float(row, n_lists, offsets, n_probe, min_codes, heap_d, order):
    """:func:`_probe` for float centroids (``IVFIndex(quantizer="k-means")``): the query's
    distances to the centroids are given (``row``, computed by the caller with one matrix
    product for the batch); the same rule picks the lists, in ``order[:n]``. Under the
    budget rule the nearest ``2 min_codes / mean list size + 8`` lists are drawn first,
    four times as many while they hold too few codes."""
    if n_probe > 0:
        return _nearest_lists(row, n_lists, min(n_probe, n_lists), heap_d, order)
    mean = max(offsets[n_lists] // max(n_lists, 1), 1)
    g = min(2 * (min_codes // mean) + 8, n_lists)
    while True:
        size = _nearest_lists(row, n_lists, g, heap_d, order)
        reached = _lists_reaching(order, size, offsets, min_codes)
        if reached or size == n_lists:
            return reached or size
        g = min(4 * g, n_lists)


@njit(nogil=True, inline="always")
def _probe_lists(
    cfd, q, heap_d, centroids, n_lists, offsets, queries, oq, n_words, vector, n_bits, n_probe,
    min_codes, cdist, counts, order, width, wide,
):  # fmt: skip
    """Query ``q``'s probed lists in ``order[:n]``, returns ``n``: by the float centroid
    distances ``cfd[q]`` when ``cfd`` has rows (:func:`_probe_float`), else by the Hamming
    distances to the binary centroids (:func:`_probe`)."""
    if cfd.shape[0]:
        return _probe_float(cfd[q], n_lists, offsets, n_probe, min_codes, heap_d, order)
    return _probe(
        centroids, n_lists, offsets, queries, oq, n_words, vector, n_bits, n_probe, min_codes,
        cdist, counts, order, width, wide,
    )  # fmt: skip


# ------------------------------------------------------------------------ top k (d, id)


@njit(nogil=True, cache=True)
def _cut(buf_d, buf_i, count, k, hist, tmp):
    """Keep exactly the ``k`` smallest (distance, id) of ``count`` buffered items (in place,
    any order); returns the new bound ``(tau_d, tau_id)``: the k-th pair. A later item enters
    only if its distance is below ``tau_d``, or equal with an id below ``tau_id``."""
    hist[:] = 0
    for j in range(count):
        hist[buf_d[j]] += 1
    total = 0
    kth = 0
    for d in range(hist.shape[0]):
        if total + hist[d] >= k:
            kth = d
            break
        total += hist[d]
    ties_left = k - total  # >= 1: that many of the items at distance kth stay
    n_ties = 0
    for j in range(count):
        if buf_d[j] == kth:
            tmp[n_ties] = buf_i[j]
            n_ties += 1
    bound = np.sort(tmp[:n_ties])[ties_left - 1]
    kept = 0
    for j in range(count):
        d = buf_d[j]
        i = buf_i[j]
        if d < kth or (d == kth and i <= bound):
            buf_d[kept] = d
            buf_i[kept] = i
            kept += 1
    return kth, bound


@njit(nogil=True, cache=True)
def _emit(buf_d, buf_i, count, k, hist, out_d, out_i, row):
    """Write ``count <= k`` items to ``out[row]`` sorted by (distance, id), padded with -1."""
    by_id = np.argsort(buf_i[:count])
    hist[:] = 0
    for j in range(count):
        hist[buf_d[j]] += 1
    start = 0
    for d in range(hist.shape[0]):
        h = hist[d]
        hist[d] = start
        start += h
    for j in range(count):  # a stable counting sort by distance of the items in id order
        t = by_id[j]
        d = buf_d[t]
        slot = hist[d]
        hist[d] = slot + 1
        out_d[row, slot] = d
        out_i[row, slot] = buf_i[t]
    for slot in range(count, k):
        out_d[row, slot] = -1
        out_i[row, slot] = -1


# ---------------------------------------------------------------------------- k-NN scan


@njit(nogil=True, inline="always")
def _block_mask(db, i0, m, n_total, queries, oq, n_words, vector, width, wide, thr, dist):
    """The codes of mini-block ``i0:i0+m`` (one list's) at distance below ``thr``: a bit mask,
    their distances in ``dist``. On the wide path a whole 64-code step, the codes past the
    list (the next list's, in the same array) masked off; never past the array."""
    if wide and i0 + _MINI_BLOCK <= n_total:  # a compile-time branch
        o = np.uint64(i0) * np.uint64(n_words)
        if n_words <= _MASK_FIRST_MAX_WORDS:  # a compile-time constant
            # the mask alone, the distances stored only when a code passes (as the flat
            # scan does for such codes)
            mask = wide_mini_block(db, o, queries, oq, thr, None, width)
            if mask:
                mask = wide_mini_block(db, o, queries, oq, thr, dist, width)
        else:
            mask = wide_mini_block(db, o, queries, oq, thr, dist, width)
        if m < _MINI_BLOCK:
            mask &= (np.uint64(1) << np.uint64(m)) - np.uint64(1)
        return mask
    _mini_block_distances(db, i0, m, queries, oq, n_words, vector, dist)
    mask = np.uint64(0)
    for u in range(m):  # d < thr, branch-free (vectorised)
        mask |= np.uint64(dist[u] < thr) << np.uint64(u)
    return mask


@njit(nogil=True, inline="always")
def _is_sampled(c, j):
    """Whether mini-block ``j`` of list ``c`` belongs to the sample of the starting bound:
    every ``_SAMPLE_STRIDE``-th block, the phase set by the list, so that each list is
    sampled alike whichever query probes it."""
    return (c + j) % _SAMPLE_STRIDE == 0


@njit(nogil=True, inline="always")
def _sample_rank(offsets, lists, n_pr, k):
    """The rank whose sampled distance bounds the top ``k`` of the probed ``lists[:n_pr]``:
    ``rank`` = mu + 3 sqrt(mu) + 2 for mu = k x the sampled share of their codes, as the
    flat scan's :func:`~hashlearn.index._knn_scan.sample_plan` draws it (for codes in random
    order the bound falls below the k-th distance with probability under 0.1 %); 0 (no
    bound) when they hold fewer than ``_SAMPLE_MIN_CODES_PER_K * k`` codes or fewer than
    ``_SAMPLE_MIN_BLOCKS`` sampled mini-blocks."""
    n_codes = sampled = blocks = 0
    for j in range(n_pr):
        c = lists[j]
        lo, hi = offsets[c], offsets[c + 1]
        n_codes += hi - lo
        for i0 in range(lo, hi, _MINI_BLOCK):
            if _is_sampled(c, (i0 - lo) // _MINI_BLOCK):
                sampled += min(_MINI_BLOCK, hi - i0)
                blocks += 1
    if blocks < _SAMPLE_MIN_BLOCKS or n_codes < _SAMPLE_MIN_CODES_PER_K * k:
        return 0
    mu = k * sampled / n_codes
    return int(np.ceil(mu + 3.0 * np.sqrt(mu) + 2.0))


@njit(nogil=True, inline="always")
def _count_sample(mask, dist, row, t, counted, rank):
    """Count the sampled distances of ``mask`` into the histogram ``row``; once ``2 rank``
    lie below ``t``, tighten ``t`` to 1 + the ``rank``-th smallest. Returns ``(t,
    counted)``."""
    while mask:
        row[dist[trailing_zeros64(mask)]] += 1
        counted += 1
        mask &= mask - np.uint64(1)
    if counted >= 2 * rank:  # only distances below the rank-th count from here
        return _rank_bound(row, t, rank)
    return t, counted


@njit(nogil=True, inline="always")
def _sample_list(
    db, c, offsets, n_total, queries, oq, n_words, vector, width, wide, dist, row, t, counted,
    rank,
):  # fmt: skip
    """Count the sampled mini-blocks of list ``c`` into a query's histogram ``row``
    (:func:`_count_sample`); returns the new ``(t, counted)``."""
    lo, hi = offsets[c], offsets[c + 1]
    for i0 in range(lo, hi, _MINI_BLOCK):
        if _is_sampled(c, (i0 - lo) // _MINI_BLOCK):
            mask = _block_mask(
                db, i0, min(_MINI_BLOCK, hi - i0), n_total, queries, oq, n_words, vector,
                width, wide, t, dist,
            )  # fmt: skip
            t, counted = _count_sample(mask, dist, row, t, counted, rank)
    return t, counted


@njit(nogil=True, inline="always")
def _take(mask, dist, ids, i0, buf_d, buf_i, tmp, hist, kept, tau_d, tau_i, k_eff):
    """Offer the passing codes of mini-block ``i0`` to a query's top ``k_eff`` by
    (distance, id), kept in ``buf_d / buf_i`` (cut back to exactly ``k_eff`` when full).
    Returns the new ``(kept, tau_d, tau_i)``."""
    cap = buf_d.shape[0]
    while mask:
        u = trailing_zeros64(mask)
        mask &= mask - np.uint64(1)
        d = dist[u]
        item = ids[i0 + u]
        if d > tau_d or (d == tau_d and item >= tau_i):
            continue
        if kept == cap:
            tau_d, tau_i = _cut(buf_d, buf_i, kept, k_eff, hist, tmp)
            kept = k_eff
            if d > tau_d or (d == tau_d and item >= tau_i):
                continue
        buf_d[kept] = d
        buf_i[kept] = item
        kept += 1
    return kept, tau_d, tau_i


@njit(nogil=True, inline="always")
def _threshold(ids, i0, tau_d, tau_i):
    """A list's ids ascend: a block whose first id is past ``tau_i`` cannot win a tie, so
    only distances below ``tau_d`` pass (ties at ``tau_d`` stay out of the loop)."""
    return tau_d if ids[i0] >= tau_i else tau_d + 1


@njit(nogil=True, inline="always")
def _start(tau0, n_bits):
    """The top-k state a scan starts from: ``(kept, tau_d, tau_i)``; with a bound
    ``tau0 <= n_bits`` only distances below it enter."""
    return 0, tau0, (-1 if tau0 <= n_bits else _ID_MAX)


@njit(nogil=True, inline="always")
def _scan_list(
    db, ids, lo, hi, n_total, queries, oq, n_words, vector, width, wide, k_eff, buf_d, buf_i,
    tmp, hist, dist, kept, tau_d, tau_i,
):  # fmt: skip
    """Offer the codes of one list (rows ``lo:hi``) to a query's top ``k_eff`` held in
    ``buf_d / buf_i`` with state ``(kept, tau_d, tau_i)``; returns the new state."""
    for i0 in range(lo, hi, _MINI_BLOCK):
        thr = _threshold(ids, i0, tau_d, tau_i)
        mask = _block_mask(
            db, i0, min(_MINI_BLOCK, hi - i0), n_total, queries, oq, n_words, vector, width,
            wide, thr, dist,
        )  # fmt: skip
        kept, tau_d, tau_i = _take(
            mask, dist, ids, i0, buf_d, buf_i, tmp, hist, kept, tau_d, tau_i, k_eff
        )
    return kept, tau_d, tau_i


@njit(nogil=True, inline="always")
def _scan_lists(
    db, ids, offsets, lists, n_pr, n_total, queries, oq, n_words, vector, width, wide, k_eff,
    n_bits, tau0, buf_d, buf_i, tmp, hist, dist,
):  # fmt: skip
    """One query's top ``k_eff`` over its probed ``lists[:n_pr]``, from the bound ``tau0``
    (``n_bits + 1``: none); returns the number kept (``< k_eff``: the bound was too tight,
    or the lists hold fewer codes)."""
    kept, tau_d, tau_i = _start(tau0, n_bits)
    for j in range(n_pr):
        c = lists[j]
        kept, tau_d, tau_i = _scan_list(
            db, ids, offsets[c], offsets[c + 1], n_total, queries, oq, n_words, vector, width,
            wide, k_eff, buf_d, buf_i, tmp, hist, dist, kept, tau_d, tau_i,
        )  # fmt: skip
    return kept


@njit(nogil=True, inline="always")
def _finish(kept, k, k_eff, buf_d, buf_i, tmp, hist, out_d, out_i, q):
    if kept > k_eff:
        _cut(buf_d, buf_i, kept, k_eff, hist, tmp)
        kept = k_eff
    _emit(buf_d, buf_i, kept, k, hist, out_d, out_i, q)


@njit(nogil=True, inline="always")
def _ivf_knn_one(
    db, ids, offsets, centroids, n_lists, queries, cfd, q, k, k_eff, n_bits, n_probe,
    min_codes, out_d, out_i, n_words, vector, width, wide, scratch,
):  # fmt: skip
    """One query: probe, the sampled bound over its lists, the scan (again without the
    bound when it left fewer than ``k_eff``)."""
    buf_d, buf_i, tmp, hist, by_level, cdist, order, dist, heap_d = scratch
    n_total = offsets[n_lists]
    oq = np.uint64(q) * np.uint64(n_words)
    n_pr = _probe_lists(
        cfd, q, heap_d, centroids, n_lists, offsets, queries, oq, n_words, vector, n_bits,
        n_probe, min_codes, cdist, by_level, order, width, wide,
    )  # fmt: skip
    tau0 = n_bits + 1
    rank = _sample_rank(offsets, order, n_pr, k_eff) if k_eff >= _SAMPLE_MIN_K else 0
    if rank:
        hist[:] = 0
        t, counted = n_bits + 1, 0
        for j in range(n_pr):
            c = order[j]
            t, counted = _sample_list(
                db, c, offsets, n_total, queries, oq, n_words, vector, width, wide, dist, hist,
                t, counted, rank,
            )  # fmt: skip
        t, counted = _rank_bound(hist, t, rank)
        if counted >= rank:
            tau0 = t
    kept = _scan_lists(
        db, ids, offsets, order, n_pr, n_total, queries, oq, n_words, vector, width, wide,
        k_eff, n_bits, tau0, buf_d, buf_i, tmp, hist, dist,
    )  # fmt: skip
    if kept < k_eff and tau0 <= n_bits:  # too tight: the lists again, from b + 1
        kept = _scan_lists(
            db, ids, offsets, order, n_pr, n_total, queries, oq, n_words, vector, width, wide,
            k_eff, n_bits, n_bits + 1, buf_d, buf_i, tmp, hist, dist,
        )  # fmt: skip
    _finish(kept, k, k_eff, buf_d, buf_i, tmp, hist, out_d, out_i, q)


@njit(nogil=True, inline="always")
def _ivf_knn_group(
    db, ids, offsets, centroids, n_lists, queries, cfd, g0, g1, k, k_eff, n_bits, n_probe,
    min_codes, out_d, out_i, n_words, vector, width, wide, scratch,
):  # fmt: skip
    """Queries ``g0:g1`` together, list by list: each probed list is read from memory once
    for all the queries that probe it (it stays in cache while each of them scans it),
    instead of once per query. Every query keeps its own top k, sampled bound
    and rescan, so its results are :func:`_ivf_knn_one`'s."""
    buf_d1, buf_i1, tmp, hist, by_level, cdist, order, dist, heap_d = scratch
    n_total = offsets[n_lists]
    mg = g1 - g0
    # probing: each query's lists, then the queries of each list (CSR, queries ascending)
    q_ptr = np.zeros(mg + 1, np.int64)
    probed = np.empty(max(64, 4 * mg), np.int64)
    for qi in range(mg):
        oq = np.uint64(g0 + qi) * np.uint64(n_words)
        n_pr = _probe_lists(
            cfd, g0 + qi, heap_d, centroids, n_lists, offsets, queries, oq, n_words, vector,
            n_bits, n_probe, min_codes, cdist, by_level, order, width, wide,
        )  # fmt: skip
        if q_ptr[qi] + n_pr > probed.shape[0]:
            grown = np.empty(2 * (q_ptr[qi] + n_pr), np.int64)
            grown[: q_ptr[qi]] = probed[: q_ptr[qi]]
            probed = grown
        probed[q_ptr[qi] : q_ptr[qi] + n_pr] = order[:n_pr]
        q_ptr[qi + 1] = q_ptr[qi] + n_pr
    l_ptr = np.zeros(n_lists + 1, np.int64)
    for p in range(q_ptr[mg]):
        l_ptr[probed[p] + 1] += 1
    for c in range(n_lists):
        l_ptr[c + 1] += l_ptr[c]
    fill = l_ptr[:-1].copy()
    by_list = np.empty(q_ptr[mg], np.int64)
    for qi in range(mg):
        for p in range(q_ptr[qi], q_ptr[qi + 1]):
            c = probed[p]
            by_list[fill[c]] = qi
            fill[c] += 1
    # the sampled starting bounds, the sampled blocks read once for all their queries
    tau0 = np.full(mg, n_bits + 1, np.int64)
    rank = np.zeros(mg, np.int64)
    if k_eff >= _SAMPLE_MIN_K:
        for qi in range(mg):
            rank[qi] = _sample_rank(offsets, probed[q_ptr[qi] :], q_ptr[qi + 1] - q_ptr[qi], k_eff)
        rows = np.zeros((mg, n_bits + 1), np.int32)
        t = np.full(mg, n_bits + 1, np.int64)
        counted = np.zeros(mg, np.int64)
        for c in range(n_lists):
            for p in range(l_ptr[c], l_ptr[c + 1]):
                qi = by_list[p]
                if rank[qi] == 0:
                    continue
                oq = np.uint64(g0 + qi) * np.uint64(n_words)
                t[qi], counted[qi] = _sample_list(
                    db, c, offsets, n_total, queries, oq, n_words, vector, width, wide, dist,
                    rows[qi], t[qi], counted[qi], rank[qi],
                )  # fmt: skip
        for qi in range(mg):
            if rank[qi]:
                bound, n_below = _rank_bound(rows[qi], t[qi], rank[qi])
                if n_below >= rank[qi]:
                    tau0[qi] = bound
    # the scan, list by list, each query from its own bound
    cap = buf_d1.shape[0]
    buf_d = np.empty((mg, cap), np.int32)
    buf_i = np.empty((mg, cap), np.int64)
    kept = np.zeros(mg, np.int64)
    tau_d = np.empty(mg, np.int64)
    tau_i = np.empty(mg, np.int64)
    for qi in range(mg):
        kept[qi], tau_d[qi], tau_i[qi] = _start(tau0[qi], n_bits)
    for c in range(n_lists):
        lo, hi = offsets[c], offsets[c + 1]
        for p in range(l_ptr[c], l_ptr[c + 1]):  # the list stays in cache across its queries
            qi = by_list[p]
            oq = np.uint64(g0 + qi) * np.uint64(n_words)
            kept[qi], tau_d[qi], tau_i[qi] = _scan_list(
                db, ids, lo, hi, n_total, queries, oq, n_words, vector, width, wide, k_eff,
                buf_d[qi], buf_i[qi], tmp, hist, dist, kept[qi], tau_d[qi], tau_i[qi],
            )  # fmt: skip
    for qi in range(mg):
        q = g0 + qi
        if kept[qi] < k_eff and tau0[qi] <= n_bits:  # too tight: its lists again, alone
            n_pr = q_ptr[qi + 1] - q_ptr[qi]
            kept[qi] = _scan_lists(
                db, ids, offsets, probed[q_ptr[qi] :], n_pr, n_total, queries,
                np.uint64(q) * np.uint64(n_words), n_words, vector, width, wide, k_eff, n_bits,
                n_bits + 1, buf_d[qi], buf_i[qi], tmp, hist, dist,
            )  # fmt: skip
        _finish(kept[qi], k, k_eff, buf_d[qi], buf_i[qi], tmp, hist, out_d, out_i, q)


#: queries scanned together by :func:`_ivf_knn_group` (their top-k buffers live at once)
_GROUP_QUERIES = 1024


@njit(nogil=True, inline="always")
def _rerank_query(
    P, q, table, db, n_words, n_bits, row_of_id, out_i, heap_s, heap_p, out_s, out_si
):
    """Re-rank query ``q``'s Hamming shortlist ``out_i[q]`` (ids, padding last) by the
    asymmetric score of its projections ``P[q]`` (:mod:`hashlearn.index._asymmetric`'s byte
    tables and scoring, so a code scores exactly as there): the best ``out_s.shape[1]`` into
    ``out_s / out_si[q]``, ties to the smaller id. Run right after the query's own scan, the
    shortlisted codes are still in cache."""
    byte_tables(P[q], n_bits, table)
    size = 0
    k_out = out_s.shape[1]
    for c in range(out_i.shape[1]):
        item = out_i[q, c]
        if item < 0:  # the padding comes last
            break
        s = _score(table, db, row_of_id[item], n_words)
        size = _offer_score(heap_s, heap_p, size, k_out, s, item)
    _emit_scores(heap_s, heap_p, size, out_s, out_si, q)


@njit(nogil=True, inline="always")
def _ivf_knn_core(
    db,
    ids,
    offsets,
    centroids,
    n_lists,
    queries,
    cfd,
    q_start,
    q_end,
    k,
    k_eff,
    n_bits,
    n_probe,
    min_codes,
    grouped,
    out_d,
    out_i,
    P,
    row_of_id,
    out_s,
    out_si,
    n_words,
    vector,
    width,
    wide,
):
    asym = P.shape[0] > 0  # re-rank each shortlist by the projections (else Hamming only)
    table = np.empty(n_words * 8 * 256 if asym else 0, np.float32)
    heap_s = np.empty(out_s.shape[1], np.float32)
    heap_p = np.empty(out_s.shape[1], np.int64)
    cap = 4 * k_eff + 64
    scratch = (
        np.empty(cap, np.int32),  # one query's top-k buffer: distances
        np.empty(cap, np.int64),  # ... and ids
        np.empty(cap, np.int64),  # the ties of a cut
        np.zeros(n_bits + 1, np.int64),  # a histogram of distances
        np.zeros(n_bits + 2, np.int64),  # probing: lists per centroid distance
        np.empty(n_lists, np.int64),  # probing: centroid distances
        np.empty(2 * n_lists, np.int64),  # probing: the lists in order
        np.empty(_MINI_BLOCK, np.int64),  # a mini-block's distances
        np.empty(n_lists, np.float32),  # probing float centroids: a heap's distances
    )
    if q_end - q_start == 1 or not grouped:
        for q in range(q_start, q_end):
            _ivf_knn_one(
                db, ids, offsets, centroids, n_lists, queries, cfd, q, k, k_eff, n_bits,
                n_probe, min_codes, out_d, out_i, n_words, vector, width, wide, scratch,
            )  # fmt: skip
            if asym:
                _rerank_query(
                    P, q, table, db, n_words, n_bits, row_of_id, out_i, heap_s, heap_p, out_s,
                    out_si,
                )  # fmt: skip
        return
    for g0 in range(q_start, q_end, _GROUP_QUERIES):
        g1 = min(q_end, g0 + _GROUP_QUERIES)
        _ivf_knn_group(
            db, ids, offsets, centroids, n_lists, queries, cfd, g0, g1, k, k_eff, n_bits,
            n_probe, min_codes, out_d, out_i, n_words, vector, width, wide, scratch,
        )  # fmt: skip
        if asym:
            for q in range(g0, g1):
                _rerank_query(
                    P, q, table, db, n_words, n_bits, row_of_id, out_i, heap_s, heap_p, out_s,
                    out_si,
                )  # fmt: skip


@njit(nogil=True, cache=True)
def ivf_knn_fixed_width(
    db,
    ids,
    offsets,
    centroids,
    n_lists,
    queries,
    cfd,
    q_start,
    q_end,
    k,
    k_eff,
    n_bits,
    n_probe,
    min_codes,
    grouped,
    out_d,
    out_i,
    P,
    row_of_id,
    out_s,
    out_si,
    width,
):
    """The k nearest of queries ``q_start:q_end`` in their probed lists, the word count a
    compile-time constant (the length of the tuple ``width``, as in ``_knn_scan``)."""
    n_words = len(width)
    _ivf_knn_core(
        db,
        ids,
        offsets,
        centroids,
        n_lists,
        queries,
        cfd,
        q_start,
        q_end,
        k,
        k_eff,
        n_bits,
        n_probe,
        min_codes,
        grouped,
        out_d,
        out_i,
        P,
        row_of_id,
        out_s,
        out_si,
        n_words,
        True,
        width,
        False,
    )


@njit(nogil=True, cache=True)
def ivf_knn_wide(
    db,
    ids,
    offsets,
    centroids,
    n_lists,
    queries,
    cfd,
    q_start,
    q_end,
    k,
    k_eff,
    n_bits,
    n_probe,
    min_codes,
    grouped,
    out_d,
    out_i,
    P,
    row_of_id,
    out_s,
    out_si,
    width,
):
    """:func:`ivf_knn_fixed_width` on the wide path (CPUs with AVX-512 VPOPCNTDQ or AVX2, see
    :func:`hashlearn._utils.popcount.kernel_path`): whole mini-blocks of a list through
    :func:`hashlearn._utils.popcount.wide_mini_block`, 8 codes per 512-bit step."""
    n_words = len(width)
    _ivf_knn_core(
        db,
        ids,
        offsets,
        centroids,
        n_lists,
        queries,
        cfd,
        q_start,
        q_end,
        k,
        k_eff,
        n_bits,
        n_probe,
        min_codes,
        grouped,
        out_d,
        out_i,
        P,
        row_of_id,
        out_s,
        out_si,
        n_words,
        True,
        width,
        True,
    )


@njit(nogil=True, cache=True)
def ivf_knn_any_width(
    db,
    ids,
    offsets,
    centroids,
    n_lists,
    queries,
    cfd,
    q_start,
    q_end,
    k,
    k_eff,
    n_bits,
    n_probe,
    min_codes,
    grouped,
    out_d,
    out_i,
    P,
    row_of_id,
    out_s,
    out_si,
    n_words,
):
    """:func:`ivf_knn_fixed_width` for word counts without a specialisation."""
    _ivf_knn_core(
        db,
        ids,
        offsets,
        centroids,
        n_lists,
        queries,
        cfd,
        q_start,
        q_end,
        k,
        k_eff,
        n_bits,
        n_probe,
        min_codes,
        grouped,
        out_d,
        out_i,
        P,
        row_of_id,
        out_s,
        out_si,
        n_words,
        False,
        (0,),
        False,
    )


# -------------------------------------------------------------------------- range scan


@njit(nogil=True, inline="always")
def _code_distance(db, i, queries, oq, n_words):
    o = i * n_words
    d = 0
    for w in range(n_words):
        d += popcount64(db[o + w] ^ queries[oq + w])
    return d


@njit(nogil=True, cache=True)
def ivf_range_count(
    db, offsets, centroids, n_lists, queries, cfd, n_words, n_bits, radius, n_probe,
    min_codes, counts, q_start, q_end,
):  # fmt: skip
    """``counts[q]`` = codes within ``radius`` of query ``q`` in its probed lists."""
    by_level = np.zeros(n_bits + 2, np.int64)
    cdist = np.empty(n_lists, np.int64)
    order = np.empty(2 * n_lists, np.int64)
    heap_d = np.empty(n_lists, np.float32)
    for q in range(q_start, q_end):
        oq = q * n_words
        n_pr = _probe_lists(
            cfd, q, heap_d, centroids, n_lists, offsets, queries, np.uint64(oq), n_words,
            False, n_bits, n_probe, min_codes, cdist, by_level, order, (0,), False,
        )  # fmt: skip
        count = 0
        for j in range(n_pr):
            c = order[j]
            for i in range(offsets[c], offsets[c + 1]):
                count += _code_distance(db, i, queries, oq, n_words) <= radius
        counts[q] = count


@njit(nogil=True, cache=True)
def ivf_range_fill(
    db, ids, offsets, centroids, n_lists, queries, cfd, n_words, n_bits, radius, n_probe,
    min_codes, lims, out_d, out_i, q_start, q_end,
):  # fmt: skip
    """Fill query ``q``'s slots ``lims[q]:lims[q+1]`` with its codes within ``radius`` in
    its probed lists, sorted by (distance, id)."""
    by_level = np.zeros(n_bits + 2, np.int64)
    hist = np.zeros(n_bits + 1, np.int64)
    cdist = np.empty(n_lists, np.int64)
    order = np.empty(2 * n_lists, np.int64)
    heap_d = np.empty(n_lists, np.float32)
    for q in range(q_start, q_end):
        oq = q * n_words
        n_pr = _probe_lists(
            cfd, q, heap_d, centroids, n_lists, offsets, queries, np.uint64(oq), n_words,
            False, n_bits, n_probe, min_codes, cdist, by_level, order, (0,), False,
        )  # fmt: skip
        lo = lims[q]
        count = lims[q + 1] - lo
        seg_d = np.empty(count, np.int32)
        seg_i = np.empty(count, np.int64)
        t = 0
        for j in range(n_pr):
            c = order[j]
            for i in range(offsets[c], offsets[c + 1]):
                d = _code_distance(db, i, queries, oq, n_words)
                if d <= radius:
                    seg_d[t] = d
                    seg_i[t] = ids[i]
                    t += 1
        by_id = np.argsort(seg_i)
        hist[:] = 0
        for j in range(count):
            hist[seg_d[j]] += 1
        start = lo
        for d in range(n_bits + 1):
            h = hist[d]
            hist[d] = start
            start += h
        for j in range(count):
            s = by_id[j]
            slot = hist[seg_d[s]]
            hist[seg_d[s]] = slot + 1
            out_d[slot] = seg_d[s]
            out_i[slot] = seg_i[s]


# ------------------------------------------------------------------------------ writing


@njit(nogil=True, cache=True)
def merge_lists(old_w, old_ids, old_off, new_w, new_ids, new_off, n_words, out_w, out_ids):
    """Lists of the old layout merged with those of the added codes, list by list, each
    merged by id (both inputs hold every list's ids ascending; so does the output).
    ``out_w`` / ``out_ids`` have room for both; returns nothing (offsets are the sums)."""
    n_lists = old_off.shape[0] - 1
    t = 0
    for c in range(n_lists):
        a, a_end = old_off[c], old_off[c + 1]
        b, b_end = new_off[c], new_off[c + 1]
        while a < a_end or b < b_end:
            if b >= b_end or (a < a_end and old_ids[a] < new_ids[b]):
                for w in range(n_words):
                    out_w[t * n_words + w] = old_w[a * n_words + w]
                out_ids[t] = old_ids[a]
                a += 1
            else:
                for w in range(n_words):
                    out_w[t * n_words + w] = new_w[b * n_words + w]
                out_ids[t] = new_ids[b]
                b += 1
            t += 1


@njit(nogil=True, cache=True)
def lists_sorted(ids, offsets):
    """Whether every list's ids are strictly ascending (a loaded layout's invariant)."""
    for c in range(offsets.shape[0] - 1):
        for i in range(offsets[c] + 1, offsets[c + 1]):
            if ids[i] <= ids[i - 1]:
                return False
    return True


# ------------------------------------------------------------- residual codes (RaBitQ)

#: bit planes of a query's quantized projections (RaBitQ's ``B_q = 4``: 16 levels)
QUERY_PLANES = 4
_QUERY_LEVELS = (1 << QUERY_PLANES) - 1


@njit(nogil=True, cache=True)
def query_planes(p, n_bits, planes):
    """Quantize the projections ``p`` to ``lo + step * level``, ``level`` in ``0..15``
    (RaBitQ's query quantization, Gao & Long 2024, Sec. 3.3: ``lo = min p``, ``step =
    (max p - min p) / 15``, round to nearest, in float64), into ``QUERY_PLANES`` bit planes
    of ``n_words`` words each (``planes[t * n_words + w]``: bit ``t`` of the levels of bits
    ``64 w .. 64 w + 63``); returns ``(lo, step, total)``, ``total`` the sum of the quantized
    values. Then ``<p_bar, x> = lo |x| + step sum_t 2^t popcount(x & plane_t)`` for a code
    ``x`` of bits."""
    n_words = planes.shape[0] // QUERY_PLANES
    lo = np.inf
    hi = -np.inf
    for j in range(n_bits):
        v = np.float64(p[j])
        lo = min(lo, v)
        hi = max(hi, v)
    step = (hi - lo) / _QUERY_LEVELS if hi > lo else 1.0
    levels = 0
    for w in range(n_words):  # each word's four planes built in registers
        w0 = w1 = w2 = w3 = np.uint64(0)
        for b in range(min(64, n_bits - 64 * w)):
            # floor(x + 0.5) as a truncation: x = (p - lo) / step >= 0
            level = min(int((np.float64(p[64 * w + b]) - lo) / step + 0.5), _QUERY_LEVELS)
            levels += level
            u = np.uint64(level)
            shift = np.uint64(b)
            w0 |= (u & np.uint64(1)) << shift
            w1 |= ((u >> np.uint64(1)) & np.uint64(1)) << shift
            w2 |= ((u >> np.uint64(2)) & np.uint64(1)) << shift
            w3 |= (u >> np.uint64(3)) << shift
        planes[w] = w0
        planes[n_words + w] = w1
        planes[2 * n_words + w] = w2
        planes[3 * n_words + w] = w3
    return lo, step, n_bits * lo + step * levels


#: codes of a list scored before any is offered to the heap (one vectorised pass)
_RESIDUAL_BLOCK = 64


@njit(nogil=True, inline="always")
def _residual_block(db, factors, first, count, n_words, planes, coef, ones, weighted, out):
    """``out[u]`` = estimated score of code ``first + u`` (``u < count``), ``coef = (base,
    2 lo, 2 step, total)``: ``(base + h) + g ((2 lo |x| + 2 step sum_t 2^t popcount(x &
    plane_t)) - total)``, the integer sums exact, the float terms in a fixed order.

    Two passes, each a loop over the codes that LLVM vectorises with the codes in SIMD lanes
    when ``n_words`` is a compile-time constant (as
    :func:`hashlearn.index._knn_scan._mini_block_distances`; ``VPOPCNTQ`` where the CPU has
    it): the integer counts into ``ones`` / ``weighted``, then the float scores. Fused into
    one loop the same work ran 2.4x slower (3.3 against 7.9 ns a 256-bit code, Zen 4)."""
    base, two_lo, two_step, total = coef
    wu = np.uint64(n_words)
    o = np.uint64(first) * wu
    for u in range(np.uint64(count)):
        a = 0
        b = 0
        for w in range(wu):
            x = db[o + u * wu + w]
            a += popcount64(x)
            b += (
                popcount64(x & planes[w])
                + 2 * popcount64(x & planes[wu + w])
                + 4 * popcount64(x & planes[2 * wu + w])
                + 8 * popcount64(x & planes[3 * wu + w])
            )
        ones[u] = a
        weighted[u] = b
    for u in range(count):
        s = (two_lo * np.float32(ones[u]) + two_step * np.float32(weighted[u])) - total
        out[u] = (base + factors[first + u, 1]) + factors[first + u, 0] * s


@njit(nogil=True, inline="always")
def _residual_core(
    cfd, sq_norms, P, db, factors, ids, offsets, centroids, vectors, query_words, n_lists,
    n_words, vector, width, n_bits, n_probe, min_codes, out_s, out_i, q_start, q_end,
):  # fmt: skip
    assert QUERY_PLANES == 4  # _residual_block's four planes
    k_out = out_s.shape[1]
    planes = np.empty(QUERY_PLANES * n_words, np.uint64)
    cap = 2 * k_out + _RESIDUAL_BLOCK  # the buffer is cut to k_out when it fills
    buf_s = np.empty(cap, np.float32)
    buf_p = np.empty(cap, np.int64)
    heap_d = np.empty(n_lists, np.float32)
    order = np.empty(2 * n_lists, np.int64)
    cdist = np.empty(n_lists, np.int64)
    counts = np.zeros(n_bits + 2, np.int64)
    est = np.empty(_RESIDUAL_BLOCK, np.float32)
    ones = np.empty(_RESIDUAL_BLOCK, np.int64)
    weighted = np.empty(_RESIDUAL_BLOCK, np.int64)
    by_float = cfd.shape[0] > 0
    for q in range(q_start, q_end):
        lo, step, total = query_planes(P[q], n_bits, planes)
        two_lo, two_step = np.float32(2.0 * lo), np.float32(2.0 * step)
        total32 = np.float32(total)
        n_pr = _probe_lists(
            cfd, q, heap_d, centroids, n_lists, offsets, query_words, np.uint64(q * n_words),
            n_words, vector, n_bits, n_probe, min_codes, cdist, counts, order, width, False,
        )  # fmt: skip
        size = 0
        tau = np.float32(-np.inf)  # below it a code cannot be among the best k_out
        for t in range(n_pr):
            c = order[t]
            if by_float:  # <p_q, c_l> from the probe's distances
                base = np.float32(0.5) * (sq_norms[c] - cfd[q, c])
            else:
                base = np.float32(0.0)
                for j in range(n_bits):
                    base += P[q, j] * vectors[c, j]
            coef = (base, two_lo, two_step, total32)
            for r0 in range(offsets[c], offsets[c + 1], _RESIDUAL_BLOCK):
                m = min(_RESIDUAL_BLOCK, offsets[c + 1] - r0)
                _residual_block(db, factors, r0, m, n_words, planes, coef, ones, weighted, est)
                for u in range(m):
                    if est[u] >= tau:  # buffered; cut to the best k_out when full
                        buf_s[size], buf_p[size] = est[u], ids[r0 + u]
                        size += 1
                        if size == cap:
                            tau = _keep_best_scores(buf_s, buf_p, size, k_out)
                            size = k_out
        if size > k_out:
            _keep_best_scores(buf_s, buf_p, size, k_out)
            size = k_out
        _heapify_scores(buf_s, buf_p, size)
        _emit_scores(buf_s, buf_p, size, out_s, out_i, q)


@njit(nogil=True, cache=True)
def residual_knn_fixed_width(
    cfd, sq_norms, P, db, factors, ids, offsets, centroids, vectors, query_words, n_lists,
    n_bits, n_probe, min_codes, out_s, out_i, q_start, q_end, width,
):  # fmt: skip
    """The best ``out_s.shape[1]`` codes of each query's probed lists by the estimated score
    of :class:`~hashlearn.index.ivf_residual.ResidualIVFIndex` (its module doc), into
    ``out_s`` / ``out_i`` (float32 scores largest first, ids; ties to the smaller id; padded
    with ``-inf`` / ``-1``); the word count a compile-time constant (the length of the tuple
    ``width``, as in ``_knn_scan``).

    The probe (:func:`_probe_lists`): by ``cfd[q, l] = |c_l|^2 - 2 <p_q, c_l>`` when ``cfd``
    has rows (k-means lists; ``sq_norms[l] = |c_l|^2``), else by the Hamming distances of
    ``query_words`` (the queries' signs) to the binary ``centroids`` (k-majority lists, whose
    float centroids ``vectors`` give ``<p_q, c_l>``). Code ``r`` of a list scores ``<p_q,
    c_l> + shift_r + gain_r * <p_bar, 2 b_r - 1>`` with ``(gain_r, shift_r) = factors[r]``
    and ``p_bar`` the query's projections quantized to 4 bits (:func:`query_planes`): four
    ANDs and popcounts a word, the codes of a list scored ``_RESIDUAL_BLOCK`` at a time in
    SIMD lanes (:func:`_residual_block`)."""
    _residual_core(
        cfd, sq_norms, P, db, factors, ids, offsets, centroids, vectors, query_words, n_lists,
        len(width), True, width, n_bits, n_probe, min_codes, out_s, out_i, q_start, q_end,
    )  # fmt: skip


@njit(nogil=True, cache=True)
def residual_knn_any_width(
    cfd, sq_norms, P, db, factors, ids, offsets, centroids, vectors, query_words, n_lists,
    n_bits, n_probe, min_codes, out_s, out_i, q_start, q_end, n_words,
):  # fmt: skip
    """:func:`residual_knn_fixed_width` for word counts without a specialisation."""
    _residual_core(
        cfd, sq_norms, P, db, factors, ids, offsets, centroids, vectors, query_words, n_lists,
        n_words, False, (0,), n_bits, n_probe, min_codes, out_s, out_i, q_start, q_end,
    )  # fmt: skip

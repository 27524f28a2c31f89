"""Asymmetric ranking of packed binary codes: a real-valued query against database bits.

A linear hasher's code of ``x`` is ``x_j = [f_j(x) >= 0]`` for its projections ``f`` (the
``project`` scores before the sign). Symmetric search binarizes the query too and ranks by
Hamming distance; asymmetric search keeps the query's projections ``p = f(q)`` and ranks the
database codes by

    s(q, x) = sum_j p_j (2 x_j - 1)                         (larger = nearer)

which is Gordo, Perronnin, Gong & Lazebnik, *Asymmetric distances for binary embeddings*
(TPAMI 2014), expectation-based asymmetric distance with a reconstruction ``+-mu`` equal for
every bit: ``d_E(q, x) = ||p - mu (2x - 1)||^2 = ||p||^2 + b mu^2 - 2 mu s(q, x)``, so ranking
by ``s`` descending is ranking by ``d_E`` ascending. Equivalently
``s = ||p||_1 - 2 sum_{j : x_j != [p_j >= 0]} |p_j|``: the Hamming distance to the query's own
code with each disagreeing bit weighted by how far the query sits from that bit's hyperplane.
It is also the numerator of RaBitQ's inner-product estimator (Gao & Long, *RaBitQ*, SIGMOD
2024, ``<x_bar, q'>`` with ``x_bar = (2x - 1) / sqrt(b)``), up to a per-code factor.

The fast form is the look-up-table evaluation of product quantization's asymmetric distance
(Jegou, Douze & Schmid, *Product quantization for nearest neighbor search*, TPAMI 2011) with
bytes as sub-codes: per query, for each code byte ``g`` a table of the 256 partial sums
``T_g[v] = sum_{t < 8} p_{8g+t} (2 v_t - 1)`` (bits past ``b`` contribute nothing), built once
in float64 and stored as float32; a code then costs one look-up and one add per byte. Codes
are read as FlatIndex's 64-bit words (:func:`hashlearn.codes.as_words`: no copy when a code is
a whole number of words), the bytes cut from each word by shifts. Two modes, both keeping the
top k as they score in a binary heap (ties to the smaller position):

* :func:`asymmetric_scan`: every code of the database, scoring exactly only the codes whose
  certified upper bound reaches the k-th score kept so far (:func:`bounded_scan_kernel`);
* :func:`asymmetric_rerank`: a candidate list per query (the Hamming shortlist to re-rank).

The bound: with ``c_j = [p_j >= 0]`` and ``d = x XOR c``, ``s = ||p||_1 - 2 sum_j d_j |p_j|``.
Weights ``w_j = min(floor(|p_j| / delta), 2^B - 1)`` give ``delta w_j <= |p_j|``, so
``s <= ||p||_1 - 2 delta sum_t 2^t popcount(d & plane_t)`` over the ``B`` bit planes of
``w`` (the bit-plane inner product of RaBitQ's quantized query, Gao & Long, SIGMOD 2024,
Sec. 3.3); plus ``eps`` (the float32 bound below) it bounds the float32 score, so a code
whose bound is below the k-th score kept is never in the top k and is not scored. Dropping
low planes only lowers the weight, so the top plane alone (one popcount per word, as a
Hamming scan) filters first and the other planes are counted where it passes.

Indexes reach the same kernels through :func:`scan_words` / :func:`rerank_words`, which take
a snapshot's rows of words as they are (``FlatIndex.search_asymmetric``, and
``BinaryIndex.search_asymmetric``'s shortlist re-rank for the other Hamming indexes).

Which bit a projection of exactly 0 gets does not matter here: it adds ``0`` to ``s`` either
way, so hashers thresholding with ``>= 0`` (most) and ``> 0`` (sign bits, BoostSSC) are
ranked alike by their projections.

The kernels are serial and GIL-free over a range of queries; the Python functions validate,
then run chunks of queries on the thread pool (:func:`hashlearn._utils.parallel.parallel_chunks`).
Scores are float32 sums of float32 table entries in a fixed order per code, so a code scores
the same in both modes; against an exact (float64) sum a score is off by at most about
``(ceil(b / 8) + 3) * 2**-24 * ||p||_1``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from hashlearn._utils.kernel_args import frozen
from hashlearn._utils.parallel import parallel_chunks
from hashlearn._utils.popcount import popcount64, trailing_zeros64
from hashlearn._utils.validation import as_plain_array, check_codes, check_k
from hashlearn.codes import as_words
from hashlearn.hashers.base import BaseHasher

__all__ = [
    "SHORTLIST_FACTOR",
    "asymmetric_scan",
    "asymmetric_rerank",
    "byte_tables",
    "check_projections",
    "check_ranking",
    "rerank_words",
    "scan_words",
]

#: an index's asymmetric search re-ranks each query's ``SHORTLIST_FACTOR * k`` nearest codes
#: by Hamming distance (:meth:`hashlearn.index.base.BinaryIndex.search_asymmetric`)
SHORTLIST_FACTOR = 4
_BLOCK = 64  # codes scored before any is offered to the top k
_U0 = np.uint64(0)
_PLANES = 5  # bit planes of the bound's weights (B)
_FIRST = 1  # top planes of the first pass (the others only where those pass)
_DENSE = 10  # all planes for every code where over 1/_DENSE pass the top planes
_CLIP = 0.99  # quantile of |p| mapped to the top weight 2^B - 1
_NO_OVERFLOW = 1e38  # ||p||_1 above which table sums may overflow float32
_STRIDE = 8  # the seed weight from every _STRIDE-th code's weight
#: word counts with a bounded kernel of their own (a constant width), keyed by a tuple
_WIDTH_TAGS = {w: (0,) * w for w in (1, 2, 3, 4, 6, 8)}


# ------------------------------------------------------------------------------ kernels


@njit(nogil=True, cache=True)
def byte_tables(p, n_bits, table):
    """Fill ``table`` (float32, 256 entries per code byte) with the partial sums of ``p``.

    ``table[256 g + v] = sum_{t < 8, 8g + t < b} p[8g + t] * (2 bit_t(v) - 1)``, computed in
    float64 by doubling: the all-zero byte's sum, then for each bit ``t`` the values below
    ``2^t`` with bit ``t`` added (``+ 2 p_t``). Bits past ``b`` add nothing, so the tables of
    the padding bytes up to a whole word are zero.
    """
    sums = np.empty(256, np.float64)
    for g in range(table.shape[0] // 256):
        base = 0.0
        for t in range(8):
            if 8 * g + t < n_bits:
                base -= np.float64(p[8 * g + t])
        sums[0] = base
        for t in range(8):
            j = 8 * g + t
            step = 2.0 * np.float64(p[j]) if j < n_bits else 0.0
            half = 1 << t
            for v in range(half):
                sums[half + v] = sums[v] + step
        for v in range(256):
            table[256 * g + v] = np.float32(sums[v])


@njit(nogil=True, inline="always")
def _score(table, words, row, n_words):
    """``s`` of code ``row`` (flat uint64 ``words``, ``n_words`` per code): one look-up per
    byte, the bytes cut from each word by shifts, four running sums (independent chains of
    adds) combined in a fixed order. Unsigned indices: no negative-index wraparound (half
    the time of signed ones)."""
    o = np.uint64(row) * np.uint64(n_words)
    m8 = np.uint64(0xFF)
    s0 = np.float32(0.0)
    s1 = np.float32(0.0)
    s2 = np.float32(0.0)
    s3 = np.float32(0.0)
    for w in range(np.uint64(n_words)):
        x = words[o + w]
        t = w << np.uint64(11)  # 8 tables of 256 entries per word
        s0 += table[t + (x & m8)]
        s1 += table[t + np.uint64(256) + ((x >> np.uint64(8)) & m8)]
        s2 += table[t + np.uint64(512) + ((x >> np.uint64(16)) & m8)]
        s3 += table[t + np.uint64(768) + ((x >> np.uint64(24)) & m8)]
        s0 += table[t + np.uint64(1024) + ((x >> np.uint64(32)) & m8)]
        s1 += table[t + np.uint64(1280) + ((x >> np.uint64(40)) & m8)]
        s2 += table[t + np.uint64(1536) + ((x >> np.uint64(48)) & m8)]
        s3 += table[t + np.uint64(1792) + (x >> np.uint64(56))]
    return (s0 + s1) + (s2 + s3)


@njit(nogil=True, inline="always")
def _worse(s_a, p_a, s_b, p_b):
    """Whether ``(s_a, p_a)`` ranks after ``(s_b, p_b)``: lower score, or a tie at a larger
    position."""
    return s_a < s_b or (s_a == s_b and p_a > p_b)


@njit(nogil=True, cache=True)
def _sift_down(heap_s, heap_p, size, j):
    """Restore the heap below slot ``j`` (each parent ranks after its children)."""
    s, p = heap_s[j], heap_p[j]
    while True:
        c = 2 * j + 1
        if c >= size:
            break
        if c + 1 < size and _worse(heap_s[c + 1], heap_p[c + 1], heap_s[c], heap_p[c]):
            c += 1
        if not _worse(heap_s[c], heap_p[c], s, p):
            break
        heap_s[j], heap_p[j] = heap_s[c], heap_p[c]
        j = c
    heap_s[j], heap_p[j] = s, p


@njit(nogil=True, inline="always")
def _offer(heap_s, heap_p, size, k, s, p):
    """Keep ``(s, p)`` among the best ``k`` pairs of the heap (root: the worst kept pair);
    returns the new size. O(log k) per pair kept, one comparison per pair refused."""
    if size == k:
        if not _worse(heap_s[0], heap_p[0], s, p):
            return size
        heap_s[0], heap_p[0] = s, p
        _sift_down(heap_s, heap_p, size, 0)
        return size
    j = size
    while j > 0:  # sift up
        parent = (j - 1) // 2
        if not _worse(s, p, heap_s[parent], heap_p[parent]):
            break
        heap_s[j], heap_p[j] = heap_s[parent], heap_p[parent]
        j = parent
    heap_s[j], heap_p[j] = s, p
    return size + 1


@njit(nogil=True, inline="always")
def _swap(buf_s, buf_p, a, b):
    buf_s[a], buf_s[b] = buf_s[b], buf_s[a]
    buf_p[a], buf_p[b] = buf_p[b], buf_p[a]


@njit(nogil=True, cache=True)
def _keep_best(buf_s, buf_p, n, k):
    """Reorder ``buf[:n]`` (``k < n``, distinct pairs) so that ``buf[:k]`` holds its ``k``
    best pairs, in no order (:func:`_worse`'s ranking); returns the lowest score of those.

    Quickselect (Hoare, "Algorithm 65: Find", CACM 1961) with a median-of-three pivot:
    linear on average. A scan that buffers the codes reaching its threshold and cuts the
    buffer to ``k`` when it fills does about ``log(n / k)`` cuts where a heap does a sift per
    code kept."""
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _worse(buf_s[lo], buf_p[lo], buf_s[mid], buf_p[mid]):
            _swap(buf_s, buf_p, lo, mid)
        if _worse(buf_s[lo], buf_p[lo], buf_s[hi], buf_p[hi]):
            _swap(buf_s, buf_p, lo, hi)
        if _worse(buf_s[mid], buf_p[mid], buf_s[hi], buf_p[hi]):
            _swap(buf_s, buf_p, mid, hi)
        _swap(buf_s, buf_p, mid, hi)  # the median of the three as the pivot, at hi
        ps, pp = buf_s[hi], buf_p[hi]
        store = lo
        for i in range(lo, hi):
            if _worse(ps, pp, buf_s[i], buf_p[i]):  # ranks before the pivot
                _swap(buf_s, buf_p, i, store)
                store += 1
        _swap(buf_s, buf_p, store, hi)
        if store == k or store == k - 1:
            break
        if store > k:
            hi = store - 1
        else:
            lo = store + 1
    low = buf_s[0]
    for i in range(1, k):
        low = min(low, buf_s[i])
    return low


@njit(nogil=True, cache=True)
def _heapify(heap_s, heap_p, size):
    """Make ``heap[:size]`` the heap :func:`_offer` keeps (root: the worst pair)."""
    for j in range(size // 2 - 1, -1, -1):
        _sift_down(heap_s, heap_p, size, j)


@njit(nogil=True, cache=True)
def _emit(heap_s, heap_p, size, out_s, out_i, row):
    """Write the heap's pairs to ``out[row]`` best first (popping the worst to the back),
    then the padding."""
    for r in range(size, out_s.shape[1]):
        out_s[row, r] = -np.inf
        out_i[row, r] = -1
    while size > 0:
        size -= 1
        out_s[row, size], out_i[row, size] = heap_s[0], heap_p[0]
        heap_s[0], heap_p[0] = heap_s[size], heap_p[size]
        _sift_down(heap_s, heap_p, size, 0)


@njit(nogil=True, cache=True)
def scan_kernel(P, words, n, n_words, n_bits, k, out_s, out_i, q_start, q_end):  # pragma: no cover
    """Top ``k`` of all ``n`` codes (flat uint64 ``words``) for queries ``q_start:q_end``.

    Scores go a block of 64 codes at a time into a small array; only those reaching the
    k-th score so far are then offered to the top k (one predictable branch per code)."""
    table = np.empty(n_words * 8 * 256, np.float32)
    heap_s = np.empty(k, np.float32)
    heap_p = np.empty(k, np.int64)
    block = np.empty(_BLOCK, np.float32)
    for q in range(q_start, q_end):
        byte_tables(P[q], n_bits, table)
        size = 0
        tau = np.float32(-np.inf)  # the k-th score once k are kept
        for i0 in range(0, n, _BLOCK):
            count = min(_BLOCK, n - i0)
            for u in range(count):
                block[u] = _score(table, words, i0 + u, n_words)
            for u in range(count):
                if block[u] > tau:  # scan order: a tie with the k-th comes later, loses
                    size = _offer(heap_s, heap_p, size, k, block[u], i0 + u)
                    if size == k:
                        tau = heap_s[0]
        _emit(heap_s, heap_p, size, out_s, out_i, q)


@njit(nogil=True, cache=True)
def plane_masks(p, n_bits, sign_words, planes):
    """The query's bound of :func:`bounded_scan_kernel`; returns ``(||p||_1 + eps, 2 delta)``.

    ``sign_words`` (uint64, one per code word) gets the query's code ``c_j = [p_j >= 0]``,
    ``planes[t]`` bit plane ``t`` of the weights ``w_j = min(floor(|p_j| / delta), 2^B - 1)``
    with ``delta`` the ``_CLIP`` quantile of ``|p|`` over ``2^B - 1`` (``B = _PLANES``), so
    ``delta w_j <= |p_j|``. ``eps`` covers the float32 rounding of a code's table score and,
    with one more ``2**-24 ||p||_1``, every float64 rounding of the bound. Where a float32
    sum could overflow (``||p||_1 > 1e38``) the bound is ``+inf``: every code is scored.
    """
    n_words = sign_words.shape[0]
    a = np.empty(n_bits, np.float64)
    for w in range(n_words):
        sign_words[w] = np.uint64(0)
        for t in range(_PLANES):
            planes[t, w] = np.uint64(0)
    total = 0.0
    for j in range(n_bits):
        a[j] = abs(np.float64(p[j]))
        total += a[j]
        if p[j] >= 0:
            sign_words[j >> 6] |= np.uint64(1) << np.uint64(j & 63)
    top = (1 << _PLANES) - 1
    ranked = np.sort(a)
    scale = ranked[int(_CLIP * (n_bits - 1))]
    if scale == 0.0:
        scale = ranked[n_bits - 1]
    delta = scale / top if scale > 0.0 else 1.0
    for j in range(n_bits):
        weight = min(int(np.floor(a[j] / delta)), top)
        for t in range(_PLANES):
            if (weight >> t) & 1:
                planes[t, j >> 6] |= np.uint64(1) << np.uint64(j & 63)
    if total > _NO_OVERFLOW:  # a float32 partial sum may overflow: no bound, score all
        return np.inf, 2.0 * delta
    eps = ((n_bits + 7) // 8 + 4) * 2.0**-24 * total
    return total + eps, 2.0 * delta


@njit(nogil=True, inline="always")
def _weight_max(l1_eps, two_delta, tau, w_hi):
    """The largest ``w`` in ``[-1, w_hi]`` with ``l1_eps - two_delta * w >= tau`` (the
    expression nonincreasing in ``w``): codes of bound weight above it are skipped."""
    r = (l1_eps - np.float64(tau)) / two_delta
    w = -1 if not r >= 0.0 else (w_hi if r >= w_hi else int(r))
    while w < w_hi and l1_eps - two_delta * (w + 1) >= tau:
        w += 1
    while w >= 0 and l1_eps - two_delta * w < tau:
        w -= 1
    return w


@njit(nogil=True, inline="always")
def _bound_weights(words, first, count, n_words, sign_words, planes, t0, out):
    """``out[u]`` = bound weight ``sum_{t >= t0} 2^t popcount((x XOR c) & plane_t)`` of code
    ``first + u`` (``t0 > 0``: a lower bound of the weight from the top planes only); with
    ``n_words`` a compile-time constant LLVM vectorises across codes."""
    nw = np.uint64(n_words)
    block = words[first * n_words : (first + count) * n_words]  # indexed from 0: vectorises
    for u in range(np.uint64(count)):
        acc = 0
        for w in range(nw):
            d = block[u * nw + w] ^ sign_words[w]
            for t in range(t0, _PLANES):
                acc += popcount64(d & planes[t, w]) << t
        out[u] = acc


@njit(nogil=True, inline="always")
def _full_weight(words, i, n_words, sign_words, planes):
    """The bound weight of code ``i`` over all planes."""
    nw = np.uint64(n_words)
    o = np.uint64(i) * nw
    acc = 0
    for w in range(nw):
        d = words[o + w] ^ sign_words[w]
        for t in range(_PLANES):
            acc += popcount64(d & planes[t, w]) << t
    return acc


@njit(nogil=True, inline="always")
def _within(weight, first, lo, hi):
    """Bit ``u`` set where ``lo <= weight[first + u] <= hi``, over a block of 64 (LLVM
    vectorises it); ``weight`` is padded to whole blocks."""
    span = np.uint32(hi - lo)
    block = weight[first : first + _BLOCK]  # a slice: indexed from 0, the loop vectorises
    mask = _U0
    for u in range(_BLOCK):
        mask |= np.uint64(np.uint32(block[u] - np.int32(lo)) <= span) << np.uint64(u)
    return mask


@njit(nogil=True, inline="always")
def _offer_any(heap_s, heap_p, size, k, s, p):
    """:func:`_offer` for pairs in any position order, as the full scan would keep them: a
    score ``-inf`` (or NaN) never enters, a tie with the k-th goes to the smaller position."""
    if size < k and not s > -np.inf:
        return size
    return _offer(heap_s, heap_p, size, k, s, p)


@njit(nogil=True, inline="always")
def _bounded_core(P, words, n, n_words, n_bits, k, out_s, out_i, scored, q_start, q_end):
    table = np.empty(n_words * 8 * 256, np.float32)
    heap_s = np.empty(k, np.float32)
    heap_p = np.empty(k, np.int64)
    sign_words = np.empty(n_words, np.uint64)
    planes = np.empty((_PLANES, n_words), np.uint64)
    w_hi = n_bits * ((1 << _PLANES) - 1)
    weight = np.full(-(-n // _BLOCK) * _BLOCK, w_hi + 1, np.int32)  # padding never passes
    hist = np.empty(w_hi + 2, np.int64)  # + the scored codes' mark
    stride = max(1, min(_STRIDE, n // (4 * k)))
    seeds = (2 * k + stride - 1) // stride
    t0 = _PLANES - _FIRST
    for q in range(q_start, q_end):
        byte_tables(P[q], n_bits, table)
        l1_eps, two_delta = plane_masks(P[q], n_bits, sign_words, planes)
        for i0 in range(0, n, _BLOCK):
            count_b = min(_BLOCK, n - i0)
            _bound_weights(words, i0, count_b, n_words, sign_words, planes, t0, weight[i0:])
        size, count, exact = 0, 0, t0 == 0
        while True:
            hist[:] = 0
            for i in range(0, n, stride):  # every stride-th code: a cheap histogram of weights
                hist[weight[i]] += 1
            w_seed, below = 0, hist[0]  # about 2k codes of least weight seed the top k
            while below < seeds and w_seed < w_hi:
                w_seed += 1
                below += hist[w_seed]
            for i0 in range(0, n, _BLOCK):  # the seeds, in position order
                mask = _within(weight, i0, 0, w_seed)
                count += popcount64(mask)
                while mask:
                    i = i0 + trailing_zeros64(mask)
                    s = _score(table, words, i, n_words)
                    size = _offer_any(heap_s, heap_p, size, k, s, i)
                    mask &= mask - np.uint64(1)
            tau = heap_s[0] if size == k else np.float32(-np.inf)
            w_max = _weight_max(l1_eps, two_delta, tau, w_hi)
            if exact:
                break
            passing = 0
            for w in range(w_seed + 1, w_max + 1):
                passing += hist[w]
            if passing * stride * _DENSE <= n:
                break
            exact = True  # the top planes select too little: all planes, seeded again
            for i0 in range(0, n, _BLOCK):
                mask = _within(weight, i0, 0, w_seed)
                count_b = min(_BLOCK, n - i0)
                _bound_weights(words, i0, count_b, n_words, sign_words, planes, 0, weight[i0:])
                while mask:  # scored already: never again
                    weight[i0 + trailing_zeros64(mask)] = w_hi + 1
                    mask &= mask - np.uint64(1)
        lo = w_seed + 1  # pass 2: the codes of weight in [lo, w_max]
        for i0 in range(0, n, _BLOCK):  # the others whose bound reaches tau
            mask = _within(weight, i0, lo, w_max) if w_max >= lo else _U0
            while mask:
                i = i0 + trailing_zeros64(mask)
                mask &= mask - np.uint64(1)
                if exact:
                    if weight[i] > w_max:  # tau rose within this block
                        continue
                elif _full_weight(words, i, n_words, sign_words, planes) > w_max:
                    continue
                count += 1
                s = _score(table, words, i, n_words)
                if size < k or s >= tau:
                    size = _offer_any(heap_s, heap_p, size, k, s, i)
                    if size == k and heap_s[0] != tau:
                        tau = heap_s[0]
                        w_max = _weight_max(l1_eps, two_delta, tau, w_hi)
        scored[q] = count
        _emit(heap_s, heap_p, size, out_s, out_i, q)


@njit(nogil=True, cache=True)
def bounded_scan_kernel(
    P, words, n, n_words, n_bits, k, out_s, out_i, scored, q_start, q_end
):  # pragma: no cover
    """:func:`scan_kernel`'s top ``k``, scoring only the codes whose bound reaches ``tau``.

    A code's bound weight is ``sum_t 2^t popcount(d & plane_t)`` (``d = x XOR c``); its top
    ``_FIRST`` planes alone give a lower bound of it, so a bound on the score. First that
    partial weight of every code; the ~2k codes of least weight (cut by a histogram of every
    ``_STRIDE``-th weight) are scored and seed the top k. Where over ``1/_DENSE`` of the
    codes would still pass, every code's full weight instead, and seeds again. Then, in
    position order, each other code whose bound ``||p||_1 + eps - 2 delta weight`` (its full
    weight, computed if needed) reaches the k-th kept score ``tau`` is scored. A skipped code
    scores below ``tau`` and pairs enter by (score, position) whatever the order, so the top
    k, scores and ties included, is :func:`scan_kernel`'s. ``scored[q]``: codes scored."""
    _bounded_core(P, words, n, n_words, n_bits, k, out_s, out_i, scored, q_start, q_end)


@njit(nogil=True, cache=True)
def bounded_scan_fixed_width(
    P, words, n, width, n_bits, k, out_s, out_i, scored, q_start, q_end
):  # pragma: no cover
    """:func:`bounded_scan_kernel` with the word count the length of the tuple ``width``, a
    compile-time constant (one compiled kernel per count, as ``_knn_scan`` does)."""
    _bounded_core(P, words, n, len(width), n_bits, k, out_s, out_i, scored, q_start, q_end)


@njit(nogil=True, cache=True)
def rerank_kernel(
    P, words, n_words, cand, n_bits, k, out_s, out_i, q_start, q_end
):  # pragma: no cover
    """Top ``k`` of each query's candidate positions ``cand[q]`` (-1 skipped)."""
    table = np.empty(n_words * 8 * 256, np.float32)
    heap_s = np.empty(k, np.float32)
    heap_p = np.empty(k, np.int64)
    for q in range(q_start, q_end):
        byte_tables(P[q], n_bits, table)
        size = 0
        for c in range(cand.shape[1]):
            i = cand[q, c]
            if i >= 0:
                size = _offer(heap_s, heap_p, size, k, _score(table, words, i, n_words), i)
        _emit(heap_s, heap_p, size, out_s, out_i, q)


# --------------------------------------------------------------------------- Python API


def _check_projections(projections, owner: str) -> np.ndarray:
    """``projections`` as C-ordered read-only float32 ``(m, b)``, finite, ``b >= 1``."""
    P = as_plain_array(projections, "projections")
    if not isinstance(P, np.ndarray):
        raise TypeError(
            f"projections of {owner} must be a numpy.ndarray (a hasher's project(X)). "
            f"Got {type(P).__name__} instead."
        )
    if not np.issubdtype(P.dtype, np.floating):
        raise TypeError(
            f"projections of {owner} must have a floating dtype. Got dtype {P.dtype} instead."
        )
    if P.ndim != 2 or P.shape[1] == 0:
        raise ValueError(
            f"projections of {owner} must be a 2-D array (n_queries, n_bits) with n_bits >= 1. "
            f"Got shape {P.shape}."
        )
    if P.dtype == np.float32:
        P = frozen(P, np.float32)
    else:
        with np.errstate(over="ignore"):  # too large for float32: inf, refused below
            P = frozen(P, np.float32)
    if not np.isfinite(P).all():
        raise ValueError(
            f"projections of {owner} must be finite as float32 (no NaN, no inf, |p| < 3.4e38)."
        )
    return P


def check_projections(projections, n_bits: int, owner: str) -> np.ndarray:
    """``projections`` checked as for :func:`asymmetric_scan`, with one column per bit of an
    index of ``n_bits``-bit codes (``ValueError`` naming both widths otherwise)."""
    P = _check_projections(projections, owner)
    if P.shape[1] != n_bits:
        raise ValueError(
            f"projections of {owner} have {P.shape[1]} columns; the index holds {n_bits}-bit "
            "codes (one projection per bit: the hasher's project(X))."
        )
    return P


def check_ranking(ranking, hasher, index, owner: str) -> str:
    """``ranking`` of a searcher over ``hasher`` and ``index``: ``"hamming"``, or
    ``"asymmetric"`` for a hashlearn hasher (its ``project``) with a local index that ranks
    codes (``search_asymmetric``; not a candidate-list index such as ``PermutationIndex`` or
    ``TableIndex``, not a sharded index); ``"asymmetric"`` only for an index without a
    Hamming search (``hamming_search = False``: ``ResidualIVFIndex``); anything else a
    one-line ``ValueError``."""
    if ranking not in ("hamming", "asymmetric"):
        raise ValueError(
            f"The 'ranking' parameter of {owner} must be 'hamming' or 'asymmetric'. "
            f"Got {ranking!r} instead."
        )
    if ranking == "hamming" and not getattr(index, "hamming_search", True):
        raise ValueError(
            f"{owner}: {type(index).__name__} ranks by its estimator only; pass "
            "ranking='asymmetric'."
        )
    ranks = callable(getattr(index, "search_asymmetric", None)) and not callable(
        getattr(index, "candidates", None)
    )
    if ranking == "asymmetric" and not (isinstance(hasher, BaseHasher) and ranks):
        raise ValueError(
            f"{owner}(ranking='asymmetric') ranks a hasher's projections against the codes of "
            "a local Hamming index (FlatIndex, MultiIndexHashing, HammingBallIndex); got "
            f"{type(hasher).__name__} with {type(index).__name__}."
        )
    return ranking


def _words(codes: np.ndarray) -> np.ndarray:
    """Checked codes as uint64 words ``(n, n_words)`` (FlatIndex's layout)."""
    n = codes.shape[0]
    return as_words(codes).reshape(n, max(1, (codes.shape[1] + 7) // 8))


def _empty_result(m: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full((m, k), -np.inf, np.float32), np.full((m, k), -1, np.int64)


def scan_words(
    P: np.ndarray,
    words: np.ndarray,
    k: int,
    n_bits: int,
    n_threads=None,
    *,
    bounded: bool = True,
    counts: np.ndarray | None = None,
):
    """:func:`asymmetric_scan` over codes given as uint64 words ``(n, n_words)`` (a snapshot's
    rows, not copied when C-ordered), for checked float32 ``P`` and ``k``: ``(S, positions)``.

    ``bounded``: :func:`bounded_scan_kernel` (default); ``False``: :func:`scan_kernel`, which
    scores every code (same results; the baseline of ``bench/asymmetric.py``)."""
    m, n = P.shape[0], words.shape[0]
    out_s, out_i = _empty_result(m, k)
    if m == 0 or n == 0:
        return out_s, out_i
    n_words, flat = words.shape[1], frozen(words.reshape(-1), np.uint64)
    k_eff = min(k, n)
    if counts is None:
        counts = np.empty(m, np.int64)

    def run(start: int, stop: int) -> None:
        if not bounded:
            scan_kernel(P, flat, n, n_words, n_bits, k_eff, out_s, out_i, start, stop)
            counts[start:stop] = n
        elif n_words in _WIDTH_TAGS:
            args = (P, flat, n, _WIDTH_TAGS[n_words], n_bits, k_eff, out_s, out_i, counts)
            bounded_scan_fixed_width(*args, start, stop)
        else:
            args = (P, flat, n, n_words, n_bits, k_eff, out_s, out_i, counts)
            bounded_scan_kernel(*args, start, stop)

    parallel_chunks(run, m, n_threads)
    return out_s, out_i


def rerank_words(
    P: np.ndarray, words: np.ndarray, cand: np.ndarray, k: int, n_bits: int, n_threads=None
):
    """:func:`asymmetric_rerank` over codes given as uint64 words ``(n, n_words)``, for checked
    float32 ``P``, ``k`` and candidate rows ``cand`` (int64 ``(m, c)`` in ``[-1, n)``)."""
    m = P.shape[0]
    out_s, out_i = _empty_result(m, k)
    if m == 0 or words.shape[0] == 0 or cand.shape[1] == 0:
        return out_s, out_i
    n_words, flat = words.shape[1], frozen(words.reshape(-1), np.uint64)
    cand, k_eff = frozen(cand, np.int64), min(k, cand.shape[1])

    def run(start: int, stop: int) -> None:
        rerank_kernel(P, flat, n_words, cand, n_bits, k_eff, out_s, out_i, start, stop)

    parallel_chunks(run, m, n_threads)
    return out_s, out_i


def asymmetric_scan(projections, codes, k: int, *, n_threads: int | None = None):
    """The ``k`` codes of highest asymmetric score ``s(q, x) = sum_j p_j (2 x_j - 1)``.

    Parameters
    ----------
    projections : float array (m, b)
        Each query's real-valued projections: a linear hasher's ``project(X)`` (whose codes
        are ``project(X) >= 0``). Used as float32; must be finite.
    codes : uint8 array (n, ceil(b / 8))
        The database codes, LSB first (:mod:`hashlearn.codes`), padding bits zero.
    k : int
        Results per query; rows pad with score ``-inf`` and position ``-1`` past ``n``.
    n_threads : int or None
        Threads for chunks of queries (None: :func:`hashlearn.get_num_threads`).

    Returns
    -------
    S : float32 (m, k), I : int64 (m, k)
        Scores, descending, and row positions in ``codes``; ties go to the smaller position.
    """
    owner = "asymmetric_scan"
    P = _check_projections(projections, owner)
    m, n_bits = P.shape
    codes = frozen(check_codes(codes, n_bits, "codes"), np.uint8)
    k = check_k(k, m, owner, bytes_per_result=12)
    return scan_words(P, _words(codes), k, n_bits, n_threads)


def asymmetric_rerank(projections, codes, candidates, k: int, *, n_threads: int | None = None):
    """Re-rank each query's candidate positions by the asymmetric score (see
    :func:`asymmetric_scan`): the Hamming shortlist ranked by the query's projections.

    ``candidates`` is an integer array ``(m, c)`` of row positions in ``codes``, ``-1``
    marking empty slots (anywhere); a position should appear once per row (a repeated one
    is scored, and returned, once per occurrence). Returns ``(S float32 (m, k), I int64
    (m, k))`` as :func:`asymmetric_scan`, over the candidates only.
    """
    owner = "asymmetric_rerank"
    P = _check_projections(projections, owner)
    m, n_bits = P.shape
    codes = frozen(check_codes(codes, n_bits, "codes"), np.uint8)
    n = codes.shape[0]
    cand = as_plain_array(candidates, "candidates")
    if not isinstance(cand, np.ndarray) or not np.issubdtype(cand.dtype, np.integer):
        kind = getattr(cand, "dtype", type(cand).__name__)
        raise TypeError(f"candidates of {owner} must be an integer numpy.ndarray. Got {kind}.")
    if cand.ndim != 2 or cand.shape[0] != m:
        raise ValueError(
            f"candidates of {owner} must have shape ({m}, n_candidates), one row per query. "
            f"Got shape {cand.shape}."
        )
    if cand.size and (cand.min() < -1 or cand.max() >= n):
        raise ValueError(
            f"candidates of {owner} must be positions in [0, {n}) or -1 (empty). "
            f"Got values in [{cand.min()}, {cand.max()}]."
        )
    k = check_k(k, m, owner, bytes_per_result=12)
    return rerank_words(P, _words(codes), cand, k, n_bits, n_threads)

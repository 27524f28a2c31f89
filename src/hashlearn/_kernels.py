"""Numba hot loops, and nothing else.

Every function here works on plain arrays: packed codes as C-contiguous ``uint64`` words
(code ``i`` occupies ``words[i * W:(i + 1) * W]``, bit ``j`` in word ``j // 64`` at bit
``j % 64``, which is exactly the LSB-first byte layout read as little-endian words), ids as
``int64``. Callers in the public API validate inputs first; kernels trust them.

Exhaustive k-NN (:func:`knn_scan`) is the core of :class:`hashlearn.index.FlatIndex`:

* XOR + popcount over 64-bit words, with the word count ``W`` a compile-time constant for
  codes up to 256 bits so the query words stay in registers;
* database blocks of ~16 KiB reused by a chunk of queries while they are in L1 cache, two
  queries per pass over a block (each loaded word serves both);
* top-k by counting, not sorting: a per-query candidate buffer accepts an item only when its
  distance is below the current k-th distance ``tau``; when the buffer fills, a histogram over
  the ``b + 1`` possible distances finds the new ``tau`` and a stable filter keeps exactly k;
* ties broken by smaller position (= smaller id, since indexes store codes sorted by id),
  which the stable filters preserve, so results are deterministic;
* serial and GIL-free over a range of queries ``q_start:q_end``: callers run chunks of
  queries on several threads (:func:`hashlearn.index.base.parallel_chunks`).
"""

from __future__ import annotations

import threading

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import types
from numba.extending import intrinsic

from hashlearn._postings import find_in

_U1 = np.uint64(1)
_U2 = np.uint64(2)
_U3 = np.uint64(3)


@intrinsic
def popcount64(typingctx, x):
    """Population count of a uint64 through LLVM's ``ctpop`` (one POPCNT instruction)."""
    sig = types.int64(types.uint64)

    def codegen(context, builder, signature, args):
        fn = builder.module.declare_intrinsic("llvm.ctpop", [ir.IntType(64)])
        return builder.call(fn, args)

    return sig, codegen


#: splitmix64's increment, the golden ratio as a 64-bit fraction
GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)


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
    """Hamming distance between ``a[ao:ao+W]`` and ``b[bo:bo+W]`` (word arrays)."""
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
# exhaustive k-NN with counting top-k
# ---------------------------------------------------------------------------------------


@njit(nogil=True, inline="always")
def _shrink(buf_d, buf_p, base, count, k, hist):
    """Keep the first k of ``count`` buffered candidates by (distance, position).

    The buffer is in scan (= position) order and the filter is stable, so among equal
    distances the smallest positions survive. Returns the new acceptance bound ``tau``:
    a later item (larger position) enters the top k only if its distance is ``< tau``.
    """
    hist[:] = 0
    for j in range(count):
        hist[buf_d[base + j]] += 1
    total = 0
    kth = 0
    for d in range(hist.shape[0]):
        if total + hist[d] >= k:
            kth = d
            break
        total += hist[d]
    ties_left = k - total
    kept = 0
    for j in range(count):
        d = buf_d[base + j]
        if d < kth or (d == kth and ties_left > 0):
            if d == kth:
                ties_left -= 1
            buf_d[base + kept] = d
            buf_p[base + kept] = buf_p[base + j]
            kept += 1
    return kth


@njit(nogil=True, inline="always")
def _emit_sorted(buf_d, buf_p, base, count, hist, out_d, out_p, row):
    """Write ``count`` buffered candidates to ``out[row]`` sorted by distance (stable)."""
    hist[:] = 0
    for j in range(count):
        hist[buf_d[base + j]] += 1
    start = 0
    for d in range(hist.shape[0]):
        c = hist[d]
        hist[d] = start
        start += c
    for j in range(count):
        d = buf_d[base + j]
        slot = hist[d]
        hist[d] = slot + 1
        out_d[row, slot] = d
        out_p[row, slot] = buf_p[base + j]
    for slot in range(count, out_d.shape[1]):
        out_d[row, slot] = -1
        out_p[row, slot] = -1


@njit(nogil=True, inline="always")
def _push(buf_d, buf_p, base, count, d, pos, cap, k, hist, tau):
    """Append a candidate; when the buffer is full, shrink it to k and lower ``tau``."""
    buf_d[base + count] = d
    buf_p[base + count] = pos
    count += 1
    if count == cap:
        tau = _shrink(buf_d, buf_p, base, count, k, hist)
        count = k
    return count, tau


@njit(nogil=True, inline="always")
def _scan_pair_one_word(
    db,
    b0,
    b1,
    qa,
    qb,
    ta,
    tb,
    ca,
    cb,
    base_a,
    base_b,
    buf_d,
    buf_p,
    cap,
    k,
    hist,
    n_bits,
    mini_a,
    mini_b,
):
    """Scan ``db[b0:b1]`` for two queries of one 64-bit word each.

    Distances of a mini-block of 8 codes are computed branch-free (LLVM vectorises this) and
    only a mini-block whose minimum beats ``tau`` is looked at item by item.
    """
    mini = mini_a.shape[0]
    for i0 in range(b0, b1, mini):
        count = min(mini, b1 - i0)
        min_a = n_bits + 1
        min_b = n_bits + 1
        u0 = np.uint64(i0)
        for u in range(count):
            x = db[u0 + np.uint64(u)]
            da = popcount64(x ^ qa)
            dbb = popcount64(x ^ qb)
            mini_a[u] = da
            mini_b[u] = dbb
            min_a = min(min_a, da)
            min_b = min(min_b, dbb)
        if min_a < ta:
            for u in range(count):
                if mini_a[u] < ta:
                    ca, ta = _push(buf_d, buf_p, base_a, ca, mini_a[u], i0 + u, cap, k, hist, ta)
        if min_b < tb:
            for u in range(count):
                if mini_b[u] < tb:
                    cb, tb = _push(buf_d, buf_p, base_b, cb, mini_b[u], i0 + u, cap, k, hist, tb)
    return ta, tb, ca, cb


@njit(nogil=True, inline="always")
def _scan_pair_words(
    db, b0, b1, queries, oa, ob, n_words, ta, tb, ca, cb, base_a, base_b, buf_d, buf_p, cap, k, hist
):
    """Scan ``db[b0:b1]`` for two queries of ``n_words`` words each, item by item.

    Up to 4 words, the query words are held in registers and each loaded database word
    serves both queries.
    """
    wu = np.uint64(n_words)
    if n_words <= 4:
        a0 = queries[oa]
        b0w = queries[ob]
        a1 = queries[oa + 1] if n_words > 1 else np.uint64(0)
        b1w = queries[ob + 1] if n_words > 1 else np.uint64(0)
        a2 = queries[oa + 2] if n_words > 2 else np.uint64(0)
        b2w = queries[ob + 2] if n_words > 2 else np.uint64(0)
        a3 = queries[oa + 3] if n_words > 3 else np.uint64(0)
        b3w = queries[ob + 3] if n_words > 3 else np.uint64(0)
    for i in range(np.uint64(b0), np.uint64(b1)):
        o = i * wu
        if n_words <= 4:
            x = db[o]
            da = popcount64(x ^ a0)
            dbb = popcount64(x ^ b0w)
            if n_words > 1:
                x = db[o + _U1]
                da += popcount64(x ^ a1)
                dbb += popcount64(x ^ b1w)
            if n_words > 2:
                x = db[o + _U2]
                da += popcount64(x ^ a2)
                dbb += popcount64(x ^ b2w)
            if n_words > 3:
                x = db[o + _U3]
                da += popcount64(x ^ a3)
                dbb += popcount64(x ^ b3w)
        else:
            da = 0
            dbb = 0
            for w in range(n_words):
                x = db[o + np.uint64(w)]
                da += popcount64(x ^ queries[oa + w])
                dbb += popcount64(x ^ queries[ob + w])
        if da < ta:
            ca, ta = _push(buf_d, buf_p, base_a, ca, da, i, cap, k, hist, ta)
        if dbb < tb:
            cb, tb = _push(buf_d, buf_p, base_b, cb, dbb, i, cap, k, hist, tb)
    return ta, tb, ca, cb


@njit(nogil=True, inline="always")
def _knn_core(db, n, queries, q_start, q_end, k, n_bits, out_d, out_p, n_words, block):
    """Shared body of the ``knn_scan_w*`` kernels; ``n_words`` is a constant in each."""
    cap = 4 * k + 64
    n_q = q_end - q_start
    # slot n_q is a scratch partner for an odd query out
    buf_d = np.empty((n_q + 1) * cap, np.int32)
    buf_p = np.empty((n_q + 1) * cap, np.int64)
    count = np.zeros(n_q + 1, np.int64)
    tau = np.full(n_q + 1, n_bits + 1, np.int64)
    hist = np.zeros(n_bits + 1, np.int64)
    mini_a = np.empty(8, np.int64)
    mini_b = np.empty(8, np.int64)
    for b0 in range(0, n, block):
        b1 = min(n, b0 + block)
        for qa in range(0, n_q, 2):
            qb = qa + 1 if qa + 1 < n_q else n_q
            oa = (q_start + qa) * n_words
            ob = (q_start + min(qa + 1, n_q - 1)) * n_words
            if n_words == 1:
                ta, tb, ca, cb = _scan_pair_one_word(
                    db,
                    b0,
                    b1,
                    queries[oa],
                    queries[ob],
                    tau[qa],
                    tau[qb],
                    count[qa],
                    count[qb],
                    qa * cap,
                    qb * cap,
                    buf_d,
                    buf_p,
                    cap,
                    k,
                    hist,
                    n_bits,
                    mini_a,
                    mini_b,
                )
            else:
                ta, tb, ca, cb = _scan_pair_words(
                    db,
                    b0,
                    b1,
                    queries,
                    oa,
                    ob,
                    n_words,
                    tau[qa],
                    tau[qb],
                    count[qa],
                    count[qb],
                    qa * cap,
                    qb * cap,
                    buf_d,
                    buf_p,
                    cap,
                    k,
                    hist,
                )
            tau[qa] = ta
            tau[qb] = tb
            count[qa] = ca
            count[qb] = cb
    for qi in range(n_q):
        c = count[qi]
        if c > k:
            _shrink(buf_d, buf_p, qi * cap, c, k, hist)
            c = k
        _emit_sorted(buf_d, buf_p, qi * cap, c, hist, out_d, out_p, q_start + qi)


@njit(nogil=True, cache=True)
def knn_scan_w1(db, n, queries, q_start, q_end, k, n_bits, out_d, out_p, block):
    _knn_core(db, n, queries, q_start, q_end, k, n_bits, out_d, out_p, 1, block)


@njit(nogil=True, cache=True)
def knn_scan_w2(db, n, queries, q_start, q_end, k, n_bits, out_d, out_p, block):
    _knn_core(db, n, queries, q_start, q_end, k, n_bits, out_d, out_p, 2, block)


@njit(nogil=True, cache=True)
def knn_scan_w3(db, n, queries, q_start, q_end, k, n_bits, out_d, out_p, block):
    _knn_core(db, n, queries, q_start, q_end, k, n_bits, out_d, out_p, 3, block)


@njit(nogil=True, cache=True)
def knn_scan_w4(db, n, queries, q_start, q_end, k, n_bits, out_d, out_p, block):
    _knn_core(db, n, queries, q_start, q_end, k, n_bits, out_d, out_p, 4, block)


@njit(nogil=True, cache=True)
def knn_scan_wide(db, n, queries, q_start, q_end, k, n_bits, out_d, out_p, block, n_words):
    _knn_core(db, n, queries, q_start, q_end, k, n_bits, out_d, out_p, n_words, block)


_KNN_BY_WORDS = {1: knn_scan_w1, 2: knn_scan_w2, 3: knn_scan_w3, 4: knn_scan_w4}


def knn_scan(db, n, queries, q_start, q_end, k, n_bits, n_words, out_d, out_p):
    """Exact k-NN by Hamming distance of queries ``q_start:q_end`` against ``n`` codes.

    ``db`` and ``queries`` are flat ``uint64`` word arrays; writes distances (int32) and
    database *positions* (int64) sorted by (distance, position) into rows
    ``q_start:q_end`` of ``out_d`` / ``out_p``, padding with -1 when ``n < k``. Serial and
    GIL-free: callers run chunks of queries on several threads.
    """
    block = max(64, 2048 // n_words)
    fn = _KNN_BY_WORDS.get(n_words)
    if fn is None:
        knn_scan_wide(db, n, queries, q_start, q_end, k, n_bits, out_d, out_p, block, n_words)
    else:
        fn(db, n, queries, q_start, q_end, k, n_bits, out_d, out_p, block)


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
# multi-index hashing (Norouzi, Punjani & Fleet, CVPR 2012)
# ---------------------------------------------------------------------------------------
#
# The m substring tables are concatenated into flat arrays, table ``s`` occupying
# ``keys[key_lo[s]:key_hi[s]]``, ``offsets[off_lo[s]:...]`` and postings indexed by those
# offsets (postings are database *positions*). A dense table (``dense[s]``) has no keys:
# its offsets are direct-addressed by the substring value (2**len + 1 entries).


@njit(nogil=True, cache=True)
def substring_keys(words, n, n_words, start, length, out):
    """``out[i]`` = bits ``start:start+length`` (``length <= 63``) of code ``i`` as int64."""
    w = start // 64
    o = np.uint64(start % 64)
    mask = (np.uint64(1) << np.uint64(length)) - np.uint64(1)
    spill = start % 64 + length > 64
    for i in range(n):
        x = words[i * n_words + w] >> o
        if spill:
            x |= words[i * n_words + w + 1] << (np.uint64(64) - o)
        out[i] = np.int64(x & mask)


@njit(nogil=True, inline="always")
def _query_substrings(queries, qo, sub_start, sub_len, out):
    for s in range(sub_start.shape[0]):
        start = sub_start[s]
        length = sub_len[s]
        w = start // 64
        o = np.uint64(start % 64)
        x = queries[qo + w] >> o
        if start % 64 + length > 64:
            x |= queries[qo + w + 1] << (np.uint64(64) - o)
        out[s] = np.int64(x & ((np.uint64(1) << np.uint64(length)) - np.uint64(1)))


@njit(nogil=True, inline="always")
def _bucket(s, key, dense, key_lo, key_hi, keys, off_lo, offsets):
    """Posting range ``(start, stop)`` of ``key`` in table ``s`` (empty if absent)."""
    if dense[s]:
        base = off_lo[s] + key
        return offsets[base], offsets[base + 1]
    j = find_in(keys, key_lo[s], key_hi[s], key)
    if j >= 0:
        base = off_lo[s] + (j - key_lo[s])
        return offsets[base], offsets[base + 1]
    return 0, 0


@njit(nogil=True, inline="always")
def _insert_best(best_d, best_p, cnt, k, d, p):
    """Insert ``(d, p)`` into the sorted top-k lists (by distance, then position)."""
    if cnt == k:
        if d > best_d[k - 1] or (d == best_d[k - 1] and p > best_p[k - 1]):
            return cnt
        j = k - 1
    else:
        j = cnt
        cnt += 1
    while j > 0 and (best_d[j - 1] > d or (best_d[j - 1] == d and best_p[j - 1] > p)):
        best_d[j] = best_d[j - 1]
        best_p[j] = best_p[j - 1]
        j -= 1
    best_d[j] = d
    best_p[j] = p
    return cnt


@njit(nogil=True, inline="always")
def _next_mask(mask):
    """Next larger integer with the same popcount (Gosper's hack, uint64)."""
    c = mask & (~mask + np.uint64(1))
    r = mask + c
    return (((r ^ mask) >> np.uint64(2)) // c) | r


@njit(nogil=True, inline="always")
def _is_set(bitmap, p):
    return (bitmap[p >> 6] >> np.uint64(p & 63)) & _U1 != np.uint64(0)


@njit(nogil=True, inline="always")
def _test_and_set(bitmap, p):
    """Whether bit ``p`` was set; sets it."""
    word = bitmap[p >> 6]
    bit = _U1 << np.uint64(p & 63)
    if word & bit:
        return True
    bitmap[p >> 6] = word | bit
    return False


@njit(nogil=True, inline="always")
def _clear_touched(bitmap, touched, count, n):
    """Zero the bitmap after a query that set ``count`` bits: the words of the recorded
    positions, or, when more were set than ``touched`` holds (``n / 64 + 1``), all
    ``ceil(n / 64)`` words -- never more than O(min(candidates, n / 64)) stores."""
    if count > touched.shape[0]:
        bitmap[: (n + 63) >> 6] = np.uint64(0)
    else:
        for t in range(count):
            bitmap[touched[t] >> 6] = np.uint64(0)


_SCRATCH = threading.local()


def visited_bitmap(n: int) -> np.ndarray:
    """This thread's all-zero visited bitmap of at least ``n`` bits, reused across calls.

    Kernels taking it set the bits of the candidates they visit and clear exactly those
    words before returning, so it is zero-filled only when it is made (or grown), never per
    query chunk. One per thread, so concurrent searches never share one.
    """
    words = max(1, -(-n // 64))
    bitmap = getattr(_SCRATCH, "bitmap", None)
    if bitmap is None or len(bitmap) < words:
        old = 0 if bitmap is None else len(bitmap)
        bitmap = np.zeros(max(words, 2 * old), np.uint64)
        _SCRATCH.bitmap = bitmap
    return bitmap


@njit(nogil=True, cache=True)
def mih_knn(
    db,
    n,
    n_words,
    queries,
    q_start,
    q_end,
    k,
    sub_start,
    sub_len,
    dense,
    key_lo,
    key_hi,
    keys,
    off_lo,
    offsets,
    postings,
    out_d,
    out_p,
    seen,
):
    """Exact k-NN of queries ``q_start:q_end`` by multi-index hashing.

    Substring radii grow 0, 1, 2, ...; after table ``s`` has been probed at radius ``r``
    (and tables ``> s`` at ``r - 1``) every code not yet seen has, by the pigeonhole
    principle, full distance ``>= r * m + s + 1`` (Norouzi et al. 2012, Prop. 1 and its
    refinement in §4). Search stops once the k-th best distance is below that bound, so the
    result (ties by smaller position) equals the linear scan's. A query whose probes exceed
    ``n`` falls back to scanning the codes not yet seen, bounding its cost by a linear scan.

    ``seen`` is an all-zero visited bitmap of at least ``ceil(n / 64)`` words (see
    :func:`visited_bitmap`); only the words of the candidates a query touched are written,
    and they are cleared again after the query (:func:`_clear_touched`), so a query costs
    O(candidates), not O(n).
    """
    m = sub_start.shape[0]
    touched = np.empty((n >> 6) + 1, np.int64)  # uninitialised: O(1) time
    qkeys = np.empty(m, np.int64)
    best_d = np.empty(k, np.int64)
    best_p = np.empty(k, np.int64)
    max_len = 0
    for s in range(m):
        max_len = max(max_len, sub_len[s])
    for qi in range(q_start, q_end):
        qo = qi * n_words
        _query_substrings(queries, qo, sub_start, sub_len, qkeys)
        cnt = 0
        n_seen = 0
        work = 0
        done = False
        r = 0
        while not done and r <= max_len:
            for s in range(m):
                length = sub_len[s]
                if r <= length:
                    limit = np.uint64(1) << np.uint64(length)
                    mask = (np.uint64(1) << np.uint64(r)) - np.uint64(1)
                    qk = np.uint64(qkeys[s])
                    while mask < limit:
                        key = np.int64(qk ^ mask)
                        b0, b1 = _bucket(s, key, dense, key_lo, key_hi, keys, off_lo, offsets)
                        work += 1 + (b1 - b0)
                        for j in range(b0, b1):
                            p = postings[j]
                            if not _test_and_set(seen, p):
                                if n_seen < touched.shape[0]:
                                    touched[n_seen] = p
                                n_seen += 1
                                d = _hamming(db, p * n_words, queries, qo, n_words)
                                cnt = _insert_best(best_d, best_p, cnt, k, d, p)
                        if r == 0:
                            break
                        mask = _next_mask(mask)
                if n_seen == n or (cnt == k and best_d[k - 1] < r * m + s + 1):
                    done = True
                    break
                if work > n:  # cheaper to finish by a linear scan
                    for p in range(n):
                        if not _is_set(seen, p):
                            d = _hamming(db, p * n_words, queries, qo, n_words)
                            cnt = _insert_best(best_d, best_p, cnt, k, d, p)
                    done = True
                    break
            r += 1
        _clear_touched(seen, touched, n_seen, n)
        for j in range(k):
            if j < cnt:
                out_d[qi, j] = best_d[j]
                out_p[qi, j] = best_p[j]
            else:
                out_d[qi, j] = -1
                out_p[qi, j] = -1


@njit(nogil=True, cache=True)
def mih_range(
    db,
    n,
    n_words,
    queries,
    q_start,
    q_end,
    radius,
    sub_start,
    sub_len,
    dense,
    key_lo,
    key_hi,
    keys,
    off_lo,
    offsets,
    postings,
    lims,
    out_d,
    out_p,
    counts,
    seen,
):
    """Range search (distance ``<= radius``) by multi-index hashing.

    A code within ``radius`` has some substring within ``radius // m`` of the query's
    (pigeonhole), so probing every table to that radius finds all of them. With
    ``counts`` given (``lims`` empty) it counts; otherwise it fills the CSR rows sorted by
    (distance, position). Falls back to a linear scan when probing would cost more.
    ``seen`` is a visited bitmap as in :func:`mih_knn`.
    """
    m = sub_start.shape[0]
    counting = lims.shape[0] == 0
    touched = np.empty((n >> 6) + 1, np.int64)  # uninitialised: O(1) time
    qkeys = np.empty(m, np.int64)
    r_max = radius // m
    probes = 0
    for s in range(m):
        length = sub_len[s]
        c = 1
        for t in range(1, min(r_max, length) + 1):
            c = c * (length - t + 1) // t
            probes += c
    buf_d = np.empty(64, np.int64)
    buf_p = np.empty(64, np.int64)
    for qi in range(q_start, q_end):
        qo = qi * n_words
        found = 0
        n_touched = 0
        if probes + m > n:
            for p in range(n):
                d = _hamming(db, p * n_words, queries, qo, n_words)
                if d <= radius:
                    if found == buf_d.shape[0]:
                        buf_d = np.concatenate((buf_d, np.empty(found, np.int64)))
                        buf_p = np.concatenate((buf_p, np.empty(found, np.int64)))
                    buf_d[found] = d
                    buf_p[found] = p
                    found += 1
        else:
            _query_substrings(queries, qo, sub_start, sub_len, qkeys)
            for s in range(m):
                length = sub_len[s]
                limit = np.uint64(1) << np.uint64(length)
                qk = np.uint64(qkeys[s])
                for r in range(min(r_max, length) + 1):
                    mask = (np.uint64(1) << np.uint64(r)) - np.uint64(1)
                    while mask < limit:
                        key = np.int64(qk ^ mask)
                        b0, b1 = _bucket(s, key, dense, key_lo, key_hi, keys, off_lo, offsets)
                        for j in range(b0, b1):
                            p = postings[j]
                            if not _test_and_set(seen, p):
                                if n_touched < touched.shape[0]:
                                    touched[n_touched] = p
                                n_touched += 1
                                d = _hamming(db, p * n_words, queries, qo, n_words)
                                if d <= radius:
                                    if found == buf_d.shape[0]:
                                        buf_d = np.concatenate((buf_d, np.empty(found, np.int64)))
                                        buf_p = np.concatenate((buf_p, np.empty(found, np.int64)))
                                    buf_d[found] = d
                                    buf_p[found] = p
                                    found += 1
                        if r == 0:
                            break
                        mask = _next_mask(mask)
            _clear_touched(seen, touched, n_touched, n)
        if counting:
            counts[qi] = found
        else:
            order = np.argsort(buf_d[:found] * (n + 1) + buf_p[:found])
            start = lims[qi]
            for j in range(found):
                out_d[start + j] = buf_d[order[j]]
                out_p[start + j] = buf_p[order[j]]


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


@njit(nogil=True, cache=True)
def mih_check_tables(
    words, n, n_words, sub_start, sub_len, dense, key_lo, key_hi, keys, off_lo, offsets, postings
):
    """0 if the substring tables of :func:`mih_knn` are exactly those of ``words``, else an
    error code: 1 postings count, 2 key ranges, 3 offset ranges, 4 offsets not monotone or
    not spanning the table, 5 a posting out of range, 6 a position twice in one table, 7 a
    posting filed under another key than its code's substring, 8 trailing entries.

    ``sub_start``, ``sub_len``, ``dense``, ``key_lo``, ``key_hi`` and ``off_lo`` hold one
    entry per table, ``sub_len`` in ``[1, 63]`` (``<= 24`` for dense tables) and the
    substrings tile the code (checked by the caller); every other index is checked here
    before it is used.
    """
    m = sub_start.shape[0]
    n_keys = keys.shape[0]
    n_off = offsets.shape[0]
    if postings.shape[0] != m * n:
        return 1
    mark = np.zeros(n, np.int64)
    sub = np.empty(1, np.int64)
    expected_key = 0
    expected_off = 0
    for s in range(m):
        length = sub_len[s]
        if key_lo[s] != expected_key or key_hi[s] < key_lo[s] or key_hi[s] > n_keys:
            return 2
        if dense[s]:
            if key_hi[s] != key_lo[s]:
                return 2
            n_buckets = 1 << length
        else:
            n_buckets = key_hi[s] - key_lo[s]
            for j in range(key_lo[s], key_hi[s]):
                if keys[j] < 0 or (keys[j] >> length) != 0:
                    return 2
                if j > key_lo[s] and keys[j] <= keys[j - 1]:
                    return 2
        expected_key = key_hi[s]
        base = off_lo[s]
        if base != expected_off or base + n_buckets + 1 > n_off:
            return 3
        if offsets[base] != s * n or offsets[base + n_buckets] != (s + 1) * n:
            return 4
        for b in range(n_buckets):
            if offsets[base + b + 1] < offsets[base + b]:
                return 4
            if not dense[s] and offsets[base + b + 1] == offsets[base + b]:
                return 4
        expected_off = base + n_buckets + 1
        for b in range(n_buckets):
            key = b if dense[s] else keys[key_lo[s] + b]
            for j in range(offsets[base + b], offsets[base + b + 1]):
                p = postings[j]
                if p < 0 or p >= n:
                    return 5
                if mark[p] == s + 1:
                    return 6
                mark[p] = s + 1
                substring_keys(words[p * n_words :], 1, n_words, sub_start[s], length, sub)
                if sub[0] != key:
                    return 7
    if expected_key != n_keys or expected_off != n_off:
        return 8
    return 0

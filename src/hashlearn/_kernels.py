"""Numba hot loops, and nothing else.

Every function here works on plain arrays: packed codes as C-contiguous ``uint64`` words
(code ``i`` occupies ``words[i * W:(i + 1) * W]``, bit ``j`` in word ``j // 64`` at bit
``j % 64``, which is exactly the LSB-first byte layout read as little-endian words), ids as
``int64``. Callers in the public API validate inputs first; kernels trust them.

Here: pairwise distances, range search, multi-index hashing and the shared bit and hash
helpers. The exhaustive k-NN scan of :class:`hashlearn.index.FlatIndex` lives in
:mod:`hashlearn._knn_scan`; the popcount primitives in :mod:`hashlearn._popcount`.
"""

from __future__ import annotations

import threading

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from hashlearn._popcount import popcount64
from hashlearn._postings import find_in

_U1 = np.uint64(1)

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

"""Numba kernels of multi-index hashing (Norouzi, Punjani & Fleet, *Fast search in Hamming
space with multi-index hashing*, CVPR 2012).

Codes are flat ``uint64`` word arrays as everywhere (see :mod:`hashlearn._kernels`). The
``m`` substring tables are concatenated into flat arrays, table ``s`` occupying
``keys[key_lo[s]:key_hi[s]]``, ``offsets[off_lo[s]:...]`` and the postings indexed by those
offsets (postings are database *positions*, table ``s`` holding ``postings[s*n:(s+1)*n]``).
A dense table (``dense[s]``) has no keys: its offsets are direct-addressed by the substring
value (``2**len + 1`` entries). ``bucket_codes`` holds, for every posting ``j``, the full
code of ``postings[j]`` (words ``j*W:(j+1)*W``): a bucket's codes lie next to each other, so
verifying a bucket is a sequential read instead of a random read per candidate.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from hashlearn._utils.popcount import popcount64, trailing_zeros64
from hashlearn._utils.postings import find_in
from hashlearn._utils.primitives import prefetch

__all__ = ["substring_keys", "mih_knn", "mih_range", "mih_check_tables"]

_U1 = np.uint64(1)
_BATCH = 16  # probes whose bucket offsets (then first codes) are prefetched together
_PREFETCH_LINES = 8  # cache lines of a bucket's codes prefetched before it is verified
_BLOCK = 64  # codes of a bucket whose distances are computed before any is looked at


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
def _substring(words, wo, start, length):
    """Bits ``start:start+length`` of the code at word offset ``wo``, as uint64."""
    w = wo + start // 64
    o = np.uint64(start % 64)
    x = words[w] >> o
    if start % 64 + length > 64:
        x |= words[w + 1] << (np.uint64(64) - o)
    return x & ((_U1 << np.uint64(length)) - _U1)


@njit(nogil=True, inline="always")
def _substring_distance(codes, co, queries, qo, start, length):
    """Hamming distance of bits ``start:start+length`` of two codes (word offsets)."""
    return popcount64(_substring(codes, co, start, length) ^ _substring(queries, qo, start, length))


@njit(nogil=True, inline="always")
def _distance(codes, co, queries, qo, n_words):
    d = 0
    for w in range(n_words):
        d += popcount64(codes[co + w] ^ queries[qo + w])
    return d


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
def _next_mask(mask):
    """Next larger integer with the same (non-zero) popcount (Gosper's hack, uint64)."""
    c = mask & (~mask + _U1)
    r = mask + c
    return (((r ^ mask) >> np.uint64(2)) // c) | r


@njit(nogil=True, inline="always")
def _insert_new(best_d, best_p, cnt, k, d, p):
    """Insert ``(d, p)`` into the top-k lists sorted by (distance, position), unless it is
    there already (a code found again in another table) or does not beat the k-th."""
    if cnt == k and (d > best_d[k - 1] or (d == best_d[k - 1] and p >= best_p[k - 1])):
        return cnt
    i = cnt
    while i > 0 and (best_d[i - 1] > d or (best_d[i - 1] == d and best_p[i - 1] > p)):
        i -= 1
    if i > 0 and best_d[i - 1] == d and best_p[i - 1] == p:
        return cnt
    last = cnt if cnt < k else k - 1
    for t in range(last, i, -1):
        best_d[t] = best_d[t - 1]
        best_p[t] = best_p[t - 1]
    best_d[i] = d
    best_p[i] = p
    return min(cnt + 1, k)


@njit(nogil=True, inline="always")
def _verify(codes, postings, b0, b1, queries, qo, n_words, n_bits, k, best_d, best_p, cnt, dist):
    """Verify the bucket ``b0:b1`` of the bucket-ordered codes; returns the new count.

    Distances of a block of codes are computed first (LLVM vectorises the loop), then only
    the codes within the current k-th distance are looked at; everything else is rejected by
    its distance alone, so no visited set is needed (:func:`_insert_new` drops repeats).
    """
    wu = np.uint64(n_words)
    qu = np.uint64(qo)
    j = b0
    while j < b1:
        c = min(_BLOCK, b1 - j)
        # unsigned offsets: no wrap-around check per load, so LLVM vectorises over codes
        first = np.uint64(j) * wu
        for u in range(np.uint64(c)):
            d = 0
            for w in range(wu):
                d += popcount64(codes[first + u * wu + w] ^ queries[qu + w])
            dist[u] = d
        for u in range(c, _BLOCK):  # a bucket's last block: the padding never passes
            dist[u] = n_bits + 1
        bound = best_d[k - 1] if cnt == k else n_bits
        passing = np.uint64(0)  # bit u: code j + u within the bound (branch-free)
        for u in range(_BLOCK):
            passing |= np.uint64(dist[u] <= bound) << np.uint64(u)
        while passing:
            u = trailing_zeros64(passing)
            cnt = _insert_new(best_d, best_p, cnt, k, dist[u], postings[j + u])
            passing &= passing - _U1
        j += c
    return cnt


@njit(nogil=True, inline="always")
def _knn_core(codes, n_words, queries, q_start, q_end, k, n_bits, tables, costs, out):
    sub_start, sub_len, dense, key_lo, key_hi, keys, off_lo, offsets, postings = tables
    probe_cost, code_cost, budget = costs
    out_d, out_p, work_out = out
    m = sub_start.shape[0]
    qkeys = np.empty(m, np.uint64)
    best_d = np.empty(k, np.int64)
    best_p = np.empty(k, np.int64)
    dist = np.empty(_BLOCK, np.int64)
    probe_keys = np.empty(_BATCH, np.int64)
    probe_lo = np.empty(_BATCH, np.int64)
    probe_hi = np.empty(_BATCH, np.int64)
    max_len = 0
    for s in range(m):
        max_len = max(max_len, sub_len[s])
    for qi in range(q_start, q_end):
        qo = qi * n_words
        for s in range(m):
            qkeys[s] = _substring(queries, qo, sub_start[s], sub_len[s])
        cnt = 0
        work = 0
        done = False
        r = 0
        while not done and r <= max_len:
            for s in range(m):
                length = sub_len[s]
                complete = True  # table s probed at radius r to the end
                if r <= length:
                    limit = _U1 << np.uint64(length)
                    mask = (_U1 << np.uint64(r)) - _U1
                    while mask < limit:
                        nb = 0
                        while nb < _BATCH and mask < limit:
                            probe_keys[nb] = np.int64(qkeys[s] ^ mask)
                            nb += 1
                            mask = limit if r == 0 else _next_mask(mask)
                        if dense[s]:
                            for t in range(nb):
                                prefetch(offsets, off_lo[s] + probe_keys[t])
                        for t in range(nb):
                            b0, b1 = _bucket(
                                s, probe_keys[t], dense, key_lo, key_hi, keys, off_lo, offsets
                            )
                            probe_lo[t] = b0
                            probe_hi[t] = b1
                            for line in range(min(_PREFETCH_LINES, -(-(b1 - b0) * n_words // 8))):
                                prefetch(codes, b0 * n_words + 8 * line)
                            work += probe_cost + (b1 - b0) * code_cost
                        for t in range(nb):
                            cnt = _verify(
                                codes,
                                postings,
                                probe_lo[t],
                                probe_hi[t],
                                queries,
                                qo,
                                n_words,
                                n_bits,
                                k,
                                best_d,
                                best_p,
                                cnt,
                                dist,
                            )
                        if work > budget:  # checked per batch: a radius can hold 10^3 probes
                            complete = mask >= limit
                            break
                # every code not yet verified is at distance >= r * m + s + 1
                if complete and cnt == k and best_d[k - 1] <= r * m + s:
                    done = True
                    break
                if work > budget:  # abandoned: the caller scans this query
                    cnt = -1
                    done = True
                    break
            r += 1
        work_out[qi] = work if cnt >= 0 else -1
        for j in range(k):
            if j < cnt:
                out_d[qi, j] = best_d[j]
                out_p[qi, j] = best_p[j]
            else:
                out_d[qi, j] = -1
                out_p[qi, j] = -1


# one kernel with the word count compiled in (64-bit codes), one with it at run time
@njit(nogil=True, cache=True)
def _mih_knn_w1(codes, queries, q_start, q_end, k, n_bits, tables, costs, out):
    _knn_core(codes, 1, queries, q_start, q_end, k, n_bits, tables, costs, out)


@njit(nogil=True, cache=True)
def _mih_knn_any(codes, n_words, queries, q_start, q_end, k, n_bits, tables, costs, out):
    _knn_core(codes, n_words, queries, q_start, q_end, k, n_bits, tables, costs, out)


def mih_knn(codes, n_words, queries, q_start, q_end, k, n_bits, tables, costs, out_d, out_p, work):
    """Exact k-NN of queries ``q_start:q_end`` by multi-index hashing, or ``work[q] = -1``.

    ``tables`` are the nine table arrays (``sub_start, sub_len, dense, key_lo, key_hi, keys,
    off_lo, offsets, postings``), ``codes`` the bucket-ordered codes. Substring radii grow
    0, 1, 2, ...; after table ``s`` has been probed at radius ``r`` (tables ``> s`` at
    ``r - 1``) every code not yet verified has, by the pigeonhole principle, full distance
    ``>= r * m + s + 1`` (Norouzi et al. 2012, Prop. 1 and its per-table refinement in §4),
    so the search stops once the k-th best distance is below that bound and the result (ties
    by smaller position) equals the linear scan's.

    ``costs = (probe_cost, code_cost, budget)``: a query adds ``probe_cost`` per probed
    bucket and ``code_cost`` per verified code to its work; once the work passes
    ``budget`` the query is abandoned (``work[q] = -1``, its rows unspecified) for the
    caller to scan. Otherwise ``work[q]`` is the query's work. Serial and GIL-free.
    """
    out = (out_d, out_p, work)
    if n_words == 1:
        _mih_knn_w1(codes, queries, q_start, q_end, k, n_bits, tables, costs, out)
    else:
        _mih_knn_any(codes, n_words, queries, q_start, q_end, k, n_bits, tables, costs, out)


@njit(nogil=True, inline="always")
def _append(buf_d, buf_p, found, d, p):
    """``(buf_d, buf_p)`` with ``(d, p)`` stored at ``found``, doubled when full."""
    if found == buf_d.shape[0]:
        buf_d = np.concatenate((buf_d, np.empty(found, np.int64)))
        buf_p = np.concatenate((buf_p, np.empty(found, np.int64)))
    buf_d[found] = d
    buf_p[found] = p
    return buf_d, buf_p


@njit(nogil=True, inline="always")
def _found_before(codes, co, queries, qo, sub_start, sub_len, s, r_max):
    """Whether a table ``t < s`` holds the code within substring radius ``r_max``."""
    for t in range(s):
        if _substring_distance(codes, co, queries, qo, sub_start[t], sub_len[t]) <= r_max:
            return True
    return False


@njit(nogil=True, cache=True)
def mih_range(
    codes,
    db,
    n,
    n_words,
    queries,
    q_start,
    q_end,
    radius,
    tables,
    lims,
    out_d,
    out_p,
    counts,
):
    """Range search (distance ``<= radius``) by multi-index hashing.

    A code within ``radius`` has some substring within ``r = radius // m`` of the query's
    (pigeonhole), so probing every table to radius ``r`` finds all of them. A code found in
    table ``s`` is reported there only if no earlier table ``t < s`` has it within ``r``
    (else table ``t`` reported it), so no visited set is needed. With ``counts`` given
    (``lims`` empty) it counts; otherwise it fills the CSR rows sorted by (distance,
    position). Scans ``db`` (the codes in position order) instead when the probes alone
    would outnumber the codes.
    """
    sub_start, sub_len, dense, key_lo, key_hi, keys, off_lo, offsets, postings = tables
    m = sub_start.shape[0]
    counting = lims.shape[0] == 0
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
        if probes + m > n:
            for p in range(n):
                d = _distance(db, p * n_words, queries, qo, n_words)
                if d <= radius:
                    buf_d, buf_p = _append(buf_d, buf_p, found, d, p)
                    found += 1
        else:
            for s in range(m):
                length = sub_len[s]
                limit = _U1 << np.uint64(length)
                qk = _substring(queries, qo, sub_start[s], length)
                for r in range(min(r_max, length) + 1):
                    mask = (_U1 << np.uint64(r)) - _U1
                    while mask < limit:
                        key = np.int64(qk ^ mask)
                        b0, b1 = _bucket(s, key, dense, key_lo, key_hi, keys, off_lo, offsets)
                        for j in range(b0, b1):
                            co = j * n_words
                            d = _distance(codes, co, queries, qo, n_words)
                            if d <= radius and not _found_before(
                                codes, co, queries, qo, sub_start, sub_len, s, r_max
                            ):
                                buf_d, buf_p = _append(buf_d, buf_p, found, d, postings[j])
                                found += 1
                        if r == 0:
                            break
                        mask = _next_mask(mask)
        if counting:
            counts[qi] = found
        else:
            order = np.argsort(buf_d[:found] * (n + 1) + buf_p[:found])
            start = lims[qi]
            for j in range(found):
                out_d[start + j] = buf_d[order[j]]
                out_p[start + j] = buf_p[order[j]]


# ---------------------------------------------------------------------------------------
# structural check of loaded tables (no kernel sees an array before it is checked)
# ---------------------------------------------------------------------------------------


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
                if np.int64(_substring(words, p * n_words, sub_start[s], length)) != key:
                    return 7
    if expected_key != n_keys or expected_off != n_off:
        return 8
    return 0

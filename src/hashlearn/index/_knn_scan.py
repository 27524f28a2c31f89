"""Exhaustive Hamming k-NN over packed codes: the numba kernels behind ``FlatIndex``.

Codes are C-contiguous ``uint64`` word arrays (code ``i`` occupies ``words[i*W:(i+1)*W]``,
see :mod:`hashlearn._utils.primitives`). The scan:

* walks the database in blocks of ~16 KiB that a chunk of queries reuses while they sit in
  L1 cache;
* computes the distances of a mini-block of 64 codes branch-free, on one of two paths
  (:func:`hashlearn._utils.popcount.kernel_path` picks one per CPU and width; both give
  identical results):

  - *wide* (:func:`knn_scan_wide`): 8 codes per 512-bit XOR + ``VPOPCNTQ`` step, the
    pass mask from a vector compare, no branch on it in the hot loop: mini-blocks with a
    passing code are noted and their passing codes' distances computed after the block
    (a mispredicted branch per passing mini-block cost about a mini-block's scan); one
    query per pass over a block (as faiss's AVX-512 ``IndexBinaryFlat`` scans);
  - *portable*: up to 4 words per code the codes sit in SIMD lanes (LLVM vectorises the
    loop over codes), wider codes go through the vector XOR + popcount of
    :func:`hashlearn._utils.popcount.code_distance`; two queries per pass, the second
    reusing the codes' words from registers (a lone query passes alone);
* looks item by item only at a mini-block with a code below the current k-th distance
  ``tau``;
* keeps the top k by counting, not sorting: a per-query candidate buffer accepts an item
  only when its distance is below ``tau``; when the buffer fills, a histogram over the
  ``b + 1`` possible distances finds the new ``tau`` and a stable filter keeps exactly k;
* for a large k (a searcher's shortlist) starts ``tau`` from a sample instead of ``b + 1``
  (:func:`sample_plan`): a few per cent of the codes, spread over the database, give a
  bound that the true k-th distance is almost surely below, so the scan buffers a few
  hundred codes instead of the thousands that pass while ``tau`` settles; a query whose
  bound proves too tight (fewer than k codes beneath it) is scanned again from ``b + 1``,
  so results never depend on the sample;
* breaks ties by smaller position (= smaller id, since indexes store codes sorted by id),
  which the stable filters preserve, so results are deterministic.

The word count ``W`` is a compile-time constant in the kernels for 1, 2, 3, 4, 6, 8 and
16 words (64 to 1024 bits; 384 bits are one sign bit per dimension of MiniLM embeddings);
other widths use one portable kernel with ``W`` at run time. Each kernel is serial and
GIL-free over a range of queries ``q_start:q_end``: callers run chunks of queries on
several threads (:func:`hashlearn._utils.parallel.parallel_chunks`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from hashlearn._utils.kernel_args import frozen
from hashlearn._utils.popcount import (
    code_distance,
    kernel_path,
    popcount64,
    trailing_zeros64,
    wide_mini_block,
)

__all__ = ["knn_scan"]

_MINI_BLOCK = 64  # codes whose distances are computed before any is looked at
_SPARSE_MAX = 8  # passing codes of a mini-block whose distances are computed one by one

#: The sampled starting bound (:func:`sample_plan`): the most codes one sampled mini-block
#: adds to the sample (a database stored in clusters can hold a query's near neighbours in
#: one mini-block; counting a subset only loosens the bound), the sampling stride, the
#: least k, the most codes per neighbour kept and the least sampled mini-blocks that use
#: it, and the queries sharing one pass over ~16 KiB of sampled codes.
_SAMPLE_PER_BLOCK = 8
_SAMPLE_STRIDE = 8
_SAMPLE_MIN_K = 32
_SAMPLE_MAX_CODES_PER_K = 1500
_SAMPLE_MIN_BLOCKS = 16
_SAMPLE_QUERIES = 128
_SAMPLE_PASS_WORDS = 2048


def sample_plan(n: int, k: int) -> tuple[int, int]:
    """How a scan of ``n`` codes for the top ``k`` starts its bound: ``(stride, rank)``,
    or ``(0, 0)`` to start from ``b + 1``.

    Every 8th whole mini-block of 64 codes is sampled (1/8 of the codes, k / 8 of the top k
    expected in the sample); the bound is the ``rank``-th smallest sampled distance + 1,
    ``rank`` = mu + 3 sqrt(mu) + 2 for mu that expected count: for codes in random order
    the bound falls below the k-th distance (and that query is scanned again) with
    probability under 0.1 %.

    Only for k >= 32 and at most 1500 codes per neighbour kept: the sample costs 1/8 of a
    scan and saves the buffering of the codes that pass while the bound settles, about
    k ln(n / k) of them. ``bench/scan_bound.py`` (quiet, AMD EPYC family 25 model 17,
    AVX-512 VPOPCNTDQ, random codes, one thread, CPU time, without / with the sample): 256
    bits, n / k = 100: 1.52, 333: 1.25, 667: 1.20, 1000: 1.11-1.16, 2000: 1.02 (512 bits:
    0.97), 4000: 0.98, 10^4: 0.94.
    """
    if k < _SAMPLE_MIN_K or n > _SAMPLE_MAX_CODES_PER_K * k:
        return 0, 0
    stride = _SAMPLE_STRIDE
    blocks = -(-(n // _MINI_BLOCK) // stride)  # ceil: mini-blocks 0, stride, 2 stride, ...
    if blocks < _SAMPLE_MIN_BLOCKS:
        return 0, 0
    mu = k * blocks * _MINI_BLOCK / n
    return stride, math.ceil(mu + 3.0 * math.sqrt(mu) + 2.0)


@njit(nogil=True, cache=True)
def sampled_bounds(db, n, queries, q_start, q_end, n_bits, stride, rank, width, wide, tau):
    """``tau[qi]`` = 1 + the ``rank``-th smallest distance of query ``q_start + qi`` to the
    sampled codes (every ``stride``-th mini-block, at most ``_SAMPLE_PER_BLOCK`` codes
    each), or ``n_bits + 1`` when fewer were sampled. ``wide``: compute a mini-block's
    distances on the wide path (``width`` a tuple of the word count, as in the scans).

    Blocked: a pass over ~16 KiB of sampled codes serves up to ``_SAMPLE_QUERIES`` queries.
    Each query counts only the distances below its own running bound, tightened to the
    ``rank``-th smallest counted whenever ``2 rank`` lie beneath it: a sampled code costs a
    distance and a compare, rarely a histogram increment.
    """
    n_words = len(width)
    wu = np.uint64(n_words)
    n_q = q_end - q_start
    n_blocks = n // _MINI_BLOCK
    span = stride * max(1, _SAMPLE_PASS_WORDS // (_MINI_BLOCK * n_words))
    hist = np.empty((min(n_q, _SAMPLE_QUERIES), n_bits + 1), np.int32)
    counted = np.empty(hist.shape[0], np.int64)  # histogram entries below the running bound
    dist = np.empty(_MINI_BLOCK, np.int64)
    tau[:] = n_bits + 1
    for qs in range(0, n_q, _SAMPLE_QUERIES):
        qe = min(n_q, qs + _SAMPLE_QUERIES)
        hist[:] = 0
        counted[:] = 0
        for b0 in range(0, n_blocks, span):
            for qi in range(qs, qe):
                oq = np.uint64(q_start + qi) * wu
                row = hist[qi - qs]
                t, c = tau[qi], counted[qi - qs]
                for b in range(b0, min(n_blocks, b0 + span), stride):
                    if wide:
                        mask = wide_mini_block(
                            db, np.uint64(b * _MINI_BLOCK) * wu, queries, oq, t, dist, width
                        )
                    else:
                        _mini_block_distances(
                            db, b * _MINI_BLOCK, _MINI_BLOCK, queries, oq, n_words, True, dist
                        )
                        mask = _passing(dist, t)
                    for _ in range(_SAMPLE_PER_BLOCK):
                        if mask == 0:
                            break
                        row[dist[trailing_zeros64(mask)]] += 1
                        c += 1
                        mask &= mask - np.uint64(1)
                    if c >= 2 * rank:
                        t, c = _rank_bound(row, t, rank)
                tau[qi], counted[qi - qs] = t, c
        for qi in range(qs, qe):
            tau[qi] = _rank_bound(hist[qi - qs], tau[qi], rank)[0]


@njit(nogil=True, inline="always")
def _rank_bound(row, t, rank):
    """``(d + 1, m)``: ``d`` the ``rank``-th smallest of the histogram ``row``'s entries below
    ``t`` (``t`` itself when fewer), ``m`` how many lie at or below ``d``."""
    total = 0
    for d in range(t):
        total += row[d]
        if total >= rank:
            return d + 1, total
    return t, total


@njit(nogil=True, inline="always")
def _flag_short(kept, k, tau0, n_bits):
    """Set ``tau0[qi]`` to 0 where the query's starting bound (below ``n_bits + 1``) left
    fewer than k codes beneath it (a bound is at least 1, so 0 marks nothing else)."""
    for qi in range(kept.shape[0]):
        if kept[qi] < k and tau0[qi] <= n_bits:
            tau0[qi] = 0


@njit(nogil=True, cache=True)  # called rarely: compiled once, not inlined
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


@njit(nogil=True, cache=True)
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
def _mini_block_distances(db, first, count, queries, q_offset, n_words, vector, out):
    """``out[u]`` = distance of code ``first + u`` to the query at word ``q_offset``.

    ``vector``: use the vector popcount for codes over 4 words. Only where ``n_words`` is a
    compile-time constant: with a run-time width the vector form ran about 8x slower (on
    the read-only arrays of an index) than the plain word loop.
    """
    wu = np.uint64(n_words)
    o = np.uint64(first) * wu
    if n_words <= 4 or not vector:
        # codes in SIMD lanes: LLVM vectorises across u, shuffling the words of a code in
        for u in range(np.uint64(count)):
            d = 0
            for w in range(wu):
                d += popcount64(db[o + u * wu + w] ^ queries[q_offset + w])
            out[u] = d
    else:
        for u in range(np.uint64(count)):
            out[u] = code_distance(db, o + u * wu, queries, q_offset, n_words)


@njit(nogil=True, inline="always")
def _passing(dist, tau):
    """Bit ``u`` set where ``dist[u] < tau``, over the whole mini-block (LLVM vectorises it)."""
    mask = np.uint64(0)
    for u in range(_MINI_BLOCK):
        mask |= np.uint64(dist[u] < tau) << np.uint64(u)
    return mask


@njit(nogil=True, inline="always")
def _accept(dist, first, tau, kept, base, buf_d, buf_p, cap, k, hist, mask):
    """Buffer the codes of a mini-block whose bit is set in ``mask`` (those closer than
    ``tau``); returns ``(tau, kept)``.

    One step per accepted code (a set bit of the mask), none per rejected one: a branch per
    code would mispredict whenever many pass, as in the first blocks or with a large k.
    """
    if mask == 0:
        return tau, kept
    if kept + popcount64(mask) > cap:  # make room: shrink to k and tighten tau
        tau = _shrink(buf_d, buf_p, base, kept, k, hist)
        kept = k
        mask = _passing(dist, tau)
    while mask:
        u = trailing_zeros64(mask)
        buf_d[base + kept] = dist[u]
        buf_p[base + kept] = first + u
        kept += 1
        mask &= mask - np.uint64(1)
    return tau, kept


@njit(nogil=True, inline="always")
def _accept_sparse(db, o, queries, oq, n_words, state):
    """:func:`_accept` for a mini-block whose distances were not stored, ``state`` its
    arguments from ``first`` on: each passing code's distance is computed on its own (a few
    scalar popcounts) instead of storing the whole mini-block's."""
    first, tau, kept, base, buf_d, buf_p, cap, k, hist, mask = state
    if kept + popcount64(mask) > cap:  # make room: shrink to k and tighten tau
        tau = _shrink(buf_d, buf_p, base, kept, k, hist)
        kept = k
    wu = np.uint64(n_words)
    while mask:
        u = trailing_zeros64(mask)
        d = code_distance(db, o + np.uint64(u) * wu, queries, oq, n_words)
        if d < tau:  # always, unless a shrink just tightened tau
            buf_d[base + kept] = d
            buf_p[base + kept] = first + u
            kept += 1
        mask &= mask - np.uint64(1)
    return tau, kept


@njit(nogil=True, inline="always")
def _top_k_state(n_q, k, n_bits):
    """Per-query candidate buffers (``cap`` slots each), counts and bounds, and the histogram."""
    cap = 4 * k + 64
    buf_d = np.empty(n_q * cap, np.int32)
    buf_p = np.empty(n_q * cap, np.int64)
    kept = np.zeros(n_q, np.int64)
    tau = np.full(n_q, n_bits + 1, np.int64)
    hist = np.zeros(n_bits + 1, np.int64)
    return cap, buf_d, buf_p, kept, tau, hist


@njit(nogil=True, inline="always")
def _emit_all(buf_d, buf_p, cap, kept, k, hist, out_d, out_p, q_start):
    """Write every query's top k (shrinking the buffers that hold more) to its output row."""
    for qi in range(kept.shape[0]):
        c = kept[qi]
        if c > k:
            _shrink(buf_d, buf_p, qi * cap, c, k, hist)
            c = k
        _emit_sorted(buf_d, buf_p, qi * cap, c, hist, out_d, out_p, q_start + qi)


@njit(nogil=True, inline="always")
def _tail(db, i0, m, queries, oq, n_words, vector, n_bits, dist):
    """Distances of a mini-block's ``m <= 64`` codes; the slots past ``m`` never pass."""
    _mini_block_distances(db, i0, m, queries, oq, n_words, vector, dist)
    if m < _MINI_BLOCK:  # the database's last codes
        dist[m:] = n_bits + 1


@njit(nogil=True, inline="always")
def _knn_core(
    db, n, queries, q_start, q_end, k, n_bits, out_d, out_p, n_words, block, vector, tau0
):
    """Body of the portable ``knn_scan_*`` kernels; ``n_words`` is a constant in the
    specialised ones. Queries go two per pass over a mini-block (the second reuses the
    codes' words from registers); an odd one out, or a lone query, passes alone.
    ``tau0``: each query's starting bound (:func:`sampled_bounds`), set to 0 where it
    proved too tight (:func:`_flag_short`)."""
    n_q = q_end - q_start
    cap, buf_d, buf_p, kept, tau, hist = _top_k_state(n_q, k, n_bits)
    tau[:] = tau0
    dist_a = np.empty(_MINI_BLOCK, np.int64)
    dist_b = np.empty(_MINI_BLOCK, np.int64)
    wu = np.uint64(n_words)
    for b0 in range(0, n, block):
        b1 = min(n, b0 + block)
        for qa in range(0, n_q, 2):
            oa = np.uint64(q_start + qa) * wu
            ta, ka = tau[qa], kept[qa]
            if qa + 1 < n_q:
                qb = qa + 1
                tb, kb = tau[qb], kept[qb]
                for i0 in range(b0, b1, _MINI_BLOCK):
                    m = min(_MINI_BLOCK, b1 - i0)
                    _tail(db, i0, m, queries, oa, n_words, vector, n_bits, dist_a)
                    _tail(db, i0, m, queries, oa + wu, n_words, vector, n_bits, dist_b)
                    ma, mb = _passing(dist_a, ta), _passing(dist_b, tb)
                    ta, ka = _accept(dist_a, i0, ta, ka, qa * cap, buf_d, buf_p, cap, k, hist, ma)
                    tb, kb = _accept(dist_b, i0, tb, kb, qb * cap, buf_d, buf_p, cap, k, hist, mb)
                tau[qb], kept[qb] = tb, kb
            else:
                for i0 in range(b0, b1, _MINI_BLOCK):
                    m = min(_MINI_BLOCK, b1 - i0)
                    _tail(db, i0, m, queries, oa, n_words, vector, n_bits, dist_a)
                    ma = _passing(dist_a, ta)
                    ta, ka = _accept(dist_a, i0, ta, ka, qa * cap, buf_d, buf_p, cap, k, hist, ma)
            tau[qa], kept[qa] = ta, ka
    _flag_short(kept, k, tau0, n_bits)
    _emit_all(buf_d, buf_p, cap, kept, k, hist, out_d, out_p, q_start)


@njit(nogil=True, cache=True)
def knn_scan_fixed_width(
    db, n, queries, q_start, q_end, k, n_bits, out_d, out_p, block, width, tau0
):
    """The kernel for a common word count, given as the *length* of the tuple ``width``: a
    tuple's length is part of its type, so numba compiles (and caches) one kernel per word
    count with the count a constant, which lets LLVM unroll and vectorise the word loop."""
    n_words = len(width)
    _knn_core(db, n, queries, q_start, q_end, k, n_bits, out_d, out_p, n_words, block, True, tau0)


@njit(nogil=True, cache=True)
def knn_scan_any_width(
    db, n, queries, q_start, q_end, k, n_bits, out_d, out_p, block, n_words, tau0
):
    """The kernel for word counts without a specialisation (``n_words`` at run time)."""
    _knn_core(db, n, queries, q_start, q_end, k, n_bits, out_d, out_p, n_words, block, False, tau0)


#: Widths (64-bit words) up to which the wide scan tests a mini-block by its mask before
#: storing its distances (the block computed twice when a code passes). 1M random 64-bit
#: codes, k = 10, batch: 0.082 vs 0.097 ms per query with the distances always stored; 60k
#: 256-bit codes, k = 80 (a searcher's shortlist): 0.054 vs 0.046, and 128-bit codes 0.036
#: vs 0.031 (k = 80) and 0.110 vs 0.101 (k = 1000), the recompute costing more than the
#: stores (Zen 4, one thread, in-process A/B; wider codes now take the deferred form).
_MASK_FIRST_MAX_WORDS = 1
#: ... and only when the database holds at least this many codes per neighbour kept: the
#: fewer codes pass a settled top k, the more the skipped work saves. ``bench/mask_first.py``
#: (quiet AMD EPYC family 25 model 17, AVX-512 VPOPCNTDQ, 2026-11-27 23:03 UTC, deferred / mask-first CPU time): n / k = 100k: 1.18,
#: 33k: 1.15, 20k: 0.99, 10k: 1.06, 6.7k: 0.95, 6k: 0.94, 3.3k: 0.98, 2k: 0.89-0.90, 600
#: (a searcher's shortlist of 100 over 60k codes): 0.90 (against storing every mini-block's
#: distances before the deferred form: the same crossover, near 8k).
MASK_FIRST_MIN_CODES_PER_K = 8000


@njit(nogil=True, cache=True)
def knn_scan_wide(
    db, n, queries, q_start, q_end, k, n_bits, out_d, out_p, block, width, mask_first, tau0
):
    """The wide path's kernel (CPUs with AVX-512 VPOPCNTDQ) for a word count given as the
    length of ``width``: whole mini-blocks through
    :func:`hashlearn._utils.popcount.wide_mini_block` (8 codes per 512-bit step, the pass
    mask from a vector compare), one query per pass over a block (a code's words are one
    load per 8 words, so pairing queries saves little), the last partial mini-block
    the portable way; ``tau0`` as in :func:`_knn_core`."""
    n_words = len(width)
    n_q = q_end - q_start
    cap, buf_d, buf_p, kept, tau, hist = _top_k_state(n_q, k, n_bits)
    tau[:] = tau0
    dist = np.empty(_MINI_BLOCK, np.int64)
    pend_o = np.empty(block // _MINI_BLOCK, np.int64)  # a block's mini-blocks with a pass
    pend_m = np.empty(block // _MINI_BLOCK, np.uint64)  # ... and their masks
    wu = np.uint64(n_words)
    for b0 in range(0, n, block):
        b1 = min(n, b0 + block)
        whole = b0 + (b1 - b0) // _MINI_BLOCK * _MINI_BLOCK
        for qi in range(n_q):
            oq = np.uint64(q_start + qi) * wu
            t, c = tau[qi], kept[qi]
            n_pend = 0
            for i0 in range(b0, whole, _MINI_BLOCK):
                o = np.uint64(i0) * wu
                if n_words <= _MASK_FIRST_MAX_WORDS and mask_first:  # the first: compile time
                    # the mask alone, and the block again with its distances stored only
                    # when a code passes (rarely, once the top k settles): no stores on
                    # the hot path where a block's distances cost little to recompute
                    if wide_mini_block(db, o, queries, oq, t, None, width):
                        mask = wide_mini_block(db, o, queries, oq, t, dist, width)
                        t, c = _accept(dist, i0, t, c, qi * cap, buf_d, buf_p, cap, k, hist, mask)
                else:
                    # no branch on the mask here: a mispredicted one throws away the scan
                    # work in flight behind it (about a mini-block's worth); the blocks with
                    # a passing code are noted and taken after the block
                    mask = wide_mini_block(db, o, queries, oq, t, None, width)
                    pend_o[n_pend], pend_m[n_pend] = i0, mask
                    n_pend += mask != 0
            for j in range(n_pend):
                i0, mask = pend_o[j], pend_m[j]
                o = np.uint64(i0) * wu
                if popcount64(mask) > _SPARSE_MAX:  # many pass (a loose tau): store them all
                    mask = wide_mini_block(db, o, queries, oq, t, dist, width)
                    t, c = _accept(dist, i0, t, c, qi * cap, buf_d, buf_p, cap, k, hist, mask)
                else:
                    state = (i0, t, c, qi * cap, buf_d, buf_p, cap, k, hist, mask)
                    t, c = _accept_sparse(db, o, queries, oq, n_words, state)
            if whole < b1:
                _tail(db, whole, b1 - whole, queries, oq, n_words, True, n_bits, dist)
                mask = _passing(dist, t)
                t, c = _accept(dist, whole, t, c, qi * cap, buf_d, buf_p, cap, k, hist, mask)
            tau[qi], kept[qi] = t, c
    _flag_short(kept, k, tau0, n_bits)
    _emit_all(buf_d, buf_p, cap, kept, k, hist, out_d, out_p, q_start)


def _read_only(a):
    """``a`` as :func:`frozen` gives it, skipping the call (a fifth of a one-query search's
    overhead for two) when it already is a read-only C-ordered uint64 array."""
    flags = a.flags
    if a.dtype == np.uint64 and flags.c_contiguous and not flags.writeable:
        return a
    return frozen(a, np.uint64)


#: word counts with a kernel of their own, each keyed by a tuple of that length
_WIDTH_TAGS = {w: (0,) * w for w in (1, 2, 3, 4, 6, 8, 16)}


def knn_scan(db, n, queries, q_start, q_end, k, n_bits, n_words, out_d, out_p, sampled=True):
    """Exact k-NN by Hamming distance of queries ``q_start:q_end`` against ``n`` codes.

    ``db`` and ``queries`` are flat ``uint64`` word arrays; writes distances (int32) and
    database *positions* (int64) sorted by (distance, position) into rows
    ``q_start:q_end`` of ``out_d`` / ``out_p``, padding with -1 when ``n < k``. Serial and
    GIL-free: callers run chunks of queries on several threads. ``sampled=False`` starts
    every bound from ``b + 1`` (:func:`sample_plan`).
    """
    block = _MINI_BLOCK * max(1, 32 // n_words)  # ~16 KiB of codes, whole mini-blocks
    # read-only inputs for every caller: one compiled kernel per width, not one per mix of
    # writable and read-only arrays (an index's codes are read-only)
    db, queries = _read_only(db), _read_only(queries)
    stride, rank = sample_plan(n, k) if sampled else (0, 0)
    width = _WIDTH_TAGS.get(n_words)
    wide = width is not None and kernel_path(n_words, lone=q_end - q_start == 1) == "wide"
    tau0 = np.empty(q_end - q_start, np.int64)
    tau0.fill(n_bits + 1)  # (np.full costs twice as much: a lone query's overhead)
    use_sample = bool(stride) and width is not None
    if use_sample:
        sampled_bounds(db, n, queries, q_start, q_end, n_bits, stride, rank, width, wide, tau0)
    tail = (out_d, out_p, block)
    if width is None:
        knn_scan_any_width(db, n, queries, q_start, q_end, k, n_bits, *tail, n_words, tau0)
    elif wide:
        mask_first = n >= MASK_FIRST_MIN_CODES_PER_K * k
        args = (*tail, width, mask_first, tau0)
        knn_scan_wide(db, n, queries, q_start, q_end, k, n_bits, *args)
    else:
        knn_scan_fixed_width(db, n, queries, q_start, q_end, k, n_bits, *tail, width, tau0)
    if use_sample:  # a query whose sampled bound was too tight is scanned again without it
        for qi in np.flatnonzero(tau0 == 0):
            q = q_start + int(qi)
            knn_scan(db, n, queries, q, q + 1, k, n_bits, n_words, out_d, out_p, sampled=False)

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

The fast form (Gordo et al.'s look-up tables, as product quantization's ADC): per query, for
each code byte ``g`` a table of the 256 partial sums ``T_g[v] = sum_{t < 8} p_{8g+t}
(2 v_t - 1)`` (bits past ``b`` contribute nothing), built once in float64 and stored as
float32; a code then costs one look-up and one add per byte. Two modes, both keeping the top
k as they score (ties to the smaller position):

* :func:`asymmetric_scan`: every code of the database;
* :func:`asymmetric_rerank`: a candidate list per query (the Hamming shortlist to re-rank).

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
from hashlearn._utils.validation import as_plain_array, check_codes, check_k

__all__ = ["asymmetric_scan", "asymmetric_rerank", "byte_tables"]


# ------------------------------------------------------------------------------ kernels


@njit(nogil=True, cache=True)
def byte_tables(p, n_bits, table):
    """Fill ``table`` (float32, ``ceil(b / 8) * 256``) with the partial sums of ``p``.

    ``table[256 g + v] = sum_{t < 8, 8g + t < b} p[8g + t] * (2 bit_t(v) - 1)``, computed in
    float64: the all-zero byte's sum, then each value from the one without its lowest set bit
    (adding ``2 p_t`` for that bit ``t``; a padding bit adds nothing).
    """
    n_bytes = (n_bits + 7) // 8
    sums = np.empty(256, np.float64)
    for g in range(n_bytes):
        base = 0.0
        for t in range(8):
            j = 8 * g + t
            if j < n_bits:
                base -= np.float64(p[j])
        sums[0] = base
        for v in range(1, 256):
            t = 0
            while not (v >> t) & 1:
                t += 1
            j = 8 * g + t
            step = 2.0 * np.float64(p[j]) if j < n_bits else 0.0
            sums[v] = sums[v & (v - 1)] + step
        for v in range(256):
            table[256 * g + v] = np.float32(sums[v])


@njit(nogil=True, inline="always")
def _score(table, codes, row, n_bytes):
    """``s`` of code ``row`` (flat uint8 ``codes``): one look-up per byte, four running sums
    (independent chains of adds), combined in a fixed order."""
    o = row * n_bytes
    s0 = np.float32(0.0)
    s1 = np.float32(0.0)
    s2 = np.float32(0.0)
    s3 = np.float32(0.0)
    g = 0
    while g + 4 <= n_bytes:
        s0 += table[(g << 8) + np.int64(codes[o + g])]
        s1 += table[((g + 1) << 8) + np.int64(codes[o + g + 1])]
        s2 += table[((g + 2) << 8) + np.int64(codes[o + g + 2])]
        s3 += table[((g + 3) << 8) + np.int64(codes[o + g + 3])]
        g += 4
    while g < n_bytes:
        s0 += table[(g << 8) + np.int64(codes[o + g])]
        g += 1
    return (s0 + s1) + (s2 + s3)


@njit(nogil=True, cache=True)
def _shrink(buf_s, buf_p, count, k):
    """Sort the ``count`` buffered ``(score, position)`` pairs by score descending, then
    position ascending (two stable sorts), keep the first ``min(k, count)``; returns that
    count."""
    by_pos = np.argsort(buf_p[:count], kind="mergesort")
    neg = np.empty(count, np.float32)
    for j in range(count):
        neg[j] = -buf_s[by_pos[j]]
    order = by_pos[np.argsort(neg, kind="mergesort")]
    keep = min(k, count)
    s = buf_s[order[:keep]].copy()
    p = buf_p[order[:keep]].copy()
    buf_s[:keep] = s
    buf_p[:keep] = p
    return keep


@njit(nogil=True, inline="always")
def _offer(buf_s, buf_p, kept, k, tau_s, tau_p, s, p):
    """Buffer ``(s, p)`` if it can still enter the top k (it beats the k-th kept pair by
    score, or ties it with a smaller position); shrinks a full buffer to k first.
    Returns ``(kept, tau_s, tau_p)``; ``tau`` is the k-th pair once one shrink has run."""
    if s < tau_s or (s == tau_s and p > tau_p):
        return kept, tau_s, tau_p
    if kept == buf_s.shape[0]:
        kept = _shrink(buf_s, buf_p, kept, k)
        tau_s, tau_p = buf_s[k - 1], buf_p[k - 1]
        if s < tau_s or (s == tau_s and p > tau_p):
            return kept, tau_s, tau_p
    buf_s[kept] = s
    buf_p[kept] = p
    return kept + 1, tau_s, tau_p


@njit(nogil=True, inline="always")
def _emit(buf_s, buf_p, kept, k, out_s, out_i, row):
    """Write the best ``min(k, kept)`` buffered pairs to ``out[row]``, then the padding."""
    kept = _shrink(buf_s, buf_p, kept, k)
    for r in range(kept):
        out_s[row, r] = buf_s[r]
        out_i[row, r] = buf_p[r]
    for r in range(kept, out_s.shape[1]):
        out_s[row, r] = -np.inf
        out_i[row, r] = -1


@njit(nogil=True, cache=True)
def scan_kernel(P, codes, n, n_bits, k, out_s, out_i, q_start, q_end):  # pragma: no cover
    """Top ``k`` of all ``n`` codes (flat uint8) for queries ``q_start:q_end`` of ``P``."""
    n_bytes = (n_bits + 7) // 8
    table = np.empty(n_bytes * 256, np.float32)
    buf_s = np.empty(4 * k + 64, np.float32)
    buf_p = np.empty(4 * k + 64, np.int64)
    for q in range(q_start, q_end):
        byte_tables(P[q], n_bits, table)
        kept = 0
        tau_s = np.float32(-np.inf)
        tau_p = np.int64(-1)  # scan order: no later position ties its way in
        for i in range(n):
            kept, tau_s, tau_p = _offer(
                buf_s, buf_p, kept, k, tau_s, tau_p, _score(table, codes, i, n_bytes), i
            )
        _emit(buf_s, buf_p, kept, k, out_s, out_i, q)


@njit(nogil=True, cache=True)
def rerank_kernel(P, codes, cand, n_bits, k, out_s, out_i, q_start, q_end):  # pragma: no cover
    """Top ``k`` of each query's candidate positions ``cand[q]`` (-1 skipped)."""
    n_bytes = (n_bits + 7) // 8
    table = np.empty(n_bytes * 256, np.float32)
    buf_s = np.empty(4 * k + 64, np.float32)
    buf_p = np.empty(4 * k + 64, np.int64)
    for q in range(q_start, q_end):
        byte_tables(P[q], n_bits, table)
        kept = 0
        tau_s = np.float32(-np.inf)
        tau_p = np.int64(np.iinfo(np.int64).max)
        for c in range(cand.shape[1]):
            i = cand[q, c]
            if i < 0:
                continue
            kept, tau_s, tau_p = _offer(
                buf_s, buf_p, kept, k, tau_s, tau_p, _score(table, codes, i, n_bytes), i
            )
        _emit(buf_s, buf_p, kept, k, out_s, out_i, q)


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
    with np.errstate(over="ignore"):  # too large for float32: inf, refused below
        P = frozen(P, np.float32)
    if not np.isfinite(P).all():
        raise ValueError(
            f"projections of {owner} must be finite as float32 (no NaN, no inf, |p| < 3.4e38)."
        )
    return P


def _empty_result(m: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full((m, k), -np.inf, np.float32), np.full((m, k), -1, np.int64)


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
    n = codes.shape[0]
    out_s, out_i = _empty_result(m, k)
    if m == 0 or n == 0:
        return out_s, out_i
    flat = codes.reshape(-1)

    def run(start: int, stop: int) -> None:
        scan_kernel(P, flat, n, n_bits, min(k, n), out_s, out_i, start, stop)

    parallel_chunks(run, m, n_threads)
    return out_s, out_i


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
    cand = frozen(cand, np.int64)
    k = check_k(k, m, owner, bytes_per_result=12)
    out_s, out_i = _empty_result(m, k)
    if m == 0 or n == 0 or cand.shape[1] == 0:
        return out_s, out_i
    flat = codes.reshape(-1)
    k_eff = min(k, cand.shape[1])

    def run(start: int, stop: int) -> None:
        rerank_kernel(P, flat, cand, n_bits, k_eff, out_s, out_i, start, stop)

    parallel_chunks(run, m, n_threads)
    return out_s, out_i

"""Neighbour lists over any index: relative Hamming thresholds, padded candidate lists."""

from __future__ import annotations

import numpy as np

from hashlearn._utils.validation import check_int

__all__ = ["relative_neighbors", "pad_candidates"]


def relative_neighbors(index, codes, *, radius=None, n_bins=None, n_threads=None):
    """Neighbours by an absolute or relative Hamming threshold, ties kept: ``(lims, D, I)``.

    The LambdaRank bit-vector paper (WWW), Sec. 3.5.2. ``radius``: every item at Hamming
    distance ``<= radius``. ``n_bins``: every item in the query's ``n_bins`` nearest non-empty
    distance bins (for k-NN classification with a relative threshold). Exactly one. CSR form
    as ``index.range_search`` (sorted by (distance, id)). Relative thresholds are found by
    growing ``index.search`` until a result lies beyond the ``n_bins``-th bin, then one
    ``range_search`` per threshold.
    """
    if (radius is None) == (n_bins is None):
        raise ValueError(
            "Searcher.neighbors takes exactly one of 'radius' (absolute "
            f"threshold) and 'n_bins' (relative threshold). Got "
            f"radius={radius!r}, n_bins={n_bins!r}."
        )
    if radius is not None:
        return index.range_search(codes, radius, n_threads=n_threads)
    n_bins = check_int(n_bins, "n_bins", "Searcher.neighbors")
    m, n = codes.shape[0], len(index)
    threshold = np.full(m, -1, np.int64)
    todo = np.arange(m)
    k = min(max(4 * n_bins, 64), max(n, 1))
    while todo.size and n:
        D, _ = index.search(codes[todo], k, n_threads=n_threads)
        s = np.where(D >= 0, D, np.iinfo(np.int32).max)
        new_bin = np.ones(s.shape, bool)
        new_bin[:, 1:] = s[:, 1:] != s[:, :-1]
        rank = np.cumsum(new_bin & (D >= 0), axis=1)
        bin_d = np.where((rank <= n_bins) & (D >= 0), D, -1).max(axis=1)
        complete = (rank[:, -1] > n_bins) | (D[:, -1] < 0) | (k >= n)
        threshold[todo[complete]] = bin_d[complete]
        todo = todo[~complete]
        k = min(2 * k, n)
    parts = {}
    for t in np.unique(threshold[threshold >= 0]):
        rows = np.flatnonzero(threshold == t)
        parts[int(t)] = (rows, index.range_search(codes[rows], int(t), n_threads=n_threads))
    counts = np.zeros(m, np.int64)
    for rows, (lims, _, _) in parts.values():
        counts[rows] = np.diff(lims)
    out_lims = np.zeros(m + 1, np.int64)
    np.cumsum(counts, out=out_lims[1:])
    out_d = np.empty(out_lims[-1], np.int32)
    out_i = np.empty(out_lims[-1], np.int64)
    for rows, (lims, D, ids) in parts.values():
        for j, row in enumerate(rows):
            dst = slice(out_lims[row], out_lims[row + 1])
            out_d[dst], out_i[dst] = D[lims[j] : lims[j + 1]], ids[lims[j] : lims[j + 1]]
    return out_lims, out_d, out_i


def pad_candidates(lists, limit: int | None) -> np.ndarray:
    """Per-query candidate lists -- id arrays or ``(ids, counts)`` pairs, in the index's order
    of preference -- as one ``(m, c)`` int64 array padded with -1 (first ``limit`` kept)."""
    lists = [np.asarray(c[0] if isinstance(c, tuple) else c, np.int64)[:limit] for c in lists]
    lengths = np.fromiter(map(len, lists), np.int64, len(lists))
    out = np.full((len(lists), max(int(lengths.max(initial=0)), 1)), -1, np.int64)
    if lengths.sum():
        rows = np.repeat(np.arange(len(lists)), lengths)
        cols = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        out[rows, cols] = np.concatenate(lists)
    return out

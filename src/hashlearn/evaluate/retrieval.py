"""Retrieval measures over Hamming distances: precision/recall within a radius, PR curves,
recall@M of the true neighbours, mean average precision."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sklearn.utils import check_random_state

from hashlearn._utils.knn import _check_choice, _query_blocks
from hashlearn._utils.validation import check_int
from hashlearn.evaluate._common import (
    _AGGREGATES,
    _AP_TIES,
    _EMPTY,
    _RANK_TIES,
    _check_distances,
    _check_id_lists,
    _check_relevant,
    _document,
    _hamming_order,
    _safe_ratio,
)


def _check_pr_inputs(distances, relevant, aggregate, empty, owner, n_bits=None) -> tuple:
    """The checked ``(distances, relevant, aggregate, empty)`` of a precision--recall
    measure (distances at most ``n_bits`` when it is given)."""
    d = _check_distances(distances, owner, n_bits)
    rel = _check_relevant(relevant, d.shape, owner)
    aggregate = _check_choice(aggregate, "aggregate", owner, _AGGREGATES)
    empty = _check_choice(empty, "empty", owner, _EMPTY)
    return d, rel, aggregate, empty


def _aggregate_pr(
    hits: np.ndarray, retrieved: np.ndarray, n_relevant: np.ndarray, aggregate: str, empty: str
) -> tuple[np.ndarray, np.ndarray]:
    """Precision and recall per column of ``(m, n_radii)`` count matrices."""
    if aggregate == "pooled":
        return (
            _safe_ratio(hits.sum(axis=0), retrieved.sum(axis=0)),
            _safe_ratio(hits.sum(axis=0), n_relevant.sum()),
        )
    precision = _safe_ratio(hits, retrieved)  # 0 for an empty retrieval
    n_counted = retrieved.shape[0] if empty == "zero" else (retrieved > 0).sum(axis=0)
    recall = _safe_ratio(hits, n_relevant[:, None])  # 0 rows for queries with nothing relevant
    return (
        _safe_ratio(precision.sum(axis=0), n_counted),
        _safe_ratio(recall.sum(axis=0), np.count_nonzero(n_relevant)),
    )


_PR_CONVENTIONS = """

    Aggregation: ``"pooled"`` (default, as the MLH code) sums over all query--item pairs,
    precision = #relevant retrieved / #retrieved and recall = #relevant retrieved / #relevant;
    nothing retrieved at all gives precision 0. ``"per_query"`` averages per-query ratios:
    a query retrieving nothing scores precision 0 (``empty="zero"``) or is left out of the
    precision mean (``empty="skip"``; if every query is left out the precision is 0.0).
    A query with no relevant item has no recall and is left out of the recall mean (0.0 if no
    query has one). ``empty`` has no effect when pooled. No ranking, so no ties.
"""


@_document(_PR_CONVENTIONS)
def precision_recall_at_radius(
    distances: np.ndarray,
    relevant: np.ndarray,
    radius: int,
    aggregate: str = "pooled",
    empty: str = "zero",
) -> tuple[float, float]:
    """Precision and recall of the Hamming ball ``distance <= radius`` (MLH, Sec. 6)."""
    owner = "precision_recall_at_radius"
    radius = check_int(radius, "radius", owner, low=0)
    d, rel, aggregate, empty = _check_pr_inputs(distances, relevant, aggregate, empty, owner)
    inside = d <= radius
    precision, recall = _aggregate_pr(
        np.count_nonzero(inside & rel, axis=1)[:, None],
        np.count_nonzero(inside, axis=1)[:, None],
        np.count_nonzero(rel, axis=1),
        aggregate,
        empty,
    )
    return float(precision[0]), float(recall[0])


@_document(_PR_CONVENTIONS)
def precision_recall_curve(
    distances: np.ndarray,
    relevant: np.ndarray,
    n_bits: int,
    aggregate: str = "pooled",
    empty: str = "zero",
) -> tuple[np.ndarray, np.ndarray]:
    """Precision and recall ``(n_bits + 1,)`` for every radius ``R = 0..n_bits`` (MLH, Fig. 4).

    One pass: per-query histograms of the distances (all items and relevant ones), summed
    cumulatively; entry ``R`` equals :func:`precision_recall_at_radius` at radius ``R``.
    """
    owner = "precision_recall_curve"
    n_bits = check_int(n_bits, "n_bits", owner)
    d, rel, aggregate, empty = _check_pr_inputs(
        distances, relevant, aggregate, empty, owner, n_bits
    )
    n_bins = n_bits + 1
    retrieved = np.empty((d.shape[0], n_bins), dtype=np.int64)
    hits = np.empty_like(retrieved)
    for rows in _query_blocks(*d.shape):
        block = d[rows]
        flat = (block + n_bins * np.arange(block.shape[0])[:, None]).ravel()
        size = block.shape[0] * n_bins
        retrieved[rows] = np.bincount(flat, minlength=size).reshape(-1, n_bins)
        hits[rows] = np.bincount(flat[rel[rows].ravel()], minlength=size).reshape(-1, n_bins)
    return _aggregate_pr(
        hits.cumsum(axis=1),
        retrieved.cumsum(axis=1),
        np.count_nonzero(rel, axis=1),
        aggregate,
        empty,
    )


def pr_auc(precision: np.ndarray, recall: np.ndarray) -> float:
    """Area under a precision--recall curve by the trapezoid rule over recall.

    Rule: points before the first one with non-zero recall are dropped (radii that retrieve
    nothing relevant), and the point ``(recall=0, precision=<precision of that first point>)``
    is prepended, extending the curve flat to recall 0. ``recall`` must be non-decreasing,
    as :func:`precision_recall_curve` returns it. A curve that never recalls anything has
    area 0.
    """
    owner = "pr_auc"
    arrays = []
    for name, arr in (("precision", precision), ("recall", recall)):
        if not isinstance(arr, np.ndarray) or not np.issubdtype(arr.dtype, np.floating):
            got = arr.dtype if isinstance(arr, np.ndarray) else type(arr).__name__
            raise TypeError(f"{name} of {owner} must be a float numpy.ndarray. Got {got}.")
        if arr.ndim != 1 or arr.shape != precision.shape or arr.size == 0:
            raise ValueError(
                f"precision and recall of {owner} must be non-empty 1-D arrays of "
                f"equal length. Got shapes {precision.shape} and {recall.shape}."
            )
        if not np.all(np.isfinite(arr)) or arr.min() < 0 or arr.max() > 1:
            raise ValueError(f"{name} of {owner} must hold finite values in [0, 1].")
        arrays.append(arr.astype(np.float64))
    p, r = arrays
    if np.any(np.diff(r) < 0):
        raise ValueError(f"recall of {owner} must be non-decreasing.")
    if r[-1] == 0:
        return 0.0
    first = int(np.argmax(r > 0))
    p = np.concatenate(([p[first]], p[first:]))
    r = np.concatenate(([0.0], r[first:]))
    return float(np.sum(np.diff(r) * (p[1:] + p[:-1]) / 2.0))


def hamming_ranking(
    distances: np.ndarray, k: int | None = None, random_state: Any = 0, ties: str = "random"
) -> np.ndarray:
    """Database indices ``(m, k)`` int64 in increasing Hamming distance, ties broken by rule.

    ``ties="random"``: a seeded random 31-bit key per query--item pair orders the items
    within a distance (equal keys, about 2**-31 a pair, fall back to the smaller index); the
    same ``random_state`` gives the same ranking, and the ranking for a smaller ``k`` is a
    prefix of the one for a larger ``k``. ``ties="index"``: smaller index first.
    ``k=None`` ranks the whole database; ``k > n_db`` pads with ``-1``.
    """
    owner = "hamming_ranking"
    d = _check_distances(distances, owner)
    k = d.shape[1] if k is None else check_int(k, "k", owner)
    ties = _check_choice(ties, "ties", owner, _RANK_TIES)
    rng = check_random_state(random_state)
    kk = min(k, d.shape[1])
    ranking = np.full((d.shape[0], k), -1, dtype=np.int64)
    for rows in _query_blocks(*d.shape):
        ranking[rows, :kk] = _hamming_order(d[rows], kk, ties, rng)
    return ranking


def _check_m_values(m_values: Any, owner: str) -> np.ndarray:
    arr = np.asarray(m_values)
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(
            f"The 'm_values' parameter of {owner} must be a non-empty 1-D "
            f"sequence of ints. Got {m_values!r} instead."
        )
    if arr.min() < 1:
        raise ValueError(
            f"The 'm_values' parameter of {owner} must hold ints >= 1. Got min {arr.min()}."
        )
    return arr.astype(np.int64)


def _recall_at_m(
    retrieved: np.ndarray, true_neighbors: np.ndarray, m_values: np.ndarray
) -> np.ndarray:
    """Validated inputs: per-query recall of ``true_neighbors`` in ``retrieved[:, :M]``."""
    n_rows = retrieved.shape[0]
    span = int(max(retrieved.max(initial=0), true_neighbors.max(initial=0))) + 2
    row_key = np.arange(n_rows, dtype=np.int64)[:, None] * span
    true_keys = (row_key + true_neighbors)[true_neighbors >= 0]
    hit = np.isin(row_key + retrieved, true_keys) & (retrieved >= 0)
    found = np.concatenate((np.zeros((n_rows, 1), np.int64), np.cumsum(hit, axis=1)), axis=1)
    found_at = found[:, np.minimum(m_values, retrieved.shape[1])]
    n_true = np.count_nonzero(true_neighbors >= 0, axis=1)
    per_query = _safe_ratio(found_at, n_true[:, None])
    return _safe_ratio(per_query.sum(axis=0), np.count_nonzero(n_true))


_RECALL_CONVENTIONS = """

    Recall@M of a query = #(its true neighbours among the first M retrieved) / #(its true
    neighbours); ``-1`` entries are ignored, and ``M`` beyond the list counts the whole list.
    Averaged per query, leaving out queries without true neighbours (0.0 if none has any).
"""


@_document(_RECALL_CONVENTIONS)
def recall_at_m(
    distances: np.ndarray,
    true_neighbors: np.ndarray,
    m_values: Sequence[int],
    random_state: Any = 0,
    ties: str = "random",
) -> np.ndarray:
    """Fraction of the true K-NN among the first M of the Hamming ranking (survey, Fig. 11).

    Returns a float64 array, one value per entry of ``m_values``. The ranking is
    :func:`hamming_ranking` with the same ``ties`` / ``random_state``; random ties (default)
    keep a method from being flattered by argsort's order within a Hamming distance.
    """
    owner = "recall_at_m"
    d = _check_distances(distances, owner)
    true_neighbors = _check_id_lists(
        true_neighbors, "true_neighbors", owner, n_rows=d.shape[0], n_db=d.shape[1]
    )
    m = _check_m_values(m_values, owner)
    ranking = hamming_ranking(d, int(min(m.max(), d.shape[1])), random_state, ties)
    return _recall_at_m(ranking, true_neighbors, m)


@_document(_RECALL_CONVENTIONS)
def recall_at_m_from_ids(
    retrieved_ids: np.ndarray, true_neighbors: np.ndarray, m_values: Sequence[int]
) -> np.ndarray:
    """Recall@M for a ranked id list a search structure returned (``-1`` padded, no repeats).

    Ties were broken by whatever produced ``retrieved_ids``; positions count list slots.
    """
    owner = "recall_at_m_from_ids"
    retrieved_ids = _check_id_lists(retrieved_ids, "retrieved_ids", owner)
    true_neighbors = _check_id_lists(
        true_neighbors, "true_neighbors", owner, n_rows=retrieved_ids.shape[0]
    )
    return _recall_at_m(retrieved_ids, true_neighbors, _check_m_values(m_values, owner))


def mean_average_precision(
    distances: np.ndarray,
    relevant: np.ndarray,
    ties: str = "random",
    random_state: Any = 0,
    top: int | None = None,
) -> float:
    r"""Mean over queries of the average precision of the Hamming ranking.

    .. math:: \mathrm{AP} = \frac{1}{\min(G, L)} \sum_{j \le L} P@j \cdot rel_j

    with ``G`` the query's relevant items and ``L = top`` (whole database if ``None``), so a
    perfect ranking scores 1. Averaged per query over queries with at least one relevant item
    (0.0 if none has one).

    Ties change AP: ``"random"`` (seeded, as :func:`hamming_ranking`), ``"index"`` (smaller
    index first), ``"pessimistic"`` (irrelevant items first within a distance: a lower bound
    over all tie orders) and ``"optimistic"`` (relevant first: the upper bound). The two
    bounds bracket every tie-breaking rule.
    """
    owner = "mean_average_precision"
    d = _check_distances(distances, owner)
    rel = _check_relevant(relevant, d.shape, owner)
    ties = _check_choice(ties, "ties", owner, _AP_TIES)
    rng = check_random_state(random_state)
    depth = d.shape[1] if top is None else min(check_int(top, "top", owner), d.shape[1])
    n_relevant = np.count_nonzero(rel, axis=1)
    ap = np.empty(d.shape[0])
    for rows in _query_blocks(*d.shape):
        order = _hamming_order(d[rows], depth, ties, rng, rel[rows])
        rel_ranked = np.take_along_axis(rel[rows], order, axis=1)
        precision_at = np.cumsum(rel_ranked, axis=1) / np.arange(1, depth + 1)
        ap[rows] = _safe_ratio(
            (precision_at * rel_ranked).sum(axis=1), np.minimum(n_relevant[rows], depth)
        )
    return float(_safe_ratio(ap.sum(), np.count_nonzero(n_relevant)))

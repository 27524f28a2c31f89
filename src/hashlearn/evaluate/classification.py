"""k-NN classification and regression over Hamming distances, and neighbour selection by an
absolute (radius) or relative (nearest non-empty bins) Hamming threshold."""

from __future__ import annotations

from typing import Any

import numpy as np

from hashlearn._utils.knn import _query_blocks
from hashlearn._utils.validation import check_int
from hashlearn._utils.vote import majority_vote
from hashlearn.evaluate._common import (
    _check_distances,
    _check_int_array,
    _check_labels,
    _document,
)
from hashlearn.evaluate.ground_truth import exact_knn

_KNN_CONVENTIONS = """

    Exactly one of ``radius`` / ``k``. ``radius`` (absolute threshold): every item at
    distance ``<= radius`` votes; a query with none gets no prediction, label ``-1``, which
    counts as an error. ``k`` (relative threshold, LambdaRank bit vectors, Sec. 3): every item
    in the query's ``k`` nearest *non-empty* Hamming distance bins votes, so all tied items
    vote and at least ``k`` items do (all of them if fewer than ``k`` bins are non-empty).
    Majority vote; a tie between classes goes to the class whose nearest voter is closest,
    then to the smaller label. Labels are non-negative ints.
"""


@_document(_KNN_CONVENTIONS)
def knn_classify(
    distances: np.ndarray, db_labels: np.ndarray, radius: int | None = None, k: int | None = None
) -> np.ndarray:
    """Predicted labels ``(m,)`` int64 by k-NN over Hamming distances."""
    owner = "knn_classify"
    d = _check_distances(distances, owner)
    db_labels = _check_labels(db_labels, "db_labels", owner, n=d.shape[1], non_negative=True)
    if (radius is None) == (k is None):
        raise ValueError(
            f"{owner} takes exactly one of 'radius' (absolute threshold) and 'k' "
            f"(relative threshold). Got radius={radius!r}, k={k!r}."
        )
    if k is None:
        radius = check_int(radius, "radius", owner, low=0)
    else:
        k = check_int(k, "k", owner)
    classes, class_of = np.unique(db_labels, return_inverse=True)
    pred = np.empty(d.shape[0], dtype=np.int64)
    for rows in _query_blocks(*d.shape):
        block = d[rows]
        if k is None:
            threshold = np.full((block.shape[0], 1), radius)
        else:  # the distance of the k-th nearest non-empty bin (its largest if fewer)
            threshold = bin_threshold(block, k)[:, None]
        voter_class = np.where(block <= threshold, class_of[None, :], -1)
        winner = majority_vote(voter_class, block, classes.size)
        pred[rows] = np.where(winner >= 0, classes[winner], -1)
    return pred


@_document(_KNN_CONVENTIONS)
def knn_classification_error(
    distances: np.ndarray,
    db_labels: np.ndarray,
    query_labels: np.ndarray,
    radius: int | None = None,
    k: int | None = None,
) -> float:
    """Fraction of queries whose :func:`knn_classify` label is wrong (or missing)."""
    pred = knn_classify(distances, db_labels, radius=radius, k=k)
    query_labels = _check_labels(
        query_labels, "query_labels", "knn_classification_error", n=pred.shape[0], non_negative=True
    )
    return float(np.mean(pred != query_labels))


def knn_classify_exact(
    X_db: Any, db_labels: np.ndarray, X_query: Any, k: int, metric: str = "euclidean"
) -> np.ndarray:
    """Reference k-NN classifier on the exact metric (Jain, Kulis & Grauman, Sec. 4).

    The ``k`` nearest by :func:`exact_knn` (ties by smaller index) vote; a tie between
    classes goes to the class whose nearest voter is closest, then to the smaller label.
    Returns int64 labels ``(m,)``.
    """
    owner = "knn_classify_exact"
    D, ids = exact_knn(X_db, X_query, k, metric=metric)
    db_labels = _check_labels(db_labels, "db_labels", owner, n=X_db.shape[0], non_negative=True)
    classes, class_of = np.unique(db_labels, return_inverse=True)
    voter_class = np.where(ids >= 0, class_of[np.maximum(ids, 0)], -1)
    closeness = -D if metric == "inner_product" else D
    return classes[majority_vote(voter_class, closeness, classes.size)]


def fraction_searched(n_candidates: np.ndarray, n_db: int) -> float:
    """Mean over queries of the fraction of the database each query touched (Jain et al.).

    ``n_candidates`` ``(m,)`` ints in ``[0, n_db]``: items each query's search examined.
    """
    owner = "fraction_searched"
    n_db = check_int(n_db, "n_db", owner)
    n_candidates = _check_labels(n_candidates, "n_candidates", owner, non_negative=True)
    if n_candidates.size == 0 or n_candidates.max() > n_db:
        raise ValueError(
            f"n_candidates of {owner} must be non-empty with values in "
            f"[0, {n_db}]. Got shape {n_candidates.shape}, max "
            f"{n_candidates.max(initial=0)}."
        )
    return float(n_candidates.mean() / n_db)


def bin_threshold(distances: np.ndarray, n_bins: int) -> np.ndarray:
    """Per row, the distance of its ``n_bins``-th nearest non-empty bin (its largest if fewer).

    The relative threshold of the LambdaRank bit-vectors paper (Sec. 3.5.2): the items at distance
    ``<= bin_threshold`` are those in the ``n_bins`` nearest non-empty Hamming bins, ties kept.
    ``distances`` ``(m, n)`` non-negative ints; negative entries (padding) are ignored.
    Returns int64 ``(m,)`` (``-1`` for a row without any entry).
    """
    owner = "bin_threshold"
    d = _check_int_array(distances, "distances", owner, ndim=2)
    n_bins = check_int(n_bins, "n_bins", owner)
    out = np.full(d.shape[0], -1, np.int64)
    for rows in _query_blocks(*d.shape):
        s = np.sort(d[rows], axis=1).astype(np.int64, copy=False)  # unsigned input too
        valid = s >= 0
        new_bin = valid.copy()
        new_bin[:, 1:] &= s[:, 1:] != s[:, :-1]
        rank = np.cumsum(new_bin, axis=1)
        out[rows] = np.where(valid & (rank <= n_bins), s, -1).max(axis=1, initial=-1)
    return out


def hamming_neighbors(
    distances: np.ndarray, *, radius: int | None = None, n_bins: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Neighbours selected by an absolute or a relative Hamming threshold, ties kept.

    LambdaRank bit-vectors paper, Sec. 3.5.2: ``radius`` (absolute threshold) selects every item
    at distance ``<= radius`` (possibly none); ``n_bins`` (relative threshold ``k``) selects the
    items in the ``n_bins`` nearest non-empty distance bins (never empty unless the database
    is). Exactly one of the two. ``distances`` ``(m, n)``: query-by-database Hamming
    distances. Returns ``(lims, D, I)`` in CSR form (query ``i``: ``I[lims[i]:lims[i+1]]``),
    sorted by (distance, column index).
    """
    owner = "hamming_neighbors"
    d = _check_distances(distances, owner)
    if (radius is None) == (n_bins is None):
        raise ValueError(
            f"{owner} takes exactly one of 'radius' (absolute threshold) and "
            f"'n_bins' (relative threshold). Got radius={radius!r}, "
            f"n_bins={n_bins!r}."
        )
    if n_bins is None:
        threshold = np.full(d.shape[0], check_int(radius, "radius", owner, low=0))
    else:
        threshold = bin_threshold(d, n_bins)
    keep = d <= threshold[:, None]
    lims = np.zeros(d.shape[0] + 1, np.int64)
    np.cumsum(keep.sum(axis=1), out=lims[1:])
    rows, cols = np.nonzero(keep)
    order = np.lexsort((cols, d[rows, cols], rows))
    rows, cols = rows[order], cols[order]
    return lims, d[rows, cols].astype(np.int32), cols.astype(np.int64)


@_document("""

    Exactly one of ``radius`` / ``k`` (see :func:`knn_classify`). Every selected neighbour
    counts once (ties kept, unweighted mean), as in the regression score of
    the LambdaRank bit-vectors paper, eq. 11; a query with no neighbour (absolute threshold)
    predicts ``nan``.
""")
def knn_regress(
    distances: np.ndarray, db_targets: np.ndarray, radius: int | None = None, k: int | None = None
) -> np.ndarray:
    """k-NN regression: the mean target of the selected neighbours, ``(m,)`` float64."""
    owner = "knn_regress"
    d = _check_distances(distances, owner)
    targets = np.asarray(db_targets, dtype=np.float64)
    if targets.shape != (d.shape[1],) or not np.all(np.isfinite(targets)):
        raise ValueError(
            f"db_targets of {owner} must be {d.shape[1]} finite numbers, one per "
            f"database item. Got shape {targets.shape}."
        )
    if (radius is None) == (k is None):
        raise ValueError(
            f"{owner} takes exactly one of 'radius' (absolute threshold) and 'k' "
            f"(relative threshold). Got radius={radius!r}, k={k!r}."
        )
    if radius is not None:
        threshold = np.full(d.shape[0], check_int(radius, "radius", owner, low=0))
    else:
        threshold = bin_threshold(d, check_int(k, "k", owner))
    keep = d <= threshold[:, None]
    count = keep.sum(axis=1)
    total = np.where(keep, targets[None, :], 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)

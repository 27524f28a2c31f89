"""Exact ground truth: brute-force nearest neighbours (:func:`exact_knn`, whose home is
:mod:`hashlearn._utils.knn`, below the learners that use it too) and relevance matrices."""

from __future__ import annotations

import numpy as np

from hashlearn._utils.knn import exact_knn
from hashlearn._utils.validation import check_int
from hashlearn.evaluate._common import _check_id_lists, _check_labels

__all__ = ["exact_knn", "relevance_from_labels", "relevance_from_neighbors"]


def relevance_from_labels(query_labels: np.ndarray, db_labels: np.ndarray) -> np.ndarray:
    """``relevant[i, j] = query_labels[i] == db_labels[j]``: bool ``(m, n_db)``."""
    q = _check_labels(query_labels, "query_labels", "relevance_from_labels")
    db = _check_labels(db_labels, "db_labels", "relevance_from_labels")
    return q[:, None] == db[None, :]


def relevance_from_neighbors(neighbor_ids: np.ndarray, n_db: int) -> np.ndarray:
    """Bool ``(m, n_db)`` marking each query's listed neighbours (e.g. ``exact_knn``'s ids).

    ``-1`` entries (padding) are ignored.
    """
    owner = "relevance_from_neighbors"
    n_db = check_int(n_db, "n_db", owner)
    ids = _check_id_lists(neighbor_ids, "neighbor_ids", owner, n_db=n_db)
    relevant = np.zeros((ids.shape[0], n_db), dtype=bool)
    rows, cols = np.nonzero(ids >= 0)
    relevant[rows, ids[rows, cols]] = True
    return relevant

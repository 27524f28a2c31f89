"""Exact ground truth: brute-force nearest neighbours and relevance matrices."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.utils.extmath import row_norms, safe_sparse_dot

from hashlearn._utils.validation import check_int
from hashlearn.evaluate._common import (
    _METRICS,
    _check_choice,
    _check_data,
    _check_id_lists,
    _check_labels,
    _query_blocks,
    _rank,
)


def _metric_keys(Q: Any, X_db: Any, db_sq: np.ndarray, metric: str) -> np.ndarray:
    """Ascending ranking keys ``(n_q, n_db)``: squared distance, 1 - cos or -inner product."""
    keys = np.asarray(safe_sparse_dot(Q, X_db.T, dense_output=True), dtype=np.float64)
    if metric == "inner_product":
        return np.negative(keys, out=keys)
    q_sq = row_norms(Q, squared=True)
    if metric == "cosine":
        keys /= np.sqrt(q_sq)[:, None]
        keys /= np.sqrt(db_sq)[None, :]
        return np.clip(1.0 - keys, 0.0, 2.0, out=keys)
    keys *= -2.0
    keys += q_sq[:, None]
    keys += db_sq[None, :]
    return np.maximum(keys, 0.0, out=keys)


def exact_knn(
    X_db: Any, X_query: Any, k: int, metric: str = "euclidean", batch_size: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Exact k nearest neighbours by blocked brute force: ``(D float32 (m, k), I int64 (m, k))``.

    Parameters
    ----------
    X_db, X_query : float32/float64 ndarray or scipy.sparse matrix, ``(n_db, d)`` / ``(m, d)``
        Computed in float64 through dot products (integer-valued data tie exactly under the
        Euclidean metrics and the inner product).
    k : int >= 1
        Neighbours per query. If ``k > n_db`` the tail is padded with id ``-1`` and distance
        ``+inf`` (``-inf`` for ``"inner_product"``, the worst score).
    metric : {"euclidean", "sqeuclidean", "cosine", "inner_product"}
        ``"cosine"`` is ``1 - cos`` (zero vectors are an error). All are ascending distances
        except ``"inner_product"``, a similarity returned in *descending* order.
    batch_size : int or None
        Queries per block; temporary memory is about ``20 * batch_size * n_db`` bytes.
        ``None`` picks blocks of about 4M query--item pairs (~80 MB).

    Ties are broken by the smaller database index, exactly (not by argsort's whim).
    """
    owner = "exact_knn"
    X_db = _check_data(X_db, "X_db", owner)
    X_query = _check_data(X_query, "X_query", owner)
    if X_db.shape[0] == 0:
        raise ValueError(f"X_db of {owner} must contain at least one row. Got shape {X_db.shape}.")
    if X_query.shape[1] != X_db.shape[1]:
        raise ValueError(
            f"X_query of {owner} must have {X_db.shape[1]} features like X_db. "
            f"Got {X_query.shape[1]} instead."
        )
    k = check_int(k, "k", owner)
    if batch_size is not None:
        batch_size = check_int(batch_size, "batch_size", owner)
    metric = _check_choice(metric, "metric", owner, _METRICS)
    db_sq = row_norms(X_db, squared=True)
    if metric == "cosine":
        for name, sq in (("X_db", db_sq), ("X_query", row_norms(X_query, squared=True))):
            if np.any(sq == 0):
                raise ValueError(
                    f"{name} of {owner} has an all-zero row (row "
                    f"{int(np.argmax(sq == 0))}); its cosine is undefined."
                )
    m, kk = X_query.shape[0], min(k, X_db.shape[0])
    D = np.full((m, k), -np.inf if metric == "inner_product" else np.inf, dtype=np.float32)
    ids = np.full((m, k), -1, dtype=np.int64)
    for rows in _query_blocks(m, X_db.shape[0], batch_size):
        keys = _metric_keys(X_query[rows], X_db, db_sq, metric)
        idx = _rank(keys, kk)
        top = np.take_along_axis(keys, idx, axis=1)
        if metric == "euclidean":
            top = np.sqrt(top)
        elif metric == "inner_product":
            top = -top
        ids[rows, :kk] = idx
        D[rows, :kk] = top
    return D, ids


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

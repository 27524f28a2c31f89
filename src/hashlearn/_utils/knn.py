"""Exact k nearest neighbours by blocked brute force, and the pieces it is made of.

A primitive (layer 1 of ``docs/design.md``): learners use it for their training neighbours
(:class:`hashlearn.hashers.RankHashing`) and :mod:`hashlearn.evaluate` for the ground truth;
the checks, query blocking and tie-aware ranking are shared with every measure there.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.utils.extmath import row_norms, safe_sparse_dot

from hashlearn._utils.validation import check_int

__all__ = ["exact_knn"]

_METRICS = ("euclidean", "sqeuclidean", "cosine", "inner_product")
# Query blocks of about this many (query, item) pairs bound temporary memory.
_BLOCK_PAIRS = 1 << 22


def _check_choice(value: Any, name: str, owner: str, options: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in options:
        raise ValueError(
            f"The {name!r} parameter of {owner} must be a str among {list(options)}. "
            f"Got {value!r} instead."
        )
    return value


def _check_data(X: Any, name: str, owner: str) -> np.ndarray | sp.csr_matrix:
    """A finite 2-D float array or scipy.sparse matrix, converted to float64 (documented)."""
    if sp.issparse(X):
        X = sp.csr_matrix(X)
        values = X.data
    elif isinstance(X, np.ndarray):
        values = X
    else:
        raise TypeError(
            f"{name} of {owner} must be a numpy.ndarray or a scipy.sparse matrix. "
            f"Got {type(X).__name__} instead."
        )
    if X.dtype not in (np.float32, np.float64):
        raise TypeError(
            f"{name} of {owner} must have dtype float32 or float64. Got dtype "
            f"{X.dtype} instead; convert explicitly, e.g. X.astype(np.float32)."
        )
    if X.ndim != 2:
        raise ValueError(f"{name} of {owner} must be a 2-D array. Got shape {X.shape} instead.")
    if not np.isfinite(values).all():
        raise ValueError(f"{name} of {owner} contains NaN or infinity.")
    return X.astype(np.float64, copy=False)


def _query_blocks(n_queries: int, n_db: int, rows: int | None = None) -> Iterator[slice]:
    rows = rows or max(1, _BLOCK_PAIRS // max(n_db, 1))
    for start in range(0, n_queries, rows):
        yield slice(start, min(start + rows, n_queries))


def _rank(keys: np.ndarray, k: int) -> np.ndarray:
    """Columns of the ``k`` smallest ``keys`` per row, ordered by ``(key, column)``.

    ``np.partition`` finds the k-th key; every key below it is kept and the ties *at* it are
    filled in column order, so the cut never drops a tied smaller index. The kept columns
    (ascending) are then stably sorted by key.
    """
    if k >= keys.shape[1]:
        return np.argsort(keys, axis=1, kind="stable")
    kth = np.partition(keys, k - 1, axis=1)[:, k - 1 : k]
    tied = keys == kth
    chosen = tied | (keys < kth)
    room = k - (chosen.sum(axis=1) - tied.sum(axis=1))
    crowded = np.flatnonzero(tied.sum(axis=1) > room)  # rows where some ties must go
    if crowded.size:
        t = tied[crowded]
        chosen[crowded] &= ~t | (np.cumsum(t, axis=1) <= room[crowded, None])
    cols = np.nonzero(chosen)[1].reshape(-1, k)
    order = np.argsort(np.take_along_axis(keys, cols, axis=1), axis=1, kind="stable")
    return np.take_along_axis(cols, order, axis=1)


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
        if not np.isfinite(keys).all():
            raise ValueError(
                f"The distances of {owner} overflow float64 (entries near 1e154 or larger); "
                "scale the data down."
            )
        idx = _rank(keys, kk)
        top = np.take_along_axis(keys, idx, axis=1)
        if metric == "euclidean":
            top = np.sqrt(top)
        elif metric == "inner_product":
            top = -top
        ids[rows, :kk] = idx
        D[rows, :kk] = top
    return D, ids

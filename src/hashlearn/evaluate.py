"""Ground truth and the evaluation measures of the papers.

Numbers published for hashing methods move with three choices that papers rarely state, so
every measure here states them:

* **Aggregation** -- pooled over all query--item pairs (the MLH evaluation code: one ratio of
  sums) or averaged per query (a mean of per-query ratios).
* **Empty retrieval** -- what a query that retrieves nothing (or has nothing relevant) scores.
  When *no* query qualifies for a mean, the mean is ``0.0``, never NaN.
* **Ties in Hamming rank** -- a Hamming distance takes only ``b + 1`` values, so many items
  tie. Rankings break ties by a rule: ``"random"`` (a seeded random key per query--item
  pair; the same ``random_state`` gives the same order), ``"index"`` (smaller
  database index first) or, for average precision, ``"pessimistic"`` / ``"optimistic"``.

Hamming distance matrices are ``(n_queries, n_db)`` integer arrays, e.g. from
:func:`hashlearn.codes.hamming_cdist`; relevance is a boolean matrix of the same shape, e.g.
from :func:`relevance_from_labels` or :func:`relevance_from_neighbors`. A radius means
distance ``<= r``, as in the papers.

Measures and their sources:

* precision / recall within Hamming radius ``R`` and the PR curve over ``R = 0..b``
  (Norouzi & Fleet, *Minimal Loss Hashing*, Sec. 6);
* recall of the true K nearest neighbours among the first ``M`` retrieved
  (Grauman & Fergus, *Learning binary hash codes*, Fig. 11);
* k-NN classification with an absolute radius or a relative threshold of the ``k`` nearest
  non-empty Hamming bins (*Learning bit vectors with LambdaRank*, Sec. 3);
* k-NN accuracy and the fraction of the database searched (Jain, Kulis & Grauman,
  *Fast image search for learned metrics*, Sec. 4);
* mean average precision over the Hamming ranking (common practice; ties bracketed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.utils import check_random_state
from sklearn.utils.extmath import row_norms, safe_sparse_dot

from hashlearn._validation import check_int

__all__ = [
    "exact_knn",
    "relevance_from_labels",
    "relevance_from_neighbors",
    "precision_recall_at_radius",
    "precision_recall_curve",
    "pr_auc",
    "hamming_ranking",
    "recall_at_m",
    "recall_at_m_from_ids",
    "mean_average_precision",
    "knn_classify",
    "knn_classification_error",
    "hamming_neighbors",
    "knn_regress",
    "bin_threshold",
    "knn_classify_exact",
    "fraction_searched",
]

_METRICS = ("euclidean", "sqeuclidean", "cosine", "inner_product")
_AGGREGATES = ("pooled", "per_query")
_EMPTY = ("zero", "skip")
_RANK_TIES = ("random", "index")
_AP_TIES = ("random", "index", "pessimistic", "optimistic")
# Query blocks of about this many (query, item) pairs bound temporary memory.
_BLOCK_PAIRS = 1 << 22


# ----------------------------------------------------------------------------- validation


def _check_choice(value: Any, name: str, owner: str, options: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in options:
        raise ValueError(
            f"The {name!r} parameter of {owner} must be a str among {list(options)}. "
            f"Got {value!r} instead."
        )
    return value


def _check_int_array(arr: Any, name: str, owner: str, ndim: int) -> np.ndarray:
    """An integer ``np.ndarray`` with ``ndim`` dimensions (bool is not an integer here)."""
    if not isinstance(arr, np.ndarray):
        raise TypeError(
            f"{name} of {owner} must be a numpy.ndarray. Got {type(arr).__name__} instead."
        )
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(
            f"{name} of {owner} must have an integer dtype. Got dtype {arr.dtype} instead."
        )
    if arr.ndim != ndim:
        raise ValueError(
            f"{name} of {owner} must be a {ndim}-D array. Got shape {arr.shape} instead."
        )
    return arr


def _check_distances(distances: Any, owner: str, n_bits: int | None = None) -> np.ndarray:
    """A non-empty ``(n_queries, n_db)`` matrix of non-negative integer (Hamming) distances."""
    d = _check_int_array(distances, "distances", owner, 2)
    if d.shape[0] == 0 or d.shape[1] == 0:
        raise ValueError(
            f"distances of {owner} must have at least one query and one database "
            f"item. Got shape {d.shape} instead."
        )
    if d.min() < 0 or d.max() >= 2**31:
        raise ValueError(
            f"distances of {owner} must be in [0, 2**31) (Hamming distances). "
            f"Got values in [{d.min()}, {d.max()}]."
        )
    if n_bits is not None and d.max() > n_bits:
        raise ValueError(
            f"distances of {owner} must be at most n_bits={n_bits}. Got max {d.max()}."
        )
    return d


def _check_relevant(relevant: Any, shape: tuple[int, ...], owner: str) -> np.ndarray:
    if not isinstance(relevant, np.ndarray) or relevant.dtype != np.bool_:
        got = relevant.dtype if isinstance(relevant, np.ndarray) else type(relevant).__name__
        raise TypeError(
            f"relevant of {owner} must be a numpy.ndarray of dtype bool. Got {got} instead."
        )
    if relevant.shape != shape:
        raise ValueError(
            f"relevant of {owner} must have the shape of distances {shape}. "
            f"Got shape {relevant.shape} instead."
        )
    return relevant


def _check_labels(
    labels: Any, name: str, owner: str, n: int | None = None, non_negative: bool = False
) -> np.ndarray:
    arr = _check_int_array(labels, name, owner, 1)
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"{name} of {owner} must have length {n}. Got {arr.shape[0]} instead.")
    if non_negative and arr.size and arr.min() < 0:
        raise ValueError(f"{name} of {owner} must be non-negative. Got min {arr.min()}.")
    return arr


def _check_id_lists(
    ids: Any, name: str, owner: str, n_rows: int | None = None, n_db: int | None = None
) -> np.ndarray:
    """Rows of database ids, ``-1`` for padding; no id repeated within a row."""
    arr = _check_int_array(ids, name, owner, 2)
    if n_rows is not None and arr.shape[0] != n_rows:
        raise ValueError(
            f"{name} of {owner} must have {n_rows} rows (one per query). "
            f"Got shape {arr.shape} instead."
        )
    if arr.size and arr.min() < -1:
        raise ValueError(
            f"{name} of {owner} must hold ids >= 0, or -1 for padding. Got min {arr.min()}."
        )
    if n_db is not None and arr.size and arr.max() >= n_db:
        raise ValueError(f"{name} of {owner} must hold ids < n_db={n_db}. Got max {arr.max()}.")
    s = np.sort(arr, axis=1)
    if np.any((s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)):
        raise ValueError(f"{name} of {owner} repeats an id within a row.")
    return arr


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


def _document(conventions: str) -> Callable[[Any], Any]:
    """Append a shared conventions paragraph to a docstring (kept working under ``-OO``)."""

    def decorate(func: Any) -> Any:
        if func.__doc__ is not None:
            func.__doc__ += conventions
        return func

    return decorate


def _safe_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``num / den`` with 0 where ``den == 0``."""
    num, den = np.broadcast_arrays(np.asarray(num, dtype=np.float64), den)
    return np.divide(num, den, out=np.zeros(num.shape), where=den > 0)


# ------------------------------------------------------------------------------- ranking


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


def _hamming_order(
    d: np.ndarray, k: int, ties: str, rng: np.random.RandomState, relevant: np.ndarray | None = None
) -> np.ndarray:
    """First ``k`` database indices of a block of the Hamming ranking, ties broken by rule."""
    if ties == "index":
        return _rank(d, k)
    if ties == "random":  # rank by (distance, seeded random 31-bit key, index)
        noise = rng.randint(0, 2**31, size=d.shape, dtype=np.int64)
        return _rank((d.astype(np.int64) << 31) | noise, k)
    # pessimistic: irrelevant first within a distance; optimistic: relevant first.
    second = relevant if ties == "pessimistic" else ~relevant
    return _rank(2 * d.astype(np.int64) + second, k)


# -------------------------------------------------------------------------- ground truth


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


# ---------------------------------------------------------------- precision and recall


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
    d = _check_distances(distances, owner)
    rel = _check_relevant(relevant, d.shape, owner)
    radius = check_int(radius, "radius", owner, low=0)
    aggregate = _check_choice(aggregate, "aggregate", owner, _AGGREGATES)
    empty = _check_choice(empty, "empty", owner, _EMPTY)
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
    d = _check_distances(distances, owner, n_bits)
    rel = _check_relevant(relevant, d.shape, owner)
    aggregate = _check_choice(aggregate, "aggregate", owner, _AGGREGATES)
    empty = _check_choice(empty, "empty", owner, _EMPTY)
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


# ------------------------------------------------------------------- ranking measures


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
    m_values = _check_m_values(m_values, owner)
    ranking = hamming_ranking(d, int(min(m_values.max(), d.shape[1])), random_state, ties)
    return _recall_at_m(ranking, true_neighbors, m_values)


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


# ------------------------------------------------------------------ k-NN classification


def _majority_vote(voter_class: np.ndarray, voter_dist: np.ndarray, n_classes: int) -> np.ndarray:
    """Class index per row by majority vote; ``-1`` where a row has no voter.

    ``voter_class`` ``(b, L)`` holds class indices (``-1`` = not a voter). Ties between classes
    go to the class whose nearest voter is closest, then to the smaller class index.
    """
    b = voter_class.shape[0]
    valid = voter_class >= 0
    slot = (voter_class + n_classes * np.arange(b)[:, None])[valid]
    votes = np.bincount(slot, minlength=b * n_classes).reshape(b, n_classes)
    nearest = np.full(b * n_classes, np.inf)
    np.minimum.at(nearest, slot, voter_dist[valid].astype(np.float64))
    nearest = nearest.reshape(b, n_classes)
    candidate = votes == votes.max(axis=1, keepdims=True)
    near = np.where(candidate, nearest, np.inf)
    candidate &= near == near.min(axis=1, keepdims=True)
    return np.where(valid.any(axis=1), np.argmax(candidate, axis=1), -1)


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
    if radius is not None:
        radius = check_int(radius, "radius", owner, low=0)
    else:
        k = check_int(k, "k", owner)
    classes, class_of = np.unique(db_labels, return_inverse=True)
    pred = np.empty(d.shape[0], dtype=np.int64)
    for rows in _query_blocks(*d.shape):
        block = d[rows]
        if radius is not None:
            threshold = np.full((block.shape[0], 1), radius)
        else:  # the k-th smallest distinct distance of each row (its largest if fewer)
            s = np.sort(block, axis=1)
            new_bin = np.concatenate(
                (np.ones((s.shape[0], 1), bool), s[:, 1:] != s[:, :-1]), axis=1
            )
            threshold = np.where(np.cumsum(new_bin, axis=1) <= k, s, -1).max(axis=1)[:, None]
        voter_class = np.where(block <= threshold, class_of[None, :], -1)
        winner = _majority_vote(voter_class, block, classes.size)
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
    return classes[_majority_vote(voter_class, closeness, classes.size)]


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


# ------------------------------------------------ neighbour selection by Hamming thresholds


def bin_threshold(distances: np.ndarray, n_bins: int) -> np.ndarray:
    """Per row, the distance of its ``n_bins``-th nearest non-empty bin (its largest if fewer).

    The relative threshold of lambdarank-bit-vectors.txt, Sec. 3.5.2: the items at distance
    ``<= bin_threshold`` are those in the ``n_bins`` nearest non-empty Hamming bins, ties kept.
    ``distances`` ``(m, n)`` non-negative ints; negative entries (padding) are ignored.
    Returns int64 ``(m,)`` (``-1`` for a row without any entry).
    """
    owner = "bin_threshold"
    d = _check_int_array(distances, "distances", owner, ndim=2)
    n_bins = check_int(n_bins, "n_bins", owner)
    out = np.full(d.shape[0], -1, np.int64)
    for rows in _query_blocks(*d.shape):
        s = np.sort(d[rows], axis=1)
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

    lambdarank-bit-vectors.txt, Sec. 3.5.2: ``radius`` (absolute threshold) selects every item
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
    if radius is not None:
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
    lambdarank-bit-vectors.txt, eq. 11; a query with no neighbour (absolute threshold)
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

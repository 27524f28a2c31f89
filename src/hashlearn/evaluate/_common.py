"""Argument checks and Hamming orders shared by every measure (choices, query blocks and
tie-aware ranking: :mod:`hashlearn._utils.knn`, shared with ``exact_knn``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hashlearn._utils.knn import _rank

_AGGREGATES = ("pooled", "per_query")
_EMPTY = ("zero", "skip")
_RANK_TIES = ("random", "index")
_AP_TIES = ("random", "index", "pessimistic", "optimistic")


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


def _document(conventions: str) -> Callable[[Any], Any]:
    """Append a shared conventions paragraph to a docstring (kept working under ``-OO``)."""

    def decorate(func: Any) -> Any:
        if func.__doc__ is not None:
            func.__doc__ += conventions
        return func

    return decorate


def _safe_ratio(num: Any, den: Any) -> np.ndarray:
    """``num / den`` with 0 where ``den == 0``."""
    num, den = np.broadcast_arrays(np.asarray(num, dtype=np.float64), den)
    return np.divide(num, den, out=np.zeros(num.shape), where=den > 0)


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
    if relevant is None:
        raise ValueError(f"ties={ties!r} needs the relevance of the items")
    second = relevant if ties == "pessimistic" else ~relevant
    return _rank(2 * d.astype(np.int64) + second, k)

"""Hash tables as sorted keys + CSR posting lists: the storage every table index shares.

A table maps int64 keys to posting lists of int64 ids::

    keys     (u,)    sorted, distinct
    offsets  (u+1,)  postings of keys[j] are ids[offsets[j]:offsets[j+1]], ids ascending
    ids      (n,)

No Python dict, no pickle: three flat arrays that save as ``.npy`` and memory-map. Used by
the inverted TableIndex (Li et al., *Learning to Search Efficiently in High Dimensions*, NIPS 2011), the Hamming-ball index (semantic
hashing, Grauman & Fergus, *Learning Binary Hash Codes for Large-Scale Image Search*, 2013 §2.2), multi-index hashing's substring tables and the
banded MinHash index. Lookups are a binary search (``find``, ``find_in`` on a slice), callable
from other kernels.
A table read from a file is checked by :func:`check_table` before any kernel uses it.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = [
    "build_table",
    "check_table",
    "find",
    "find_in",
    "find_many",
    "gathered_sizes",
    "posting_range",
    "merge_tables",
    "remove_from_table",
]


def build_table(keys: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(keys, offsets, ids)`` of the table holding ``ids[i]`` under ``keys[i]``."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if keys.shape != ids.shape or keys.ndim != 1:
        raise ValueError(
            f"keys and ids must be 1-d of the same length; got {keys.shape} and {ids.shape}."
        )
    order = np.lexsort((ids, keys))
    sorted_keys = keys[order]
    if len(sorted_keys):
        starts = np.flatnonzero(np.concatenate([[True], sorted_keys[1:] != sorted_keys[:-1]]))
    else:
        starts = np.zeros(0, np.int64)
    offsets = np.append(starts, len(sorted_keys)).astype(np.int64)
    return sorted_keys[starts], offsets, ids[order]


def merge_tables(table_a, table_b) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One table holding the postings of both (for ``add`` to a built index)."""
    (ka, oa, ia), (kb, ob, ib) = table_a, table_b
    keys = np.concatenate([np.repeat(ka, np.diff(oa)), np.repeat(kb, np.diff(ob))])
    return build_table(keys, np.concatenate([ia, ib]))


def remove_from_table(table, drop_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The table without the postings of ``drop_ids`` (keys left empty are dropped)."""
    keys, offsets, ids = table
    keep = ~np.isin(ids, drop_ids)
    return build_table(np.repeat(keys, np.diff(offsets))[keep], ids[keep])


@numba.njit(cache=True, nogil=True, inline="always")
def find_in(keys: np.ndarray, lo: int, hi: int, key: int) -> int:
    """Position of ``key`` in the sorted slice ``keys[lo:hi]``, or -1 (binary search).

    The one binary search of the package's kernels: a table of a multi-table index is a
    slice of one key array, so lookups take the slice bounds.
    """
    stop = hi
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    if lo < stop and keys[lo] == key:
        return lo
    return -1


@numba.njit(cache=True, nogil=True, inline="always")
def find(keys: np.ndarray, key: int) -> int:
    """Position of ``key`` in the sorted ``keys``, or -1 (binary search)."""
    return find_in(keys, 0, keys.shape[0], key)


@numba.njit(cache=True, nogil=True, inline="always")
def posting_range(table_keys, table_ptr, offsets, t, key) -> tuple[np.int64, np.int64]:
    """``(start, stop)`` of the postings of ``key`` in table ``t`` of tables packed into one
    array (table ``t`` is ``table_keys[table_ptr[t]:table_ptr[t+1]]``, its postings indexed
    by ``offsets``); ``(0, 0)`` when the key is absent."""
    a = find_in(table_keys, table_ptr[t], table_ptr[t + 1], key)
    if a < 0:
        return np.int64(0), np.int64(0)
    return offsets[a], offsets[a + 1]


@numba.njit(cache=True, nogil=True)
def gathered_sizes(query_keys, table_keys, table_ptr, offsets, sizes) -> None:
    """``sizes[q]``: the summed length of the posting lists of query ``q``'s keys, one key
    per table (``query_keys`` (m, L), tables packed as in :func:`posting_range`): the room
    its gathered candidates need."""
    for q in range(query_keys.shape[0]):
        total = 0
        for t in range(query_keys.shape[1]):
            start, stop = posting_range(table_keys, table_ptr, offsets, t, query_keys[q, t])
            total += stop - start
        sizes[q] = total


def find_many(keys: np.ndarray, query_keys: np.ndarray) -> np.ndarray:
    """Positions of many keys (any shape) in the sorted ``keys``, -1 where absent."""
    query_keys = np.asarray(query_keys, dtype=np.int64)
    pos = np.searchsorted(keys, query_keys)
    found = np.zeros(query_keys.shape, bool)
    inside = pos < len(keys)
    found[inside] = keys[pos[inside]] == query_keys[inside]
    return np.where(found, pos, -1)


_TABLE_ERRORS = {
    1: "offsets do not start at 0 and end at the number of postings",
    2: "offsets are not strictly increasing (an empty or negative posting list)",
    3: "keys are not strictly ascending",
    4: "the number of postings is not the number of items",
    5: "a posting is outside [0, n)",
    6: "an item is posted twice",
}


@numba.njit(cache=True, nogil=True)
def _table_error(keys, offsets, ids, n, positions):
    u = keys.shape[0]
    if offsets[0] != 0 or offsets[u] != ids.shape[0]:
        return 1
    for j in range(u):
        if offsets[j + 1] <= offsets[j]:
            return 2
        if j > 0 and keys[j] <= keys[j - 1]:
            return 3
    if positions:
        if ids.shape[0] != n:
            return 4
        mark = np.zeros(n, np.bool_)
        for i in range(ids.shape[0]):
            p = ids[i]
            if p < 0 or p >= n:
                return 5
            if mark[p]:
                return 6
            mark[p] = True
    return 0


def check_table(
    keys: np.ndarray,
    offsets: np.ndarray,
    ids: np.ndarray,
    n: int = 0,
    *,
    positions: bool = False,
    what: str = "the table",
) -> None:
    """Raise ``ValueError`` unless ``(keys, offsets, ids)`` is a table as
    :func:`build_table` makes it: keys strictly ascending, offsets from 0 to ``len(ids)``
    and strictly increasing (no empty posting list). With ``positions`` the ids are the
    positions ``0..n-1`` of ``n`` items, each exactly once. O(len(ids)); 1-D integer arrays
    expected (the caller checks dtypes).
    """
    if keys.ndim != 1 or offsets.ndim != 1 or ids.ndim != 1 or len(offsets) != len(keys) + 1:
        raise ValueError(
            f"{what} is corrupted: {len(keys)} keys need {len(keys) + 1} offsets, got "
            f"{len(offsets)}"
        )
    error = _table_error(keys, offsets, ids, int(n), bool(positions))
    if error:
        raise ValueError(f"{what} is corrupted: {_TABLE_ERRORS[error]}")

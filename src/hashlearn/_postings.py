"""Hash tables as sorted keys + CSR posting lists: the storage every table index shares.

A table maps int64 keys to posting lists of int64 ids::

    keys     (u,)    sorted, distinct
    offsets  (u+1,)  postings of keys[j] are ids[offsets[j]:offsets[j+1]], ids ascending
    ids      (n,)

No Python dict, no pickle: three flat arrays that save as ``.npy`` and memory-map. Used by
the inverted TableIndex (boosted-search-forest.txt), the Hamming-ball index (semantic
hashing, binary-codes-survey.txt §2.2), multi-index hashing's substring tables and the
banded MinHash index. Lookups are a binary search (``find``), callable from other kernels.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["build_table", "find", "find_many", "merge_tables", "remove_from_table"]


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
def find(keys: np.ndarray, key: np.int64) -> np.int64:
    """Position of ``key`` in the sorted ``keys``, or -1 (binary search)."""
    lo, hi = 0, keys.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    if lo < keys.shape[0] and keys[lo] == key:
        return lo
    return -1


def find_many(keys: np.ndarray, query_keys: np.ndarray) -> np.ndarray:
    """Positions of many keys (any shape) in the sorted ``keys``, -1 where absent."""
    query_keys = np.asarray(query_keys, dtype=np.int64)
    pos = np.searchsorted(keys, query_keys)
    found = np.zeros(query_keys.shape, bool)
    inside = pos < len(keys)
    found[inside] = keys[pos[inside]] == query_keys[inside]
    return np.where(found, pos, -1)

"""Banded LSH index over Min-Hash signatures (Grauman & Fergus, *Learning Binary Hash Codes for Large-Scale Image Search*, 2013 §2.3 and §4.1).

A signature of ``bands * rows`` Min-Hash values is cut into ``bands`` bands of ``rows``
consecutive values; each band is hashed to one int64 key and stored in its own hash table.
Two sets with Jaccard similarity :math:`J` share a band key with probability :math:`J^r`,
and collide in at least one of the ``b`` bands with probability

.. math::

    P(J) = 1 - (1 - J^r)^b,

the S-curve that turns a similarity threshold near :math:`(1/b)^{1/r}` into a sharp
candidate filter. Candidates are reported with their band-collision counts, most
collisions first; re-rank them with the estimated or exact Jaccard similarity.

Storage: the tables are a :class:`hashlearn.index.table.TableIndex` with ``bands`` tables
(sorted keys + CSR posting lists from :mod:`hashlearn._utils.postings`), so the index saves as
plain ``.npy`` arrays and loads memory-mapped. Band keys are a 64-bit polynomial hash of the
band's values; two different bands share a key with probability about :math:`2^{-63}`.
"""

from __future__ import annotations

import numba
import numpy as np

from hashlearn._utils.validation import as_plain_array, check_int
from hashlearn.index._storage import IdStore
from hashlearn.index.base import IndexBase
from hashlearn.index.table import TableIndex
from hashlearn.io import persistable

__all__ = ["MinHashLSHIndex", "band_collision_probability"]


def band_collision_probability(jaccard, bands: int, rows: int):
    """:math:`1 - (1 - J^r)^b`: probability that two sets collide in at least one band."""
    return 1.0 - (1.0 - np.asarray(jaccard, dtype=np.float64) ** rows) ** bands


@numba.njit(cache=True, nogil=True)
def _band_keys(signatures, bands, rows, out):
    """out[i, b] = 64-bit hash of signatures[i, b*rows:(b+1)*rows] (splitmix-style chain)."""
    for i in range(signatures.shape[0]):
        for b in range(bands):
            h = np.uint64(0x243F6A8885A308D3) + np.uint64(b) * np.uint64(0x9E3779B97F4A7C15)
            for r in range(rows):
                h ^= np.uint64(signatures[i, b * rows + r])
                h *= np.uint64(0xBF58476D1CE4E5B9)
                h ^= h >> np.uint64(31)
                h *= np.uint64(0x94D049BB133111EB)
                h ^= h >> np.uint64(29)
            out[i, b] = np.int64(h >> np.uint64(1))  # non-negative int64


@persistable
class MinHashLSHIndex(IndexBase):
    """Banded LSH tables over Min-Hash signatures; reports candidates by band collisions.

    Parameters
    ----------
    bands : int
        Number of hash tables ``b``.
    rows : int
        Signature values per band ``r``; signatures must have ``bands * rows`` columns
        (e.g. ``MinHash(n_hashes=bands * rows)``).

    Examples
    --------
    >>> from hashlearn.hashers.minhash import MinHash
    >>> sets = [{1, 2, 3, 4}, {1, 2, 3, 5}, {7, 8, 9}]
    >>> mh = MinHash(n_hashes=32, random_state=0).fit(sets)
    >>> index = MinHashLSHIndex(bands=16, rows=2)
    >>> index.add(mh.transform(sets)).tolist()
    [0, 1, 2]
    >>> ids, counts = index.candidates(mh.transform([{1, 2, 3, 4}]))[0]
    >>> int(ids[0])
    0
    """

    def __init__(self, bands: int, rows: int):
        self.bands = check_int(bands, "bands", "MinHashLSHIndex")
        self.rows = check_int(rows, "rows", "MinHashLSHIndex")
        self._tables = TableIndex(self.bands)

    @property
    def n_hashes(self) -> int:
        """Signature length ``bands * rows`` the index expects."""
        return self.bands * self.rows

    @property
    def _store(self) -> IdStore:  # type: ignore[override]  # IndexBase declares an attribute
        return self._tables.store

    def __repr__(self) -> str:
        return f"MinHashLSHIndex(bands={self.bands}, rows={self.rows}, ntotal={len(self)})"

    def band_keys(self, signatures) -> np.ndarray:
        """``int64 (n, bands)``: the hash-table key of every band of every signature."""
        sig = np.asarray(as_plain_array(signatures, "signatures"))
        if sig.ndim != 2 or sig.shape[1] != self.n_hashes:
            raise ValueError(
                f"signatures must have shape (n, {self.n_hashes}) = (n, bands * "
                f"rows). Got shape {sig.shape}."
            )
        if sig.size and not np.issubdtype(sig.dtype, np.integer):
            raise TypeError(f"signatures must be integer Min-Hash values. Got dtype {sig.dtype}.")
        sig = np.ascontiguousarray(sig, dtype=np.int64)
        out = np.empty((sig.shape[0], self.bands), dtype=np.int64)
        _band_keys(sig, self.bands, self.rows, out)
        return out

    def add(self, signatures, ids=None) -> np.ndarray:
        """Insert signatures (ids: distinct non-negative ints, default consecutive)."""
        return self._tables.add(self.band_keys(signatures), ids)

    def remove(self, ids, *, missing: str = "raise") -> int:
        """Remove ids (never renumbers the others); returns how many were removed."""
        return self._tables.remove(ids, missing=missing)

    def candidates(self, signatures, min_count: int = 1, *, n_threads: int | None = None):
        """Per query ``(ids int64, band collision counts)``, most collisions first, then id.

        An item is a candidate when it shares at least ``min_count`` band keys with the
        query (``min_count=1``: the classic OR over bands).
        """
        return self._tables.candidates(self.band_keys(signatures), min_count, n_threads=n_threads)

    def _get_state(self):
        params, state, arrays = self._tables._get_state()
        return {"bands": self.bands, "rows": self.rows}, state, arrays

    @classmethod
    def _from_state(cls, params, state, arrays):
        obj = cls(params["bands"], params["rows"])
        obj._tables = TableIndex._from_state({"n_tables": obj.bands}, state, arrays)
        return obj

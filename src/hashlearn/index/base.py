"""What every binary-code index shares: the faiss-like API, validation, ids, threads.

Conventions (all indexes):

* ``search(queries, k) -> (D, I)``: ``D`` int32 Hamming distances and ``I`` int64 ids, both
  ``(m, k)``, sorted by (distance, id); fewer than ``k`` results pad with ``-1`` / ``-1``.
* ``range_search(queries, radius) -> (lims, D, I)`` in CSR form, like faiss: the results of
  query ``i`` are ``D[lims[i]:lims[i+1]]``. **Radius means distance <= radius**, as in the
  papers; faiss's ``range_search`` means ``< radius``, so pass ``radius - 1`` here for the
  same results.
* ``remove(ids)`` never renumbers the remaining ids (faiss's flat index does).
* ids are distinct non-negative int64; ``add`` without ids numbers from one past the largest
  id ever added (a ``ValueError`` once that would pass ``2**63 - 1``).
* ids and codes live in an :class:`~hashlearn.index._storage.IdStore` (``index.store``)
  that publishes immutable snapshots: ``search``/``range_search`` may run in any number of
  threads while another thread calls ``add``/``remove``, and each search sees the index
  either before or after each write.
"""

from __future__ import annotations

import contextlib

import numpy as np

from hashlearn._utils.validation import check_codes, check_int, check_k
from hashlearn.codes import as_words, pack_bits
from hashlearn.index._asymmetric import SHORTLIST_FACTOR, check_projections, rerank_words
from hashlearn.index._storage import IdStore
from hashlearn.io import Persistable

__all__ = ["BinaryIndex", "IndexBase", "register_index", "make_index", "available_indexes"]

_INDEXES: dict[str, type[BinaryIndex]] = {}


def register_index(name: str):
    """Class decorator: make an index constructible as ``make_index(name, ...)``."""

    def decorate(cls):
        _INDEXES[name] = cls
        cls.registry_name = name
        return cls

    return decorate


def make_index(name: str, n_bits: int, **params) -> BinaryIndex:
    """Build an index by registry name, e.g. ``make_index("flat", n_bits=64)``."""
    try:
        cls = _INDEXES[name]
    except KeyError:
        raise ValueError(f"Unknown index {name!r}; available: {sorted(_INDEXES)}.") from None
    return cls(n_bits, **params)


def available_indexes() -> list[str]:
    """Registry names accepted by :func:`make_index`."""
    return sorted(_INDEXES)


class IndexBase(Persistable):
    """What every index shares: ids and rows held in an :class:`IdStore`."""

    _store: IdStore

    def __len__(self) -> int:
        return len(self._store)

    @property
    def store(self) -> IdStore:
        """The ids and aligned rows (:class:`~hashlearn.index._storage.IdStore`); read
        ``store.snapshot`` for one consistent view while other threads write."""
        return self._store

    @property
    def ids(self) -> np.ndarray:
        """Ids of the stored items, ascending (read-only)."""
        return self._store.snapshot.ids


class BinaryIndex(IndexBase):
    """Base class of indexes over packed binary codes of ``n_bits`` bits."""

    registry_name = ""

    def __init__(self, n_bits: int):
        self.n_bits = check_int(n_bits, "n_bits", type(self).__name__)
        self._n_words = max(1, -(-self.n_bits // 64))
        self._store = IdStore({"words": ((self._n_words,), np.uint64)}, type(self).__name__)

    @property
    def code_size(self) -> int:
        """Bytes per packed code."""
        return (self.n_bits + 7) // 8

    # subclasses provide: add, search, range_search, remove, _get_state, _from_state, and
    # an IdStore in self._store whose rows hold the codes as "words".

    @property
    def codes(self) -> np.ndarray:
        """Stored codes as ``uint8 (n, code_size)``, in the order of :attr:`ids` (read-only)."""
        return self._words.view(np.uint8)[:, : self.code_size]

    @property
    def _words(self) -> np.ndarray:
        """Stored codes as ``uint64 (n, n_words)`` words (read-only)."""
        return self._store.snapshot.rows["words"]

    def add(self, codes: np.ndarray, ids=None) -> np.ndarray:
        """Add packed codes ``(n, ceil(n_bits/8))`` uint8 with optional distinct int ids.

        Without ``ids`` the codes are numbered from one past the largest id ever added
        (``ValueError`` once that would pass ``2**63 - 1``). Duplicate ids, or ids already in
        the index, raise ``ValueError``. Returns the ids of the added codes (int64, in the
        order of ``codes``). Safe while other threads search.
        """
        codes = self._check_codes(codes)
        words = as_words(codes).reshape(codes.shape[0], self._n_words)
        return self._store.add({"words": words}, ids)

    def remove(self, ids, *, missing: str = "raise") -> int:
        """Remove the codes with these ids; the other ids stay as they are.

        ``missing="raise"`` (default) refuses ids that are not in the index with a
        ``ValueError`` and removes nothing; ``missing="ignore"`` skips them. Returns the
        number of codes removed. Safe while other threads search.
        """
        return self._store.remove(ids, missing=missing)

    def search_asymmetric(
        self, projections, k: int, *, queries=None, n_threads: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best codes by asymmetric score ``s(q, x) = sum_j p_j (2 x_j - 1)``
        (Gordo, Perronnin, Gong & Lazebnik, *Asymmetric distances for binary embeddings*,
        TPAMI 2014) among each query's Hamming shortlist: the ``min(len(self), 4 k)``
        nearest codes by :meth:`search`, re-ranked by the queries' real-valued projections
        ``(m, n_bits)`` (a hasher's ``project(X)``).

        ``queries``: the queries' codes for the shortlist (default ``projections >= 0``
        packed; a hasher thresholding with ``> 0`` should pass its ``encode(X)``). Returns
        ``(S float32 (m, k), I int64 (m, k))``: scores largest first, ties to the smaller id,
        padded with ``-inf`` / ``-1``. :class:`~hashlearn.index.FlatIndex` scores every code
        instead. The shortlist and the codes it re-ranks come from one state of the index
        (a write in between: searched again; after three tries with writers held off).
        """
        owner = f"{type(self).__name__}.search_asymmetric"
        if type(self).codes is not BinaryIndex.codes:
            raise TypeError(
                f"{owner}: this index keeps its codes outside its IdStore; search "
                "asymmetrically with FlatIndex, MultiIndexHashing or HammingBallIndex."
            )
        P = check_projections(projections, self.n_bits, owner)
        m = len(P)
        k = check_k(k, m, owner, bytes_per_result=12)
        if queries is None:
            queries = pack_bits(P >= 0)
        queries = self._check_queries(queries)
        if len(queries) != m:
            raise ValueError(f"{owner}: {len(queries)} query codes for {m} projections.")
        for attempt in range(4):
            with self._store.writing() if attempt == 3 else contextlib.nullcontext():
                snap = self._store.snapshot
                if snap.n == 0:
                    return np.full((m, k), -np.inf, np.float32), np.full((m, k), -1, np.int64)
                search = self.search  # type: ignore[attr-defined]  # every subclass has one
                _, cand = search(queries, min(snap.n, SHORTLIST_FACTOR * k), n_threads=n_threads)
                if self._store.snapshot is snap:  # the search saw this state
                    break
        # the shortlist as rows of the snapshot (ids ascending: ties go to the smaller id)
        rows = np.where(cand >= 0, np.searchsorted(snap.ids, cand), -1)
        S, pos = rerank_words(P, snap.rows["words"], rows, k, self.n_bits, n_threads)
        return S, snap.to_ids(pos)

    def _check_codes(self, codes) -> np.ndarray:
        return check_codes(codes, self.n_bits, "codes")

    def _check_queries(self, queries) -> np.ndarray:
        return check_codes(queries, self.n_bits, "queries")

    def _check_k(self, k, m: int, n: int | None = None) -> int:
        """``k`` for ``m`` queries (:func:`hashlearn._utils.validation.check_k`; ``k`` above the
        ``n`` stored codes is allowed and pads with -1)."""
        return check_k(k, m, f"{type(self).__name__}.search")

    def _check_radius(self, radius) -> int:
        return check_int(
            radius, "radius", f"{type(self).__name__}.range_search", low=0, high=self.n_bits
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_bits={self.n_bits}, ntotal={len(self)})"

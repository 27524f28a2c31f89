"""Exact exhaustive Hamming search (the linear popcount scan of the survey, §2.1).

Every query is compared with every database code by XOR + popcount over 64-bit words; the k
nearest are selected by counting over the ``b + 1`` possible distances rather than sorting
(see :mod:`hashlearn._kernels`). This is the exact reference every other index is tested
against, and the index to use up to a few million codes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hashlearn import _kernels, io
from hashlearn._parallel import parallel_chunks
from hashlearn._validation import check_codes, check_ids
from hashlearn.codes import as_words
from hashlearn.index.base import BinaryIndex, register_index
from hashlearn.io import persistable

__all__ = ["FlatIndex"]


@persistable
@register_index("flat")
class FlatIndex(BinaryIndex):
    """Exact k-NN and range search over packed binary codes by exhaustive scan.

    Same API and code layout as ``faiss.IndexBinaryFlat``, with three differences:
    ``range_search`` returns distances ``<= radius`` (faiss: ``< radius``), ``remove``
    never renumbers the remaining ids, and ties are broken by smaller id, so results are
    deterministic. Codes are stored as whole 64-bit words (32-bit codes take 8 bytes).

    Parameters
    ----------
    n_bits : int
        Code length in bits (any length; the last byte is zero-padded).

    Examples
    --------
    >>> import numpy as np
    >>> from hashlearn.index import FlatIndex
    >>> index = FlatIndex(64)
    >>> index.add(np.zeros((3, 8), np.uint8), ids=[10, 11, 12])
    >>> D, I = index.search(np.zeros((1, 8), np.uint8), k=2)
    >>> I.tolist()
    [[10, 11]]
    """

    def __init__(self, n_bits: int):
        super().__init__(n_bits)
        self._n_words = max(1, (self.code_size + 7) // 8)
        self._words = np.zeros((0, self._n_words), np.uint64)
        self._ids = np.zeros(0, np.int64)
        self._n = 0
        self._next_id = 0
        self._path: Path | None = None  # set by open(): adds and removes write through

    def __len__(self) -> int:
        return self._n

    @property
    def ids(self) -> np.ndarray:
        """Ids of the stored codes, ascending (read-only view)."""
        view = self._ids[: self._n].view()
        view.flags.writeable = False
        return view

    @property
    def codes(self) -> np.ndarray:
        """Stored codes as ``uint8 (n, code_size)``, in the order of :attr:`ids` (a view)."""
        return self._words[: self._n].view(np.uint8)[:, : self.code_size]

    # --------------------------------------------------------------------------- building

    def add(self, codes: np.ndarray, ids=None) -> np.ndarray:
        """Add packed codes ``(n, ceil(n_bits/8))`` uint8 with optional distinct int ids.

        Without ``ids`` the codes are numbered from one past the largest id ever added.
        Duplicate ids, or ids already in the index, raise ``ValueError``. Returns the ids
        of the added codes (int64, in the order of ``codes``).
        """
        codes = check_codes(codes, self.n_bits, "codes")
        m = codes.shape[0]
        if ids is None:
            new_ids = np.arange(self._next_id, self._next_id + m, dtype=np.int64)
        else:
            new_ids = check_ids(ids, m)
            present = np.isin(new_ids, self._ids[: self._n])
            if present.any():
                raise ValueError(
                    f"ids already in the index: {new_ids[present][:5].tolist()}. "
                    "Remove them first to replace their codes."
                )
        if m == 0:
            return new_ids
        words = as_words(codes).reshape(m, self._n_words)
        sorted_ids = new_ids
        if np.any(new_ids[1:] < new_ids[:-1]):
            order = np.argsort(new_ids, kind="stable")
            sorted_ids, words = new_ids[order], words[order]
        self._next_id = max(self._next_id, int(sorted_ids[-1]) + 1)
        if self._path is not None:
            self._write_through(words, sorted_ids)
        elif self._n and sorted_ids[0] < self._ids[self._n - 1]:
            self._merge(words, sorted_ids)
        else:
            self._append(words, sorted_ids)
        return new_ids

    def _append(self, words: np.ndarray, ids: np.ndarray) -> None:
        end = self._n + len(ids)
        if end > len(self._ids) or not self._words.flags.writeable:
            capacity = max(end, 2 * self._n, 1024)
            grown_words = np.zeros((capacity, self._n_words), np.uint64)
            grown_ids = np.zeros(capacity, np.int64)
            grown_words[: self._n] = self._words[: self._n]
            grown_ids[: self._n] = self._ids[: self._n]
            self._words, self._ids = grown_words, grown_ids
        self._words[self._n : end] = words
        self._ids[self._n : end] = ids
        self._n = end

    def _merge(self, words: np.ndarray, ids: np.ndarray) -> None:
        all_ids = np.concatenate([self._ids[: self._n], ids])
        all_words = np.concatenate([self._words[: self._n], words])
        order = np.argsort(all_ids, kind="stable")
        self._words, self._ids, self._n = all_words[order], all_ids[order], len(all_ids)

    # ------------------------------------------------------------------------- on disk

    @classmethod
    def open(cls, path, *, verify: bool = False) -> FlatIndex:
        """Open a saved index memory-mapped, for searching and **appending in place**.

        Opening reads only ``meta.json`` (instant at any size unless ``verify``); searches
        page the codes in from the file. ``add`` on the opened index writes through: codes
        whose ids are all larger than the stored ones are appended to the array files and
        ``meta.json`` is replaced atomically (:func:`hashlearn.io.append_rows`, O(new
        codes)); other adds and ``remove`` save a new generation (O(n)). One writer at a
        time; readers that loaded the index earlier keep seeing their version.
        """
        index = cls.load(path, mmap=True, verify=verify)
        index._path = Path(path)
        return index

    def _write_through(self, words: np.ndarray, sorted_ids: np.ndarray) -> None:
        if self._n == 0 or sorted_ids[0] > self._ids[self._n - 1]:
            io.append_rows(
                self._path, {"words": words, "ids": sorted_ids}, {"next_id": self._next_id}
            )
        else:
            self._merge(words, sorted_ids)
            io.save(self, self._path)
        self._remap()

    def _remap(self) -> None:
        reopened = type(self).load(self._path, mmap=True, verify=False)
        self._words, self._ids, self._n = reopened._words, reopened._ids, reopened._n
        self._next_id = reopened._next_id

    def remove(self, ids, *, missing: str = "raise") -> int:
        """Remove the codes with these ids; the other ids stay as they are.

        ``missing="raise"`` (default) refuses ids that are not in the index with a
        ``ValueError`` and removes nothing; ``missing="ignore"`` skips them. Returns the
        number of codes removed.
        """
        if missing not in ("raise", "ignore"):
            raise ValueError(f"missing must be 'raise' or 'ignore'. Got {missing!r}.")
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise ValueError(
                f"ids must be a 1-D array of integers. Got shape {ids.shape}, dtype {ids.dtype}."
            )
        current = self._ids[: self._n]
        drop = np.isin(current, ids)
        if missing == "raise":
            unknown = ~np.isin(ids, current)
            if unknown.any():
                raise ValueError(f"ids not in the index: {ids[unknown][:5].tolist()}.")
        removed = int(drop.sum())
        if removed:
            keep = ~drop
            self._words = self._words[: self._n][keep]
            self._ids = current[keep]
            self._n = len(self._ids)
            if self._path is not None:
                io.save(self, self._path)
                self._remap()
        return removed

    # ---------------------------------------------------------------------------- search

    def search(
        self, queries: np.ndarray, k: int, *, n_threads: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest codes of each query: ``(D int32 (m, k), I int64 (m, k))``.

        Sorted by (distance, id); rows pad with ``-1`` when the index holds fewer than
        ``k`` codes (an empty index returns all ``-1``).
        """
        queries = self._check_queries(queries)
        k = self._check_k(k)
        m = queries.shape[0]
        dist = np.full((m, k), -1, np.int32)
        pos = np.full((m, k), -1, np.int64)
        if m == 0 or self._n == 0:
            return dist, pos
        db, q_words, k_eff = self._db_words(), as_words(queries), min(k, self._n)

        def scan(start: int, stop: int) -> None:
            _kernels.knn_scan(
                db, self._n, q_words, start, stop, k_eff, self.n_bits, self._n_words, dist, pos
            )

        parallel_chunks(scan, m, n_threads)
        return dist, self._to_ids(pos)

    def range_search(
        self, queries: np.ndarray, radius: int, *, n_threads: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All codes within Hamming distance ``<= radius`` (faiss: ``< radius``).

        Returns ``(lims int64 (m+1,), D int32, I int64)``; query ``i``'s results are
        ``D[lims[i]:lims[i+1]]``, sorted by (distance, id).
        """
        queries = self._check_queries(queries)
        radius = self._check_radius(radius)
        m = queries.shape[0]
        counts = np.zeros(m, np.int64)
        q_words = as_words(queries) if m else np.zeros(0, np.uint64)
        db, n, n_words = self._db_words(), self._n, self._n_words
        if n:
            parallel_chunks(
                lambda start, stop: _kernels.range_count(
                    db, n, q_words, n_words, radius, counts, start, stop
                ),
                m,
                n_threads,
            )
        lims = np.zeros(m + 1, np.int64)
        np.cumsum(counts, out=lims[1:])
        dist = np.empty(lims[-1], np.int32)
        pos = np.empty(lims[-1], np.int64)
        if lims[-1]:
            parallel_chunks(
                lambda start, stop: _kernels.range_fill(
                    db, n, q_words, n_words, radius, self.n_bits, lims, dist, pos, start, stop
                ),
                m,
                n_threads,
            )
        return lims, dist, self._to_ids(pos)

    def _db_words(self) -> np.ndarray:
        return self._words[: self._n].reshape(-1)

    def _to_ids(self, pos: np.ndarray) -> np.ndarray:
        ids = self._ids[: self._n]
        return np.where(pos >= 0, ids[np.maximum(pos, 0)], -1)

    # ------------------------------------------------------------------------ persistence

    def _get_state(self):
        arrays = {"words": self._words[: self._n], "ids": self._ids[: self._n]}
        return {"n_bits": self.n_bits}, {"next_id": self._next_id}, arrays

    @classmethod
    def _from_state(cls, params, state, arrays):
        index = cls(params["n_bits"])
        words, ids = arrays["words"], arrays["ids"]
        if words.ndim != 2 or words.shape[1] != index._n_words or len(ids) != len(words):
            raise ValueError(
                f"saved FlatIndex arrays are inconsistent: words {words.shape}, ids "
                f"{ids.shape} for {index.n_bits}-bit codes."
            )
        index._words, index._ids, index._n = words, ids, len(ids)
        index._next_id = int(state["next_id"])
        return index

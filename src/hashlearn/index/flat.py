"""Exact exhaustive Hamming search (the linear popcount scan of the survey, §2.1).

Every query is compared with every database code by XOR + popcount over 64-bit words; the k
nearest are selected by counting over the ``b + 1`` possible distances rather than sorting
(see :mod:`hashlearn._utils.primitives`). This is the exact reference every other index is tested
against, and the index to use up to a few million codes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hashlearn import io
from hashlearn._utils import range_scan as _range_scan
from hashlearn._utils.parallel import parallel_chunks
from hashlearn._utils.validation import check_codes, check_k
from hashlearn.codes import as_words
from hashlearn.index._asymmetric import check_projections, scan_words
from hashlearn.index._knn_scan import knn_scan
from hashlearn.index._storage import Snapshot, check_code_state
from hashlearn.index.base import BinaryIndex, register_index
from hashlearn.io import persistable

__all__ = ["FlatIndex", "scan_search", "scan_range_search"]


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
    array([10, 11, 12])
    >>> D, I = index.search(np.zeros((1, 8), np.uint8), k=2)
    >>> I.tolist()
    [[10, 11]]
    """

    def __init__(self, n_bits: int):
        super().__init__(n_bits)
        self._path: Path | None = None  # set by open(): adds and removes write through

    # --------------------------------------------------------------------------- building

    def add(self, codes: np.ndarray, ids=None) -> np.ndarray:
        """Add packed codes ``(n, ceil(n_bits/8))`` uint8 with optional distinct int ids.

        Without ``ids`` the codes are numbered from one past the largest id ever added
        (``ValueError`` once that would pass ``2**63 - 1``). Duplicate ids, or ids already in
        the index, raise ``ValueError``. Returns the ids of the added codes (int64, in the
        order of ``codes``). Safe while other threads search (see :mod:`hashlearn.index`).
        """
        codes = check_codes(codes, self.n_bits, "codes")
        m = codes.shape[0]
        words = as_words(codes).reshape(m, self._n_words)
        with self._store.writing():
            new_ids = self._store.new_ids(ids, m)
            if m == 0:
                return new_ids
            snap, buffers, _, _ = self._store.plan_add({"words": words}, new_ids)
            if self._path is None:
                self._store.publish(snap, buffers=buffers)
            else:
                self._write_through(snap, words, new_ids)
        return new_ids

    # ------------------------------------------------------------------------- on disk

    @classmethod
    def open(cls, path, *, verify: bool = True) -> FlatIndex:
        """Open a saved index memory-mapped, for searching and **appending in place**.

        Opening checks every array's sha256 (reads the files once) unless ``verify=False``,
        the explicit fast path that trusts the bytes on disk; either way the arrays'
        structure is checked (O(n)). Searches page the codes in from the file. ``add`` on
        the opened index writes through: codes whose ids are all larger than the stored ones
        are appended to the array files and ``meta.json`` is replaced atomically
        (:func:`hashlearn.io.append_rows`, O(new codes)); other adds and ``remove`` save a
        new generation (O(n)). One writing process at a time; readers that loaded the index
        earlier keep seeing their version.
        """
        index = cls.load(path, mmap=True, verify=verify)
        index._path = Path(path)
        return index

    def _write_through(self, snap: Snapshot, words: np.ndarray, new_ids: np.ndarray) -> None:
        assert self._path is not None  # only an index from open() writes through
        old = self._store.snapshot
        order = np.argsort(new_ids, kind="stable")
        sorted_ids = new_ids[order]
        if old.n == 0 or sorted_ids[0] > old.ids[-1]:
            io.append_rows(
                self._path,
                {"words": words[order], "ids": sorted_ids},
                {"next_id": snap.next_id},
            )
        else:
            self._save_snapshot(snap)
        self._remap(snap)

    def _remap(self, written: Snapshot) -> None:
        """Publish the state just written as memory maps of the files. They hold what this
        writer checked and wrote (``written``), so only their shapes are checked: an append
        stays O(new rows) instead of re-validating the whole index."""
        assert self._path is not None
        meta, arrays = io.read_dir(self._path, mmap=True, verify=False)
        words, ids = arrays.get("words"), arrays.get("ids")
        if (
            words is None
            or ids is None
            or words.shape != written.rows["words"].shape
            or ids.shape != written.ids.shape
            or meta["state"].get("next_id") != written.next_id
        ):
            raise ValueError(f"{self._path} changed while this index was writing to it")
        self._store.publish(Snapshot(ids, {"words": words}, written.next_id))

    def remove(self, ids, *, missing: str = "raise") -> int:
        """Remove the codes with these ids; the other ids stay as they are.

        ``missing="raise"`` (default) refuses ids that are not in the index with a
        ``ValueError`` and removes nothing; ``missing="ignore"`` skips them. Returns the
        number of codes removed. Safe while other threads search.
        """
        with self._store.writing():
            snap, _, removed = self._store.plan_remove(ids, missing)
            if removed:
                if self._path is None:
                    self._store.publish(snap)
                else:
                    self._save_snapshot(snap)
                    self._remap(snap)
        return removed

    # ---------------------------------------------------------------------------- search

    def search(
        self, queries: np.ndarray, k: int, *, n_threads: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest codes of each query: ``(D int32 (m, k), I int64 (m, k))``.

        Sorted by (distance, id); rows pad with ``-1`` when the index holds fewer than
        ``k`` codes (an empty index returns all ``-1``).
        """
        snap = self._store.snapshot
        queries = self._check_queries(queries)
        k = self._check_k(k, len(queries))
        return scan_search(snap, queries, k, self.n_bits, n_threads)

    def search_asymmetric(
        self, projections, k: int, *, queries=None, n_threads: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` codes of highest asymmetric score ``s(q, x) = sum_j p_j (2 x_j - 1)``
        (Gordo, Perronnin, Gong & Lazebnik, *Asymmetric distances for binary embeddings*,
        TPAMI 2014): the queries' real-valued projections ``(m, n_bits)`` (a hasher's
        ``project(X)``) against every stored code, by
        :func:`~hashlearn.index._asymmetric.scan_words`: exact, scoring only the codes whose
        bit-plane upper bound reaches the k-th score so far.

        Returns ``(S float32 (m, k), I int64 (m, k))``: scores largest first, ties to the
        smaller id, padded with ``-inf`` / ``-1``. ``queries`` (the queries' codes) is not
        needed by the scan and ignored; it is accepted as by
        :meth:`BinaryIndex.search_asymmetric <hashlearn.index.base.BinaryIndex.search_asymmetric>`.
        """
        snap = self._store.snapshot  # one state for the whole search
        owner = f"{type(self).__name__}.search_asymmetric"
        P = check_projections(projections, self.n_bits, owner)
        k = check_k(k, len(P), owner, bytes_per_result=12)
        S, pos = scan_words(P, snap.rows["words"], k, self.n_bits, n_threads)
        return S, snap.to_ids(pos)

    def range_search(
        self, queries: np.ndarray, radius: int, *, n_threads: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All codes within Hamming distance ``<= radius`` (faiss: ``< radius``).

        Returns ``(lims int64 (m+1,), D int32, I int64)``; query ``i``'s results are
        ``D[lims[i]:lims[i+1]]``, sorted by (distance, id).
        """
        snap = self._store.snapshot
        queries = self._check_queries(queries)
        radius = self._check_radius(radius)
        return scan_range_search(snap, queries, radius, self.n_bits, n_threads)

    # ------------------------------------------------------------------------ persistence

    def _state_of(self, snap: Snapshot):
        arrays = {"words": snap.rows["words"], "ids": snap.ids}
        return {"n_bits": self.n_bits}, {"next_id": snap.next_id}, arrays

    def _save_snapshot(self, snap: Snapshot) -> None:
        assert self._path is not None
        io.write_dir(self._path, type(self).__name__, *self._state_of(snap))

    def _get_state(self):
        return self._state_of(self._store.snapshot)

    @classmethod
    def _from_state(cls, params, state, arrays):
        index = cls(params["n_bits"])
        words, ids, next_id = check_code_state(arrays, state, index.n_bits)
        index._store.restore(ids, {"words": words}, next_id)
        return index


def scan_search(snap: Snapshot, queries: np.ndarray, k: int, n_bits: int, n_threads=None):
    """Exact k-NN of checked ``queries`` in a snapshot whose rows hold ``words``, by scan.

    The search of :class:`FlatIndex`, shared with the indexes that fall back to a scan.
    """
    m, n = queries.shape[0], snap.n
    if m == 0 or n == 0:
        return np.full((m, k), -1, np.int32), np.full((m, k), -1, np.int64)
    # the kernel writes every slot (-1 past the n-th); no padding: positions map directly
    dist = np.empty((m, k), np.int32)
    pos = np.empty((m, k), np.int64)
    words = snap.rows["words"]
    n_words = words.shape[1]
    db, q_words, k_eff = words.reshape(-1), as_words(queries), min(k, n)
    q_words.flags.writeable = False  # a view: the kernels take read-only inputs

    def scan(start: int, stop: int) -> None:
        knn_scan(db, n, q_words, start, stop, k_eff, n_bits, n_words, dist, pos)

    parallel_chunks(scan, m, n_threads)
    return dist, (snap.ids[pos] if k <= n else snap.to_ids(pos))


def scan_range_search(
    snap: Snapshot, queries: np.ndarray, radius: int, n_bits: int, n_threads=None
):
    """All codes within ``radius`` of checked ``queries`` in a snapshot, by scan (CSR)."""
    m = queries.shape[0]
    counts = np.zeros(m, np.int64)
    q_words = as_words(queries) if m else np.zeros(0, np.uint64)
    words = snap.rows["words"]
    db, n, n_words = words.reshape(-1), snap.n, words.shape[1]
    if n:
        parallel_chunks(
            lambda start, stop: _range_scan.range_count(
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
            lambda start, stop: _range_scan.range_fill(
                db, n, q_words, n_words, radius, n_bits, lims, dist, pos, start, stop
            ),
            m,
            n_threads,
        )
    return lims, dist, snap.to_ids(pos)

"""VectorStore: the vectors a refine stage rescores, kept by id in copy-on-write snapshots.

The store rides the index layer's storage (:mod:`hashlearn.index._storage`): an
:class:`~hashlearn.index._storage.IdStore` holds the ids in ascending order and, for dense
vectors, the rows aligned with them (appends write into spare capacity, amortised O(new
rows)). CSR vectors are attached to the snapshot they belong to. A writer builds the next
immutable :class:`~hashlearn.index._storage.Snapshot` and publishes it with one reference
assignment, so a reader that took :attr:`VectorStore.state` once sees ids and vectors that
belong together, whatever writers do meanwhile. Data derived from a set of vectors (the
screens, the vectors mapped by a learned metric, the CSR kernel arrays) is cached on the
snapshot by :meth:`Snapshot.derived`, so it is rebuilt only after a write.

On disk (:meth:`VectorStore.arrays` / :meth:`VectorStore.restore`) the vectors are
``.npy`` arrays that a load may memory-map. A map is advised ``MADV_RANDOM``
(:func:`advise_random`): a search reads a few scattered rows, and the kernel's default
read-around would fetch up to 128 KiB of file around each one (a cold-cache search of a
2M x 96 float32 store read ~208 MB for 1,600 rows); with the advice a row costs the pages
it spans (``bench/rerank_store.py`` measures it). A load with ``direct=True`` attaches a
:class:`~hashlearn.rerank.rowfile.RowFile` to the snapshot: a search then reads only the rows
it rescores, with direct I/O, and the page cache never holds the file (vector files larger than
RAM). A write publishes a snapshot without it (the new rows live in memory).
"""

from __future__ import annotations

import contextlib
import mmap as _mmap
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.utils.validation import check_array

from hashlearn import io as _io
from hashlearn.index._storage import IdStore, Snapshot
from hashlearn.rerank.rowfile import RowFile

__all__ = ["VectorStore", "MissingVectorsError", "advise_random", "canonical_csr", "as_dense"]


class MissingVectorsError(ValueError):
    """Candidate ids that the store holds no vectors for."""


def canonical_csr(X: sp.csr_matrix) -> sp.csr_matrix:
    """``X`` with sorted, unique column indices per row (a copy when it had to change)."""
    if not X.has_canonical_format:
        X = X.copy()
        X.sum_duplicates()
    return X


def as_dense(X) -> np.ndarray:
    """``X`` as a dense float32 or float64 array (scipy.sparse densified)."""
    if sp.issparse(X):
        X = X.toarray()
    return check_array(X, dtype=(np.float64, np.float32), ensure_min_samples=0)


def advise_random(arr) -> None:
    """Advise the memory map under ``arr`` (if any) for random access: no read-around, so a
    page fault reads the faulting page only (Linux ``MADV_RANDOM``; elsewhere nothing)."""
    advice = getattr(_mmap, "MADV_RANDOM", None)
    while arr is not None and advice is not None:
        buf = getattr(arr, "_mmap", None)
        if isinstance(buf, _mmap.mmap):
            with contextlib.suppress(OSError, ValueError):
                buf.madvise(advice)
            return
        arr = getattr(arr, "base", None)


class VectorStore:
    """Vectors by id (dense rows or one CSR matrix), published as immutable snapshots.

    The kind (dense or CSR) and the dtype of the first batch are kept; later batches are
    converted to them. Writers are serialised by the underlying :class:`IdStore`'s lock.

    Examples
    --------
    >>> import numpy as np
    >>> store = VectorStore()
    >>> store.add(np.eye(3), np.array([4, 2, 9]))
    >>> state = store.state
    >>> state.ids.tolist(), VectorStore.vectors_of(state)[:, 0].tolist()
    ([2, 4, 9], [0.0, 1.0, 0.0])
    >>> store.remove([4]), len(store)
    (1, 2)
    """

    def __init__(self):
        self._ids: IdStore | None = None  # made at the first add: row shapes known then
        self._empty = Snapshot(np.zeros(0, np.int64), {}, 0)

    # ------------------------------------------------------------------------ reading

    @property
    def state(self) -> Snapshot:
        """The current snapshot (one atomic read; hold on to it for a consistent view)."""
        return self._empty if self._ids is None else self._ids.snapshot

    def __len__(self) -> int:
        return self.state.n

    @staticmethod
    def vectors_of(state: Snapshot):
        """The vectors of ``state``: a dense array, a CSR matrix, or None when empty-new."""
        if "vectors" in state.rows:
            return state.rows["vectors"]
        return state.cached("csr")

    @property
    def sparse(self) -> bool:
        return sp.issparse(self.vectors_of(self.state))

    @staticmethod
    def positions(state: Snapshot, ids: np.ndarray) -> np.ndarray:
        """Rows of ``state`` for candidate ``ids`` (-1 stays -1); ids without vectors raise
        :class:`MissingVectorsError`.

        Ids spanning at most ``4 n + 1024`` values (the usual ``0..n-1`` included) are
        looked up in a table built once per snapshot; others by binary search."""
        known = state.ids
        n = len(known)
        table = state.derived("id_table", _id_table)
        if table is not False and len(table) == n + 1 and ids.size:
            if ids.min() >= -1 and ids.max() < n:  # ids 0..n-1 in order: an id is its row
                return ids
        if table is not False:
            span = len(table) - 1  # table[span] = -1 answers padding and unknown ids
            pos = table[np.where(ids >= 0, np.minimum(ids, span), span)]
            found = pos >= 0
        else:
            pos = np.searchsorted(known, ids)
            found = np.zeros(ids.shape, bool)
            inside = pos < n
            found[inside] = known[pos[inside]] == ids[inside]
        unknown = (ids >= 0) & ~found
        if unknown.any():
            raise MissingVectorsError(
                f"the index holds ids without vectors to re-rank by, e.g. "
                f"{ids[unknown][:5].tolist()}; add the database through Searcher.add (or use "
                "rerank=None)."
            )
        return np.where(found, pos, -1)

    # ------------------------------------------------------------------------ writing

    def prepare(self, X, name: str = "X"):
        """``X`` as this store keeps vectors: canonical CSR when the store is sparse (or is
        empty and ``X`` is sparse), else a dense float array (the store's dtype once set)."""
        current = self.vectors_of(self.state)
        if sp.issparse(current) or (current is None and sp.issparse(X)):
            X = check_array(
                X, accept_sparse="csr", dtype=(np.float64, np.float32), ensure_min_samples=0
            )
            return canonical_csr(sp.csr_matrix(X))
        X = as_dense(X)
        if current is not None:
            if X.shape[1] != current.shape[1]:
                raise ValueError(
                    f"{name} has {X.shape[1]} features but the stored vectors have "
                    f"{current.shape[1]}."
                )
            X = X.astype(current.dtype, copy=False)
        return np.ascontiguousarray(X)

    def add(self, vectors, ids) -> None:
        """Keep ``vectors`` (from :meth:`prepare`) under the distinct new ``ids``."""
        ids = np.asarray(ids, np.int64)
        if len(ids) != vectors.shape[0]:
            raise ValueError(f"{vectors.shape[0]} vectors for {len(ids)} ids.")
        if self._ids is None:
            rows = {} if sp.issparse(vectors) else {"vectors": ((vectors.shape[1],), vectors.dtype)}
            self._ids = IdStore(rows, "VectorStore")
        with self._ids.writing():
            snap = self._ids.snapshot
            new_ids = self._ids.new_ids(ids, len(ids))
            if "vectors" in self._ids.row_shapes:
                new, buffers, _, _ = self._ids.plan_add({"vectors": vectors}, new_ids)
                self._ids.publish(new, buffers=buffers)
                return
            old = snap.cached("csr")
            all_ids = np.concatenate([snap.ids, new_ids])
            order = np.argsort(all_ids, kind="stable")
            csr = vectors if old is None else sp.vstack([old, vectors], format="csr")
            if old is not None and vectors.shape[1] != old.shape[1]:
                raise ValueError(
                    f"X has {vectors.shape[1]} features but the stored vectors have {old.shape[1]}."
                )
            next_id = max(snap.next_id, int(all_ids.max(initial=-1)) + 1)
            new = Snapshot(all_ids[order], {}, next_id)
            new.attach("csr", canonical_csr(sp.csr_matrix(csr[order])))
            self._ids.publish(new)

    def reserve(self, n_rows: int, dim: int, dtype=np.float32) -> None:
        """Room for ``n_rows`` dense ``dim``-wide rows in all before appending them
        (:meth:`IdStore.reserve`: one copy instead of doubling; a no-op for CSR vectors)."""
        if self._ids is None:
            self._ids = IdStore({"vectors": ((dim,), np.dtype(dtype))}, "VectorStore")
        if "vectors" in self._ids.row_shapes:
            self._ids.reserve(n_rows)

    def remove(self, ids) -> int:
        """Forget the vectors of ``ids`` (ids not held are skipped); returns how many."""
        if self._ids is None:
            return 0
        with self._ids.writing():
            snap = self._ids.snapshot
            new, keep, removed = self._ids.plan_remove(ids, "ignore")
            if removed:
                if "vectors" not in new.rows:
                    new.attach("csr", snap.cached("csr")[keep])
                self._ids.publish(new)
            return removed

    # -------------------------------------------------------------------- persistence

    def arrays(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """``(state, arrays)`` to save: ``vector_ids`` and ``vectors`` (dense) or the CSR
        arrays ``vectors_data`` / ``vectors_indices`` / ``vectors_indptr``."""
        snap = self.state
        V = self.vectors_of(snap)
        state: dict[str, Any] = {"vectors": "none"}
        arrays = {"vector_ids": np.asarray(snap.ids, np.int64)}
        if sp.issparse(V):
            state["vectors"], state["n_features"] = "csr", int(V.shape[1])
            arrays["vectors_data"] = V.data
            arrays["vectors_indices"] = V.indices.astype(np.int64, copy=False)
            arrays["vectors_indptr"] = V.indptr.astype(np.int64, copy=False)
        elif V is not None:
            state["vectors"] = "dense"
            arrays["vectors"] = np.ascontiguousarray(V)
        return state, arrays

    def restore(self, state: dict, arrays: dict, *, direct: bool = False) -> None:
        """Publish what :meth:`arrays` saved, every invariant checked (``ValueError``);
        memory-mapped arrays stay mapped (advised for random access). ``direct``: dense
        memory-mapped vectors are read row by row (:class:`RowFile`) by searches."""
        ids = _io.require_array(arrays, "vector_ids", np.int64, 1)
        if ids.size and (ids[0] < 0 or np.any(ids[1:] <= ids[:-1])):
            raise ValueError("array 'vector_ids' must be non-negative and strictly increasing")
        kind = _io.require_state(state, "vectors", str)
        n = len(ids)
        next_id = int(ids[-1]) + 1 if n else 0
        if kind == "dense":
            vectors = _io.require_array(arrays, "vectors", arrays["vectors"].dtype, 2, (n, None))
            if vectors.dtype not in (np.float32, np.float64):
                raise ValueError(f"array 'vectors' has dtype {vectors.dtype}, expected a float")
            advise_random(vectors)
            derived = {"row_file": RowFile.of(vectors)} if direct and n else None
            self._ids = IdStore({"vectors": ((vectors.shape[1],), vectors.dtype)}, "VectorStore")
            self._ids.restore(ids, {"vectors": vectors}, next_id, derived)
        elif kind == "csr":
            d = _io.require_state(state, "n_features", int, low=0)
            data = arrays.get("vectors_data")
            if direct:
                raise ValueError("direct reads need dense vectors; these are CSR (use mmap=True)")
            if data is None or data.dtype not in (np.float32, np.float64):
                raise ValueError("array 'vectors_data' is missing or not float32/float64")
            data = _io.require_array(arrays, "vectors_data", data.dtype, 1)
            indptr = _io.require_array(arrays, "vectors_indptr", np.int64, 1, (n + 1,))
            indices = _io.require_array(
                arrays, "vectors_indices", np.int64, 1, (len(data),), low=0, high=max(d, 1)
            )
            if indptr[0] != 0 or indptr[-1] != len(data) or np.any(np.diff(indptr) < 0):
                raise ValueError("array 'vectors_indptr' is not a valid CSR row pointer")
            for arr in (data, indices):
                advise_random(arr)
            csr = sp.csr_matrix((data, indices, indptr), shape=(n, d), copy=False)
            if not csr.has_canonical_format:
                raise ValueError("the CSR vectors are not in canonical (sorted) form")
            self._ids = IdStore({}, "VectorStore")
            self._ids.restore(ids, {}, next_id, {"csr": csr})
        elif kind == "none":
            if n:
                raise ValueError(f"{n} vector ids saved without vectors")
            self._ids = None
        else:
            raise ValueError(f"state entry 'vectors' must be dense, csr or none, got {kind!r}")

    def replace(self, ids: np.ndarray, vectors: np.ndarray, *, direct: bool = False) -> None:
        """Publish dense ``vectors`` under ``ids`` (ascending) as the new state, e.g. a file
        grown in place and mapped again (:meth:`hashlearn.embeddings.EmbeddingIndex.open`);
        ``direct``: searches read the rows of the mapped file with :class:`RowFile`."""
        advise_random(vectors)
        derived = {"row_file": RowFile.of(vectors)} if direct and len(ids) else None
        if self._ids is None:
            self._ids = IdStore({"vectors": ((vectors.shape[1],), vectors.dtype)}, "VectorStore")
        with self._ids.writing():
            nxt = int(ids[-1]) + 1 if len(ids) else 0
            self._ids.publish(Snapshot(ids, {"vectors": vectors}, nxt, derived))


def _id_table(state: Snapshot):
    """``table[id]`` = row of ``state`` (-1 for none) when its ids are dense, else False."""
    ids = state.ids
    if len(ids) and ids[0] >= 0 and ids[-1] < 4 * len(ids) + 1024:
        table = np.full(int(ids[-1]) + 2, -1, np.int64)
        table[ids] = np.arange(len(ids))
        return table
    return False

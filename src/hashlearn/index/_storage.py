"""Ids, row storage and snapshots: the layer every index is built on.

Every index holds items with distinct non-negative int64 ids, kept in ascending order, and
zero or more *row arrays* aligned with them (``words`` of packed codes for
:class:`~hashlearn.index.flat.FlatIndex`, one word array per stage for
:class:`~hashlearn.index.cascade.Cascade`, none for
:class:`~hashlearn.index.table.TableIndex`, whose items live in its posting tables). An
:class:`IdStore` owns them, assigns automatic ids, validates explicit ones, removes by id
and publishes the result as an immutable :class:`Snapshot`.

Concurrency (copy-on-write). A snapshot is never modified after it is published: a writer
(``add``/``remove``) builds the next snapshot beside the current one while holding the
store's write lock, then replaces it with one reference assignment. A search reads
:attr:`IdStore.snapshot` once and works on that snapshot only, so any number of threads may
search while one thread writes: each search sees the index either before or after each write,
never a mixture, and never blocks. Writers are serialised by the lock. Appends whose ids are
all larger than the stored ones write into spare capacity past the rows any snapshot can see,
so they stay amortised O(new rows).

Data derived from a snapshot (multi-index hashing's substring tables, the Hamming-ball
table) is cached on the snapshot itself by :meth:`Snapshot.derived`, built once, on first use,
under the snapshot's own lock.

Loading. :func:`check_ids_array`, :func:`check_next_id`, :func:`check_words` and
:func:`check_code_state` (built on :func:`hashlearn.io.require_array` and
:func:`hashlearn.io.require_state`) verify, in O(n), the structural invariants every loader
relies on before any kernel sees an array. (A load racing with another process's save is
retried by :func:`hashlearn.io.load`.)
"""

from __future__ import annotations

import contextlib
import mmap
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from hashlearn._utils import primitives as _primitives
from hashlearn._utils.validation import check_ids
from hashlearn.io import require_array, require_state

__all__ = [
    "ID_MAX",
    "IdStore",
    "Snapshot",
    "check_code_state",
    "check_ids_array",
    "check_next_id",
    "check_words",
]

ID_MAX = int(np.iinfo(np.int64).max)
"""Largest id; automatic ids are numbered up to it and no further."""

_HUGE_PAGE_MIN_BYTES = 1 << 22  # 4 MiB: row buffers at least this big ask for huge pages


def _zeroed_rows(shape: tuple[int, ...], dtype) -> np.ndarray:
    """``np.zeros(shape, dtype)`` for a row buffer, on fresh memory advised to use
    transparent huge pages where the platform allows (Linux: a private anonymous mapping,
    ``MADV_HUGEPAGE`` before any page is touched).

    Scans read a row buffer end to end, and with 4 KiB pages a 1M x 32-bit ``FlatIndex``
    scan ran 11 % slower (2026-11-26, this repository's 2-core AMD EPYC, 2000 queries:
    ~300 vs ~270 us per query): ``np.zeros`` gets huge pages only when the allocator hands
    it untouched memory, so two indexes over the same codes in one process could differ by
    that much. Elsewhere, or when the mapping fails, plain ``np.zeros``.
    """
    dtype = np.dtype(dtype)
    n_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    private = getattr(mmap, "MAP_PRIVATE", None)
    anonymous = getattr(mmap, "MAP_ANONYMOUS", None)
    if n_bytes < _HUGE_PAGE_MIN_BYTES or advice is None or private is None or anonymous is None:
        return np.zeros(shape, dtype)
    try:
        buf = mmap.mmap(-1, n_bytes, flags=private | anonymous)
    except OSError:
        return np.zeros(shape, dtype)
    with contextlib.suppress(OSError):
        buf.madvise(advice)
    return np.frombuffer(buf, dtype).reshape(shape)


def _frozen(arr: np.ndarray) -> np.ndarray:
    view = arr.view()
    view.flags.writeable = False
    return view


class Snapshot:
    """One immutable state of an index: ids (ascending), aligned rows, the next automatic id.

    ``rows[name][i]`` belongs to ``ids[i]``. Arrays are read-only views; nothing in a
    snapshot changes after it is published.
    """

    __slots__ = ("ids", "rows", "next_id", "_derived", "_lock")

    def __init__(
        self,
        ids: np.ndarray,
        rows: Mapping[str, np.ndarray],
        next_id: int,
        derived: Mapping[str, Any] | None = None,
    ):
        self.ids = _frozen(ids)
        self.rows = {name: _frozen(value) for name, value in rows.items()}
        self.next_id = int(next_id)
        self._derived: dict[str, Any] = dict(derived or {})
        self._lock = threading.Lock()

    @property
    def n(self) -> int:
        """Number of items."""
        return len(self.ids)

    def to_ids(self, pos: np.ndarray) -> np.ndarray:
        """Ids at internal positions ``pos`` (``-1`` stays ``-1``)."""
        pos = np.asarray(pos)
        if self.n == 0:
            return np.full(pos.shape, -1, np.int64)
        return np.where(pos >= 0, self.ids[np.maximum(pos, 0)], -1)

    def derived(self, name: str, build: Callable[[Snapshot], Any]) -> Any:
        """``build(self)``, computed once per snapshot and cached (thread-safe)."""
        value = self._derived.get(name)
        if value is None:
            with self._lock:
                value = self._derived.get(name)
                if value is None:
                    value = build(self)
                    self._derived[name] = value
        return value

    def attach(self, name: str, value: Any) -> None:
        """Store derived data built with the snapshot, before it is published."""
        self._derived[name] = value

    def cached(self, name: str) -> Any:
        """The derived value ``name`` if it was built, else ``None``."""
        return self._derived.get(name)

    def __getstate__(self):  # copyable (e.g. sent to a dask worker): the lock is not
        return {
            "ids": self.ids,
            "rows": self.rows,
            "next_id": self.next_id,
            "derived": dict(self._derived),
        }

    def __setstate__(self, state):
        self.__init__(state["ids"], state["rows"], state["next_id"], state["derived"])


class IdStore:
    """Ids, aligned row arrays and the next automatic id, published as :class:`Snapshot`.

    Parameters
    ----------
    row_shapes : mapping
        ``name -> (trailing shape, dtype)`` of every row array.
    owner : str
        The index's class name, for error messages.

    Examples
    --------
    >>> import numpy as np
    >>> store = IdStore({"keys": ((), np.int64)}, "Example")
    >>> store.add({"keys": np.array([7, 8])}).tolist()
    [0, 1]
    >>> store.add({"keys": np.array([9])}, ids=[10]).tolist()
    [10]
    >>> store.remove([0])
    1
    >>> snap = store.snapshot
    >>> snap.ids.tolist(), snap.rows["keys"].tolist(), snap.next_id
    ([1, 10], [8, 9], 11)
    """

    def __init__(self, row_shapes: Mapping[str, tuple[tuple[int, ...], Any]], owner: str):
        self.owner = owner
        self.row_shapes = {name: (tuple(s), np.dtype(d)) for name, (s, d) in row_shapes.items()}
        self._lock = threading.RLock()
        self._buffers: dict[str, np.ndarray] | None = None  # spare capacity for appends
        self._snapshot = Snapshot(
            np.zeros(0, np.int64),
            {name: np.zeros((0, *s), d) for name, (s, d) in self.row_shapes.items()},
            0,
        )

    def __getstate__(self):  # copyable: the current snapshot, without locks or buffers
        return {"owner": self.owner, "row_shapes": self.row_shapes, "snapshot": self._snapshot}

    def __setstate__(self, state):
        self.__init__(state["row_shapes"], state["owner"])
        self._snapshot = state["snapshot"]

    # ------------------------------------------------------------------------ reading

    @property
    def snapshot(self) -> Snapshot:
        """The current state (one atomic read; hold on to it for a consistent view)."""
        return self._snapshot

    def __len__(self) -> int:
        return self._snapshot.n

    # ------------------------------------------------------------------------ writing

    @contextlib.contextmanager
    def writing(self):
        """Hold the write lock (re-entrant): one writer at a time."""
        with self._lock:
            yield self._snapshot

    def publish(self, snapshot: Snapshot, *, buffers: dict[str, np.ndarray] | None = None):
        """Make ``snapshot`` the current state (callers hold :meth:`writing`)."""
        with self._lock:
            self._buffers = buffers
            self._snapshot = snapshot

    def new_ids(self, ids, m: int) -> np.ndarray:
        """Ids for ``m`` new items: validated explicit ones, or the next ``m`` automatic ones.

        Raises ``ValueError`` for duplicates, ids already present and an exhausted id space.
        """
        snap = self._snapshot
        if ids is None:
            if m == 0:
                return np.zeros(0, np.int64)
            if snap.next_id + m - 1 > ID_MAX:
                raise ValueError(
                    f"{self.owner}: the int64 id space is exhausted: automatic ids would run "
                    f"from {snap.next_id} past {ID_MAX}. Pass explicit ids instead."
                )
            return np.arange(snap.next_id, snap.next_id + m, dtype=np.int64)
        new_ids = check_ids(ids, m)
        if m and snap.n:
            present = np.isin(new_ids, snap.ids)
            if present.any():
                raise ValueError(
                    f"ids already in the index: {new_ids[present][:5].tolist()}. "
                    "Remove them first to replace their items."
                )
        return new_ids

    def plan_add(
        self, rows: Mapping[str, np.ndarray], new_ids: np.ndarray, *, positions: bool = False
    ):
        """The snapshot after adding ``rows`` under ``new_ids`` (not published).

        Returns ``(snapshot, buffers, old_to_new, added_to_new)``; with ``positions`` the
        last two are the positions of the old items and of the added ones (in the order
        given) in the new snapshot, else ``None``. Already sorted ids are neither sorted nor
        copied again, so appending ``m`` rows allocates only the grown buffers.
        """
        snap = self._snapshot
        m, n = len(new_ids), snap.n
        for name, (shape, dtype) in self.row_shapes.items():
            if rows[name].shape != (m, *shape) or rows[name].dtype != dtype:
                raise ValueError(f"row array {name!r} must be {dtype} of shape {(m, *shape)}")
        if m == 0:
            return snap, self._buffers, np.arange(n), np.zeros(0, np.int64)
        sorted_rows: Mapping[str, np.ndarray]
        if m > 1 and np.any(new_ids[1:] < new_ids[:-1]):
            order = np.argsort(new_ids, kind="stable")
            sorted_ids = new_ids[order]
            sorted_rows = {name: rows[name][order] for name in self.row_shapes}
        else:
            order, sorted_ids, sorted_rows = None, new_ids, rows
        next_id = max(snap.next_id, int(sorted_ids[-1]) + 1)
        if n == 0 or sorted_ids[0] > snap.ids[-1]:
            # append: write past the rows every published snapshot can see
            buffers = self._buffers
            end = n + m
            if buffers is None or len(buffers["ids"]) < end:
                buffers = self._grown(max(end, 2 * n, 1024))
            buffers["ids"][n:end] = sorted_ids
            for name in self.row_shapes:
                buffers[name][n:end] = sorted_rows[name]
            new = Snapshot(
                buffers["ids"][:end], {k: buffers[k][:end] for k in self.row_shapes}, next_id
            )
            if not positions:
                return new, buffers, None, None
            added_to_new = np.arange(n, end)
            if order is not None:
                added_to_new[order] = added_to_new.copy()
            return new, buffers, np.arange(n), added_to_new
        all_ids = np.concatenate([snap.ids, new_ids])
        merged = np.argsort(all_ids, kind="stable")
        new_rows = {
            name: np.concatenate([snap.rows[name], rows[name]])[merged] for name in self.row_shapes
        }
        new = Snapshot(all_ids[merged], new_rows, next_id)
        if not positions:
            return new, None, None, None
        rank = np.empty(n + m, np.int64)
        rank[merged] = np.arange(n + m)
        return new, None, rank[:n], rank[n:]

    def _grown(self, capacity: int) -> dict[str, np.ndarray]:
        """Fresh row buffers of ``capacity`` rows holding the current snapshot's rows."""
        snap = self._snapshot
        grown = {"ids": _zeroed_rows((capacity,), np.int64)}
        grown["ids"][: snap.n] = snap.ids
        for name, (shape, dtype) in self.row_shapes.items():
            grown[name] = _zeroed_rows((capacity, *shape), dtype)
            grown[name][: snap.n] = snap.rows[name]
        return grown

    @property
    def capacity(self) -> int:
        """Rows the append buffers hold before the next growth (0: none yet)."""
        return 0 if self._buffers is None else len(self._buffers["ids"])

    def reserve(self, n_rows: int) -> None:
        """Make room for ``n_rows`` rows in all before the appends that fill them, so a
        large database added chunk by chunk is copied into its buffers once, instead of
        growing by doubling (whose last copy holds both buffers: up to twice the rows in
        memory at once). A no-op when the buffers already hold that many rows."""
        with self.writing():
            if n_rows > max(self.capacity, self._snapshot.n):
                self._buffers = self._grown(int(n_rows))

    def add(self, rows: Mapping[str, np.ndarray], ids=None) -> np.ndarray:
        """Add items (``rows[name]`` aligned with them); returns their ids (input order)."""
        with self.writing():
            m = len(next(iter(rows.values()))) if rows else 0
            new_ids = self.new_ids(ids, m)
            snap, buffers, _, _ = self.plan_add(rows, new_ids)
            self.publish(snap, buffers=buffers)
            return new_ids

    def plan_remove(self, ids, missing: str = "raise"):
        """The snapshot without ``ids`` (not published): ``(snapshot, keep, removed)``.

        ``missing="raise"`` refuses ids not present with a ``ValueError``; ``"ignore"`` skips
        them. ``keep`` is the boolean mask of the old items that stay.
        """
        if missing not in ("raise", "ignore"):
            raise ValueError(f"missing must be 'raise' or 'ignore'. Got {missing!r}.")
        if isinstance(ids, np.ma.MaskedArray):
            raise TypeError("ids must be a plain array of integers, not a masked array.")
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise ValueError(
                f"ids must be a 1-D array of integers. Got shape {ids.shape}, dtype {ids.dtype}."
            )
        snap = self._snapshot
        drop = np.isin(snap.ids, ids)
        if missing == "raise":
            unknown = ~np.isin(ids, snap.ids)
            if unknown.any():
                raise ValueError(f"ids not in the index: {ids[unknown][:5].tolist()}.")
        removed = int(drop.sum())
        keep = ~drop
        if not removed:
            return snap, keep, 0
        new = Snapshot(
            snap.ids[keep], {name: snap.rows[name][keep] for name in self.row_shapes}, snap.next_id
        )
        return new, keep, removed

    def remove(self, ids, *, missing: str = "raise") -> int:
        """Remove items by id (the others keep theirs); returns how many were removed."""
        with self.writing():
            snap, _, removed = self.plan_remove(ids, missing)
            if removed:
                self.publish(snap)
            return removed

    def restore(
        self,
        ids: np.ndarray,
        rows: Mapping[str, np.ndarray],
        next_id: int,
        derived: Mapping[str, Any] | None = None,
    ) -> Snapshot:
        """Publish a loaded state (callers validate it first, see :func:`check_ids_array`)."""
        snap = Snapshot(ids, rows, next_id, derived)
        self.publish(snap)
        return snap


# --------------------------------------------------------------------------- loading


def check_ids_array(arrays: Mapping[str, np.ndarray], name: str = "ids") -> np.ndarray:
    """Saved ids: int64, 1-D, non-negative and strictly ascending (so distinct)."""
    ids = require_array(arrays, name, np.int64, 1)
    if len(ids) and ids[0] < 0:
        raise ValueError(f"array {name!r} holds negative ids")
    if not _primitives.strictly_increasing(ids):
        raise ValueError(f"array {name!r} is not strictly ascending (ids sorted and distinct)")
    return ids


def check_next_id(state: Mapping[str, Any], ids: np.ndarray) -> int:
    """``state["next_id"]``: an int above every stored id, at most ``2**63``."""
    low = int(ids[-1]) + 1 if len(ids) else 0
    return require_state(state, "next_id", int, low=low, high=ID_MAX + 1)


def check_words(words: np.ndarray, n_bits: int, name: str) -> None:
    """Packed codes as ``uint64 (n, n_words)`` words: the bits past ``n_bits`` must be 0."""
    n_words = words.shape[1]
    if n_words != max(1, -(-n_bits // 64)):
        raise ValueError(f"array {name!r} has {n_words} words per code for {n_bits}-bit codes")
    spare = n_words * 64 - n_bits
    if spare and len(words):
        mask = np.uint64(((1 << spare) - 1) << (64 - spare))
        if _primitives.any_bits(words[:, n_words - 1], mask):
            raise ValueError(
                f"array {name!r} has non-zero padding bits above bit {n_bits} of its codes"
            )


def check_code_state(
    arrays: Mapping[str, np.ndarray], state: Mapping[str, Any], n_bits: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """``(words, ids, next_id)`` of a saved index of packed codes, every invariant checked:
    ``words`` uint64 ``(n, n_words)`` with zero padding bits, ``ids`` as
    :func:`check_ids_array`, ``next_id`` as :func:`check_next_id`."""
    ids = check_ids_array(arrays)
    words = require_array(arrays, "words", np.uint64, 2)
    n_words = max(1, -(-n_bits // 64))
    if words.shape != (len(ids), n_words):
        raise ValueError(
            f"arrays 'words' {words.shape} and 'ids' {ids.shape} do not fit together for "
            f"{n_bits}-bit codes (expected words of shape ({len(ids)}, {n_words}))"
        )
    check_words(words, n_bits, "words")
    return words, ids, check_next_id(state, ids)

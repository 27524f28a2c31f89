"""Charikar's sorted-permutation search in Hamming space (Charikar, "Similarity Estimation
Techniques from Rounding Algorithms", STOC 2002, Sec. 3; as used by Jain, Kulis & Grauman,
"Fast Image Search for Learned Metrics", CVPR 2008, Sec. 3.3; survey §2.4).

``M = ceil(n^{1/(1+eps)})`` random permutations of the bit positions are drawn; for each, the
database codes with their bits permuted are sorted lexicographically. A query's code,
permuted the same way, is located in every sorted order by binary search. Then (the paper's
scan, ``scan="charikar"``, the default) two pointers per order start at that position, one
moving up and one moving down, and ``n_examined`` times the pointer -- over all ``2M`` of
them -- whose next entry shares the longest prefix with the permuted query examines that
entry and moves on. Charikar examines ``2N = 2M`` entries this way (Jain et al.'s "2M
nearest examples"); that is the default budget here with ``window=1``. The variant
``scan="window"`` takes instead a fixed ``window`` entries on each side in every order,
``2 * window * M`` entries. Either way the distinct items examined are the candidates,
ranked by exact Hamming distance.

``candidates(q)`` returns each query's candidate ids (nearest Hamming first, ties by id);
``candidates(q, return_counts=True)`` also the number of distinct items each query examined,
so ``counts / len(index)`` is the fraction of the database searched; ``search(q, k)`` their
top k. Sorted orders are rebuilt lazily after ``add`` / ``remove`` (and after ``load``: they
are derived from the codes and ``random_state``, so they are not saved).
"""

from __future__ import annotations

import math
import threading

import numba
import numpy as np
from sklearn.utils import check_random_state

from hashlearn._utils.popcount import leading_zeros64, popcount64, trailing_zeros64
from hashlearn._utils.validation import check_codes, check_ids, check_int, check_real
from hashlearn.codes import unpack_bits
from hashlearn.index.base import BinaryIndex, register_index
from hashlearn.io import persistable, require_array, require_state

__all__ = ["PermutationIndex"]


# ----------------------------------------------------------------------------- kernels


@numba.njit(cache=True, nogil=True)
def _less(keys, o, row, q):
    """keys[o, row] < q lexicographically (word 0 most significant)."""
    for w in range(q.shape[0]):
        a = keys[o, row, w]
        if a != q[w]:
            return a < q[w]
    return False


@numba.njit(cache=True, nogil=True)
def _lcp(keys, o, row, q, n_bits):
    """Length of the longest common prefix of ``keys[o, row]`` and ``q`` (in bits)."""
    for w in range(q.shape[0]):
        x = keys[o, row, w] ^ q[w]
        if x != 0:
            return min(w * 64 + leading_zeros64(x), n_bits)
    return n_bits


@numba.njit(cache=True, nogil=True)
def _position(keys, o, q, n):
    """First entry of sorted order ``o`` not below ``q`` (binary search)."""
    lo = 0
    hi = n
    while lo < hi:
        mid = (lo + hi) // 2
        if _less(keys, o, mid, q):
            lo = mid + 1
        else:
            hi = mid
    return lo


@numba.njit(cache=True, nogil=True)
def _visit(r, qi, stamp, db_words, query_words, out_rows, out_dist, c):
    """Record row ``r`` as a candidate of query ``qi`` unless already seen; new count."""
    if stamp[r] == qi:
        return c
    stamp[r] = qi
    dist = 0
    for v in range(db_words.shape[1]):
        dist += popcount64(db_words[r, v] ^ query_words[qi, v])
    out_rows[qi, c] = r
    out_dist[qi, c] = dist
    return c + 1


@numba.njit(cache=True, nogil=True)
def permutation_candidates(
    keys, rows, query_keys, db_words, query_words, window, out_rows, out_dist, counts
):
    """The fixed-window scan: for each query, binary-search every sorted order, take
    ``window`` entries on each side, de-duplicate, and record the candidate rows with their
    Hamming distances.

    keys (M, n, W) uint64 sorted per order; rows (M, n) database row of each entry;
    query_keys (m, M, W); db_words (n, V) / query_words (m, V) codes as 64-bit words.
    Writes out_rows / out_dist (m, cap) and counts (m,).
    """
    n_orders, n = rows.shape
    m = query_keys.shape[0]
    stamp = np.full(n, -1, np.int64)
    for qi in range(m):
        c = 0
        for o in range(n_orders):
            lo = _position(keys, o, query_keys[qi, o], n)
            for pos in range(max(0, lo - window), min(n, lo + window)):
                c = _visit(rows[o, pos], qi, stamp, db_words, query_words, out_rows, out_dist, c)
        counts[qi] = c


@numba.njit(cache=True, nogil=True)
def charikar_candidates(
    keys, rows, query_keys, db_words, query_words, n_examined, n_bits, out_rows, out_dist, counts
):
    """Charikar's scan (Charikar 2002, Sec. 3): two pointers per sorted order start at the
    query's position (one moving up, one down); ``n_examined`` times, the pointer whose next
    entry shares the longest prefix with the (permuted) query, over all orders, examines
    that entry and moves on. Ties: lower order first, then the downward pointer (entries at
    or after the query's position) before the upward one. Arrays as in
    :func:`permutation_candidates`."""
    n_orders, n = rows.shape
    m = query_keys.shape[0]
    stamp = np.full(n, -1, np.int64)
    n_ptr = 2 * n_orders
    ptr = np.empty(n_ptr, np.int64)  # [2o]: down (next = ptr), [2o+1]: up (next = ptr)
    # A bucket queue of the pointers by the prefix length of their next entry: bit j of
    # level[l] is set when pointer j's next entry shares l bits. The pointer to move is the
    # lowest set bit of the highest non-empty level, which is the tie rule above. In a sorted
    # order the prefix shared with the query only shrinks away from the query's position, so
    # the highest level never rises and a step costs O(1) instead of a pass over 2 x orders.
    n_ptr_words = (n_ptr + 63) // 64
    level = np.zeros((n_bits + 1, n_ptr_words), np.uint64)
    for qi in range(m):
        level[:] = 0
        top = -1
        for o in range(n_orders):
            q = query_keys[qi, o]
            lo = _position(keys, o, q, n)
            ptr[2 * o] = lo
            ptr[2 * o + 1] = lo - 1
            if lo < n:
                top = max(top, _enqueue(level, 2 * o, _lcp(keys, o, lo, q, n_bits)))
            if lo > 0:
                top = max(top, _enqueue(level, 2 * o + 1, _lcp(keys, o, lo - 1, q, n_bits)))
        c = 0
        for _step in range(n_examined):
            best = -1
            while top >= 0:
                for w in range(n_ptr_words):
                    if level[top, w] != 0:
                        best = w * 64 + trailing_zeros64(level[top, w])
                        break
                if best >= 0:
                    break
                top -= 1
            if best < 0:
                break  # every order fully examined
            level[top, best >> 6] &= ~(np.uint64(1) << np.uint64(best & 63))
            o = best // 2
            pos = ptr[best]
            c = _visit(rows[o, pos], qi, stamp, db_words, query_words, out_rows, out_dist, c)
            pos += 1 if best % 2 == 0 else -1
            ptr[best] = pos
            if 0 <= pos < n:
                top = max(top, _enqueue(level, best, _lcp(keys, o, pos, query_keys[qi, o], n_bits)))
        counts[qi] = c


@numba.njit(nogil=True, inline="always")
def _enqueue(level, j, prefix):
    """Put pointer ``j`` at level ``prefix`` of the bucket queue; returns ``prefix``."""
    level[prefix, j >> 6] |= np.uint64(1) << np.uint64(j & 63)
    return prefix


# ----------------------------------------------------------------------------- index


def _words(bits: np.ndarray) -> np.ndarray:
    """Bit matrix (n, b) -> uint64 words (n, ceil(b/64)), bit 0 most significant."""
    n, b = bits.shape
    n_words = max(1, (b + 63) // 64)
    padded = np.zeros((n, n_words * 64), np.uint8)
    padded[:, :b] = bits
    packed = np.packbits(padded, axis=1, bitorder="big")
    return packed.view(">u8").astype(np.uint64).reshape(n, n_words)


class _Contents:
    """One immutable state of a PermutationIndex: codes, ids and their lazily built orders."""

    __slots__ = ("codes", "ids", "built")

    def __init__(self, codes: np.ndarray, ids: np.ndarray):
        self.codes, self.ids = codes, ids
        # (perms, keys, rows, words), see PermutationIndex._built
        self.built: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None


@persistable
@register_index("permutation")
class PermutationIndex(BinaryIndex):
    """Approximate Hamming search over sorted random bit permutations (Charikar 2002).

    Parameters
    ----------
    n_bits : int
        Code length.
    epsilon : float, default=1.5
        Approximation parameter: ``M = ceil(n^{1/(1+epsilon)})`` permutations for ``n``
        codes (Jain et al. use 1.5). Ignored when ``n_permutations`` is given.
    n_permutations : int, optional
        Fixed number of permutations ``M``.
    scan : {"charikar", "window"}, default="charikar"
        ``"charikar"``: the paper's scan, ``n_examined`` entries in all, each step taking
        the entry (above or below the query's position, in any order) with the longest
        prefix in common with the query. ``"window"``: ``window`` entries on each side of
        the query's position in every order (``2 * window * M`` entries examined).
    n_examined : int, optional
        Budget of the Charikar scan: entries examined per query over all orders (an item
        met in several orders counts each time). Default ``2 * window * M``: with
        ``window=1`` the paper's ``2M``, and in general the budget of the window scan with
        the same ``window``. Only with ``scan="charikar"``.
    window : int, default=1
        Entries taken above and below the query's position in every order by the window
        scan, and the default budget of the Charikar scan (see ``n_examined``).
    random_state : int, default=0
        Seed of the permutations (an int, so the index can be saved and rebuilt).

    Radius means Hamming distance ``<= radius`` (``range_search`` is approximate: it
    filters the candidates).

    Examples
    --------
    >>> import numpy as np
    >>> from hashlearn.codes import pack_bits
    >>> from hashlearn.index.permutation import PermutationIndex
    >>> bits = np.random.RandomState(0).rand(200, 32) < 0.5
    >>> index = PermutationIndex(32, random_state=0)
    >>> index.add(pack_bits(bits)).shape
    (200,)
    >>> index.n_orders, index.budget  # M = ceil(200^(1/2.5)), 2M entries examined
    (9, 18)
    >>> cands, counts = index.candidates(pack_bits(bits[:2]), return_counts=True)
    >>> int(cands[0][0]), bool(counts[0] <= index.budget)
    (0, True)
    """

    def __init__(
        self,
        n_bits: int,
        epsilon: float = 1.5,
        n_permutations: int | None = None,
        scan: str = "charikar",
        n_examined: int | None = None,
        window: int = 1,
        random_state: int = 0,
    ):
        super().__init__(n_bits)
        owner = type(self).__name__
        self.epsilon = check_real(epsilon, "epsilon", owner, low=0.0)
        self.n_permutations = (
            None if n_permutations is None else check_int(n_permutations, "n_permutations", owner)
        )
        if scan not in ("charikar", "window"):
            raise ValueError(
                f"The 'scan' parameter of {owner} must be 'charikar' or 'window'. "
                f"Got {scan!r} instead."
            )
        self.scan = scan
        if n_examined is not None and scan != "charikar":
            raise ValueError(
                f"n_examined is the budget of scan='charikar'; scan='window' examines "
                f"2 * window entries per order. Got n_examined={n_examined!r}."
            )
        self.n_examined = None if n_examined is None else check_int(n_examined, "n_examined", owner)
        self.window = check_int(window, "window", owner)
        self.random_state = check_int(random_state, "random_state", owner, low=0)
        # Copy-on-write: writers build a new _Contents and swap it in under the lock; a
        # search reads self._contents once, so it sees one whole state, never a mix.
        self._contents = _Contents(np.zeros((0, self.code_size), np.uint8), np.zeros(0, np.int64))
        self._next_id = 0
        self._write_lock = threading.Lock()

    def __getstate__(self):  # copyable (e.g. sent to a dask worker): the lock is not
        state = self.__dict__.copy()
        del state["_write_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._write_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._contents.ids)

    @property
    def ids(self) -> np.ndarray:
        """Ids of the stored codes, in insertion order."""
        return self._contents.ids.copy()

    @property
    def codes(self) -> np.ndarray:
        """The stored packed codes, in insertion order."""
        return self._contents.codes.copy()

    def _orders_for(self, n: int) -> int:
        if self.n_permutations is not None:
            return self.n_permutations
        return max(1, math.ceil(max(n, 1) ** (1.0 / (1.0 + self.epsilon)) - 1e-9))

    def _budget_for(self, n: int) -> int:
        if self.scan == "charikar" and self.n_examined is not None:
            return self.n_examined
        return 2 * self.window * self._orders_for(n)

    @property
    def n_orders(self) -> int:
        """The number of sorted permutations ``M`` for the current database size."""
        return self._orders_for(len(self))

    @property
    def budget(self) -> int:
        """Entries examined per query over all orders: ``n_examined`` (Charikar scan,
        default ``2 * window * M``) or ``2 * window * M`` (window scan); fewer when the
        orders hold fewer entries."""
        return self._budget_for(len(self))

    def permutations(self, n_orders: int | None = None) -> np.ndarray:
        """The bit permutations ``(M, n_bits)``; the first ones do not depend on ``M``."""
        rng = check_random_state(self.random_state)
        count = self.n_orders if n_orders is None else n_orders
        return np.array(
            [rng.permutation(self.n_bits) for _ in range(count)], dtype=np.int64
        ).reshape(count, self.n_bits)

    # ---------------------------------------------------------------------- building

    def add(self, codes: np.ndarray, ids=None) -> np.ndarray:
        """Add packed codes with optional distinct ids (default: numbered on)."""
        codes = check_codes(codes, self.n_bits, "codes")
        m = codes.shape[0]
        with self._write_lock:
            old = self._contents
            if ids is None:
                if self._next_id > np.iinfo(np.int64).max - m:
                    raise ValueError(
                        f"automatic ids would leave the int64 id space (next id {self._next_id})."
                    )
                new_ids = np.arange(self._next_id, self._next_id + m, dtype=np.int64)
            else:
                new_ids = check_ids(ids, m)
                present = np.isin(new_ids, old.ids)
                if present.any():
                    raise ValueError(f"ids already in the index: {new_ids[present][:5].tolist()}.")
            if m:
                self._contents = _Contents(
                    np.concatenate([old.codes, codes]), np.concatenate([old.ids, new_ids])
                )
                self._next_id = max(self._next_id, int(new_ids.max()) + 1)
        return new_ids

    def remove(self, ids, *, missing: str = "raise") -> int:
        """Remove codes by id (``missing="raise"`` or ``"ignore"`` unknown ids)."""
        if missing not in ("raise", "ignore"):
            raise ValueError(f"missing must be 'raise' or 'ignore'. Got {missing!r}.")
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise ValueError(f"ids must be a 1-D array of integers. Got shape {ids.shape}.")
        with self._write_lock:
            old = self._contents
            if missing == "raise":
                unknown = ~np.isin(ids, old.ids)
                if unknown.any():
                    raise ValueError(f"ids not in the index: {ids[unknown][:5].tolist()}.")
            keep = ~np.isin(old.ids, ids)
            removed = int((~keep).sum())
            if removed:
                self._contents = _Contents(old.codes[keep], old.ids[keep])
        return removed

    def _build(self, contents: _Contents):
        """The sorted orders of ``contents``, built once per state (a race builds it twice,
        from the same immutable arrays, and keeps either)."""
        if contents.built is None:
            n = len(contents.ids)
            perms = self.permutations(self._orders_for(n))
            bits = unpack_bits(contents.codes, self.n_bits)
            n_orders = len(perms)
            n_words = max(1, (self.n_bits + 63) // 64)
            keys = np.empty((n_orders, n, n_words), np.uint64)
            rows = np.empty((n_orders, n), np.int64)
            for o, perm in enumerate(perms):
                words = _words(bits[:, perm])
                order = np.lexsort(
                    (contents.ids,) + tuple(words[:, w] for w in range(n_words - 1, -1, -1))
                )
                keys[o], rows[o] = words[order], order
            contents.built = (perms, keys, rows, _words(bits))
        return contents.built

    # ------------------------------------------------------------------------ search

    def _candidates(self, queries: np.ndarray):
        contents = self._contents  # one state for the whole search
        n = len(contents.ids)
        budget = self._budget_for(n)
        perms, keys, rows, db_words = self._build(contents)
        m = len(queries)
        q_bits = unpack_bits(queries, self.n_bits)
        n_words = keys.shape[2]
        query_keys = _words(q_bits[:, perms].reshape(m * len(perms), self.n_bits)).reshape(
            m, len(perms), n_words
        )
        cap = min(n, budget)
        out_rows = np.full((m, max(cap, 1)), -1, np.int64)
        out_dist = np.full((m, max(cap, 1)), self.n_bits + 1, np.int64)
        counts = np.zeros(m, np.int64)
        if m and n:
            if self.scan == "charikar":
                charikar_candidates(
                    keys,
                    rows,
                    query_keys,
                    db_words,
                    _words(q_bits),
                    budget,
                    self.n_bits,
                    out_rows,
                    out_dist,
                    counts,
                )
            else:
                permutation_candidates(
                    keys,
                    rows,
                    query_keys,
                    db_words,
                    _words(q_bits),
                    self.window,
                    out_rows,
                    out_dist,
                    counts,
                )
        sentinel = np.iinfo(np.int64).max
        cand_ids = (
            np.where(out_rows >= 0, contents.ids[np.maximum(out_rows, 0)], sentinel)
            if n
            else np.full(out_rows.shape, sentinel)
        )
        order = np.lexsort((cand_ids, out_dist), axis=-1)
        take = np.arange(m)[:, None]
        cand_ids, out_dist = cand_ids[take, order], out_dist[take, order]
        return cand_ids, out_dist, counts

    def candidates(self, queries: np.ndarray, *, return_counts: bool = False):
        """Each query's candidate ids (int64), nearest Hamming distance first, ties by id.

        With ``return_counts=True`` returns ``(lists, counts)``: ``counts[i]`` (int64) is
        the number of distinct items query ``i`` examined (the length of its list), so
        ``counts / len(index)`` is the fraction of the database searched.
        """
        queries = self._check_queries(queries)
        ids, _, counts = self._candidates(queries)
        lists = [ids[i, : counts[i]].copy() for i in range(len(queries))]
        return (lists, counts) if return_counts else lists

    def search(
        self, queries: np.ndarray, k: int, *, n_threads: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest candidates by Hamming distance: ``(D int32, I int64)``, padded
        with -1 where fewer than ``k`` candidates were found. ``n_threads`` is accepted for
        API compatibility (the scan over orders is single-threaded)."""
        queries = self._check_queries(queries)
        k = self._check_k(k, len(queries), len(self))
        m = len(queries)
        D = np.full((m, k), -1, np.int32)
        Ids = np.full((m, k), -1, np.int64)
        ids, dist, counts = self._candidates(queries)
        width = min(k, ids.shape[1])
        valid = np.arange(width)[None, :] < counts[:, None]
        D[:, :width] = np.where(valid, dist[:, :width], -1)
        Ids[:, :width] = np.where(valid, ids[:, :width], -1)
        return D, Ids

    def range_search(self, queries: np.ndarray, radius: int, *, n_threads: int | None = None):
        """Candidates within Hamming distance ``<= radius`` (approximate), CSR form."""
        queries = self._check_queries(queries)
        radius = self._check_radius(radius)
        ids, dist, counts = self._candidates(queries)
        keep = (np.arange(ids.shape[1])[None, :] < counts[:, None]) & (dist <= radius)
        lims = np.zeros(len(queries) + 1, np.int64)
        np.cumsum(keep.sum(axis=1), out=lims[1:])
        return lims, dist[keep].astype(np.int32), ids[keep]

    # ------------------------------------------------------------------- persistence

    def _get_state(self):
        params = {
            "n_bits": self.n_bits,
            "epsilon": self.epsilon,
            "n_permutations": self.n_permutations,
            "scan": self.scan,
            "n_examined": self.n_examined,
            "window": self.window,
            "random_state": self.random_state,
        }
        contents = self._contents
        return params, {"next_id": self._next_id}, {"codes": contents.codes, "ids": contents.ids}

    @classmethod
    def _from_state(cls, params, state, arrays):
        params = dict(params)
        params.setdefault("scan", "window")  # saved before the Charikar scan existed
        index = cls(**params)
        codes = require_array(arrays, "codes", np.uint8, shape=(None, index.code_size))
        n = codes.shape[0]
        ids = require_array(arrays, "ids", np.int64, shape=(n,), low=0)
        next_id = require_state(state, "next_id", int, low=0)
        if n and (len(np.unique(ids)) != n or next_id <= int(ids.max())):
            raise ValueError("ids must be distinct and below next_id")
        check_codes(codes, index.n_bits, "codes")  # padding bits zero
        index._contents = _Contents(np.asarray(codes), np.asarray(ids))
        index._next_id = next_id
        return index

    def __repr__(self) -> str:
        return (
            f"PermutationIndex(n_bits={self.n_bits}, ntotal={len(self)}, "
            f"n_orders={self.n_orders}, scan={self.scan!r}, budget={self.budget})"
        )

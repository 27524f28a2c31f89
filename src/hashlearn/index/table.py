"""Inverted index over L tables of integer keys (Li et al., *Learning to Search Efficiently in High Dimensions*, NIPS 2011 §3.4).

A bucketer (a boosted search forest, k-means trees, LSH tables) maps every item to one
integer key per table: the leaf it reaches in tree ``l``, or the bucket of its ``l``-th LSH
code. In analogy with text search every key is an "index word" and the items under it its
"documents". A query collides with an item in table ``l`` when both carry the same key; the
candidate set of the paper's selection function ``T(q, x) > 0`` is the union of the
query's postings over the L tables, each candidate with its collision count
``sum_l 1(key_l(q) == key_l(x))`` (the unweighted ensemble score).

Storage: each table is sorted keys + CSR posting lists (:mod:`hashlearn._utils.postings`) over
*internal positions* -- ranks of the ids in ascending order -- stored as int32. All tables
are concatenated into four flat arrays, so the index saves as ``.npy`` files and loads
memory-mapped.

Probing (numba): for each query the postings of its L keys (binary search per table) are
gathered and sorted, runs give the collision counts, and a counting sort by count orders
them (count descending, then id ascending). The work is proportional to the number of
gathered postings -- the candidate volume -- not to the database size, which is the point
of the paper's Table 1.

Key tags. Bucketers in :mod:`hashlearn.forest` put a 23-bit tag derived from their learned
state (``key_tag_``) into bits 40..62 of every key. ``TableIndex(n_tables,
bucketer=fitted_bucketer)`` remembers the tag and refuses keys (to add or to query) that
carry a different one: the keys of another bucketer than the one that built the index.
"""

from __future__ import annotations

import numba
import numpy as np

from hashlearn._utils.parallel import parallel_chunks
from hashlearn._utils.postings import build_table, check_table, gathered_sizes, posting_range
from hashlearn._utils.validation import as_plain_array, check_int
from hashlearn.forest.base import KEY_LOCAL_MASK, KEY_TAG_MASK, KEY_TAG_SHIFT
from hashlearn.index._storage import IdStore, check_ids_array, check_next_id
from hashlearn.index.base import IndexBase
from hashlearn.io import persistable, require_array, require_state

__all__ = ["TableIndex", "KEY_TAG_SHIFT", "KEY_LOCAL_MASK"]


# ----------------------------------------------------------------------------- kernels


@numba.njit(cache=True, nogil=True, inline="always")
def _gather(q, query_keys, tables, out_pos, out_table, base):
    """Copy the postings of query ``q``'s keys, table by table, to ``out_pos[base:]`` (and
    each one's table to ``out_table[base:]``); returns their number."""
    table_keys, table_ptr, offsets, postings = tables
    total = 0
    for t in range(query_keys.shape[1]):
        start, stop = posting_range(table_keys, table_ptr, offsets, t, query_keys[q, t])
        for p in range(start, stop):
            out_pos[base + total] = postings[p]
            out_table[base + total] = t
            total += 1
    return total


@numba.njit(cache=True, nogil=True)
def _count_probe(start, stop, query_keys, tables, min_count, lims, out_pos, out_cnt, lengths):
    """Candidates of queries ``start..stop``, written at ``out_*[lims[q]:]`` (``lims`` bounds
    the gathered postings) with their number in ``lengths[q]``: gather the postings of the
    query's L keys, sort them, count runs, order by count descending then position."""
    n_tables = query_keys.shape[1]
    for q in range(start, stop):
        base = lims[q]
        total = _gather(q, query_keys, tables, out_pos, out_cnt, base)
        if total == 0:
            lengths[q] = 0
            continue
        buf = np.sort(out_pos[base : base + total])
        # run-length: unique positions ascending with counts
        n_unique = 0
        i = 0
        while i < total:
            j = i + 1
            while j < total and buf[j] == buf[i]:
                j += 1
            if j - i >= min_count:
                out_pos[base + n_unique] = buf[i]
                out_cnt[base + n_unique] = j - i
                n_unique += 1
            i = j
        # stable counting sort by count descending (positions stay ascending within a count)
        hist = np.zeros(n_tables + 2, np.int64)
        for u in range(n_unique):
            hist[n_tables - out_cnt[base + u]] += 1
        acc = 0
        for c in range(n_tables + 1):
            h = hist[c]
            hist[c] = acc
            acc += h
        tmp_pos = buf[:n_unique].copy()
        tmp_cnt = np.empty(n_unique, np.int32)
        for u in range(n_unique):
            slot = hist[n_tables - out_cnt[base + u]]
            hist[n_tables - out_cnt[base + u]] += 1
            tmp_pos[slot] = out_pos[base + u]
            tmp_cnt[slot] = out_cnt[base + u]
        for u in range(n_unique):
            out_pos[base + u] = tmp_pos[u]
            out_cnt[base + u] = tmp_cnt[u]
        lengths[q] = n_unique


@numba.njit(cache=True, nogil=True)
def _weighted_probe(start, stop, query_keys, tables, weights, bound, out_pos, out_score, lengths):
    """Candidates of queries ``start..stop``: gather the postings of the query's keys table
    by table, add ``weights[t]`` per table to each position's score (in table order), then
    order by score descending, position ascending."""
    for q in range(start, stop):
        base = bound[q]
        total = _gather(q, query_keys, tables, out_pos, out_score, base)  # score: the table
        if total == 0:
            lengths[q] = 0
            continue
        pos = out_pos[base : base + total].copy()
        tab = out_score[base : base + total].copy()
        order = np.argsort(pos, kind="mergesort")  # stable: tables stay in order
        n_unique = 0
        i = 0
        while i < total:
            p0 = pos[order[i]]
            score = 0.0
            j = i
            while j < total and pos[order[j]] == p0:
                score += weights[np.int64(tab[order[j]])]
                j += 1
            out_pos[base + n_unique] = p0
            out_score[base + n_unique] = score
            n_unique += 1
            i = j
        # positions are ascending; a stable sort on -score keeps them so within a score
        neg = -out_score[base : base + n_unique]
        rank = np.argsort(neg, kind="mergesort")
        pos_sorted = out_pos[base : base + n_unique][rank].copy()
        score_sorted = out_score[base : base + n_unique][rank].copy()
        out_pos[base : base + n_unique] = pos_sorted
        out_score[base : base + n_unique] = score_sorted
        lengths[q] = n_unique


# ----------------------------------------------------------------------------- the index


@persistable
class TableIndex(IndexBase):
    """Inverted index of L hash tables over integer keys; returns candidates, not distances.

    The candidate-selection stage of Li et al., *Learning to Search Efficiently in High Dimensions*, NIPS 2011 (§2 and §3.4): an item is a
    candidate for a query when they share a key in at least ``min_count`` of the L tables
    (``min_count=1``: the paper's ``T(q, x) > 0``). Pair it with an exact re-ranking stage:
    ``Searcher(bucketer, TableIndex(...), rerank="euclidean")``.

    Parameters
    ----------
    n_tables : int
        L, the number of keys per item (trees in a forest, tables of an LSH family).
    bucketer : fitted bucketer, optional
        The bucketer whose keys the index will hold (``BoostedSearchForest``,
        ``KMeansTree``, ``LSHTables``). Its ``key_tag_`` is kept, and keys carrying another
        tag -- produced by a different bucketer -- are refused with a ``ValueError``.
        Without it, any int64 keys are accepted.

    Notes
    -----
    Not in the ``make_index`` registry: it holds integer keys, not ``n_bits``-bit codes.
    Ids follow the other indexes: ``add`` numbers from one past the largest id ever added,
    ``remove`` never renumbers. Internal positions are int32, so at most 2**31 - 1 items.
    The ids and tables live in an :class:`~hashlearn.index._storage.IdStore` snapshot:
    ``candidates`` may run in several threads while another thread adds or removes items,
    each call seeing the index before or after each write.

    Examples
    --------
    >>> import numpy as np
    >>> from hashlearn.index.table import TableIndex
    >>> index = TableIndex(2)
    >>> index.add(np.array([[1, 7], [1, 8], [2, 7]]))
    array([0, 1, 2])
    >>> [(ids.tolist(), counts.tolist()) for ids, counts in index.candidates([[1, 7]])]
    [([0, 1, 2], [2, 1, 1])]
    """

    def __init__(self, n_tables: int, bucketer=None):
        self.n_tables = check_int(n_tables, "n_tables", "TableIndex")
        self.key_tag: int | None = None
        if bucketer is not None:
            tag = getattr(bucketer, "key_tag_", None)
            if tag is None:
                raise ValueError(
                    "bucketer must be a fitted hashlearn bucketer (with key_tag_); "
                    f"got {type(bucketer).__name__} without one (fit it first)."
                )
            n_b = bucketer.n_tables
            if n_b != self.n_tables:
                raise ValueError(
                    f"bucketer makes {n_b} keys per item but n_tables={self.n_tables}."
                )
            self.key_tag = int(tag)
        self._store = IdStore({}, type(self).__name__)
        self._store.snapshot.attach("tables", self._pack([]))

    def __repr__(self) -> str:
        return f"TableIndex(n_tables={self.n_tables}, ntotal={len(self)})"

    # ------------------------------------------------------------------------ validation

    def _check_keys(self, keys, name: str) -> np.ndarray:
        keys = as_plain_array(keys, name)
        if not isinstance(keys, np.ndarray):
            keys = np.asarray(keys)
            if keys.dtype == object:
                raise TypeError(f"{name} must be an integer array of shape (n, {self.n_tables}).")
        if not np.issubdtype(keys.dtype, np.integer) or keys.dtype == bool:
            raise TypeError(
                f"{name} must have an integer dtype (int64 keys from a bucketer's "
                f"keys(X)). Got dtype {keys.dtype} instead."
            )
        if keys.ndim != 2 or keys.shape[1] != self.n_tables:
            hint = " Use keys.reshape(1, -1) for one item." if keys.ndim == 1 else ""
            raise ValueError(
                f"{name} must be a 2-D array of shape (n, {self.n_tables}) (one "
                f"key per table). Got shape {keys.shape}.{hint}"
            )
        if keys.dtype == np.uint64 and keys.size and keys.max() > np.iinfo(np.int64).max:
            raise ValueError(f"{name} holds keys above the int64 range.")
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        if self.key_tag is not None and keys.size:
            tags = (keys >> KEY_TAG_SHIFT) & KEY_TAG_MASK
            if np.any(tags != self.key_tag):
                raise ValueError(
                    f"{name} were not made by the bucketer this index was built for (key tag "
                    f"{int(tags.flat[np.argmax(tags.ravel() != self.key_tag)])} instead of "
                    f"{self.key_tag}): encode with the same fitted bucketer."
                )
        return keys

    # ------------------------------------------------------------------------ building

    def _split(self, t: dict) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The packed tables ``t`` as one ``(keys, offsets, postings)`` per table."""
        out = []
        offsets, postings = t["offsets"], t["postings"]
        for i in range(self.n_tables):
            lo, hi = int(t["table_ptr"][i]), int(t["table_ptr"][i + 1])
            offs = np.asarray(offsets[lo : hi + 1]) - offsets[lo]
            post = np.asarray(postings[offsets[lo] : offsets[hi]])
            out.append((np.asarray(t["table_keys"][lo:hi]), offs, post))
        return out

    def _pack(self, tables) -> dict[str, np.ndarray]:
        """One table per key position packed into four flat arrays."""
        if not tables:
            tables = [(np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int32))]
            tables *= self.n_tables
        sizes = [len(k) for k, _, _ in tables]
        offs, shift = [np.zeros(1, np.int64)], 0
        for _, o, p in tables:
            offs.append(o[1:] + shift)
            shift += len(p)
        return {
            "table_keys": np.concatenate([k for k, _, _ in tables]).astype(np.int64),
            "table_ptr": np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
            "offsets": np.concatenate(offs).astype(np.int64),
            "postings": np.concatenate([p for _, _, p in tables]).astype(np.int32),
        }

    def add(self, keys, ids=None) -> np.ndarray:
        """Add items with their keys ``(n, n_tables)`` (one per table) and optional ids.

        Returns the ids of the added items (int64, in the order of ``keys``). Duplicate ids,
        or ids already present, raise ``ValueError``; so do automatic ids past ``2**63 - 1``.
        """
        keys = self._check_keys(keys, "keys")
        m = keys.shape[0]
        with self._store.writing() as old:
            new_ids = self._store.new_ids(ids, m)
            if m == 0:
                return new_ids
            if old.n + m >= 2**31:
                raise ValueError("TableIndex holds at most 2**31 - 1 items.")
            snap, buffers, old_to_new, added_to_new = self._store.plan_add(
                {}, new_ids, positions=True
            )
            tables = []
            for t, (tk, to, tp) in enumerate(self._split(old.cached("tables"))):
                old_keys = np.repeat(tk, np.diff(to))
                tables.append(
                    build_table(
                        np.concatenate([old_keys, keys[:, t]]),
                        np.concatenate([old_to_new[tp], added_to_new]),
                    )
                )
            snap.attach("tables", self._pack(tables))
            self._store.publish(snap, buffers=buffers)
        return new_ids

    def remove(self, ids, *, missing: str = "raise") -> int:
        """Remove items by id; the others keep theirs. Returns the number removed.

        ``missing="raise"`` refuses ids not in the index (removing nothing);
        ``missing="ignore"`` skips them.
        """
        with self._store.writing() as old:
            snap, keep, removed = self._store.plan_remove(ids, missing)
            if not removed:
                return 0
            new_pos = np.cumsum(keep) - 1
            tables = []
            for tk, to, tp in self._split(old.cached("tables")):
                tp = tp.astype(np.int64)
                alive = keep[tp]
                tables.append(build_table(np.repeat(tk, np.diff(to))[alive], new_pos[tp[alive]]))
            snap.attach("tables", self._pack(tables))
            self._store.publish(snap)
        return removed

    # ------------------------------------------------------------------------ querying

    def candidates_csr(
        self, query_keys, min_count: int = 1, *, n_threads: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Candidates of every query in CSR form ``(lims, ids, counts)``.

        The candidates of query ``q`` are ``ids[lims[q]:lims[q+1]]`` with their collision
        counts (number of tables where the query's key equals the item's), ordered by count
        descending, then id ascending; only items colliding in ``>= min_count`` tables.
        """
        min_count = check_int(min_count, "min_count", "TableIndex.candidates", high=self.n_tables)
        return self._probe(query_keys, _count_probe, min_count, np.int32, n_threads)

    def weighted_candidates_csr(
        self, query_keys, weights, *, n_threads: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Candidates ranked by a weighted vote of the tables: CSR ``(lims, ids int64,
        scores float64)``.

        The candidate set is the paper's ``{x : T(q, x) > 0}``, the items sharing the query's
        key in at least one table; each is scored by the ensemble selection function
        ``T(q, x) = sum_l w_l 1(key_l(q) == key_l(x))`` (Li, Ning, Cao, Zhang, Gong & Huang,
        "Learning to Search Efficiently in High Dimensions", NIPS 2011, eq. 8, with ``w_l`` the
        tree weights ``c_m`` of eq. 15 for a boosted search forest) and ordered by score
        descending, then id ascending. The weights are summed in table order. With unit
        weights the score is the collision count of :meth:`candidates_csr`.

        ``weights`` must be positive and finite, one per table.
        """
        weights = np.asarray(weights, dtype=np.float64)
        if weights.shape != (self.n_tables,):
            raise ValueError(
                f"weights must have shape ({self.n_tables},), one per table. Got {weights.shape}."
            )
        if not np.all(np.isfinite(weights)) or np.any(weights <= 0):
            raise ValueError("weights must be positive and finite.")
        return self._probe(query_keys, _weighted_probe, weights, np.float64, n_threads)

    def _probe(self, query_keys, kernel, param, score_dtype, n_threads):
        """Run a probe kernel (``_count_probe`` or ``_weighted_probe``, with its ``param``)
        over the queries of one snapshot on the thread pool; CSR ``(lims, ids, scores)``."""
        snap = self._store.snapshot
        t = snap.cached("tables")
        tables = (t["table_keys"], t["table_ptr"], t["offsets"], t["postings"])
        query_keys = self._check_keys(query_keys, "query_keys")
        m = query_keys.shape[0]
        sizes = np.zeros(m, np.int64)
        gathered_sizes(query_keys, t["table_keys"], t["table_ptr"], t["offsets"], sizes)
        bound = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        out_pos = np.empty(bound[-1], np.int32)
        out_score = np.empty(bound[-1], score_dtype)
        lengths = np.zeros(m, np.int64)

        def run(start: int, stop: int) -> None:
            kernel(start, stop, query_keys, tables, param, bound, out_pos, out_score, lengths)

        parallel_chunks(run, m, n_threads)
        lims = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        keep = np.repeat(bound[:-1], lengths) + (
            np.arange(lims[-1]) - np.repeat(lims[:-1], lengths)
        )
        return lims, np.asarray(snap.ids)[out_pos[keep]], out_score[keep]

    def candidates(
        self, query_keys, min_count: int = 1, *, n_threads: int | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """One ``(ids int64, counts int32)`` pair per query, see :meth:`candidates_csr`."""
        lims, ids, counts = self.candidates_csr(query_keys, min_count, n_threads=n_threads)
        return [
            (ids[lims[q] : lims[q + 1]], counts[lims[q] : lims[q + 1]])
            for q in range(len(lims) - 1)
        ]

    def bucket_sizes(self) -> np.ndarray:
        """Posting-list lengths of every key of every table, concatenated."""
        return np.diff(self._store.snapshot.cached("tables")["offsets"])

    # ------------------------------------------------------------------------ persistence

    def _get_state(self):
        snap = self._store.snapshot
        params = {"n_tables": self.n_tables}
        state = {"key_tag": self.key_tag, "next_id": snap.next_id}
        return params, state, {"ids": snap.ids, **snap.cached("tables")}

    @classmethod
    def _from_state(cls, params, state, arrays):
        """Every array is checked in O(n L) before use: ids, table layout, offsets, and
        each table holding every item's position exactly once."""
        obj = cls(int(params["n_tables"]))
        tag = require_state(state, "key_tag", int, low=0, high=KEY_TAG_MASK, optional=True)
        obj.key_tag = tag
        ids = check_ids_array(arrays)
        next_id = check_next_id(state, ids)
        n, L = len(ids), obj.n_tables
        if n >= 2**31:
            raise ValueError("a TableIndex holds at most 2**31 - 1 items")
        t = {
            "table_keys": require_array(arrays, "table_keys", np.int64, 1),
            "table_ptr": require_array(arrays, "table_ptr", np.int64, 1),
            "offsets": require_array(arrays, "offsets", np.int64, 1),
            "postings": require_array(arrays, "postings", np.int32, 1),
        }
        ptr, offsets = t["table_ptr"], t["offsets"]
        if (
            ptr.shape != (L + 1,)
            or ptr[0] != 0
            or ptr[-1] != len(t["table_keys"])
            or np.any(np.diff(ptr) < 0)
        ):
            raise ValueError(f"table_ptr does not split the keys into {L} tables")
        if len(offsets) != len(t["table_keys"]) + 1 or len(t["postings"]) != n * L:
            raise ValueError(
                f"{len(t['table_keys'])} keys, {len(offsets)} offsets and "
                f"{len(t['postings'])} postings do not fit {n} items in {L} tables"
            )
        if offsets[0] != 0 or offsets[-1] != len(t["postings"]) or np.any(np.diff(offsets) <= 0):
            raise ValueError("the tables are corrupted: offsets not strictly increasing")
        for i in range(L):
            lo, hi = int(ptr[i]), int(ptr[i + 1])
            check_table(
                t["table_keys"][lo:hi],
                offsets[lo : hi + 1] - offsets[lo],
                t["postings"][offsets[lo] : offsets[hi]],
                n,
                positions=True,
                what=f"table {i}",
            )
        if tag is not None and len(t["table_keys"]):
            tags = (t["table_keys"] >> KEY_TAG_SHIFT) & KEY_TAG_MASK
            if np.any(tags != tag):
                raise ValueError(f"the tables hold keys without the key tag {tag}")
        obj._store.restore(ids, {}, next_id, {"tables": t})
        return obj

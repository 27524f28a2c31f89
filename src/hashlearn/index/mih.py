"""Multi-index hashing: exact sub-linear k-NN in Hamming space.

Norouzi, Punjani & Fleet, "Fast search in Hamming space with multi-index hashing", CVPR 2012.
Each ``b``-bit code is cut into ``m`` disjoint substrings of about ``b / m`` bits, and each
substring position gets its own hash table (substring value -> codes). By the pigeonhole
principle, two codes at Hamming distance ``d`` agree within ``floor(d / m)`` bits on at least
one substring, so the neighbours of a query are found by probing each table with the
query's substring and the substrings at radius ``0, 1, 2, ...`` around it. After table ``s``
has been probed at radius ``r`` (the tables after it at ``r - 1``) every code not yet seen is
at distance at least

.. math:: d \\ge r\\,m + s + 1

(the paper's Proposition 1 with its per-table refinement), so the search stops as soon as
the k-th best verified distance is below that bound: the result is *exact*, and identical to
:class:`~hashlearn.index.flat.FlatIndex` (ties by smaller id).

The default ``m`` is the paper's ``round(b / log2 n)`` (§5), so substrings are about
``log2 n`` bits long. Tables are the sorted-keys + CSR posting lists of
:mod:`hashlearn._utils.postings`, holding database *positions*; a table whose key space ``2**len``
is at most ``8 n`` (and ``len <= 24``) is dense, direct-addressed by the substring value.
Beside the positions each table keeps a copy of the codes in posting order (``m`` copies of
the codes in all), so a bucket is verified by one sequential read, a block of 64 distances at
a time, instead of a cache miss per candidate; a candidate is looked at only when it is
within the current k-th distance, and a repeat (a code found again in another table) is
dropped against the k results, so no visited set is kept (:mod:`hashlearn.index._mih_kernels`).

A cost model, in units of one code word scanned by FlatIndex, decides between probing and
scanning: a probed bucket and a verified code word each have a cost measured against the
scan (see ``_PROBE_COST``, ``_CODE_COST``). The first 8 queries of a batch (one in 32 of a
smaller batch, at least 2) are probed with half a scan's budget, checked after every batch
of probes; when their mean cost (an abandoned query counted as its budget plus a
scan) exceeds half a scan, the rest of the batch goes to FlatIndex's scan (uniform random
codes do, at k >= 10 on 10M x 64 bits); otherwise every query probes with a scan's budget, and
the queries that exceed it are scanned together at the end. The worst case is thus about
1.5 scans for the pilot queries and 2 for an abandoned one.

Tables are rebuilt, by the first search after an ``add``/``remove``, for the snapshot that
search reads (build time O(n m log n)); a saved index stores the tables, not the code copies,
which are gathered again when it is loaded (O(n m)).
"""

from __future__ import annotations

import math

import numpy as np

from hashlearn._utils.kernel_args import frozen
from hashlearn._utils.parallel import parallel_chunks
from hashlearn._utils.postings import build_table
from hashlearn._utils.validation import check_int
from hashlearn.codes import as_words
from hashlearn.index import _mih_kernels
from hashlearn.index._storage import Snapshot, check_code_state
from hashlearn.index.base import BinaryIndex, register_index
from hashlearn.index.flat import scan_range_search, scan_search
from hashlearn.io import persistable, require_array

__all__ = ["MultiIndexHashing"]

_DENSE_MAX_BITS = 24
_MAX_SUBSTRING_BITS = 63

# The cost model, in units of one code word scanned by FlatIndex (~0.3 ns): a probed bucket
# (cache misses on its offsets and its first codes) and a verified code word (read in
# sequence with its bucket). Fitted on single-query CPU times at 10M x 64-bit codes
# (uniform and clustered): ~70-110 ns per probe, 1-2 ns per verified code (4 in buckets of
# a few codes).
_SCAN_COST = 1
_PROBE_COST = 320
_CODE_COST = 6
# queries probed first to decide whether a batch probes or scans: 8, or one in 32 of a
# smaller batch (at least 2), so a hopeless pilot wastes at most ~1/64 of the batch's scans
_PILOT_QUERIES = 8
_QUERY_BUDGET = 1.0  # a probing query is abandoned (and scanned) past this many scans
# a batch probes only when its pilot costs under half a scan: the cost of a probe (a cache
# miss) varied 1.5x with the machine's memory load, and uniform codes at 10M x 64 bits,
# k = 10, modelled at 0.7 scans, ran at 0.77x-1.8x FlatIndex from one run to the next
_PROBE_MARGIN = 0.5


@persistable
@register_index("mih")
class MultiIndexHashing(BinaryIndex):
    """Exact k-NN and range search by multi-index hashing (Norouzi et al., CVPR 2012).

    Parameters
    ----------
    n_bits : int
        Code length in bits.
    n_substrings : int or "auto"
        Number ``m`` of substring tables, in ``[ceil(n_bits / 63), n_bits]``. ``"auto"``
        uses ``round(n_bits / log2(n))`` for the current database size ``n`` (re-chosen
        whenever the tables are rebuilt), the paper's recommendation; on clustered codes at
        10M x 64 bits it beat ``m = 4`` (LSH codes: 24x FlatIndex against 12x at k = 10).

    Notes
    -----
    ``search`` and ``range_search`` return exactly what :class:`FlatIndex` returns for the
    same codes and ids (same ``(distance, id)`` order, ``-1`` padding, radius ``<= r``).
    Searches may run in several threads while another thread adds or removes codes; each
    sees the index before or after each write.

    Examples
    --------
    >>> import numpy as np
    >>> from hashlearn.index.mih import MultiIndexHashing
    >>> index = MultiIndexHashing(64)
    >>> index.add(np.zeros((3, 8), np.uint8), ids=[10, 11, 12])
    array([10, 11, 12])
    >>> index.search(np.zeros((1, 8), np.uint8), k=2)[1].tolist()
    [[10, 11]]
    """

    def __init__(self, n_bits: int, n_substrings: int | str = "auto"):
        super().__init__(n_bits)
        low = -(-self.n_bits // _MAX_SUBSTRING_BITS)
        if not (isinstance(n_substrings, str) and n_substrings == "auto"):
            check_int(n_substrings, "n_substrings", "MultiIndexHashing", low=low, high=self.n_bits)
        self.n_substrings = n_substrings

    # ------------------------------------------------------------------------ properties

    @property
    def n_substrings_(self) -> int:
        """The number of substring tables in use (resolves ``"auto"``)."""
        snap = self._store.snapshot
        tables = snap.cached("mih")
        if tables is not None:
            return len(tables["sub_start"])
        return self._resolve_m(snap.n)

    def _resolve_m(self, n: int) -> int:
        low = -(-self.n_bits // _MAX_SUBSTRING_BITS)
        if self.n_substrings != "auto":
            return int(self.n_substrings)
        m = round(self.n_bits / math.log2(max(n, 2)))
        return int(min(self.n_bits, max(low, m, 1)))

    # -------------------------------------------------------------------------- building

    def build(self) -> MultiIndexHashing:
        """Build the substring tables now (otherwise done by the first search after an add)."""
        self._tables_of(self._store.snapshot)
        return self

    def _tables_of(self, snap: Snapshot) -> dict[str, np.ndarray]:
        return snap.derived("mih", self._build_tables)

    def _build_tables(self, snap: Snapshot) -> dict[str, np.ndarray]:
        n = snap.n
        m = self._resolve_m(n)
        bounds = [self.n_bits * s // m for s in range(m + 1)]
        sub_start = np.asarray(bounds[:-1], np.int64)
        sub_len = np.diff(bounds).astype(np.int64)
        words = snap.rows["words"].reshape(-1)
        n_words = self._n_words
        positions = np.arange(n, dtype=np.int64)
        key_parts, off_parts, post_parts = [], [], []
        dense = np.zeros(m, np.bool_)
        key_lo = np.zeros(m, np.int64)
        key_hi = np.zeros(m, np.int64)
        off_lo = np.zeros(m, np.int64)
        n_keys = n_offsets = n_postings = 0
        substring = np.empty(n, np.int64)
        for s in range(m):
            _mih_kernels.substring_keys(
                words, n, n_words, int(sub_start[s]), int(sub_len[s]), substring
            )
            length = int(sub_len[s])
            if length <= _DENSE_MAX_BITS and (1 << length) <= max(8 * n, 256):
                counts = np.bincount(substring, minlength=1 << length)
                offsets = np.zeros((1 << length) + 1, np.int64)
                np.cumsum(counts, out=offsets[1:])
                postings = np.argsort(substring, kind="stable").astype(np.int64)
                keys = np.zeros(0, np.int64)
                dense[s] = True
            else:
                keys, offsets, postings = build_table(substring, positions)
            key_lo[s], key_hi[s] = n_keys, n_keys + len(keys)
            off_lo[s] = n_offsets
            key_parts.append(keys)
            off_parts.append(offsets + n_postings)
            post_parts.append(postings)
            n_keys += len(keys)
            n_offsets += len(offsets)
            n_postings += len(postings)
        postings = np.concatenate(post_parts)
        return {
            "sub_start": sub_start,
            "sub_len": sub_len,
            "dense": dense,
            "key_lo": key_lo,
            "key_hi": key_hi,
            "off_lo": off_lo,
            "keys": np.concatenate(key_parts),
            "offsets": np.concatenate(off_parts),
            "postings": postings,
            "codes": _bucket_codes(snap.rows["words"], postings),
        }

    # ---------------------------------------------------------------------------- search

    def search(
        self, queries: np.ndarray, k: int, *, n_threads: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest codes of each query: ``(D int32 (m, k), I int64 (m, k))``.

        Exact: sorted by (distance, id) and padded with ``-1``, exactly as FlatIndex.
        """
        snap = self._store.snapshot
        queries = self._check_queries(queries)
        k = self._check_k(k, queries.shape[0])
        return self._search(snap, queries, k, n_threads)[:2]

    def _search(self, snap: Snapshot, queries: np.ndarray, k: int, n_threads):
        """``(D, I, scanned)``: the k-NN and which queries the linear scan answered."""
        n, m_q = snap.n, queries.shape[0]
        scanned = np.ones(m_q, np.bool_)
        if m_q == 0 or n == 0 or k >= n:  # nothing to prune: the linear scan is optimal
            return (*scan_search(snap, queries, k, self.n_bits, n_threads), scanned)
        dist = np.empty((m_q, k), np.int32)
        pos = np.empty((m_q, k), np.int64)
        work = np.full(m_q, -1, np.int64)
        tables = self._tables_of(snap)
        q_words, n_words = frozen(as_words(queries), np.uint64), self._n_words
        scan_cost = n * n_words * _SCAN_COST
        costs = (_PROBE_COST, n_words * _CODE_COST, int(_QUERY_BUDGET * scan_cost))
        codes, table_args = _kernel_tables(tables)

        def probe(start: int, stop: int) -> None:
            _mih_kernels.mih_knn(
                codes, n_words, q_words, start, stop, k, self.n_bits, table_args,
                costs, dist, pos, work,
            )  # fmt: skip

        # the first queries, on half the budget, decide whether the batch probes or scans
        pilot = min(m_q, _PILOT_QUERIES, max(2, m_q // 32))
        _mih_kernels.mih_knn(
            codes, n_words, q_words, 0, pilot, k, self.n_bits, table_args,
            (_PROBE_COST, n_words * _CODE_COST, scan_cost // 2), dist, pos, work,
        )  # fmt: skip
        pilot_cost = np.where(work[:pilot] < 0, 3 * scan_cost // 2, work[:pilot]).mean()
        if pilot_cost < _PROBE_MARGIN * scan_cost:
            parallel_chunks(lambda a, b: probe(pilot + a, pilot + b), m_q - pilot, n_threads)
        scanned = work < 0
        pos[scanned] = -1  # rows the kernel left unfilled
        ids = snap.to_ids(pos)
        if scanned.any():
            rows = np.flatnonzero(scanned)
            dist[rows], ids[rows] = scan_search(snap, queries[rows], k, self.n_bits, n_threads)
        return dist, ids, scanned

    def range_search(
        self, queries: np.ndarray, radius: int, *, n_threads: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All codes within Hamming distance ``<= radius`` (faiss: ``< radius``).

        Returns ``(lims int64 (m+1,), D int32, I int64)`` in CSR form, each query's results
        sorted by (distance, id); identical to :meth:`FlatIndex.range_search`.
        """
        snap = self._store.snapshot
        queries = self._check_queries(queries)
        radius = self._check_radius(radius)
        n, m_q = snap.n, queries.shape[0]
        if m_q == 0 or n == 0:
            return scan_range_search(snap, queries, radius, self.n_bits, n_threads)
        db, n_words = frozen(snap.rows["words"].reshape(-1), np.uint64), self._n_words
        q_words = frozen(as_words(queries), np.uint64)
        tables = self._tables_of(snap)
        codes, table_args = _kernel_tables(tables)
        counts = np.zeros(m_q, np.int64)
        no_lims = np.zeros(0, np.int64)
        no_d = np.zeros(0, np.int32)
        no_p = np.zeros(0, np.int64)

        def run(start, stop, lims, dist, pos):
            _mih_kernels.mih_range(
                codes, db, n, n_words, q_words, start, stop, radius, table_args,
                lims, dist, pos, counts,
            )  # fmt: skip

        parallel_chunks(lambda a, b: run(a, b, no_lims, no_d, no_p), m_q, n_threads)
        lims = np.zeros(m_q + 1, np.int64)
        np.cumsum(counts, out=lims[1:])
        dist = np.empty(lims[-1], np.int32)
        pos = np.empty(lims[-1], np.int64)
        if lims[-1]:
            parallel_chunks(lambda a, b: run(a, b, lims, dist, pos), m_q, n_threads)
        return lims, dist, snap.to_ids(pos)

    # ------------------------------------------------------------------------ persistence

    def _get_state(self):
        snap = self._store.snapshot
        tables = self._tables_of(snap)
        arrays = {"words": snap.rows["words"], "ids": snap.ids}
        arrays.update({f"table_{name}": tables[name] for name in _TABLE_NAMES})
        params = {"n_bits": self.n_bits, "n_substrings": self.n_substrings}
        return params, {"next_id": snap.next_id}, arrays

    @classmethod
    def _from_state(cls, params, state, arrays):
        index = cls(params["n_bits"], params["n_substrings"])
        words, ids, next_id = check_code_state(arrays, state, index.n_bits)
        tables = _check_tables(index, words, arrays)
        tables["codes"] = _bucket_codes(words, tables["postings"])
        index._store.restore(ids, {"words": words}, next_id, {"mih": tables})
        return index


def _kernel_tables(tables: dict[str, np.ndarray]) -> tuple[np.ndarray | None, tuple]:
    """The bucket-ordered codes and the table arrays as read-only views, so the kernels see
    one array type whether the tables were built, loaded or memory-mapped (one compile)."""
    codes = tables.get("codes")
    codes = None if codes is None else frozen(codes, np.uint64)
    return codes, tuple(frozen(tables[name], tables[name].dtype) for name in _TABLE_NAMES)


def _bucket_codes(words: np.ndarray, postings: np.ndarray) -> np.ndarray:
    """The codes in posting order (each bucket's codes side by side), flat uint64 words."""
    n = len(words)
    out = np.empty((len(postings), words.shape[1]), np.uint64)
    for start in range(0, len(postings), n or 1):  # one table at a time
        np.take(words, postings[start : start + n], axis=0, out=out[start : start + n])
    return out.reshape(-1)


# the saved tables, in the order of the kernels' arguments (hashlearn.index._mih_kernels)
_TABLE_NAMES = (
    "sub_start",
    "sub_len",
    "dense",
    "key_lo",
    "key_hi",
    "keys",
    "off_lo",
    "offsets",
    "postings",
)
_PER_TABLE = ("sub_start", "sub_len", "dense", "key_lo", "key_hi", "off_lo")
_TABLE_DTYPES = {"dense": np.bool_}

_TABLE_ERRORS = {
    1: "the postings are not one per code and table",
    2: "the key ranges of the tables are out of bounds or keys are not ascending substrings",
    3: "the offset ranges of the tables are out of bounds",
    4: "the offsets are not monotone or do not span each table's postings",
    5: "a posting is outside [0, n)",
    6: "a code is posted twice in one table",
    7: "a code is posted under another key than its substring",
    8: "the tables have trailing keys or offsets",
}


def _check_tables(index: MultiIndexHashing, words: np.ndarray, arrays) -> dict[str, np.ndarray]:
    """The saved substring tables, checked against the codes in O(n m)."""
    tables = {
        name: require_array(arrays, f"table_{name}", _TABLE_DTYPES.get(name, np.int64), 1)
        for name in _TABLE_NAMES
    }
    m = len(tables["sub_start"])
    low = -(-index.n_bits // _MAX_SUBSTRING_BITS)
    if not low <= m <= index.n_bits or any(len(tables[name]) != m for name in _PER_TABLE):
        raise ValueError(f"the substring tables do not describe {low}..{index.n_bits} tables")
    if index.n_substrings != "auto" and m != index.n_substrings:
        raise ValueError(f"{m} substring tables saved for n_substrings={index.n_substrings}")
    sub_len, sub_start = tables["sub_len"], tables["sub_start"]
    if (
        np.any(sub_len < 1)
        or np.any(sub_len > _MAX_SUBSTRING_BITS)
        or int(sub_len.sum()) != index.n_bits
        or sub_start[0] != 0
        or np.any(sub_start[1:] != np.cumsum(sub_len)[:-1])
        or np.any(tables["dense"] & (sub_len > _DENSE_MAX_BITS))
    ):
        raise ValueError(f"the substring layout does not tile the {index.n_bits}-bit codes")
    error = _mih_kernels.mih_check_tables(
        frozen(words.reshape(-1), np.uint64), len(words), index._n_words, *_kernel_tables(tables)[1]
    )
    if error:
        raise ValueError(
            f"the substring tables do not match the stored codes: {_TABLE_ERRORS[error]}"
        )
    return tables

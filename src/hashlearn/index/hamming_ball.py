"""Hamming-ball lookup: binary codes used as hash-table addresses (semantic hashing).

Grauman & Fergus, *Learning Binary Hash Codes for Large-Scale Image Search*, 2013 §2.2
(Salakhutdinov & Hinton's semantic hashing; also the inverted index of the LambdaRank
bit-vector paper (WWW), Sec. 5.5): every database code is a key of a hash table whose
posting list holds the items with that code. A query does not scan the database; it
enumerates its *Hamming ball*, the codes at distance 0, 1, 2, ... from its own code, in order
of distance, and looks each one up. A ball of radius ``r`` around a ``b``-bit code holds
:math:`\\sum_{i \\le r} \\binom{b}{i}` codes (529 for b = 32, r = 2), so a query costs that
many lookups whatever the database size.

Storage is :mod:`hashlearn._utils.postings` (sorted int64 keys + CSR posting lists of positions),
laid out for lookups: rows ``(key, first entry)`` side by side, the entries ``(id, code)``
in bucket order so a bucket's codes are verified by one sequential read, a
*directory* over the top ``p`` bits of the keys (``2^p`` about a quarter of the number of
distinct keys, so it stays in cache) that narrows a lookup to a few adjacent key rows, and an
occupancy bitmap over the top ``p + 6`` bits (2 bytes per distinct code) that answers the
common case -- the probed code is absent -- in one cached read.

Keys. Every code goes through a second, 64-bit mixing hash (splitmix64, chained over the
code's 64-bit words) and keeps its top 63 bits as the table key; that spreads learned, skewed
codes evenly over the directory. For codes longer than 32 bits (and, rarely, for shorter
ones, since one bit of the hash is dropped) two codes can share a key. **Collisions are
handled by verification**: each posting found for a probed code is checked by its true
Hamming distance to the query and kept only when that distance equals the level being
enumerated. An item whose key collides with a probed code at another distance is skipped
there and found at its own level, so results are exactly those of
:class:`~hashlearn.index.flat.FlatIndex`.

Fallback. When the ball is bigger than the database (``sum_{i<=r} C(b, i) > len(index)``) a
lookup per ball code costs more than comparing with every code -- in practice already when
it is bigger than ``len(index) / probe_cost``, a probe being a random memory access and a
scan step a streamed popcount -- so ``range_search`` scans
(:func:`~hashlearn.index.flat.scan_range_search` over the same codes) for that radius, and ``search(q, k)`` enumerates levels only
while the ball stays smaller than the database and scans the queries that have not found ``k``
items by then (when a uniformly spread database would leave that ball nearly empty, a batch
whose pilot -- one query in 32 -- finds nothing within distance 1 is scanned without probing).
Results are identical either way.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from hashlearn._utils.parallel import parallel_chunks
from hashlearn._utils.popcount import popcount64
from hashlearn._utils.postings import build_table, check_table, find_in
from hashlearn._utils.primitives import grow_hits, prefetch, sort_ids, splitmix64
from hashlearn._utils.validation import check_real
from hashlearn.codes import as_words
from hashlearn.index._storage import Snapshot, check_code_state
from hashlearn.index.base import BinaryIndex, register_index
from hashlearn.index.flat import scan_range_search, scan_search
from hashlearn.io import persistable, require_array

__all__ = ["HammingBallIndex", "ball_size"]


def ball_size(n_bits: int, radius: int) -> int:
    """Number of codes within Hamming distance ``<= radius`` of a ``n_bits``-bit code."""
    return sum(math.comb(n_bits, i) for i in range(min(radius, n_bits) + 1))


@numba.njit(cache=True, nogil=True)
def _key(words, offset, n_words):
    """Table key of a code: splitmix64 chained over its words, top 63 bits."""
    h = np.uint64(0)
    for w in range(n_words):
        h = splitmix64(h ^ words[offset + w])
    return np.int64(h >> np.uint64(1))


@numba.njit(cache=True, nogil=True)
def _keys_of(words, n, n_words):
    out = np.empty(n, np.int64)
    for i in range(n):
        out[i] = _key(words, i * n_words, n_words)
    return out


@numba.njit(cache=True, nogil=True)
def _fill_bitmap(keys, bitmap, bitmap_shift):
    for i in range(keys.shape[0]):
        b = keys[i] >> bitmap_shift
        bitmap[b >> 6] |= np.uint64(1) << np.uint64(b & 63)


@numba.njit(nogil=True, inline="always")
def _may_hold(bitmap, bitmap_shift, key):
    """False when no key has the top bits of ``key``: the common case, answered from cache."""
    b = key >> bitmap_shift
    return ((bitmap[b >> 6] >> np.uint64(b & 63)) & np.uint64(1)) != np.uint64(0)


@numba.njit(nogil=True, inline="always")
def _find_row(kv, lo, hi, key):
    """Row of ``key`` among the key rows ``kv[lo:hi]`` (sorted), or -1."""
    if hi - lo > _LINEAR_ROWS:  # a crowded directory slot: binary search
        return find_in(kv[:, 0], lo, hi, key)
    for row in range(lo, hi):  # a few rows, one or two cache lines
        if kv[row, 0] >= key:
            return row if kv[row, 0] == key else -1
    return -1


_LINEAR_ROWS = 16  # directory slots hold ~4 keys; longer ones are binary searched
_PROBE_BATCH = 64  # probe keys computed before they are looked up
_PILOT_EVERY = 32  # the pilot of a k-NN batch: one query in 32 (see HammingBallIndex.search)


@numba.njit(nogil=True, inline="always")
def _next_combination(comb, level, n_bits):
    """Advance ``comb[:level]`` to the next ``level``-subset of ``range(n_bits)`` in
    lexicographic order; False when it was the last one."""
    i = level - 1
    while i >= 0 and comb[i] == n_bits - level + i:
        i -= 1
    if i < 0:
        return False
    comb[i] += 1
    for j in range(i + 1, level):
        comb[j] = comb[j - 1] + 1
    return True


@numba.njit(nogil=True, inline="always")
def _probe_key(queries, qo, n_words, comb, level, probe):
    """Key of the query code ``queries[qo:qo+W]`` with bits ``comb[:level]`` flipped."""
    if n_words == 1:  # the common case (codes up to 64 bits): no copy, one mixing step
        word = queries[qo]
        for i in range(level):
            word ^= np.uint64(1) << np.uint64(comb[i])
        return np.int64(splitmix64(word) >> np.uint64(1))  # _key of a one-word code
    for w in range(n_words):
        probe[w] = queries[qo + w]
    for i in range(level):
        bit = comb[i]
        probe[bit >> 6] ^= np.uint64(1) << np.uint64(bit & 63)
    return _key(probe, 0, n_words)


@numba.njit(cache=True, nogil=True)
def _ball_chunk(
    n_words,
    kv,
    entries,
    directory,
    shift,
    bitmap,
    bitmap_shift,
    queries,
    q_start,
    q_end,
    max_level,
    k,
    n_bits,
):
    """Enumerate the Hamming ball of queries ``q_start:q_end`` level by level.

    Stops a query after level ``max_level`` or after the first level at which it has ``k``
    items (``k = 0``: never). Returns ``(counts, ids, dist)``: per query its number of
    results, and the results concatenated in query order, sorted by (distance, id).
    """
    m = q_end - q_start
    counts = np.zeros(m, np.int64)
    hit_ids = np.empty(1024, np.int64)
    dist = np.empty(1024, np.int32)
    total = 0
    probe = np.empty(n_words, np.uint64)
    comb = np.empty(max(max_level, 1), np.int64)
    batch = np.empty(_PROBE_BATCH, np.int64)
    lows = np.empty(_PROBE_BATCH, np.int64)
    highs = np.empty(_PROBE_BATCH, np.int64)
    scratch = np.empty(1024, np.int64)  # for sorting a level's ids
    digit_counts = np.empty(256, np.int64)
    for qi in range(m):
        qo = (q_start + qi) * n_words
        found = 0
        for level in range(max_level + 1):
            level_start = total
            n_buckets = 0
            for i in range(level):
                comb[i] = i
            more = True
            while more:
                # a batch of probe keys first, then their lookups: the bitmap reads of a
                # batch are independent, so the CPU overlaps their cache misses
                n_batch = 0
                while more and n_batch < _PROBE_BATCH:
                    key = _probe_key(queries, qo, n_words, comb, level, probe)
                    batch[n_batch] = key
                    prefetch(bitmap, (key >> bitmap_shift) >> 6)
                    n_batch += 1
                    more = _next_combination(comb, level, n_bits)
                # then, in stages that each prefetch what the next one reads: the
                # directory slots of the probes that pass the bitmap, their key rows, the
                # buckets of those found
                n_pass = 0
                for b in range(n_batch):
                    key = batch[b]
                    if _may_hold(bitmap, bitmap_shift, key):
                        prefetch(directory, key >> shift)
                        batch[n_pass] = key
                        n_pass += 1
                n_rows = 0
                for b in range(n_pass):
                    key = batch[b]
                    slot = key >> shift
                    lo, hi = directory[slot], directory[slot + 1]
                    if lo < hi:
                        prefetch(kv, 2 * lo)
                        batch[n_rows], lows[n_rows], highs[n_rows] = key, lo, hi
                        n_rows += 1
                n_found = 0
                for b in range(n_rows):
                    row = _find_row(kv, lows[b], highs[b], batch[b])
                    if row >= 0:
                        prefetch(entries, kv[row, 1] * (1 + n_words))
                        lows[n_found] = row
                        n_found += 1
                n_buckets += n_found
                for b in range(n_found):
                    # the bucket's entries (id, code words) are contiguous, ids ascending
                    first, stop = kv[lows[b], 1], kv[lows[b] + 1, 1]
                    hit_ids, dist = grow_hits(hit_ids, dist, total, total + stop - first)
                    for e in range(first, stop):
                        d = 0
                        for w in range(n_words):
                            d += popcount64(entries[e, 1 + w] ^ queries[qo + w])
                        if d == level:  # else a key collision: it belongs to another level
                            hit_ids[total] = np.int64(entries[e, 0])
                            dist[total] = level
                            total += 1
            if n_buckets > 1:  # one bucket's ids are sorted already
                if scratch.shape[0] < total - level_start:
                    scratch = np.empty(2 * (total - level_start), np.int64)
                sort_ids(hit_ids, level_start, total, scratch, digit_counts)
            found += total - level_start
            if k > 0 and found >= k:
                break
        counts[qi] = found
    return counts, hit_ids[:total], dist[:total]


@numba.njit(cache=True, nogil=True)
def _keys_match(db, n_words, keys, offsets, postings):
    """Whether every posting is filed under its code's key (bounds checked by the caller)."""
    for b in range(keys.shape[0]):
        for j in range(offsets[b], offsets[b + 1]):
            if _key(db, postings[j] * n_words, n_words) != keys[b]:
                return False
    return True


def _ball_table(
    keys: np.ndarray,
    offsets: np.ndarray,
    postings: np.ndarray,
    words: np.ndarray,
    ids: np.ndarray,
    n_words: int,
) -> dict:
    """The lookup structure over a table (sorted ``keys``, CSR ``offsets`` into ``postings``
    of positions) of the codes ``words`` with ``ids``: rows ``(key, first entry)``, the
    entries ``(id, code words)`` in bucket order, a directory and an occupancy bitmap.

    A probe that hits reads three places: the directory (cache-resident, ~4 keys a slot),
    one or two lines of key rows, and the bucket's entries, which carry the codes so the
    verification reads sequentially (faiss's ``IndexBinaryHash`` keeps codes by ids likewise).
    """
    u = len(keys)
    kv = np.empty((u + 1, 2), np.int64)
    kv[:u, 0], kv[u, 0] = keys, np.iinfo(np.int64).max
    kv[:, 1] = offsets
    entries = np.empty((len(postings), 1 + n_words), np.uint64)
    entries[:, 0] = ids[postings]  # postings ascend within a bucket, and so do the ids
    entries[:, 1:] = words.reshape(-1, n_words)[postings]
    p = int(min(24, max(1, math.ceil(math.log2(max(u, 2))) - 2)))
    shift = 63 - p
    bounds = np.arange(2**p + 1, dtype=np.int64) << np.int64(shift)
    bounds[-1] = np.iinfo(np.int64).max
    directory = np.searchsorted(keys, bounds).astype(np.int64)
    directory[-1] = u
    # occupancy bitmap over the top q bits of the keys (~16 bits per key, <= 128 MiB):
    # most probed codes are absent, and this answers them without touching the table
    q = int(min(30, max(6, math.ceil(math.log2(max(u, 2))) + 4)))
    bitmap_shift = 63 - q
    bitmap = np.zeros(2 ** (q - 6), np.uint64)
    _fill_bitmap(keys, bitmap, bitmap_shift)
    return {
        "kv": kv,
        "entries": entries,
        "directory": directory,
        "shift": shift,
        "bitmap": bitmap,
        "bitmap_shift": bitmap_shift,
    }


@persistable
@register_index("hamming-ball")
class HammingBallIndex(BinaryIndex):
    """Exact k-NN and range search by enumerating the query's Hamming ball.

    Semantic hashing's address lookup (Grauman & Fergus, *Learning Binary Hash Codes for Large-Scale Image Search*, 2013 §2.2): the cost of a query is
    the number of codes in its ball (:func:`ball_size`), not the database size, which makes
    it the fastest exact index for short codes and small radii (32 bits, radius <= 2).
    Results are identical to :class:`~hashlearn.index.flat.FlatIndex` (same ties by smaller
    id, same padding); see the module docstring for hashing, collisions and the fallback to
    a scan when the ball is bigger than the database.

    Parameters
    ----------
    n_bits : int
        Code length in bits.
    probe_cost : float, default=32.0
        Cost of one ball probe (a random table lookup) in units of comparing one stored code
        in a scan. A radius whose ball holds more than ``len(index) / probe_cost`` codes is
        answered by a scan instead (``probe_cost=1``: only when the ball is bigger than the
        database). Results are the same either way; only speed differs.

    ``add`` and ``remove`` rebuild the table (``O(n log n)``): add in large batches.
    Searches may run in several threads while another thread writes; each sees the index
    before or after each write. ``radius`` means distance ``<= radius`` (faiss: ``< radius``).

    Examples
    --------
    >>> import numpy as np
    >>> from hashlearn.index.hamming_ball import HammingBallIndex
    >>> index = HammingBallIndex(16)
    >>> index.add(np.array([[0, 0], [1, 0], [3, 0]], np.uint8), ids=[5, 6, 7])
    array([5, 6, 7])
    >>> D, I = index.search(np.array([[1, 0]], np.uint8), k=2)
    >>> D.tolist(), I.tolist()
    ([[0, 1]], [[6, 5]])
    """

    def __init__(self, n_bits: int, probe_cost: float = 32.0):
        super().__init__(n_bits)
        self.probe_cost = check_real(probe_cost, "probe_cost", "HammingBallIndex", low=1.0)

    @property
    def n_keys(self) -> int:
        """Number of distinct codes (occupied table entries)."""
        return len(self._table_of(self._store.snapshot)["kv"]) - 1

    # ---------------------------------------------------------------------------- build

    def add(self, codes: np.ndarray, ids=None) -> np.ndarray:
        """Add packed codes with optional distinct ids (see :meth:`FlatIndex.add`); the table
        of the new state is built before it is published."""
        codes = self._check_codes(codes)
        words = as_words(codes).reshape(codes.shape[0], self._n_words)
        with self._store.writing():
            new_ids = self._store.new_ids(ids, len(words))
            if len(new_ids):
                snap, buffers, _, _ = self._store.plan_add({"words": words}, new_ids)
                snap.attach("ball", self._build_table(snap))
                self._store.publish(snap, buffers=buffers)
        return new_ids

    def remove(self, ids, *, missing: str = "raise") -> int:
        """Remove codes by id; the other ids are kept (see :meth:`FlatIndex.remove`)."""
        with self._store.writing():
            snap, _, removed = self._store.plan_remove(ids, missing)
            if removed:
                snap.attach("ball", self._build_table(snap))
                self._store.publish(snap)
        return removed

    def _table_of(self, snap: Snapshot) -> dict:
        return snap.derived("ball", self._build_table)

    def _build_table(self, snap: Snapshot) -> dict:
        n, n_words = snap.n, self._n_words
        db = snap.rows["words"].reshape(-1)
        keys = _keys_of(db, n, n_words) if n else np.zeros(0, np.int64)
        return _ball_table(*build_table(keys, np.arange(n)), db, snap.ids, n_words)

    # --------------------------------------------------------------------------- search

    def _run_ball(self, snap, queries, max_level: int, k: int, n_threads: int | None):
        m = queries.shape[0]
        q_words = as_words(queries)
        n_words = self._n_words
        t = self._table_of(snap)
        chunks: dict[int, tuple] = {}

        def run(start: int, stop: int) -> None:
            chunks[start] = _ball_chunk(
                n_words,
                t["kv"],
                t["entries"],
                t["directory"],
                t["shift"],
                t["bitmap"],
                t["bitmap_shift"],
                q_words,
                start,
                stop,
                max_level,
                k,
                self.n_bits,
            )

        parallel_chunks(run, m, n_threads)
        starts = sorted(chunks)
        counts = np.concatenate([chunks[s][0] for s in starts]) if starts else np.zeros(0, int)
        ids = np.concatenate([chunks[s][1] for s in starts]) if starts else np.zeros(0, int)
        dist = np.concatenate([chunks[s][2] for s in starts]) if starts else np.zeros(0, int)
        lims = np.zeros(m + 1, np.int64)
        np.cumsum(counts, out=lims[1:])
        return lims, dist.astype(np.int32), ids

    def _max_level(self, n: int | None = None) -> int:
        """Largest radius whose ball, times ``probe_cost``, is not bigger than the database
        of ``n`` codes (default: the current size; -1 if none): beyond it a scan is cheaper."""
        level = -1
        n = len(self) if n is None else n
        while level < self.n_bits and ball_size(self.n_bits, level + 1) * self.probe_cost <= n:
            level += 1
        return level

    def range_search(
        self, queries: np.ndarray, radius: int, *, n_threads: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All codes within distance ``<= radius``: ``(lims, D int32, I int64)`` (CSR).

        Sorted by (distance, id). Scans instead when the ball of ``radius`` is bigger than
        the database (same results).
        """
        snap = self._store.snapshot
        queries = self._check_queries(queries)
        radius = self._check_radius(radius)
        if radius > self._max_level(snap.n):
            return scan_range_search(snap, queries, radius, self.n_bits, n_threads)
        return self._run_ball(snap, queries, radius, 0, n_threads)

    def search(
        self, queries: np.ndarray, k: int, *, n_threads: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest codes: ``(D int32 (m, k), I int64 (m, k))``, exact.

        The ball grows level by level until ``k`` items are found; queries that would need a
        ball bigger than the database, or that found nothing within distance 1 where a ball
        of the largest affordable radius is not expected to hold ``k`` codes, are answered by
        a scan (a batch of 64 or more such queries first tries a pilot, one query in 32, and
        is scanned whole when the pilot finds nothing). Sorted by (distance, id), padded
        with -1.
        """
        snap = self._store.snapshot
        queries = self._check_queries(queries)
        m, n = queries.shape[0], snap.n
        k = self._check_k(k, m)
        D = np.full((m, k), -1, np.int32)
        I = np.full((m, k), -1, np.int64)  # noqa: E741 - faiss's name
        if m == 0 or n == 0:
            return D, I
        k_eff = min(k, n)
        max_level = self._max_level(n)
        short = np.ones(m, bool)

        def ball(rows: np.ndarray, level: int) -> np.ndarray:
            """Ball up to ``level`` for ``rows``; fills the rows that reach k, returns the
            number of results of each row."""
            lims, dist, hit_ids = self._run_ball(snap, queries[rows], level, k_eff, n_threads)
            counts = np.diff(lims)
            done = counts >= k_eff
            short[rows[done]] = False
            if done.any():
                take = lims[:-1][done][:, None] + np.arange(k_eff)[None, :]
                D[rows[done], :k_eff] = dist[take]
                I[rows[done], :k_eff] = hit_ids[take]
            return counts

        if max_level >= 0:
            # The cost model: levels 0 and 1 first (1 + b probes, about 1 % of a scan of 1M
            # codes). A query that found nothing there, when the ball up to ``max_level``
            # would hold fewer than k codes of a uniformly spread database of this size, is
            # hopeless: it goes straight to the scan instead of paying for the rest of the
            # ball first (random codes: 529 probes at b = 32, r = 2, about a tenth of a scan).
            # A batch first sends a pilot (one query in 32) through levels 0 and 1: when none
            # of it finds anything there, the whole batch goes to the scan (random codes: the
            # probes would add ~1 % to the scan; the pilot adds ~0.03 %).
            first = min(1, max_level)
            expected = n * ball_size(self.n_bits, max_level) / 2.0**self.n_bits
            hopeless_when_empty = max_level > first and expected < k_eff
            rows = np.arange(m)
            if hopeless_when_empty and m >= 2 * _PILOT_EVERY:
                pilot = rows[::_PILOT_EVERY]
                if not (ball(pilot, first) > 0).any():
                    rows = rows[:0]
            found = np.zeros(m, np.int64)
            if rows.size:
                found[rows] = ball(rows, first)
            if max_level > first:
                rows = rows[short[rows]]
                if hopeless_when_empty:
                    rows = rows[found[rows] > 0]
                if rows.size:
                    ball(rows, max_level)
        if short.any():
            D_scan, I_scan = scan_search(snap, queries[short], k, self.n_bits, n_threads)
            D[short], I[short] = D_scan, I_scan
        return D, I

    # ---------------------------------------------------------------------- persistence

    def _get_state(self):
        snap = self._store.snapshot
        t = self._table_of(snap)
        params = {"n_bits": self.n_bits, "probe_cost": self.probe_cost}
        kv = t["kv"]
        arrays = {
            "words": snap.rows["words"],
            "ids": snap.ids,
            "keys": np.ascontiguousarray(kv[:-1, 0]),
            "offsets": np.ascontiguousarray(kv[:, 1]),
            "postings": np.searchsorted(snap.ids, t["entries"][:, 0].astype(np.int64)),
        }
        return params, {"next_id": snap.next_id}, arrays

    @classmethod
    def _from_state(cls, params, state, arrays):
        """Table arrays are checked against the codes in O(n); the lookup structure
        (key rows, entries with their codes, directory, bitmap) is rebuilt from them."""
        index = cls(params["n_bits"], probe_cost=params.get("probe_cost", 32.0))
        words, ids, next_id = check_code_state(arrays, state, index.n_bits)
        n = len(ids)
        keys = require_array(arrays, "keys", np.int64, 1)
        offsets = require_array(arrays, "offsets", np.int64, 1)
        postings = require_array(arrays, "postings", np.int64, 1)
        check_table(keys, offsets, postings, n, positions=True, what="the code table")
        if len(keys) and keys[0] < 0:
            raise ValueError("the code table holds negative keys")
        if not _keys_match(words.reshape(-1), index._n_words, keys, offsets, postings):
            raise ValueError("the code table files codes under keys that are not theirs")
        table = _ball_table(keys, offsets, postings, words, ids, index._n_words)
        index._store.restore(ids, {"words": words}, next_id, {"ball": table})
        return index

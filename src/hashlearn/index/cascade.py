"""Cascaded Hamming search: short codes narrow the candidates of longer codes.

the LambdaRank bit-vector paper (WWW), Sec. 6 ("Cascade architecture"): ranking functions are cascaded
in increasing order of the number of bits, each stage searching only among the neighbours
found by the previous stage. The paper's two-stage classifier on MNIST (an 8-bit ranking
function, then a 256-bit one) cut the 256-bit search set by an order of magnitude with
almost no loss of accuracy.

Every stage holds one code per item (all stages index the same items, e.g. the codes of an
8-bit and a 256-bit :class:`~hashlearn.hashers.rank.RankHashing` of the same rows). A
filtering stage keeps, for each query, the items in its ``n_bins`` nearest non-empty Hamming
bins among its candidates (the paper's relative threshold, all ties kept) or, with
``radius``, those at distance ``<= radius``; the first stage's candidates are all items. The
last stage ranks the survivors by its own Hamming distance: :meth:`Cascade.neighbors` selects
with a relative or absolute threshold again, :meth:`Cascade.search` returns the ``k``
nearest. ``search_set_sizes`` tells how many items each stage compared per query.
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np

from hashlearn._utils.popcount import popcount64
from hashlearn._utils.primitives import grow_hits
from hashlearn._utils.validation import check_codes, check_int, check_k
from hashlearn.codes import as_words
from hashlearn.index._storage import IdStore, check_ids_array, check_next_id, check_words
from hashlearn.index.base import IndexBase
from hashlearn.io import persistable, require_array

_CHUNK_PAIRS = 1 << 20  # queries x items compared per chunk: bounds the memory of a search

__all__ = ["Cascade"]


@numba.njit(cache=True, nogil=True, inline="always")
def _stage_threshold(hist, n_bits, n_bins, radius):
    """``radius`` when ``>= 0``, else the distance of the ``n_bins``-th non-empty bin of the
    histogram ``hist`` (the last non-empty one if fewer; -1 if none): the kernel form of
    :func:`hashlearn.evaluate.bin_threshold`."""
    if radius >= 0:
        return radius
    threshold, seen = -1, 0
    for d in range(n_bits + 1):
        if hist[d] > 0:
            threshold = d
            seen += 1
            if seen == n_bins:
                break
    return threshold


@numba.njit(cache=True, nogil=True)
def _select_stage(
    db,
    n_words,
    n_bits,
    queries,
    use_all,
    n_items,
    cand_lims,
    cand_pos,
    n_bins,
    radius,
    by_distance,
    max_keep,
):
    """One stage for every query: distances to its candidates, then a bin threshold.

    Candidates are all ``n_items`` positions (``use_all``) or ``cand_pos[cand_lims[i]:
    cand_lims[i+1]]`` (ascending). Keeps distance ``<= radius`` (``radius >= 0``) or the
    ``n_bins`` nearest non-empty bins. Returns ``(lims, pos, dist)`` sorted per query by
    (distance, position) if ``by_distance`` else by position (the next stage's input);
    with ``by_distance`` and ``max_keep >= 0`` only the first ``max_keep`` of each query.
    """
    m = queries.shape[0] // n_words
    lims = np.zeros(m + 1, np.int64)
    out_pos = np.empty(1024, np.int64)
    out_dist = np.empty(1024, np.int32)
    buf_d = np.empty(n_items, np.int32)
    buf_p = np.empty(n_items, np.int64)
    hist = np.zeros(n_bits + 2, np.int64)
    total = 0
    for q in range(m):
        qo = q * n_words
        if use_all:
            count = n_items
        else:
            count = cand_lims[q + 1] - cand_lims[q]
        hist[:] = 0
        for j in range(count):
            p = j if use_all else cand_pos[cand_lims[q] + j]
            d = 0
            for w in range(n_words):
                d += popcount64(db[p * n_words + w] ^ queries[qo + w])
            buf_d[j] = d
            buf_p[j] = p
            hist[d] += 1
        threshold = _stage_threshold(hist, n_bits, n_bins, radius)
        kept = 0
        for d in range(min(threshold, n_bits) + 1):
            kept += hist[d]
        if by_distance and max_keep >= 0:
            kept = min(kept, max_keep)
        out_pos, out_dist = grow_hits(out_pos, out_dist, total, total + kept)
        if not by_distance:
            slot = total
            for j in range(count):
                if buf_d[j] <= threshold:
                    out_pos[slot] = buf_p[j]
                    out_dist[slot] = buf_d[j]
                    slot += 1
            total += kept
            lims[q + 1] = total
            continue
        # counting sort by distance; stable, so ties stay in position order
        start = total
        for d in range(min(threshold, n_bits) + 1):
            c = hist[d]
            hist[d] = start
            start += c
        for j in range(count):
            d = buf_d[j]
            if d <= threshold:
                slot = hist[d]
                if slot < total + kept:
                    out_pos[slot] = buf_p[j]
                    out_dist[slot] = d
                hist[d] = slot + 1
        total += kept
        lims[q + 1] = total
    return lims, out_pos[:total], out_dist[:total]


@persistable
class Cascade(IndexBase):
    """Multi-stage Hamming search: each stage searches the previous stage's neighbours.

    the LambdaRank bit-vector paper (WWW), Sec. 6 (8-bit -> 256-bit cascade).

    Parameters
    ----------
    n_bits : sequence of int
        Code length of each stage, first (shortest, cheapest) to last.
    n_bins : int or sequence of int, default=3
        Relative threshold of each *filtering* stage (all but the last): the candidates in
        the query's ``n_bins`` nearest non-empty Hamming bins pass, ties kept.
    radius : int, sequence of (int or None), or None
        Absolute threshold (distance ``<= radius``) of a filtering stage instead of
        ``n_bins``.

    Examples
    --------
    >>> import numpy as np
    >>> from hashlearn.index.cascade import Cascade
    >>> rng = np.random.RandomState(0)
    >>> short, long = rng.randint(0, 256, (100, 1), np.uint8), rng.randint(0, 256, (100, 4), np.uint8)
    >>> cascade = Cascade((8, 32), n_bins=2)
    >>> ids = cascade.add([short, long])
    >>> D, I = cascade.search([short[:1], long[:1]], k=1)
    >>> I.tolist()
    [[0]]
    """

    def __init__(self, n_bits: Sequence[int], n_bins=3, radius=None):
        owner = "Cascade"
        if isinstance(n_bits, (int, np.integer)) or len(n_bits) < 2:
            raise ValueError(
                f"The 'n_bits' parameter of {owner} must be a sequence of at least "
                f"2 code lengths (one per stage). Got {n_bits!r} instead."
            )
        self.n_bits = tuple(check_int(b, "n_bits", owner) for b in n_bits)
        n_filters = len(self.n_bits) - 1
        self.n_bins = self._per_stage(n_bins, n_filters, "n_bins", low=1)
        self.radius = self._per_stage(radius, n_filters, "radius", low=0)
        for b, r, s in zip(self.n_bits, self.radius, self.n_bins, strict=False):
            if r is None and s is None:
                raise ValueError(f"each filtering stage of {owner} needs n_bins or radius.")
            if r is not None and r > b:
                raise ValueError(
                    f"The 'radius' parameter of {owner} must be at most the "
                    f"stage's code length {b}. Got {r} instead."
                )
        self._store = IdStore(
            {f"stage{s}": ((self._n_words(s),), np.uint64) for s in range(len(self.n_bits))},
            "Cascade",
        )

    @staticmethod
    def _per_stage(value, n, name, low):
        values = list(value) if isinstance(value, (list, tuple)) else [value] * n
        if len(values) != n:
            raise ValueError(
                f"The {name!r} parameter of Cascade must be one value or one per "
                f"filtering stage ({n}). Got {value!r} instead."
            )
        return tuple(None if v is None else check_int(v, name, "Cascade", low=low) for v in values)

    def _n_words(self, stage: int) -> int:
        return max(1, (self.n_bits[stage] + 63) // 64)

    def _check_stage_codes(self, codes, name: str) -> list[np.ndarray]:
        if not isinstance(codes, (list, tuple)) or len(codes) != len(self.n_bits):
            raise ValueError(
                f"{name} must be a list of {len(self.n_bits)} code arrays, one per "
                f"stage ({self.n_bits} bits). Got {type(codes).__name__}."
            )
        checked = [
            check_codes(c, b, f"{name}[{s}]")
            for s, (c, b) in enumerate(zip(codes, self.n_bits, strict=False))
        ]
        if len({len(c) for c in checked}) != 1:
            raise ValueError(
                f"every stage of {name} must have the same number of rows. Got "
                f"{[len(c) for c in checked]}."
            )
        return checked

    def add(self, codes: Sequence[np.ndarray], ids=None) -> np.ndarray:
        """Add the items' codes (one array per stage, same rows) with optional distinct ids.

        Returns the ids (int64, in the order of the rows); automatic ids number from one past
        the largest id ever added (``ValueError`` past ``2**63 - 1``). Safe while other
        threads search.
        """
        codes = self._check_stage_codes(codes, "codes")
        rows = {
            f"stage{s}": as_words(c).reshape(len(c), self._n_words(s)) for s, c in enumerate(codes)
        }
        return self._store.add(rows, ids)

    def remove(self, ids, *, missing: str = "raise") -> int:
        """Remove items by id (the others keep theirs); returns how many were removed.

        ``missing="raise"`` refuses ids not in the cascade; ``"ignore"`` skips them.
        """
        return self._store.remove(ids, missing=missing)

    def _run(self, queries, final_n_bins, final_radius, max_keep=-1):
        """Every stage for chunks of queries; each chunk compares at most about
        ``_CHUNK_PAIRS`` query-item pairs, so memory is O(results + one chunk's
        candidates), not O(queries x items)."""
        snap = self._store.snapshot
        queries = self._check_stage_codes(queries, "queries")
        m, n = len(queries[0]), snap.n
        n_stages = len(self.n_bits)
        sizes = np.zeros((m, n_stages), np.int64)
        sizes[:, 0] = n
        if n == 0 or m == 0:
            return np.zeros(m + 1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64), sizes
        q_words = [as_words(q).reshape(m, -1) for q in queries]
        chunk = max(1, _CHUNK_PAIRS // n)
        counts = np.zeros(m, np.int64)
        parts_d, parts_p = [], []
        for q0 in range(0, m, chunk):
            q1 = min(m, q0 + chunk)
            lims = np.zeros(q1 - q0 + 1, np.int64)
            pos = np.zeros(0, np.int64)
            dist = np.zeros(0, np.int32)
            for s, b in enumerate(self.n_bits):
                last = s == n_stages - 1
                n_bins = final_n_bins if last else self.n_bins[s]
                radius = final_radius if last else self.radius[s]
                if s:
                    sizes[q0:q1, s] = np.diff(lims)
                lims, pos, dist = _select_stage(
                    snap.rows[f"stage{s}"].reshape(-1),
                    self._n_words(s),
                    b,
                    q_words[s][q0:q1].reshape(-1),
                    s == 0,
                    n,
                    lims,
                    pos,
                    0 if n_bins is None else n_bins,
                    -1 if radius is None else radius,
                    last,
                    max_keep,
                )
            counts[q0:q1] = np.diff(lims)
            parts_d.append(dist)
            parts_p.append(pos)
        lims = np.zeros(m + 1, np.int64)
        np.cumsum(counts, out=lims[1:])
        return lims, np.concatenate(parts_d), snap.ids[np.concatenate(parts_p)], sizes

    def neighbors(
        self,
        queries: Sequence[np.ndarray],
        *,
        n_bins: int | None = 3,
        radius: int | None = None,
        return_search_sets: bool = False,
    ):
        """Neighbours by the last stage's code among the survivors of the filtering stages.

        Relative threshold ``n_bins`` (nearest non-empty bins, ties kept) or, when given,
        absolute ``radius`` (distance ``<= radius``). Returns ``(lims, D, I)`` in CSR form,
        sorted by (distance, id); with ``return_search_sets`` also ``(m, n_stages)`` counts
        of the items each stage compared per query.
        """
        if radius is not None:
            radius = check_int(radius, "radius", "Cascade.neighbors", low=0, high=self.n_bits[-1])
            n_bins = None
        else:
            n_bins = check_int(n_bins, "n_bins", "Cascade.neighbors")
        lims, dist, ids, sizes = self._run(queries, n_bins, radius)
        result = (lims, dist, ids)
        return (*result, sizes) if return_search_sets else result

    def search(self, queries: Sequence[np.ndarray], k: int):
        """The ``k`` nearest survivors by the last stage's Hamming distance: ``(D, I)``.

        Sorted by (distance, id), padded with -1 (also when fewer than ``k`` survive).
        """
        queries = self._check_stage_codes(queries, "queries")
        m = len(queries[0])
        k = check_k(k, m, "Cascade.search")
        D = np.full((m, k), -1, np.int32)
        I = np.full((m, k), -1, np.int64)  # noqa: E741 - faiss's name
        lims, dist, ids, _ = self._run(queries, None, self.n_bits[-1], max_keep=k)
        counts = np.diff(lims)
        rows = np.repeat(np.arange(m), counts)
        cols = np.arange(lims[-1]) - np.repeat(lims[:-1], counts)
        D[rows, cols] = dist
        I[rows, cols] = ids
        return D, I

    def search_set_sizes(self, queries: Sequence[np.ndarray]) -> np.ndarray:
        """``(m, n_stages)``: how many items each stage compared for each query."""
        return self._run(queries, 1, None)[3]

    # ---------------------------------------------------------------------- persistence

    def _get_state(self):
        snap = self._store.snapshot
        params = {
            "n_bits": list(self.n_bits),
            "n_bins": list(self.n_bins),
            "radius": list(self.radius),
        }
        arrays = {f"stage{s}": snap.rows[f"stage{s}"].reshape(-1) for s in range(len(self.n_bits))}
        arrays["ids"] = snap.ids
        return params, {"next_id": snap.next_id}, arrays

    @classmethod
    def _from_state(cls, params, state, arrays):
        """Ids, next id and every stage's words (shape, zero padding bits) checked in O(n)."""
        cascade = cls(params["n_bits"], n_bins=params["n_bins"], radius=params["radius"])
        ids = check_ids_array(arrays)
        next_id = check_next_id(state, ids)
        n = len(ids)
        rows = {}
        for s, b in enumerate(cascade.n_bits):
            words = require_array(arrays, f"stage{s}", np.uint64, 1)
            if words.shape != (n * cascade._n_words(s),):
                raise ValueError(f"saved Cascade stage {s} has {words.shape} words for {n} ids.")
            rows[f"stage{s}"] = words.reshape(n, cascade._n_words(s))
            check_words(rows[f"stage{s}"], b, f"stage{s}")
        cascade._store.restore(ids, rows, next_id)
        return cascade

"""Inverted-file index over binary codes: a sub-linear coarse stage (faiss's ``IndexBinaryIVF``).

The codes are partitioned by k-means in Hamming space with majority-vote centroids
(*k-majority*: C. Grana, D. Borghesani, M. Manfredi, R. Cucchiara, "A fast approach for
integrating ORB descriptors in the bag of words model", Proc. SPIE Electronic Imaging 2013:
assign each code to its nearest centroid by Hamming distance, then set each centroid bit to
the majority of its members' bits -- the centroid minimising the members' summed Hamming
distance; the quantizer of faiss's ``IndexBinaryIVF``). A query is compared with every
centroid and only the codes of its nearest lists are scanned.

``quantizer="k-means"`` partitions by Lloyd's k-means on the hasher's real-valued
projections instead (the vectors whose signs are the codes; S. Lloyd, "Least squares
quantization in PCM", IEEE Trans. Inf. Theory 1982; the float coarse quantizer of faiss's
``IndexIVF``, H. Jegou, M. Douze, C. Schmid, "Product quantization for nearest neighbor
search", TPAMI 2011): float centroids in the projection space, each vector filed under the
centroid nearest its projection, each query probing the lists nearest its projection. A
caller with only codes (no projections) stands in ``scale_j (2 b_j - 1)`` for them, the
training set's mean ``|p_j|`` times the bit's sign. Measured on 249k MiniLM sentence
embeddings through ITQ-256 with 1,996 lists of each kind (``docs/results.md``), k-means
lists reach recall 0.95 with half the candidates of k-majority lists, but each query pays a
product with every float centroid, so they were no faster there and slower at 1M rows.

Layout. The codes are stored grouped by list (list ``l`` holds rows
``offsets[l]:offsets[l+1]`` of one word array, its ids ascending), so a probed list is one
contiguous range of words scanned by the mini-block kernel of the flat scan
(:mod:`hashlearn.index._ivf_kernels`). Every write (``add``, ``remove``, ``train``) builds
the next grouped layout beside the current one, O(n + m) (an add merges each list with its
new codes by id), and publishes it with the centroids as one copy-on-write snapshot
(:mod:`hashlearn.index._storage`): searches run in any number of threads beside a writer and
see the index before or after each write. Add in batches: each write rewrites the lists.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from hashlearn._utils.kernel_args import frozen
from hashlearn._utils.parallel import parallel_chunks
from hashlearn._utils.popcount import kernel_path
from hashlearn._utils.validation import check_codes, check_int
from hashlearn.codes import as_words, pack_bits, unpack_bits
from hashlearn.index import _ivf_kernels as _kernels
from hashlearn.index._asymmetric import SHORTLIST_FACTOR, check_projections, rerank_words
from hashlearn.index._knn_scan import _WIDTH_TAGS
from hashlearn.index._storage import (
    ID_MAX,
    Snapshot,
    _zeroed_rows,
    check_words,
)
from hashlearn.index.base import BinaryIndex, register_index
from hashlearn.io import persistable, require_array, require_state

__all__ = ["IVFIndex"]

#: k-majority iterations (faiss's ``IndexBinaryIVF`` trains its binary k-means for 10
#: by default); training stops earlier once no code changes list
N_ITER = 10
#: training sample: at most this many codes per list (faiss's ``max_points_per_centroid``)
MAX_TRAIN_PER_LIST = 256
#: k-means training sample: at most this many rows per list (faiss warns below 39; the
#: float centroids converge on fewer rows than binary ones, and each round is a matrix
#: product over the sample)
K_MEANS_TRAIN_PER_LIST = 64
#: ``n_lists=None``: about ``LISTS_PER_SQRT_N * sqrt(n)`` lists for ``n`` training codes
LISTS_PER_SQRT_N = 4
#: ``n_probe=None``: scan the nearest lists until they hold ``PROBE_FACTOR * k`` codes ...
PROBE_FACTOR = 32
#: ... and at least ``MIN_PROBE_LISTS`` average lists' worth of codes
MIN_PROBE_LISTS = 16
#: how the lists are learned: k-majority on the codes, or k-means on the projections
QUANTIZERS = ("k-majority", "k-means")
#: rows of a float centroid-distance product at a time (bounds its temporary memory)
_FLOAT_CHUNK = 4096
#: a batch of queries is scanned list by list (each probed list read from memory once for
#: all its queries) when the codes hold at least this many words (16 MiB): below, each
#: query's lists are cache hits anyway and the grouping's bookkeeping costs
#: (``bench/composition_ab.py``, 60k Fashion-MNIST codes, 1.9 MB, against the scan before
#: either change: 0.89-0.92x grouped, 0.96-0.97x per query; at 1M ITQ-256 codes, 32 MB,
#: grouping took a probed top 400 from 73 to 55 us a query in a development measurement)
GROUP_MIN_WORDS = 2 << 20

_LAYOUT = "ivf"  # the snapshot's derived entry: (centroids, offsets)


class _Lists:
    """The coarse quantizer of one snapshot: centroids (uint64 words, ``(n_lists, W)``), the
    list offsets (int64, ``n_lists + 1``) into the snapshot's grouped rows, and for
    ``quantizer="k-means"`` the float centroids (float32 ``(n_lists, n_bits)``, whose signs
    are ``centroids``) and the bits' stand-in scale (float32 ``(n_bits,)``); ``None`` for
    k-majority lists."""

    __slots__ = ("centroids", "offsets", "vectors", "scale", "sq_norms", "probe_form")

    def __init__(self, centroids, offsets, vectors=None, scale=None):
        self.centroids = _read_only(centroids)
        self.offsets = _read_only(offsets)
        self.vectors = None if vectors is None else _read_only(vectors)
        self.scale = None if scale is None else _read_only(scale)
        self.sq_norms = None if vectors is None else (vectors.astype(np.float64) ** 2).sum(1)
        #: the probe's operands: ``-2 C^T`` contiguous (float32 ``(n_bits, n_lists)``: a
        #: transposed view would cost the product about 1.5x) and ``|c|^2`` in float32
        self.probe_form = (
            None
            if vectors is None
            else (
                _read_only(np.ascontiguousarray(-2.0 * self.vectors.T, dtype=np.float32)),
                self.sq_norms.astype(np.float32),
            )
        )

    def with_offsets(self, offsets: np.ndarray) -> _Lists:
        """The same centroids over other list offsets (a write's new layout), sharing the
        derived norms and probe operands instead of computing them again on every write."""
        lists = object.__new__(_Lists)
        for name in _Lists.__slots__:
            setattr(lists, name, getattr(self, name))
        lists.offsets = _read_only(offsets)
        return lists

    @property
    def n_lists(self) -> int:
        return self.centroids.shape[0]


def _id_ordered(snap: Snapshot, cand: np.ndarray):
    """``(short, rows, local)``: the distinct candidate ids ascending, their rows in the
    snapshot (whose ids are in list order), and ``cand`` as indices into ``short`` (-1 kept).

    The snapshot's ids in ascending order and their rows are sorted once per snapshot
    (cached). A batch with candidates for at least a quarter of the ids spanning at most
    ``4 n + 1024`` values is put in order through O(n + m k) tables (no sort); smaller
    batches sort their own candidates only."""
    sorted_ids, rows_of_sorted = snap.derived("ivf_id_order", _id_order)
    valid = cand >= 0
    span = int(sorted_ids[-1]) + 1 if len(sorted_ids) else 0
    if 4 * cand.size >= snap.n and span <= 4 * snap.n + 1024:
        seen = np.zeros(span, bool)
        seen[cand[valid]] = True
        short = np.flatnonzero(seen)
        rank = np.cumsum(seen) - 1
        local = np.where(valid, rank[np.where(valid, cand, 0)], -1)
    else:
        short, inverse = np.unique(cand[valid], return_inverse=True)
        local = np.full(cand.shape, -1, np.int64)
        local[valid] = inverse
    return short, rows_of_sorted[np.searchsorted(sorted_ids, short)], local


def _row_of_id(snap: Snapshot) -> np.ndarray | bool:
    """Each id's row in the snapshot (int32 where the rows fit, -1 for absent ids), when
    the ids span at most ``4 n + 1024`` values; else ``False`` (sparse ids: the re-rank
    puts its candidates in order by sorting instead, :func:`_id_ordered`)."""
    span = int(snap.ids.max()) + 1 if snap.n else 0
    if span > 4 * snap.n + 1024:
        return False
    table = np.full(span, -1, np.int32 if snap.n < 2**31 else np.int64)
    table[snap.ids] = np.arange(snap.n, dtype=table.dtype)
    return _read_only(table)


def _id_order(snap: Snapshot) -> tuple[np.ndarray, np.ndarray]:
    by_id = np.argsort(snap.ids, kind="stable")
    return snap.ids[by_id], by_id


def _read_only(a: np.ndarray) -> np.ndarray:
    """``a`` as a kernel input: C-ordered and read-only, its dtype kept."""
    return frozen(a, a.dtype)


#: the float centroid distances of a search over k-majority lists: none
_NO_FLOAT = _read_only(np.zeros((0, 0), np.float32))
#: a Hamming search's re-rank arguments: no projections, so none (the kernel's ``asym`` off)
_NO_RERANK = (
    _read_only(np.zeros((0, 1), np.float32)),
    np.zeros((0, 1), np.float32),
    np.zeros((0, 1), np.int64),
    _read_only(np.zeros(0, np.int32)),
)


def _nearest_centroids(P: np.ndarray, C: np.ndarray, sq_norms: np.ndarray):
    """``(lists, sq_dist)``: each row of ``P`` filed under its nearest row of ``C`` by
    Euclidean distance (ties to the smaller list), in chunks of float32 matrix products
    (float64 where the values are large enough for float32 squares to overflow)."""
    lists = np.empty(len(P), np.int64)
    sq = np.empty(len(P), np.float64)
    big = max(np.abs(C).max(initial=0.0), np.abs(P).max(initial=0.0)) > 1e15
    dtype = np.float64 if big else np.float32
    Ct = np.ascontiguousarray(C.T, dtype=dtype)
    norms = sq_norms.astype(dtype)[None, :]
    for s in range(0, len(P), _FLOAT_CHUNK):
        block = P[s : s + _FLOAT_CHUNK].astype(dtype)
        d = norms - 2.0 * (block @ Ct)
        lists[s : s + len(block)] = best = d.argmin(1)
        near = d[np.arange(len(block)), best].astype(np.float64)
        sq[s : s + len(block)] = near + (block.astype(np.float64) ** 2).sum(1)
    return lists, sq


@persistable
@register_index("ivf")
class IVFIndex(BinaryIndex):
    """Inverted-file k-NN and range search over packed binary codes (approximate).

    faiss's ``IndexBinaryIVF`` with hashlearn's conventions: results ``(D int32, I int64)``
    sorted by (distance, id) and padded with -1, ``range_search`` returns distances
    ``<= radius``, ``remove`` never renumbers. When every list is probed
    (``n_probe >= n_lists``) the results are exactly :class:`~hashlearn.index.FlatIndex`'s.

    Parameters
    ----------
    n_bits : int
        Code length in bits.
    n_lists : int or None, default=None
        Number of lists (k-majority centroids). ``None``: chosen by :meth:`train` as
        ``round(4 * sqrt(n))`` for ``n`` training codes, clipped to ``[1, n]`` and to the
        distinct codes of the sample (faiss's rule of thumb, 4 to 16 sqrt(n)). A number
        above the sample's distinct codes is clipped to them with a warning.
    n_probe : int or None, default=None
        Lists scanned per query. ``None`` follows from the budget: a k-NN search scans the
        nearest lists (by centroid distance) until they hold at least
        ``max(32 * k, 16 * n / n_lists)`` codes -- 32 candidates per neighbour, and at least
        16 average lists (range search: as for ``k = 1``). It keeps 0.999 of the flat scan's
        distances at k = 10 on digits ITQ-32 codes and 0.996 on 200k codes of a Gaussian
        mixture through ITQ-64 (``docs/design.md``). A search's ``n_probe=`` overrides it.
    random_state : int, default=0
        Seed of the training sample and of the initial centroids.
    quantizer : {"k-majority", "k-means"}, default="k-majority"
        How the lists are learned: k-majority on the codes, or k-means on the hasher's
        real-valued projections (module doc), which :meth:`train`, :meth:`add` and the
        searches then take as ``projections=`` (:class:`~hashlearn.search.Searcher` and
        :class:`~hashlearn.embeddings.EmbeddingIndex` pass them); given only codes, the
        bits scaled by the training set's mean ``|p_j|`` stand in for them.

    Notes
    -----
    :meth:`train` learns the lists from a sample; :meth:`add` on an untrained index trains
    on the codes it is given first (the first batch should represent the data). Training
    again re-partitions the stored codes. ``Searcher.fit`` trains the index on the codes of
    its sample.

    Examples
    --------
    >>> import numpy as np
    >>> from hashlearn.index import IVFIndex
    >>> rng = np.random.default_rng(0)
    >>> codes = rng.integers(0, 256, (1000, 8), dtype=np.uint8)
    >>> index = IVFIndex(64, n_lists=16)
    >>> index.add(codes)[:3]
    array([0, 1, 2])
    >>> D, I = index.search(codes[:2], k=1, n_probe=16)  # every list: exact
    >>> I.tolist(), D.tolist()
    ([[0], [1]], [[0], [0]])
    """

    def __init__(
        self,
        n_bits: int,
        n_lists: int | None = None,
        n_probe: int | None = None,
        random_state: int = 0,
        quantizer: str = "k-majority",
    ):
        super().__init__(n_bits)
        owner = type(self).__name__
        self.n_lists = None if n_lists is None else check_int(n_lists, "n_lists", owner)
        self.n_probe = None if n_probe is None else check_int(n_probe, "n_probe", owner)
        self.random_state = check_int(random_state, "random_state", owner, low=0)
        if quantizer not in QUANTIZERS:
            raise ValueError(
                f"The 'quantizer' parameter of {owner} must be one of {list(QUANTIZERS)}. "
                f"Got {quantizer!r} instead."
            )
        self.quantizer = quantizer

    @property
    def uses_projections(self) -> bool:
        """Whether the lists live in the projection space (``quantizer="k-means"``): callers
        that can should pass ``projections=`` to :meth:`train`, :meth:`add` and searches."""
        return self.quantizer == "k-means"

    def _projections(self, projections, codes: np.ndarray, scale, owner: str) -> np.ndarray:
        """The checked projections of ``codes`` (float32 ``(m, n_bits)``), or their stand-in
        ``scale (2 b - 1)`` when none are given (module doc)."""
        if projections is not None:
            P = check_projections(projections, self.n_bits, owner)
            if len(P) != len(codes):
                raise ValueError(f"{owner}: {len(P)} rows of projections for {len(codes)} codes.")
            return P
        signs = unpack_bits(codes, self.n_bits).astype(np.float32) * 2.0 - 1.0
        return signs * (np.ones(self.n_bits, np.float32) if scale is None else scale)

    def _checked(self, projections, queries, owner: str):
        """The projections of the queries, checked once at a search's entry (or None)."""
        return None if projections is None else self._projections(projections, queries, None, owner)

    def _float_distances(self, layout: _Lists, queries, P, *, finite: bool = False) -> np.ndarray:
        """The queries' squared distances to the float centroids less ``|p|^2`` (float32
        ``(m, n_lists)``, one matrix product) from their checked projections ``P`` (None:
        the stand-in); none for k-majority lists. ``finite``: the caller knows every ``|p|^2``
        and ``|c|^2`` is at most ``1e37``, so no sum overflows float32 and the pass that turns
        NaN into ``inf`` is skipped (about 5 us a query at 4,000 lists, Zen 4)."""
        if layout.vectors is None:
            return _NO_FLOAT
        if P is None:
            P = self._projections(None, queries, layout.scale, "")
        neg2_t, sq_norms = layout.probe_form
        # one float32 product (float64 projections would make it a float64 product at twice
        # the cost: 28 against 13 us a query for 256 bits x 1,996 lists on Zen 4), then two
        # passes in place
        d = P.astype(np.float32, copy=False) @ neg2_t
        d += sq_norms
        return _read_only(d if finite else np.nan_to_num(d, copy=False, nan=np.inf))

    # --------------------------------------------------------------------------- state

    def _layout(self, snap: Snapshot) -> _Lists | None:
        return snap.cached(_LAYOUT)

    @property
    def is_trained(self) -> bool:
        """Whether the lists exist (after :meth:`train`, or the first :meth:`add`)."""
        return self._layout(self._store.snapshot) is not None

    @property
    def centroids(self) -> np.ndarray:
        """The lists' centroids as packed codes ``uint8 (n_lists, code_size)`` (read-only;
        with ``quantizer="k-means"`` the signs of :attr:`centroid_vectors`); ``(0,
        code_size)`` before training."""
        layout = self._layout(self._store.snapshot)
        if layout is None:
            return np.zeros((0, self.code_size), np.uint8)
        return layout.centroids.view(np.uint8)[:, : self.code_size]

    @property
    def centroid_vectors(self) -> np.ndarray | None:
        """The float centroids ``float32 (n_lists, n_bits)`` of ``quantizer="k-means"``
        (read-only); ``None`` for k-majority lists or before training."""
        layout = self._layout(self._store.snapshot)
        return None if layout is None else layout.vectors

    @property
    def list_sizes(self) -> np.ndarray:
        """Codes per list (int64, ``n_lists``); empty before training."""
        layout = self._layout(self._store.snapshot)
        return np.zeros(0, np.int64) if layout is None else np.diff(layout.offsets)

    @property
    def ids(self) -> np.ndarray:
        """Ids of the stored items, ascending."""
        return np.sort(self._store.snapshot.ids)

    @property
    def _words(self) -> np.ndarray:
        """Stored codes as ``uint64 (n, n_words)`` words in the order of :attr:`ids`."""
        snap = self._store.snapshot
        return snap.rows["words"][np.argsort(snap.ids)]

    # ------------------------------------------------------------------------ training

    def train(self, codes: np.ndarray, *, projections=None) -> IVFIndex:
        """Learn the lists from ``codes`` (or a sample of them) -- by k-majority, or with
        ``quantizer="k-means"`` by k-means on their ``projections`` -- and return self.

        At most 256 rows per list are used (a sample drawn with ``random_state``). Codes
        already in the index are re-assigned to the new lists by their codes (one write;
        their projections are not kept).
        """
        codes = check_codes(codes, self.n_bits, "codes", allow_empty=False)
        words = as_words(codes).reshape(len(codes), self._n_words)
        P = None
        if self.uses_projections:
            P = self._projections(projections, codes, None, "IVFIndex.train")
        elif projections is not None:
            check_projections(projections, self.n_bits, "IVFIndex.train")
        with self._store.writing():
            self._train_locked(words, P)
        return self

    def _train_locked(self, words: np.ndarray, P: np.ndarray | None) -> None:
        snap = self._store.snapshot
        rows, ids = snap.rows["words"], snap.ids
        order = np.argsort(ids, kind="stable")
        rows, ids = rows[order], ids[order]
        if P is None:
            layout = _Lists(self._k_majority(words), np.zeros(1, np.int64))
            lists = self._assign(rows, layout.centroids)
        else:
            layout = self._k_means_lists(P)
            stored_codes = np.ascontiguousarray(rows.view(np.uint8)[:, : self.code_size])
            stored = self._projections(None, stored_codes, layout.scale, "IVFIndex.train")
            lists = self._float_assign(stored, layout)
        self._store.publish(self._grouped(rows, ids, lists, layout, snap.next_id))

    def _k_means_lists(self, P: np.ndarray) -> _Lists:
        """Empty k-means lists learned from projections ``P``: the float centroids, their
        signs as the binary centroids, and the bits' stand-in scale (mean ``|p_j|``)."""
        vectors = self._k_means(P)
        scale = np.abs(P).mean(0).astype(np.float32)
        centroids = as_words(pack_bits(vectors >= 0)).reshape(len(vectors), self._n_words)
        return _Lists(centroids, np.zeros(len(vectors) + 1, np.int64), vectors, scale)

    def _lists_for(self, n: int) -> int:
        """The number of lists for ``n`` training rows (``n_lists``, or about 4 sqrt(n))."""
        if self.n_lists is None:
            return min(max(1, round(LISTS_PER_SQRT_N * math.sqrt(n))), n)
        return self.n_lists

    def _fewer_lists(self, n_lists: int, n_distinct: int, what: str) -> int:
        if n_lists > n_distinct:
            if self.n_lists is not None:
                warnings.warn(
                    f"IVFIndex: n_lists={n_lists} but the training {what} hold only "
                    f"{n_distinct} distinct {what}; using {n_distinct} lists.",
                    stacklevel=5,
                )
            return n_distinct
        return n_lists

    def _k_means(self, P: np.ndarray) -> np.ndarray:
        """Float centroids (``float32 (n_lists, n_bits)``) by Lloyd's k-means on a sample of
        the projections ``P``: at most ``N_ITER`` rounds, stopping once no row changes list;
        an empty list is re-seeded with the row farthest from its centroid."""
        rng = np.random.default_rng(self.random_state)
        n_lists = self._lists_for(len(P))
        if len(P) > K_MEANS_TRAIN_PER_LIST * n_lists:
            P = P[np.sort(rng.choice(len(P), K_MEANS_TRAIN_PER_LIST * n_lists, replace=False))]
        distinct = np.unique(P, axis=0)
        n_lists = self._fewer_lists(n_lists, len(distinct), "projections")
        C = distinct[np.sort(rng.choice(len(distinct), n_lists, replace=False))]
        C = C.astype(np.float64)
        lists = np.full(len(P), -1, np.int64)
        for _ in range(N_ITER):
            new_lists, sq = _nearest_centroids(P, C, (C**2).sum(1))
            if np.array_equal(new_lists, lists):
                break
            lists = new_lists
            sizes = np.bincount(lists, minlength=n_lists)
            by_list = np.argsort(lists, kind="stable")
            starts = np.flatnonzero(sizes)
            first = np.cumsum(sizes)[starts] - sizes[starts]
            sums = np.add.reduceat(P[by_list], first, axis=0, dtype=np.float64)
            C = C.copy()
            C[starts] = sums / sizes[starts, None]
            empty = np.flatnonzero(sizes == 0)
            if len(empty):  # re-seed each empty list with a row far from its centroid
                C[empty] = P[np.argsort(-sq, kind="stable")[: len(empty)]]
        return np.ascontiguousarray(C, dtype=np.float32)

    def _float_assign(self, P: np.ndarray, layout: _Lists) -> np.ndarray:
        """The k-means list of each projection row (its nearest float centroid)."""
        assert layout.vectors is not None and layout.sq_norms is not None
        return _nearest_centroids(P, layout.vectors, layout.sq_norms)[0]

    def _k_majority(self, words: np.ndarray) -> np.ndarray:
        """Centroids (``uint64 (n_lists, W)``) by k-majority (Grana et al. 2013) on a sample."""
        rng = np.random.default_rng(self.random_state)
        n = len(words)
        n_lists = self._lists_for(n)
        if n > MAX_TRAIN_PER_LIST * n_lists:
            sample = np.sort(rng.choice(n, MAX_TRAIN_PER_LIST * n_lists, replace=False))
            words = words[sample]
        distinct = np.unique(words, axis=0)
        n_lists = self._fewer_lists(n_lists, len(distinct), "codes")
        centroids = np.ascontiguousarray(
            distinct[np.sort(rng.choice(len(distinct), n_lists, replace=False))]
        )
        n_bits, n_words = self.n_bits, self._n_words
        flat = np.ascontiguousarray(words).reshape(-1)
        lists = np.full(len(words), -1, np.int64)
        for _ in range(N_ITER):
            new_lists, dist = self._assign(words, centroids, with_dist=True)
            if np.array_equal(new_lists, lists):
                break
            lists = new_lists
            counts = np.zeros((n_lists, n_words * 64), np.int64)
            sizes = np.zeros(n_lists, np.int64)
            _kernels.bit_counts(flat, len(words), n_words, lists, counts, sizes)
            old_bits = np.unpackbits(centroids.view(np.uint8), axis=1, bitorder="little")
            twice = 2 * counts
            bits = np.where(
                twice > sizes[:, None], 1, np.where(twice < sizes[:, None], 0, old_bits)
            ).astype(np.uint8)  # a tie keeps the centroid's bit
            bits[:, n_bits:] = 0
            new = np.packbits(bits, axis=1, bitorder="little").view(np.uint64)
            empty = np.flatnonzero(sizes == 0)
            if len(empty):  # re-seed each empty list with a code far from its centroid
                far = np.argsort(-dist, kind="stable")
                new[empty] = words[far[: len(empty)]]
            centroids = np.ascontiguousarray(new)
        return centroids

    def _assign(self, rows: np.ndarray, centroids: np.ndarray, *, with_dist: bool = False):
        """Nearest centroid of each row (ties to the smaller list), in parallel."""
        n = len(rows)
        lists = np.empty(n, np.int64)
        dist = np.empty(n, np.int64)
        flat = np.ascontiguousarray(rows).reshape(-1)
        cent = np.ascontiguousarray(centroids).reshape(-1)
        n_lists, n_words = len(centroids), self._n_words
        width = _WIDTH_TAGS.get(n_words)
        tail: int | tuple[int, ...]  # the word count, or a tuple of that length
        if width is None:
            kernel, tail = _kernels.assign_any_width, n_words
        else:
            kernel, tail = _kernels.assign_fixed_width, width
        if n:
            flat.flags.writeable = cent.flags.writeable = False
            parallel_chunks(
                lambda s, e: kernel(flat, cent, n_lists, lists, dist, s, e, tail), n, None
            )
        return (lists, dist) if with_dist else lists

    def _grouped(self, rows, ids, lists, layout: _Lists, next_id) -> Snapshot:
        """The snapshot of ``rows`` (ids ascending) grouped by their ``lists`` under the
        centroids of ``layout``."""
        n_lists = layout.n_lists
        order = np.argsort(lists, kind="stable")  # ids stay ascending within a list
        offsets = np.zeros(n_lists + 1, np.int64)
        np.cumsum(np.bincount(lists, minlength=n_lists), out=offsets[1:])
        words = _zeroed_rows((len(ids), self._n_words), np.uint64)
        words[:] = rows[order]
        snap = Snapshot(ids[order], {"words": words}, next_id)
        snap.attach(_LAYOUT, layout.with_offsets(offsets))
        return snap

    # ------------------------------------------------------------------------ writing

    def add(self, codes: np.ndarray, ids=None, *, projections=None) -> np.ndarray:
        """Add packed codes ``(n, ceil(n_bits/8))`` uint8 with optional distinct int ids
        (and, for ``quantizer="k-means"``, their ``projections``, which file them).

        An untrained index first trains on these codes (:meth:`train`). Without ``ids`` the
        codes are numbered from one past the largest id ever added; duplicate ids, or ids
        already in the index, raise ``ValueError``. Returns the ids of the added codes
        (int64, in the order of ``codes``). O(n + m): the lists are rewritten. Safe while
        other threads search.
        """
        codes = check_codes(codes, self.n_bits, "codes")
        m = codes.shape[0]
        words = as_words(codes).reshape(m, self._n_words)
        P = self._checked(projections, codes, "IVFIndex.add")
        with self._store.writing():
            new_ids = self._store.new_ids(ids, m)
            if m == 0:
                return new_ids
            if not self.is_trained:
                train_P = self._projections(P, codes, None, "") if self.uses_projections else None
                self._train_locked(words, train_P)
            snap = self._store.snapshot
            layout = self._layout(snap)
            assert layout is not None  # trained just above
            if layout.vectors is None:
                lists = self._assign(words, layout.centroids)
            else:  # without projections: the stand-in, at the trained scale
                P = P if P is not None else self._projections(None, codes, layout.scale, "")
                lists = self._float_assign(P, layout)
            order = np.lexsort((new_ids, lists))
            rows = {"words": np.ascontiguousarray(words[order])}
            self._store.publish(self._merged(snap, layout, lists, new_ids, order, rows))
        return new_ids

    def _merged(self, snap: Snapshot, layout: _Lists, lists, new_ids, order, rows) -> Snapshot:
        """The snapshot of ``snap`` with new rows merged into their ``lists`` by id, O(n + m):
        ``rows`` maps each row array of the store to the new rows already in ``order``
        (``np.lexsort((new_ids, lists))``), each row a whole number of 64-bit words."""
        m = len(new_ids)
        add_off = np.zeros(layout.n_lists + 1, np.int64)
        np.cumsum(np.bincount(lists, minlength=layout.n_lists), out=add_off[1:])
        added = new_ids[order]
        out_ids = np.empty(snap.n + m, np.int64)
        merged = {}
        for name, new_rows in rows.items():
            old = np.ascontiguousarray(snap.rows[name])
            out = _zeroed_rows((snap.n + m, *old.shape[1:]), old.dtype)
            width = out.reshape(snap.n + m, -1).view(np.uint64).shape[1]  # words a row
            _kernels.merge_lists(
                old.view(np.uint64).reshape(-1), snap.ids, layout.offsets,
                np.ascontiguousarray(new_rows).view(np.uint64).reshape(-1), added, add_off,
                width, out.view(np.uint64).reshape(-1), out_ids,
            )  # fmt: skip
            merged[name] = out
        next_id = max(snap.next_id, int(new_ids.max()) + 1)
        new = Snapshot(out_ids, merged, next_id)
        new.attach(_LAYOUT, layout.with_offsets(layout.offsets + add_off))
        return new

    def remove(self, ids, *, missing: str = "raise") -> int:
        """Remove the codes with these ids; the other ids stay as they are.

        ``missing="raise"`` (default) refuses ids that are not in the index with a
        ``ValueError`` and removes nothing; ``missing="ignore"`` skips them. Returns the
        number of codes removed. Safe while other threads search.
        """
        with self._store.writing():
            layout = self._layout(self._store.snapshot)
            new, keep, removed = self._store.plan_remove(ids, missing)
            if removed:
                assert layout is not None  # codes exist, so the lists do
                kept_before = np.zeros(len(keep) + 1, np.int64)
                np.cumsum(keep, out=kept_before[1:])
                new.attach(_LAYOUT, layout.with_offsets(kept_before[layout.offsets]))
                self._store.publish(new)
        return removed

    # ---------------------------------------------------------------------------- search

    def _probe(self, n_probe, owner: str) -> int:
        """The fixed number of lists to probe, or 0 for the budget rule."""
        if n_probe is None:
            n_probe = self.n_probe
        if n_probe is None:
            return 0
        return check_int(n_probe, "n_probe", owner)

    def _min_codes(self, k: int, snap: Snapshot, layout: _Lists) -> int:
        return max(PROBE_FACTOR * k, -(-MIN_PROBE_LISTS * snap.n // layout.n_lists))

    def search(
        self,
        queries: np.ndarray,
        k: int,
        *,
        n_threads: int | None = None,
        n_probe: int | None = None,
        projections=None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest codes in each query's probed lists: ``(D int32 (m, k), I int64
        (m, k))``, sorted by (distance, id), padded with ``-1``.

        ``n_probe``: lists scanned per query (default: the index's; ``None`` there too: the
        budget rule of the class docstring). ``n_probe >= n_lists`` is the exact search.
        ``projections``: the queries' (k-means lists are probed by them).
        """
        snap = self._store.snapshot
        queries = self._check_queries(queries)
        k = self._check_k(k, len(queries))
        probe = self._probe(n_probe, "IVFIndex.search")
        P = self._checked(projections, queries, "IVFIndex.search")
        return self._search_snapshot(snap, queries, k, probe, n_threads, P)

    def _search_snapshot(
        self, snap: Snapshot, queries, k: int, probe: int, n_threads, P, rerank=None
    ):
        """:meth:`search` of checked arguments in one snapshot (``P``: the projections).

        ``rerank=(P32, k_out, row_of_id)``: each query's ``k`` nearest codes re-ranked in
        the scan kernel by the asymmetric score of ``P32`` (float32 ``(m, n_bits)``), right
        after that query's scan; returns the best ``k_out`` as ``(S float32, I int64)``."""
        m, n = len(queries), snap.n
        layout = self._layout(snap)
        out_d = np.full((m, k), -1, np.int32)
        out_i = np.full((m, k), -1, np.int64)
        if rerank is None:
            P32, out_s, out_si, row_of_id = _NO_RERANK
        else:
            P32, k_out, row_of_id = rerank
            out_s = np.full((m, k_out), -np.inf, np.float32)
            out_si = np.full((m, k_out), -1, np.int64)
        if m == 0 or n == 0 or layout is None:
            return (out_d, out_i) if rerank is None else (out_s, out_si)
        cfd = self._float_distances(layout, queries, P)
        min_codes = self._min_codes(k, snap, layout)
        db = snap.rows["words"].reshape(-1)
        q = _read_only(as_words(queries))
        cent = layout.centroids.reshape(-1)
        args = (db, snap.ids, layout.offsets, cent, layout.n_lists, q, cfd)
        grouped = n * self._n_words >= GROUP_MIN_WORDS
        rest = (k, min(k, n), self.n_bits, probe, min_codes, grouped, out_d, out_i, P32)
        rest_rerank = (row_of_id, out_s, out_si)
        width = _WIDTH_TAGS.get(self._n_words)

        tail: int | tuple[int, ...]  # the word count, or a tuple of that length
        if width is None:
            kernel, tail = _kernels.ivf_knn_any_width, self._n_words
        else:
            wide = kernel_path(self._n_words, lone=m == 1) == "wide"
            kernel = _kernels.ivf_knn_wide if wide else _kernels.ivf_knn_fixed_width
            tail = width

        def scan(start: int, stop: int) -> None:
            kernel(*args, start, stop, *rest, *rest_rerank, tail)

        parallel_chunks(scan, m, n_threads)
        return (out_d, out_i) if rerank is None else (out_s, out_si)

    def search_asymmetric(
        self,
        projections,
        k: int,
        *,
        queries=None,
        n_threads: int | None = None,
        n_probe: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best codes by asymmetric score ``s(q, x) = sum_j p_j (2 x_j - 1)``
        (Gordo, Perronnin, Gong & Lazebnik, *Asymmetric distances for binary embeddings*,
        TPAMI 2014) among each query's Hamming shortlist: the ``min(len(self), 4 k)``
        nearest codes by :meth:`search` (its probing, ``n_probe``; k-means lists probed by
        the projections), as
        :meth:`BinaryIndex.search_asymmetric <hashlearn.index.base.BinaryIndex.search_asymmetric>`
        ranks them: ``(S float32 (m, k), I int64 (m, k))``, scores largest first, ties to the
        smaller id, padded with ``-inf`` / ``-1``. Shortlist and codes come from one state.

        Where the ids span at most ``4 n + 1024`` values (ids given by ``add``, or a few
        removed), each query's shortlist is re-ranked inside the scan kernel right after that
        query's scan, while its codes are still in cache; sparser ids are put in order by a
        sort first. Both give the same results.
        """
        owner = "IVFIndex.search_asymmetric"
        P = check_projections(projections, self.n_bits, owner)
        m = len(P)
        k = self._check_k(k, m)
        queries = self._check_queries(pack_bits(P >= 0) if queries is None else queries)
        if len(queries) != m:
            raise ValueError(f"{owner}: {len(queries)} query codes for {m} projections.")
        probe = self._probe(n_probe, owner)
        snap = self._store.snapshot
        if snap.n == 0:
            return np.full((m, k), -np.inf, np.float32), np.full((m, k), -1, np.int64)
        n_short = min(snap.n, SHORTLIST_FACTOR * k)
        row_of_id = snap.derived("ivf_row_of_id", _row_of_id)
        if row_of_id is not False:  # re-ranked in the scan kernel, each query after its scan
            rerank = (_read_only(P), k, row_of_id)
            return self._search_snapshot(snap, queries, n_short, probe, n_threads, P, rerank)
        _, cand = self._search_snapshot(snap, queries, n_short, probe, n_threads, P)
        # the shortlisted codes in id order, so that a tie goes to the smaller id
        short, rows, local = _id_ordered(snap, cand)
        S, pos = rerank_words(P, snap.rows["words"][rows], local, k, self.n_bits, n_threads)
        return S, np.where(pos >= 0, short[np.maximum(pos, 0)], -1)

    def range_search(
        self,
        queries: np.ndarray,
        radius: int,
        *,
        n_threads: int | None = None,
        n_probe: int | None = None,
        projections=None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All codes within Hamming distance ``<= radius`` in each query's probed lists
        (faiss: ``< radius``): ``(lims int64 (m+1,), D int32, I int64)``, query ``i``'s
        results ``D[lims[i]:lims[i+1]]`` sorted by (distance, id). ``n_probe`` and
        ``projections`` as in :meth:`search` (the budget rule with ``k = 1``)."""
        snap = self._store.snapshot
        queries = self._check_queries(queries)
        radius = self._check_radius(radius)
        probe = self._probe(n_probe, "IVFIndex.range_search")
        P = self._checked(projections, queries, "IVFIndex.range_search")
        m, layout = len(queries), self._layout(snap)
        counts = np.zeros(m, np.int64)
        lims = np.zeros(m + 1, np.int64)
        if m == 0 or snap.n == 0 or layout is None:
            return lims, np.zeros(0, np.int32), np.zeros(0, np.int64)
        cfd = self._float_distances(layout, queries, P)
        min_codes = self._min_codes(1, snap, layout)
        db, W = snap.rows["words"].reshape(-1), self._n_words
        q = _read_only(as_words(queries))
        cent, offsets, n_lists = layout.centroids.reshape(-1), layout.offsets, layout.n_lists
        head = (db, offsets, cent, n_lists, q, cfd, W, self.n_bits, radius, probe, min_codes)
        parallel_chunks(lambda s, e: _kernels.ivf_range_count(*head, counts, s, e), m, n_threads)
        np.cumsum(counts, out=lims[1:])
        out_d = np.empty(lims[-1], np.int32)
        out_i = np.empty(lims[-1], np.int64)
        fill = (db, snap.ids, offsets, cent, n_lists, q, cfd, W, self.n_bits, radius, probe)
        parallel_chunks(
            lambda s, e: _kernels.ivf_range_fill(*fill, min_codes, lims, out_d, out_i, s, e),
            m,
            n_threads,
        )
        return lims, out_d, out_i

    # ------------------------------------------------------------------------ persistence

    def _get_state(self):
        snap = self._store.snapshot
        layout = self._layout(snap)
        W = self._n_words
        if layout is None:
            centroids, offsets = np.zeros((0, W), np.uint64), np.zeros(1, np.int64)
        else:
            centroids, offsets = layout.centroids, layout.offsets
        params = {
            "n_bits": self.n_bits,
            "n_lists": self.n_lists,
            "n_probe": self.n_probe,
            "random_state": self.random_state,
            "quantizer": self.quantizer,
        }
        arrays = {
            "words": snap.rows["words"],
            "ids": snap.ids,
            "centroids": centroids,
            "offsets": offsets,
        }
        if layout is not None and layout.vectors is not None:
            arrays["centroid_vectors"] = layout.vectors
            arrays["bit_scale"] = layout.scale
        return params, {"next_id": snap.next_id}, arrays

    @classmethod
    def _from_state(cls, params, state, arrays):
        index = cls(**params)
        W = index._n_words
        ids = require_array(arrays, "ids", np.int64, 1, low=0)
        n = len(ids)
        words = require_array(arrays, "words", np.uint64, shape=(n, W))
        check_words(words, index.n_bits, "words")
        centroids = require_array(arrays, "centroids", np.uint64, shape=(None, W))
        check_words(centroids, index.n_bits, "centroids")
        n_lists = len(centroids)
        offsets = require_array(arrays, "offsets", np.int64, shape=(n_lists + 1,))
        if offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) < 0):
            raise ValueError(
                f"array 'offsets' must rise from 0 to the {n} stored codes, one list after another"
            )
        if n and n_lists == 0:
            raise ValueError("the saved IVFIndex holds codes but no centroids")
        if not _kernels.lists_sorted(ids, offsets):
            raise ValueError("array 'ids' is not ascending within each list")
        if n > 1:
            s = np.sort(ids)
            if np.any(s[1:] == s[:-1]):
                raise ValueError("array 'ids' holds duplicate ids")
        low = int(ids.max()) + 1 if n else 0
        next_id = require_state(state, "next_id", int, low=low, high=ID_MAX + 1)
        vectors = scale = None
        if index.uses_projections and n_lists:
            vectors = require_array(
                arrays, "centroid_vectors", np.float32, shape=(n_lists, index.n_bits)
            )
            scale = require_array(arrays, "bit_scale", np.float32, shape=(index.n_bits,))
            if not (np.isfinite(vectors).all() and np.isfinite(scale).all()):
                raise ValueError("arrays 'centroid_vectors' and 'bit_scale' must be finite")
            signs = centroids.view(np.uint8)[:, : index.code_size]
            if index.quantizer == "k-means" and not np.array_equal(pack_bits(vectors >= 0), signs):
                raise ValueError("array 'centroids' is not the signs of 'centroid_vectors'")
        elif "centroid_vectors" in arrays or "bit_scale" in arrays:
            raise ValueError(
                "float centroids saved for an IVFIndex whose lists are not k-means lists"
            )
        snap = Snapshot(ids, {"words": words}, next_id)
        if n_lists:
            snap.attach(_LAYOUT, _Lists(centroids, offsets, vectors, scale))
        index._store.publish(snap)
        return index

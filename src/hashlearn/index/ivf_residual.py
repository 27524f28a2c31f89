"""Residual 1-bit codes under float k-means lists, ranked by RaBitQ's estimator (IVF-RaBitQ).

J. Gao, C. Long, "RaBitQ: quantizing high-dimensional vectors with a theoretical error bound
for approximate nearest neighbor search", SIGMOD 2024: each vector is coded by the signs of
its residual to its list's centroid, and a real-valued query is scored against the bits by an
unbiased estimator of the inner product (Sec. 3.2, ``<o, q> ~ <o_bar, q> / <o_bar, o>``); its
IVF layout puts the codes under k-means lists (Sec. 5; faiss's ``IndexIVFRaBitQ``). Here the
space is a linear hasher's projections ``p = f(x)`` (ITQ's rotated principal directions,
orthonormal LSH, sign bits: ``hasher.project``), so one hasher gives the lists, the codes and
the query's scores:

* lists: Lloyd's k-means on the projections (``IVFIndex(quantizer="k-means")``'s lists);
* code of ``p`` in list ``l``: ``b = sign(r)``, ``r = p - c_l`` (``b`` in ``{-1, 1}``, stored
  as bits ``r >= 0``), and two float32 factors per row (8 bytes);
* with ``g = |r|^2 / |r|_1`` RaBitQ's estimator of ``<q - c, r>`` is ``g <q - c, b>``
  (``<o_bar, o> = |r|_1 / (sqrt(D) |r|)`` for ``o = r / |r|``, ``o_bar = b / sqrt(D)``);
  ``<q - c, b> = <q, b> - <c, b>``, so one quantized copy of the query serves every list and
  the score of a row is

      s(q, x) = <q, c_l> + g <q_bar, b> + h,        h = <c_l, r> - g <c_l, b> - |p|^2 / 2,

  with ``q_bar`` the query's projections rounded to 16 levels (RaBitQ's ``B_q = 4``, Sec.
  3.3), so that ``<q_bar, b>`` is four ANDs and popcounts a code word
  (:func:`hashlearn.index._ivf_kernels.query_planes`). It estimates ``<q, p> - |p|^2 / 2 =
  (|q|^2 - |q - p|^2) / 2``: ranking by ``s`` descending is ranking by the estimated
  Euclidean distance in the projection space ascending, the geometry of the lists' probe.
  ``add(row_terms=t)`` puts ``t_x`` in place of ``-|p|^2 / 2``, so that the score estimates
  ``<q, p> + t_x``: :class:`~hashlearn.search.Searcher` passes what an orthonormal
  projection drops from each row (:func:`hashlearn.search.row_terms`), since the projection
  space's own distance over-ranks rows with much outside the projection (for unit vectors
  through ITQ ``-|p|^2 / 2 = <x, mu> + |x_perp|^2 / 2 + const``, not ``<x, mu> + const``).

The factors ``(g, h)`` are computed in float64 and stored as float32; the scan sums the
integer popcounts exactly and the float32 terms in a fixed order
(:func:`hashlearn.index._ivf_kernels.residual_knn_fixed_width`). The codes of the plain
:class:`~hashlearn.index.IVFIndex` compared by Hamming distance to the query's residual do
worse than plain Hamming ranking (residual distances are not comparable across lists:
``bench/residual_codes.py``), so this index ranks by the estimate only:
:meth:`search_asymmetric` (``Searcher(ranking="asymmetric")``); its Hamming ``search`` and
``range_search`` raise.

Lists: k-means (the paper's IVF, the default) or k-majority lists of the projections' signs
probed by Hamming distance (``quantizer="k-majority"``), whose residuals are taken from each
list's mean projection; the estimator is the same for both.

Measured (``docs/results.md``, 120k MiniLM rows through ITQ-256, one thread, AMD EPYC Zen 3
with AVX2): recall@10 0.958 after rescoring 80 rows, at 0.91x faiss HNSW's queries per second
and 1.9x faiss IVF-RaBitQ's, but 0.74x the k-majority :class:`~hashlearn.index.IVFIndex`
that ``EmbeddingIndex`` uses by default: a scanned code costs about 17-20 ns here (AVX2, no
vector popcount) against about 1 ns for a Hamming code, which eats what the fewer candidates
save.
"""

from __future__ import annotations

import numpy as np

from hashlearn._utils.parallel import parallel_chunks
from hashlearn.codes import as_words, hamming_cdist, pack_bits, unpack_bits
from hashlearn.index import _ivf_kernels as _kernels
from hashlearn.index._asymmetric import check_projections
from hashlearn.index._knn_scan import _WIDTH_TAGS
from hashlearn.index._storage import ID_MAX, IdStore, Snapshot
from hashlearn.index.ivf import _LAYOUT, _NO_FLOAT, IVFIndex, _Lists, _read_only
from hashlearn.io import persistable, require_array, require_state

__all__ = ["ResidualIVFIndex"]

#: ``n_probe=None`` before :meth:`ResidualIVFIndex.calibrate`: scan the nearest lists until
#: they hold ``PROBE_FACTOR * k`` codes ...
PROBE_FACTOR = 64
#: ... and at least ``MIN_PROBE_LISTS`` average lists' worth of codes
MIN_PROBE_LISTS = 16
#: ``n_probe=None`` after :meth:`ResidualIVFIndex.calibrate`: for ``k`` candidates the probed
#: lists may miss ``PROBE_MISS / k`` of a query's true neighbours (estimated on the sample)
PROBE_MISS = 2.0
_CHUNK = 65536  # rows encoded at a time (bounds the float64 temporaries)
_FLOAT32_SQ_MAX = 1e37  # |p|^2 of a row at most this (float32 factors, with room)
_NO_WORDS = _read_only(np.zeros(0, np.uint64))  # no query signs: a probe by float distances


@persistable
class ResidualIVFIndex(IVFIndex):
    """k-means lists of a hasher's projections with residual 1-bit codes, ranked by RaBitQ's
    estimator (module doc); the coarse stage of ``EmbeddingIndex(coarse_quantizer="residual")``.

    ``add`` and ``train`` take the rows' ``projections=`` (a hasher's ``project(X)``; given
    only codes, the bits scaled by the training set's mean ``|p_j|`` stand in for them, as for
    ``IVFIndex(quantizer="k-means")``). :meth:`search_asymmetric` returns each query's ``k``
    best rows of its probed lists by estimated score. 48 bytes a row in RAM at 256 bits (the
    32-byte code, the factors, the id), plus the lists.

    Parameters
    ----------
    n_bits : int
        Code length in bits (one per projection).
    n_lists : int or None, default=None
        Number of k-means lists; ``None``: about ``4 sqrt(n)`` for ``n`` training rows (as
        :class:`~hashlearn.index.IVFIndex`).
    n_probe : int or None, default=None
        Lists scanned per query. ``None``: the nearest lists until they hold a budget of
        codes for a search of ``k``, so that the candidates a searcher asks for set how far
        it looks: sized from the data after :meth:`calibrate` (the lists may miss about
        ``PROBE_MISS / k`` of a query's true neighbours), else ``max(64 k, 16 n /
        n_lists)``.
    random_state : int, default=0
        Seed of the k-means sample and initial centroids.
    quantizer : {"k-means", "k-majority"}, default="k-means"
        The lists: k-means on the projections (RaBitQ's IVF; a query's probe is one
        product with the float centroids, about 15 us a query at 256 bits x 2,000 lists on
        Zen 4), or k-majority lists of the projections' signs (:class:`IVFIndex`'s default,
        probed by Hamming distance, about 2 us), each with the mean of its training
        projections as the float centroid of its residuals. The k-means default stays until
        the k-majority lists are measured on real embeddings (issue 32).

    Notes
    -----
    The stored codes (:attr:`codes`) are the residual signs, not the codes that were added.
    Training a non-empty index again raises (the rows' projections are not kept): build a
    new one.

    Examples
    --------
    >>> import numpy as np
    >>> from hashlearn.index.ivf_residual import ResidualIVFIndex
    >>> P = np.random.default_rng(0).standard_normal((500, 32)).astype(np.float32)
    >>> codes = np.packbits(P >= 0, axis=1, bitorder="little")
    >>> index = ResidualIVFIndex(32, n_lists=8)
    >>> index.add(codes, projections=P)[:3]
    array([0, 1, 2])
    >>> S, I = index.search_asymmetric(P[:2], k=1, n_probe=8)  # every list
    >>> I.tolist()
    [[0], [1]]
    """

    #: the shortlist comes from :meth:`search_asymmetric` only (``check_ranking``)
    hamming_search = False
    #: ``add`` takes ``row_terms`` (what the projection drops; ``Searcher`` passes them)
    accepts_row_terms = True

    @property
    def uses_projections(self) -> bool:
        """Always: the residuals are taken in the projection space, whatever the lists."""
        return True

    def __init__(
        self,
        n_bits: int,
        n_lists: int | None = None,
        n_probe: int | None = None,
        random_state: int = 0,
        quantizer: str = "k-means",
    ):
        super().__init__(n_bits, n_lists, n_probe, random_state, quantizer=quantizer)
        rows = {"words": ((self._n_words,), np.uint64), "factors": ((2,), np.float32)}
        self._store = IdStore(rows, type(self).__name__)
        #: from :meth:`calibrate`: sorted fractions of the stored rows a probe must scan to
        #: reach each sampled true neighbour (None: the fixed budget rule)
        self._probe_need: np.ndarray | None = None
        self.probe_rows = 0  # the rows stored when calibrate last ran (0: never)

    # ------------------------------------------------------------------------ encoding

    def _residual_rows(self, P: np.ndarray, lists: np.ndarray, layout: _Lists, terms=None):
        """``(words, factors)`` of projection rows ``P`` filed under ``lists``: the residual
        signs as uint64 words and ``(g, h)`` per row (module doc), computed in float64;
        ``terms``: the rows' terms replacing ``-|p|^2 / 2`` in ``h`` (:meth:`add`)."""
        assert layout.vectors is not None
        m = len(P)
        words = np.empty((m, self._n_words), np.uint64)
        factors = np.empty((m, 2), np.float32)
        for s in range(0, m, _CHUNK):
            p = P[s : s + _CHUNK].astype(np.float64)
            c = layout.vectors[lists[s : s + _CHUNK]].astype(np.float64)
            r = p - c
            bits = r >= 0
            l1 = np.abs(r).sum(1)
            g = np.divide((r * r).sum(1), l1, out=np.zeros(len(r)), where=l1 > 0)
            signed_c = np.where(bits, c, -c).sum(1)  # <c, b>
            if terms is None:
                term = -0.5 * (p * p).sum(1)
            else:
                term = terms[s : s + _CHUNK].astype(np.float64)
            h = (c * r).sum(1) - g * signed_c + term
            words[s : s + len(p)] = as_words(pack_bits(bits)).reshape(len(p), self._n_words)
            factors[s : s + len(p), 0] = g
            factors[s : s + len(p), 1] = h
        return words, factors

    @staticmethod
    def _checked_terms(row_terms, m: int, owner: str) -> np.ndarray:
        """``row_terms`` as float64 ``(m,)``, finite and within float32's range with room."""
        terms = np.asarray(row_terms)
        if terms.shape != (m,) or not np.issubdtype(terms.dtype, np.floating):
            raise ValueError(
                f"row_terms of {owner} must be a float array of shape ({m},); got "
                f"{terms.dtype} {terms.shape}."
            )
        terms = terms.astype(np.float64)
        if not np.isfinite(terms).all() or (m and np.abs(terms).max() > _FLOAT32_SQ_MAX):
            raise ValueError(f"row_terms of {owner} must be finite and at most 1e37 in size.")
        return terms

    @staticmethod
    def _largest_sq_norm(P: np.ndarray) -> float:
        """The largest ``|p|^2`` of projection rows ``P`` (0 for none), in float64."""
        return float((P.astype(np.float64) ** 2).sum(1).max()) if len(P) else 0.0

    @classmethod
    def _check_scale(cls, P: np.ndarray) -> None:
        """Refuse projections whose squared norms overflow float32 (the factors hold them)."""
        if cls._largest_sq_norm(P) > _FLOAT32_SQ_MAX:
            raise ValueError(
                "ResidualIVFIndex.add: projections too large for float32 factors (|p|^2 "
                "overflows); scale the vectors down."
            )

    # ------------------------------------------------------------------------ training

    def _train_locked(self, words: np.ndarray, P: np.ndarray | None) -> None:
        snap = self._store.snapshot
        if snap.n:
            raise ValueError(
                "ResidualIVFIndex.train: the index holds rows, whose projections it does not "
                "keep; build a new index to learn other lists."
            )
        assert P is not None  # uses_projections: the stand-in when none are given
        self._check_scale(P)
        empty = Snapshot(snap.ids, dict(snap.rows), snap.next_id)
        self._probe_need, self.probe_rows = None, 0  # other lists: calibrate again
        if self.quantizer == "k-means":
            layout = self._k_means_lists(P)
        else:
            layout = self._k_majority_lists(P)
        empty.attach(_LAYOUT, layout)
        self._store.publish(empty)

    def _k_majority_lists(self, P: np.ndarray) -> _Lists:
        """Empty k-majority lists of the projections' signs (:meth:`IVFIndex._k_majority`),
        each with the mean of its training projections as the float centroid the residuals
        are taken from (an empty list: its binary centroid at the bits' stand-in scale)."""
        words = self._sign_words(P)
        centroids = self._k_majority(words)
        lists = self._assign(words, centroids)
        n_lists = len(centroids)
        scale = np.abs(P).mean(0).astype(np.float32)
        sizes = np.bincount(lists, minlength=n_lists)
        sums = np.zeros((n_lists, self.n_bits), np.float64)
        np.add.at(sums, lists, P.astype(np.float64))
        codes = np.ascontiguousarray(centroids.view(np.uint8)[:, : self.code_size])
        signs = unpack_bits(codes, self.n_bits) * 2.0 - 1.0
        vectors = np.where(
            sizes[:, None] > 0, sums / np.maximum(sizes, 1)[:, None], signs * scale
        ).astype(np.float32)
        return _Lists(centroids, np.zeros(n_lists + 1, np.int64), vectors, scale)

    def _sign_words(self, P: np.ndarray) -> np.ndarray:
        """The signs ``p >= 0`` of projection rows as uint64 words ``(m, W)`` (a linear
        hasher's codes of the same rows)."""
        return as_words(pack_bits(P >= 0)).reshape(len(P), self._n_words)

    # ------------------------------------------------------------------------- writing

    def add(self, codes: np.ndarray, ids=None, *, projections=None, row_terms=None) -> np.ndarray:
        """Add rows by their codes and ``projections`` (see the class doc) with optional
        distinct int ids; returns their ids (int64, in the order given).

        ``row_terms``: float ``(m,)``, each row's term ``t_x`` in place of ``-|p|^2 / 2``, so
        that its score estimates ``<q, p> + t_x`` (module doc): what the projection drops
        from a row, put back by a caller that has the vectors (``Searcher`` passes
        :func:`hashlearn.search.row_terms` for a linear hasher with orthonormal rows).

        An untrained index first trains on them. Without ``ids`` the rows are numbered from
        one past the largest id ever added; duplicate ids, or ids already in the index, raise
        ``ValueError``. O(n + m): the lists are rewritten. Safe while other threads search.
        """
        owner = "ResidualIVFIndex.add"
        codes = self._check_codes(codes)
        m = codes.shape[0]
        P = self._checked(projections, codes, owner)
        if P is not None:
            self._check_scale(P)
        terms = None if row_terms is None else self._checked_terms(row_terms, m, owner)
        with self._store.writing():
            new_ids = self._store.new_ids(ids, m)
            if m == 0:
                return new_ids
            if not self.is_trained:
                self._train_locked(np.zeros((0, self._n_words), np.uint64),
                                   self._projections(P, codes, None, ""))  # fmt: skip
            snap = self._store.snapshot
            layout = self._layout(snap)
            assert layout is not None  # trained just above
            if P is None:  # the stand-in, at the trained scale
                P = self._projections(None, codes, layout.scale, "")
            if self.quantizer == "k-means":
                lists = self._float_assign(P, layout)
            else:
                lists = self._assign(self._sign_words(P), layout.centroids)
            order = np.lexsort((new_ids, lists))
            sorted_terms = None if terms is None else terms[order]
            words, factors = self._residual_rows(P[order], lists[order], layout, sorted_terms)
            rows = {"words": words, "factors": factors}  # two float32: one 64-bit word
            self._store.publish(self._merged(snap, layout, lists, new_ids, order, rows))
        return new_ids

    # -------------------------------------------------------------------------- search

    def search(self, queries, k, **kwargs):
        """Not available: this index ranks by its estimator (:meth:`search_asymmetric`)."""
        raise TypeError(
            "ResidualIVFIndex ranks by projections only: call search_asymmetric(projections, "
            "k), or use Searcher(ranking='asymmetric')."
        )

    def range_search(self, queries, radius, **kwargs):
        """Not available: residual codes have no Hamming radius (:meth:`search_asymmetric`)."""
        raise TypeError(
            "ResidualIVFIndex has no Hamming range search; rank by search_asymmetric instead."
        )

    def _min_codes(self, k: int, snap: Snapshot, layout: _Lists) -> int:
        need = self._probe_need
        if need is None:
            return max(PROBE_FACTOR * k, -(-MIN_PROBE_LISTS * snap.n // layout.n_lists))
        # the smallest budget leaving at most PROBE_MISS / k of the sampled neighbours out
        allowed = int(PROBE_MISS * len(need) / k)
        if allowed >= len(need):
            return k
        return max(k, int(np.ceil(need[len(need) - 1 - allowed] * snap.n)))

    def calibrate(self, projections, neighbors) -> ResidualIVFIndex:
        """Size the budget rule of ``n_probe=None`` from the data; returns ``self``.

        ``projections``: sample queries like those to be searched (``(m, n_bits)``, e.g.
        stored rows'); ``neighbors``: the ids of each one's true nearest stored rows by the
        metric searched (int ``(m, t)``, ``-1`` pads). For each true neighbour the probe's
        cost to reach it is counted: the codes of the lists nearer the query (in the probe's
        order) plus one, as a fraction of the rows stored. A search for ``k`` candidates
        then scans the nearest lists until they hold ``max(k, f n)`` codes, ``n`` the rows
        stored at search time and ``f`` the fraction that leaves at most ``PROBE_MISS / k``
        of the sampled neighbours unreached: the lists are expected to lose about as few
        true neighbours as ``k`` candidates do, whether the data's neighbours sit in one
        list (a clustered 1M set: 7 average lists for 120 candidates) or spread over many
        (the 249k MiniLM corpus: 64 for 60). Fixed factors (``PROBE_FACTOR``) serve until
        this is called; training other lists clears it. ``EmbeddingIndex`` calls it after
        the first add, with exact neighbours of sampled rows."""
        owner = "ResidualIVFIndex.calibrate"
        P = check_projections(projections, self.n_bits, owner)
        nb = np.asarray(neighbors)
        if nb.ndim != 2 or len(nb) != len(P) or not np.issubdtype(nb.dtype, np.integer):
            raise ValueError(
                f"{owner}: neighbors must be an integer array (m, t) with one row per "
                f"projection row ({len(P)}); got {nb.dtype} {nb.shape}."
            )
        with self._store.writing():
            snap = self._store.snapshot
            layout = self._layout(snap)
            if layout is None or snap.n == 0:
                raise ValueError(f"{owner}: the index holds no rows to calibrate on.")
            by_id = np.argsort(snap.ids, kind="stable")
            q_rows, cols = np.nonzero(nb >= 0)
            wanted = nb[q_rows, cols].astype(np.int64)
            pos = np.searchsorted(snap.ids, wanted, sorter=by_id)
            pos = np.minimum(pos, snap.n - 1)
            if not np.array_equal(snap.ids[by_id[pos]], wanted):
                raise ValueError(f"{owner}: neighbors holds ids that are not in the index.")
            sizes = np.diff(layout.offsets)
            row_list = np.searchsorted(layout.offsets, by_id[pos], side="right") - 1
            if self.quantizer == "k-means":
                dist = self._float_distances(layout, None, P)
            else:
                signs = pack_bits(P >= 0)
                cent = np.ascontiguousarray(layout.centroids.view(np.uint8)[:, : self.code_size])
                dist = hamming_cdist(signs, cent, self.n_bits)
            order = np.argsort(dist, axis=1, kind="stable")  # the probe's order, ties by list
            rank = np.empty_like(order)
            np.put_along_axis(rank, order, np.arange(layout.n_lists)[None, :], axis=1)
            before = np.cumsum(sizes[order], axis=1) - sizes[order]  # codes ahead of a list
            reach = before[q_rows, rank[q_rows, row_list]] + 1
            need = np.sort(reach / snap.n)
            self._probe_need = _read_only(need) if len(need) else None
            self.probe_rows = snap.n if len(need) else 0
        return self

    def search_asymmetric(
        self,
        projections,
        k: int,
        *,
        queries=None,
        n_threads: int | None = None,
        n_probe: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` rows of highest estimated score ``s(q, x)`` (module doc) in each query's
        probed lists: ``(S float32 (m, k), I int64 (m, k))``, largest first, ties to the
        smaller id, padded with ``-inf`` / ``-1``.

        ``projections``: the queries' (``(m, n_bits)``, a hasher's ``project(X)``); they
        probe the lists too. ``queries``: their codes, checked and otherwise unused (the
        signature of every index's asymmetric search). ``n_probe``: lists per query (default:
        the index's; ``None`` there too: the class doc's budget rule); ``n_probe >=
        n_lists`` scores every row."""
        owner = "ResidualIVFIndex.search_asymmetric"
        P = check_projections(projections, self.n_bits, owner)
        m = len(P)
        k = self._check_k(k, m)
        if queries is not None and len(self._check_queries(queries)) != m:
            raise ValueError(f"{owner}: {len(queries)} query codes for {m} projections.")
        probe = self._probe(n_probe, owner)
        snap = self._store.snapshot
        layout = self._layout(snap)
        out_s = np.full((m, k), -np.inf, np.float32)
        out_i = np.full((m, k), -1, np.int64)
        if m == 0 or snap.n == 0 or layout is None:
            return out_s, out_i
        if self.quantizer == "k-means":  # the probe by float distances
            # no float32 overflow (hence no NaN) where every |p|^2 and |c|^2 is small enough
            largest = max(self._largest_sq_norm(P), float(layout.sq_norms.max()))
            finite = largest <= _FLOAT32_SQ_MAX
            cfd = self._float_distances(layout, None, P, finite=finite)
            query_words = _NO_WORDS
        else:  # by the Hamming distances of the queries' signs to the binary centroids
            cfd, query_words = _NO_FLOAT, _read_only(self._sign_words(P).reshape(-1))
        args = (
            cfd, layout.probe_form[1], _read_only(P), snap.rows["words"].reshape(-1),
            snap.rows["factors"], snap.ids, layout.offsets, layout.centroids.reshape(-1),
            layout.vectors, query_words, layout.n_lists, self.n_bits, probe,
            self._min_codes(k, snap, layout), out_s, out_i,
        )  # fmt: skip
        width = _WIDTH_TAGS.get(self._n_words)
        tail: int | tuple[int, ...]  # the word count, or a tuple of that length
        if width is None:
            kernel, tail = _kernels.residual_knn_any_width, self._n_words
        else:
            kernel, tail = _kernels.residual_knn_fixed_width, width
        parallel_chunks(lambda s, e: kernel(*args, s, e, tail), m, n_threads)
        return out_s, out_i

    # -------------------------------------------------------------------- persistence

    def _get_state(self):
        params, state, arrays = super()._get_state()
        arrays["factors"] = self._store.snapshot.rows["factors"]
        if self._probe_need is not None:
            arrays["probe_need"] = self._probe_need
            state = dict(state, probe_rows=self.probe_rows)
        return params, state, arrays

    @classmethod
    def _from_state(cls, params, state, arrays):
        index = super()._from_state(params, state, arrays)
        snap = index._store.snapshot
        factors = require_array(arrays, "factors", np.float32, shape=(snap.n, 2))
        if not np.isfinite(factors).all():
            raise ValueError("array 'factors' must be finite")
        if "probe_need" in arrays:  # saves before calibrate existed have none
            need = require_array(arrays, "probe_need", np.float64, 1)
            if not (np.all((need > 0) & (need <= 1)) and np.all(np.diff(need) >= 0)):
                raise ValueError("array 'probe_need' must rise within (0, 1]")
            index._probe_need = need if len(need) else None
            index.probe_rows = require_state(state, "probe_rows", int, low=1, high=ID_MAX + 1)
        rows = {"words": snap.rows["words"], "factors": factors}
        loaded = Snapshot(snap.ids, rows, snap.next_id)
        layout = index._layout(snap)
        if layout is not None:
            loaded.attach(_LAYOUT, layout)
        index._store.publish(loaded)
        return index

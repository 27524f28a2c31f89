"""Searcher: hash, shortlist by Hamming distance, refine -- one object over any index.

In the shape of faiss's ``IndexRefine`` (``base_index``, ``refine_index``, ``k_factor``): a
hasher (or bucketer) + an index (local, or sharded on Dask) + a refine stage
(:class:`~hashlearn.rerank.refiner.Refiner`: the vectors, every kernel path and screen) + a
candidate budget that a search may override. ``Searcher`` only composes.

Result convention (faiss's; every class and the CLI): ``rerank="inner_product"`` and
``"cosine"`` report similarities, largest first, padded with ``-inf``; other re-rankings
float32 distances, smallest first, padded with ``inf``; no re-ranking, int32 Hamming
distances padded with -1. Ids pad with -1.

Threads: searches run beside writes. Writers hold a lock and bump a version before and after
each write (a seqlock); a search that overlapped a write runs again: one published state.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from hashlearn import io as _io
from hashlearn._utils.parallel import bounded_threads
from hashlearn._utils.seqlock import SeqLock
from hashlearn._utils.validation import check_int
from hashlearn.hashers.base import BaseHasher
from hashlearn.index._asymmetric import check_ranking
from hashlearn.index._neighbors import pad_candidates, relative_neighbors
from hashlearn.index.base import BinaryIndex, make_index
from hashlearn.rerank import available_rerankers, register_reranker
from hashlearn.rerank.refiner import MissingVectorsError, Refiner
from hashlearn.rerank.store import VectorStore

__all__ = ["Searcher", "register_reranker", "available_rerankers"]

_COMPONENT = re.compile(r"(hasher|index)-[0-9a-f]{16}")
_COMPONENT_TMP = re.compile(r"\.(hasher|index)-[0-9a-f]{16}\.tmp-.*")


class Searcher:
    """Hasher + index + refine stage + candidate budget, in one object.

    Parameters
    ----------
    hasher : BaseHasher or bucketer
        A hashlearn hasher (:meth:`fit` fits it in place), or a bucketer with ``keys(X)``
        (search forests, k-means trees, LSH tables) with a candidate index (``TableIndex``).
    index : index or str, default="flat"
        An index over the hasher's codes, a name for :func:`hashlearn.index.make_index`, or
        a sharded index (with ``refine_search``, :class:`hashlearn.distributed.ShardedIndex`)
        whose shards keep and refine their own vectors on their workers.
    rerank : None, str or callable
        ``None``: Hamming distances. A name from :func:`available_rerankers`, ``"metric"``
        (the hasher's learned metric) or ``fn(queries (b, d), candidates (b, c, d)) ->
        distances (b, c)``: the refine stage (:class:`~hashlearn.rerank.refiner.Refiner`).
    n_candidates : int, optional
        Candidates refined per query (a search may override it): a Hamming index's nearest
        ``n_candidates`` (default ``max(10 * k, 100)``); the first ``n_candidates`` of each
        list of an index with ``candidates(...)`` (default: all).
    screen : bool, default=True
        Let the refine stage screen candidates with a compact copy of the vectors.
    ranking : {"hamming", "asymmetric"}, default="hamming"
        Shortlist by Hamming distance, or by the query's projections against the codes
        (``index.search_asymmetric``, Gordo et al., TPAMI 2014; float32 scores, largest first,
        without re-ranking): :func:`~hashlearn.index._asymmetric.check_ranking`.

    Examples
    --------
    >>> from hashlearn import Searcher, RandomHyperplaneLSH, load_digits
    >>> X, y = load_digits()
    >>> s = Searcher(RandomHyperplaneLSH(32, random_state=0), rerank="euclidean")
    >>> D, I = s.fit(X).add(X).search(X[:2], k=3)
    >>> I[:, 0].tolist()
    [0, 1]
    >>> bool((s.search(X[:2], k=3, k_factor=4)[1][:, 0] == I[:, 0]).all())  # 12 candidates
    True
    """

    def __init__(
        self, hasher, index="flat", rerank=None, n_candidates=None, screen=True, ranking="hamming"
    ):
        if not (isinstance(hasher, BaseHasher) or _is_bucketer(hasher)):
            raise TypeError(f"hasher must be a hasher or a bucketer, got {type(hasher).__name__}")
        self._index_name = index if isinstance(index, str) else None
        if isinstance(index, str):
            if not hasattr(hasher, "n_bits"):
                raise TypeError(
                    "a bucketer needs an index object such as TableIndex, not a registry name."
                )
            index = make_index(index, n_bits=getattr(hasher, "n_bits_", hasher.n_bits))
        self._sharded = callable(getattr(index, "refine_search", None))
        if not (isinstance(index, BinaryIndex) or self._sharded or _is_candidate_index(index)):
            raise TypeError(
                f"index must be a hashlearn index or a registry name. Got {type(index).__name__}."
            )
        if (isinstance(index, BinaryIndex) or self._sharded) and index.n_bits != _code_bits(hasher):
            raise ValueError(
                f"index holds {index.n_bits}-bit codes but the hasher makes "
                f"{_code_bits(hasher) or 'no'}-bit codes."
            )
        if rerank is None and not (isinstance(index, BinaryIndex) or self._sharded):
            raise ValueError(f"{type(index).__name__} gives no distances; pass rerank=...")
        if n_candidates is not None:
            check_int(n_candidates, "n_candidates", "Searcher")
        check_ranking(ranking, hasher, index, "Searcher")
        refiner = Refiner(rerank, hasher=hasher, screen=screen)  # validates both
        self.hasher, self.index, self.rerank = hasher, index, rerank
        self.n_candidates, self.screen, self.ranking = n_candidates, bool(screen), ranking
        #: the refine stage (None without re-ranking, or when the sharded index refines)
        self.refiner = None if self._sharded or rerank is None else refiner
        self._attached = False  # a sharded index was given the refine stage's recipe
        self._seq = SeqLock()  # writers one at a time, searches beside them (module doc)
        #: the geometry whose per-row terms an index with ``accepts_row_terms`` gets at each
        #: add (:func:`row_terms`); a save keeps it, a save from before it has none
        self._row_terms = _ROW_TERMS.get(rerank) if isinstance(rerank, str) else None

    def fit(self, X, y=None, **fit_params) -> Searcher:
        """Fit the hasher in place on a sample; adds nothing. A hasher making fewer bits than
        asked (PCA hashing clips ``n_bits``) re-makes an empty index made from a name."""
        self.hasher.fit(X, y, **fit_params)
        bits = _code_bits(self.hasher)
        if isinstance(self.index, BinaryIndex) and self.index.n_bits != bits:
            if self._index_name is None or len(self.index):
                raise ValueError(
                    f"the fitted hasher makes {bits}-bit codes but the index holds "
                    f"{self.index.n_bits}-bit codes; build the index with n_bits={bits}."
                )
            self.index = make_index(self._index_name, n_bits=bits)
        if callable(getattr(self.index, "train", None)):  # a coarse stage: IVFIndex's lists
            self.index.train(self._encode(X), **self._projected(X))
        self._attach()
        return self

    def _attach(self) -> None:
        if self._sharded and self.rerank is not None and not self._attached:
            self.index.attach_refiner(self.rerank, self.hasher, self.screen)
            self._attached = True

    def add(self, X, ids=None) -> Searcher:
        """Encode the rows of ``X`` and add them to the index (and the refine stage)."""
        if isinstance(self.hasher, BaseEstimator):
            check_is_fitted(self.hasher)
        # a dask array over a refining sharded index is encoded and kept on the workers
        on_workers = self._sharded and self.rerank is not None and hasattr(X, "__dask_graph__")
        codes = None if on_workers else self._encode(X)
        with self._seq.writing():
            if self._sharded:
                self._attach()
                vectors = None if self.rerank is None else X
                self.index.add(codes, ids=ids, vectors=vectors)
                return self
            vectors = None if self.refiner is None else self.refiner.store.prepare(X)
            extra = self._projected(X)
            if self._row_terms and getattr(self.index, "accepts_row_terms", False):
                terms = row_terms(self.hasher, X, self._row_terms)
                extra = extra if terms is None else {**extra, "row_terms": terms}
            new_ids = np.asarray(self.index.add(codes, ids, **extra))
            if vectors is not None:
                self.refiner.store.add(vectors, new_ids)
        return self

    def remove(self, ids) -> int:
        """Remove ids from the index (and their vectors); returns the number removed."""
        with self._seq.writing():
            removed = self.index.remove(ids)
            if self.refiner is not None:
                self.refiner.remove(ids)
        return removed

    def search(self, X, k: int, *, n_candidates=None, k_factor=None, n_threads=None):
        """The ``k`` nearest items of each row of ``X``: ``(D, I)`` (module doc: convention).

        This search's budget: ``n_candidates`` (absolute) or ``k_factor`` (``k * k_factor``),
        at most one; default the searcher's ``n_candidates``. ``n_threads=None`` uses
        :func:`hashlearn.get_num_threads`."""
        k = check_int(k, "k", "Searcher.search")
        if n_candidates is not None and k_factor is not None:
            raise ValueError("Searcher.search takes n_candidates or k_factor, not both.")
        if k_factor is not None:
            n_candidates = k * check_int(k_factor, "k_factor", "Searcher.search")
        elif n_candidates is not None:
            n_candidates = check_int(n_candidates, "n_candidates", "Searcher.search")
        else:
            n_candidates = self.n_candidates
        with bounded_threads(n_threads):  # BLAS and OpenMP too: n_threads=1 is one CPU
            return self._search(X, k, n_candidates, n_threads)

    def _search(self, X, k, n_candidates, n_threads):
        # an index that ranks by projections only (ResidualIVFIndex) needs no query codes
        codes = self._encode(X) if getattr(self.index, "hamming_search", True) else None
        if self.rerank is None:
            return self._ranked(X, codes, k, n_threads)
        if not callable(getattr(self.index, "candidates", None)):
            n_candidates = max(k, n_candidates or max(10 * k, 100))
        if self._sharded:
            return self.index.refine_search(X, codes, k, n_candidates)
        return self._seq.read(
            self._refined, X, codes, k, n_candidates, n_threads, retry_on=MissingVectorsError
        )

    def _refined(self, X, codes, k, n_candidates, n_threads):
        if callable(getattr(self.index, "candidates", None)):
            cand = pad_candidates(self.index.candidates(codes), n_candidates)
        else:
            n_candidates = min(n_candidates, max(len(self.index), 1))
            _, cand = self._ranked(X, codes, n_candidates, n_threads)
        return self.refiner.refine(X, cand, k, n_threads=n_threads)

    def _ranked(self, X, codes, k, n_threads):  # the shortlist, by the searcher's ranking
        if self.ranking == "hamming":
            return self.index.search(codes, k, n_threads=n_threads, **self._projected(X))
        P = self.hasher.project(X)
        return self.index.search_asymmetric(P, k, queries=codes, n_threads=n_threads)

    def neighbors(self, X, *, radius=None, n_bins=None, n_threads=None):
        """Neighbours within an absolute (``radius``) or relative (``n_bins``) Hamming threshold,
        ties kept: ``(lims, D, I)`` (:func:`~hashlearn.index._neighbors.relative_neighbors`)."""
        if not isinstance(self.index, BinaryIndex):
            raise TypeError("Searcher.neighbors needs a Hamming index (BinaryIndex).")
        return relative_neighbors(
            self.index, self._encode(X), radius=radius, n_bins=n_bins, n_threads=n_threads
        )

    def _projected(self, X) -> dict:
        """``{"projections": hasher.project(X)}`` for an index that files and probes by them
        (``IVFIndex(quantizer="k-means")``), else nothing."""
        if getattr(self.index, "uses_projections", False):
            return {"projections": self.hasher.project(X)}
        return {}

    def _encode(self, X):
        return self.hasher.encode(X) if isinstance(self.hasher, BaseHasher) else self.hasher.keys(X)

    # -------------------------------------------------------------------------- persistence

    def save(self, path: str | os.PathLike) -> None:
        """Save to the directory ``path`` atomically, without pickle: ``meta.json``, the
        vectors (:meth:`VectorStore.arrays <hashlearn.rerank.store.VectorStore.arrays>`), the
        hasher and the index in sub-directories (:func:`hashlearn.io.write_composite`). A
        callable ``rerank`` cannot be saved (``TypeError``)."""
        params = {**Refiner.params(self.rerank, self.screen), "n_candidates": self.n_candidates}
        params["ranking"] = self.ranking
        token = secrets.token_hex(8)
        hasher_dir, index_dir = f"hasher-{token}", f"index-{token}"
        with self._seq.lock:  # one state of the index and its vectors
            store = VectorStore() if self.refiner is None else self.refiner.store
            state, arrays = store.arrays()
            _io.write_composite(
                Path(path),
                {hasher_dir: self.hasher, index_dir: self.index},
                lambda name: _COMPONENT.fullmatch(name) or _COMPONENT_TMP.fullmatch(name),
                "Searcher",
                params,
                {
                    "hasher_dir": hasher_dir,
                    "index_dir": index_dir,
                    "row_terms": self._row_terms or "none",
                    **state,
                },
                arrays,
            )

    @classmethod
    def load(cls, path: str | os.PathLike, *, mmap=True, verify=True, **index_kwargs) -> Searcher:
        """Load what :meth:`save` wrote, memory-mapped read-only by default (``mmap="direct"``:
        a search reads only the rows it rescores, :mod:`hashlearn.rerank.rowfile`, for vector
        files larger than RAM); ``verify`` checks every sha256. A save replaced meanwhile is
        read again (up to 5 times). Another class's save is a ``TypeError``, an inconsistent
        one a ``ValueError``. ``index_kwargs`` go to the index's load (``client=`` for a
        sharded index)."""
        path = Path(path)
        for attempt in range(5):  # a save another process replaced meanwhile: read again
            try:
                meta, arrays = _io.read_dir(path, mmap=mmap, verify=verify)
                if meta["class"] != "Searcher":
                    raise TypeError(f"{path} holds a {meta['class']}, not a Searcher.")
                names = [
                    _io.require_state(meta["state"], n, str) for n in ("hasher_dir", "index_dir")
                ]
                if not all(_COMPONENT.fullmatch(name) for name in names):
                    raise ValueError(f"{path}: the saved Searcher is inconsistent: dirs {names}")
                hasher = _io.load(path / names[0], mmap=mmap, verify=verify)
                index = _io.load(path / names[1], mmap=mmap, verify=verify, **index_kwargs)
                break
            except (ValueError, FileNotFoundError):
                if attempt == 4 or not path.is_dir():
                    raise
        try:
            rerank, screen = Refiner.saved_params(meta["params"])
            ranking = meta["params"].get("ranking", "hamming")  # saves before it: Hamming
            obj = cls(hasher, index, rerank, meta["params"].get("n_candidates"), screen, ranking)
            terms = meta["state"].get("row_terms", "none")  # saves before it: none
            if terms not in ("none", *_ROW_TERMS.values()):
                raise ValueError(f"unknown row_terms {terms!r}")
            obj._row_terms = None if terms == "none" else terms
            if obj.refiner is not None:
                obj.refiner.store.restore(meta["state"], arrays, direct=mmap == "direct")
            elif _io.require_state(meta["state"], "vectors", str) != "none":
                raise ValueError("vectors saved for a Searcher without re-ranking")
            obj._attached = obj._sharded  # a sharded index saves its shards' refiners
            return obj
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: the saved Searcher is inconsistent: {exc}") from None


#: the per-row terms (:func:`row_terms`) that a re-ranking's geometry asks of the shortlist
_ROW_TERMS = {
    "inner_product": "inner_product",
    "euclidean": "euclidean",
    "sqeuclidean": "euclidean",
}
#: the dropped cross term ``<q_perp, x_perp>`` of a row near the query, as a share of the
#: row's dropped energy ``|x_perp|^2`` (:func:`row_terms`). Measured, true 10-NN in a
#: fixed shortlist of the residual lists with every list probed, for shares 1/2, 3/8, 1/4,
#: 1/8, 0 (0: the geometry's own term; 1/2: the projection space's ``-|p|^2 / 2``):
#: digits ITQ-16 0.921 / 0.926 / 0.926 / 0.923 / 0.919, Fashion-MNIST ITQ-32 0.858 / 0.895 /
#: 0.897 / 0.881 / 0.858, ITQ-64 0.940 / 0.954 / 0.958 / 0.955 / 0.945, ITQ-128 0.978 / 0.981 /
#: 0.983 / 0.984 / 0.982; 1M vectors drawn like MiniLM embeddings, ITQ-256, 100 of 400:
#: 0.954 (1/2), 0.973 (1/4), 0.974 (0). A quarter is best or within 0.001 of it everywhere.
DROPPED_OVERLAP = 0.25
_TERM_ROWS = 65536  # rows of X widened to float64 at a time


def orthonormal_form(hasher) -> tuple[np.ndarray, np.ndarray] | None:
    """``(W, m)`` float64 of a fitted linear hasher whose scores are ``W (x - m)`` with
    orthonormal rows of ``W`` (ITQ, PCA hashing, orthogonal LSH; ``m = mean - W^T shift``),
    or None (no linear form, or rows not orthonormal)."""
    form = hasher._linear_form() if isinstance(hasher, BaseHasher) else None
    if form is None:
        return None
    W = np.asarray(form.weights, np.float64)
    if not np.allclose(W @ W.T, np.eye(len(W)), rtol=0, atol=1e-6):
        return None
    m = np.zeros(W.shape[1]) if form.mean is None else np.asarray(form.mean, np.float64)
    if form.shift is not None:
        m = m - W.T @ np.asarray(form.shift, np.float64)
    return W, m


def row_terms(hasher, X, geometry: str) -> np.ndarray | None:
    """What a linear hasher's projection drops from each row of ``X``, as the per-row term of
    a residual index's score (:class:`~hashlearn.index.ResidualIVFIndex`), or None.

    For a hasher whose scores are ``p = W (x - m)`` with orthonormal rows of ``W`` (ITQ, PCA
    hashing, orthogonal LSH; ``m = mean - W^T shift``), ``x - m = W^T p + x_perp``, so
    ``<q, x> = <p_q, p> + <x, m> + <q_perp, x_perp> + c(q)`` and ``-|q - x|^2 / 2 = <p_q, p>
    - |x - m|^2 / 2 + <q_perp, x_perp> + c(q)``. The index cannot see ``q_perp``; near the
    query it overlaps ``x_perp``, so the cross term is estimated as ``DROPPED_OVERLAP
    |x_perp|^2`` and the score ranks by ``<p_q, p> + t_x`` with ``t_x = <x, m> + |x_perp|^2 /
    4`` (``geometry="inner_product"``) or ``-|x - m|^2 / 2 + |x_perp|^2 / 4``
    (``"euclidean"``). The index's own ``-|p|^2 / 2`` is the share 1/2, the projection
    space's Euclidean distance, which over-ranks rows with much outside the projection: on
    1M vectors drawn like MiniLM embeddings through ITQ-256 the true top 10 in a query's 100
    best estimates went from 0.954 to 0.973 (``docs/results.md``), on Fashion-MNIST through
    ITQ-32 from 0.858 to 0.897 (``DROPPED_OVERLAP``). None for other hashers (rows not
    orthonormal, or no linear form: sign bits, which drop nothing at full width) and for
    sparse ``X``."""
    if sp.issparse(X) or not isinstance(X, np.ndarray):
        return None
    form = orthonormal_form(hasher)
    if form is None:
        return None
    W, m = form
    out = np.empty(len(X))
    for start in range(0, len(X), _TERM_ROWS):
        centred = np.asarray(X[start : start + _TERM_ROWS], np.float64) - m
        sq = (centred * centred).sum(1)
        dropped = np.maximum(sq - ((centred @ W.T) ** 2).sum(1), 0.0)
        if geometry == "inner_product":
            own = centred @ m + m @ m  # <x, m>
        else:
            own = -0.5 * sq
        out[start : start + len(centred)] = own + DROPPED_OVERLAP * dropped
    return out


def _code_bits(hasher):  # fitted ``n_bits_`` (may be clipped), or ``n_bits``; None: a bucketer
    return getattr(hasher, "n_bits_", getattr(hasher, "n_bits", None))


def _is_bucketer(obj) -> bool:
    """Bucketers (search forests, k-means trees, LSH tables) give integer keys, not codes."""
    return callable(getattr(obj, "keys", None)) and callable(getattr(obj, "fit", None))


def _is_candidate_index(obj) -> bool:
    return callable(getattr(obj, "candidates", None)) and callable(getattr(obj, "add", None))

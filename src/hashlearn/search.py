"""Searcher: a hasher, an index and an optional re-ranking stage wired together.

The common pipeline of all five papers::

    fit the hasher on a sample ─ encode + add the database ─ search the query codes
    ─ re-rank the top candidates by the exact (or learned) distance on the original vectors

Each stage stays usable alone; ``Searcher`` only saves the bookkeeping (keeping the original
vectors by id for re-ranking, choosing how many candidates to re-rank).

The built-in exact re-rankers (``"sqeuclidean"``, ``"euclidean"``, ``"inner_product"``,
``"cosine"``) run as one batched numba kernel over all (query, candidate) pairs on the shared
thread pool, keeping each query's top k as it scores (no candidate distance matrix, no
sort); for scipy.sparse input the vectors are kept as CSR and each query is scattered once so
a pair costs O(nnz(q) + nnz(x)), so no dense copy of the database is ever made. By default
(``screen=True``) a compact copy of the vectors bounds every candidate's distance first and
only the candidates that can still be among the k nearest are scored in full precision
(certified bounds: the same results). The learned metric of
:class:`~hashlearn.hashers.MetricLSH`, ``d_A(x, q) =
(x - q)^T A (x - q)`` with ``A = G^T G`` (Jain, Kulis & Grauman, "Fast Image Search for
Learned Metrics", CVPR 2008, eq. 6's explicit form), is the squared Euclidean distance of
``G x`` and ``G q``: the kept vectors are mapped by ``G`` once (derived state, recomputed
after a load, never saved) and re-ranked by the same kernel. The implicit learned metric of
:class:`~hashlearn.hashers.KernelMetricLSH` over CSR vectors (eq. 8's kernelised form,
``|z|^2 + t^T M t`` with ``z = x - q``, ``t = Phi z`` over the c constrained points) runs in
the CSR kernel: ``M = U diag(w) U^T`` once, each vector's ``U^T Phi x`` kept as c side
features, so a pair costs O(nnz + c) instead of O(nnz + c^2). Other learned metrics and
callables are scored in blocks of queries, one call per block. A ``Searcher`` saves to a directory (:meth:`Searcher.save`): the
hasher and the index each in their own save format, the re-rank vectors as ``.npy`` arrays
(CSR arrays for sparse vectors) that :meth:`Searcher.load` can memory-map. No pickle.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_array, check_is_fitted

from hashlearn import io as _io
from hashlearn._utils.kernel_args import frozen
from hashlearn._utils.parallel import parallel_chunks
from hashlearn._utils.validation import check_int
from hashlearn.hashers.base import BaseHasher
from hashlearn.hashers.metric_lsh import KernelMetricLSH, MetricLSH
from hashlearn.index.base import BinaryIndex, make_index
from hashlearn.rerank._csr_kernels import (
    SKETCH_PAIRS,
    csr_distance_kernel,
    csr_scratch,
    csr_sketch_kernel,
    row_sqnorms,
)
from hashlearn.rerank._kernels import (
    COSINE,
    EUCLIDEAN,
    NEG_INNER,
    SQEUCLIDEAN,
    queries_per_call,
    rescore_runner,
)
from hashlearn.rerank._quantized import Quantized, quantize
from hashlearn.rerank._sketch import build_sketch, sketch_rows

__all__ = ["Searcher", "register_reranker", "available_rerankers"]

Reranker = Callable[[np.ndarray, np.ndarray], np.ndarray]
_RERANKERS: dict[str, Reranker] = {}


def register_reranker(name: str):
    """Decorator: ``fn(queries (b, d), candidates (b, c, d)) -> distances (b, c)``, smaller is
    nearer; usable as ``Searcher(..., rerank=name)``."""

    def decorate(fn: Reranker) -> Reranker:
        _RERANKERS[name] = fn
        return fn

    return decorate


def available_rerankers() -> list[str]:
    """Names accepted by ``Searcher(rerank=...)`` besides a callable."""
    return sorted(_RERANKERS)


@register_reranker("sqeuclidean")
def _sqeuclidean(queries: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    diff = candidates - queries[:, None, :]
    return np.einsum("bcd,bcd->bc", diff, diff)


@register_reranker("euclidean")
def _euclidean(queries: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    return np.sqrt(np.maximum(_sqeuclidean(queries, candidates), 0.0))


@register_reranker("inner_product")
def _negative_inner_product(queries: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    return -np.einsum("bcd,bd->bc", candidates, queries)


@register_reranker("cosine")
def _cosine(queries: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    qn = np.linalg.norm(queries, axis=1)[:, None]
    cn = np.linalg.norm(candidates, axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        sim = np.einsum("bcd,bd->bc", candidates, queries) / (qn * cn)
    return 1.0 - np.nan_to_num(sim)


# The built-in exact re-rankers run as batched kernels (``rerank._kernels.distance_kernel`` for dense
# vectors, ``rerank._csr_kernels.csr_distance_kernel`` for CSR) that keep each query's top k as they
# score; both screen the candidates first where they can (``Searcher(screen=True)``).
_EXACT_KIND = {
    "sqeuclidean": SQEUCLIDEAN,
    "euclidean": EUCLIDEAN,
    "inner_product": NEG_INNER,
    "cosine": COSINE,
}
_BUILTIN = {
    "sqeuclidean": _sqeuclidean,
    "euclidean": _euclidean,
    "inner_product": _negative_inner_product,
    "cosine": _cosine,
}


#: the largest share of a search's pairs the 8-bit screen may leave for full precision
#: before it is dropped for that set of vectors: one step for all columns fits data whose
#: columns differ widely in range poorly (the 256 leading PCA components of Fashion-MNIST,
#: k = 10 of 100 candidates: 66 per query scored exactly, 0.78x the unscreened speed; raw
#: pixels: 10 per query, 1.3x; 2026-11-27, this repository's 2-core AMD EPYC)
_SCREEN_MAX_EXACT = 0.25
#: the same for the sketch screen of CSR vectors, whose first pass is cheaper relative to an
#: exact pair (Fashion-MNIST bag of patches, 100 candidates: about 0.03 us per candidate for
#: the sketch against 0.3-0.5 us per pair scored exactly; 14 % of the pairs scored there)
_SKETCH_MAX_EXACT = 0.6


def _code_bits(hasher) -> int | None:
    """Bits per code of ``hasher``: its fitted ``n_bits_`` (which may be clipped) or ``n_bits``."""
    return getattr(hasher, "n_bits_", getattr(hasher, "n_bits", None))


class Searcher:
    """Hasher + index (+ exact re-ranking) in one object.

    Parameters
    ----------
    hasher : BaseHasher or bucketer
        Any hashlearn hasher (fitted or not), or a bucketer with ``keys(X)`` (a search forest,
        k-means trees, LSH tables) paired with a candidate index such as ``TableIndex``.
    index : BinaryIndex or str, default="flat"
        An index over ``hasher.n_bits``-bit codes, or a registry name for
        :func:`hashlearn.index.make_index`.
    rerank : None, str or callable
        ``None`` returns Hamming distances. ``"metric"`` re-ranks by the hasher's learned
        metric (its ``metric_distances(queries, candidates)``, e.g. ITML's Mahalanobis
        distance; for a ``MetricLSH``, the squared Euclidean distance of the vectors mapped
        by ``G_``, computed in the batched kernel; for a ``KernelMetricLSH`` over sparse
        vectors, the CSR kernel with side features; for scipy.sparse vectors otherwise, its
        ``metric_distances_from_differences(Z)``
        over the CSR differences of the pairs when it has one, so nothing is densified --
        otherwise only each block's candidate rows are). A name from :func:`available_rerankers`
        (``"euclidean"``, ``"sqeuclidean"``, ``"cosine"``, ``"inner_product"`` -- reported as
        its negative, so smaller is nearer) or ``fn(queries (b, d), candidates (b, c, d))``
        re-ranks the Hamming candidates by that distance on the original vectors, which the
        searcher then keeps.
    n_candidates : int, optional
        Candidates re-ranked per query: for a Hamming index the nearest ``n_candidates``
        (default ``max(10 * k, 100)``); for an index with ``candidates(...)`` (tables,
        sorted permutations) the first ``n_candidates`` of each list (default: all).
    screen : bool, default=True
        With a built-in exact metric (or MetricLSH's learned one), keep a compact copy of
        the vectors (built at the first search, never saved) and screen the candidates with
        it: pass 1 bounds every candidate's distance from the copy, and only those that can
        still be among the k nearest are scored in full precision. Dense vectors get an
        8-bit copy (``d`` bytes each, a quarter of float32; :mod:`hashlearn.rerank._quantized`),
        CSR vectors a bucket-norm sketch (12-bit codes, about 8 bytes per non-zero of a
        row; :mod:`hashlearn.rerank._sketch`). The results are those of the exact re-ranking (the
        bounds are certified; where they fix a float32 distance and its rank, that pair's
        full-precision score is skipped); a copy that spares too few exact scores is
        dropped until the vectors change; ``False`` saves the memory.

    Examples
    --------
    >>> from hashlearn import Searcher, RandomHyperplaneLSH, load_digits
    >>> X, y = load_digits()
    >>> s = Searcher(RandomHyperplaneLSH(32, random_state=0), rerank="euclidean")
    >>> D, I = s.fit(X).add(X).search(X[:2], k=3)
    >>> I[:, 0].tolist()
    [0, 1]

    Save it (a directory; no pickle) and load it back with the vectors memory-mapped:

    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     s.save(os.path.join(tmp, "searcher"))
    ...     loaded = Searcher.load(os.path.join(tmp, "searcher"), mmap=True)
    ...     D2, I2 = loaded.search(X[:2], k=3)
    >>> bool((I2 == I).all())
    True
    """

    def __init__(
        self,
        hasher: BaseHasher,
        index: BinaryIndex | str = "flat",
        rerank: str | Reranker | None = None,
        n_candidates: int | None = None,
        screen: bool = True,
    ):
        if not (isinstance(hasher, BaseHasher) or _is_bucketer(hasher)):
            raise TypeError(
                f"hasher must be a hashlearn hasher (encode) or bucketer (keys). "
                f"Got {type(hasher).__name__}."
            )
        self._index_name = index if isinstance(index, str) else None
        if isinstance(index, str):
            if not hasattr(hasher, "n_bits"):
                raise TypeError(
                    "a bucketer needs an index object such as TableIndex, not a registry name."
                )
            index = make_index(index, n_bits=_code_bits(hasher))
        if not (isinstance(index, BinaryIndex) or _is_candidate_index(index)):
            raise TypeError(
                f"index must be a hashlearn index or a registry name. Got {type(index).__name__}."
            )
        if isinstance(index, BinaryIndex) and index.n_bits != _code_bits(hasher):
            raise ValueError(
                f"index holds {index.n_bits}-bit codes but the hasher makes "
                f"{_code_bits(hasher) or 'no'}-bit codes."
            )
        if rerank == "metric":
            if not callable(getattr(hasher, "metric_distances", None)):
                raise ValueError(
                    f"rerank='metric' needs a hasher with a learned metric "
                    f"(metric_distances); {type(hasher).__name__} has none."
                )
        elif isinstance(rerank, str) and rerank not in _RERANKERS:
            raise ValueError(
                f"Unknown rerank {rerank!r}; available: {available_rerankers()} or a callable."
            )
        if rerank is not None and not isinstance(rerank, str) and not callable(rerank):
            raise TypeError("rerank must be None, a name or a callable.")
        if rerank is None and not isinstance(index, BinaryIndex):
            raise ValueError(
                f"{type(index).__name__} returns candidates without distances; "
                "pass rerank=... to rank them."
            )
        if n_candidates is not None:
            check_int(n_candidates, "n_candidates", "Searcher")
        if not isinstance(screen, (bool, np.bool_)):
            raise TypeError(f"screen must be True or False, got {screen!r}")
        self.hasher = hasher
        self.index = index
        self.rerank = rerank
        self.n_candidates = n_candidates
        self.screen = bool(screen)
        self._vectors: np.ndarray | None = None  # rows in the order of _vector_ids
        self._vector_ids = np.zeros(0, np.int64)
        self._position_table: tuple | None = None  # (vector ids, id -> row table)
        self._metric_cache: tuple | None = None  # (vectors, G_ or S_, vectors mapped by it)
        self._csr_cache: tuple | None = None  # (CSR vectors, their kernel arrays)
        self._implicit_cache: tuple | None = None  # (S_, (Phi, U, w)) of KernelMetricLSH
        self._screen_cache: tuple | None = None  # (re-rank vectors, their screen or None)

    def fit(self, X, y=None, **fit_params) -> Searcher:
        """Fit the hasher (on a training sample); does not add anything to the index.

        A hasher may make fewer bits than asked for (e.g. PCA hashing clips ``n_bits`` to the
        number of features, with a warning); an empty index made from a registry name is then
        re-made for the fitted code length, any other index mismatch is an error.
        """
        self.hasher.fit(X, y, **fit_params)
        bits = _code_bits(self.hasher)
        if isinstance(self.index, BinaryIndex) and self.index.n_bits != bits:
            if self._index_name is None or len(self.index):
                raise ValueError(
                    f"the fitted hasher makes {bits}-bit codes but the index holds "
                    f"{self.index.n_bits}-bit codes; build the index with n_bits={bits}."
                )
            self.index = make_index(self._index_name, n_bits=bits)
        return self

    def add(self, X, ids=None) -> Searcher:
        """Encode the rows of ``X`` and add them to the index (keeping them if re-ranking).

        With re-ranking, dense input is kept as a dense array and scipy.sparse input as a CSR
        matrix (the kind of the first batch is kept; later batches are converted to it).
        """
        if isinstance(self.hasher, BaseEstimator):
            check_is_fitted(self.hasher)
        vectors = self._as_vectors(X, "X") if self.rerank is not None else None
        new_ids = np.asarray(self.index.add(self._encode(X), ids))
        if vectors is not None:
            all_ids = np.concatenate([self._vector_ids, new_ids.astype(np.int64)])
            if self._vectors is None:
                all_vecs = vectors
            elif sp.issparse(vectors):
                all_vecs = sp.vstack([self._vectors, vectors], format="csr")
            else:
                all_vecs = np.concatenate([self._vectors, vectors])
            order = np.argsort(all_ids, kind="stable")
            self._vector_ids, self._vectors = all_ids[order], all_vecs[order]
            if sp.issparse(self._vectors):
                self._vectors = _canonical_csr(self._vectors)
        return self

    def remove(self, ids) -> int:
        """Remove ids from the index (and the kept vectors); returns the number removed."""
        removed = self.index.remove(ids)
        if self._vectors is not None:
            keep = np.flatnonzero(~np.isin(self._vector_ids, ids))
            self._vector_ids, self._vectors = self._vector_ids[keep], self._vectors[keep]
        return removed

    def search(self, X, k: int, *, n_threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest database items of each row of ``X``: ``(D, I)``.

        Without re-ranking ``D`` holds int32 Hamming distances; with it, float32 distances
        of the re-ranking metric. Padded with ``-1`` ids (and ``-1`` / ``inf`` distances).
        ``n_threads=None`` uses :func:`hashlearn.get_num_threads`.
        """
        k = check_int(k, "k", "Searcher.search")
        codes = self._encode(X)
        if self.rerank is None:
            return self.index.search(codes, k, n_threads=n_threads)
        if callable(getattr(self.index, "candidates", None)):
            cand = _pad_candidates(self.index.candidates(codes), self.n_candidates)
        else:
            n_cand = max(k, self.n_candidates or max(10 * k, 100))
            _, cand = self.index.search(codes, n_cand, n_threads=n_threads)
        return self._rerank(X, cand, k, n_threads)

    # -------------------------------------------------------------------------- persistence

    def save(self, path: str | os.PathLike) -> None:
        """Save to the directory ``path``, atomically and without pickle.

        Layout: ``meta.json`` and the re-rank vectors as ``.npy`` arrays (``vector_ids``,
        and ``vectors`` or the CSR arrays ``vectors_data`` / ``vectors_indices`` /
        ``vectors_indptr``) written by :func:`hashlearn.io.write_dir`, plus the hasher and
        the index each saved by :func:`hashlearn.io.save` into a sub-directory named in
        ``meta.json``. Over an existing save the new sub-directories are written first, then
        ``meta.json`` is replaced atomically, then the old ones are deleted: a crash at any
        point leaves the old or the new searcher loadable. A callable ``rerank`` cannot be
        saved (``TypeError``); a registered name is saved by name.
        """
        if self.rerank is not None and not isinstance(self.rerank, str):
            raise TypeError(
                "cannot save a Searcher whose rerank is a callable; register it with "
                "hashlearn.search.register_reranker(name) and pass rerank=name instead."
            )
        path = Path(path)
        token = secrets.token_hex(8)
        hasher_dir, index_dir = f"hasher-{token}", f"index-{token}"
        params = {"rerank": self.rerank, "n_candidates": self.n_candidates, "screen": self.screen}
        state: dict = {"hasher_dir": hasher_dir, "index_dir": index_dir, "vectors": "none"}
        arrays: dict[str, np.ndarray] = {"vector_ids": np.asarray(self._vector_ids, np.int64)}
        if sp.issparse(self._vectors):
            csr = _canonical_csr(self._vectors)
            state["vectors"] = "csr"
            state["n_features"] = int(csr.shape[1])
            arrays["vectors_data"] = csr.data
            arrays["vectors_indices"] = csr.indices.astype(np.int64, copy=False)
            arrays["vectors_indptr"] = csr.indptr.astype(np.int64, copy=False)
        elif self._vectors is not None:
            state["vectors"] = "dense"
            arrays["vectors"] = np.ascontiguousarray(self._vectors)
        _io.write_composite(
            path,
            {hasher_dir: self.hasher, index_dir: self.index},
            lambda name: _COMPONENT.fullmatch(name) or _COMPONENT_TMP.fullmatch(name),
            "Searcher",
            params,
            state,
            arrays,
        )

    @classmethod
    def load(cls, path: str | os.PathLike, *, mmap: bool = False, verify: bool = True) -> Searcher:
        """Load what :meth:`save` wrote. ``mmap=True`` memory-maps the re-rank vectors (and
        the component arrays) read-only; ``verify`` checks every array's sha256. A save
        replaced by another process while loading is read again (up to 5 times)."""
        path = Path(path)
        for attempt in range(5):
            meta, arrays = _io.read_dir(path, mmap=mmap, verify=verify)
            if meta["class"] != "Searcher":
                raise TypeError(f"{path} holds a {meta['class']}, not a Searcher.")
            try:
                hasher_dir, index_dir = (
                    _io.require_state(meta["state"], name, str)
                    for name in ("hasher_dir", "index_dir")
                )
                for name in (hasher_dir, index_dir):
                    if not _COMPONENT.fullmatch(name):
                        raise ValueError(f"invalid component directory name {name!r}")
            except ValueError as exc:
                raise ValueError(f"{path}: the saved Searcher is inconsistent: {exc}") from None
            try:
                hasher = _io.load(path / hasher_dir, mmap=mmap, verify=verify)
                index = _io.load(path / index_dir, mmap=mmap, verify=verify)
                break
            except FileNotFoundError:
                if attempt == 4 or _io.read_dir(path, mmap=True, verify=False)[0] == meta:
                    raise
        try:
            return cls._from_parts(meta["params"], meta["state"], arrays, hasher, index)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: the saved Searcher is inconsistent: {exc}") from None

    @classmethod
    def _from_parts(cls, params, state, arrays, hasher, index) -> Searcher:
        rerank = params.get("rerank")
        if rerank is not None and not isinstance(rerank, str):
            raise ValueError(f"params entry 'rerank' must be a name or null, got {rerank!r}")
        n_candidates = params.get("n_candidates")
        screen = params.get("screen", True)  # saves before the screen existed: the default
        if not isinstance(screen, bool):
            raise ValueError(f"params entry 'screen' must be true or false, got {screen!r}")
        obj = cls(hasher, index, rerank=rerank, n_candidates=n_candidates, screen=screen)
        ids = _io.require_array(arrays, "vector_ids", np.int64, 1)
        if ids.size and np.any(ids[1:] <= ids[:-1]):
            raise ValueError("array 'vector_ids' must be strictly increasing")
        kind = _io.require_state(state, "vectors", str)
        n = len(ids)
        if kind == "dense":
            vectors = _io.require_array(arrays, "vectors", arrays["vectors"].dtype, 2, (n, None))
            if vectors.dtype not in (np.float32, np.float64):
                raise ValueError(f"array 'vectors' has dtype {vectors.dtype}, expected a float")
        elif kind == "csr":
            d = _io.require_state(state, "n_features", int, low=0)
            data = arrays.get("vectors_data")
            if data is None or data.dtype not in (np.float32, np.float64):
                raise ValueError("array 'vectors_data' is missing or not float32/float64")
            data = _io.require_array(arrays, "vectors_data", data.dtype, 1)
            indptr = _io.require_array(arrays, "vectors_indptr", np.int64, 1, (n + 1,))
            indices = _io.require_array(
                arrays, "vectors_indices", np.int64, 1, (len(data),), low=0, high=max(d, 1)
            )
            if indptr[0] != 0 or indptr[-1] != len(data) or np.any(np.diff(indptr) < 0):
                raise ValueError("array 'vectors_indptr' is not a valid CSR row pointer")
            vectors = sp.csr_matrix((data, indices, indptr), shape=(n, d), copy=False)
            if not vectors.has_canonical_format:
                raise ValueError("the CSR vectors are not in canonical (sorted) form")
        elif kind == "none":
            if n:
                raise ValueError(f"{n} vector ids saved without vectors")
            vectors = None
        else:
            raise ValueError(f"state entry 'vectors' must be dense, csr or none, got {kind!r}")
        if rerank is None and vectors is not None:
            raise ValueError("vectors saved for a Searcher without re-ranking")
        obj._vector_ids, obj._vectors = ids, vectors
        return obj

    def neighbors(
        self,
        X,
        *,
        radius: int | None = None,
        n_bins: int | None = None,
        n_threads: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Neighbours by an absolute or relative Hamming threshold, ties kept: ``(lims, D, I)``.

        the LambdaRank bit-vector paper (WWW), Sec. 3.5.2. ``radius``: every item at Hamming distance
        ``<= radius``. ``n_bins``: every item in the query's ``n_bins`` nearest non-empty
        distance bins (for k-NN classification with a relative threshold). Exactly one.
        CSR form as ``range_search`` (sorted by (distance, id)); needs a Hamming index, and
        ignores re-ranking. Relative thresholds are found by growing ``search`` until a
        result lies beyond the ``n_bins``-th bin, then one ``range_search`` per threshold.
        """
        if not isinstance(self.index, BinaryIndex):
            raise TypeError("Searcher.neighbors needs a Hamming index (BinaryIndex).")
        if (radius is None) == (n_bins is None):
            raise ValueError(
                "Searcher.neighbors takes exactly one of 'radius' (absolute "
                f"threshold) and 'n_bins' (relative threshold). Got "
                f"radius={radius!r}, n_bins={n_bins!r}."
            )
        codes = self._encode(X)
        if radius is not None:
            return self.index.range_search(codes, radius, n_threads=n_threads)
        n_bins = check_int(n_bins, "n_bins", "Searcher.neighbors")
        m, n = codes.shape[0], len(self.index)
        threshold = np.full(m, -1, np.int64)
        todo = np.arange(m)
        k = min(max(4 * n_bins, 64), max(n, 1))
        while todo.size and n:
            D, _ = self.index.search(codes[todo], k, n_threads=n_threads)
            s = np.where(D >= 0, D, np.iinfo(np.int32).max)
            new_bin = np.ones(s.shape, bool)
            new_bin[:, 1:] = s[:, 1:] != s[:, :-1]
            rank = np.cumsum(new_bin & (D >= 0), axis=1)
            bin_d = np.where((rank <= n_bins) & (D >= 0), D, -1).max(axis=1)
            complete = (rank[:, -1] > n_bins) | (D[:, -1] < 0) | (k >= n)
            threshold[todo[complete]] = bin_d[complete]
            todo = todo[~complete]
            k = min(2 * k, n)
        parts = {}
        for t in np.unique(threshold[threshold >= 0]):
            rows = np.flatnonzero(threshold == t)
            parts[int(t)] = (
                rows,
                self.index.range_search(codes[rows], int(t), n_threads=n_threads),
            )
        counts = np.zeros(m, np.int64)
        for rows, (lims, _, _) in parts.values():
            counts[rows] = np.diff(lims)
        out_lims = np.zeros(m + 1, np.int64)
        np.cumsum(counts, out=out_lims[1:])
        out_d = np.empty(out_lims[-1], np.int32)
        out_i = np.empty(out_lims[-1], np.int64)
        for rows, (lims, D, ids) in parts.values():
            for j, row in enumerate(rows):
                dst = slice(out_lims[row], out_lims[row + 1])
                out_d[dst], out_i[dst] = D[lims[j] : lims[j + 1]], ids[lims[j] : lims[j + 1]]
        return out_lims, out_d, out_i

    def _encode(self, X):
        return self.hasher.encode(X) if isinstance(self.hasher, BaseHasher) else self.hasher.keys(X)

    def _vector_positions(self, ids: np.ndarray) -> np.ndarray:
        """Rows of the kept vectors for candidate ids (-1 stays -1); unknown ids raise.

        Ids spanning at most ``4 n + 1024`` values (the usual ``0..n-1`` included) are looked
        up in a table built once per set of ids; others by binary search."""
        table = self._id_table()
        if table is not None and len(table) == len(self._vector_ids) + 1 and ids.size:
            # ids 0..n-1 in order (the usual case): an id is its row
            if ids.min() >= -1 and ids.max() < len(self._vector_ids):
                return ids
        if table is not None:
            span = len(table) - 1  # table[span] = -1 answers padding and unknown ids
            pos = table[np.where(ids >= 0, np.minimum(ids, span), span)]
            found = pos >= 0
        else:
            pos = np.searchsorted(self._vector_ids, ids)
            found = np.zeros(ids.shape, bool)
            inside = pos < len(self._vector_ids)
            found[inside] = self._vector_ids[pos[inside]] == ids[inside]
        unknown = (ids >= 0) & ~found
        if unknown.any():
            raise ValueError(
                f"the index holds ids without vectors to re-rank by, e.g. "
                f"{ids[unknown][:5].tolist()}; add the database through Searcher.add (or use "
                "rerank=None)."
            )
        return np.where(found, pos, -1)

    def _id_table(self) -> np.ndarray | None:
        """``table[id]`` = row of the kept vectors (-1 for none), when the ids are dense."""
        ids = self._vector_ids
        cached = self._position_table
        if cached is not None and cached[0] is ids:
            return cached[1]
        table = None
        if len(ids) and ids[0] >= 0 and ids[-1] < 4 * len(ids) + 1024:
            table = np.full(int(ids[-1]) + 2, -1, np.int64)
            table[ids] = np.arange(len(ids))
        self._position_table = (ids, table)
        return table

    def _as_vectors(self, X, name: str):
        """``X`` as kept re-rank vectors: CSR (canonical) when the store is sparse -- or is
        empty and ``X`` is sparse --, else a dense float array."""
        sparse = sp.issparse(self._vectors) or (self._vectors is None and sp.issparse(X))
        if sparse:
            X = check_array(
                X, accept_sparse="csr", dtype=(np.float64, np.float32), ensure_min_samples=0
            )
            return _canonical_csr(sp.csr_matrix(X))
        return _dense(X)

    def _exact_kind(self) -> int | None:
        name = self.rerank
        if isinstance(name, str) and name in _BUILTIN and _RERANKERS.get(name) is _BUILTIN[name]:
            return _EXACT_KIND[name]
        return None

    def _metric_factor(self) -> np.ndarray | None:
        """``G_`` when the hasher's learned metric is ``|G_ (x - q)|^2`` (MetricLSH's), else
        None."""
        h = type(self.hasher)
        if (
            self.rerank != "metric"
            or getattr(h, "metric_distances", None) is not MetricLSH.metric_distances
            or getattr(h, "metric_distances_from_differences", None)
            is not MetricLSH.metric_distances_from_differences
        ):
            return None
        G = getattr(self.hasher, "G_", None)
        if not isinstance(G, np.ndarray) or G.ndim != 2 or G.dtype != np.float64:
            return None
        return G

    def _metric_vectors(self, G: np.ndarray) -> np.ndarray:
        """The kept vectors mapped by ``x -> G x`` (dense float64), computed once per set of
        vectors and factor (recomputed after a load, never saved)."""
        V = self._vectors
        cached = self._metric_cache
        if cached is not None and cached[0] is V and cached[1] is G:
            return cached[2]
        if G.shape[1] != V.shape[1]:
            raise ValueError(
                f"the hasher's metric factor G_ takes {G.shape[1]} features but the database "
                f"vectors have {V.shape[1]}."
            )
        mapped = _mapped(V, G)
        self._metric_cache = (V, G, mapped)
        return mapped

    def _csr_arrays(self, V: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``V``'s data, column indices (int32 below 2^31 columns, else int64) and int64 row
        pointers, converted once per set of vectors (not on every search); every CSR kernel
        reads these."""
        cached = self._csr_cache
        if cached is None or cached[0] is not V:
            narrow = np.int32 if V.shape[1] < 2**31 else np.int64
            arrays = (
                np.asarray(V.data),
                np.asarray(V.indices, narrow),
                np.asarray(V.indptr, np.int64),
            )
            cached = self._csr_cache = (V, arrays)
        return cached[1]

    def _implicit_metric(self):
        """For a ``KernelMetricLSH`` over CSR vectors: ``(Phi, U, w)`` with its learned
        distance ``|z|^2 + t^T M t`` (``z = x - q``, ``t = Phi z``) written as ``|z|^2 +
        sum_j w_j (U^T t)_j^2`` (``M = U diag(w) U^T``); else None (also when the side features,
        one float64 per constrained point per vector, would exceed 1 GiB)."""
        h, V = self.hasher, self._vectors
        if (
            self.rerank != "metric"
            or not sp.issparse(V)
            or getattr(type(h), "metric_distances", None) is not KernelMetricLSH.metric_distances
            or getattr(type(h), "metric_distances_from_differences", None)
            is not KernelMetricLSH.metric_distances_from_differences
        ):
            return None
        S = getattr(h, "S_", None)
        cached = self._implicit_cache
        if cached is None or cached[0] is not S:
            try:
                K0, ptr = h.K0_, h.constrained_indptr_
                Phi = sp.csr_matrix(
                    (h.constrained_data_, h.constrained_indices_, ptr),
                    shape=(len(ptr) - 1, V.shape[1]),
                )
                w, U = np.linalg.eigh(S + S.T + S.T @ K0 @ S)
            except (AttributeError, TypeError, ValueError):
                return None
            cached = self._implicit_cache = (S, (Phi, U, w))
        Phi, U, w = cached[1]
        if V.shape[0] * Phi.shape[0] * 8 > 2**30:
            return None
        return Phi, U, w

    def _side_features(self, implicit) -> np.ndarray:
        """``(Phi x) U`` of every kept vector (dense float64), computed once per set of
        vectors and hasher state (recomputed after a load, never saved)."""
        V = self._vectors
        key = self.hasher.S_
        cached = self._metric_cache
        if cached is not None and cached[0] is V and cached[1] is key:
            return cached[2]
        Phi, U, _ = implicit
        features = np.ascontiguousarray((V @ Phi.T).toarray() @ U)
        self._metric_cache = (V, key, features)
        return features

    def _screen_for(self, frozen_vectors: np.ndarray, V: np.ndarray) -> Quantized | None:
        """The 8-bit copy of the dense re-rank vectors ``V`` (``frozen_vectors``: their
        C-ordered view), built once per set of vectors (recomputed after an add, a remove
        or a load; never saved); None with ``screen=False``."""
        if not self.screen:
            return None
        cached = self._screen_cache
        if cached is None or cached[0] is not V:
            cached = self._screen_cache = (V, quantize(frozen_vectors))
        return cached[1]

    def _judge_screen(self, V, scored_exactly: int, pairs: int) -> None:
        """Drop the screen of ``V`` (until its vectors change) once a search had to score
        more than ``_SCREEN_MAX_EXACT`` of its pairs in full precision (``_SKETCH_MAX_EXACT``
        for CSR vectors): the screen then fits the data too poorly to pay for its first pass
        (for the 8-bit copy, one grid step for all columns)."""
        limit = _SKETCH_MAX_EXACT if sp.issparse(V) else _SCREEN_MAX_EXACT
        if pairs and scored_exactly > limit * pairs:
            self._screen_cache = (V, None)

    def _csr_screen_for(self, V: sp.csr_matrix, arrays) -> tuple | None:
        """``(sketch, |x|^2)`` of the CSR re-rank vectors ``V`` (their bucket-norm sketch,
        :func:`~hashlearn.rerank._sketch.build_sketch` of their kernel ``arrays``, and each row's
        squared norm), built once per set of vectors like :meth:`_screen_for`; None with
        ``screen=False`` or once dropped (:meth:`_judge_screen`)."""
        if not self.screen:
            return None
        cached = self._screen_cache
        if cached is None or cached[0] is not V:
            sketch = build_sketch(*arrays, V.shape[1])
            cached = self._screen_cache = (V, (sketch, row_sqnorms(arrays[0], arrays[2])))
        return cached[1]

    def _batched_operands(self, X):
        """``(queries, vectors, kind, side)`` for the batched kernels -- an exact metric on the
        kept vectors (dense or CSR); the learned metric ``|G_ (x - q)|^2`` as the squared
        Euclidean distance of the mapped vectors; the implicit learned metric as CSR squared
        distances plus weighted side features ``side = (queries', vectors', weights)`` -- or
        None for the general path."""
        V = self._vectors
        kind = self._exact_kind()
        if kind is not None:
            sparse = sp.issparse(V)
            Q = _checked_queries(X, sparse, V.shape[1], not sparse and V.dtype == np.float32)
            return Q, V, kind, None
        G = self._metric_factor()
        if G is not None:
            mapped = self._metric_vectors(G)
            Q = _checked_queries(X, sp.issparse(X), G.shape[1])
            return _mapped(Q, G), mapped, SQEUCLIDEAN, None
        implicit = self._implicit_metric()
        if implicit is not None:
            features = self._side_features(implicit)
            Q = _checked_queries(X, True, V.shape[1])
            Phi, U, w = implicit
            side = (np.ascontiguousarray((Q @ Phi.T).toarray() @ U), features, w)
            return Q, V, SQEUCLIDEAN, side
        return None

    def _rerank(
        self, X, cand: np.ndarray, k: int, n_threads: int | None
    ) -> tuple[np.ndarray, np.ndarray]:
        m = cand.shape[0]
        if not len(self._vector_ids):  # empty database: every candidate is padding
            return np.full((m, k), np.inf, np.float32), np.full((m, k), -1, np.int64)
        cand_pos = self._vector_positions(cand)
        operands = self._batched_operands(X)
        if operands is not None:  # one kernel scores every pair and keeps each top k
            Q, V, kind, side = operands
            pos = np.ascontiguousarray(cand_pos, np.int64)
            out_d = np.full((m, k), np.inf, np.float64)
            out_row = np.full((m, k), -1, np.int64)
            chunk = {}  # the thread pool's default chunks of queries
            screen = None
            if sp.issparse(V):
                vectors = self._csr_arrays(V)
                queries = (Q.data, Q.indices.astype(vectors[1].dtype), Q.indptr.astype(np.int64))
                n_cols = V.shape[1]
                if side is None and pos.shape[1] >= 2 * k:
                    screen = self._csr_screen_for(V, vectors)
                if screen is not None:
                    sketch, x_sq = screen
                    x_sketch = (sketch.codes, sketch.err, sketch.code_sq)
                    extra = (sketch_rows(sketch, *queries), x_sketch, x_sq, sketch.step)
                    kernel, scored_exactly = csr_sketch_kernel, []
                    chunk = {"max_chunk": queries_per_call(pos.shape[1], SKETCH_PAIRS)}
                else:
                    kernel = csr_distance_kernel
                    extra = side or (np.zeros((m, 0)), np.zeros((V.shape[0], 0)), np.zeros(0))

                def run(start, stop):
                    scratch = csr_scratch(n_cols, queries[2])
                    args = (queries, vectors, extra, pos, kind, k, out_d, out_row, start, stop)
                    n_exact = kernel(*args, scratch)
                    if screen is not None:
                        scored_exactly.append(n_exact)
            else:
                # read-only C-ordered views (a memmap's buffer as a plain ndarray, no copy):
                # one compiled kernel whatever the arrays' flags
                Qd, Vd, pos_d = frozen(Q, Q.dtype), frozen(V, V.dtype), frozen(pos, np.int64)

                screen = self._screen_for(Vd, V)
                run = rescore_runner(
                    Qd, Vd, pos_d, kind, k, out_d, out_row, screen=screen, float32_results=True
                )
                if screen is not None and pos.shape[1] >= 2 * k:  # the 8-bit screen runs
                    screened, scored_exactly = run, []

                    def run(start, stop):
                        scored_exactly.append(screened(start, stop))

                chunk = {"max_chunk": queries_per_call(pos.shape[1])}

            parallel_chunks(run, m, n_threads, min_chunk=1, **chunk)
            if screen is not None and pos.shape[1] >= 2 * k:
                self._judge_screen(V, sum(scored_exactly), np.count_nonzero(pos >= 0))
            ids = np.where(out_row >= 0, self._vector_ids[np.maximum(out_row, 0)], -1)
            return out_d.astype(np.float32), ids
        return self._rerank_general(X, cand_pos, cand, k)

    def _rerank_general(self, X, cand_pos, cand, k):
        """Re-ranking by a callable or a learned metric without a linear factor, in blocks of
        queries (one call of the distance function per block)."""
        m = cand.shape[0]
        out_d = np.full((m, k), np.inf, np.float32)
        out_i = np.full((m, k), -1, np.int64)
        V = self._vectors
        sparse = sp.issparse(V)
        if self.rerank == "metric":
            fn = self.hasher.metric_distances
            from_differences = getattr(self.hasher, "metric_distances_from_differences", None)
            if sparse and callable(from_differences):
                return self._rerank_sparse_metric(X, cand_pos, cand, k, from_differences)
        else:
            fn = _RERANKERS[self.rerank] if isinstance(self.rerank, str) else self.rerank
        queries = _dense(X)
        d = queries.shape[1]
        block = max(1, 2**22 // max(1, cand.shape[1] * d))
        for start in range(0, m, block):
            stop = min(m, start + block)
            ids, pos = cand[start:stop], cand_pos[start:stop]
            rows = np.maximum(pos, 0)
            # sparse vectors: only this block's candidate rows are densified
            vecs = V[rows.ravel()].toarray().reshape(*rows.shape, -1) if sparse else V[rows]
            dist = np.asarray(fn(queries[start:stop], vecs), dtype=np.float64)
            if dist.shape != ids.shape:
                raise ValueError(f"rerank returned shape {dist.shape}; expected {ids.shape}.")
            _top_k(np.where(ids >= 0, dist, np.inf), ids, k, out_d[start:stop], out_i[start:stop])
        return out_d, out_i

    def _rerank_sparse_metric(self, X, cand_pos, cand, k, from_differences):
        """Learned-metric re-ranking without densifying anything: the differences
        ``x - q`` of every (query, candidate) pair of a block as one CSR matrix (O(nnz)),
        scored by the hasher's ``metric_distances_from_differences(Z) -> (rows,)`` (for the
        implicit learned metric, O(M z + z^2) per pair in Jain, Kulis and Grauman's terms)."""
        V = self._vectors
        Q = _canonical_csr(sp.csr_matrix(check_array(X, accept_sparse="csr", dtype=np.float64)))
        if Q.shape[1] != V.shape[1]:
            raise ValueError(
                f"X has {Q.shape[1]} features but the database vectors have {V.shape[1]}."
            )
        m, c = cand.shape
        out_d = np.full((m, k), np.inf, np.float32)
        out_i = np.full((m, k), -1, np.int64)
        block = max(1, 2**18 // max(1, c))
        for start in range(0, m, block):
            stop = min(m, start + block)
            ids, pos = cand[start:stop], cand_pos[start:stop]
            rows = np.maximum(pos, 0).ravel()
            Z = (V[rows] - Q[np.repeat(np.arange(start, stop), c)]).tocsr()
            dist = np.asarray(from_differences(Z), dtype=np.float64).reshape(ids.shape)
            _top_k(dist, ids, k, out_d[start:stop], out_i[start:stop])
        return out_d, out_i


_COMPONENT = re.compile(r"(hasher|index)-[0-9a-f]{16}")
_COMPONENT_TMP = re.compile(r"\.(hasher|index)-[0-9a-f]{16}\.tmp-.*")


def _top_k(dist: np.ndarray, ids: np.ndarray, k: int, out_d: np.ndarray, out_i: np.ndarray):
    """The ``k`` smallest of each row by (distance, id), padding (id -1) last."""
    dist = np.where(ids >= 0, dist, np.inf)
    sentinel = np.where(ids >= 0, ids, np.iinfo(np.int64).max)
    order = np.lexsort((sentinel, dist), axis=-1)[:, :k]
    rows = np.arange(len(ids))[:, None]
    width = order.shape[1]
    out_d[:, :width] = dist[rows, order]
    out_i[:, :width] = ids[rows, order]


def _checked_queries(X, sparse: bool, n_features: int, keep_float32: bool = False):
    """Queries for the batched kernels: canonical float64 CSR (``sparse``) or a dense float64
    C array (float32 kept as it is with ``keep_float32``), with ``n_features`` columns."""
    if sparse:
        Q = _canonical_csr(sp.csr_matrix(check_array(X, accept_sparse="csr", dtype=np.float64)))
    else:
        Q = _dense(X)
        Q = np.ascontiguousarray(
            Q, np.float32 if keep_float32 and Q.dtype == np.float32 else np.float64
        )
    if Q.shape[1] != n_features:
        raise ValueError(f"X has {Q.shape[1]} features but the database vectors have {n_features}.")
    return Q


def _mapped(X, G: np.ndarray, block: int = 65536) -> np.ndarray:
    """``X @ G.T`` as a dense float64 C array (dense ``X`` in blocks of rows: no float64 copy
    of a float32 ``X``)."""
    if sp.issparse(X):
        return np.ascontiguousarray(np.asarray(X @ G.T), np.float64)
    out = np.empty((X.shape[0], G.shape[0]), np.float64)
    for start in range(0, X.shape[0], block):
        out[start : start + block] = np.asarray(X[start : start + block], np.float64) @ G.T
    return out


def _canonical_csr(X: sp.csr_matrix) -> sp.csr_matrix:
    """``X`` with sorted, unique column indices per row (a copy when it had to change)."""
    if not X.has_canonical_format:
        X = X.copy()
        X.sum_duplicates()
    return X


def _is_bucketer(obj) -> bool:
    """Bucketers (search forests, k-means trees, LSH tables) give integer keys, not codes."""
    return callable(getattr(obj, "keys", None)) and callable(getattr(obj, "fit", None))


def _is_candidate_index(obj) -> bool:
    return callable(getattr(obj, "candidates", None)) and callable(getattr(obj, "add", None))


def _pad_candidates(lists, limit: int | None) -> np.ndarray:
    """Per-query candidate lists -- id arrays or ``(ids, counts)`` pairs, in the index's order
    of preference -- as one ``(m, c)`` int64 array padded with -1 (first ``limit`` kept)."""
    lists = [np.asarray(c[0] if isinstance(c, tuple) else c, np.int64)[:limit] for c in lists]
    lengths = np.fromiter(map(len, lists), np.int64, len(lists))
    out = np.full((len(lists), max(int(lengths.max(initial=0)), 1)), -1, np.int64)
    if lengths.sum():
        rows = np.repeat(np.arange(len(lists)), lengths)
        cols = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        out[rows, cols] = np.concatenate(lists)
    return out


def _dense(X) -> np.ndarray:
    if sp.issparse(X):
        X = X.toarray()
    return check_array(X, dtype=(np.float64, np.float32), ensure_min_samples=0)

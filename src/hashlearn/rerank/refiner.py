"""Refiner: rescore candidate ids exactly (or by a learned metric) and keep each top k.

The refine stage of "hash, shortlist by Hamming distance, refine" -- faiss's
``IndexRefine`` ``refine_index`` -- as one object that owns the kept vectors (a
:class:`~hashlearn.rerank.store.VectorStore`), picks the kernel path and owns the screens'
state:

- the built-in exact metrics (``"sqeuclidean"``, ``"euclidean"``, ``"inner_product"``,
  ``"cosine"``) run as one batched numba kernel over all (query, candidate) pairs on the
  shared thread pool, keeping each query's top k as it scores: dense vectors in
  :mod:`hashlearn.rerank._kernels` (float64, or a float32 screen over float32 vectors),
  scipy.sparse vectors as CSR in :mod:`hashlearn.rerank._csr_kernels` (a pair costs
  O(nnz(q) + nnz(x)); no dense copy is ever made);
- with ``screen=True`` a compact copy of the vectors bounds every candidate's distance first
  and only the candidates that can still be among the k nearest are scored in full precision
  (certified bounds: the same results): an 8-bit copy of dense vectors
  (:mod:`hashlearn.rerank._quantized`), a bucket-norm sketch of CSR ones
  (:mod:`hashlearn.rerank._sketch`, Seidl & Kriegel, "Optimal multi-step k-nearest neighbor
  search", SIGMOD 1998, for the ordered refinement). A screen that spares too few exact
  scores is dropped until the vectors change;
- a learned metric reaches the refiner through its hasher: ``hasher.metric_transform()``
  returns ``G`` when the metric is ``|G (x - q)|^2`` (Jain, Kulis & Grauman, "Fast Image
  Search for Learned Metrics", CVPR 2008, eq. 6's explicit form): the vectors mapped by
  ``G`` once, then the squared Euclidean kernel; ``hasher.metric_kernel_form()`` returns
  ``(Phi, U, w)`` when it is eq. 8's implicit form ``|z|^2 + sum_j w_j ((Phi z) U)_j^2``
  (``z = x - q``): CSR squared distances plus c weighted side features per vector. Other
  learned metrics (``hasher.metric_distances``) and callables are scored in blocks of
  queries.

Result convention (faiss's): ``"inner_product"`` and ``"cosine"`` report similarities
(inner product, cosine similarity), largest first, padded with ``-inf``; every other metric
reports distances, smallest first, padded with ``inf``; ids pad with -1. Ties go to the
smaller id.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp
from sklearn.utils.validation import check_array

from hashlearn._utils.kernel_args import frozen
from hashlearn._utils.parallel import parallel_chunks
from hashlearn.index._storage import Snapshot
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
from hashlearn.rerank._quantized import quantize
from hashlearn.rerank._sketch import build_sketch, sketch_rows
from hashlearn.rerank.rowfile import RowFile
from hashlearn.rerank.store import MissingVectorsError, VectorStore, as_dense, canonical_csr

__all__ = [
    "Refiner",
    "MissingVectorsError",
    "register_reranker",
    "available_rerankers",
    "SIMILARITIES",
]

Reranker = Callable[[np.ndarray, np.ndarray], np.ndarray]
_RERANKERS: dict[str, Reranker] = {}

#: metrics reported as similarities (largest first); all others as distances
SIMILARITIES = ("inner_product", "cosine")


def register_reranker(name: str):
    """Decorator: ``fn(queries (b, d), candidates (b, c, d)) -> distances (b, c)``, smaller is
    nearer; usable as ``Searcher(..., rerank=name)``."""

    def decorate(fn: Reranker) -> Reranker:
        _RERANKERS[name] = fn
        return fn

    return decorate


def available_rerankers() -> list[str]:
    """Names accepted by ``Searcher(rerank=...)`` besides ``"metric"`` and a callable."""
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


_BUILTIN = {
    "sqeuclidean": (_sqeuclidean, SQEUCLIDEAN),
    "euclidean": (_euclidean, EUCLIDEAN),
    "inner_product": (_negative_inner_product, NEG_INNER),
    "cosine": (_cosine, COSINE),
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
#: side features of the implicit learned metric (one float64 per constrained point per
#: vector) above this many bytes: the general path instead
_MAX_SIDE_BYTES = 2**30


class Refiner:
    """Kept vectors by id + exact (or learned-metric) rescoring of candidate ids.

    Parameters
    ----------
    metric : str or callable
        A name from :func:`available_rerankers`, ``"metric"`` (the hasher's learned metric),
        or ``fn(queries (b, d), candidates (b, c, d)) -> distances (b, c)``.
    hasher : BaseHasher, optional
        The hasher whose learned metric ``"metric"`` uses (``metric_transform``,
        ``metric_kernel_form`` or ``metric_distances``).
    screen : bool, default=True
        Screen candidates with a compact copy of the vectors (built at the first search,
        never saved); ``False`` saves its memory. Same results either way.

    Examples
    --------
    >>> import numpy as np
    >>> r = Refiner("euclidean")
    >>> r.add(np.array([[0.0, 0.0], [3.0, 4.0], [1.0, 0.0]]), np.array([10, 11, 12]))
    >>> D, I = r.refine(np.zeros((1, 2)), np.array([[11, 10, 12, -1]]), k=2)
    >>> I.tolist(), D.tolist()
    ([[10, 12]], [[0.0, 1.0]])
    """

    def __init__(self, metric, *, hasher=None, screen: bool = True):
        if metric is None:  # no refine stage: only the settings are checked
            pass
        elif metric == "metric":
            if not callable(getattr(hasher, "metric_distances", None)):
                raise ValueError(
                    f"rerank='metric' needs a hasher with a learned metric "
                    f"(metric_distances); {type(hasher).__name__} has none."
                )
        elif isinstance(metric, str):
            if metric not in _RERANKERS:
                raise ValueError(
                    f"Unknown rerank {metric!r}; available: {available_rerankers()}, "
                    "'metric' or a callable."
                )
        elif not callable(metric):
            raise TypeError("rerank must be None, a name or a callable.")
        if not isinstance(screen, (bool, np.bool_)):
            raise TypeError(f"screen must be True or False, got {screen!r}")
        self.metric = metric
        self.hasher = hasher
        self.screen = bool(screen)
        self.store = VectorStore()

    @property
    def similarity(self) -> bool:
        """Whether results are similarities (largest first) rather than distances."""
        return isinstance(self.metric, str) and self.metric in SIMILARITIES

    def __len__(self) -> int:
        return len(self.store)

    def add(self, vectors, ids) -> None:
        """Keep ``vectors`` (dense or scipy.sparse rows) under the new ``ids``."""
        self.store.add(self.store.prepare(vectors), ids)

    def remove(self, ids) -> int:
        """Forget the vectors of ``ids`` (absent ones skipped); returns how many."""
        return self.store.remove(ids)

    # ------------------------------------------------------------------------- refine

    def refine(
        self, queries, candidate_ids: np.ndarray, k: int, *, n_threads: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The best ``k`` of each query's candidates: ``(D float32 (m, k), I int64 (m, k))``.

        ``candidate_ids`` int64 ``(m, c)`` padded with -1. Candidates whose vectors the store
        does not hold raise :class:`MissingVectorsError`. See the module doc for the result
        convention."""
        cand = np.asarray(candidate_ids, np.int64)
        if cand.ndim != 2 or cand.shape[0] != queries.shape[0]:
            raise ValueError(
                f"candidate_ids must be (m, c) for {queries.shape[0]} queries; got {cand.shape}."
            )
        state = self.store.state
        if not state.n or not cand.shape[1]:  # nothing to score: padding
            D, I = (
                np.full((len(cand), k), np.inf, np.float32),
                np.full((len(cand), k), -1, np.int64),
            )
        else:
            pos = VectorStore.positions(state, cand)
            row_file = state.cached("row_file")
            if row_file is not None:  # vectors on disk: read only the candidates' rows
                state, pos = _gathered(state, row_file, pos)
            D, I = self._rescore(queries, state, pos, k, n_threads, row_file is None)
        if self.similarity:  # the kernels rank by -q.x and 1 - cos (in float64)
            D = np.where(I >= 0, -D if self.metric == "inner_product" else 1.0 - D, -np.inf)
        return D.astype(np.float32), I

    def _rescore(self, X, state, cand_pos, k, n_threads, may_screen=True):
        operands = self._batched_operands(X, state)
        if operands is None:
            return self._rescore_general(X, state, cand_pos, k)
        Q, V, kind, side = operands
        m = cand_pos.shape[0]
        pos = np.ascontiguousarray(cand_pos, np.int64)
        out_d = np.full((m, k), np.inf, np.float64)
        out_row = np.full((m, k), -1, np.int64)
        screens = pos.shape[1] >= 2 * k and self.screen and may_screen and side is None
        counts: list[int] = []
        if sp.issparse(V):
            vectors = state.derived("csr_arrays", _csr_arrays)
            queries = (Q.data, Q.indices.astype(vectors[1].dtype), Q.indptr.astype(np.int64))
            screen = _screen(state, V, lambda: _csr_screen(state, vectors)) if screens else False
            chunk = {}
            if screen is not False:
                sketch, x_sq = screen
                x_sketch = (sketch.codes, sketch.err, sketch.code_sq)
                extra = (sketch_rows(sketch, *queries), x_sketch, x_sq, sketch.step)
                kernel = csr_sketch_kernel
                chunk = {"max_chunk": queries_per_call(pos.shape[1], SKETCH_PAIRS)}
            else:
                kernel = csr_distance_kernel
                extra = side or (np.zeros((m, 0)), np.zeros((V.shape[0], 0)), np.zeros(0))

            def run(start, stop):
                scratch = csr_scratch(V.shape[1], queries[2])
                args = (queries, vectors, extra, pos, kind, k, out_d, out_row, start, stop)
                counts.append(kernel(*args, scratch))
        else:
            # read-only C-ordered views (a memmap's buffer as a plain ndarray, no copy): one
            # compiled kernel whatever the arrays' flags
            Qd, Vd, pos_d = frozen(Q, Q.dtype), frozen(V, V.dtype), frozen(pos, np.int64)
            screens = self.screen and may_screen
            screen = _screen(state, V, lambda: quantize(Vd) or False) if screens else False
            runner = rescore_runner(
                Qd, Vd, pos_d, kind, k, out_d, out_row, screen=screen or None, float32_results=True
            )
            screen = screen if pos.shape[1] >= 2 * k else False

            def run(start, stop):
                counts.append(runner(start, stop))

            chunk = {"max_chunk": queries_per_call(pos.shape[1])}
        parallel_chunks(run, m, n_threads, min_chunk=1, **chunk)
        if screen is not False:
            limit = _SKETCH_MAX_EXACT if sp.issparse(V) else _SCREEN_MAX_EXACT
            if sum(counts) > limit * np.count_nonzero(pos >= 0):
                state.attach("screen", (V, False))  # dropped until the vectors change
        ids = np.where(out_row >= 0, state.ids[np.maximum(out_row, 0)], -1)
        return out_d, ids

    def _batched_operands(self, X, state):
        """``(queries, vectors, kind, side)`` for the batched kernels -- an exact metric on the
        kept vectors (dense or CSR); the learned metric ``|G (x - q)|^2`` as the squared
        Euclidean distance of the mapped vectors; the implicit learned metric as CSR squared
        distances plus weighted side features ``side = (queries', vectors', weights)`` -- or
        None for the general path."""
        V = VectorStore.vectors_of(state)
        name = self.metric
        if isinstance(name, str) and name in _BUILTIN and _RERANKERS[name] is _BUILTIN[name][0]:
            sparse = sp.issparse(V)
            Q = _checked_queries(X, sparse, V.shape[1], not sparse and V.dtype == np.float32)
            return Q, V, _BUILTIN[name][1], None
        if name != "metric":
            return None
        transform = getattr(self.hasher, "metric_transform", None)
        G = transform() if callable(transform) else None
        if G is not None:
            if G.shape[1] != V.shape[1]:
                raise ValueError(
                    f"the hasher's metric transform takes {G.shape[1]} features but the "
                    f"database vectors have {V.shape[1]}."
                )
            cached = state.cached("mapped")
            if cached is None or cached[0] is not G:
                cached = (G, _mapped(V, G))
                state.attach("mapped", cached)
            Q = _checked_queries(X, sp.issparse(X), G.shape[1])
            return _mapped(Q, G), cached[1], SQEUCLIDEAN, None
        form = getattr(self.hasher, "metric_kernel_form", None)
        form = form() if callable(form) and sp.issparse(V) else None
        if form is None or V.shape[0] * form[0].shape[0] * 8 > _MAX_SIDE_BYTES:
            return None
        Phi, U, w = form
        cached = state.cached("side")
        if cached is None or cached[0] is not form:
            cached = (form, np.ascontiguousarray((V @ Phi.T).toarray() @ U))
            state.attach("side", cached)
        Q = _checked_queries(X, True, V.shape[1])
        side = (np.ascontiguousarray((Q @ Phi.T).toarray() @ U), cached[1], w)
        return Q, V, SQEUCLIDEAN, side

    def _rescore_general(self, X, state, cand_pos, k):
        """Rescoring by a callable or a learned metric without a kernel form, in blocks of
        queries (one call of the distance function per block)."""
        V = VectorStore.vectors_of(state)
        m, c = cand_pos.shape
        out_d = np.full((m, k), np.inf, np.float32)
        out_i = np.full((m, k), -1, np.int64)
        sparse = sp.issparse(V)
        if self.metric == "metric":
            fn = self.hasher.metric_distances
            from_differences = getattr(self.hasher, "metric_distances_from_differences", None)
            if sparse and callable(from_differences):
                Q = _checked_queries(X, True, V.shape[1])
                block = max(1, 2**18 // max(1, c))
                for start in range(0, m, block):
                    stop = min(m, start + block)
                    pos = cand_pos[start:stop]
                    Z = V[np.maximum(pos, 0).ravel()] - Q[np.repeat(np.arange(start, stop), c)]
                    dist = np.asarray(from_differences(Z.tocsr()), np.float64).reshape(pos.shape)
                    _top_k(dist, pos, state.ids, k, out_d[start:stop], out_i[start:stop])
                return out_d, out_i
        else:
            fn = _RERANKERS[self.metric] if isinstance(self.metric, str) else self.metric
        queries = as_dense(X)
        block = max(1, 2**22 // max(1, c * queries.shape[1]))
        for start in range(0, m, block):
            stop = min(m, start + block)
            pos = cand_pos[start:stop]
            rows = np.maximum(pos, 0)
            # sparse vectors: only this block's candidate rows are densified
            vecs = V[rows.ravel()].toarray().reshape(*rows.shape, -1) if sparse else V[rows]
            dist = np.asarray(fn(queries[start:stop], vecs), dtype=np.float64)
            if dist.shape != pos.shape:
                raise ValueError(f"rerank returned shape {dist.shape}; expected {pos.shape}.")
            _top_k(dist, pos, state.ids, k, out_d[start:stop], out_i[start:stop])
        return out_d, out_i

    # -------------------------------------------------------------------- persistence

    @staticmethod
    def params(metric, screen: bool) -> dict:
        """The JSON parameters of a save (a callable metric cannot be saved: ``TypeError``)."""
        if metric is not None and not isinstance(metric, str):
            raise TypeError(
                "cannot save a Searcher whose rerank is a callable; register it with "
                "hashlearn.search.register_reranker(name) and pass rerank=name instead."
            )
        return {"rerank": metric, "screen": bool(screen)}

    @staticmethod
    def saved_params(params: dict) -> tuple:
        """``(metric, screen)`` of saved parameters, checked (``ValueError``)."""
        metric = params.get("rerank")
        if metric is not None and not isinstance(metric, str):
            raise ValueError(f"params entry 'rerank' must be a name or null, got {metric!r}")
        screen = params.get("screen", True)  # saves before the screen existed: the default
        if not isinstance(screen, bool):
            raise ValueError(f"params entry 'screen' must be true or false, got {screen!r}")
        return metric, screen


def _gathered(state: Snapshot, row_file: RowFile, pos: np.ndarray):
    """A snapshot of only the rows ``pos`` names, read from ``row_file``, and ``pos`` as rows
    of it (the screens are not built for a snapshot this short-lived)."""
    valid = pos >= 0
    rows, inverse = np.unique(pos[valid], return_inverse=True)
    local = np.full(pos.shape, -1, np.int64)
    local[valid] = inverse
    return Snapshot(state.ids[rows], {"vectors": row_file.take(rows)}, 0), local


def _top_k(dist, pos, ids_of_rows, k: int, out_d: np.ndarray, out_i: np.ndarray):
    """The ``k`` smallest of each row by (distance, id), padding (row -1) last."""
    ids = np.where(pos >= 0, ids_of_rows[np.maximum(pos, 0)], -1)
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
        Q = canonical_csr(sp.csr_matrix(check_array(X, accept_sparse="csr", dtype=np.float64)))
    else:
        Q = as_dense(X)
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


def _csr_arrays(state):
    """The CSR vectors' data, column indices (int32 below 2^31 columns, else int64) and
    int64 row pointers, converted once per snapshot; every CSR kernel reads these."""
    V = VectorStore.vectors_of(state)
    narrow = np.int32 if V.shape[1] < 2**31 else np.int64
    return np.asarray(V.data), np.asarray(V.indices, narrow), np.asarray(V.indptr, np.int64)


def _screen(state, V, build):
    """The screen of the kernel's vectors ``V`` (the kept ones, or those mapped by a learned
    metric), cached on the snapshot: ``build()`` once per ``V``; False once dropped."""
    cached = state.cached("screen")
    if cached is None or cached[0] is not V:
        cached = (V, build())
        state.attach("screen", cached)
    return cached[1]


def _csr_screen(state, arrays):
    """``(sketch, |x|^2)`` of the CSR vectors: their bucket-norm sketch and squared norms."""
    sketch = build_sketch(*arrays, VectorStore.vectors_of(state).shape[1])
    return sketch, row_sqnorms(arrays[0], arrays[2])

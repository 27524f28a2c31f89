"""Searcher: a hasher, an index and an optional re-ranking stage wired together.

The common pipeline of all five papers::

    fit the hasher on a sample ─ encode + add the database ─ search the query codes
    ─ re-rank the top candidates by the exact (or learned) distance on the original vectors

Each stage stays usable alone; ``Searcher`` only saves the bookkeeping (keeping the original
vectors by id for re-ranking, choosing how many candidates to re-rank).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_array, check_is_fitted

from hashlearn._validation import check_int
from hashlearn.hashers.base import BaseHasher
from hashlearn.index.base import BinaryIndex, make_index

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
        distance). A name from :func:`available_rerankers`
        (``"euclidean"``, ``"sqeuclidean"``, ``"cosine"``, ``"inner_product"`` -- reported as
        its negative, so smaller is nearer) or ``fn(queries (b, d), candidates (b, c, d))``
        re-ranks the Hamming candidates by that distance on the original vectors, which the
        searcher then keeps.
    n_candidates : int, optional
        Candidates re-ranked per query: for a Hamming index the nearest ``n_candidates``
        (default ``max(10 * k, 100)``); for an index with ``candidates(...)`` (tables,
        sorted permutations) the first ``n_candidates`` of each list (default: all).

    Examples
    --------
    >>> from hashlearn import Searcher, RandomHyperplaneLSH, load_digits
    >>> X, y = load_digits()
    >>> s = Searcher(RandomHyperplaneLSH(32, random_state=0), rerank="euclidean")
    >>> D, I = s.fit(X).add(X).search(X[:2], k=3)
    >>> I[:, 0].tolist()
    [0, 1]
    """

    def __init__(
        self,
        hasher: BaseHasher,
        index: BinaryIndex | str = "flat",
        rerank: str | Reranker | None = None,
        n_candidates: int | None = None,
    ):
        if not (isinstance(hasher, BaseHasher) or _is_bucketer(hasher)):
            raise TypeError(
                f"hasher must be a hashlearn hasher (encode) or bucketer (keys). "
                f"Got {type(hasher).__name__}."
            )
        if isinstance(index, str):
            if not hasattr(hasher, "n_bits"):
                raise TypeError(
                    "a bucketer needs an index object such as TableIndex, not a registry name."
                )
            index = make_index(index, n_bits=hasher.n_bits)
        if not (isinstance(index, BinaryIndex) or _is_candidate_index(index)):
            raise TypeError(
                f"index must be a hashlearn index or a registry name. Got {type(index).__name__}."
            )
        if isinstance(index, BinaryIndex) and index.n_bits != getattr(hasher, "n_bits", None):
            raise ValueError(
                f"index holds {index.n_bits}-bit codes but the hasher makes "
                f"{getattr(hasher, 'n_bits', 'no')}-bit codes."
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
        self.hasher = hasher
        self.index = index
        self.rerank = rerank
        self.n_candidates = n_candidates
        self._vectors: np.ndarray | None = None  # rows in the order of _vector_ids
        self._vector_ids = np.zeros(0, np.int64)

    def fit(self, X, y=None, **fit_params) -> Searcher:
        """Fit the hasher (on a training sample); does not add anything to the index."""
        self.hasher.fit(X, y, **fit_params)
        return self

    def add(self, X, ids=None) -> Searcher:
        """Encode the rows of ``X`` and add them to the index (keeping them if re-ranking)."""
        if isinstance(self.hasher, BaseEstimator):
            check_is_fitted(self.hasher)
        new_ids = np.asarray(self.index.add(self._encode(X), ids))
        if self.rerank is not None:
            vectors = _dense(X)
            all_ids = np.concatenate([self._vector_ids, new_ids])
            all_vecs = (
                vectors if self._vectors is None else np.concatenate([self._vectors, vectors])
            )
            order = np.argsort(all_ids, kind="stable")
            self._vector_ids, self._vectors = all_ids[order], all_vecs[order]
        return self

    def remove(self, ids) -> int:
        """Remove ids from the index (and the kept vectors); returns the number removed."""
        removed = self.index.remove(ids)
        if self._vectors is not None:
            keep = ~np.isin(self._vector_ids, ids)
            self._vector_ids, self._vectors = self._vector_ids[keep], self._vectors[keep]
        return removed

    def search(self, X, k: int, *, n_threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest database items of each row of ``X``: ``(D, I)``.

        Without re-ranking ``D`` holds int32 Hamming distances; with it, float32 distances
        of the re-ranking metric. Padded with ``-1`` ids (and ``-1`` / ``inf`` distances).
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
        return self._rerank(_dense(X), self._vector_positions(cand), cand, k)

    def neighbors(
        self,
        X,
        *,
        radius: int | None = None,
        n_bins: int | None = None,
        n_threads: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Neighbours by an absolute or relative Hamming threshold, ties kept: ``(lims, D, I)``.

        lambdarank-bit-vectors.txt, Sec. 3.5.2. ``radius``: every item at Hamming distance
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
        """Rows of the kept vectors for candidate ids (-1 stays -1); unknown ids raise."""
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

    def _rerank(
        self, queries: np.ndarray, cand_pos: np.ndarray, cand: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        if self.rerank == "metric":
            fn = self.hasher.metric_distances
        else:
            fn = _RERANKERS[self.rerank] if isinstance(self.rerank, str) else self.rerank
        m = len(queries)
        out_d = np.full((m, k), np.inf, np.float32)
        out_i = np.full((m, k), -1, np.int64)
        block = max(1, 2**22 // max(1, cand.shape[1] * queries.shape[1]))
        for start in range(0, m, block):
            stop = min(m, start + block)
            ids, pos = cand[start:stop], cand_pos[start:stop]
            if not len(self._vector_ids):  # empty database: every candidate is padding
                break
            dist = np.asarray(
                fn(queries[start:stop], self._vectors[np.maximum(pos, 0)]), dtype=np.float64
            )
            if dist.shape != ids.shape:
                raise ValueError(f"rerank returned shape {dist.shape}; expected {ids.shape}.")
            dist = np.where(ids >= 0, dist, np.inf)
            sentinel = np.where(ids >= 0, ids, np.iinfo(np.int64).max)
            order = np.lexsort((sentinel, dist), axis=-1)[:, :k]
            rows = np.arange(stop - start)[:, None]
            width = order.shape[1]
            out_d[start:stop, :width] = dist[rows, order]
            out_i[start:stop, :width] = ids[rows, order]
        return out_d, out_i


def _is_bucketer(obj) -> bool:
    """Bucketers (search forests, k-means trees, LSH tables) give integer keys, not codes."""
    return callable(getattr(obj, "keys", None)) and callable(getattr(obj, "fit", None))


def _is_candidate_index(obj) -> bool:
    return callable(getattr(obj, "candidates", None)) and callable(getattr(obj, "add", None))


def _pad_candidates(lists, limit: int | None) -> np.ndarray:
    """Per-query candidate lists -- id arrays or ``(ids, counts)`` pairs, in the index's order
    of preference -- as one ``(m, c)`` int64 array padded with -1 (first ``limit`` kept)."""
    lists = [np.asarray(c[0] if isinstance(c, tuple) else c, np.int64) for c in lists]
    if limit is not None:
        lists = [c[:limit] for c in lists]
    width = max((len(c) for c in lists), default=0)
    out = np.full((len(lists), max(width, 1)), -1, np.int64)
    for row, c in enumerate(lists):
        out[row, : len(c)] = c
    return out


def _dense(X) -> np.ndarray:
    if sp.issparse(X):
        X = X.toarray()
    return check_array(X, dtype=(np.float64, np.float32), ensure_min_samples=0)

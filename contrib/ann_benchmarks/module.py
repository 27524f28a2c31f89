"""hashlearn in ann-benchmarks: copy this directory to ``ann_benchmarks/algorithms/hashlearn/``.

Three algorithm classes, each a ``BaseANN`` built on hashlearn's public API only:

* :class:`Hashlearn` -- Euclidean / angular vectors: random-hyperplane LSH codes of ``n_bits``
  bits in a ``MultiIndexHashing`` (``index="mih"``) or ``FlatIndex`` (``index="flat"``), the
  ``n_candidates`` nearest codes re-ranked by the exact distance (a ``hashlearn.Searcher``).
  Angular vectors are normalised first, so the Euclidean re-ranking is the angular order.
* :class:`HashlearnHamming` -- ``bit/hamming`` datasets (unpacked booleans): rows packed into
  binary codes and searched *exactly* with multi-index hashing (Norouzi, Punjani and Fleet,
  "Fast Search in Hamming Space with Multi-Index Hashing", 2012) or a flat scan.
* :class:`HashlearnMinHash` -- ``bit/jaccard`` datasets (sets of item ids, or boolean rows):
  Min-Hash signatures in banded LSH tables (``MinHashLSHIndex``), candidates ordered by band
  collisions, the first ``n_candidates`` re-ranked by the exact Jaccard distance.

Run as a script (``python3 module.py``) it warms numba's compile cache by running every code
path above on tiny data; the Dockerfile does this so that a benchmark never measures
compilation.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

try:
    from ..base.module import BaseANN
except ImportError:  # run as a script (the image's build-time warm-up): no harness around
    BaseANN = object

from hashlearn import (
    FlatIndex,
    MinHash,
    MinHashLSHIndex,
    MultiIndexHashing,
    RandomHyperplaneLSH,
    Searcher,
    pack_bits,
)

_INDEXES = {"mih": MultiIndexHashing, "flat": FlatIndex}
_TRAIN_SAMPLE = 20_000  # rows the hash functions are fitted on


def _check_index(index: str) -> str:
    if index not in _INDEXES:
        raise ValueError(f"index must be one of {sorted(_INDEXES)}. Got {index!r}.")
    return index


class Hashlearn(BaseANN):
    """``Hashlearn(metric, index, n_bits)``; query argument: ``n_candidates`` re-ranked."""

    def __init__(self, metric: str, index: str = "mih", n_bits: int = 64):
        if metric not in ("euclidean", "angular"):
            raise NotImplementedError(f"Hashlearn supports euclidean and angular, not {metric}.")
        self._metric, self._index_name, self._n_bits = metric, _check_index(index), int(n_bits)
        self._n_candidates = 100
        self._searcher: Searcher | None = None
        self._results = None
        self.name = f"hashlearn-lsh-{index}({metric}, {n_bits} bits)"

    def _vectors(self, X) -> np.ndarray:
        X = np.ascontiguousarray(X, np.float32)
        if X.ndim == 1:
            X = X[None, :]
        if self._metric == "angular":
            X = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), np.float32(1e-30))
        return X

    def fit(self, X) -> None:
        X = self._vectors(X)
        sample = np.random.default_rng(0).permutation(len(X))[:_TRAIN_SAMPLE]
        hasher = RandomHyperplaneLSH(self._n_bits, random_state=0).fit(X[sample])
        index = _INDEXES[self._index_name](self._n_bits)
        self._searcher = Searcher(hasher, index, rerank="sqeuclidean")
        self._searcher.add(X)

    def set_query_arguments(self, n_candidates: int) -> None:
        self._n_candidates = max(1, int(n_candidates))
        if self._searcher is not None:
            self._searcher.n_candidates = self._n_candidates
        self.name = (
            f"hashlearn-lsh-{self._index_name}({self._metric}, {self._n_bits} bits, "
            f"n_candidates={self._n_candidates})"
        )

    def _search(self, X, n: int, n_threads: int | None) -> np.ndarray:
        self._searcher.n_candidates = max(self._n_candidates, n)
        return self._searcher.search(self._vectors(X), n, n_threads=n_threads)[1]

    def query(self, v, n: int) -> np.ndarray:
        ids = self._search(v, n, 1)[0]
        return ids[ids >= 0]

    def batch_query(self, X, n: int) -> None:
        self._results = self._search(X, n, None)

    def get_batch_results(self) -> list[np.ndarray]:
        return [row[row >= 0] for row in self._results]

    def __str__(self) -> str:
        return self.name


class HashlearnHamming(BaseANN):
    """``HashlearnHamming(metric, index)``: exact Hamming k-NN; no query argument."""

    def __init__(self, metric: str, index: str = "mih"):
        if metric != "hamming":
            raise NotImplementedError(f"HashlearnHamming supports hamming, not {metric}.")
        self._index_name = _check_index(index)
        self._index = None
        self._results = None
        self.name = f"hashlearn-{index}(hamming, exact)"

    @staticmethod
    def _codes(X) -> np.ndarray:
        X = np.asarray(X)
        if X.ndim == 1:
            X = X[None, :]
        return pack_bits(X != 0)

    def fit(self, X) -> None:
        codes = self._codes(X)
        self._index = _INDEXES[self._index_name](np.asarray(X).shape[1])
        self._index.add(codes)

    def set_query_arguments(self, *args) -> None:
        """Exact search: nothing to tune (accepts and ignores the harness's arguments)."""

    def query(self, v, n: int) -> np.ndarray:
        ids = self._index.search(self._codes(v), n, n_threads=1)[1][0]
        return ids[ids >= 0]

    def batch_query(self, X, n: int) -> None:
        self._results = self._index.search(self._codes(X), n)[1]

    def get_batch_results(self) -> list[np.ndarray]:
        return [row[row >= 0] for row in self._results]

    def __str__(self) -> str:
        return self.name


class HashlearnMinHash(BaseANN):
    """``HashlearnMinHash(metric, bands, rows)``; query argument: ``n_candidates`` re-ranked
    by the exact Jaccard distance (the candidates with the most band collisions first)."""

    def __init__(self, metric: str, bands: int = 32, rows: int = 4):
        if metric != "jaccard":
            raise NotImplementedError(f"HashlearnMinHash supports jaccard, not {metric}.")
        self._bands, self._rows = int(bands), int(rows)
        self._n_candidates = 200
        self._n_tokens = 0
        self._results = None
        self.name = f"hashlearn-minhash(jaccard, {bands}x{rows})"

    def _sets(self, X) -> sp.csr_matrix:
        """Item sets as a binary CSR matrix: from a 2-D boolean array, one set (1-D array of
        item ids), or a list of id arrays (ann-benchmarks' sparse datasets)."""
        if isinstance(X, np.ndarray) and X.dtype == np.bool_:
            return sp.csr_matrix(np.atleast_2d(X), dtype=np.float32)
        if isinstance(X, np.ndarray) and X.ndim == 1 and np.issubdtype(X.dtype, np.integer):
            X = [X]
        rows = [np.unique(np.asarray(s, np.int64)) for s in X]
        indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
        indices = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        width = max(self._n_tokens, int(indices.max()) + 1 if indices.size else 0)
        return sp.csr_matrix(
            (np.ones(len(indices), np.float32), indices, indptr), shape=(len(rows), width)
        )

    def _signatures(self, sets: sp.csr_matrix) -> np.ndarray:
        """Min-Hash signatures; an empty set (whose Min-Hash is undefined) gets values outside
        Min-Hash's range, distinct per row, so it collides with nothing."""
        empty = np.diff(sets.indptr) == 0
        sig = np.empty((sets.shape[0], self._bands * self._rows), np.int64)
        if (~empty).any():
            sig[~empty] = self._minhash.transform(sets[np.flatnonzero(~empty)])
        sig[empty] = (1 << 40) + np.flatnonzero(empty)[:, None]
        return sig

    def fit(self, X) -> None:
        self._X = self._sets(X)
        self._n_tokens = self._X.shape[1]
        self._sizes = np.diff(self._X.indptr).astype(np.float64)
        self._minhash = MinHash(self._bands * self._rows, random_state=0).fit(self._X)
        self._index = MinHashLSHIndex(self._bands, self._rows)
        self._index.add(self._signatures(self._X))

    def set_query_arguments(self, n_candidates: int) -> None:
        self._n_candidates = max(1, int(n_candidates))
        self.name = (
            f"hashlearn-minhash(jaccard, {self._bands}x{self._rows}, "
            f"n_candidates={self._n_candidates})"
        )

    def _search(self, X, n: int, n_threads: int | None) -> list[np.ndarray]:
        Q = self._sets(X)
        q_sizes = np.diff(Q.indptr)  # tokens the database never saw still count in the union
        lists = self._index.candidates(self._signatures(Q), n_threads=n_threads)
        Q = sp.csr_matrix(Q[:, : self._n_tokens], shape=(Q.shape[0], self._n_tokens))
        out = []
        for q, (cand, _) in enumerate(lists):
            cand = cand[: max(self._n_candidates, n)]
            if not cand.size:
                out.append(cand)
                continue
            inter = np.asarray((self._X[cand] @ Q[q].T).todense()).ravel()
            union = self._sizes[cand] + q_sizes[q] - inter
            dist = 1.0 - inter / np.maximum(union, 1.0)
            out.append(cand[np.lexsort((cand, dist))[:n]])
        return out

    def query(self, v, n: int) -> np.ndarray:
        return self._search(v, n, 1)[0]

    def batch_query(self, X, n: int) -> None:
        self._results = self._search(X, n, None)

    def get_batch_results(self) -> list[np.ndarray]:
        return self._results

    def __str__(self) -> str:
        return self.name


def warm_up() -> None:
    """Run every code path on tiny data, so numba compiles (and caches) each kernel now."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((600, 16)).astype(np.float32)
    for metric in ("euclidean", "angular"):
        for index in _INDEXES:
            for n_bits in (32, 64, 128, 256):
                algo = Hashlearn(metric, index, n_bits)
                algo.fit(X)
                algo.set_query_arguments(50)
                algo.query(X[0], 10)
                algo.batch_query(X[:40], 10)
                algo.get_batch_results()
    for dim in (64, 128, 256, 512, 1024):
        B = rng.random((300, dim)) < 0.5
        for index in _INDEXES:
            algo = HashlearnHamming("hamming", index)
            algo.fit(B)
            algo.query(B[0], 10)
            algo.batch_query(B[:40], 10)
    sets = [rng.choice(500, size=rng.integers(1, 30), replace=False) for _ in range(300)]
    algo = HashlearnMinHash("jaccard", 16, 4)
    algo.fit(sets)
    algo.set_query_arguments(100)
    algo.query(sets[0], 10)
    algo.batch_query(sets[:40], 10)


if __name__ == "__main__":
    warm_up()
    print("hashlearn: numba compile cache warmed")

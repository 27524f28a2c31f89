"""ann-benchmarks algorithm module for hashlearn (copy this directory to
``ann_benchmarks/algorithms/hashlearn/`` in an ann-benchmarks checkout).

The algorithm itself is :class:`hashlearn.experiments.ann_bench.HashlearnANN`, the same code
``hashlearn bench ann FILE.hdf5`` sweeps locally; this class only adds the harness's
``BaseANN`` base. Hamming datasets (unpacked booleans) are packed and searched exactly with
multi-index hashing; Euclidean / angular ones are encoded with random-hyperplane LSH and the
``n_candidates`` nearest codes are re-ranked by the exact distance.
"""

from __future__ import annotations

from ann_benchmarks.algorithms.base.module import BaseANN

from hashlearn.experiments.ann_bench import HashlearnANN


class Hashlearn(HashlearnANN, BaseANN):
    """``Hashlearn(metric, index="mih", n_bits=64)``; query argument: ``n_candidates``."""

    def __init__(self, metric, index="mih", n_bits=64):
        HashlearnANN.__init__(self, metric, index, n_bits)

    def fit(self, X):
        HashlearnANN.fit(self, X)

    def set_query_arguments(self, n_candidates):
        HashlearnANN.set_query_arguments(self, max(int(n_candidates), 1))

    def query(self, v, n):
        return HashlearnANN.query(self, v, n)

    def batch_query(self, X, n):
        HashlearnANN.batch_query(self, X, n)

    def get_batch_results(self):
        return HashlearnANN.get_batch_results(self)

    def __str__(self):
        return HashlearnANN.__str__(self)

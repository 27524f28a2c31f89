"""LSH tables: the data-independent baseline of Li et al., *Learning to Search Efficiently in High Dimensions*, NIPS 2011 (§4, "multiple sets
of LSH codes").

Each of ``n_tables`` tables concatenates ``bits_per_table`` random-hyperplane bits
(Charikar's sign-random-projection LSH, survey §3.1) of the centred data,
``h(x) = 1(r . (x - mu) > 0)`` with ``r ~ N(0, I)``; the table's key is the integer whose bit
``j`` is the table's ``j``-th bit. Items sharing a key in any table are candidates (Gionis,
Indyk & Motwani's multi-table scheme), so the inverted :class:`~hashlearn.index.table.TableIndex`
serves them like the leaves of a search forest.
"""

from __future__ import annotations

import numba
import numpy as np
from sklearn.utils import check_random_state

from hashlearn._utils.parallel import parallel_chunks
from hashlearn._utils.validation import check_int
from hashlearn.forest.base import BaseBucketer, _score
from hashlearn.io import persistable

__all__ = ["LSHTables"]


@persistable
class LSHTables(BaseBucketer):
    """``n_tables`` tables of ``bits_per_table`` random-hyperplane bits each.

    Parameters
    ----------
    n_tables : int
        Number of tables L (keys per item).
    bits_per_table : int
        Bits concatenated into one table's key, in [1, 40]: ``2**bits_per_table`` buckets.
    random_state : int, RandomState or None

    Attributes
    ----------
    directions_ : ndarray (n_tables * bits_per_table, n_features)
        Gaussian hyperplane normals; rows ``l*b .. (l+1)*b - 1`` form table ``l``.
    offsets_ : ndarray (n_tables * bits_per_table,)
        ``directions_ @ mean(X)``: the hyperplanes pass through the data mean.

    Examples
    --------
    >>> from hashlearn.datasets import load_digits
    >>> from hashlearn.forest.lsh_tables import LSHTables
    >>> X, _ = load_digits()
    >>> LSHTables(4, 8, random_state=0).fit(X).leaves(X[:2]).shape
    (2, 4)
    """

    def __init__(self, n_tables: int = 8, bits_per_table: int = 12, random_state=None):
        self.n_tables = n_tables
        self.bits_per_table = bits_per_table
        self.random_state = random_state

    def _fit(self, X, y) -> None:
        n_tables = check_int(self.n_tables, "n_tables", "LSHTables")
        bits = check_int(self.bits_per_table, "bits_per_table", "LSHTables", high=40)
        rng = check_random_state(self.random_state)
        self.directions_ = rng.standard_normal((n_tables * bits, X.shape[1]))
        self.offsets_ = self.directions_ @ X.mean(axis=0)

    def _check_state(self) -> None:
        super()._check_state()
        rows = int(self.n_tables) * int(self.bits_per_table)
        if np.shape(self.directions_) != (rows, self.n_features_in_) or np.shape(self.offsets_) != (
            rows,
        ):
            raise ValueError(
                f"directions_ {np.shape(self.directions_)} and offsets_ "
                f"{np.shape(self.offsets_)} do not fit {self.n_tables} tables of "
                f"{self.bits_per_table} bits over {self.n_features_in_} features"
            )

    def _local_keys(self, X, n_threads=None) -> np.ndarray:
        out = np.empty((X.shape[0], self.n_tables), np.int64)
        directions = np.ascontiguousarray(self.directions_, dtype=np.float64)
        offsets = np.ascontiguousarray(self.offsets_, dtype=np.float64)
        bits = int(self.bits_per_table)

        def kernel(start: int, stop: int) -> None:
            _lsh_keys_range(start, stop, X, directions, offsets, bits, out)

        parallel_chunks(kernel, X.shape[0], n_threads, min_chunk=64)
        return out


@numba.njit(cache=True, nogil=True)
def _lsh_keys_range(start, stop, X, directions, offsets, bits, out):
    """Row by row (so a row's key does not depend on the batch it comes in): bit ``j`` of
    table ``l`` is ``r . x > r . mu`` with ``r`` row ``l * bits + j`` of ``directions``,
    computed by the forest's split-score kernel."""
    n_tables = out.shape[1]
    for i in range(start, stop):
        for t in range(n_tables):
            key = 0
            for j in range(bits):
                r = t * bits + j
                if _score(X, i, -r - 1, directions) > offsets[r]:
                    key |= 1 << j
            out[i, t] = key

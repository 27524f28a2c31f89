"""Linear hash functions: bit ``j`` of ``x`` is ``[(x - mean) . w_j + shift_j >= 0]``.

Random-hyperplane LSH, PCA hashing, ITQ, metric LSH, minimal loss hashing and RankNet codes
all threshold a linear projection at zero. :class:`LinearForm` holds the fitted ``W``,
``mean`` and ``shift`` of such a hasher and computes its codes and its scores in one shared
way, block by block, so that neither ever holds more than a block of ``X`` in a new array:

* :meth:`LinearForm.encode` works in the precision of ``X``: float32 rows are multiplied by
  a float32 copy of ``W`` (single-precision BLAS, the speed and memory of faiss's encoders),
  float64 rows by ``W`` itself. Each block's product is thresholded and packed straight into
  the preallocated codes. The bit test ``p + shift >= 0`` is done as ``p >= -shift``, which is
  the same test in IEEE arithmetic (``p + s`` is zero exactly when ``p == -s``, and rounding
  keeps its sign), so float64 rows get exactly the codes of the one-shot float64 formula.
  float32 rows get the float64 codes except where a score lies within float32 rounding of
  zero (a tie), measured at more than 99.9 % of the bits on digits and Fashion-MNIST
  (``tests/test_encode.py``).
* :meth:`LinearForm.project` returns float64 scores whatever the input precision (float32
  blocks are widened exactly, block by block), so ``project`` stays the precise reference.

Centring (``mean``) subtracts the mean from a block before the product, as the one-shot
formula ``(X - mean) @ W.T`` does, rather than folding it into the shift: for data far from
the origin (pixels in 0..255) the folded form would lose the float32 precision to
cancellation. Hashers that accept scipy.sparse input fold their mean into ``shift`` and pass
``mean=None`` (a sparse matrix minus a mean is dense).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from sklearn.utils import assert_all_finite

from hashlearn.hashers._csr_product import csr_dense_product

__all__ = ["LinearForm", "block_rows", "blas_threads"]

#: Memory one block touches (its rows of X, their centred copy, scores and bits) when BLAS
#: runs on one thread: small enough to stay in cache between the finiteness check, the
#: centring and the product.
BLOCK_BYTES = 2 * 2**20
#: The same per BLAS thread when BLAS runs on several: each call then needs enough work to
#: amortise its thread synchronisation (measured, 2 threads, 100k x 784 float32 rows on a
#: busy 2-core machine: 2 MiB blocks took 6-9x the CPU time of one thread, 16 MiB 1.4x).
BLOCK_BYTES_PER_BLAS_THREAD = 8 * 2**20
#: Fewest rows in a block, so that each BLAS call stays efficient on small budgets.
MIN_BLOCK_ROWS = 256


@functools.cache
def _blas_controller():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().select(user_api="blas")


def blas_threads() -> int:
    """Threads the BLAS libraries of this process use now (the most of them); follows
    ``threadpoolctl.threadpool_limits``."""
    return max((info["num_threads"] for info in _blas_controller().info()), default=1)


def block_rows(n_rows: int, bytes_per_row: int, input_bytes: int, threads: int = 1) -> int:
    """Rows per block: within :data:`BLOCK_BYTES` (one BLAS thread) or
    ``threads * BLOCK_BYTES_PER_BLAS_THREAD`` and within 5 % of the input's size, whichever is
    smaller (the other 5 % of the 10 % target are left to the cast weights), but at least
    :data:`MIN_BLOCK_ROWS` (and at most ``n_rows``, at least 1)."""
    per_call = BLOCK_BYTES if threads <= 1 else threads * BLOCK_BYTES_PER_BLAS_THREAD
    budget = min(per_call, input_bytes // 20)
    rows = max(MIN_BLOCK_ROWS, budget // max(1, bytes_per_row))
    return max(1, min(n_rows, rows))


def _input_bytes(X) -> int:
    if sp.issparse(X):
        return X.data.nbytes + X.indices.nbytes + X.indptr.nbytes
    return X.nbytes


@dataclass(frozen=True)
class LinearForm:
    """Scores ``(X - mean) @ weights.T + shift`` of a fitted linear hasher; bits are
    ``scores >= 0``.

    Parameters
    ----------
    weights : ndarray (n_bits, n_features), float64
    mean : ndarray (n_features,) or None
        Subtracted from every row before the product (dense input only); None: no centring.
    shift : ndarray (n_bits,) or None
        Added to the products; None: zero.
    """

    weights: np.ndarray
    mean: np.ndarray | None = None
    shift: np.ndarray | None = None
    #: ``weights.T`` C-ordered in the input's dtype, for sparse input (see ``_blocks``)
    weights_t: np.ndarray | None = None

    @property
    def n_bits(self) -> int:
        return self.weights.shape[0]

    def _blocks(self, X, dtype, scores_per_row_bytes: int, check_finite: str | None = None):
        """Yield ``(start, stop, products)``: ``(X[start:stop] - mean) @ weights.T`` in
        ``dtype``, one block at a time (the arrays are reused between blocks).

        ``check_finite``: the estimator's name, to check each block for NaN and infinity
        while it is in cache (one ``sum`` per block; finite unless a value is not, or the sum
        overflows, and then the exact check decides); None: ``X`` was checked already.
        """
        n, d = X.shape
        if sp.issparse(X) and X.format != "csr":
            X = sp.csr_matrix(X)
        weights_t = self.weights.astype(dtype, copy=False).T
        mean = self.mean
        if mean is not None and sp.issparse(X):
            raise TypeError("a LinearForm with a mean needs dense input; fold it into shift.")
        itemsize = np.dtype(dtype).itemsize
        input_bytes = _input_bytes(X)
        per_row = scores_per_row_bytes + input_bytes // max(1, n)
        per_row += 0 if mean is None else d * itemsize
        rows = block_rows(n, per_row, input_bytes, 1 if sp.issparse(X) else blas_threads())
        if mean is not None:
            mean = mean.astype(dtype, copy=False)
            centred = np.empty((rows, d), dtype)
        products = np.empty((rows, self.n_bits), dtype)
        sparse = sp.issparse(X)
        for start in range(0, n, rows):
            stop = min(n, start + rows)
            # the block's rows (a view), or of a CSR matrix their values (read in place)
            block = X.data[X.indptr[start] : X.indptr[stop]] if sparse else X[start:stop]
            if check_finite is not None:
                with np.errstate(over="ignore", invalid="ignore"):
                    total = block.sum()
                if not np.isfinite(total):
                    assert_all_finite(block, estimator_name=check_finite, input_name="X")
            if sparse:  # scipy's arithmetic, in place (see hashlearn.hashers._csr_product)
                dense = self.weights_t if self.weights_t is not None else weights_t
                dense = np.ascontiguousarray(dense, dtype=dtype)
                csr_dense_product(X, start, stop, dense, products)
                yield start, stop, products[: stop - start]
                continue
            if mean is not None:
                block = np.subtract(block, mean, out=centred[: stop - start], dtype=dtype)
            elif block.dtype != dtype:
                block = block.astype(dtype)
            yield start, stop, np.matmul(block, weights_t, out=products[: stop - start])

    def encode(self, X, check_finite: str | None = None) -> np.ndarray:
        """Packed codes ``uint8 (n, ceil(n_bits / 8))`` of validated ``X`` (float32 or float64,
        dense or CSR), computed in the precision of ``X``. ``check_finite``: see ``_blocks``."""
        dtype = X.dtype
        b = self.n_bits
        thresholds = np.zeros(b) if self.shift is None else -self.shift
        thresholds = thresholds.astype(dtype)
        codes = np.empty((X.shape[0], (b + 7) // 8), np.uint8)
        bits = None
        per_row = b * (dtype.itemsize + 1)
        for start, stop, products in self._blocks(X, dtype, per_row, check_finite):
            if bits is None:
                bits = np.empty(products.shape, np.bool_)
            block_bits = np.greater_equal(products, thresholds, out=bits[: stop - start])
            codes[start:stop] = np.packbits(block_bits, axis=1, bitorder="little")
        return codes

    def project(self, X) -> np.ndarray:
        """Scores ``float64 (n, n_bits)`` of validated ``X``, computed in float64."""
        scores = np.empty((X.shape[0], self.n_bits))
        for start, stop, products in self._blocks(X, np.float64, self.n_bits * 8):
            scores[start:stop] = products
        if self.shift is not None:
            scores += self.shift
        return scores

"""A bucket-norm sketch of sparse vectors: a few hundred 12-bit codes per vector whose
distances bound Euclidean distances from below, for screening CSR re-ranking candidates
(:func:`hashlearn.rerank._csr_kernels.csr_sketch_kernel`).

The columns are dealt into ``w`` buckets, in descending order of their frequency in the
database and round robin, so the most frequent columns each lead a bucket of their own. A
vector ``x`` maps to its bucket norms, ``f(x)_b = |x restricted to bucket b|``. The reverse
triangle inequality in each bucket, ``| |q_b| - |x_b| | <= |q_b - x_b|``, makes ``f`` a
contraction: ``|f(q) - f(x)| <= |q - x|``. That is the lower-bounding lemma of Faloutsos,
Ranganathan & Manolopoulos, "Fast Subsequence Matching in Time-Series Databases" (SIGMOD
1994): a search may discard a candidate whose sketch distance already exceeds the k-th
exact distance, and lose nothing.

Tags. A bucket with one non-zero column carries that column's 4-bit tag (its round in the
deal, modulo 15; ``NO_TAG`` for several columns). Where both vectors have one column in a
bucket and the tags differ, the columns differ, the two parts are orthogonal and the bucket
adds ``|q_b|^2 + |x_b|^2`` -- not just ``(|q_b| - |x_b|)^2`` -- which is still at most
``|q_b - x_b|^2``. Written as the distance of ``(f(q)_D, 0, f(q)_rest)`` and ``(0,
f(x)_D, f(x)_rest)`` (``D`` the buckets whose tags differ), this is again a contraction of
the bucket norms, so the error bounds below carry over unchanged. On the bag-of-patches
histograms 92 % of the non-empty buckets hold one column, and the tags halve the
candidates left to score exactly (below).

The bucket norms are kept as 12-bit codes (:func:`hashlearn.rerank._quantized.quantize_row`, one
step from 0 to the largest norm), the tag in the top 4 bits of each uint16, so the sketch
distance is an exact integer sum (:func:`hashlearn.rerank._quantized.tagged_sqdist`). Each
vector's error bound covers both the quantization and the float64 rounding of its norms, so
``|q - x| >= step sqrt(S) - err_q - err_x`` holds for the real numbers.

Width: ``w`` is four times the database's mean number of non-zeros per row (rounded up to a
multiple of 32, within 64..1024): two bytes a code, two thirds of a float64 CSR row's
memory. Measured on the bag-of-patches Fashion-MNIST histograms (56 non-zeros a row, 1000
Hamming candidates, k = 10), the candidates whose bound still reaches the 10th distance,
without tags: 107 at 128 buckets, 43 at 256 and 27 at 384 (8-bit codes at 256 buckets left
175); in the kernel, with tags, 22 exact scores a query at 256 buckets instead of 49, 31 at
192 and 57 at 128 (their times within noise of each other from 192 up).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from hashlearn.rerank._quantized import (
    COLUMN_BLOCK,
    MAX_WIDE_COLUMNS,
    NO_TAG,
    WIDE_LEVELS,
    quantize_row,
)

__all__ = ["Sketch", "build_sketch", "sketch_rows", "sketch_width"]

_U64 = 2.0**-53
_UNDERFLOW_ROOT = 2.0**-536  # root of twice float64's smallest subnormal
_MIN_WIDTH = 64
_MAX_WIDTH = 1024
_CHUNK = 4096  # rows sketched at a time (a float64 block of 4096 x w)
_EMPTY = 255  # the tag of a bucket no non-zero has reached yet
assert _MAX_WIDTH <= MAX_WIDE_COLUMNS


class Sketch(NamedTuple):
    """The sketch of a CSR matrix (see the module docstring)."""

    bucket_of: np.ndarray  # (n_cols,) int32: each column's bucket
    tag_of: np.ndarray  # (n_cols,) uint8: each column's tag within its bucket, < NO_TAG
    codes: np.ndarray  # (n, w) uint16: code (0..WIDE_LEVELS) | tag << 12
    err: np.ndarray  # (n,) float64, >= |f(x) - step codes| (inf where x is not finite)
    code_sq: np.ndarray  # (n,) int64: sum of the squared codes (tags left out)
    step: float


def sketch_width(mean_nnz: float, n_cols: int) -> int:
    """Buckets for rows of ``mean_nnz`` non-zeros over ``n_cols`` columns: ``4 mean_nnz``
    rounded up to a multiple of ``COLUMN_BLOCK``, within 64..1024 and at most the columns
    (rounded up)."""
    want = -(-max(4.0 * mean_nnz, 1.0) // COLUMN_BLOCK) * COLUMN_BLOCK
    cols = -(-max(n_cols, 1) // COLUMN_BLOCK) * COLUMN_BLOCK
    return int(min(max(want, _MIN_WIDTH), _MAX_WIDTH, cols))


@njit(nogil=True, cache=True)
def _bucket_norms(
    data, indices, indptr, sketch_of, start, stop, out, tags, slack
):  # pragma: no cover
    """Rows ``start:stop`` into ``out`` (zeroed, one row each): their bucket norms, computed
    in float64, and into ``tags`` (filled with ``_EMPTY``) each bucket's tag: its one
    non-zero column's ``tag_of``, or ``NO_TAG`` for several (``sketch_of = (bucket_of,
    tag_of)``); ``slack`` gets a bound on each row's ``|f_computed - f|``. Every square and
    sum is exact to ``(n + 1) u`` relatively (``n`` the row's non-zeros, all terms are
    non-negative) and off by at most ``n 2^-1075`` where squares underflow; the root halves
    the relative error and adds ``u``: the bound below doubles that (``|f| = |x|``)."""
    bucket_of, tag_of = sketch_of
    for r in range(stop - start):
        row = start + r
        b0, b1 = indptr[row], indptr[row + 1]
        total = 0.0
        for t in range(b0, b1):
            x = np.float64(data[t])
            col = indices[t]
            b = bucket_of[col]
            out[r, b] += x * x
            total += x * x
            tags[r, b] = tag_of[col] if tags[r, b] == _EMPTY else NO_TAG
        for b in range(out.shape[1]):
            out[r, b] = np.sqrt(out[r, b])
        n = b1 - b0
        slack[r] = (n + 4.0) * _U64 * np.sqrt(total) * 1.01 + np.sqrt(n + 1.0) * _UNDERFLOW_ROOT
        if not total < np.inf:  # NaN or infinity: no bound
            slack[r] = np.inf


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def _sketch_rows(data, indices, indptr, sketch_of, step, codes, err, code_sq):  # pragma: no cover
    """Each CSR row's tagged codes, error bound and sum of squared codes into ``codes``,
    ``err`` and ``code_sq``, one row at a time: its bucket norms (:func:`_bucket_norms`)
    quantized on the grid ``0, step, ..`` (:func:`hashlearn.rerank._quantized.quantize_row`,
    norms above it clamped, their error counted), the tags in the top 4 bits."""
    width = codes.shape[1]
    norms = np.zeros((1, width))
    tags = np.empty((1, width), np.uint8)
    slack = np.empty(1)
    lo = np.zeros(width)
    for row in range(indptr.shape[0] - 1):
        norms[0, :] = 0.0
        tags[0, :] = _EMPTY
        _bucket_norms(data, indices, indptr, sketch_of, row, row + 1, norms, tags, slack)
        e, _ = quantize_row(norms, 0, lo, step, WIDE_LEVELS, codes, row)
        err[row] = (e + slack[0]) * (1.0 + 4.0 * _U64)
        total = 0
        for b in range(width):
            c = np.int64(codes[row, b])
            total += c * c
            tag = NO_TAG if tags[0, b] == _EMPTY else tags[0, b]
            codes[row, b] = c | (np.int64(tag) << 12)
        code_sq[row] = total


def sketch_rows(sketch: Sketch, data, indices, indptr) -> tuple[np.ndarray, ...]:
    """``(codes, err, code_sq)`` of the rows of the CSR arrays ``(data, indices, indptr)``
    (with the sketched matrix's columns) on ``sketch``'s buckets and grid; norms above the
    grid are clamped and their error counted; ``code_sq`` is each row's sum of squared
    codes (tags left out)."""
    n = len(indptr) - 1
    codes = np.empty((n, sketch.codes.shape[1]), np.uint16)
    err = np.empty(n)
    code_sq = np.empty(n, np.int64)
    sketch_of = (sketch.bucket_of, sketch.tag_of)
    _sketch_rows(data, indices, indptr, sketch_of, float(sketch.step), codes, err, code_sq)
    return codes, err, code_sq


def build_sketch(data, indices, indptr, n_cols: int) -> Sketch:
    """The sketch of the CSR matrix ``(data, indices, indptr)`` with ``n_cols`` columns
    (canonical: distinct column indices within a row)."""
    n = len(indptr) - 1
    width = sketch_width(len(indices) / max(n, 1), n_cols)
    counts = np.bincount(np.asarray(indices, np.int64), minlength=n_cols)
    rank = np.empty(n_cols, np.int64)
    rank[np.argsort(-counts, kind="stable")] = np.arange(n_cols)
    bucket_of = (rank % width).astype(np.int32)
    tag_of = ((rank // width) % NO_TAG).astype(np.uint8)
    none = np.empty(0)
    sketch = Sketch(bucket_of, tag_of, np.empty((0, width), np.uint16), none, none, 1.0)
    top = 0.0  # the largest finite bucket norm: the grid's end
    for start in range(0, n, _CHUNK):
        stop = min(n, start + _CHUNK)
        norms = np.zeros((stop - start, width))
        tags = np.full((stop - start, width), _EMPTY, np.uint8)
        slack = np.empty(stop - start)
        _bucket_norms(data, indices, indptr, (bucket_of, tag_of), start, stop, norms, tags, slack)
        finite = norms[np.isfinite(norms)]
        top = max(top, float(finite.max()) if finite.size else 0.0)
    step = top / WIDE_LEVELS
    if not (np.isfinite(step) and step > 2.0**-1000):  # empty, zero or subnormal: any step
        step = 1.0  # is valid (errors are measured), this one cannot overflow 1 / step
    sketch = sketch._replace(step=step)
    codes, err, code_sq = sketch_rows(sketch, data, indices, indptr)
    return sketch._replace(codes=codes, err=err, code_sq=code_sq)

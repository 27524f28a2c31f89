"""Block-wise encoding of linear hashers in the input's precision (hashers/_linear.py).

Exactness is tested on integer-valued data and weights, where every product and sum is exact
in float32 and float64 whatever the summation order, so the codes (ties at exactly 0
included) must equal the one-shot formula bit for bit. On real data (digits,
Fashion-MNIST) float32 codes must agree with the float64 codes on >= 99.9 % of the bits, and
every bit that differs must be a tie: a float64 score within the worst-case float32 rounding
bound of zero.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import unpack_le
from hashlearn.codes import pack_bits
from hashlearn.datasets import fashion_mnist_available, load_digits, load_fashion_mnist
from hashlearn.hashers import _linear
from hashlearn.hashers._linear import LinearForm, block_rows
from hashlearn.hashers.lsh import RandomHyperplaneLSH
from hashlearn.hashers.metric_lsh import MetricLSH
from hashlearn.hashers.mlh import MinimalLossHashing
from hashlearn.hashers.pca import IterativeQuantization, PCAHashing
from hashlearn.hashers.rank import RankHashing

EPS32 = float(np.finfo(np.float32).eps)


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 7 rows, so that every test crosses many block boundaries."""
    monkeypatch.setattr(_linear, "BLOCK_BYTES", 1)
    monkeypatch.setattr(_linear, "MIN_BLOCK_ROWS", 7)


def integer_problem(n=45, d=11, b=13, seed=0):
    """Small integers everywhere: every score is exact and many are exactly 0 (ties)."""
    rng = np.random.default_rng(seed)
    X = rng.integers(-3, 4, (n, d)).astype(np.float64)
    W = rng.integers(-2, 3, (b, d)).astype(np.float64)
    mean = rng.integers(-1, 2, d).astype(np.float64)
    shift = rng.integers(-2, 3, b).astype(np.float64)
    return X, W, mean, shift


def reference_codes(X, W, mean, shift):
    scores = (np.asarray(X, np.float64) - (0.0 if mean is None else mean)) @ W.T
    return pack_bits(scores + (0.0 if shift is None else shift) >= 0)


# ------------------------------------------------------------------ exact, block by block


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("use_mean", [True, False])
@pytest.mark.parametrize("use_shift", [True, False])
def test_blocks_give_the_one_shot_codes_exactly(small_blocks, dtype, use_mean, use_shift):
    X, W, mean, shift = integer_problem()
    mean = mean if use_mean else None
    shift = shift if use_shift else None
    form = LinearForm(W, mean=mean, shift=shift)
    expected = reference_codes(X, W, mean, shift)
    scores = (X - (0.0 if mean is None else mean)) @ W.T + (0.0 if shift is None else shift)
    assert np.mean(scores == 0) > 0.02  # the data does test the ties
    assert len(X) % 7 != 0  # the last block is partial
    np.testing.assert_array_equal(form.encode(X.astype(dtype)), expected)
    np.testing.assert_array_equal(form.project(X.astype(dtype)), scores)
    assert form.project(X.astype(dtype)).dtype == np.float64


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sparse_blocks_give_the_one_shot_codes_exactly(small_blocks, dtype):
    X, W, _, shift = integer_problem(seed=1)
    X[np.random.default_rng(1).random(X.shape) < 0.6] = 0.0
    X[3] = 0.0  # an all-zero row
    form = LinearForm(W, shift=shift)
    X_csr = sp.csr_matrix(X.astype(dtype))
    np.testing.assert_array_equal(form.encode(X_csr), reference_codes(X, W, None, shift))
    np.testing.assert_array_equal(form.project(X_csr), X @ W.T + shift)


def test_a_mean_needs_dense_input():
    X, W, mean, _ = integer_problem()
    with pytest.raises(TypeError, match="dense"):
        LinearForm(W, mean=mean).encode(sp.csr_matrix(X))


def test_empty_input_gives_empty_codes():
    _, W, mean, shift = integer_problem()
    form = LinearForm(W, mean=mean, shift=shift)
    assert form.encode(np.empty((0, W.shape[1]), np.float32)).shape == (0, 2)
    assert form.project(np.empty((0, W.shape[1]))).shape == (0, W.shape[0])


def _integer_hashers(X, W, mean, shift):
    """Each linear hasher, fitted, then given integer weights: its codes are known exactly."""
    d = X.shape[1]
    lsh = RandomHyperplaneLSH(n_bits=W.shape[0], random_state=0).fit(X)
    lsh.components_, lsh.mean_ = W, mean
    lsh.offset_ = W @ mean
    pca = PCAHashing(n_bits=min(W.shape[0], d)).fit(X)
    pca.components_, pca.mean_ = W[: pca.n_bits_], mean
    itq = IterativeQuantization(n_bits=min(W.shape[0], d), n_iter=2, random_state=0).fit(X)
    itq.components_, itq.mean_ = W[: itq.n_bits_], mean
    metric = MetricLSH.from_metric(G=np.eye(d), n_bits=W.shape[0], components=W, mean=mean)
    y = np.arange(len(X)) % 3
    mlh = MinimalLossHashing(n_bits=W.shape[0], n_epochs=0, random_state=0).fit(X, y)
    mlh.components_, mlh.offset_ = W, shift
    rank = RankHashing(n_bits=W.shape[0], n_epochs=1, docs_per_query=10, random_state=0)
    rank.fit(X, y)
    rank.weights_, rank.scale_, rank.mean_ = W.T, np.ones(d), mean
    rank.bias_ = shift + mean @ W.T  # so that its offset, bias_ - mean_ @ W.T, is shift
    return [
        (lsh, reference_codes(X, W, mean, None)),
        (pca, reference_codes(X, W[: pca.n_bits_], mean, None)),
        (itq, reference_codes(X, W[: itq.n_bits_], mean, None)),
        (metric, reference_codes(X, W, mean, None)),
        (mlh, reference_codes(X, W, None, shift)),
        (rank, reference_codes(X, W, None, shift)),
    ]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_every_linear_hasher_encodes_its_own_formula_exactly(small_blocks, dtype):
    X, W, mean, shift = integer_problem(n=60, d=11, b=9, seed=2)
    for hasher, expected in _integer_hashers(X, W, mean, shift):
        name = type(hasher).__name__
        got = hasher.encode(X.astype(dtype))
        np.testing.assert_array_equal(got, expected, err_msg=name)
        np.testing.assert_array_equal(
            pack_bits(hasher.project(X.astype(dtype)) >= 0), expected, err_msg=name
        )


# -------------------------------------------------- float32 agrees with float64 but at ties


def _float32_disagreements(hasher, X):
    """Fraction of bits where float32 and float64 codes differ; asserts that each one is a
    tie: its float64 score lies within the worst-case float32 rounding error of zero."""
    X32 = np.asarray(X, np.float32)
    X64 = X32.astype(np.float64)
    n_bits = hasher.n_bits_
    bits32 = unpack_le(hasher.encode(X32), n_bits).astype(bool)
    bits64 = unpack_le(hasher.encode(X64), n_bits).astype(bool)
    scores = hasher.project(X64)
    np.testing.assert_array_equal(bits64, scores >= 0)
    form = hasher._linear_form()
    W = form.weights
    centred = np.abs(X64 - (0.0 if form.mean is None else form.mean))
    shift = np.zeros(n_bits) if form.shift is None else np.abs(form.shift)
    # centring, d products and d - 1 sums in float32, rounding of the mean, W and the shift
    bound = (X.shape[1] + 4) * EPS32 * (centred @ np.abs(W).T) + EPS32 * shift
    if form.mean is not None:
        bound += (X.shape[1] + 4) * EPS32 * (np.abs(form.mean) @ np.abs(W).T)
    differ = bits32 != bits64
    assert np.all(np.abs(scores[differ]) <= bound[differ])
    return differ.mean()


def _hashers(X, n_bits, pca=True):
    yield RandomHyperplaneLSH(n_bits=n_bits, random_state=0).fit(X)
    yield RandomHyperplaneLSH(n_bits=n_bits, center=False, random_state=0).fit(X)
    if pca:
        yield PCAHashing(n_bits=n_bits).fit(X)
    yield IterativeQuantization(n_bits=n_bits, n_iter=20, random_state=0).fit(X)


def test_float32_codes_agree_with_float64_on_digits(small_blocks):
    X, _ = load_digits()
    for hasher in _hashers(X.astype(np.float64), 48):
        assert _float32_disagreements(hasher, X) <= 1e-3, type(hasher).__name__


def test_float32_codes_agree_with_float64_on_fashion_mnist():
    if not fashion_mnist_available():
        pytest.skip("Fashion-MNIST not installed")
    X, _ = load_fashion_mnist(subset="test")  # raw pixels 0..255: far from the origin
    train, test = X[:3000].astype(np.float64), X[5000:8000]
    # PCAHashing shares ITQ's arithmetic (centre, then project) and is checked on digits;
    # leaving it out here saves one 784 x 784 eigendecomposition
    for hasher in _hashers(train, 64, pca=False):
        assert _float32_disagreements(hasher, test) <= 1e-3, type(hasher).__name__


def test_sparse_float32_agrees_with_dense_float32_but_at_ties():
    rng = np.random.default_rng(4)
    X = rng.standard_normal((400, 50)) * (rng.random((400, 50)) < 0.2)
    h = RandomHyperplaneLSH(n_bits=40, random_state=0).fit(X)
    dense = unpack_le(h.encode(X.astype(np.float32)), 40)
    sparse = unpack_le(h.encode(sp.csr_matrix(X, dtype=np.float32)), 40)
    scores = h.project(X)
    bound = (50 + 4) * EPS32 * (np.abs(X) @ np.abs(h.components_).T + np.abs(h.offset_))
    differ = dense != sparse
    assert np.all(np.abs(scores[differ]) <= bound[differ])


# --------------------------------------------------------------------------- memory


def test_block_rows_stays_within_the_budget():
    assert block_rows(10**6, 3_000, 3 * 10**9) == _linear.BLOCK_BYTES // 3_000
    assert block_rows(10**6, 3_000, 10**6) == _linear.MIN_BLOCK_ROWS  # a tenth is < one row
    assert block_rows(100, 3_000, 3 * 10**9) == 100
    assert block_rows(0, 3_000, 0) == 1
    many = 4 * _linear.BLOCK_BYTES_PER_BLAS_THREAD // 3_000  # 4 BLAS threads: larger blocks
    assert block_rows(10**6, 3_000, 3 * 10**9, threads=4) == many
    assert block_rows(10**6, 3_000, 10**8, threads=4) == 10**8 // 20 // 3_000  # 5 % cap


def test_blas_threads_follows_threadpoolctl():
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"):
        assert _linear.blas_threads() == 1
    assert _linear.blas_threads() >= 1


@pytest.mark.parametrize("cls", [RandomHyperplaneLSH, IterativeQuantization])
def test_float32_encoding_allocates_less_than_a_tenth_of_the_input(cls):
    rng = np.random.default_rng(5)
    X = rng.standard_normal((20_000, 300), dtype=np.float32) + 2.0
    hasher = cls(n_bits=64, random_state=0).fit(X[:2000])
    hasher.encode(X[:10])  # warm up
    tracemalloc.start()
    try:
        codes = hasher.encode(X)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - codes.nbytes <= 0.1 * X.nbytes, (peak, X.nbytes)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_non_finite_values_in_any_block_are_refused(small_blocks, bad, dtype):
    X, W, mean, shift = integer_problem()
    for hasher, _ in _integer_hashers(X, W[:, : X.shape[1]], mean, shift):
        Y = X.astype(dtype)
        Y[-1, 2] = bad  # in the last, partial block
        with pytest.raises(ValueError, match="NaN|infinity"):
            hasher.encode(Y)
        if hasher.accept_sparse:
            with pytest.raises(ValueError, match="NaN|infinity"):
                hasher.encode(sp.csr_matrix(Y))


def test_a_sum_that_overflows_is_not_mistaken_for_infinity(small_blocks):
    X, W, _, shift = integer_problem()
    X[:, :2] = 3e38  # finite, but every block's float32 sum overflows
    W[:, :2] = 0.0  # and the scores stay exact
    codes = LinearForm(W, shift=shift).encode(X.astype(np.float32), check_finite="LinearForm")
    np.testing.assert_array_equal(codes, reference_codes(X, W, None, shift))


def test_sparse_encoding_keeps_one_transposed_copy_and_refreshes_it_on_refit():
    rng = np.random.default_rng(3)
    X = sp.random(60, 500, density=0.05, format="csr", random_state=3)
    lsh = RandomHyperplaneLSH(16, random_state=0).fit(X)
    first = lsh.encode(X)
    cached = lsh._weights_t_cache[1]
    assert cached.flags.c_contiguous and cached.shape == (500, 16)
    np.testing.assert_array_equal(lsh.encode(X), first)
    assert lsh._weights_t_cache[1] is cached  # reused, not copied again
    np.testing.assert_array_equal(first, lsh.encode(X.toarray()))
    lsh.fit(sp.csr_matrix(rng.standard_normal((60, 500))))  # new weights: new copy
    np.testing.assert_array_equal(lsh.encode(X), lsh.encode(X.toarray()))
    assert lsh._weights_t_cache[0] is lsh.components_
    assert lsh._weights_t_cache[1] is not cached

"""Issue 12: every unsupervised hasher, with its defaults, gives codes at least as good as
``RandomHyperplaneLSH`` (its defaults: orthogonal directions) at the same number of bits, on
the data its docstring says it is for.

Measure: recall of the 50 Euclidean nearest neighbours among the first ``M`` items of the
Hamming ranking (random tie-breaking, survey Fig. 11), averaged over 300 (digits) or 200
(Fashion-MNIST) held-out queries and, for randomised hashers, over three seeds. Each claim
holds with a margin: the hasher's mean must beat LSH's mean plus ``margin``; the margins are
about a third of the gaps measured when this file was written (in the comments).

Where a docstring scopes its hasher (PCA hashing and spectral hashing: short codes; kernelized
LSH: high-dimensional data), the test uses that scope; where a hasher does not beat LSH on
Euclidean neighbours at all (SIKH), a strict ``xfail`` records the measured loss, so the
day it starts winning the test says so.
"""

from __future__ import annotations

import numpy as np
import pytest

from hashlearn.codes import hamming_cdist
from hashlearn.datasets import fashion_mnist_available, load_digits, load_fashion_mnist
from hashlearn.evaluate import exact_knn, recall_at_m
from hashlearn.hashers import (
    IterativeQuantization,
    KernelizedLSH,
    PCAHashing,
    RandomHyperplaneLSH,
    RBMHashing,
    ShiftInvariantKernelHashing,
    SpectralHashing,
)

SEEDS = (0, 1, 2)


def _split(X, n_queries, seed=0):
    perm = np.random.RandomState(seed).permutation(len(X))
    return X[perm[n_queries:]], X[perm[:n_queries]], perm


def _recall(cls, X_db, X_q, true_nn, n_bits, m, **params):
    # PCA hashing and spectral hashing are deterministic; ITQ's seed only starts its
    # rotation (measured spread across seeds < 0.005): one fit each keeps the file quick
    seeds = SEEDS if cls in (RandomHyperplaneLSH, KernelizedLSH) else SEEDS[:1]
    values = []
    for seed in seeds:
        h = cls(n_bits=n_bits, random_state=seed, **params).fit(X_db)
        D = hamming_cdist(h.encode(X_q), h.encode(X_db), h.n_bits_)
        values.append(recall_at_m(D, true_nn, [m], random_state=seed)[0])
    return float(np.mean(values))


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits()
    X_db, X_q, _ = _split(X.astype(np.float64), 300)
    _, true_nn = exact_knn(X_db, X_q, 50)
    return X_db, X_q, true_nn


@pytest.fixture(scope="module")
def fashion():
    if not fashion_mnist_available():
        pytest.skip("Fashion-MNIST is not installed")
    X, _ = load_fashion_mnist(subset="train")
    X_db, X_q, _ = _split(X[:3200].astype(np.float64), 200)
    _, true_nn = exact_knn(X_db, X_q, 50)
    return X_db, X_q, true_nn


# (hasher, bits, M, margin); measured means in the comments (hasher vs LSH)
DIGITS_CASES = [
    (IterativeQuantization, 16, 500, 0.03),  # 0.988 vs 0.916
    (IterativeQuantization, 32, 500, 0.005),  # 0.996 vs 0.976
    (PCAHashing, 8, 500, 0.04),  # 0.923 vs 0.800 (short codes: its docstring's scope)
    (PCAHashing, 16, 500, 0.0),  # 0.925 vs 0.916
    (SpectralHashing, 8, 500, 0.04),  # 0.918 vs 0.800 (short codes)
    (SpectralHashing, 16, 500, 0.01),  # 0.950 vs 0.916
]


@pytest.mark.parametrize("cls, n_bits, m, margin", DIGITS_CASES)
def test_defaults_beat_lsh_on_digits(digits, cls, n_bits, m, margin):
    X_db, X_q, true_nn = digits
    ours = _recall(cls, X_db, X_q, true_nn, n_bits, m)
    lsh = _recall(RandomHyperplaneLSH, X_db, X_q, true_nn, n_bits, m)
    assert ours >= lsh + margin, (cls.__name__, n_bits, ours, lsh)


FASHION_CASES = [
    (IterativeQuantization, 32, 150, 0.06),  # 0.740 vs 0.539 (5,700 items)
    (PCAHashing, 16, 150, 0.05),  # 0.551 vs 0.376
    (SpectralHashing, 32, 150, 0.04),  # 0.673 vs 0.539
    (KernelizedLSH, 32, 150, 0.04),  # 0.693 vs 0.539 (784-d: its docstring's scope)
    (KernelizedLSH, 64, 150, 0.03),  # 0.814 vs 0.694
]


@pytest.mark.slow
@pytest.mark.parametrize("cls, n_bits, m, margin", FASHION_CASES)
def test_defaults_beat_lsh_on_fashion_mnist(fashion, cls, n_bits, m, margin):
    X_db, X_q, true_nn = fashion
    ours = _recall(cls, X_db, X_q, true_nn, n_bits, m)
    lsh = _recall(RandomHyperplaneLSH, X_db, X_q, true_nn, n_bits, m)
    assert ours >= lsh + margin, (cls.__name__, n_bits, ours, lsh)


@pytest.mark.xfail(
    strict=True,
    reason="measured: SIKH's defaults lose to LSH on Euclidean neighbours at every code "
    "length tried (digits, recall of 50-NN in the top 150: 0.614 vs 0.823 at 32 bits, "
    "0.940 vs 0.991 at 256 bits; no gamma in 0.25-16 x 1/median fixes it). Its docstring "
    "says so.",
)
def test_sikh_defaults_beat_lsh_at_long_codes_on_digits(digits):
    X_db, X_q, true_nn = digits
    ours = _recall(ShiftInvariantKernelHashing, X_db, X_q, true_nn, 256, 150)
    lsh = _recall(RandomHyperplaneLSH, X_db, X_q, true_nn, 256, 150)
    assert ours >= lsh


@pytest.mark.xfail(
    strict=True,
    reason="measured: on 64-d digits KLSH (rbf, defaults) loses to orthogonal LSH (recall "
    "of 50-NN in the top 150 at 32 bits: 0.783 vs 0.823; 0.804 for Gaussian LSH); its "
    "docstring scopes it to high-dimensional or non-vector data.",
)
def test_klsh_defaults_beat_lsh_on_low_dimensional_digits(digits):
    X_db, X_q, true_nn = digits
    ours = _recall(KernelizedLSH, X_db, X_q, true_nn, 32, 150)
    lsh = _recall(RandomHyperplaneLSH, X_db, X_q, true_nn, 32, 150)
    assert ours >= lsh


@pytest.mark.slow
def test_rbm_defaults_beat_lsh_on_label_retrieval_digits():
    """RBMHashing is semantic hashing fine-tuned by NCA on labels (its docstring): with
    labels, its codes retrieve same-class items better than LSH's (mean precision of the
    first 50 Hamming neighbours)."""
    from hashlearn.evaluate import hamming_ranking

    X, y = load_digits()
    X = X.astype(np.float64)
    perm = np.random.RandomState(0).permutation(len(X))
    q, db = perm[:300], perm[300:]

    def precision(h):
        D = hamming_cdist(h.encode(X[q]), h.encode(X[db]), h.n_bits_)
        top = hamming_ranking(D, 50, random_state=0)
        return float(np.mean(y[db][top] == y[q][:, None]))

    rbm = precision(RBMHashing(n_bits=32, random_state=0).fit(X[db], y[db]))
    lsh = np.mean([precision(RandomHyperplaneLSH(32, random_state=s).fit(X[db])) for s in SEEDS])
    assert rbm >= lsh + 0.03, (rbm, lsh)

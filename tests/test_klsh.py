"""KernelizedLSH: LSH collision law with a linear kernel, kernels, bad input, real data."""

import os

import numpy as np
import pytest
from sklearn.metrics.pairwise import rbf_kernel

from hashlearn.codes import hamming_cdist, unpack_bits
from hashlearn.datasets import fashion_mnist_available, load_fashion_mnist
from hashlearn.evaluate import exact_knn, recall_at_m
from hashlearn.hashers.klsh import KernelizedLSH
from hashlearn.hashers.lsh import RandomHyperplaneLSH
from hashlearn.io import load
from hashlearn.kernels import intersection_kernel, kernel_matrix

# Fashion-MNIST from the Debian path, or a directory of IDX files named by this variable.
FASHION_DIR = os.environ.get("HASHLEARN_FASHION_MNIST_DIR") or None


def _anisotropic(n, seed=0):
    rng = np.random.RandomState(seed)
    return rng.standard_normal((n, 5)) * np.array([3.0, 2.0, 1.0, 0.7, 0.5]) + 4.0


def test_linear_kernel_matches_hyperplane_lsh_collision_probability():
    """Linear-kernel KLSH bits collide with probability 1 - theta/pi (eq. 6), like LSH."""
    X = _anisotropic(3000)
    mean = X.mean(0)
    n_bits = 3000
    klsh = KernelizedLSH(n_bits, kernel="linear", p=300, t=30, random_state=0).fit(X)
    lsh = RandomHyperplaneLSH(n_bits, center=True, random_state=0).fit(X)
    rng = np.random.RandomState(1)
    for _ in range(4):
        a, b = X[rng.choice(len(X), 2, replace=False)]
        ca, cb = a - klsh.sample_.mean(0), b - klsh.sample_.mean(0)
        theta = np.arccos(np.clip(ca @ cb / np.linalg.norm(ca) / np.linalg.norm(cb), -1, 1))
        expected = 1 - theta / np.pi
        bits_k = unpack_bits(klsh.encode(np.stack([a, b])), n_bits)
        bits_l = unpack_bits(lsh.encode(np.stack([a + 0 * mean, b])), n_bits)
        freq_k = (bits_k[0] == bits_k[1]).mean()
        freq_l = (bits_l[0] == bits_l[1]).mean()
        sd = np.sqrt(expected * (1 - expected) / n_bits)
        # binomial tolerance + the CLT / sampled-covariance approximation of KLSH (footnote 8)
        assert abs(freq_k - expected) <= 4.5 * sd + 0.03, (freq_k, expected)
        assert abs(freq_k - freq_l) <= 4.5 * np.sqrt(2) * sd + 0.04, (freq_k, freq_l)


def test_bits_balanced_and_deterministic():
    X = _anisotropic(1000)
    a = KernelizedLSH(64, p=200, t=20, random_state=3).fit(X).encode(X)
    b = KernelizedLSH(64, p=200, t=20, random_state=3).fit(X).encode(X)
    np.testing.assert_array_equal(a, b)
    bits = unpack_bits(a, 64)
    assert 0.2 < bits.mean() < 0.8


def test_precomputed_equals_named_kernel():
    X = _anisotropic(400)
    named = KernelizedLSH(32, kernel="rbf", gamma=0.05, p=100, t=10, random_state=0).fit(X)
    K = rbf_kernel(X, X, gamma=0.05)
    pre = KernelizedLSH(32, kernel="precomputed", p=100, t=10, random_state=0).fit(K)
    Q = _anisotropic(50, seed=9)
    np.testing.assert_allclose(
        pre.project(rbf_kernel(Q, X, gamma=0.05)), named.project(Q), rtol=1e-6, atol=1e-8
    )


def test_callable_kernel_on_sets_and_histogram_kernels():
    rng = np.random.RandomState(0)
    sets = [frozenset(rng.choice(50, 8, replace=False).tolist()) for _ in range(60)]

    def jaccard(a, b):
        return len(a & b) / len(a | b)

    h = KernelizedLSH(16, kernel=jaccard, p=40, t=8, random_state=0).fit(sets)
    codes = h.encode(sets[:5])
    assert codes.shape == (5, 2)
    # identical sets hash identically; the code is a function of the set
    np.testing.assert_array_equal(h.encode([sets[0]]), codes[:1])
    with pytest.raises(TypeError, match="callable kernel"):
        h.save("unused")
    H = np.abs(_anisotropic(200))
    for kernel in ("chi2", "intersection"):
        assert KernelizedLSH(8, kernel=kernel, p=50, t=5, random_state=0).fit(H).encode(
            H
        ).shape == (200, 1)
    np.testing.assert_allclose(
        intersection_kernel(H[:3], H[:4]), [[np.minimum(a, b).sum() for b in H[:4]] for a in H[:3]]
    )


def test_bad_input():
    X = _anisotropic(100)
    with pytest.warns(UserWarning, match=r"p \(200\) is greater than the total number"):
        h = KernelizedLSH(8, p=200, t=30, random_state=0).fit(X)
    assert (h.p_, h.t_) == (100, 15) and h.weights_.shape == (100, 8)
    with pytest.raises(ValueError, match="n_samples=1"):
        KernelizedLSH(8).fit(X[:1])
    with pytest.raises(ValueError, match="'t' parameter"):
        KernelizedLSH(8, p=50, t=60).fit(X)
    with pytest.raises(ValueError, match="'kernel' parameter"):
        KernelizedLSH(8, kernel="poly", p=50, t=5).fit(X)
    items = list(range(30))
    with pytest.raises(ValueError, match="not symmetric"):
        KernelizedLSH(8, kernel=lambda a, b: float(a - b) ** 2 + a, p=20, t=5).fit(items)
    with pytest.raises(ValueError, match="NaN"):
        KernelizedLSH(8, kernel=lambda a, b: float("nan"), p=20, t=5).fit(items)
    K = rbf_kernel(X, X)
    K[0, 1] += 1.0
    with pytest.raises(ValueError, match="not symmetric"):
        KernelizedLSH(8, kernel="precomputed", p=50, t=5, random_state=0).fit(K)
    with pytest.raises(ValueError, match="non-negative"):
        KernelizedLSH(8, kernel="chi2", p=50, t=5).fit(X - 10)
    with pytest.raises(ValueError, match="NaN"):
        KernelizedLSH(8, p=50, t=5).fit(np.where(X > 5, np.nan, X))
    fitted = KernelizedLSH(8, kernel="precomputed", p=50, t=5).fit(rbf_kernel(X, X))
    with pytest.raises(ValueError, match="columns"):
        fitted.encode(rbf_kernel(X, X[:10]))


def test_save_load_roundtrip(tmp_path):
    X = _anisotropic(300)
    h = KernelizedLSH(24, p=100, t=10, random_state=0).fit(X)
    h.save(tmp_path / "klsh")
    again = load(tmp_path / "klsh")
    np.testing.assert_array_equal(again.encode(X), h.encode(X))
    assert kernel_matrix(X[:2], X[:3], "linear").shape == (2, 3)


@pytest.mark.skipif(not fashion_mnist_available(FASHION_DIR), reason="Fashion-MNIST not installed")
def test_rbf_klsh_beats_lsh_on_euclidean_recall_fashion_mnist():
    """Survey §4.3 / issue 7: KLSH-RBF > LSH on Euclidean recall@500 (50 NN), 32 bits."""
    X, _ = load_fashion_mnist(FASHION_DIR, subset="train")
    rng = np.random.RandomState(0)
    idx = rng.choice(len(X), 4100, replace=False)
    X = X[idx].astype(np.float64) / 255.0
    db, q = X[:4000], X[4000:]
    _, true = exact_knn(db, q, 50)
    scores = {}
    for name, h in (
        ("klsh", KernelizedLSH(32, p=300, t=30, random_state=0)),
        ("lsh", RandomHyperplaneLSH(32, random_state=0)),
    ):
        h.fit(db)
        d = hamming_cdist(h.encode(q), h.encode(db), 32)
        scores[name] = recall_at_m(d, true, [500])[0]
    assert scores["klsh"] > scores["lsh"] + 0.02, scores


def test_verbose_logs_the_fit(capsys, stderr_logging):
    X = _anisotropic(100)
    KernelizedLSH(8, p=50, t=5, random_state=0).fit(X)
    assert capsys.readouterr().err == ""
    KernelizedLSH(8, p=50, t=5, random_state=0, verbose=True).fit(X)
    err = capsys.readouterr().err
    assert "p=50 sampled items" in err and "eigendecomposition of the 50 x 50" in err

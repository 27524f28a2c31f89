"""Unsupervised code baselines: PCAHashing, IterativeQuantization, SpectralHashing,
ShiftInvariantKernelHashing -- models checked against independent numpy/scikit-learn
references, collision probabilities with binomial tolerances, orderings on digits."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.decomposition import PCA

from conftest import brute_distances, unpack_le
from hashlearn.hashers.base import available_hashers, make_hasher
from hashlearn.hashers.pca import IterativeQuantization, PCAHashing
from hashlearn.hashers.sikh import ShiftInvariantKernelHashing, sikh_collision_probability
from hashlearn.hashers.spectral import SpectralHashing
from hashlearn.io import load

ALL = [
    (PCAHashing, {}),
    (IterativeQuantization, {"random_state": 0}),
    (SpectralHashing, {}),
    (ShiftInvariantKernelHashing, {"random_state": 0}),
]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((12, 12))
    X = rng.standard_normal((300, 12)) @ A + 3.0
    Y = rng.standard_normal((50, 12)) @ A + 3.0
    return X, Y


@pytest.fixture(scope="module")
def digits():
    from hashlearn.datasets import load_digits

    X, y = load_digits()[:2]
    X = np.asarray(X, dtype=np.float64)
    return X, np.asarray(y)


def test_registered_names():
    names = available_hashers()
    assert names["pca"] is PCAHashing
    assert names["itq"] is IterativeQuantization
    assert names["spectral"] is SpectralHashing
    assert names["sikh"] is ShiftInvariantKernelHashing
    assert isinstance(make_hasher("itq", n_bits=4), IterativeQuantization)


@pytest.mark.parametrize("cls,kw", ALL)
@pytest.mark.parametrize("n_bits", [1, 7, 9, 12])
def test_layout_determinism_and_roundtrip(cls, kw, n_bits, data, tmp_path):
    X, Y = data
    h = cls(n_bits=n_bits, **kw).fit(X)
    codes = h.encode(Y)
    assert codes.dtype == np.uint8 and codes.shape == (len(Y), math.ceil(n_bits / 8))
    np.testing.assert_array_equal(unpack_le(codes, n_bits), h.project(Y) >= 0)
    np.testing.assert_array_equal(cls(n_bits=n_bits, **kw).fit(X).encode(Y), codes)
    h.save(tmp_path / "h")
    back = cls.load(tmp_path / "h")
    np.testing.assert_array_equal(back.encode(Y), codes)
    assert type(load(tmp_path / "h")) is cls
    assert back.get_params() == h.get_params()


@pytest.mark.parametrize("cls", [PCAHashing, IterativeQuantization])
def test_more_bits_than_dimensions_is_clipped_with_a_warning(cls, data):
    X, Y = data
    d = X.shape[1]
    with pytest.warns(UserWarning, match=r"n_bits \(13\) is greater than min\(n_samples"):
        h = cls(n_bits=13, random_state=0).fit(X)
    assert h.n_bits == 13 and h.n_bits_ == d
    assert h.encode(Y).shape == (len(Y), math.ceil(d / 8))
    # the clipped code is the code asked for at n_bits = d
    np.testing.assert_array_equal(h.encode(Y), cls(n_bits=d, random_state=0).fit(X).encode(Y))
    with pytest.warns(UserWarning, match="n_bits_=5"):
        small = cls(n_bits=6).fit(X[:5])
    assert small.n_bits_ == 5 and small.project(Y).shape == (len(Y), 5)


def test_pca_hashing_takes_random_state():
    from hashlearn.hashers import make_hasher

    X = np.random.RandomState(0).randn(40, 8)
    a = make_hasher("pca", n_bits=4, random_state=0).fit(X).encode(X)
    np.testing.assert_array_equal(a, make_hasher("pca", n_bits=4, random_state=1).fit(X).encode(X))


def test_pca_hashing_matches_sklearn_pca(data):
    X, Y = data
    h = PCAHashing(n_bits=6).fit(X)
    ref = PCA(n_components=6, svd_solver="full").fit(X)
    # same subspace and variances; each direction equal up to sign
    np.testing.assert_allclose(h.explained_variance_, ref.explained_variance_, rtol=1e-8)
    dots = np.abs(np.sum(h.components_ * ref.components_, axis=1))
    np.testing.assert_allclose(dots, 1.0, atol=1e-8)
    signs = np.sign(np.sum(h.components_ * ref.components_, axis=1))
    np.testing.assert_allclose(h.project(Y), ref.transform(Y) * signs, atol=1e-8)


def test_itq_rotation_is_orthogonal_and_lowers_quantization_loss(data):
    X, _ = data
    h = IterativeQuantization(n_bits=8, n_iter=40, random_state=1).fit(X)
    R = h.rotation_
    np.testing.assert_allclose(R @ R.T, np.eye(8), atol=1e-10)
    loss = h.quantization_loss_
    assert np.all(np.diff(loss) <= 1e-9 * loss[0]), "ITQ loss must not increase"
    # the learned rotation quantizes better than plain PCA (R = I)
    V = h.project(X) @ R.T  # back to the unrotated PCA coordinates
    pca_loss = np.sum((np.where(V >= 0, 1.0, -1.0) - V) ** 2) / len(X)
    assert loss[-1] < pca_loss
    # the rotated projection is the PCA projection times R
    np.testing.assert_allclose(h.project(X), PCAHashing(8).fit(X).project(X) @ R, atol=1e-8)


def test_spectral_hashing_model(data):
    X, Y = data
    h = SpectralHashing(n_bits=20).fit(X)
    # independent oracle: enumerate (direction, mode) pairs, keep the 20 lowest frequencies
    ref = PCA(n_components=12, svd_solver="full").fit(X)
    V = ref.transform(X)
    width = V.max(0) - V.min(0)
    cands = sorted((m * np.pi / width[k], k, m) for k in range(12) for m in range(1, 21))[:20]
    np.testing.assert_allclose(np.sort(h.frequency_), [c[0] for c in cands], rtol=1e-8)
    VY = ref.transform(Y)
    signs = np.sign(np.sum(h.components_ * ref.components_, axis=1))
    Vs, VYs = V * signs, VY * signs
    expected = np.stack(
        [np.sin(np.pi / 2 + f * (VYs[:, k] - Vs[:, k].min())) for f, k, _ in cands], axis=1
    )
    order = np.lexsort((h.direction_, h.frequency_))
    np.testing.assert_allclose(h.project(Y)[:, order], expected, atol=1e-7)
    # the first bit of each used direction splits the box in half (mode 1): balanced-ish
    bits = unpack_le(h.encode(X), 20)
    assert np.all(bits.mean(0) > 0.05) and np.all(bits.mean(0) < 0.95)


def test_spectral_hashing_long_directions_get_more_bits():
    rng = np.random.default_rng(3)
    X = rng.uniform(0, 1, (2000, 2)) * [8.0, 1.0]  # a long thin box
    h = SpectralHashing(n_bits=6).fit(X)
    # the long side (PCA direction 0) has frequencies pi m / 8 < pi: all 6 bits go there
    assert np.all(h.direction_ == 0)
    np.testing.assert_allclose(np.sort(h.frequency_) * 8.0 / np.pi, np.arange(1, 7), rtol=0.02)


def test_sikh_collision_probability_matches_theory():
    rng = np.random.default_rng(5)
    d, n_bits = 5, 4000
    x = rng.standard_normal(d)
    gamma = 0.3
    h = ShiftInvariantKernelHashing(n_bits=n_bits, gamma=gamma, random_state=2).fit(
        np.stack([x, x + 1.0])
    )
    for scale in (0.3, 1.0, 2.0):
        y = x + scale * rng.standard_normal(d) / np.sqrt(d)
        kern = math.exp(-gamma * np.sum((x - y) ** 2))
        p = float(sikh_collision_probability(kern))
        bits = unpack_le(h.encode(np.stack([x, y])), n_bits)
        agree = int(np.sum(bits[0] == bits[1]))
        sd = math.sqrt(n_bits * p * (1 - p))
        assert abs(agree - n_bits * p) < 5 * sd, (scale, agree / n_bits, p)
    # the theoretical curve is monotone in the kernel value, 1 at identity
    vals = sikh_collision_probability(np.linspace(0, 1, 11))
    assert np.all(np.diff(vals) > 0) and abs(vals[-1] - 1.0) < 1e-12


def test_sikh_gamma_default_and_validation(data):
    X, _ = data
    h = ShiftInvariantKernelHashing(n_bits=8, random_state=0).fit(X)
    assert h.gamma_ > 0
    with pytest.raises(ValueError, match="gamma"):
        ShiftInvariantKernelHashing(n_bits=8, gamma=-1.0).fit(X)


def _precision_at_radius(h, X_db, X_q, relevant, n_bits, radius=2):
    d = brute_distances(unpack_le(h.encode(X_q), n_bits), unpack_le(h.encode(X_db), n_bits))
    ret = d <= radius
    return (ret & relevant).sum() / max(ret.sum(), 1)


def test_baselines_beat_chance_and_itq_beats_pca_on_digits(digits):
    X, y = digits
    X = X - X.mean(0)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(X))
    db, q = perm[:1000], perm[1000:1300]
    relevant = y[q][:, None] == y[db][None, :]
    chance = relevant.mean()
    prec = {}
    for name, h in [
        ("pca", PCAHashing(16)),
        ("itq", IterativeQuantization(16, random_state=0)),
        ("spectral", SpectralHashing(16)),
        ("sikh", ShiftInvariantKernelHashing(16, random_state=0)),
    ]:
        h.fit(X[db])
        prec[name] = _precision_at_radius(h, X[db], X[q], relevant, 16)
    for name, p in prec.items():
        assert p > chance + 0.1, (name, p, chance)
    assert prec["itq"] > prec["pca"] + 0.02, prec

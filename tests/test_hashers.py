"""RandomHyperplaneLSH: determinism, code layout, sparse input, collision probability,
scikit-learn conventions and input validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from conftest import unpack_le
from hashlearn.hashers import (
    BaseHasher,
    RandomHyperplaneLSH,
    available_hashers,
    make_hasher,
)


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((120, 10)) + 2.0, rng.standard_normal((40, 10)) + 2.0


# ----------------------------------------------------------------------------- determinism


def test_same_random_state_gives_identical_codes(data):
    X, Y = data
    a = RandomHyperplaneLSH(n_bits=77, random_state=3).fit(X).encode(Y)
    b = RandomHyperplaneLSH(n_bits=77, random_state=3).fit(X).encode(Y)
    np.testing.assert_array_equal(a, b)
    c = RandomHyperplaneLSH(n_bits=77, random_state=4).fit(X).encode(Y)
    assert not np.array_equal(a, c)
    # refitting the same estimator with an int seed reproduces the codes
    h = RandomHyperplaneLSH(n_bits=77, random_state=3)
    np.testing.assert_array_equal(h.fit(X).encode(Y), h.fit(X).encode(Y))


_SLOW_TO_FIT = {"metric-lsh", "kernel-metric-lsh", "rbm", "mlh", "boosted-ssc", "rank"}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.slow) if n in _SLOW_TO_FIT else n
        for n in available_hashers()
    ],
)
def test_every_hasher_takes_random_state_as_int_none_or_randomstate(name):
    """The package's convention (scikit-learn's check_random_state): an int or a
    RandomState seeds the fit, equal seeds give equal codes, None is accepted."""
    from hashlearn import load_digits

    X, y = load_digits()
    X, y = X[:150], y[:150]
    codes = [
        make_hasher(name, n_bits=8, random_state=seed).fit(X, y).encode(X)
        for seed in (3, 3, np.random.RandomState(3), np.random.RandomState(3))
    ]
    np.testing.assert_array_equal(codes[0], codes[1])
    np.testing.assert_array_equal(codes[2], codes[3])
    assert make_hasher(name, n_bits=8, random_state=None).fit(X, y).encode(X).shape == (150, 1)


@pytest.mark.parametrize("n_bits", [1, 7, 8, 9, 33, 64, 100, 257])
@pytest.mark.parametrize("center", [True, False])
def test_codes_layout_and_projection(data, n_bits, center):
    X, Y = data
    h = RandomHyperplaneLSH(n_bits=n_bits, center=center, random_state=0).fit(X)
    codes = h.encode(Y)
    assert codes.dtype == np.uint8
    assert codes.shape == (len(Y), math.ceil(n_bits / 8))
    spare = codes.shape[1] * 8 - n_bits
    if spare:
        assert not np.any(codes[:, -1] >> (8 - spare)), "padding bits must be zero"
    bits = unpack_le(codes, n_bits)
    proj = h.project(Y)
    assert proj.shape == (len(Y), n_bits)
    np.testing.assert_array_equal(bits, (proj >= 0).astype(np.uint8))
    # the documented model: sign of r^T (x - mean) with Gaussian r
    assert h.components_.shape == (n_bits, 10)
    mean = X.mean(axis=0) if center else np.zeros(10)
    np.testing.assert_allclose(h.mean_, mean, atol=1e-12)
    np.testing.assert_allclose(proj, (Y - mean) @ h.components_.T, rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(h.transform(Y), codes)
    np.testing.assert_array_equal(h.fit_transform(X), h.encode(X))


def test_centering_balances_bits_on_shifted_data():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((4000, 8)) + 25.0
    centred = unpack_le(
        RandomHyperplaneLSH(64, center=True, random_state=0).fit(X).encode(X), 64
    ).mean(axis=0)
    raw = unpack_le(
        RandomHyperplaneLSH(64, center=False, random_state=0).fit(X).encode(X), 64
    ).mean(axis=0)
    assert np.all(np.abs(centred - 0.5) < 0.1)
    assert np.mean(np.abs(raw - 0.5) > 0.4) > 0.5  # most uncentred bits are constant


@pytest.mark.parametrize("center", [True, False])
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_sparse_input_gives_the_same_codes_as_dense(center, fmt):
    rng = np.random.default_rng(2)
    dense = rng.standard_normal((150, 30)) * (rng.random((150, 30)) < 0.2)
    dense[5] = 0.0  # an all-zero row
    sparse = sp.random(150, 30, density=0.2, random_state=3, format="csr")
    X_dense = dense + sparse.toarray()
    X_sparse = sp.csr_matrix(X_dense).asformat(fmt)
    h_dense = RandomHyperplaneLSH(n_bits=70, center=center, random_state=1).fit(X_dense)
    h_sparse = RandomHyperplaneLSH(n_bits=70, center=center, random_state=1).fit(X_sparse)
    np.testing.assert_allclose(h_sparse.mean_, h_dense.mean_, rtol=1e-12, atol=1e-15)
    expected = h_dense.encode(X_dense)
    np.testing.assert_array_equal(h_sparse.encode(X_sparse), expected)
    np.testing.assert_array_equal(h_dense.encode(X_sparse), expected)
    np.testing.assert_array_equal(h_sparse.encode(X_dense), expected)
    np.testing.assert_allclose(
        h_dense.project(X_sparse), h_dense.project(X_dense), rtol=1e-10, atol=1e-10
    )


# ---------------------------------------------------------------------- collision probability


@pytest.mark.parametrize("directions", ["orthogonal", "gaussian"])
@pytest.mark.parametrize("theta", [np.pi / 8, np.pi / 4, np.pi / 2, 3 * np.pi / 4])
def test_collision_probability_is_one_minus_angle_over_pi(theta, directions):
    """Charikar: P[h(u) = h(v)] = 1 - theta / pi for each random-hyperplane bit. Orthogonal
    blocks keep each direction uniform on the sphere; within a block the bits are negatively
    correlated, so the binomial tolerance is conservative for them."""
    n_bits, d = 4096, 16
    p = 1.0 - theta / np.pi
    tol = 4.5 * math.sqrt(p * (1 - p) / n_bits)
    rng = np.random.default_rng(11)
    pairs = []
    for _ in range(3):  # three random planes, the same angle
        basis, _ = np.linalg.qr(rng.standard_normal((d, 2)))
        u = basis[:, 0]
        v = math.cos(theta) * basis[:, 0] + math.sin(theta) * basis[:, 1]
        pairs.append((u, v))
    X = np.array([x for pair in pairs for x in pair])
    h = RandomHyperplaneLSH(
        n_bits=n_bits, center=False, directions=directions, random_state=123
    ).fit(X)
    bits = unpack_le(h.encode(X), n_bits)
    for i in range(len(pairs)):
        freq = np.mean(bits[2 * i] == bits[2 * i + 1])
        assert abs(freq - p) <= tol, (theta, freq, p, tol)


@pytest.mark.parametrize("n_bits, d", [(5, 8), (8, 8), (20, 8), (33, 16), (3, 1)])
def test_orthogonal_directions_are_orthonormal_per_block(n_bits, d):
    X = np.random.RandomState(0).randn(30, d)
    h = RandomHyperplaneLSH(n_bits=n_bits, random_state=4).fit(X)
    R = h.components_
    assert R.shape == (n_bits, d)
    for start in range(0, n_bits, d):
        block = R[start : start + d]
        np.testing.assert_allclose(block @ block.T, np.eye(len(block)), atol=1e-12)
    if n_bits > d > 1:  # different blocks are different rotations
        assert not np.allclose(np.abs(R[:d] @ R[d : 2 * d].T), np.eye(min(d, n_bits - d)))
    # same seed -> same directions and codes; another seed -> other directions
    again = RandomHyperplaneLSH(n_bits=n_bits, random_state=4).fit(X)
    np.testing.assert_array_equal(again.components_, R)
    np.testing.assert_array_equal(again.encode(X), h.encode(X))
    other = RandomHyperplaneLSH(n_bits=n_bits, random_state=5).fit(X)
    assert not np.allclose(other.components_, R)


def test_orthogonal_directions_are_uniform_on_the_sphere():
    """Each orthogonal direction is marginally uniform: the first coordinate of r over many
    seeds has mean 0 and variance 1/d (as for a normalised Gaussian)."""
    d = 6
    X = np.zeros((2, d))
    first = np.array(
        [RandomHyperplaneLSH(n_bits=3, random_state=s).fit(X).components_[:, 0] for s in range(400)]
    ).ravel()
    assert abs(first.mean()) < 4 * math.sqrt(1 / d / first.size)
    assert abs(np.mean(first**2) - 1 / d) < 0.02


def test_gaussian_directions_option(data):
    X, _ = data
    h = RandomHyperplaneLSH(n_bits=16, directions="gaussian", random_state=0).fit(X)
    ref = np.random.RandomState(0).standard_normal((16, X.shape[1]))
    np.testing.assert_array_equal(h.components_, ref)
    with pytest.raises(ValueError, match="'directions' parameter"):
        RandomHyperplaneLSH(n_bits=16, directions="haar").fit(X)


def test_identical_and_opposite_vectors():
    rng = np.random.default_rng(5)
    u = rng.standard_normal(12)
    h = RandomHyperplaneLSH(n_bits=512, center=False, random_state=0).fit(np.stack([u, -u]))
    bits = unpack_le(h.encode(np.stack([u, 3 * u, -u])), 512)
    np.testing.assert_array_equal(bits[0], bits[1])  # scale does not matter
    np.testing.assert_array_equal(bits[0], 1 - bits[2])  # theta = pi: never collide


# ------------------------------------------------------------------------ sklearn conventions


def test_estimator_conventions(data):
    X, Y = data
    h = RandomHyperplaneLSH(n_bits=0, center=False, random_state=7)  # invalid: not checked yet
    params = {"n_bits": 0, "center": False, "directions": "orthogonal", "random_state": 7}
    assert vars(h) == params  # nothing computed
    assert h.get_params() == params
    assert h.set_params(n_bits=24) is h and h.n_bits == 24
    assert h.fit(X) is h
    assert isinstance(h, BaseHasher)
    twin = clone(h)
    assert twin.get_params() == h.get_params()
    assert not hasattr(twin, "components_")
    with pytest.raises(NotFittedError):
        twin.encode(Y)
    np.testing.assert_array_equal(twin.fit(X).encode(Y), h.encode(Y))
    assert "n_bits=24" in repr(h)
    pipe = make_pipeline(StandardScaler(), RandomHyperplaneLSH(n_bits=16, random_state=0))
    codes = pipe.fit(X).transform(Y)
    assert codes.shape == (len(Y), 2) and codes.dtype == np.uint8


def test_registry():
    assert isinstance(make_hasher("lsh", n_bits=8), RandomHyperplaneLSH)
    assert available_hashers()["lsh"] is RandomHyperplaneLSH
    with pytest.raises(ValueError, match="lsh"):
        make_hasher("no-such-hasher")


@parametrize_with_checks([RandomHyperplaneLSH(n_bits=16, random_state=0)])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


# --------------------------------------------------------------------------- bad input


def test_bad_input_is_refused(data):
    X, Y = data
    h = RandomHyperplaneLSH(n_bits=16, random_state=0)
    with pytest.raises(NotFittedError):
        h.encode(Y)
    with pytest.raises(NotFittedError):
        h.project(Y)
    for bad in (np.nan, np.inf, -np.inf):
        Xb = X.copy()
        Xb[3, 4] = bad
        with pytest.raises(ValueError, match="X"):
            RandomHyperplaneLSH(8, random_state=0).fit(Xb)
    h.fit(X)
    Yb = Y.copy()
    Yb[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        h.encode(Yb)
    with pytest.raises(ValueError, match="features"):
        h.encode(Y[:, :9])
    with pytest.raises(ValueError, match="features"):
        h.project(np.hstack([Y, Y]))
    with pytest.raises(ValueError):
        h.encode(Y[0])  # 1-D
    with pytest.raises(ValueError):
        RandomHyperplaneLSH(8).fit(X[:0])  # no samples
    for n_bits in (0, -2, 2.5, "8", None):
        with pytest.raises(ValueError, match="n_bits"):
            RandomHyperplaneLSH(n_bits=n_bits).fit(X)
    with pytest.raises(ValueError, match="y"):
        RandomHyperplaneLSH(8).fit(X, np.zeros(len(X) - 1))


def test_supervision_arguments_are_validated_even_when_ignored(data):
    X, _ = data
    n = len(X)
    h = RandomHyperplaneLSH(n_bits=8, random_state=0)
    good_pairs = np.array([[0, 1], [2, 3], [4, 5]])
    good_similar = np.array([True, False, True])
    assert h.fit(X, pairs=good_pairs, similar=good_similar) is h
    assert h.fit(X, pairs=good_pairs, similar=[1, 0, 1]) is h
    with pytest.raises(ValueError, match="pairs"):
        h.fit(X, pairs=np.array([[0, n]]), similar=[True])
    with pytest.raises(ValueError, match="pairs"):
        h.fit(X, pairs=np.array([[-1, 2]]), similar=[True])
    with pytest.raises(ValueError, match="pairs"):
        h.fit(X, pairs=np.array([0, 1, 2]), similar=[True, True, True])
    with pytest.raises(TypeError, match="pairs"):
        h.fit(X, pairs=np.array([[0.0, 1.5]]), similar=[True])
    with pytest.raises(ValueError, match="similar"):
        h.fit(X, pairs=good_pairs, similar=[True, False])
    with pytest.raises(ValueError, match="similar"):
        h.fit(X, pairs=good_pairs)
    with pytest.raises(ValueError, match="similar"):
        h.fit(X, pairs=good_pairs, similar=[0, 2, 1])
    with pytest.raises(ValueError, match="pairs"):
        h.fit(X, similar=good_similar)
    with pytest.raises(ValueError, match="y or pairs"):
        h.fit(X, np.zeros(n), pairs=good_pairs, similar=good_similar)


# ------------------------------------------------------------- data of huge magnitude

# Issue 29: SpectralHashing fitted on finite data of magnitude 1e300 gave NaN projections
# (garbage codes, no error). Every hasher now either fits such data as it fits the same data
# scaled down (power-of-two scaling is exact, so the codes must be identical), or refuses it
# with a one-line ValueError, or (learned by gradient steps, not scale-invariant) at least
# fits a finite model.
_SCALE_INVARIANT = {"boosted-ssc", "bre", "lsh", "sign", "spectral"}
_REFUSED = {"itq", "kernel-metric-lsh", "klsh", "metric-lsh", "pca", "sikh"}
_FINITE = {"mlh", "rbm", "rank"}


def test_the_huge_data_expectations_cover_every_hasher():
    assert _SCALE_INVARIANT | _REFUSED | _FINITE == set(available_hashers())


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            n,
            marks=pytest.mark.xfail(
                strict=True,
                reason="rank.py (not changed here): X.std overflows at 1e300, one code for all",
            ),
        )
        if n == "rank"
        else n
        for n in sorted(available_hashers())
    ],
)
def test_data_of_magnitude_1e300_fits_exactly_as_scaled_down_or_is_refused(name, tmp_path):
    from hashlearn import load, load_digits
    from test_load_any import FAST_PARAMS

    X, y = load_digits()
    X, y = X[:150].astype(np.float64) / 16.0, y[:150]
    huge = X * 2.0**997  # largest magnitude 1.3e300; the scaling is exact

    def make():
        return make_hasher(name, n_bits=16, random_state=0, **FAST_PARAMS.get(name, {}))

    if name in _REFUSED:
        with pytest.raises(ValueError) as info:
            make().fit(huge, y)
        assert "\n" not in str(info.value)
        assert "float64" in str(info.value) or "infinite kernel values" in str(info.value)
        return
    with np.errstate(all="ignore"):
        hasher = make().fit(huge, y)
    for key, value in vars(hasher).items():
        if key.endswith("_") and isinstance(value, np.ndarray) and value.dtype.kind == "f":
            assert np.isfinite(value).all(), key
    codes = hasher.encode(huge)
    assert len(np.unique(codes, axis=0)) > 1, "every row got the same code"
    hasher.save(tmp_path / "h")  # a finite model saves and loads (non-finite ones cannot)
    np.testing.assert_array_equal(load(tmp_path / "h").encode(huge), codes)
    if name in _SCALE_INVARIANT:
        np.testing.assert_array_equal(codes, make().fit(X, y).encode(X))

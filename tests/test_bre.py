"""BinaryReconstructiveEmbedding: the exact coordinate step against a brute-force line
search, bookkeeping of bits and distances, the objective decreasing, persistence, bad input
and improvement over its random initialisation on digits."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import unpack_le
from hashlearn.hashers.base import available_hashers
from hashlearn.hashers.bre import BinaryReconstructiveEmbedding, _coordinate_descent
from hashlearn.io import load


def _csr(P, n):
    ends = np.concatenate([P[:, 0], P[:, 1]])
    ids = np.concatenate([np.arange(len(P))] * 2)
    order = np.argsort(ends, kind="stable")
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(ends, minlength=n), out=indptr[1:])
    return indptr, ids[order].astype(np.int64)


def _objective(K, W, P, targets):
    B = (K @ W.T) >= 0
    dist = (B[P[:, 0]] != B[P[:, 1]]).sum(1)
    return np.sum((targets - dist / W.shape[0]) ** 2)


@pytest.mark.parametrize("seed", range(6))
def test_coordinate_step_is_the_exact_line_minimum(seed):
    rng = np.random.default_rng(seed)
    n, s, b = 30, 5, 4
    K = rng.standard_normal((n, s))
    W = rng.standard_normal((b, s))
    P = rng.integers(0, n, (80, 2))
    P = P[P[:, 0] != P[:, 1]].astype(np.int64)
    targets = rng.uniform(0, 1, len(P))
    p, t = int(rng.integers(b)), int(rng.integers(s))
    # brute force: the objective at every breakpoint midpoint and beyond the extremes
    Y = K @ W.T
    flips = -Y[:, p] / K[:, t]
    pts = np.sort(np.concatenate([flips, [0.0]]))
    cands = np.concatenate([(pts[1:] + pts[:-1]) / 2, [pts[0] - 1.0, pts[-1] + 1.0, 0.0]])
    best = np.inf
    for alpha in cands:
        W2 = W.copy()
        W2[p, t] += alpha
        best = min(best, _objective(K, W2, P, targets))
    before = _objective(K, W, P, targets)
    B = (Y >= 0).astype(np.int8)
    dist = (B[P[:, 0]] != B[P[:, 1]]).sum(1).astype(np.float64)
    indptr, pair_of = _csr(P, n)
    Wc = W.copy()
    gain = _coordinate_descent(
        K, Wc, Y, B, dist, P, targets, indptr, pair_of, np.array([p * s + t], np.int64)
    )
    after = _objective(K, Wc, P, targets)
    assert after == pytest.approx(best, abs=1e-9)
    assert gain == pytest.approx(before - after, abs=1e-9)
    # bookkeeping: projections, bits and distances match a recomputation
    np.testing.assert_allclose(Y, K @ Wc.T, atol=1e-9)
    np.testing.assert_array_equal(B, (K @ Wc.T) >= 0)
    np.testing.assert_array_equal(dist, (B[P[:, 0]] != B[P[:, 1]]).sum(1))
    assert np.count_nonzero(Wc != W) <= 1


@pytest.fixture(scope="module")
def digits():
    from hashlearn.datasets import load_digits

    X, y = load_digits()
    X = np.asarray(X, np.float64)
    X -= X.mean(0)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return X, y


def test_objective_decreases_and_beats_initialisation(digits):
    X, _ = digits
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(X))
    tr, te = perm[:500], perm[500:800]
    kw = dict(n_bits=16, n_landmarks=32, init="random", random_state=0)
    h = BinaryReconstructiveEmbedding(n_iter=2, **kw).fit(X[tr])
    hist = h.objective_history_
    assert np.all(np.diff(hist) <= 1e-12) and hist[-1] < 0.8 * hist[0], hist
    # Hamming distances correlate with Euclidean distances better than at initialisation
    init = BinaryReconstructiveEmbedding(n_iter=0, **kw).fit(X[tr])
    d_true = ((X[te][:, None] - X[tr][None]) ** 2).sum(-1).ravel()

    def corr(model):
        a = unpack_le(model.encode(X[te]), 16).astype(bool)
        b = unpack_le(model.encode(X[tr]), 16).astype(bool)
        d = (a[:, None] != b[None]).sum(-1).ravel()
        return np.corrcoef(d, d_true)[0, 1]

    assert corr(h) > corr(init) + 0.05, (corr(h), corr(init))


@pytest.mark.parametrize("n_bits", [16, 32])
def test_itq_start_reaches_a_lower_loss_than_the_random_start(digits, n_bits):
    """init="itq" (the default) starts the same descent from ITQ's projections fitted into
    the kernel span: on digits both its start and its end lie below those of the paper's
    random start, over three seeds."""
    X, _ = digits
    kw = dict(n_bits=n_bits, kernel="linear", target_power=1.0, n_iter=2)
    for seed in range(3):
        itq = BinaryReconstructiveEmbedding(init="itq", random_state=seed, **kw).fit(X)
        rnd = BinaryReconstructiveEmbedding(init="random", random_state=seed, **kw).fit(X)
        a, b = itq.objective_history_, rnd.objective_history_
        assert np.all(np.diff(a) <= 1e-12), a
        assert a[0] < b[0] and a[-1] < b[-1], (seed, a, b)


def test_target_power_selection(digits):
    """target_power="auto": both kernels at each of the powers 1, 0.5, 0.25 and 2; the power
    with the highest mean held-out score over the two kernels wins (if clearly above 1), then
    the better kernel at that power; with labels there are no distances to raise to a power and nothing is
    selected."""
    X, y = digits
    h = BinaryReconstructiveEmbedding(16, n_landmarks=32, n_iter=1, random_state=0).fit(X)
    res = h.selection_results_
    assert res.shape == (8, 3)
    np.testing.assert_array_equal(res[:, 0], [0, 1] * 4)
    np.testing.assert_array_equal(res[:, 1], np.repeat([1.0, 0.5, 0.25, 2.0], 2))
    means = res[:, 2].reshape(4, 2).mean(1)
    assert h.target_power_ in (1.0, [1.0, 0.5, 0.25, 2.0][int(np.argmax(means))])
    at_power = res[res[:, 1] == h.target_power_]
    np.testing.assert_array_equal(h.kernel_scores_, at_power[:, 2])
    assert h.kernel_ == ("rbf" if at_power[1, 2] > at_power[0, 2] else "linear")
    fixed = BinaryReconstructiveEmbedding(16, n_landmarks=32, n_iter=1, target_power=2.0)
    fixed = fixed.set_params(kernel="linear", random_state=0).fit(X)
    assert fixed.target_power_ == 2.0 and fixed.selection_results_.shape == (0, 3)
    sup = BinaryReconstructiveEmbedding(16, n_landmarks=32, n_iter=1, random_state=0)
    sup = sup.fit(X[:300], y[:300])
    assert sup.target_power_ == 1.0 and sup.selection_results_.shape == (0, 3)
    assert np.all(sup.kernel_scores_ == -1.0)


def test_supervised_pairs_roundtrip_and_determinism(digits, tmp_path):
    X, y = digits
    X, y = X[:300], y[:300]
    kw = dict(n_bits=12, n_landmarks=16, n_iter=1, n_neighbors=5, n_random=5, random_state=1)
    a = BinaryReconstructiveEmbedding(**kw).fit(X, y)
    np.testing.assert_array_equal(
        a.encode(X), BinaryReconstructiveEmbedding(**kw).fit(X, y).encode(X)
    )
    assert a.objective_history_[-1] <= a.objective_history_[0]
    r = BinaryReconstructiveEmbedding(kernel="rbf", **kw).fit(X)
    assert r.gamma_ > 0
    for model, name in ((a, "a"), (r, "r")):
        model.save(tmp_path / name)
        back = load(tmp_path / name)
        assert isinstance(back, BinaryReconstructiveEmbedding)
        np.testing.assert_array_equal(back.encode(X), model.encode(X))
    P = np.array([[0, 1], [2, 3], [4, 5]])
    c = BinaryReconstructiveEmbedding(**kw).fit(X, pairs=P, similar=[True, False, True])
    assert c.weights_.shape == (12, 16)
    assert available_hashers()["bre"] is BinaryReconstructiveEmbedding


@pytest.mark.parametrize(
    "params,match",
    [
        (dict(kernel="poly"), "kernel"),
        (dict(n_landmarks=0), "n_landmarks"),
        (dict(n_iter=-1), "n_iter"),
        (dict(kernel="rbf", gamma=-1.0), "gamma"),
        (dict(n_neighbors=0, n_random=0), "no training pairs"),
        (dict(init="pca"), "init"),
        (dict(target_power=0.0), "target_power"),
        (dict(target_power=-1.0), "target_power"),
    ],
)
def test_bad_parameters(digits, params, match):
    X, _ = digits
    with pytest.raises(ValueError, match=match):
        BinaryReconstructiveEmbedding(**{"n_bits": 8, **params}).fit(X[:50])


def test_bad_supervision(digits):
    X, y = digits
    with pytest.raises(ValueError, match="single class"):
        BinaryReconstructiveEmbedding(8).fit(X[:50], np.zeros(50))
    with pytest.raises(ValueError, match="rows"):
        BinaryReconstructiveEmbedding(8).fit(X[:50], pairs=[[0, 50]], similar=[True])


@pytest.mark.parametrize("kernel", ["linear", "rbf"])
@pytest.mark.parametrize("factor", [1e150, 1e200, 1e300, 1e-300])
def test_large_or_tiny_finite_input_gives_a_finite_model(kernel, factor):
    """Issue 13: finite but large input used to overflow the kernel (a NaN model, no error).
    Inputs are rescaled internally: every fitted array is finite and the codes equal those
    of the unscaled data (the rescaling divides by the data's own RMS row norm)."""
    X = np.random.default_rng(0).standard_normal((200, 5))
    kw = dict(n_bits=8, kernel=kernel, n_landmarks=16, n_iter=1, random_state=0)
    ref = BinaryReconstructiveEmbedding(**kw).fit(X)
    h = BinaryReconstructiveEmbedding(**kw).fit(X * factor)
    for name in ("landmarks_", "weights_", "kernel_mean_", "objective_history_"):
        assert np.isfinite(getattr(h, name)).all(), name
    assert np.isfinite(h.gamma_) and h.input_scale_ > 0
    np.testing.assert_array_equal(h.encode(X * factor), ref.encode(X))


def test_constant_input_is_finite_or_refused():
    X = np.full((50, 4), 3.0)
    h = BinaryReconstructiveEmbedding(8, n_landmarks=8, n_iter=1, random_state=0).fit(X)
    assert np.isfinite(h.weights_).all() and np.isfinite(h.kernel_mean_).all()

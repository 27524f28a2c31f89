"""MinimalLossHashing: exact loss-adjusted inference against brute force, the bound and the
loss decreasing in training, hyper-parameter selection, persistence and bad input."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from conftest import unpack_le
from hashlearn.hashers.base import available_hashers
from hashlearn.hashers.mlh import (
    MinimalLossHashing,
    bre_loss,
    hinge_loss,
    loss_adjusted_inference,
    select_mlh_hyperparameters,
)
from hashlearn.io import load


def _all_codes(q):
    return np.array(list(itertools.product([0, 1], repeat=q)), dtype=np.float64)


def _brute_force(a, c, target, loss, rho, lam, eps):
    """max over all (g_i, g_j) in {0,1}^q x {0,1}^q of eps*l(|g_i-g_j|) + g_i.a + g_j.c."""
    q = len(a)
    H = _all_codes(q)
    si = H @ a
    sj = H @ c
    m = (H[:, None, :] != H[None, :, :]).sum(2)
    if loss == "hinge":
        lval = hinge_loss(m, np.full(m.shape, bool(target)), rho, lam)
    else:
        lval = bre_loss(m, target, q)
    obj = eps * lval + si[:, None] + sj[None, :]
    return obj.max()


@pytest.mark.parametrize("loss", ["hinge", "bre"])
@pytest.mark.parametrize("q", [1, 2, 3, 5, 8, 10])
def test_loss_adjusted_inference_equals_brute_force(loss, q):
    rng = np.random.default_rng(q * 7 + (loss == "bre"))
    n_trials = 12 if q <= 8 else 3
    for trial in range(n_trials):
        a = rng.standard_normal(q)
        c = rng.standard_normal(q)
        if trial % 3 == 0:
            c = a + 0.1 * rng.standard_normal(q)  # similar scores: codes agree at rest
        target = float(trial % 2) if loss == "hinge" else float(rng.uniform())
        rho = float(rng.integers(0, q + 1)) + (0.5 if trial % 4 == 1 else 0.0)
        lam = float(rng.uniform(0, 2))
        eps = float(rng.choice([0.1, 1.0, 5.0]))
        gi, gj, m, value = loss_adjusted_inference(
            a, c, target, loss=loss, rho=rho, lam=lam, epsilon=eps
        )
        best = _brute_force(a, c, target, loss, rho, lam, eps)
        assert value == pytest.approx(best, abs=1e-9)
        # the returned codes attain the value
        assert m == int(np.sum(gi != gj))
        lval = hinge_loss(m, bool(target), rho, lam) if loss == "hinge" else bre_loss(m, target, q)
        assert eps * lval + gi @ a + gj @ c == pytest.approx(best, abs=1e-9)


def _sorted_gains_oracle(a, c, target, rho, lam, eps):
    """The maximum of eq. 12 by §4.1's sort: the best m flips the m largest gains."""
    q = len(a)
    base = np.maximum(a + c, 0.0).sum()
    gains = np.sort(np.maximum(a, c) - np.maximum(a + c, 0.0))[::-1]
    m = np.arange(q + 1)
    running = np.concatenate([[0.0], np.cumsum(gains)])
    return (running + eps * hinge_loss(m, bool(target), rho, lam)).max() + base


@pytest.mark.parametrize("q", [16, 64, 128])
def test_hinge_inference_without_sort_equals_the_sorted_gains(q):
    """The hinge loss's O(q) inference (each side of the loss's kink maximised by a
    threshold on the gains, quickselect when clamped) against §4.1's sort, on long codes and
    with tied gains (scores on a coarse grid)."""
    rng = np.random.default_rng(q)
    for trial in range(200):
        a, c = rng.standard_normal(q), rng.standard_normal(q)
        if trial % 2:
            a, c = np.round(a * 2) / 2, np.round(c * 2) / 2  # many equal gains
        target = float(trial % 2 == 0)
        rho = float(rng.uniform(0, q)) if trial % 3 else float(rng.integers(0, q + 1))
        lam, eps = float(rng.uniform(0, 2)), float(rng.choice([0.03, 0.3, 3.0]))
        gi, gj, m, value = loss_adjusted_inference(a, c, target, rho=rho, lam=lam, epsilon=eps)
        assert value == pytest.approx(_sorted_gains_oracle(a, c, target, rho, lam, eps), abs=1e-9)
        assert m == int(np.sum(gi != gj))
        lval = hinge_loss(m, bool(target), rho, lam)
        assert eps * lval + gi @ a + gj @ c == pytest.approx(value, abs=1e-9)


def test_loss_adjusted_inference_batch_and_validation():
    rng = np.random.default_rng(0)
    A, C = rng.standard_normal((20, 6)), rng.standard_normal((20, 6))
    t = rng.integers(0, 2, 20)
    Gi, Gj, M, V = loss_adjusted_inference(A, C, t, rho=2, lam=0.5, epsilon=1.0)
    for p in range(20):
        assert V[p] == pytest.approx(_brute_force(A[p], C[p], t[p], "hinge", 2, 0.5, 1.0))
    with pytest.raises(ValueError, match="loss"):
        loss_adjusted_inference(A, C, t, loss="l2")
    with pytest.raises(ValueError, match="same shape"):
        loss_adjusted_inference(A, C[:, :5], t)


def test_hinge_loss_is_eq4():
    m = np.arange(7)
    np.testing.assert_allclose(hinge_loss(m, True, 3, 0.5), [0, 0, 0, 1, 2, 3, 4])
    np.testing.assert_allclose(hinge_loss(m, False, 3, 0.5), [2, 1.5, 1, 0.5, 0, 0, 0])


@pytest.fixture(scope="module")
def clusters():
    rng = np.random.default_rng(1)
    centres = rng.standard_normal((6, 10)) * 2.0
    y = rng.integers(0, 6, 400)
    X = centres[y] + 0.7 * rng.standard_normal((400, 10))
    return X, y


@pytest.mark.parametrize("loss", ["hinge", "bre"])
def test_bound_and_loss_decrease_in_training(clusters, loss):
    X, y = clusters
    # the BRE loss lies in [0, 1] (eq. 2), so it needs a larger scale epsilon than eq. (4)
    eps = 0.1 if loss == "hinge" else 20.0
    h = MinimalLossHashing(
        n_bits=16,
        rho=4,
        lam=0.5,
        epsilon=eps,
        n_epochs=12,
        pairs_per_epoch=5000,
        monitor_pairs=3000,
        loss=loss,
        label_neighbors=0,  # pairs across the whole set: near pairs start at a low BRE loss
        random_state=0,
    ).fit(X, y)
    L, B = h.loss_history_, h.bound_history_
    assert L.shape == B.shape == (13,)
    assert np.all(B >= L - 1e-9), "eq. (11) bounds the empirical loss"
    # both drop substantially from the LSH initialisation, and the end is near the best
    assert B[-1] < 0.6 * B[0] and L[-1] < 0.8 * L[0], (L, B)
    assert B[-3:].mean() <= B[:3].mean()
    # objective() agrees with the recorded bound semantics on fresh pairs
    lo, bo = h.objective(X, y, n_pairs=2000)
    assert bo >= lo


def test_mlh_beats_its_lsh_initialisation_on_label_retrieval(clusters):
    X, y = clusters
    from hashlearn.codes import hamming_cdist
    from hashlearn.evaluate import precision_recall_at_radius

    X = X + 1.5 * np.random.default_rng(9).standard_normal(X.shape)  # overlapping classes
    Xtr, ytr, Xte, yte = X[:300], y[:300], X[300:], y[300:]
    rel = yte[:, None] == ytr[None, :]
    # class-level retrieval: pairs across the whole set (label_neighbors=0), both from the
    # same LSH initialisation
    untrained = MinimalLossHashing(16, n_epochs=0, label_neighbors=0, random_state=3).fit(Xtr, ytr)
    trained = MinimalLossHashing(
        16, rho=3, n_epochs=10, pairs_per_epoch=5000, label_neighbors=0, random_state=3
    ).fit(Xtr, ytr)
    res = {}
    for name, h in (("lsh", untrained), ("mlh", trained)):
        d = hamming_cdist(h.encode(Xte), h.encode(Xtr), 16)
        res[name] = precision_recall_at_radius(d, rel, 3)
    # measured: LSH (on the centred input) 0.619 / 0.173, MLH 0.647 / 0.407
    assert res["mlh"][0] > res["lsh"][0] + 0.01 and res["mlh"][1] > res["lsh"][1] + 0.1, res


def test_mlh_defaults_from_labels_beat_their_lsh_initialisation_on_knn(clusters):
    """The default label supervision (neighbourhood pairs, ``label_neighbors=20``) serves
    nearest-neighbour search: the k-NN error of the 3 nearest Hamming bins drops below the
    LSH initialisation's on overlapping classes."""
    X, y = clusters
    from hashlearn.codes import hamming_cdist
    from hashlearn.evaluate import knn_classification_error

    X = X + 1.5 * np.random.default_rng(9).standard_normal(X.shape)
    Xtr, ytr, Xte, yte = X[:300], y[:300], X[300:], y[300:]
    err = {}
    for name, kw in (
        ("lsh", {"n_epochs": 0}),
        ("mlh", {}),
        ("class-pairs", {"label_neighbors": 0}),
    ):
        h = MinimalLossHashing(16, random_state=3, **kw).fit(Xtr, ytr)
        err[name] = knn_classification_error(
            hamming_cdist(h.encode(Xte), h.encode(Xtr), 16), ytr, yte, k=3
        )
    # measured: LSH 0.24, defaults 0.13, pairs across the whole set (label_neighbors=0) 0.17
    assert err["mlh"] < err["lsh"], err


def test_determinism_pairs_api_and_roundtrip(clusters, tmp_path):
    X, y = clusters
    kw = dict(n_bits=13, n_epochs=2, pairs_per_epoch=2000, random_state=5)
    a = MinimalLossHashing(**kw).fit(X, y)
    b = MinimalLossHashing(**kw).fit(X, y)
    np.testing.assert_array_equal(a.encode(X), b.encode(X))
    # unit rows (§5) in the centred, scaled units training works in
    inner = np.hstack(
        [a.components_ * a.input_scale_, (a.offset_ + a.components_ @ a.mean_)[:, None]]
    )
    np.testing.assert_allclose(np.linalg.norm(inner, axis=1), 1.0)
    np.testing.assert_allclose(a.mean_, X.mean(0))
    bits = unpack_le(a.encode(X), 13)
    np.testing.assert_array_equal(bits, X @ a.components_.T + a.offset_ >= 0)
    a.save(tmp_path / "m")
    back = load(tmp_path / "m")
    assert isinstance(back, MinimalLossHashing)
    np.testing.assert_array_equal(back.encode(X), a.encode(X))
    np.testing.assert_array_equal(back.loss_history_, a.loss_history_)
    # explicit pairs
    rng = np.random.default_rng(0)
    P = rng.integers(0, len(X), (3000, 2))
    s = y[P[:, 0]] == y[P[:, 1]]
    c = MinimalLossHashing(
        n_bits=8, n_epochs=1, pairs_per_epoch=1000, fit_offset=False, random_state=0
    ).fit(X, pairs=P, similar=s)
    # no offset: the hyperplanes pass through the training mean (eq. 1 on centred data)
    np.testing.assert_allclose(c.offset_, -c.components_ @ X.mean(0), atol=1e-12)
    assert available_hashers()["mlh"] is MinimalLossHashing


@pytest.mark.parametrize(
    "params,match",
    [
        (dict(rho=-1), "rho"),
        (dict(rho=17), "rho"),
        (dict(lam=-0.1), "lam"),
        (dict(epsilon=0.0), "epsilon"),
        (dict(loss="l1"), "loss"),
        (dict(batch_size=0), "batch_size"),
        (dict(n_bits=0), "n_bits"),
    ],
)
def test_bad_parameters(clusters, params, match):
    X, y = clusters
    with pytest.raises(ValueError, match=match):
        MinimalLossHashing(**{"n_bits": 16, **params}).fit(X, y)


def test_bad_supervision(clusters):
    X, y = clusters
    h = MinimalLossHashing(8, n_epochs=1, pairs_per_epoch=100)
    with pytest.raises(ValueError, match="requires y to be passed"):
        h.fit(X)
    with pytest.raises(ValueError, match="y"):
        h.fit(X, y[:-1])
    with pytest.raises(ValueError, match="single class"):
        h.fit(X, np.zeros(len(X)))
    with pytest.raises(ValueError, match="rows"):
        h.fit(X, pairs=[[0, len(X)]], similar=[True])
    with pytest.raises(ValueError, match="similar"):
        h.fit(X, pairs=[[0, 1]], similar=[True, False])


def test_select_hyperparameters_on_held_out(clusters):
    X, y = clusters
    best, table = select_mlh_hyperparameters(
        X,
        y,
        n_bits=8,
        rho_values=(1, 3),
        lam_values=(0.5,),
        epsilon_values=(0.1,),
        n_epochs=2,
        pairs_per_epoch=2000,
        random_state=0,
    )
    assert len(table) == 2 and best["rho"] in (1.0, 3.0)
    top = max(table, key=lambda r: r["score"])
    assert {k: best[k] for k in ("rho", "lam", "epsilon")} == {
        k: top[k] for k in ("rho", "lam", "epsilon")
    }
    assert best["n_epochs"] == 2  # given, so not searched
    assert all(0 < r["score"] <= 1 and r["n_epochs"] == 2 for r in table)
    P = np.random.default_rng(0).integers(0, len(X), (4000, 2))
    best2, _ = select_mlh_hyperparameters(
        X,
        pairs=P,
        similar=y[P[:, 0]] == y[P[:, 1]],
        n_bits=8,
        rho_values=(2,),
        lam_values=(0.5,),
        epsilon_values=(0.1,),
        n_epochs=1,
        pairs_per_epoch=1000,
        random_state=0,
    )
    assert best2["rho"] == 2.0
    with pytest.raises(ValueError, match="labels y or pairs"):
        select_mlh_hyperparameters(X, n_bits=8)


def test_paper_ordering_on_digits_mlh_above_lsh_and_sh():
    """§6.1 protocol, subsampled: MLH's precision within Hamming radius 3 (per query, empty
    retrieval = 0) beats LSH and SH at 32 bits on digits."""
    from hashlearn.codes import hamming_cdist
    from hashlearn.datasets import load_digits
    from hashlearn.evaluate import precision_recall_at_radius
    from hashlearn.experiments.mlh import prepare
    from hashlearn.hashers.lsh import RandomHyperplaneLSH
    from hashlearn.hashers.spectral import SpectralHashing
    from hashlearn.supervision import neighbor_threshold, neighbors_within

    X, _ = load_digits()
    perm = np.random.default_rng(0).permutation(len(X))
    A, B = prepare(
        np.asarray(X[perm[:600]], float),
        np.asarray(X[perm[600:900]], float),
        normalise=True,
        n_pca=40,
    )
    thr = neighbor_threshold(A, 30)
    iu = np.triu_indices(len(A), 1)
    P, s = np.stack(iu, 1), neighbors_within(A, A, thr)[iu]
    rel = neighbors_within(B, A, thr)

    def precision(h):
        d = hamming_cdist(h.encode(B), h.encode(A), 32)
        return precision_recall_at_radius(d, rel, 3, aggregate="per_query")[0]

    mlh = np.mean(
        [
            precision(
                MinimalLossHashing(
                    32,
                    rho=10,
                    lam=0.5,
                    epsilon=0.1,
                    n_epochs=4,
                    pairs_per_epoch=30000,
                    monitor_pairs=0,
                    random_state=r,
                ).fit(A, pairs=P, similar=s)
            )
            for r in range(2)
        ]
    )
    lsh = np.mean([precision(RandomHyperplaneLSH(32, random_state=r).fit(A)) for r in range(2)])
    sh = precision(SpectralHashing(32).fit(A))
    assert mlh > max(lsh, sh) + 0.1, (mlh, lsh, sh)

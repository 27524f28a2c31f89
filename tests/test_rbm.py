"""RBMHashing: NCA gradient oracle, training behaviour, bad input, persistence, real data."""

import os

import numpy as np
import pytest

from hashlearn.codes import hamming_cdist, unpack_bits
from hashlearn.datasets import fashion_mnist_available, load_digits, load_fashion_mnist
from hashlearn.evaluate import exact_knn, recall_at_m
from hashlearn.hashers.lsh import RandomHyperplaneLSH
from hashlearn.hashers.rbm import RBMHashing
from hashlearn.io import load

FASHION_DIR = os.environ.get("HASHLEARN_FASHION_MNIST_DIR") or None


def label_neighbors(db, q, y_db, y_q, k=50):
    """The k Euclidean-nearest database items of the query's own class (label ground truth)."""
    out = np.full((len(q), k), -1, np.int64)
    for c in np.unique(y_q):
        rows = np.flatnonzero(y_db == c)
        qi = np.flatnonzero(y_q == c)
        _, ids = exact_knn(db[rows], q[qi], k)
        out[qi] = np.where(ids >= 0, rows[np.maximum(ids, 0)], -1)
    return out


def _nca_objective(h, Zb, target, layers):
    F = h._forward(Zb, layers)[-1]
    d = ((F[:, None, :] - F[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(d, np.inf)
    p = np.exp(-d)
    p /= p.sum(1, keepdims=True)
    return (p * target).sum()


def test_nca_gradient_matches_finite_differences():
    rng = np.random.RandomState(0)
    layers = [
        (0.5 * rng.standard_normal((5, 4)), 0.1 * rng.standard_normal(4)),
        (0.5 * rng.standard_normal((4, 3)), 0.1 * rng.standard_normal(3)),
    ]
    Zb = rng.standard_normal((8, 5))
    y = rng.randint(0, 2, 8)
    target = y[:, None] == y[None, :]
    np.fill_diagonal(target, False)
    h = RBMHashing(3)
    grads, value = h._nca_gradients(Zb, target, layers)
    assert value == pytest.approx(_nca_objective(h, Zb, target, layers))
    eps = 1e-6
    for li, (W, b) in enumerate(layers):
        for arr, g in ((W, grads[li][0]), (b, grads[li][1])):
            flat = arr.reshape(-1)
            for j in range(0, flat.size, 3):
                old = flat[j]
                flat[j] = old + eps
                up = _nca_objective(h, Zb, target, layers)
                flat[j] = old - eps
                down = _nca_objective(h, Zb, target, layers)
                flat[j] = old
                # gradients are averaged over the batch
                assert g.reshape(-1)[j] == pytest.approx(
                    (up - down) / (2 * eps) / len(Zb), rel=1e-4, abs=1e-8
                )


def test_fit_improves_nca_objective_and_is_deterministic(tmp_path):
    X, y = load_digits()
    kwargs = dict(hidden_layers=(64,), pretrain_epochs=2, finetune_epochs=10, random_state=0)
    h = RBMHashing(16, **kwargs).fit(X[:800], y[:800])
    assert h.nca_objective_[-1] > h.nca_objective_[0] + 0.1
    codes = h.encode(X)
    np.testing.assert_array_equal(codes, RBMHashing(16, **kwargs).fit(X[:800], y[:800]).encode(X))
    np.testing.assert_array_equal(unpack_bits(codes, 16), h.project(X) >= 0)
    h.save(tmp_path / "rbm")
    np.testing.assert_array_equal(load(tmp_path / "rbm").encode(X), codes)
    # unsupervised (Euclidean neighbours) and pairs also train
    RBMHashing(8, **kwargs).fit(X[:300])
    pairs = np.random.RandomState(0).randint(0, 300, (2000, 2))
    RBMHashing(8, **kwargs).fit(X[:300], pairs=pairs, similar=y[pairs[:, 0]] == y[pairs[:, 1]])


def test_bad_input():
    X, y = load_digits()
    bad = X[:50].copy()
    bad[3, 4] = np.inf
    with pytest.raises(ValueError, match="infinity|NaN"):
        RBMHashing(8, finetune_epochs=1).fit(bad, y[:50])
    with pytest.raises(ValueError, match="hidden_layers"):
        RBMHashing(8, hidden_layers=(0,)).fit(X[:50], y[:50])
    with pytest.raises(ValueError, match="finetune_lr"):
        RBMHashing(8, finetune_lr=-1.0).fit(X[:50], y[:50])
    fitted = RBMHashing(8, hidden_layers=(16,), pretrain_epochs=1, finetune_epochs=1).fit(X[:50])
    with pytest.raises(ValueError, match="NaN"):
        fitted.encode(np.where(X[:5] > 3, np.nan, X[:5]))


def test_beats_lsh_on_digits_label_retrieval():
    X, y = load_digits()
    X = X.astype(np.float64)
    q, db, yq, ydb = X[:200], X[200:], y[:200], y[200:]
    truth = label_neighbors(db, q, ydb, yq)
    scores = {}
    for name, h in (
        (
            "rbm",
            RBMHashing(
                32, hidden_layers=(64,), pretrain_epochs=3, finetune_epochs=15, random_state=0
            ),
        ),
        ("lsh", RandomHyperplaneLSH(32, random_state=0)),
    ):
        h.fit(db, ydb)
        scores[name] = recall_at_m(hamming_cdist(h.encode(q), h.encode(db), 32), truth, [200])[0]
    assert scores["rbm"] > scores["lsh"] + 0.05, scores


@pytest.mark.slow  # the same claim on digits runs in the fast suite
@pytest.mark.skipif(not fashion_mnist_available(FASHION_DIR), reason="Fashion-MNIST not installed")
def test_beats_lsh_at_32_bits_fashion_mnist():
    """Issue 7 / survey Fig. 11: RBM+NCA > LSH on label-based recall of 50 NN at M=500.
    Slow; ``test_beats_lsh_on_digits_label_retrieval`` checks the claim in the fast suite."""
    X, y = load_fashion_mnist(FASHION_DIR, subset="train")
    idx = np.random.RandomState(0).choice(len(X), 3200, replace=False)
    X, y = X[idx].astype(np.float64) / 255.0, y[idx]
    db, q, ydb, yq = X[:3000], X[3000:], y[:3000], y[3000:]
    truth = label_neighbors(db, q, ydb, yq)
    scores = {}
    for name, h in (
        (
            "rbm",
            RBMHashing(
                32, hidden_layers=(128,), pretrain_epochs=3, finetune_epochs=15, random_state=0
            ),
        ),
        ("lsh", RandomHyperplaneLSH(32, random_state=0)),
    ):
        h.fit(db, ydb)
        scores[name] = recall_at_m(hamming_cdist(h.encode(q), h.encode(db), 32), truth, [500])[0]
    assert scores["rbm"] > scores["lsh"] + 0.02, scores


def test_pretraining_settings_are_parameters(tmp_path, capsys, stderr_logging):
    """The CD-1 mini-batch and weight decay are parameters (no hidden constants): changing
    either changes the pre-trained weights; the saved hasher keeps them and its layer sizes."""
    X = np.random.RandomState(0).randn(120, 6)
    kw = dict(n_bits=8, hidden_layers=(12,), pretrain_epochs=2, finetune_epochs=0, random_state=0)
    base = RBMHashing(**kw).fit(X)
    assert base.get_params()["pretrain_batch_size"] == 100
    assert base.get_params()["weight_decay"] == 2e-4
    for change in ({"pretrain_batch_size": 10}, {"weight_decay": 0.1}):
        other = RBMHashing(**kw, **change).fit(X)
        assert not np.allclose(other.coef0_, base.coef0_), change
    h = RBMHashing(**kw, pretrain_batch_size=10, weight_decay=0.1, verbose=True).fit(X)
    assert "pre-trained layer 1" in capsys.readouterr().err
    h.save(tmp_path / "rbm")
    back = load(tmp_path / "rbm")
    assert back.get_params() == h.get_params() and back.hidden_layers == (12,)
    np.testing.assert_array_equal(back.encode(X), h.encode(X))
    with pytest.raises(ValueError, match="'pretrain_batch_size' parameter"):
        RBMHashing(**{**kw, "pretrain_batch_size": 0}).fit(X)
    with pytest.raises(ValueError, match="'weight_decay' parameter"):
        RBMHashing(**{**kw, "weight_decay": -1.0}).fit(X)

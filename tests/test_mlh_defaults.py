"""MinimalLossHashing and BinaryReconstructiveEmbedding with their defaults: the ``"auto"``
selection (held-out rows, per code length, deterministic), and defaults beating the
unsupervised baselines under the §6.1 measure of Norouzi & Fleet (2011): PCA to 40
dimensions of unit-length rows, ground truth the Euclidean threshold giving 50 neighbours
per point on average, precision within Hamming radius 3 averaged per query with an empty
retrieval scoring 0."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest

from hashlearn.codes import hamming_cdist
from hashlearn.evaluate import precision_recall_at_radius
from hashlearn.hashers.bre import BinaryReconstructiveEmbedding
from hashlearn.hashers.lsh import RandomHyperplaneLSH
from hashlearn.hashers.mlh import MinimalLossHashing, select_mlh_hyperparameters
from hashlearn.hashers.pca import IterativeQuantization
from hashlearn.hashers.spectral import SpectralHashing
from hashlearn.supervision import neighbor_threshold, neighbors_within


def _protocol(X, seed, n_train, n_test):
    """§6.1: centre, unit length, PCA-40 fitted on the training rows; all training pairs
    labelled by the 50-neighbour threshold; test rows relevant within the threshold."""
    from hashlearn.experiments.mlh import prepare

    perm = np.random.default_rng(seed).permutation(len(X))
    A, B = prepare(
        np.asarray(X[perm[:n_train]], np.float64),
        np.asarray(X[perm[n_train : n_train + n_test]], np.float64),
        normalise=True,
        n_pca=40,
    )
    thr = neighbor_threshold(A, 50)
    iu = np.triu_indices(len(A), 1)
    P = np.stack(iu, 1).astype(np.int64)
    s = neighbors_within(A, A, thr)[iu]
    return A, B, P, s, neighbors_within(B, A, thr)


def _precision(h, A, B, rel):
    n_bits = getattr(h, "n_bits_", h.n_bits)
    d = hamming_cdist(h.encode(B), h.encode(A), n_bits)
    return precision_recall_at_radius(d, rel, 3, aggregate="per_query")[0]


def _baselines(A, B, rel, n_bits, seed):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ITQ clips n_bits > 40 to 40 with a warning
        models = {
            "LSH": RandomHyperplaneLSH(n_bits, random_state=seed).fit(A),
            "SH": SpectralHashing(n_bits).fit(A),
            "ITQ": IterativeQuantization(n_bits, random_state=seed).fit(A),
        }
    return {k: _precision(h, A, B, rel) for k, h in models.items()}


@pytest.fixture(scope="module")
def digits_x():
    from hashlearn.datasets import load_digits

    return load_digits()[0]


@pytest.fixture(scope="module")
def small(digits_x):
    return _protocol(digits_x, 0, 600, 300)


# ----------------------------------------------------------------------- quick (make test)


def test_defaults_beat_lsh_quick(small):
    """The auto selection (under a small budget) beats LSH at 32 bits, quickly."""
    A, B, P, s, rel = small
    h = MinimalLossHashing(32, time_budget=2.0, random_state=0).fit(A, pairs=P, similar=s)
    lsh = np.mean(
        [_precision(RandomHyperplaneLSH(32, random_state=r).fit(A), A, B, rel) for r in range(3)]
    )
    assert _precision(h, A, B, rel) > lsh + 0.1, (_precision(h, A, B, rel), lsh)


def test_auto_attributes_determinism_and_one_selection_path(small):
    A, _, P, s, _ = small
    kw = dict(n_bits=16, time_budget=1.0, random_state=3)
    a = MinimalLossHashing(**kw).fit(A, pairs=P, similar=s)
    b = MinimalLossHashing(**kw).fit(A, pairs=P, similar=s)
    np.testing.assert_array_equal(a.encode(A), b.encode(A))
    assert a.selection_results_.shape[1] == len(MinimalLossHashing.selection_columns) == 6
    # every candidate was scored; the chosen point is the best screened one
    table = a.selection_results_
    assert len(table) >= 5 and np.all((table[:, 4] >= 0) & (table[:, 4] <= 1))
    screened = table[table[:, 5] < 4]
    chosen = screened[
        (screened[:, 0] == a.rho_) & (screened[:, 1] == a.lam_) & (screened[:, 2] == a.epsilon_)
    ]
    assert len(chosen) == 1 and chosen[0, 4] >= screened[:, 4].max() - 0.005
    assert 1 <= a.n_epochs_ <= max(1, round(table[:, 3].max()))
    assert len(a.loss_history_) == a.n_epochs_ + 1
    # fit's "auto" and the public helper are the same search
    best, rows = select_mlh_hyperparameters(
        A, pairs=P, similar=s, n_bits=16, time_budget=1.0, random_state=3
    )
    assert best == dict(rho=a.rho_, lam=a.lam_, epsilon=a.epsilon_, n_epochs=a.n_epochs_)
    np.testing.assert_allclose(
        [[r[c] for c in MinimalLossHashing.selection_columns] for r in rows], table
    )


def test_rho_is_chosen_per_code_length(small):
    A, _, P, s, _ = small
    for n_bits in (8, 64):
        h = MinimalLossHashing(n_bits, time_budget=1.0, random_state=0).fit(A, pairs=P, similar=s)
        assert 1.0 <= h.rho_ <= n_bits / 2
        rhos = set(h.selection_results_[:, 0])
        assert max(rhos) <= n_bits / 2 and (n_bits < 64 or 32.0 in rhos)


def test_explicit_values_skip_the_selection(small):
    A, _, P, s, _ = small
    kw = dict(rho=5, lam=0.3, epsilon=0.2, n_epochs=2, pairs_per_epoch=2000, random_state=1)
    h = MinimalLossHashing(16, **kw).fit(A, pairs=P, similar=s)
    assert (h.rho_, h.lam_, h.epsilon_, h.n_epochs_) == (5.0, 0.3, 0.2, 2)
    assert h.selection_results_.shape == (0, 6) and h.pairs_per_epoch_ == 2000
    # only the epochs left to choose: rho, lam, epsilon stay as given
    e = MinimalLossHashing(16, rho=5, lam=0.3, epsilon=0.2, time_budget=1.0, random_state=1)
    e.fit(A, pairs=P, similar=s)
    assert (e.rho_, e.lam_, e.epsilon_) == (5.0, 0.3, 0.2)
    assert set(e.selection_results_[:, 0]) == {5.0} and e.n_epochs_ >= 1


def test_auto_with_labels_and_tiny_data_fallback():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 300)
    X = np.eye(3)[y] * 3 + rng.standard_normal((300, 3))
    h = MinimalLossHashing(8, time_budget=1.0, random_state=0).fit(X, y)
    assert len(h.selection_results_) > 0
    bits = h.encode(X)
    same = (bits[:, None, 0] == bits[None, :, 0]).mean(axis=1)
    assert np.isfinite(same).all()
    tiny = MinimalLossHashing(8, random_state=0).fit(X[:10], y[:10])  # too small to hold out
    assert tiny.selection_results_.shape == (0, 6)
    assert (tiny.rho_, tiny.lam_, tiny.epsilon_, tiny.n_epochs_) == (2.0, 0.5, 0.1, 10)


@pytest.mark.parametrize(
    "params,match",
    [
        (dict(time_budget=0), "time_budget"),
        (dict(validation_fraction=0.9), "validation_fraction"),
        (dict(selection_radius=-1), "selection_radius"),
        (dict(verbose=-1), "verbose"),
        (dict(rho="fast"), "rho"),
        (dict(n_epochs="many"), "n_epochs"),
    ],
)
def test_bad_auto_parameters(small, params, match):
    A, _, P, s, _ = small
    with pytest.raises(ValueError, match=match):
        MinimalLossHashing(16, **params).fit(A, pairs=P, similar=s)


def test_verbose_logs_selection_and_epochs(small, caplog):
    A, _, P, s, _ = small
    caplog.set_level(logging.INFO, logger="hashlearn")
    MinimalLossHashing(8, time_budget=0.5, verbose=2, random_state=0).fit(A, pairs=P, similar=s)
    text = caplog.text
    assert "held-out score" in text and "epoch 1/" in text
    caplog.clear()
    BinaryReconstructiveEmbedding(8, n_landmarks=8, n_iter=1, verbose=1, random_state=0).fit(A)
    assert "pass 1/1" in caplog.text


def test_one_sample_uses_sklearn_wording():
    for est in (MinimalLossHashing(8), BinaryReconstructiveEmbedding(8)):
        with pytest.raises(ValueError, match="n_samples=1"):
            est.fit(np.ones((1, 3)), [0]) if est.supervised else est.fit(np.ones((1, 3)))


# ---------------------------------------------------------------- slow: the measure


def _fashion_x():
    from hashlearn.datasets import fashion_mnist_available, load_fashion_mnist

    if not fashion_mnist_available():
        pytest.skip("Fashion-MNIST is not installed")
    return load_fashion_mnist(subset="train")[0]


# Margins over the best of LSH, SH and ITQ (ITQ clips 64 bits to 40 here, which makes it
# the strongest baseline at "64 bits"). Gaps measured with seed 0 of this protocol: digits
# 0.085 (32 bits) and about 0.2 (64); Fashion-MNIST only 0.01 (32) and 0.015 (64), so there
# MLH is only required to win.
MARGIN = {("digits", 32): 0.03, ("digits", 64): 0.1, ("fashion", 32): 0.0, ("fashion", 64): 0.0}


@pytest.mark.slow
@pytest.mark.parametrize("n_bits", [32, 64])
@pytest.mark.parametrize("dataset", ["digits", "fashion"])
def test_mlh_defaults_beat_lsh_sh_itq(dataset, n_bits, digits_x):
    X = digits_x if dataset == "digits" else _fashion_x()
    A, B, P, s, rel = _protocol(X, 1, 1000, 797 if dataset == "digits" else 1000)
    h = MinimalLossHashing(n_bits, random_state=1).fit(A, pairs=P, similar=s)
    mlh = _precision(h, A, B, rel)
    base = _baselines(A, B, rel, n_bits, 1)
    assert mlh > max(base.values()) + MARGIN[(dataset, n_bits)], (mlh, base)


@pytest.mark.slow
def test_bre_defaults_beat_sh_and_lsh_on_digits(digits_x):
    A, B, _, _, rel = _protocol(digits_x, 2, 1000, 797)
    bre = _precision(BinaryReconstructiveEmbedding(32, random_state=2).fit(A), A, B, rel)
    base = _baselines(A, B, rel, 32, 2)
    assert bre > base["SH"] + 0.1 and bre > base["LSH"] + 0.1, (bre, base)

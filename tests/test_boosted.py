"""BoostedSimilarityHashing (BoostSSC / PSH): stump oracle, loss, persistence, real data."""

import os

import numpy as np
import pytest

from hashlearn.codes import hamming_cdist, unpack_bits
from hashlearn.datasets import load_digits
from hashlearn.evaluate import exact_knn, recall_at_m
from hashlearn.hashers.boosted import BoostedSimilarityHashing
from hashlearn.hashers.lsh import RandomHyperplaneLSH
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


def test_first_stump_is_the_weighted_least_squares_optimum():
    """Round 1 (uniform weights) picks the (dim, threshold) of eq. 15, checked by brute force."""
    rng = np.random.RandomState(0)
    X = rng.standard_normal((60, 4))
    y = (X[:, 2] > 0.3).astype(int)  # dimension 2 separates the classes
    h = BoostedSimilarityHashing(1, n_pairs=400, n_thresholds=8, weighted=True, random_state=0).fit(
        X, y
    )
    assert h.features_[0] == 2
    # oracle over the same grid, with the same pairs
    from sklearn.utils import check_random_state

    from hashlearn.supervision import resolve_pairs

    pairs, sim = resolve_pairs(
        X, y, None, None, n_pairs=400, owner="o", random_state=check_random_state(0)
    )
    z = np.where(sim, 1.0, -1.0)
    grid = np.quantile(X, np.linspace(0, 1, 10)[1:-1], axis=0).T
    best = (np.inf, None)
    for k in range(4):
        for thr in grid[k]:
            s = (X[pairs[:, 0], k] > thr) == (X[pairs[:, 1], k] > thr)
            pred = np.where(s, z[s].mean() if s.any() else 0, z[~s].mean() if (~s).any() else 0)
            best = min(best, (((z - pred) ** 2).sum(), (k, thr)), key=lambda t: t[0])
    assert (h.features_[0], h.thresholds_[0]) == (best[1][0], pytest.approx(best[1][1]))
    bits = unpack_bits(h.encode(X), 1)[:, 0]
    np.testing.assert_array_equal(bits, X[:, 2] > h.thresholds_[0])


@pytest.mark.parametrize("weighted", [False, True])
def test_loss_decreases_and_hamming_constraint(weighted):
    X, y = load_digits()
    h = BoostedSimilarityHashing(24, weighted=weighted, n_pairs=4000, random_state=0).fit(X, y)
    assert np.all(np.diff(h.train_loss_) <= 1e-9)
    assert h.train_loss_[-1] < 0.8 * h.train_loss_[0]
    if not weighted:
        assert np.allclose(h.alphas_, h.alphas_[0])
    codes = h.encode(X[:20])
    wh = h.weighted_hamming(codes, codes)
    assert np.allclose(np.diag(wh), 0)
    mq = h.metric_distances(X[:3], np.stack([X[:5]] * 3))
    np.testing.assert_allclose(mq, wh[:3, :5])


def _pairs_and_grid(X, y, n_pairs, n_thr):
    from sklearn.utils import check_random_state

    from hashlearn.supervision import resolve_pairs

    pairs, sim = resolve_pairs(
        X, y, None, None, n_pairs=n_pairs, owner="o", random_state=check_random_state(0)
    )
    grid = np.quantile(X, np.linspace(0, 1, n_thr + 2)[1:-1], axis=0).T
    return pairs, np.where(sim, 1.0, -1.0), grid


@pytest.mark.parametrize("alpha", [0.3, 1.0])
def test_constant_alpha_weak_learner_fixes_alpha(alpha):
    """Torralba's constraint: every round's (stump, beta) minimises eq. 15 with alpha held
    at the given constant, checked by brute force over the grid for the first 3 rounds."""
    rng = np.random.RandomState(1)
    X = rng.standard_normal((80, 3))
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(int)
    h = BoostedSimilarityHashing(3, alpha=alpha, n_pairs=300, n_thresholds=6, random_state=0)
    h.fit(X, y)
    np.testing.assert_array_equal(h.alphas_, alpha)
    assert h.alpha_ == alpha
    pairs, z, grid = _pairs_and_grid(X, y, 300, 6)
    score = np.zeros(len(z))
    for bit in range(3):
        w = np.exp(-z * score)
        w /= w.sum()
        best = (np.inf, None)
        for k in range(3):
            for thr in grid[k]:
                s = ((X[pairs[:, 0], k] > thr) == (X[pairs[:, 1], k] > thr)).astype(float)
                beta = (w * (z - alpha * s)).sum()
                loss = (w * (z - alpha * s - beta) ** 2).sum()
                if loss < best[0] - 1e-12:
                    best = (loss, (k, thr, beta, s))
        k, thr, beta, s = best[1]
        assert h.features_[bit] == k and h.thresholds_[bit] == pytest.approx(thr)
        assert h.betas_[bit] == pytest.approx(beta)
        score += alpha * s + beta


def test_auto_alpha_is_chosen_on_held_out_pairs():
    """alpha="auto" picks a grid value by held-out exponential loss, then boosts all pairs
    with it: the same codes as passing that alpha explicitly."""
    X, y = load_digits()
    auto = BoostedSimilarityHashing(8, n_pairs=2000, random_state=0).fit(X, y)
    assert auto.alpha_ in BoostedSimilarityHashing.ALPHA_GRID
    np.testing.assert_array_equal(auto.alphas_, auto.alpha_)
    fixed = BoostedSimilarityHashing(8, alpha=auto.alpha_, n_pairs=2000, random_state=0)
    np.testing.assert_array_equal(fixed.fit(X, y).encode(X), auto.encode(X))
    free = BoostedSimilarityHashing(2, weighted=True, n_pairs=2000, random_state=0).fit(X, y)
    assert np.isnan(free.alpha_)
    for bad, err in (("big", TypeError), (0.0, ValueError), (-1.0, ValueError)):
        with pytest.raises(err, match="alpha"):
            BoostedSimilarityHashing(4, alpha=bad).fit(X[:50], y[:50])


def test_weighted_hamming_ranks_like_the_learned_similarity():
    """With signed alphas the weighted Hamming distance is sum(alpha + beta) - F (eq. 14),
    so it orders pairs as F does, also when some alpha is negative."""
    X, y = load_digits()
    h = BoostedSimilarityHashing(12, weighted=True, n_pairs=3000, random_state=0).fit(X, y)
    h.alphas_ = h.alphas_.copy()
    h.alphas_[::3] *= -1.0  # make sure negative alphas occur
    a, b = X[:15], X[100:130]
    same = (a[:, None, h.features_] > h.thresholds_) == (b[None, :, h.features_] > h.thresholds_)
    F = (h.alphas_ * same + h.betas_).sum(axis=2)
    wh = h.weighted_hamming(h.encode(a), h.encode(b))
    np.testing.assert_allclose(wh, (h.alphas_ + h.betas_).sum() - F, atol=1e-9)
    assert (wh < 0).any() or (h.alphas_ < 0).any()
    mq = h.metric_distances(a[:3], np.stack([b[:7]] * 3))
    np.testing.assert_allclose(mq, wh[:3, :7], atol=1e-9)


def test_small_and_constant_inputs():
    """No singular systems: constant features, two rows, one feature."""
    X = np.ones((10, 3))
    y = np.arange(10) % 2
    for weighted in (False, True):
        h = BoostedSimilarityHashing(4, weighted=weighted, n_pairs=50, random_state=0)
        assert h.fit(X, y).encode(X).shape == (10, 1)
        assert np.isfinite(h.train_loss_).all()
        h.fit(np.array([[0.0], [1.0], [0.5], [2.0]]), [0, 1, 0, 1])
    with pytest.raises(ValueError, match="one class"):
        BoostedSimilarityHashing(4).fit(X, np.zeros(10, int))
    with pytest.raises(ValueError, match="n_samples = 1"):
        BoostedSimilarityHashing(4).fit(X[:1], [0])


def test_pairs_interface_and_determinism(tmp_path):
    X, y = load_digits()
    rng = np.random.RandomState(0)
    pairs = rng.randint(0, len(X), size=(3000, 2))
    similar = y[pairs[:, 0]] == y[pairs[:, 1]]
    a = BoostedSimilarityHashing(16, random_state=0).fit(X, pairs=pairs, similar=similar)
    b = BoostedSimilarityHashing(16, random_state=0).fit(X, pairs=pairs, similar=similar)
    np.testing.assert_array_equal(a.encode(X), b.encode(X))
    a.save(tmp_path / "b")
    np.testing.assert_array_equal(load(tmp_path / "b").encode(X), a.encode(X))
    with pytest.raises(ValueError, match="supervised"):
        BoostedSimilarityHashing(8).fit(X)
    with pytest.raises(ValueError, match="both similar and dissimilar"):
        BoostedSimilarityHashing(8).fit(X, pairs=pairs, similar=np.ones(len(pairs), bool))
    with pytest.raises(ValueError, match="n_thresholds"):
        BoostedSimilarityHashing(8, n_thresholds=0).fit(X, y)


def test_beats_lsh_on_digits_label_retrieval():
    X, y = load_digits()
    X = X.astype(np.float64)
    q, db, yq, ydb = X[:200], X[200:], y[:200], y[200:]
    truth = label_neighbors(db, q, ydb, yq)
    scores = {}
    for name, h in (
        ("boost", BoostedSimilarityHashing(32, random_state=0)),
        ("lsh", RandomHyperplaneLSH(32, random_state=0)),
    ):
        h.fit(db, ydb)
        scores[name] = recall_at_m(hamming_cdist(h.encode(q), h.encode(db), 32), truth, [200])[0]
    assert scores["boost"] > scores["lsh"] + 0.03, scores


# No Fashion-MNIST ordering test for boosting: the issue's claim "boosted codes beat LSH at 32
# bits on label-based recall@500" did not hold robustly on raw Fashion-MNIST pixels
# (single-pixel stumps): 81.9 vs 77.6 on one 5000-item split (PSH, weighted), 79.3 vs 81.3
# on the `hashlearn reproduce survey --quick` split. Asserting it on the favourable split
# would be cherry-picking; the numbers are reported in docs/results.md ("survey").

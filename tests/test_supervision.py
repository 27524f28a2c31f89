"""Supervision helpers: pairs from labels / neighbours, thresholds, explicit pairs."""

from __future__ import annotations

import numpy as np
import pytest

from hashlearn.supervision import (
    check_pairs,
    neighbor_threshold,
    neighbors_within,
    pairs_from_label_neighbourhoods,
    pairs_from_labels,
    pairs_from_neighbors,
    resolve_pairs,
    sample_pairs,
)


def _brute_sq(A, B):
    return ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1)


def test_pairs_from_labels_are_labelled_by_class():
    rng = np.random.RandomState(0)
    y = rng.randint(0, 5, size=300)
    pairs, similar = pairs_from_labels(y, 2000, similar_fraction=0.3, random_state=1)
    assert pairs.shape == (2000, 2) and pairs.dtype == np.int64
    assert np.array_equal(similar, y[pairs[:, 0]] == y[pairs[:, 1]])
    assert (pairs[:, 0] != pairs[:, 1]).all()
    assert similar.sum() == 600


def test_pairs_from_labels_cover_every_class_member():
    y = np.array([0, 0, 0, 1, 1, 2])  # class 2 has one member: never an anchor of a similar pair
    pairs, similar = pairs_from_labels(y, 4000, random_state=0)
    sim = pairs[similar]
    assert set(np.unique(sim)) == {0, 1, 2, 3, 4}
    counts = np.bincount(sim.ravel(), minlength=6)[:5]
    # within class 0 every member is chosen equally often (binomial tolerance)
    c0 = counts[:3]
    assert np.abs(c0 - c0.mean()).max() < 5 * np.sqrt(c0.mean())


def test_pairs_from_labels_deterministic_and_errors():
    y = np.repeat([0, 1], 10)
    a = pairs_from_labels(y, 50, random_state=3)
    b = pairs_from_labels(y, 50, random_state=3)
    assert all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))
    with pytest.raises(ValueError, match="single class"):
        pairs_from_labels(np.zeros(10), 5)
    with pytest.raises(ValueError, match="similar_fraction"):
        pairs_from_labels(y, 5, similar_fraction=1.5)
    with pytest.raises(ValueError, match="no class with two members"):
        pairs_from_labels(np.arange(5), 5)


def test_resolve_pairs_forms_and_errors():
    X = np.zeros((6, 2))
    y = np.array([0, 0, 0, 1, 1, 1])
    p, s = resolve_pairs(X, y, None, None, n_pairs=20, owner="T", random_state=0)
    assert p.shape == (20, 2) and np.array_equal(s, y[p[:, 0]] == y[p[:, 1]])
    p, s = resolve_pairs(X, None, [[0, 5]], [0], n_pairs=20, owner="T")
    assert p.tolist() == [[0, 5]] and s.tolist() == [False]
    with pytest.raises(ValueError, match="index rows of X"):
        resolve_pairs(X, None, [[0, 6]], [True], n_pairs=1, owner="T")
    with pytest.raises(ValueError, match="not both"):
        resolve_pairs(X, y, [[0, 1]], [True], n_pairs=1, owner="T")
    with pytest.raises(ValueError, match="supervised"):
        resolve_pairs(X, None, None, None, n_pairs=1, owner="T")
    with pytest.raises(ValueError, match="one label per row"):
        resolve_pairs(X, y[:3], None, None, n_pairs=1, owner="T")
    with pytest.raises(ValueError, match="without pairs"):
        resolve_pairs(X, None, None, [True], n_pairs=1, owner="T")
    with pytest.raises(TypeError, match="integer"):
        check_pairs([[0.5, 1.0]], [True], 6, "T")
    with pytest.raises(ValueError, match="booleans"):
        check_pairs([[0, 1]], [2], 6, "T")


@pytest.mark.parametrize("n, max_rows", [(200, 5000), (400, 100)])
def test_neighbor_threshold_gives_k_neighbours_on_average(n, max_rows):
    rng = np.random.RandomState(0)
    X = rng.randn(n, 5)
    thr = neighbor_threshold(X, 20, max_rows=max_rows, random_state=0)
    d = np.sqrt(_brute_sq(X, X))
    np.fill_diagonal(d, np.inf)
    avg = (d <= thr).sum(1).mean()
    if max_rows >= n:
        assert avg == pytest.approx(20, abs=1e-9)
    else:  # estimated from a subset of rows
        assert abs(avg - 20) < 3
    W = neighbors_within(X, X, thr)
    assert np.array_equal(W, np.sqrt(_brute_sq(X, X)) <= thr)


def test_neighbor_threshold_rejects_too_many_neighbours():
    with pytest.raises(ValueError, match="n_neighbors"):
        neighbor_threshold(np.zeros((5, 2)), 5)


def test_sample_pairs_distinct_rows():
    p = sample_pairs(3, 1000, random_state=0)
    assert (p[:, 0] != p[:, 1]).all() and p.min() >= 0 and p.max() < 3
    with pytest.raises(ValueError, match="n_samples"):
        sample_pairs(1, 5)


def test_pairs_from_neighbors_labels_match_threshold():
    rng = np.random.RandomState(1)
    X = rng.randn(300, 4)
    pairs, similar = pairs_from_neighbors(X, 10, 1000, random_state=0)
    thr = neighbor_threshold(X, 10, random_state=np.random.RandomState(0))
    d = np.sqrt(((X[pairs[:, 0]] - X[pairs[:, 1]]) ** 2).sum(1))
    assert (pairs[:, 0] != pairs[:, 1]).all()
    assert np.array_equal(similar, d <= thr + 1e-9)
    assert 0.4 < similar.mean() < 0.7


def _brute_neighbourhood(X, y, k, anchors):
    """For each anchor, the k nearest rows of its class and of the other classes."""
    want = set()
    for a in anchors:
        d = ((X - X[a]) ** 2).sum(1)
        d[a] = np.inf
        for mask in (y == y[a], y != y[a]):
            rows = np.flatnonzero(mask & np.isfinite(d))
            want |= {(int(a), int(j)) for j in rows[np.argsort(d[rows])][:k]}
    return want


@pytest.mark.parametrize(
    "max_anchors, max_flops, n_anchors",
    [(10_000, 3e11, 1500), (700, 3e11, 700), (10_000, 1.0, 1000)],
)
def test_pairs_from_label_neighbourhoods_against_brute_force(max_anchors, max_flops, n_anchors):
    rng = np.random.RandomState(0)
    X = rng.standard_normal((1500, 7))
    y = rng.randint(0, 4, 1500)
    k = 5
    P, s = pairs_from_label_neighbourhoods(
        X, y, k, max_anchors=max_anchors, max_flops=max_flops, random_state=1
    )
    anchors = np.unique(P[:, 0])
    assert len(anchors) == n_anchors  # capped by max_anchors, or by the flops (>= 1000)
    assert np.array_equal(s, y[P[:, 0]] == y[P[:, 1]])
    assert (P[:, 0] != P[:, 1]).all() and P.min() >= 0 and P.max() < 1500
    # every anchor's 2k neighbourhood pairs, k uniform ones, and k pairs from labels
    assert len(P) == 4 * k * len(anchors)
    near = _brute_neighbourhood(X, y, k, anchors)
    got = {tuple(p) for p in P.tolist()}
    assert near <= got
    counts = np.bincount(P[:, 0], minlength=1500)[anchors]
    assert counts.sum() == len(P) and (counts >= 3 * k).all()  # pairs from labels: any anchor


def test_pairs_from_label_neighbourhoods_search_a_sample_of_large_sets():
    rng = np.random.RandomState(0)
    X = rng.standard_normal((900, 3))
    y = np.arange(900) % 3
    P, s = pairs_from_label_neighbourhoods(X, y, 4, max_candidates=300, random_state=0)
    anchors = np.unique(P[:, 0])
    assert len(anchors) == 300
    # the neighbours are the nearest among the sampled rows (the anchors themselves here)
    near = _brute_neighbourhood(X[anchors], y[anchors], 4, np.arange(300))
    got = {(int(a), int(b)) for a, b in P.tolist()}
    assert {(int(anchors[a]), int(anchors[b])) for a, b in near} <= got
    assert np.array_equal(s, y[P[:, 0]] == y[P[:, 1]])


def test_pairs_from_label_neighbourhoods_small_classes_and_errors():
    X = np.arange(12.0).reshape(6, 2)
    y = np.array([0, 0, 1, 1, 1, 1])
    P, s = pairs_from_label_neighbourhoods(X, y, 3, random_state=0)
    sim_of_0 = P[(P[:, 0] == 0) & s, 1]
    assert 1 in sim_of_0  # class 0 has one other member: all it can give
    with pytest.raises(ValueError, match="1 class"):
        pairs_from_label_neighbourhoods(X, np.zeros(6), 3)
    with pytest.raises(ValueError, match="one label per row"):
        pairs_from_label_neighbourhoods(X, np.zeros(5), 3)
    with pytest.raises(ValueError, match="n_neighbors"):
        pairs_from_label_neighbourhoods(X, y, 0)


def test_pairs_from_label_neighbourhoods_refuse_overflowing_distances():
    X = np.random.RandomState(0).standard_normal((50, 3)) * 1e300
    y = np.arange(50) % 2
    with pytest.raises(ValueError, match="overflow float64"):
        pairs_from_label_neighbourhoods(X, y, 3)

"""Neighbour selection by absolute / relative Hamming thresholds (the LambdaRank
bit-vector paper (WWW), Sec. 3.5.2), in evaluate and Searcher, against brute-force oracles."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hashlearn.datasets import load_digits
from hashlearn.evaluate import bin_threshold, hamming_neighbors, knn_classify, knn_regress
from hashlearn.hashers.lsh import RandomHyperplaneLSH
from hashlearn.index.flat import FlatIndex
from hashlearn.index.hamming_ball import HammingBallIndex
from hashlearn.search import Searcher


def _oracle(d_row, radius=None, n_bins=None):
    if radius is None:
        radius = np.unique(d_row)[:n_bins].max()
    keep = np.flatnonzero(d_row <= radius)
    return keep[np.lexsort((keep, d_row[keep]))]


@given(seed=st.integers(0, 2**31), n_bins=st.integers(1, 6), radius=st.integers(0, 8))
@settings(max_examples=60, deadline=None)
def test_hamming_neighbors_oracle(seed, n_bins, radius):
    rng = np.random.default_rng(seed)
    d = rng.integers(0, 9, size=(7, 30))
    for kw in ({"n_bins": n_bins}, {"radius": radius}):
        lims, D, I = hamming_neighbors(d, **kw)
        for i in range(d.shape[0]):
            ref = _oracle(d[i], **kw)
            np.testing.assert_array_equal(I[lims[i] : lims[i + 1]], ref)
            np.testing.assert_array_equal(D[lims[i] : lims[i + 1]], d[i, ref])


def test_relative_threshold_paper_example():
    """Sec. 3.5.2: neighbours at distances 4, 7, 12, 17, 20 and k = 3 -> 4, 7 and 12 (with
    an absolute threshold 3 nothing)."""
    d = np.array([[20, 4, 12, 7, 17, 7, 12]])
    assert bin_threshold(d, 3).tolist() == [12]
    lims, D, I = hamming_neighbors(d, n_bins=3)
    assert D.tolist() == [4, 7, 7, 12, 12] and I.tolist() == [1, 3, 5, 2, 6]
    lims, D, I = hamming_neighbors(d, radius=3)
    assert lims.tolist() == [0, 0]


def test_knn_regress_oracle():
    rng = np.random.default_rng(0)
    d = rng.integers(0, 6, size=(20, 40))
    t = rng.normal(size=40)
    for k in (1, 3):
        pred = knn_regress(d, t, k=k)
        ref = [t[_oracle(d[i], n_bins=k)].mean() for i in range(20)]
        np.testing.assert_allclose(pred, ref)
    pred = knn_regress(d, t, radius=0)
    has = (d == 0).any(axis=1)
    assert np.isnan(pred[~has]).all()
    np.testing.assert_allclose(pred[has], [t[d[i] == 0].mean() for i in np.flatnonzero(has)])


def test_bad_input():
    d = np.zeros((2, 3), np.int64)
    with pytest.raises(ValueError, match="exactly one"):
        hamming_neighbors(d)
    with pytest.raises(ValueError, match="exactly one"):
        hamming_neighbors(d, radius=1, n_bins=1)
    with pytest.raises(ValueError, match="n_bins"):
        hamming_neighbors(d, n_bins=0)
    with pytest.raises(ValueError, match="db_targets"):
        knn_regress(d, np.zeros(2), k=1)
    with pytest.raises(ValueError, match="exactly one"):
        knn_regress(d, np.zeros(3))


@pytest.mark.parametrize("index_cls", [FlatIndex, HammingBallIndex])
def test_searcher_neighbors_matches_evaluate(index_cls):
    X, y = load_digits()
    hasher = RandomHyperplaneLSH(16, random_state=0).fit(X[:500])
    searcher = Searcher(hasher, index_cls(16))
    searcher.add(X[:1000])
    from hashlearn.codes import hamming_cdist

    dist = hamming_cdist(hasher.encode(X[1000:1100]), hasher.encode(X[:1000]), 16)
    for kw in ({"n_bins": 1}, {"n_bins": 3}, {"radius": 2}):
        got = searcher.neighbors(X[1000:1100], **kw)
        ref = hamming_neighbors(dist, **kw)
        for a, b in zip(got, ref, strict=False):
            np.testing.assert_array_equal(a, b)
    # majority vote of the selected neighbours == knn_classify with the relative threshold
    lims, _, ids = searcher.neighbors(X[1000:1100], n_bins=3)
    votes = [np.bincount(y[ids[lims[i] : lims[i + 1]]], minlength=10) for i in range(100)]
    pred = knn_classify(dist, y[:1000], k=3)
    agree = [v[p] == v.max() for v, p in zip(votes, pred, strict=False)]
    assert all(agree)
    with pytest.raises(ValueError, match="exactly one"):
        searcher.neighbors(X[:2])

"""Bucketers: boosted search forest, k-means trees, LSH tables (Li et al., "Learning to search
efficiently in high dimensions", NIPS 2011)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.decomposition import PCA
from sklearn.exceptions import NotFittedError

from hashlearn.datasets import load_digits
from hashlearn.evaluate import exact_knn, recall_at_m_from_ids
from hashlearn.forest.base import TreeBuilder, tree_leaves, weighted_candidates_csr
from hashlearn.forest.boosted import BoostedSearchForest, _best_threshold, _candidate_directions
from hashlearn.forest.kmeans_tree import KMeansTree
from hashlearn.forest.lsh_tables import LSHTables
from hashlearn.index.table import KEY_LOCAL_MASK, TableIndex


def small_forest(**kw):
    params = dict(n_trees=3, max_depth=6, lam=0.2, n_pairs=4000, k_similar=10, random_state=0)
    params.update(kw)
    return BoostedSearchForest(**params)


@pytest.fixture(scope="module")
def blobs():
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((8, 6)) * 5
    X = centers[rng.integers(0, 8, 600)] + rng.standard_normal((600, 6))
    return X


BUCKETERS = [
    lambda: small_forest(),
    lambda: small_forest(split="stump"),
    lambda: small_forest(split="hybrid", stump_above=100),
    lambda: KMeansTree(n_trees=3, max_depth=5, random_state=0),
    lambda: LSHTables(3, 7, random_state=0),
]


@pytest.mark.parametrize("make", BUCKETERS)
def test_keys_deterministic_roundtrip_and_tagged(make, blobs, tmp_path):
    b = make().fit(blobs)
    keys = b.keys(blobs)
    assert keys.dtype == np.int64 and keys.shape == (len(blobs), b.n_tables)
    assert np.all((keys >> 40) == b.key_tag_)
    np.testing.assert_array_equal(make().fit(blobs).keys(blobs), keys)  # same random_state
    b.save(tmp_path / "b")
    loaded = type(b).load(tmp_path / "b", mmap=True)
    np.testing.assert_array_equal(loaded.keys(blobs), keys)
    assert loaded.key_tag_ == b.key_tag_
    with pytest.raises(ValueError, match="features"):
        b.keys(blobs[:, :3])
    with pytest.raises(NotFittedError):
        make().keys(blobs)


def python_leaves(x, arrays, tree, tol=0.0):
    """Walk one tree node by node in plain Python. Returns None when the point passes within
    ``tol`` (relative) of a split plane, where the side would depend on summation order."""
    v = arrays["roots_"][tree]
    while arrays["left_"][v] >= 0:
        f = arrays["feature_"][v]
        if f >= 0:
            s, scale = x[f], 0.0
        else:
            p = arrays["proj_"][-f - 1]
            s, scale = float(p @ x), float(np.abs(p) @ np.abs(x))
        if tol > 0 and abs(s - arrays["threshold_"][v]) <= tol * scale:
            return None
        v = arrays["left_"][v] if s > arrays["threshold_"][v] else arrays["right_"][v]
    return arrays["leaf_id_"][v]


TREE_ARRAYS = ("roots_", "left_", "right_", "feature_", "threshold_", "leaf_id_", "proj_")


def test_tree_kernel_matches_python_walk(blobs):
    """Kernel vs a Python walk. No point in the data comes near a split plane (thresholds lie
    midway between training values), so the comparison does not depend on summation order;
    a point within 1e-9 (relative) of a plane would be reported, not compared."""
    b = small_forest(split="hybrid", stump_above=150).fit(blobs)
    arrays = {k: getattr(b, k) for k in TREE_ARRAYS}
    assert (b.feature_ >= 0).any() and (b.feature_[b.left_ >= 0] < 0).any()  # both kinds
    got = b.leaves(blobs)
    want = [[python_leaves(x, arrays, t, tol=1e-9) for t in range(3)] for x in blobs]
    assert not any(w is None for row in want for w in row)  # no near-ties at all
    np.testing.assert_array_equal(got, np.array(want))
    np.testing.assert_array_equal(got, tree_leaves(blobs, b))
    np.testing.assert_array_equal(got, b.leaves(blobs, n_threads=1))
    # leaves are numbered 0..n_leaves-1 in every tree
    for t in range(3):
        assert got[:, t].max() < b.n_leaves_[t]


def _as_fitted(arrays):
    """An object with the tree arrays as attributes, what tree_leaves reads."""

    class Trees:
        pass

    obj = Trees()
    for k, v in arrays.items():
        setattr(obj, k, v)
    return obj


def test_tree_kernel_exact_on_integer_data():
    """Integer data and integer hyperplanes: every score is exact in any summation order,
    so the kernel must agree with the Python walk on every point, ties included."""
    rng = np.random.default_rng(3)
    X = rng.integers(-4, 5, size=(400, 7)).astype(np.float64)
    tb = TreeBuilder(7)
    root = tb.new_node()
    a, b = tb.set_split(root, None, rng.integers(-3, 4, 7).astype(float), 0.0)
    tb.set_split(a, 2, None, 1.0)
    c, _ = tb.set_split(b, None, rng.integers(-3, 4, 7).astype(float), -2.0)
    tb.set_split(c, None, np.ones(7), 3.0)  # many points exactly on this plane
    tb.finish_tree(root)
    arrays = tb.arrays()
    obj = _as_fitted(arrays)
    want = np.array([python_leaves(x, arrays, 0) for x in X])
    np.testing.assert_array_equal(tree_leaves(X, obj)[:, 0], want)
    np.testing.assert_array_equal(tree_leaves(X, obj, n_threads=2)[:, 0], want)
    assert (X.sum(1) == 3.0).any()  # the tie case occurs


def _capture(monkeypatch, cls, name):
    calls = []
    original = getattr(cls, name)

    def wrapper(*args, **kwargs):
        out = original(*args, **kwargs)
        calls.append(out)
        return out

    monkeypatch.setattr(cls, name, wrapper)
    return calls


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "kw", [{"split": "projection"}, {"split": "stump"}, {"split": "hybrid", "stump_above": 150}]
)
def test_fit_time_leaves_equal_keys(monkeypatch, blobs, seed, kw):
    """The leaf each training point reaches while boosting (which sets the pair weights of
    the next trees) is the leaf keys() gives it."""
    calls = _capture(monkeypatch, BoostedSearchForest, "_grow_tree")
    rng = np.random.default_rng(seed)
    X = blobs[rng.permutation(len(blobs))[:400]] * rng.uniform(0.5, 3.0)
    b = small_forest(random_state=seed, **kw).fit(X)
    fit_leaves = np.stack([leaves for _, leaves, _ in calls], axis=1)
    np.testing.assert_array_equal(fit_leaves, b.leaves(X))
    # thresholds never sit on a training value
    for t_node in np.flatnonzero(b.left_ >= 0):
        f = b.feature_[t_node]
        if f >= 0:
            assert not np.any(X[:, f] == b.threshold_[t_node])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kmeans_fit_time_leaves_equal_keys(monkeypatch, blobs, seed):
    calls = _capture(monkeypatch, KMeansTree, "_grow_tree")
    km = KMeansTree(n_trees=3, max_depth=5, random_state=seed).fit(blobs)
    leaves = km.leaves(blobs)
    for t, (_, leaf_rows) in enumerate(calls):
        fit_leaf = np.full(len(blobs), -1)
        for node, rows in leaf_rows:
            fit_leaf[rows] = km.leaf_id_[node]
        np.testing.assert_array_equal(fit_leaf, leaves[:, t])


def test_keys_do_not_depend_on_the_batch(blobs):
    """A row's keys are the same whether it is encoded alone, in a batch, or on 1 or 2
    threads (row-wise kernels, no BLAS blocking)."""
    for b in (
        LSHTables(3, 7, random_state=0).fit(blobs),
        small_forest(split="hybrid", stump_above=150).fit(blobs),
        KMeansTree(n_trees=2, max_depth=4, random_state=0).fit(blobs),
    ):
        whole = b.keys(blobs)
        np.testing.assert_array_equal(b.keys(blobs, n_threads=1), whole)
        singles = np.vstack([b.keys(blobs[i : i + 1]) for i in range(0, len(blobs), 7)])
        np.testing.assert_array_equal(singles, whole[::7])


def test_tree_builder_numbers_leaves_depth_first():
    tb = TreeBuilder(2)
    root = tb.new_node()
    left, right = tb.set_split(root, 0, None, 0.0)
    tb.set_split(right, 1, None, 1.0)
    tb.finish_tree(root)
    arrays = tb.arrays()
    assert arrays["n_leaves_"].tolist() == [3]
    X = np.array([[1.0, 0.0], [-1.0, 2.0], [-1.0, 0.0]])

    class A:
        pass

    obj = A()
    for k, v in arrays.items():
        setattr(obj, k, v)
    assert tree_leaves(X, obj)[:, 0].tolist() == [0, 1, 2]


def test_best_threshold_matches_brute_force():
    rng = np.random.default_rng(5)
    v = rng.standard_normal(50)
    a, b = rng.integers(0, 50, 80), rng.integers(0, 50, 80)
    w = rng.random(80)
    theta, gain = _best_threshold(v, v[a], v[b], w, 0.3, 3, 16)
    left = v > theta
    cut = w[left[a] != left[b]].sum()
    m1, m2 = left.sum(), (~left).sum()
    assert gain == pytest.approx(2 * 0.3 * m1 * m2 - cut)
    assert min(m1, m2) >= 3
    # no threshold among the candidates (quantiles of v) does better
    for t in np.unique(v)[:-1]:
        lt = v > t
        if min(lt.sum(), (~lt).sum()) >= 3 and t in np.sort(v)[(np.arange(1, 17) * 49) // 17]:
            assert 2 * 0.3 * lt.sum() * (~lt).sum() - w[lt[a] != lt[b]].sum() <= gain + 1e-9


def _threshold_oracle(v, va, vb, w, cost, min_leaf, n_thresholds):
    """Every candidate's gain by a direct pass over the pairs (the kernel sweeps once)."""
    s = np.sort(v)
    m = len(v)
    best, seen = (np.nan, -np.inf), set()
    for t in range(1, n_thresholds + 1):
        q = s[(t * (m - 1)) // (n_thresholds + 1)]
        if q in seen:
            continue
        seen.add(q)
        larger = s[s > q]
        if not len(larger):
            break
        mid = q / 2.0 + larger[0] / 2.0
        mid = mid if q < mid < larger[0] else q
        if np.isnan(best[0]):
            best = (mid, -np.inf)
        m_left = int((v > q).sum())
        if min(m_left, m - m_left) < min_leaf:
            continue
        cut = w[(np.minimum(va, vb) <= q) & (np.maximum(va, vb) > q)].sum()
        gain = 2.0 * cost * m_left * (m - m_left) - cut
        if gain > best[1]:
            best = (mid, gain)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_best_threshold_sweep_equals_a_pass_per_candidate(seed):
    """Tied values, repeated quantiles, pairs with equal ends, integer weights (exact in
    any summation order): the sweep's threshold and gain are the direct computation's."""
    rng = np.random.default_rng(seed)
    m, n_pairs = int(rng.integers(2, 120)), int(rng.integers(0, 300))
    v = rng.integers(0, 6, m).astype(float) if seed % 2 else rng.standard_normal(m)
    a, b = rng.integers(0, m, n_pairs), rng.integers(0, m, n_pairs)
    w = rng.integers(1, 5, n_pairs).astype(float)
    args = (v, v[a], v[b], w, float(rng.random() * 0.05), int(rng.integers(1, 4)), 16)
    want = _threshold_oracle(*args)
    got = _best_threshold(*args)
    np.testing.assert_equal(got, want)


def test_lsh_tables_keys_are_sign_bits():
    X = np.random.default_rng(6).standard_normal((50, 5))
    lsh = LSHTables(2, 4, random_state=3).fit(X)
    bits = (X @ lsh.directions_.T > lsh.directions_ @ X.mean(0)).astype(np.int64)
    want = np.stack([sum(bits[:, t * 4 + j] << j for j in range(4)) for t in range(2)], 1)
    np.testing.assert_array_equal(lsh.leaves(X), want)
    assert np.all(lsh.keys(X) & KEY_LOCAL_MASK == want)


def test_kmeans_tree_leaves_are_nearest_centroid_cells(blobs):
    km = KMeansTree(n_trees=1, max_depth=1, random_state=0).fit(blobs)
    leaves = km.leaves(blobs)[:, 0]
    c0, c1 = blobs[leaves == 0].mean(0), blobs[leaves == 1].mean(0)
    nearer0 = ((blobs - c0) ** 2).sum(1) < ((blobs - c1) ** 2).sum(1)
    # Lloyd's iterations converged: each point is in the cell of its nearer centroid
    assert (nearer0 == (leaves == 0)).mean() > 0.99


def test_boosting_reweights_and_tree_weights_follow_eq15(blobs):
    bsf = small_forest(n_trees=4).fit(blobs)
    assert bsf.tree_weights_.shape == (4,) and np.all(bsf.tree_weights_ > 0)
    # the weights used are eq. 15's, clipped to [1e-3, 50]; the raw ones are kept
    assert np.array_equal(bsf.tree_weights_, np.clip(bsf.raw_tree_weights_, 1e-3, 50.0))
    # later trees differ from the first (pairs are reweighted and resampled)
    leaves = bsf.leaves(blobs)
    assert not np.array_equal(leaves[:, 0], leaves[:, 1])
    # a larger lam prices candidates higher: more leaves, smaller buckets
    cheap = small_forest(n_trees=1, lam=0.05).fit(blobs)
    dear = small_forest(n_trees=1, lam=0.6).fit(blobs)
    assert dear.n_leaves_[0] > cheap.n_leaves_[0]


def test_labels_similarity(blobs):
    y = (blobs[:, 0] > 0).astype(int)
    bsf = small_forest(similarity="labels").fit(blobs, y)
    assert bsf.keys(blobs).shape == (600, 3)
    with pytest.raises(ValueError, match="needs labels"):
        small_forest(similarity="labels").fit(blobs)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"lam": 0.0}, "lam"),
        ({"lam": 1.0}, "lam"),
        ({"lam": 1.5}, "lam"),
        ({"lam": -0.1}, "lam"),
        ({"split": "oblique"}, "split"),
        ({"n_trees": 0}, "n_trees"),
        ({"similarity": "cosine"}, "similarity"),
        ({"max_depth": 0}, "max_depth"),
        ({"similar_fraction": 1.0}, "similar_fraction"),
    ],
)
def test_bad_parameters(kw, match, blobs):
    with pytest.raises(ValueError, match=match):
        small_forest(**kw).fit(blobs)


def test_empty_tree_is_an_error(blobs):
    # a tiny lam makes every candidate nearly free: no split raises J at the root
    with pytest.warns(UserWarning, match="empty"):
        bsf = small_forest(lam=1e-9, n_trees=1).fit(blobs)
    assert bsf.n_leaves_.tolist() == [1]
    with pytest.warns(UserWarning, match="k_similar"):
        assert small_forest(k_similar=50).fit(blobs[:20]).keys(blobs[:3]).shape == (3, 3)
    with pytest.raises(ValueError, match="single leaf"):
        KMeansTree(n_trees=1, max_depth=3).fit(np.ones((10, 3)))
    with pytest.raises(ValueError, match="n_tables"):
        LSHTables(0, 4).fit(blobs)
    with pytest.raises(ValueError, match="bits_per_table"):
        LSHTables(2, 41).fit(blobs)


def _recall_curve(bucketer, db, queries, true_nn, m_values):
    index = TableIndex(bucketer.n_tables, bucketer=bucketer)
    index.add(bucketer.keys(db))
    lims, ids, _ = index.candidates_csr(bucketer.keys(queries))
    width = max(m_values)
    ranked = np.full((len(queries), width), -1, np.int64)
    for q in range(len(queries)):
        c = ids[lims[q] : lims[q + 1]][:width]
        ranked[q, : len(c)] = c
    return recall_at_m_from_ids(ranked, true_nn, m_values), np.diff(lims).mean()


def test_paper_ordering_on_digits():
    """BSF finds more of the true 20-NN than k-means trees and LSH tables with as many trees
    of the same depth, while returning fewer candidates (Li et al. 2011, Fig. 1a,
    on the embedded digits data; candidates ordered by collision count)."""
    X, _ = load_digits()
    X = PCA(16, random_state=0).fit_transform(X / 16.0)
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(X))
    db, queries = X[perm[200:]], X[perm[:200]]
    _, true_nn = exact_knn(db, queries, 20)
    m_values = [25, 50, 100, 200]
    common = dict(n_trees=4, max_depth=6)
    bsf = BoostedSearchForest(lam=0.1, n_pairs=20000, k_similar=20, random_state=0, **common).fit(
        db
    )
    km = KMeansTree(random_state=0, **common).fit(db)
    lsh = LSHTables(4, 6, random_state=0).fit(db)
    r_bsf, n_bsf = _recall_curve(bsf, db, queries, true_nn, m_values)
    r_km, n_km = _recall_curve(km, db, queries, true_nn, m_values)
    r_lsh, n_lsh = _recall_curve(lsh, db, queries, true_nn, m_values)
    # measured: bsf [.53 .72 .87 .87] from 82 candidates; km [.50 .72 .83 .86] from 106;
    # lsh [.37 .50 .66 .75] from 165
    assert n_bsf < n_km < n_lsh
    assert np.all(r_bsf > r_lsh + 0.05)
    assert r_bsf[-1] > r_km[-1] + 0.01  # all candidates: more recall from fewer of them
    assert r_bsf[0] > r_km[0] + 0.01 and np.all(r_bsf >= r_km - 0.01)


def _fashion_ordering(path=None):
    from hashlearn.datasets import load_fashion_mnist

    X, _ = load_fashion_mnist(path, subset="train")
    rng = np.random.default_rng(0)
    X = X[rng.permutation(len(X))[:8200]] / 255.0
    X = PCA(32, random_state=0).fit_transform(X)
    db, queries = X[:8000], X[8000:]
    _, true_nn = exact_knn(db, queries, 100)
    m_values = [100, 200, 400]
    train = db[:3000]
    bsf = BoostedSearchForest(
        n_trees=8, max_depth=6, lam=0.1, n_pairs=20000, k_similar=38, random_state=0
    ).fit(train)
    km = KMeansTree(n_trees=8, max_depth=6, random_state=0).fit(train)
    lsh = LSHTables(8, 6, random_state=0).fit(train)
    return [_recall_curve(b, db, queries, true_nn, m_values) for b in (bsf, km, lsh)]


@pytest.mark.slow  # the same ordering on digits runs in the fast suite
@pytest.mark.skipif(
    not __import__("hashlearn.datasets").datasets.fashion_mnist_available(),
    reason="Fashion-MNIST is not installed",
)
def test_paper_ordering_on_fashion_mnist():
    """Fig. 1a on a Fashion-MNIST subsample (8000 items, 200 queries, 8 trees of depth 6).
    Measured: R@100/200/400 bsf .517/.739/.877 (485 candidates), km .440/.632/.732 (395),
    lsh .390/.562/.722 (1725). Slow; ``test_paper_ordering_on_digits`` checks the same
    ordering in the fast suite."""
    (r_bsf, n_bsf), (r_km, n_km), (r_lsh, n_lsh) = _fashion_ordering()
    ok = np.array([100, 200, 400]) <= min(n_bsf, n_km, n_lsh)
    assert ok.any()
    assert np.all(r_bsf[ok] > r_km[ok] + 0.02)
    assert np.all(r_bsf[ok] > r_lsh[ok] + 0.05)


def brute_force_weighted_vote(db_keys, q_keys, ids, weights):
    """Alg./eq. 8 in plain Python: T(q, x) = sum_m c_m [key_m(q) == key_m(x)] for every
    item, candidates T > 0 sorted by (-T, id)."""
    out = []
    for qk in q_keys:
        scored = []
        for row, i in zip(db_keys, ids, strict=True):
            t = sum(float(w) for w, a, b in zip(weights, qk, row, strict=True) if a == b)
            if t > 0:
                scored.append((-t, int(i), t))
        out.append(sorted(scored))
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_forest_ranking_is_the_weighted_vote(blobs, seed):
    """BoostedSearchForest.candidates ranks by the learned selection function T (eq. 8).
    Weights rounded to multiples of 1/64 make every sum exact (no summation-order
    dependence) and create ties, broken by id."""
    bsf = small_forest(n_trees=4, random_state=seed).fit(blobs[:500])
    rng = np.random.default_rng(seed)
    ids = rng.permutation(5000)[:500]
    index = TableIndex(bsf.n_tables, bucketer=bsf)
    index.add(bsf.keys(blobs[:500]), ids=ids)
    queries = blobs[500:]
    weights = np.maximum(np.round(bsf.tree_weights_ * 64) / 64, 1 / 64)
    bsf.tree_weights_ = weights
    lims, got_ids, scores = bsf.candidates(index, queries)
    want = brute_force_weighted_vote(bsf.keys(blobs[:500]), bsf.keys(queries), ids, weights)
    for q in range(len(queries)):
        sl = slice(lims[q], lims[q + 1])
        assert got_ids[sl].tolist() == [i for _, i, _ in want[q]]
        assert scores[sl].tolist() == [t for _, _, t in want[q]]
    # the candidate set is the unweighted one (T > 0 iff one collision); only the order moves
    lims_u, ids_u, counts = index.candidates_csr(bsf.keys(queries))
    np.testing.assert_array_equal(lims_u, lims)
    for q in range(len(queries)):
        sl = slice(lims[q], lims[q + 1])
        assert set(ids_u[sl].tolist()) == set(got_ids[sl].tolist())
    # the order differs from the collision count somewhere when the weights differ
    if len(set(weights.tolist())) > 1:
        assert any(
            ids_u[lims[q] : lims[q + 1]].tolist() != got_ids[lims[q] : lims[q + 1]].tolist()
            for q in range(len(queries))
        )


def test_weighted_candidates_unit_weights_are_collision_counts(blobs):
    km = KMeansTree(n_trees=3, max_depth=4, random_state=0).fit(blobs)
    index = TableIndex(3, bucketer=km)
    index.add(km.keys(blobs))
    lims, ids, scores = km.candidates(index, blobs[:50], n_threads=2)
    lims_u, ids_u, counts = index.candidates_csr(km.keys(blobs[:50]))
    np.testing.assert_array_equal(lims, lims_u)
    np.testing.assert_array_equal(ids, ids_u)
    np.testing.assert_array_equal(scores, counts)
    with pytest.raises(ValueError, match="weights"):
        weighted_candidates_csr(index, km.keys(blobs[:2]), np.ones(2))
    with pytest.raises(ValueError, match="weights"):
        weighted_candidates_csr(index, km.keys(blobs[:2]), np.array([1.0, 0.0, 1.0]))
    with pytest.raises(TypeError, match="TableIndex"):
        weighted_candidates_csr(object(), km.keys(blobs[:2]), np.ones(3))


@pytest.mark.parametrize(
    "m, n_pairs, d", [(5, 3, 24), (12, 10, 24), (40, 60, 24), (300, 900, 24), (300, 900, 12)]
)
def test_candidate_directions_are_the_top_eigenvectors(m, n_pairs, d):
    """Eq. 18's direction (and the principal direction) against numpy's dense eigh: exact
    reductions for small nodes, 16 Lanczos steps for larger ones (checked to be within a
    small angle on data with a decaying spectrum, as image features have)."""
    rng = np.random.default_rng(m)
    Xc = rng.standard_normal((m, d)) * np.geomspace(4.0, 0.1, d)
    Xc -= Xc.mean(axis=0)
    a, b = rng.integers(0, m, n_pairs), rng.integers(0, m, n_pairs)
    pw = rng.random(n_pairs) + 0.1
    dirs = _candidate_directions(Xc, Xc, a, b, pw)
    S = np.zeros((m, m))
    np.add.at(S, (a, b), pw)
    top_pair = np.linalg.eigh(Xc.T @ (S + S.T) @ Xc)[1][:, -1]
    top_pca = np.linalg.eigh(Xc.T @ Xc)[1][:, -1]
    np.testing.assert_allclose(np.linalg.norm(dirs, axis=1), 1.0, atol=1e-9)
    assert abs(dirs[0] @ top_pair) > 0.999
    assert abs(dirs[2] @ top_pca) > 0.999
    no_pairs = _candidate_directions(Xc, Xc, a[:0], b[:0], pw[:0])
    assert no_pairs.shape == (1, d) and abs(no_pairs[0] @ top_pca) > 0.999


def _fixed_order_dot(a, b):
    """The split score's order of operations in plain Python: four partial sums over the
    columns j = l mod 4, leftover columns into the first, combined pairwise."""
    s = [0.0, 0.0, 0.0, 0.0]
    n4 = len(a) - len(a) % 4
    for j in range(n4):
        s[j % 4] += float(a[j]) * float(b[j])
    for j in range(n4, len(a)):
        s[0] += float(a[j]) * float(b[j])
    return (s[0] + s[1]) + (s[2] + s[3])


@pytest.mark.parametrize("d", [1, 3, 4, 5, 8, 31, 64, 65])
@pytest.mark.parametrize("order", ["C", "F"])
def test_row_dot_has_one_order_of_operations(d, order):
    """row_dot (vectorised for C arrays, a loop otherwise) gives the bits of the fixed
    order on floats of mixed magnitudes, where another order would round differently."""
    import numba

    from hashlearn._utils.dense import row_dot

    rng = np.random.default_rng(d)
    A = np.asarray(rng.standard_normal((6, d)) * 10.0 ** rng.integers(-8, 8, (6, d)), order=order)
    B = np.asarray(rng.standard_normal((5, d)) * 10.0 ** rng.integers(-8, 8, (5, d)), order=order)

    @numba.njit
    def all_pairs(A, B, out):
        for a in range(A.shape[0]):
            for b in range(B.shape[0]):
                out[a, b] = row_dot(A, a, B, b)

    got = np.empty((6, 5))
    all_pairs(A, B, got)
    want = np.array([[_fixed_order_dot(A[a], B[b]) for b in range(5)] for a in range(6)])
    np.testing.assert_array_equal(got, want)


def test_tree_walk_in_lanes_equals_the_python_walk():
    """Rows walk down in groups of _WALK_LANES, one level at a time: a forest of uneven
    depth (a leaf at depth 1 beside deep ones) over a row count that is not a multiple of
    the group, every row's leaf equal to the Python walk with the same score."""
    from hashlearn.forest import base

    rng = np.random.default_rng(4)
    d, n = 13, 8 * base._WALK_LANES + 3
    X = rng.standard_normal((n, d))
    tb = TreeBuilder(d)
    root = tb.new_node()
    shallow, deep = tb.set_split(root, None, rng.standard_normal(d), 0.0)
    for _ in range(5):
        deep, _ = tb.set_split(deep, None, rng.standard_normal(d), -0.3)
    tb.finish_tree(root)
    arrays = tb.arrays()
    obj = _as_fitted(arrays)

    def walk(x):
        v = arrays["roots_"][0]
        while arrays["left_"][v] >= 0:
            s = _fixed_order_dot(arrays["proj_"][-arrays["feature_"][v] - 1], x)
            v = arrays["left_"][v] if s > arrays["threshold_"][v] else arrays["right_"][v]
        return arrays["leaf_id_"][v]

    want = np.array([walk(x) for x in X])
    assert len(set(want)) > 3
    np.testing.assert_array_equal(tree_leaves(X, obj, n_threads=1)[:, 0], want)
    np.testing.assert_array_equal(tree_leaves(X, obj, n_threads=2)[:, 0], want)

"""RankHashing (the LambdaRank bit-vector paper, WWW): gradients vs finite differences, eq. 1-2,
persistence, bad input, and the paper's ordering on digits."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from hashlearn.codes import hamming_cdist, unpack_bits
from hashlearn.datasets import load_digits
from hashlearn.evaluate import knn_classify
from hashlearn.hashers.lsh import RandomHyperplaneLSH
from hashlearn.hashers.rank import RankHashing, _sigmoid


@pytest.fixture(scope="module")
def digits_split():
    X, y = load_digits()
    order = np.random.RandomState(0).permutation(len(X))
    X, y = X[order], y[order]
    return X[:1000], y[:1000], X[1000:1600], y[1000:1600]


def _initialised(n_features=6, n_bits=5, seed=0, **params):
    rng = np.random.RandomState(seed)
    model = RankHashing(n_bits=n_bits, **params)
    model.weights_ = rng.normal(0, 0.7, (n_features, n_bits))
    model.bias_ = rng.normal(0, 0.3, n_bits)
    model.docs_per_query_ = params.get("docs_per_query", 100)  # as fit resolves it
    return model


def _numeric_gradient(loss_of, weights, eps=1e-6):
    grad = np.zeros_like(weights)
    for idx in np.ndindex(weights.shape):
        old = weights[idx]
        weights[idx] = old + eps
        up = loss_of()
        weights[idx] = old - eps
        down = loss_of()
        weights[idx] = old
        grad[idx] = (up - down) / (2 * eps)
    return grad


def test_triplet_gradient_matches_finite_differences():
    rng = np.random.RandomState(1)
    Xs = rng.normal(size=(12, 6))
    model = _initialised()
    triplets = rng.randint(0, 12, size=(9, 3))

    def loss():
        return model._triplet_gradient(Xs, triplets)[2] / len(triplets)

    grad_w, grad_b, _, _ = model._triplet_gradient(Xs, triplets)
    np.testing.assert_allclose(grad_w, _numeric_gradient(loss, model.weights_), atol=1e-6)
    np.testing.assert_allclose(grad_b, _numeric_gradient(loss, model.bias_), atol=1e-6)


@pytest.mark.parametrize("task", ["classification", "regression", "retrieval"])
def test_ranknet_query_gradient_matches_finite_differences(task):
    """The batched RankNet gradient over (query, doc, doc) pairs (eq. 2-4) is the derivative
    of the summed pair cross-entropy divided by the number of queries."""
    rng = np.random.RandomState(2)
    n = 15
    Xs = rng.normal(size=(n, 6))
    y = rng.randint(0, 3, n) if task == "classification" else rng.normal(size=n)
    neighbors = np.sort(np.argsort(rng.rand(n, n), axis=1)[:, :4], axis=1)
    model = _initialised(objective="ranknet", task=task, docs_per_query=8)
    queries = np.array([0, 3, 7, 11])

    def run():
        return model._query_gradient(
            Xs, y if task != "retrieval" else None, neighbors, queries, np.random.RandomState(5)
        )

    grad_w, grad_b, _, n_pairs = run()
    assert n_pairs > 0
    np.testing.assert_allclose(
        grad_w, _numeric_gradient(lambda: run()[2] / 4, model.weights_), atol=1e-6
    )
    np.testing.assert_allclose(
        grad_b, _numeric_gradient(lambda: run()[2] / 4, model.bias_), atol=1e-6
    )


def test_lambdarank_reweights_only_boundary_swaps():
    """LambdaRank (eq. 5): zero gradient when every relevant doc is already inside the
    selected bins and every irrelevant one outside (no swap changes S)."""
    rng = np.random.RandomState(3)
    Xs = rng.normal(size=(30, 6))
    y = np.arange(30) % 2
    model = _initialised(task="classification", docs_per_query=29, n_bits=6)
    # codes = sign of the first feature's projection direction only: class = sign(x0)
    Xs[:, 0] = np.where(y == 1, 3.0, -3.0)
    model.weights_[:] = 0
    model.weights_[0, :] = 0.5  # h = 0.82 or 0.18: not saturated
    model.bias_[:] = 0
    grad_w, grad_b, _, _ = model._query_gradient(
        Xs, y, None, np.arange(30), np.random.RandomState(0)
    )
    assert np.abs(grad_w).max() < 1e-6 and np.abs(grad_b).max() < 1e-6
    model.objective = "ranknet"
    grad_w, _, _, _ = model._query_gradient(Xs, y, None, np.arange(30), np.random.RandomState(0))
    assert np.abs(grad_w).max() > 0  # RankNet still pushes the (already right) pairs apart


def test_codes_are_rounded_sigmoid_and_relaxed_score_is_hamming(digits_split):
    X, y, Xq, _ = digits_split
    model = RankHashing(24, n_epochs=1, random_state=0).fit(X, y)
    h = _sigmoid(model.project(X[:50]))
    bits = unpack_bits(model.encode(X[:50]), 24).astype(bool)
    np.testing.assert_array_equal(bits, h >= 0.5)  # eq. 1, rounded
    model.weights_ *= 1e4  # saturate the sigmoid: h is binary, eq. 2 = Hamming distance
    model.bias_ *= 1e4
    relaxed = model.relaxed_hamming(Xq[:20], X[:30])
    exact = hamming_cdist(model.encode(Xq[:20]), model.encode(X[:30]), 24)
    np.testing.assert_allclose(relaxed, exact, atol=1e-2)  # integers, up to rare z ~ 0


def test_same_seed_same_codes_and_save_load(digits_split, tmp_path):
    X, y, Xq, _ = digits_split
    a = RankHashing(16, n_epochs=2, random_state=7).fit(X, y)
    b = RankHashing(16, n_epochs=2, random_state=7).fit(X, y)
    np.testing.assert_array_equal(a.encode(Xq), b.encode(Xq))
    a.save(tmp_path / "rank")
    loaded = RankHashing.load(tmp_path / "rank")
    np.testing.assert_array_equal(loaded.encode(Xq), a.encode(Xq))
    assert loaded.get_params() == a.get_params()


def test_sparse_input_and_other_tasks(digits_split):
    X, y, Xq, _ = digits_split
    model = RankHashing(16, n_epochs=2, random_state=0).fit(sp.csr_matrix(X[:300]), y[:300])
    np.testing.assert_array_equal(model.encode(sp.csr_matrix(Xq[:10])), model.encode(Xq[:10]))
    for task, target in (("retrieval", None), ("regression", y[:300].astype(float))):
        for objective in ("ranknet", "lambdarank"):
            m = RankHashing(16, task=task, objective=objective, n_epochs=3, random_state=0)
            m.fit(X[:300], target)
            assert m.encode(Xq[:5]).shape == (5, 2)
            assert np.isfinite(m.loss_curve_).all()
    triplet_model = RankHashing(16, n_epochs=3, random_state=0)
    triplets = np.array([[i, i + 1, i + 2] for i in range(0, 200, 3)])
    triplet_model.fit(X[:300], triplets=triplets)
    assert triplet_model.loss_curve_[-1] < triplet_model.loss_curve_[0]


def test_bad_input(digits_split):
    X, y, _, _ = digits_split
    with pytest.raises(ValueError, match="triplets"):
        RankHashing(8).fit(X[:50], triplets=np.array([[0, 1, 50]]))
    with pytest.raises(ValueError, match="triplets"):
        RankHashing(8).fit(X[:50], triplets=np.array([[0, -1, 2]]))
    with pytest.raises(ValueError, match="triplets"):
        RankHashing(8).fit(X[:50], triplets=np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="class labels"):
        RankHashing(8).fit(X[:50])
    with pytest.raises(ValueError, match="real targets"):
        RankHashing(8, task="regression").fit(X[:50])
    with pytest.raises(ValueError, match="takes no y"):
        RankHashing(8, task="retrieval").fit(X[:50], y[:50])
    with pytest.raises(ValueError, match="2 classes"):
        RankHashing(8).fit(X[:50], np.zeros(50, int))
    with pytest.raises(ValueError, match="'objective'"):
        RankHashing(8, objective="listnet").fit(X[:50], y[:50])
    with pytest.raises(ValueError, match="'task'"):
        RankHashing(8, task="ranking").fit(X[:50], y[:50])
    with pytest.raises(ValueError, match="'radius'"):
        RankHashing(8, task="retrieval", radius=9).fit(X[:50])
    with pytest.raises(ValueError, match="'learning_rate'"):
        RankHashing(8, learning_rate=0).fit(X[:50], y[:50])
    with pytest.raises(ValueError, match="'classification_score'"):
        RankHashing(8, classification_score="majority").fit(X[:50], y[:50])
    with pytest.raises(ValueError, match="verbose"):
        RankHashing(8, verbose=-1).fit(X[:50], y[:50])
    with pytest.raises(ValueError, match="requires y to be passed"):
        RankHashing(8).fit(X[:50])
    with pytest.raises(ValueError, match="not pairs"):
        RankHashing(8).fit(X[:50], pairs=np.array([[0, 1]]), similar=np.array([True]))


def test_class_similarity_eq10_checks_identity_and_save(digits_split, tmp_path):
    """eq. 10 with F = I is eq. 7 (identical codes); a graded F trains, saves and loads."""
    X, y, Xq, _ = digits_split
    kw = dict(n_bits=16, n_epochs=2, docs_per_query=30, random_state=0)
    flat = RankHashing(**kw).fit(X[:300], y[:300])
    ident = RankHashing(class_similarity=np.eye(10), **kw).fit(X[:300], y[:300])
    np.testing.assert_array_equal(flat.encode(Xq), ident.encode(Xq))
    F = np.where(np.arange(10)[:, None] // 5 == np.arange(10)[None, :] // 5, 0.5, 0.0)
    np.fill_diagonal(F, 1.0)
    hier = RankHashing(class_similarity=F, **kw).fit(X[:300], y[:300])
    np.testing.assert_array_equal(hier.class_similarity_, F)
    hier.save(tmp_path / "hier")
    loaded = RankHashing.load(tmp_path / "hier")
    np.testing.assert_array_equal(loaded.encode(Xq), hier.encode(Xq))
    np.testing.assert_array_equal(loaded.get_params()["class_similarity"], F)
    assert not hasattr(flat.fit(X[:300], y[:300]), "class_similarity_")
    with pytest.raises(ValueError, match="class_similarity"):
        RankHashing(8, class_similarity=np.eye(3)).fit(X[:50], y[:50])
    with pytest.raises(ValueError, match="class_similarity"):
        RankHashing(8, class_similarity=np.eye(10), classification_score="margin").fit(
            X[:50], y[:50]
        )
    with pytest.raises(ValueError, match="finite"):
        RankHashing(8, class_similarity=np.full((10, 10), np.nan)).fit(X[:50], y[:50])


def test_hierarchical_delta_matches_swapping():
    """eq. 10: |ΔS_Hier| of a straddling swap, against swapping and re-scoring; the
    RankNet pairs are ordered by F(l_q, .)."""
    rng = np.random.RandomState(5)
    Q, D, B = 5, 20, 9
    F = rng.rand(3, 3)
    model = RankHashing(n_bits=B, k=2)
    hq, hd = rng.rand(Q, B), rng.rand(Q, D, B)
    y = rng.randint(0, 3, 40)
    queries = rng.choice(40, Q, replace=False)
    docs = rng.randint(0, 40, (Q, D))
    gain = model._gain(y, None, queries, docs, F)
    np.testing.assert_array_equal(gain, F[y[queries][:, None], y[docs]])
    qi, ai, bi = np.nonzero(gain[:, :, None] > gain[:, None, :])
    delta = model._delta_score(hq, hd, gain, y, queries, docs, qi, ai, bi)
    checked = 0
    for q, a, b, d in zip(qi, ai, bi, delta, strict=True):
        dist = ((hq[q] >= 0.5) != (hd[q] >= 0.5)).sum(axis=1)
        bins = np.unique(dist)
        top, win = bins[:2].max(), bins[: max(B // 3, 3)].max()
        if (dist[a] <= top) == (dist[b] <= top) or max(dist[a], dist[b]) > win:
            assert d == 0.0
            continue
        swapped = dist.copy()
        swapped[a], swapped[b] = dist[b], dist[a]
        rel = F[y[queries[q]], y[docs[q]]]
        assert np.isclose(d, abs(rel[swapped <= top].sum() - rel[dist <= top].sum()))
        checked += 1
    assert checked > 10


def test_retrieval_radius_is_absolute():
    """task="retrieval" with ``radius``: the selected set is every document within the
    radius (at least the nearest bin), not capped at the k-th non-empty bin."""
    rng = np.random.RandomState(6)
    Q, D, B = 4, 30, 12
    model = RankHashing(n_bits=B, k=1, task="retrieval", radius=5)
    hq, hd = rng.rand(Q, B), rng.rand(Q, D, B)
    docs = rng.randint(0, 50, (Q, D))
    gain = rng.randint(0, 2, (Q, D)).astype(float)
    qi, ai, bi = np.nonzero(gain[:, :, None] > gain[:, None, :])
    delta = model._delta_score(hq, hd, gain, None, np.arange(Q), docs, qi, ai, bi)
    dist = ((hq[:, None, :] >= 0.5) != (hd >= 0.5)).sum(axis=2)
    top = np.maximum(5, dist.min(axis=1))  # the radius, or the nearest bin if beyond it
    window = np.array([np.unique(r)[: max(B // 3, 2)].max() for r in dist])
    within = np.maximum(window, top)[qi]
    inside = dist <= top[:, None]
    straddle = inside[qi, ai] != inside[qi, bi]
    weighed = straddle & (dist[qi, ai] <= within) & (dist[qi, bi] <= within)
    np.testing.assert_array_equal(delta > 0, weighed)
    nearest_bin = np.array([(r == r.min()).sum() for r in dist])
    assert (inside.sum(axis=1) > nearest_bin).any()  # the radius reaches past one bin


def _brute_force_delta(model, hq, hd, y, queries, docs, score):
    """|S(O) - S(O')| by actually swapping two documents' Hamming distances (so their
    positions) and re-evaluating S over the selected bins (relative threshold k)."""
    Q, D = docs.shape
    out = {}
    for q in range(Q):
        dist = ((hq[q] >= 0.5) != (hd[q] >= 0.5)).sum(axis=1)
        window = max(model.n_bits // 3, model.k + 1)
        bins = np.unique(dist)
        top, win = bins[: model.k].max(), bins[:window].max()

        def S(dd, q=q, top=top):
            sel = dd <= top  # the same selected bins (the swap moves documents, not bins)
            labels = y[docs[q]][sel]
            if score == "count":
                return float((labels == y[queries[q]]).sum())
            counts = np.bincount(labels, minlength=y.max() + 1).astype(float)
            c = counts[y[queries[q]]]
            counts[y[queries[q]]] = -np.inf
            return min(c - max(counts.max(), 0.0), 1.0)

        for a in range(D):
            for b in range(D):
                inside_a, inside_b = dist[a] <= top, dist[b] <= top
                if inside_a == inside_b or max(dist[a], dist[b]) > win:
                    continue
                swapped = dist.copy()
                swapped[a], swapped[b] = dist[b], dist[a]
                out[q, a, b] = abs(S(swapped) - S(dist))
    return out


@pytest.mark.parametrize("score", ["count", "margin"])
def test_lambdarank_delta_score_matches_swapping(score):
    """|ΔS| of LambdaRank (eq. 5) for the classification score: eq. 7 (``count``) or the
    capped margin, against swapping the two documents and re-scoring in Python."""
    rng = np.random.RandomState(4)
    Q, D, B = 6, 25, 9
    model = RankHashing(n_bits=B, k=2, classification_score=score)
    hq = rng.rand(Q, B)
    hd = rng.rand(Q, D, B)
    y = rng.randint(0, 3, 40)
    queries = rng.choice(40, Q, replace=False)
    docs = rng.randint(0, 40, (Q, D))
    gain = (y[docs] == y[queries][:, None]).astype(float)
    qi, ai, bi = np.nonzero(gain[:, :, None] > gain[:, None, :])
    delta = model._delta_score(hq, hd, gain, y, queries, docs, qi, ai, bi)
    want = _brute_force_delta(model, hq, hd, y, queries, docs, score)
    got = {(q, a, b): d for q, a, b, d in zip(qi, ai, bi, delta, strict=True)}
    for key, value in got.items():
        assert value == want.get(key, 0.0), (key, value, want.get(key))
    assert sum(v > 0 for v in got.values()) > 10
    if score == "count":
        assert set(np.unique(delta)) <= {0.0, 1.0}


def test_fit_sets_only_fitted_attributes_and_logs(digits_split, caplog):
    import logging

    X, y, _, _ = digits_split
    model = RankHashing(8, n_epochs=2, docs_per_query=20, verbose=1, random_state=0)
    before = dict(vars(model))
    triplets = np.array([[i, i + 1, i + 2] for i in range(0, 90, 3)])
    with caplog.at_level(logging.INFO, logger="hashlearn"):
        model.fit(X[:100], triplets=triplets)
    after = {k: v for k, v in vars(model).items() if not k.endswith("_")}
    assert after == before  # no parameter changed, nothing private left behind
    assert RankHashing.supervised is True and "supervised" not in vars(model)
    assert sum("epoch" in r.getMessage() for r in caplog.records) == 2


def test_paper_ordering_on_digits(digits_split):
    """Table 4's ordering with the relative threshold k = 3, on digits at 32 bits:
    LambdaRank (eq. 7 score) <= RankNet < LSH in k-NN error (issue 31's ordering). One split
    cannot tell the two rank codes apart, so LambdaRank only must not be significantly above
    RankNet (paired over the queries, z <= 2); ``test_supervised_defaults`` holds the
    ordering over 5 draws. Measured on this split with the defaults (50 documents a query at
    32 bits): 3.67 %, 3.17 %, 12.17 % (with 100 documents: 3.83 %, 3.83 %)."""
    X, y, Xq, yq = digits_split
    wrong = {}
    for name, model in (
        ("lsh", RandomHyperplaneLSH(32, random_state=0)),
        ("ranknet", RankHashing(32, objective="ranknet", random_state=0)),
        ("lambdarank", RankHashing(32, objective="lambdarank", random_state=0)),
    ):
        model.fit(X, y)
        dist = hamming_cdist(model.encode(Xq), model.encode(X), 32)
        wrong[name] = (knn_classify(dist, y, k=3) != yq).astype(np.float64)
    errors = {k: float(v.mean()) for k, v in wrong.items()}
    diff = wrong["lambdarank"] - wrong["ranknet"]
    assert diff.mean() <= 2.0 * diff.std(ddof=1) / np.sqrt(len(diff)), errors
    assert errors["ranknet"] + 0.02 < errors["lsh"], errors
    assert errors["lambdarank"] + 0.02 < errors["lsh"], errors


@pytest.mark.parametrize("pooled", [False, True])
def test_nearest_rows_match_brute_force(monkeypatch, pooled):
    """The neighbour documents: each row's m nearest other rows, as brute force finds them
    (ties to the smaller id), among a random pool of rows when the search would be too
    large; never the row itself."""
    import hashlearn.hashers.rank as rank

    rng = np.random.RandomState(0)
    X = rng.randint(0, 4, size=(60, 3)).astype(np.float64)  # integer data: exact ties
    if pooled:
        monkeypatch.setattr(rank, "_NEAR_FLOPS", 2.0 * 60 * 3 * 25)  # a pool of 25 rows
    near = rank._nearest_rows(X, 5, np.random.RandomState(1))
    assert near.shape == (60, 5) and near.dtype == np.int64
    assert not (near == np.arange(60)[:, None]).any()
    pool = np.arange(60)
    if pooled:
        pool = np.sort(np.random.RandomState(1).choice(60, 25, replace=False))
    d = ((X[:, None, :] - X[None, pool, :]) ** 2).sum(-1)
    for i in range(60):
        order = [int(pool[j]) for j in np.lexsort((pool, d[i])) if pool[j] != i][:5]
        assert near[i].tolist() == order, i


def test_neighbor_docs_are_the_first_documents(digits_split):
    X, y, _, _ = digits_split
    model = RankHashing(8, docs_per_query=12, neighbor_docs=4, random_state=0)
    model._near = np.arange(40, dtype=np.int64).reshape(10, 4) + 100
    model.docs_per_query_ = 12
    Xs = model._standardize_fit(X[:200])
    model.weights_ = np.random.RandomState(0).normal(0, 0.1, (X.shape[1], 8))
    model.bias_ = np.zeros(8)
    seen = {}
    real = model._gain

    def spy(y_, neighbors, queries, docs, similarity):
        seen["docs"] = docs.copy()
        return real(y_, neighbors, queries, docs, similarity)

    model._gain = spy
    queries = np.array([0, 3, 9])
    model._query_gradient(Xs, y[:200], None, queries, np.random.RandomState(2))
    np.testing.assert_array_equal(seen["docs"][:, :4], model._near[queries])
    assert (seen["docs"][:, 4:] != queries[:, None]).all()
    with pytest.raises(ValueError, match="neighbor_docs"):
        RankHashing(8, neighbor_docs=-1).fit(X[:50], y[:50])
    # 0 is the paper's sampling: no neighbour search, the same codes as before the option
    a = RankHashing(8, n_epochs=2, neighbor_docs=0, random_state=0).fit(X[:300], y[:300])
    b = RankHashing(8, n_epochs=2, neighbor_docs=5, random_state=0).fit(X[:300], y[:300])
    assert not hasattr(a, "_near") and not hasattr(b, "_near")
    assert not np.array_equal(a.encode(X[:300]), b.encode(X[:300]))

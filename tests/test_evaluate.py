"""Tests of hashlearn.evaluate against slow, obviously correct references."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.neighbors import NearestNeighbors

from hashlearn import evaluate as ev

SETTINGS = settings(max_examples=40, deadline=None)
seeds = st.integers(0, 2**32 - 1)


def random_problem(seed: int, max_bits: int = 6):
    """A small Hamming distance matrix with many ties, relevance and a bit count."""
    rng = np.random.default_rng(seed)
    m, n = rng.integers(1, 6), rng.integers(1, 30)
    n_bits = int(rng.integers(1, max_bits + 1))
    d = rng.integers(0, n_bits + 1, size=(m, n)).astype(np.int32)
    relevant = rng.random((m, n)) < rng.random()
    return rng, d, relevant, n_bits


# ----------------------------------------------------------------------------- references


def ref_order(keys_row) -> list[int]:
    return sorted(range(len(keys_row)), key=lambda j: (keys_row[j], j))


def ref_pr(d, rel, radius, aggregate, empty):
    if aggregate == "pooled":
        hits = sum(
            1
            for i in range(d.shape[0])
            for j in range(d.shape[1])
            if d[i, j] <= radius and rel[i, j]
        )
        retrieved = sum(
            1 for i in range(d.shape[0]) for j in range(d.shape[1]) if d[i, j] <= radius
        )
        n_rel = int(rel.sum())
        return (hits / retrieved if retrieved else 0.0, hits / n_rel if n_rel else 0.0)
    precisions, recalls = [], []
    for i in range(d.shape[0]):
        got = [j for j in range(d.shape[1]) if d[i, j] <= radius]
        hits = sum(1 for j in got if rel[i, j])
        if got:
            precisions.append(hits / len(got))
        elif empty == "zero":
            precisions.append(0.0)
        if rel[i].any():
            recalls.append(hits / rel[i].sum())
    return (
        float(np.mean(precisions)) if precisions else 0.0,
        float(np.mean(recalls)) if recalls else 0.0,
    )


def ref_recall_at_m(ranked_rows, true_rows, m_values):
    out = []
    for M in m_values:
        per_query = []
        for ranked, true in zip(ranked_rows, true_rows, strict=True):
            true = {t for t in true if t >= 0}
            if true:
                per_query.append(len(true & {r for r in ranked[:M] if r >= 0}) / len(true))
        out.append(np.mean(per_query) if per_query else 0.0)
    return np.array(out)


def ref_ap(ranked_rel, n_relevant, depth):
    hits, total = 0, 0.0
    for j, r in enumerate(ranked_rel[:depth], start=1):
        if r:
            hits += 1
            total += hits / j
    return total / min(n_relevant, depth)


def ref_vote(dists, labels) -> int:
    if not labels:
        return -1
    counts = Counter(labels)
    best = max(counts.values())
    tied = [c for c in counts if counts[c] == best]
    return min(
        tied, key=lambda c: (min(d for d, lab in zip(dists, labels, strict=True) if lab == c), c)
    )


def ref_knn(d, labels, radius=None, k=None):
    pred = []
    for row in d:
        if radius is None:
            bins = sorted(set(row.tolist()))
            thr = bins[min(k, len(bins)) - 1]
        else:
            thr = radius
        voters = [j for j in range(len(row)) if row[j] <= thr]
        pred.append(ref_vote([row[j] for j in voters], [labels[j] for j in voters]))
    return np.array(pred)


# ------------------------------------------------------------------------------ exact_knn


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean", "cosine"])
def test_exact_knn_matches_sklearn(metric):
    rng = np.random.default_rng(0)
    X, Q = rng.normal(size=(200, 6)), rng.normal(size=(23, 6))
    D, ids = ev.exact_knn(X, Q, 9, metric=metric, batch_size=5)
    nn = NearestNeighbors(n_neighbors=9, algorithm="brute", metric=metric).fit(X)
    D_ref, ids_ref = nn.kneighbors(Q)
    assert D.dtype == np.float32 and ids.dtype == np.int64
    np.testing.assert_array_equal(ids, ids_ref)
    np.testing.assert_allclose(D, D_ref, rtol=1e-5, atol=1e-6)


def test_exact_knn_inner_product_descending_and_sparse():
    rng = np.random.default_rng(1)
    X, Q = rng.normal(size=(50, 5)), rng.normal(size=(7, 5)).astype(np.float32)
    D, ids = ev.exact_knn(X, Q, 4, metric="inner_product")
    scores = Q.astype(np.float64) @ X.T
    np.testing.assert_array_equal(ids, np.argsort(-scores, axis=1, kind="stable")[:, :4])
    assert np.all(np.diff(D, axis=1) <= 0)
    for metric in ["euclidean", "cosine", "inner_product"]:
        dense = ev.exact_knn(X, Q, 4, metric=metric)
        sparse = ev.exact_knn(sp.csr_matrix(X), sp.csr_matrix(Q), 4, metric=metric)
        np.testing.assert_array_equal(dense[1], sparse[1])
        np.testing.assert_allclose(dense[0], sparse[0], rtol=1e-6)


@SETTINGS
@given(seeds, st.sampled_from(["euclidean", "sqeuclidean", "inner_product"]))
def test_exact_knn_ties_go_to_smaller_index(seed, metric):
    rng = np.random.default_rng(seed)
    n, m, k = int(rng.integers(1, 40)), int(rng.integers(1, 5)), int(rng.integers(1, 45))
    X = rng.integers(0, 3, size=(n, 2))
    Q = rng.integers(0, 3, size=(m, 2))
    D, ids = ev.exact_knn(
        X.astype(float), Q.astype(float), k, metric=metric, batch_size=int(rng.integers(1, 4))
    )
    for i in range(m):
        if metric == "inner_product":
            keys = [-int(Q[i] @ x) for x in X]
        else:
            keys = [int(((Q[i] - x) ** 2).sum()) for x in X]
        expected = ref_order(keys)[:k]
        np.testing.assert_array_equal(ids[i, : len(expected)], expected)
        np.testing.assert_array_equal(ids[i, len(expected) :], -1)
        pad = -np.inf if metric == "inner_product" else np.inf
        assert np.all(D[i, len(expected) :] == pad)


def test_exact_knn_cut_keeps_smaller_tied_index():
    # Five items tie at the 2nd distance; the two kept must be the smallest indices.
    X = np.array([[3.0], [1.0], [1.0], [0.0], [1.0], [1.0], [1.0]])
    D, ids = ev.exact_knn(X, np.array([[0.0]]), 3)
    np.testing.assert_array_equal(ids, [[3, 1, 2]])
    np.testing.assert_allclose(D, [[0.0, 1.0, 1.0]])


def test_exact_knn_rejects_bad_input():
    X = np.ones((5, 3))
    with pytest.raises(ValueError, match="X_query"):
        ev.exact_knn(X, np.ones((2, 4)), 1)
    with pytest.raises(ValueError, match="NaN"):
        ev.exact_knn(X, np.full((2, 3), np.nan), 1)
    with pytest.raises(ValueError, match="NaN"):
        ev.exact_knn(sp.csr_matrix(np.full((2, 3), np.inf)), X, 1)
    with pytest.raises(TypeError, match="float32 or float64"):
        ev.exact_knn(X.astype(int), X, 1)
    with pytest.raises(TypeError, match="X_db"):
        ev.exact_knn(X.tolist(), X, 1)
    with pytest.raises(ValueError, match="'k'"):
        ev.exact_knn(X, X, 0)
    with pytest.raises(ValueError, match="metric"):
        ev.exact_knn(X, X, 1, metric="manhattan")
    with pytest.raises(ValueError, match="all-zero"):
        ev.exact_knn(np.vstack([X, np.zeros((1, 3))]), X, 1, metric="cosine")
    with pytest.raises(ValueError, match="at least one row"):
        ev.exact_knn(np.ones((0, 3)), X, 1)


# ------------------------------------------------------------------------------ relevance


def test_relevance_helpers():
    rel = ev.relevance_from_labels(np.array([0, 2]), np.array([2, 0, 0, 1]))
    np.testing.assert_array_equal(rel, [[0, 1, 1, 0], [1, 0, 0, 0]])
    rel = ev.relevance_from_neighbors(np.array([[3, 0, -1], [-1, -1, -1]]), 4)
    np.testing.assert_array_equal(rel, [[1, 0, 0, 1], [0, 0, 0, 0]])
    with pytest.raises(ValueError, match="n_db"):
        ev.relevance_from_neighbors(np.array([[4]]), 4)
    with pytest.raises(ValueError, match="repeats"):
        ev.relevance_from_neighbors(np.array([[1, 1]]), 4)
    with pytest.raises(TypeError, match="integer"):
        ev.relevance_from_labels(np.array([0.0]), np.array([1]))


# ----------------------------------------------------------------- precision and recall


@SETTINGS
@given(seeds, st.sampled_from(["pooled", "per_query"]), st.sampled_from(["zero", "skip"]))
def test_precision_recall_and_curve_match_reference(seed, aggregate, empty):
    rng, d, rel, n_bits = random_problem(seed)
    precision, recall = ev.precision_recall_curve(d, rel, n_bits, aggregate, empty)
    assert precision.shape == recall.shape == (n_bits + 1,)
    assert np.all(np.diff(recall) >= -1e-12)
    for radius in range(n_bits + 1):
        got = ev.precision_recall_at_radius(d, rel, radius, aggregate, empty)
        np.testing.assert_allclose(got, ref_pr(d, rel, radius, aggregate, empty))
        np.testing.assert_allclose((precision[radius], recall[radius]), got)


def test_pooled_and_per_query_differ():
    # Query 0 retrieves one relevant item; query 1 retrieves three irrelevant ones.
    d = np.array([[0, 5, 5, 5], [0, 0, 0, 5]])
    rel = np.array([[1, 0, 0, 0], [0, 0, 0, 1]], dtype=bool)
    assert ev.precision_recall_at_radius(d, rel, 1) == (0.25, 0.5)
    assert ev.precision_recall_at_radius(d, rel, 1, aggregate="per_query") == (0.5, 0.5)


def test_empty_retrieval_both_ways():
    d = np.array([[4, 4], [0, 0]])
    rel = np.array([[1, 0], [1, 0]], dtype=bool)
    assert ev.precision_recall_at_radius(d, rel, 1, "per_query", "zero")[0] == 0.25
    assert ev.precision_recall_at_radius(d, rel, 1, "per_query", "skip")[0] == 0.5
    assert ev.precision_recall_at_radius(d, rel, 1, "pooled")[0] == 0.5
    # Nothing retrieved by anyone: precision 0.0 under every convention, never NaN.
    for aggregate in ("pooled", "per_query"):
        for empty in ("zero", "skip"):
            assert ev.precision_recall_at_radius(d[:1], rel[:1], 0, aggregate, empty) == (0, 0)
    # A query with nothing relevant is left out of the per-query recall mean.
    rel2 = np.array([[0, 0], [1, 0]], dtype=bool)
    assert ev.precision_recall_at_radius(d, rel2, 1, "per_query")[1] == 1.0


def test_pr_auc_rule():
    p, r = np.array([0.0, 1.0, 0.5]), np.array([0.0, 0.5, 1.0])
    assert ev.pr_auc(p, r) == pytest.approx(0.5 + 0.5 * 0.75)
    assert ev.pr_auc(np.zeros(3), np.zeros(3)) == 0.0
    assert ev.pr_auc(np.ones(4), np.linspace(0.25, 1, 4)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="non-decreasing"):
        ev.pr_auc(p, r[::-1].copy())
    with pytest.raises(ValueError, match="equal length"):
        ev.pr_auc(p, r[:2])
    with pytest.raises(ValueError, match="finite"):
        ev.pr_auc(np.array([np.nan, 1, 1]), r)
    with pytest.raises(TypeError, match="float"):
        ev.pr_auc(p, np.array([0, 1, 1]))


@SETTINGS
@given(seeds)
def test_pr_auc_of_curve_is_trapezoid(seed):
    _, d, rel, n_bits = random_problem(seed)
    p, r = ev.precision_recall_curve(d, rel, n_bits)
    keep = r > 0
    if not keep.any():
        assert ev.pr_auc(p, r) == 0.0
        return
    pts = [(0.0, p[keep][0])] + list(zip(r[keep], p[keep], strict=True))
    area = sum(
        (r2 - r1) * (p1 + p2) / 2 for (r1, p1), (r2, p2) in zip(pts[:-1], pts[1:], strict=True)
    )
    assert ev.pr_auc(p, r) == pytest.approx(area)


# ------------------------------------------------------------------------------- ranking


@SETTINGS
@given(seeds)
def test_hamming_ranking(seed):
    rng, d, _, _ = random_problem(seed)
    n = d.shape[1]
    ranked = ev.hamming_ranking(d, ties="index")
    for i in range(d.shape[0]):
        np.testing.assert_array_equal(ranked[i], ref_order(d[i]))
    k = int(rng.integers(1, n + 3))
    rand = ev.hamming_ranking(d, k=k, random_state=seed % 7)
    assert rand.shape == (d.shape[0], k) and rand.dtype == np.int64
    full = ev.hamming_ranking(d, random_state=seed % 7)
    np.testing.assert_array_equal(rand[:, :n], full[:, :k])  # prefix property
    np.testing.assert_array_equal(rand[:, n:], -1)
    for i in range(d.shape[0]):
        assert sorted(full[i]) == list(range(n))
        assert np.all(np.diff(d[i, full[i]]) >= 0)


def test_random_ties_are_seeded():
    d = np.zeros((4, 200), dtype=np.int32)
    a = ev.hamming_ranking(d, 20, random_state=3)
    np.testing.assert_array_equal(a, ev.hamming_ranking(d, 20, random_state=3))
    assert not np.array_equal(a, ev.hamming_ranking(d, 20, random_state=4))
    true = np.tile(np.arange(10), (4, 1))
    r3 = ev.recall_at_m(d, true, [10, 50], random_state=3)
    np.testing.assert_array_equal(r3, ev.recall_at_m(d, true, [10, 50], random_state=3))
    assert not np.array_equal(r3, ev.recall_at_m(d, true, [10, 50], random_state=4))
    np.testing.assert_array_equal(ev.recall_at_m(d, true, [10], ties="index"), [1.0])


@SETTINGS
@given(seeds, st.sampled_from(["random", "index"]))
def test_recall_at_m_matches_reference(seed, ties):
    rng, d, _, _ = random_problem(seed)
    m, n = d.shape
    K = int(rng.integers(1, 6))
    true = np.full((m, K), -1, dtype=np.int64)
    for i in range(m):
        size = int(rng.integers(0, min(K, n) + 1))
        true[i, :size] = rng.choice(n, size=size, replace=False)
    m_values = sorted({int(v) for v in rng.integers(1, n + 5, size=3)})
    got = ev.recall_at_m(d, true, m_values, random_state=5, ties=ties)
    ranked = ev.hamming_ranking(d, random_state=5, ties=ties)
    np.testing.assert_allclose(got, ref_recall_at_m(ranked, true, m_values))
    np.testing.assert_allclose(ev.recall_at_m_from_ids(ranked, true, m_values), got)


def test_recall_at_m_from_ids_padding():
    retrieved = np.array([[5, -1, 2, 7], [-1, -1, -1, -1]])
    true = np.array([[2, 7, -1], [0, -1, -1]])
    np.testing.assert_allclose(
        ev.recall_at_m_from_ids(retrieved, true, [1, 3, 10]), [0.0, 0.25, 0.5]
    )
    with pytest.raises(ValueError, match="repeats"):
        ev.recall_at_m_from_ids(np.array([[1, 1]]), true[:1], [1])
    with pytest.raises(ValueError, match="rows"):
        ev.recall_at_m_from_ids(retrieved, true[:1], [1])
    with pytest.raises(ValueError, match="m_values"):
        ev.recall_at_m_from_ids(retrieved, true, [0])


@SETTINGS
@given(seeds)
def test_mean_average_precision(seed):
    rng, d, rel, _ = random_problem(seed)
    top = [None, int(rng.integers(1, d.shape[1] + 2))][int(rng.integers(0, 2))]
    depth = d.shape[1] if top is None else min(top, d.shape[1])
    rules = {
        "index": lambda i, j: (d[i, j], j),
        "pessimistic": lambda i, j: (d[i, j], rel[i, j], j),
        "optimistic": lambda i, j: (d[i, j], not rel[i, j], j),
    }
    values = {}
    for ties, key in rules.items():
        aps = [
            ref_ap(
                rel[i, sorted(range(d.shape[1]), key=lambda j, i=i: key(i, j))], rel[i].sum(), depth
            )
            for i in range(d.shape[0])
            if rel[i].any()
        ]
        expected = float(np.mean(aps)) if aps else 0.0
        values[ties] = ev.mean_average_precision(d, rel, ties=ties, top=top)
        assert values[ties] == pytest.approx(expected)
    ranked = ev.hamming_ranking(d, random_state=2)
    aps = [
        ref_ap(rel[i, ranked[i]], rel[i].sum(), depth) for i in range(d.shape[0]) if rel[i].any()
    ]
    values["random"] = ev.mean_average_precision(d, rel, random_state=2, top=top)
    assert values["random"] == pytest.approx(float(np.mean(aps)) if aps else 0.0)
    eps = 1e-12
    for ties in ("random", "index"):
        assert values["pessimistic"] - eps <= values[ties] <= values["optimistic"] + eps


def test_map_ties_bracket_strictly():
    d = np.zeros((1, 10), dtype=np.int32)
    rel = np.zeros((1, 10), dtype=bool)
    rel[0, 4] = True
    lo = ev.mean_average_precision(d, rel, ties="pessimistic")
    hi = ev.mean_average_precision(d, rel, ties="optimistic")
    assert lo == pytest.approx(0.1) and hi == 1.0
    assert lo < ev.mean_average_precision(d, rel, random_state=0) <= hi


# --------------------------------------------------------------------- classification


@SETTINGS
@given(seeds)
def test_knn_classify_matches_reference(seed):
    rng, d, _, n_bits = random_problem(seed)
    labels = rng.integers(0, 4, size=d.shape[1]) * 3  # non-contiguous labels
    radius = int(rng.integers(0, n_bits + 1))
    k = int(rng.integers(1, n_bits + 3))
    np.testing.assert_array_equal(
        ev.knn_classify(d, labels, radius=radius), ref_knn(d, labels, radius=radius)
    )
    np.testing.assert_array_equal(ev.knn_classify(d, labels, k=k), ref_knn(d, labels, k=k))
    query_labels = rng.integers(0, 4, size=d.shape[0]) * 3
    expected = np.mean(ref_knn(d, labels, k=k) != query_labels)
    assert ev.knn_classification_error(d, labels, query_labels, k=k) == pytest.approx(expected)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.int32])
def test_knn_classify_reads_every_integer_distance_dtype(dtype):
    """Hamming distances often come as small unsigned ints; -1 padding must not overflow."""
    rng = np.random.default_rng(3)
    d = rng.integers(0, 17, size=(40, 60))
    labels = rng.integers(0, 5, size=60)
    for k in (1, 3):
        np.testing.assert_array_equal(
            ev.knn_classify(d.astype(dtype), labels, k=k), ref_knn(d, labels, k=k)
        )
    np.testing.assert_array_equal(ev.bin_threshold(d.astype(dtype), 2), ev.bin_threshold(d, 2))


def test_relative_threshold_votes_with_all_tied_items():
    # Nearest bin (distance 1) holds three items: all vote, so class 1 wins 2 to 1.
    d = np.array([[1, 1, 1, 2, 5]])
    labels = np.array([0, 1, 1, 0, 0])
    assert ev.knn_classify(d, labels, k=1).tolist() == [1]
    # The paper's example: bins 4, 7, 12 are the 3 nearest non-empty ones (both items at 12
    # vote, so class 2 wins 2 to 1 to 1); an absolute radius of 3 retrieves nothing.
    d = np.array([[4, 7, 12, 17, 20, 12]])
    labels = np.array([0, 1, 2, 0, 0, 2])
    assert ev.knn_classify(d, labels, k=3).tolist() == [2]
    assert ev.knn_classify(d, labels, radius=3).tolist() == [-1]
    assert ev.knn_classification_error(d, labels, np.array([2]), radius=3) == 1.0


def test_class_ties_by_nearest_voter_then_label():
    assert ev.knn_classify(np.array([[3, 1, 2, 3]]), np.array([0, 1, 0, 1]), radius=3).tolist() == [
        1
    ]
    assert ev.knn_classify(np.array([[1, 1]]), np.array([5, 2]), radius=1).tolist() == [2]


def test_knn_classify_exact():
    rng = np.random.default_rng(3)
    X, Q = rng.normal(size=(60, 4)), rng.normal(size=(15, 4))
    labels = rng.integers(0, 3, size=60)
    D, ids = ev.exact_knn(X, Q, 5)
    expected = [ref_vote(list(D[i]), [labels[j] for j in ids[i]]) for i in range(15)]
    np.testing.assert_array_equal(ev.knn_classify_exact(X, labels, Q, 5), expected)
    # k larger than the database: every item votes, padding does not.
    assert ev.knn_classify_exact(X[:3], np.array([1, 1, 0]), Q[:2], 10).tolist() == [1, 1]


def test_fraction_searched():
    assert ev.fraction_searched(np.array([10, 30]), 100) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="n_candidates"):
        ev.fraction_searched(np.array([101]), 100)
    with pytest.raises(ValueError, match="n_db"):
        ev.fraction_searched(np.array([1]), 0)


# ------------------------------------------------------------------------- bad inputs

D = np.array([[0, 1, 2], [2, 1, 0]], dtype=np.int32)
REL = D == 1
LAB = np.array([0, 1, 1])


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: ev.precision_recall_at_radius(D, REL[:, :2], 1), ValueError, "shape"),
        (lambda: ev.precision_recall_at_radius(D, REL.astype(int), 1), TypeError, "bool"),
        (lambda: ev.precision_recall_at_radius(D.astype(float), REL, 1), TypeError, "integer"),
        (lambda: ev.precision_recall_at_radius(D, REL, -1), ValueError, "radius"),
        (
            lambda: ev.precision_recall_at_radius(D, REL, 1, aggregate="mean"),
            ValueError,
            "aggregate",
        ),
        (lambda: ev.precision_recall_at_radius(D, REL, 1, empty="nan"), ValueError, "empty"),
        (lambda: ev.precision_recall_at_radius(-D, REL, 1), ValueError, r"\[0, 2\*\*31\)"),
        (lambda: ev.precision_recall_at_radius(D[:0], REL[:0], 1), ValueError, "at least one"),
        (lambda: ev.precision_recall_at_radius(D.tolist(), REL, 1), TypeError, "ndarray"),
        (lambda: ev.precision_recall_curve(D, REL, 1), ValueError, "n_bits"),
        (lambda: ev.hamming_ranking(D, k=0), ValueError, "'k'"),
        (lambda: ev.hamming_ranking(D, ties="pessimistic"), ValueError, "ties"),
        (lambda: ev.mean_average_precision(D, REL, top=0), ValueError, "top"),
        (lambda: ev.recall_at_m(D, np.array([[0], [3]]), [1]), ValueError, "n_db"),
        (lambda: ev.recall_at_m(D, np.array([[0.0], [1.0]]), [1]), TypeError, "integer"),
        (lambda: ev.recall_at_m(D, np.array([[0]]), [1]), ValueError, "rows"),
        (lambda: ev.recall_at_m(D, np.array([[0], [1]]), [1.5]), ValueError, "m_values"),
        (lambda: ev.knn_classify(D, LAB), ValueError, "exactly one"),
        (lambda: ev.knn_classify(D, LAB, radius=1, k=1), ValueError, "exactly one"),
        (lambda: ev.knn_classify(D, LAB, k=0), ValueError, "'k'"),
        (lambda: ev.knn_classify(D, LAB[:2], k=1), ValueError, "db_labels"),
        (lambda: ev.knn_classify(D, LAB - 1, k=1), ValueError, "non-negative"),
        (lambda: ev.knn_classify(D, LAB.astype(float), k=1), TypeError, "db_labels"),
        (lambda: ev.knn_classification_error(D, LAB, LAB, k=1), ValueError, "query_labels"),
        (
            lambda: ev.knn_classify_exact(np.ones((3, 2)), LAB, np.ones((1, 2)), 0),
            ValueError,
            "'k'",
        ),
        (
            lambda: ev.knn_classify_exact(np.ones((3, 2)), LAB[:2], np.ones((1, 2)), 1),
            ValueError,
            "db_labels",
        ),
    ],
)
def test_bad_inputs_raise(call, error, match):
    with pytest.raises(error, match=match):
        call()

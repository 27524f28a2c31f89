"""The reproductions' shared evaluation loop: specs x bits x seeds -> tidy records."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from hashlearn import load_digits
from hashlearn.codes import hamming_cdist
from hashlearn.evaluate import knn_classification_error, precision_recall_at_radius, recall_at_m
from hashlearn.experiments.pipeline import (
    MethodSpec,
    Split,
    knn_error,
    pr_curve_auc,
    precision_at_radius,
    recall_at_m_curve,
    run_specs,
    summarize,
)
from hashlearn.hashers import make_hasher


@pytest.fixture(scope="module")
def digits_split():
    X, y = load_digits()
    X = X[:600] / 16.0
    split = Split.holdout(X, y[:600], n_queries=100, random_state=0)
    return split.with_euclidean_truth(20).with_label_relevance()


def test_holdout_partitions_the_rows():
    X = np.arange(40, dtype=np.float64).reshape(20, 2)
    y = np.arange(20)
    s = Split.holdout(X, y, n_queries=5, random_state=1)
    assert s.X_q.shape == (5, 2) and s.X_db.shape == (15, 2)
    assert sorted(np.r_[s.y_q, s.y_db].tolist()) == list(range(20))
    np.testing.assert_array_equal(s.X_q[:, 0] / 2, s.y_q)  # rows keep their labels
    with pytest.raises(ValueError, match="n_queries"):
        Split.holdout(X, n_queries=20)


def test_records_equal_direct_measurement(digits_split):
    """Every column equals the measure computed by hand from the same hasher (oracle)."""
    s = digits_split
    specs = [MethodSpec("LSH", "lsh"), MethodSpec("PCAH", "pca")]
    measures = [
        recall_at_m_curve([10, 100]),
        precision_at_radius(2, "label"),
        knn_error(n_bins=2),
        pr_curve_auc("label"),
    ]
    records = run_specs(specs, s, bits=[16], seeds=[3], measures=measures)
    assert [r["method"] for r in records] == ["LSH", "PCAH"]
    for rec, name in zip(records, ["lsh", "pca"], strict=True):
        h = make_hasher(name, n_bits=16)
        if "random_state" in h.get_params():
            h.set_params(random_state=3)
        h.fit(s.X_db)
        d = hamming_cdist(h.encode(s.X_q), h.encode(s.X_db), 16)
        want = recall_at_m(d, s.truth["euclidean"], [10, 100], random_state=0)
        assert rec["recall@10"] == pytest.approx(want[0])
        assert rec["recall@100"] == pytest.approx(want[1])
        p, r = precision_recall_at_radius(d, s.relevant("label"), 2, aggregate="per_query")
        assert rec["precision@r2"] == pytest.approx(p) and rec["recall@r2"] == pytest.approx(r)
        err = knn_classification_error(d, s.y_db.astype(np.int64), s.y_q.astype(np.int64), k=2)
        assert rec["knn_error@2bins"] == pytest.approx(err)
        assert 0.0 <= rec["pr_auc"] <= 1.0
        assert rec["fit_cpu_s"] >= 0 and rec["encode_cpu_s"] >= 0


def test_same_seed_same_records_and_summary(digits_split):
    specs = [MethodSpec("LSH", "lsh")]
    kw = dict(bits=[8, 16], seeds=[0, 1], measures=[recall_at_m_curve([50])])
    a = run_specs(specs, digits_split, **kw)
    b = run_specs(specs, digits_split, **kw)
    assert [r["recall@50"] for r in a] == [r["recall@50"] for r in b]
    summary = summarize(a, "recall@50")
    assert set(summary) == {("LSH", 8), ("LSH", 16)}
    mean, std, n = summary[("LSH", 16)]
    vals = [r["recall@50"] for r in a if r["bits"] == 16]
    assert n == 2 and mean == pytest.approx(np.mean(vals)) and std == pytest.approx(np.std(vals))
    # more bits rank the Euclidean neighbours better (LSH converges to the angle)
    assert summary[("LSH", 16)][0] > summary[("LSH", 8)][0]


def test_supervision_kinds_and_progress(digits_split):
    calls = []

    class Bar:
        def __init__(self, total, desc):
            calls.append(("new", total, desc))

        def update(self, n):
            calls.append(("update", n))

        def close(self):
            calls.append(("close",))

    specs = [
        MethodSpec("BoostSSC", "boosted-ssc", {"n_pairs": 2000}, supervision="labels"),
        MethodSpec(
            "MLH",
            "mlh",
            {"rho": 3, "lam": 0.5, "epsilon": 0.1, "n_epochs": 2},
            supervision="neighbors",
            n_neighbors=20,
            n_pairs=5000,
        ),
    ]
    records = run_specs(
        specs, digits_split, bits=[8], seeds=[0], measures=[knn_error(radius=1)], progress=Bar
    )
    assert len(records) == 2
    assert calls[0] == ("new", 2, "methods") and calls[-1] == ("close",)
    assert sum(1 for c in calls if c[0] == "update") == 2
    unlabeled = Split(X_db=digits_split.X_db, X_q=digits_split.X_q)
    with pytest.raises(ValueError, match="labels"):
        run_specs(specs[:1], unlabeled, bits=[8], seeds=[0], measures=[])


def test_bad_spec_is_refused():
    with pytest.raises(ValueError, match="supervision"):
        MethodSpec("x", "lsh", supervision="pairs")
    with pytest.raises(ValueError, match="Unknown hasher"):
        MethodSpec("x", "no-such-hasher").build(8, 0)


def test_search_spec_scan_equals_brute_force(digits_split):
    """An exhaustive SearchSpec (every item re-ranked) returns the exact neighbours, and the
    vote over them equals the exact k-NN classifier (oracle)."""
    from hashlearn.evaluate import exact_knn, knn_classify_exact
    from hashlearn.experiments.pipeline import (
        SearchSpec,
        knn_error_of_neighbors,
        searched_fraction,
    )

    s = digits_split
    rng = np.random.RandomState(0)  # no distance ties: the orders must agree exactly
    s = Split(s.X_db + 1e-3 * rng.rand(*s.X_db.shape), s.X_q, s.y_db, s.y_q)
    spec = SearchSpec("scan", "lsh", rerank="sqeuclidean", k=5, n_candidates="all")
    models = {}
    measures = [knn_error_of_neighbors(), searched_fraction()]
    (rec,) = run_specs([spec], s, bits=[16], seeds=[0], measures=measures, models=models)
    output, _, _ = spec.evaluate(s, 16, 0)
    _, want = exact_knn(s.X_db, s.X_q, 5)
    np.testing.assert_array_equal(output.ids, want)
    exact = np.mean(knn_classify_exact(s.X_db, s.y_db, s.X_q, 5) != s.y_q)
    assert rec["knn_error"] == pytest.approx(exact) and rec["searched"] == 1.0
    assert rec["search_cpu_s"] >= 0 and ("scan", 16, 0) in models


def test_candidate_recall_curve_equals_brute_force(digits_split):
    from hashlearn.experiments.pipeline import BucketerSpec, candidate_recall_curve
    from hashlearn.forest import LSHTables

    s = digits_split
    spec = BucketerSpec("LSH tables", LSHTables, {"n_tables": 6}, "bits_per_table")
    measure = candidate_recall_curve("euclidean", [1, 3, 6])
    (rec,) = run_specs([spec], s, bits=[5], seeds=[2], measures=[measure])
    keys, _, _ = spec.evaluate(s, 5, 2)
    relevant = s.relevant("euclidean")
    for j, t in enumerate([1, 3, 6]):
        shared = (keys.queries[:, None, :t] == keys.database[None, :, :t]).any(axis=2)
        sizes = shared.sum(axis=1)
        recall = (shared & relevant).sum(axis=1) / relevant.sum(axis=1)
        assert rec["mean_candidates"][j] == pytest.approx(sizes.mean())
        assert rec["candidate_recall"][j] == pytest.approx(recall.mean())
    assert np.all(np.diff(rec["candidate_recall"]) >= 0)


def test_deterministic_and_dimension_bounded_specs_are_run_once(digits_split):
    X = np.ascontiguousarray(digits_split.X_db[:, :8])
    s = Split(X, np.ascontiguousarray(digits_split.X_q[:, :8])).with_euclidean_truth(5)
    specs = [
        MethodSpec("PCAH", "pca", deterministic=True, max_bits_dim=True),
        MethodSpec("LSH", "lsh"),
    ]
    records = run_specs(specs, s, bits=[4, 16], seeds=[0, 1], measures=[recall_at_m_curve([5])])
    got = sorted((r["method"], r["bits"], r["seed"]) for r in records)
    assert got == [("LSH", 4, 0), ("LSH", 4, 1), ("LSH", 16, 0), ("LSH", 16, 1), ("PCAH", 4, 0)]


def test_claims_and_tables(tmp_path):
    import json

    from hashlearn.experiments.pipeline import claim, mean_table, write_claims

    rows = [
        claim("P", "a beats b", "digits", [0.1, 0.12, 0.08], baseline="LSH(directions='gaussian')"),
        claim("P", "c", "d", [0.1, -0.1, 0.05]),
        claim("P", "e", "d", [-0.2, -0.3, -0.25]),
        claim("P", "exact search", "d", 0.0, 1, holds=True),
        claim("P", "one run", "d", 0.3, 1),
    ]
    table = write_claims(tmp_path, rows)
    assert json.loads((tmp_path / "claims.json").read_text()) == rows
    assert [r["verdict"] for r in rows] == ["holds", "tie", "fails", "holds", "tie"]
    half = 4.302652729911275 * 0.02 / 3**0.5  # t_{0.975, 2} * sd / sqrt(n)
    assert rows[0]["ci_low"] == pytest.approx(0.1 - half) and rows[0]["n"] == 3
    assert (
        f"| P | a beats b | digits | holds | +0.100 | [{0.1 - half:+.3f}, {0.1 + half:+.3f}] | 3 "
        "| LSH(directions='gaussian') |" in table
    )
    assert "| exact (deterministic check) | 1 | - |" in table
    assert "| P | one run | d | tie | +0.300 | none (n = 1) | 1 | - |" in table
    with pytest.raises(ValueError, match="seeds"):
        claim("P", "c", "d", [0.1, 0.2], 3)
    records = [
        {"method": "A", "bits": 8, "v": 0.5},
        {"method": "A", "bits": 8, "v": 0.7},
        {"method": "B", "bits": 16, "v": 0.25},
    ]
    table = mean_table(records, "v")
    assert "| A | 0.600 ± 0.100 | n/a |" in table and "| B | n/a | 0.250 |" in table


def test_fits_are_shared_between_specs_differing_only_in_search(digits_split):
    from hashlearn.experiments.pipeline import SearchSpec, searched_fraction

    scan = SearchSpec("scan", "lsh", rerank="sqeuclidean", k=3, n_candidates="all")
    hashed = SearchSpec("hashed", "lsh", index="flat", rerank="sqeuclidean", k=3)
    other = MethodSpec("other seed", "lsh")
    fits, models = {}, {}
    kw = dict(bits=[16], measures=[searched_fraction()], fits=fits, models=models)
    run_specs([scan], digits_split, seeds=[0], **kw)
    run_specs([hashed], digits_split, seeds=[0], **kw)
    run_specs([other], digits_split, seeds=[1], measures=[], bits=[16], fits=fits, models=models)
    assert models[("scan", 16, 0)] is models[("hashed", 16, 0)]
    assert models[("other seed", 16, 1)] is not models[("scan", 16, 0)]
    assert len(fits) == 2


def test_worker_processes_give_the_sequential_records(digits_split):
    specs = [
        MethodSpec("LSH", "lsh"),
        MethodSpec("SH", "spectral", deterministic=True),
        MethodSpec(
            "MLH",
            "mlh",
            {"time_budget": 0.2},
            supervision="neighbors",
            n_neighbors=20,
            n_pairs=3000,
        ),
    ]
    kw = dict(bits=[8, 16], seeds=[0, 1], measures=[precision_at_radius(2, "label")])
    models_seq, models_par, fits = {}, {}, {}
    # one BLAS thread on both sides, as in the workers: a BLAS product's last bits may
    # depend on its thread count, and this test must not depend on summation order
    with threadpool_limits(1):
        seq = run_specs(specs, digits_split, models=models_seq, **kw)
    par = run_specs(specs, digits_split, models=models_par, fits=fits, n_jobs=2, **kw)

    def values(records):
        return [{k: v for k, v in r.items() if not k.endswith("cpu_s")} for r in records]

    assert values(par) == values(seq) and len(seq) == 10  # SH once per code length
    assert models_par.keys() == models_seq.keys() and len(fits) == 10
    for key, model in models_seq.items():
        codes = model.encode(digits_split.X_q)
        np.testing.assert_array_equal(models_par[key].encode(digits_split.X_q), codes)
    with pytest.raises(ValueError, match="n_jobs"):
        run_specs(specs, digits_split, n_jobs=0, **kw)


def test_rows_as_run_name_the_class_parameters_and_supervision():
    from hashlearn.experiments._common import LIBRARY_LSH, lsh_specs
    from hashlearn.experiments.pipeline import MethodSpec, rows_as_run

    paper, library = lsh_specs()
    assert paper.as_run() == "RandomHyperplaneLSH(directions='gaussian', center=False)"
    assert library.name == LIBRARY_LSH and library.as_run() == "RandomHyperplaneLSH()"
    mlh = MethodSpec(
        "MLH", "mlh", {"rho": lambda b: b / 4}, "neighbors", 100, 2000, similar_fraction=0.0
    )
    assert mlh.as_run() == (
        "MinimalLossHashing(rho=f(bits)) on 2000 pairs (100-NN threshold, uniform)"
    )
    table = rows_as_run([paper, mlh, MethodSpec("BRE", "bre", n_train=300)])
    assert "| BRE | `BinaryReconstructiveEmbedding(), fitted on 300 rows` |" in table


def test_label_steps_refuse_an_unlabelled_split():
    # with_train_per_class used to return train_rows [0] (np.unique(None) is [None])
    split = Split.holdout(np.random.default_rng(0).random((20, 3)), n_queries=5, random_state=0)
    with pytest.raises(ValueError, match="needs labels"):
        split.with_train_per_class(2)
    d = np.zeros((5, 15), np.int32)
    with pytest.raises(ValueError, match="needs labels"):
        knn_error(radius=1)(d, split, 8)

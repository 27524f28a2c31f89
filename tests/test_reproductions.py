"""Every reproduction runs end to end in quick mode on a small slice of digits: each table,
plot and claims file is produced, and the claims that hold robustly at this scale are
asserted with a margin.

Each test runs the paper module's own ``run`` (the pipeline: specs -> records -> tables ->
plots -> JSON) with its quick settings on 500 digits, so nothing needs Fashion-MNIST.
"""

from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import pytest

from hashlearn import load_digits

CLAIM_KEYS = {
    "paper",
    "claim",
    "data",
    "verdict",
    "holds",
    "margin",
    "ci_low",
    "ci_high",
    "interval",
    "n",
    "seeds",
    "baseline",
}


def _small_digits(monkeypatch, module, n=500):
    def load_real(name, data_dir=None):
        X, y = load_digits()
        return X[:n], y[:n]

    monkeypatch.setattr(module, "load_real", load_real)
    monkeypatch.setattr(module, "available_real", lambda data_dir=None: ["digits"])


def _claims(path):
    claims = json.loads((path / "claims.json").read_text())
    assert claims, "a reproduction checks at least one claim"
    for c in claims:
        assert set(c) == CLAIM_KEYS
        assert isinstance(c["holds"], bool) and math.isfinite(c["margin"]) and c["seeds"] >= 1
        assert c["holds"] == (c["verdict"] == "holds") and c["n"] == c["seeds"]
        if c["interval"] == "paired t":  # the verdict rests on the interval, not the margin
            assert c["ci_low"] <= c["margin"] <= c["ci_high"]
            want = "holds" if c["ci_low"] > 0 else "fails" if c["ci_high"] < 0 else "tie"
            assert c["verdict"] == want
    return claims


def _pngs(path, names):
    for name in names:
        assert (path / name).stat().st_size > 10_000, name


def test_survey_produces_every_table_and_plot(tmp_path, monkeypatch):
    from hashlearn.experiments import survey

    _small_digits(monkeypatch, survey)
    report = survey.run(tmp_path, quick=True, seed=0)
    assert report.count("retrieved at M = 500") == 2  # one table per ground truth
    assert "Fig. 16" in report and "### Claims" in report
    _pngs(tmp_path, ["survey_fig11_digits_32bits.png"])
    results = json.loads((tmp_path / "survey.json").read_text())["digits"]
    names = {s.name for s in survey.specs("label", quick=True)}
    for truth in survey.TRUTHS:
        assert set(results[truth]["at500"]) == names
        for by_bits in results[truth]["at500"].values():
            assert all(0.0 <= v <= 1.0 for v in by_bits.values())
        for curve in results[truth]["curves_32"].values():
            assert curve == sorted(curve)  # recall@M never falls as M grows
    coverage = results["fig16"]["coverage"]
    # coverage grows with N and shrinks with k
    assert all(row == sorted(row) for row in coverage)
    assert coverage[0][0] >= coverage[2][0]
    assert len(_claims(tmp_path)) == 4


def test_mlh_produces_every_table_and_plot(tmp_path, monkeypatch):
    from hashlearn.experiments import mlh

    _small_digits(monkeypatch, mlh)
    report = mlh.run(tmp_path, quick=True, seed=0)
    for table in ("pooled (the paper's measure)", "per query (empty retrieval = 0)", "PR"):
        assert table in report or table == "PR"
    assert "within 0.25 CPU s per model" in report  # the training budget is stated
    _pngs(tmp_path, ["mlh_precision_r3.png", "mlh_pr.png", "mlh_training_curve.png"])
    results = json.loads((tmp_path / "mlh_small.json").read_text())
    assert set(results) == {"digits", "uniform-10d"}
    digits = results["digits"]
    runs = {m: sum(r["method"] == m for r in digits) for m in mlh.UNSUPERVISED + ("MLH",)}
    assert runs == {"SH": 1, "PCAH": 1, "SIKH": 2, "ITQ": 2, "LSH": 2, "MLH": 2}
    for r in digits:
        assert 0.0 <= r["precision@r3_pooled"] <= 1.0 and 0.0 <= r["precision@r3"] <= 1.0
        if r["method"] in ("MLH", "BRE2"):  # settings chosen on training rows, recorded
            assert r["n_epochs_"] >= 1 and r["epsilon_"] > 0
    # uniform 10-D data: PCAH / ITQ would need more bits than dimensions -> not run
    assert not any(r["method"] in ("PCAH", "ITQ") for r in results["uniform-10d"])
    auc = mlh.summarize(digits, "pr_auc")
    # robust at this scale: the supervised MLH ranks neighbours far better than SH and LSH
    assert auc[("MLH", 16)][0] > max(auc[("SH", 16)][0], auc[("LSH", 16)][0]) + 0.05
    claims = _claims(tmp_path)
    assert len(claims) == 8 and all(c["n"] == 2 for c in claims)
    # the paper's LSH (Gaussian, through the origin) and the library's as an extra row
    assert "`RandomHyperplaneLSH(directions='gaussian', center=False)`" in report
    assert sum(r["method"].startswith("LSH (library default") for r in digits) == 2
    # MLH trained as the paper (quick: 20 epochs of 10^4 pairs) after its held-out choice
    paper = [r for r in digits if r["method"] == "MLH (paper §5 training)"]
    assert len(paper) == 2 and all(r["n_epochs_"] == 20 for r in paper)
    assert all(r["rho_"] in (1.0, 2.0, 4.0) for r in paper)  # 16 x (1/16, 1/8, 1/4)


def test_search_forest_curves_never_fall(tmp_path, monkeypatch):
    from hashlearn.experiments import search_forest

    _small_digits(monkeypatch, search_forest)
    report = search_forest.run(tmp_path, quick=True, seed=0)
    assert "as trees are added" in report
    _pngs(tmp_path, ["search_forest_recall.png"])
    results = json.loads((tmp_path / "search_forest.json").read_text())
    records = results["records"]
    assert {r["method"] for r in records} == {"BSF", "k-means trees", "LSH tables"}
    for r in records:  # one configuration per curve: candidates and recall only grow
        assert r["trees"] == [1, 2, 4, 8]
        assert np.all(np.diff(r["mean_candidates"]) >= 0)
        assert np.all(np.diff(r["candidate_recall"]) >= 0)
        assert 0.0 < r["candidate_recall"][-1] <= 1.0
    bsf = next(r for r in records if r["method"] == "BSF")
    assert bsf["candidate_recall"][-1] > 0.8  # 8 boosted trees find most of the 20-NN
    sh = results["sh"][0]["recall_curve"]
    assert sh == sorted(sh)
    assert all(c["n"] == 2 for c in _claims(tmp_path))  # paired over the quick mode's seeds
    # the two rankings of one candidate set: recall among the first M only grows with M
    assert "Ranking the candidates" in report and "trees with c <= 0" in report
    for how in ("T", "count"):
        means = [np.mean(results["ranking"][f"6/{m}"][how]) for m in search_forest.RANK_AT]
        assert means == sorted(means) and 0.0 <= means[0] <= means[-1] <= 1.0


def test_learned_metric_uses_the_papers_budget(tmp_path, monkeypatch):
    from hashlearn.experiments import learned_metric

    _small_digits(monkeypatch, learned_metric)
    report = learned_metric.run(tmp_path, quick=True, seed=0)
    assert "Sparse case (Fig. 2)" in report and "2M entries examined" in report
    _pngs(tmp_path, ["learned_metric_accuracy.png", "learned_metric_searched.png"])
    results = json.loads((tmp_path / "learned_metric.json").read_text())["records"]
    dense = results["digits"]
    n_db = 500 - 10 * 10  # 10 queries per class held out in quick mode
    budget = 2 * math.ceil(n_db ** (1 / (1 + learned_metric.EPSILON)))
    for r in dense:
        assert 0.0 <= r["knn_accuracy"] <= 1.0
        if r["method"].endswith("LSH"):  # Charikar's search examines at most 2M entries
            assert r["searched"] <= budget / n_db + 1e-12
        else:
            assert r["searched"] == 1.0
    acc = learned_metric.summarize(dense, "knn_accuracy")
    assert acc[("euclidean, linear scan", 32)][0] > 0.9  # 4-NN on digits
    # hashing searches a few percent of the database and loses little at 32 bits
    assert acc[("learned, LSH", 32)][0] > acc[("learned, LSH", 8)][0]
    assert acc[("learned, LSH", 32)][0] > 0.8
    sparse = results["digits bags of patches"]
    assert {r["method"] for r in sparse} == {
        "euclidean, linear scan",
        "euclidean, LSH",
        "learned, linear scan",
        "learned, LSH",
    }
    assert len(_claims(tmp_path)) == 6


def test_rank_codes_produces_every_table_and_plot(tmp_path, monkeypatch):
    from hashlearn.experiments import rank_codes

    _small_digits(monkeypatch, rank_codes)
    report = rank_codes.run(tmp_path, quick=True, seed=0)
    for part in ("k-NN classification error", "Retrieval precision", "Cascade", "Hamming-ball"):
        assert part in report
    _pngs(tmp_path, ["rank_codes_error.png"])
    results = json.loads((tmp_path / "rank_codes.json").read_text())
    err = rank_codes.summarize(results["digits"]["records"], rank_codes.ERROR)
    assert all(0.0 <= v[0] <= 1.0 for v in err.values())
    # robust at this scale: 32 learned bits classify far better than 8 random ones
    assert err[("LambdaRank", 32)][0] < err[("LSH", 8)][0] - 0.2
    cascade = results["digits_cascade"]
    assert [c["filter_bins"] for c in cascade] == [1, 2, 3]
    sizes = [c["search_set"] for c in cascade]
    assert sizes == sorted(sizes)  # more bins kept, larger long-code search set
    assert len(_claims(tmp_path)) == 2


def test_ann_bench_claims_hold(tmp_path):
    pytest.importorskip("h5py")
    from hashlearn.experiments import ann_bench

    report = ann_bench.run(tmp_path, quick=True, seed=0)
    assert not list(tmp_path.glob("*.hdf5"))  # the synthetic files are removed
    assert "ann-benchmarks sweep" in report
    _pngs(tmp_path, ["ann_synthetic-hamming.png", "ann_synthetic-euclidean.png"])
    claims = _claims(tmp_path)
    assert all(c["holds"] for c in claims)  # exact Hamming search; recall never falls


def test_a_protocol_runs_on_your_own_data(tmp_path):
    from hashlearn.experiments import search_forest

    rng = np.random.RandomState(0)
    X = np.repeat(rng.randn(20, 12), 60, axis=0) + 0.1 * rng.randn(1200, 12)
    report = search_forest.run(tmp_path, quick=True, X=X)
    assert "your data" in report
    records = json.loads((tmp_path / "search_forest.json").read_text())["records"]
    assert all(np.all(np.diff(r["candidate_recall"]) >= 0) for r in records)
    with pytest.raises(ValueError, match="2-D"):
        search_forest.run(tmp_path, quick=True, X=np.zeros(5))
    with pytest.raises(ValueError, match="one label per row"):
        search_forest.run(tmp_path, quick=True, X=X, y=np.zeros(3))
    if importlib.util.find_spec("h5py") is not None:
        from hashlearn.experiments import ann_bench

        assert "your-data.hdf5" in ann_bench.run(tmp_path / "ann", quick=True, X=X)
    from hashlearn.experiments import rank_codes

    with pytest.raises(ValueError, match="needs labels"):
        rank_codes.run(tmp_path, quick=True, X=X)


def test_user_data_files(tmp_path):
    from hashlearn.experiments._common import load_user_data

    X, y = np.arange(12.0).reshape(6, 2), np.arange(6)
    np.save(tmp_path / "x.npy", X)
    np.savez(tmp_path / "xy.npz", X=X, y=y)
    got, labels = load_user_data(tmp_path / "x.npy")
    np.testing.assert_array_equal(got, X)
    assert labels is None
    got, labels = load_user_data(tmp_path / "xy.npz")
    np.testing.assert_array_equal(labels, y)
    np.savez(tmp_path / "bad.npz", Z=X)
    with pytest.raises(ValueError, match="'X'"):
        load_user_data(tmp_path / "bad.npz")
    with pytest.raises(ValueError, match="--data"):
        load_user_data(tmp_path / "x.csv")
    pytest.importorskip("h5py")
    import h5py

    with h5py.File(tmp_path / "xy.h5", "w") as f:
        f.create_dataset("X", data=X)
        f.create_dataset("y", data=y)
    got, labels = load_user_data(tmp_path / "xy.h5")
    np.testing.assert_array_equal(got, X)
    np.testing.assert_array_equal(labels, y)


def test_reproduce_cli_reads_your_data(tmp_path):
    from click.testing import CliRunner

    from hashlearn.cli import main

    rng = np.random.RandomState(0)
    X = np.repeat(rng.randn(20, 12), 60, axis=0) + 0.1 * rng.randn(1200, 12)
    np.savez(tmp_path / "mine.npz", X=X)
    args = ["reproduce", "search-forest", "--quick", "--data", str(tmp_path / "mine.npz")]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    report = (tmp_path / "out" / "results.md").read_text()
    assert "your data" in report
    # the report says how and when it was made, under its heading
    run_line = report.split("\n")[2]
    assert run_line.startswith("Run: `hashlearn reproduce search-forest --seed 0 --quick --data ")
    assert "UTC (" in run_line and "load average" in run_line
    assert (tmp_path / "out" / "claims.json").exists()
    args = ["reproduce", "rank-codes", "--quick", "--data", str(tmp_path / "mine.npz")]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "out2")])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("Error: rank-codes needs labels")


def test_ablations_explain_the_claims_they_name(tmp_path, monkeypatch):
    from hashlearn.experiments import ablations, learned_metric

    def load_real(name, data_dir=None):
        X, y = load_digits()
        return X, y

    monkeypatch.setattr(ablations, "load_real", load_real)
    monkeypatch.setattr(ablations, "available_real", lambda data_dir=None: ["digits"])
    report = ablations.run(tmp_path, quick=True, seed=0)
    findings = json.loads((tmp_path / "ablations.json").read_text())["findings"]
    # without Fashion-MNIST the sparse case's and the survey's ablations run on digits
    # ... and MLH's pooled-precision one on digits (§6.2's needs Fashion-MNIST)
    assert [f[1] for f in findings] == ["digits bags of patches"] + ["digits"] * 5
    for _, _, finding in findings[1:]:
        assert finding.split(":")[0] in ("protocol", "noise", "method")
    assert findings[3][0] == "LambdaRank k-NN error below RankNet at 32 bits"
    survey_claims = [f[0] for f in findings[1:3]]
    assert survey_claims == [
        f"{m} above LSH at M = 500, 32 bits (label ground truth)"
        for m in ablations.SURVEY_SUPERVISED
    ]
    mlh_claims = [f[0] for f in findings[4:]]
    assert mlh_claims[0] == "MLH above BRE, precision R<=3 (pooled), 16 bits"
    assert mlh_claims[1].startswith("MLH above the best unsupervised (")
    assert all("retrieves within R<=3 for" in f[2] for f in findings[4:])
    claim, _, finding = findings[0]
    assert claim.endswith("within 0.02 of the learned linear scan")
    assert finding.split(":")[0] in ("protocol", "noise", "method")
    # the claim text is the reproduction's own, so the overview can match it
    texts = [c["claim"] for c in learned_metric._claims("x", _fake_records(), (32,))]
    assert claim in texts
    assert "| claim | data | finding |" in report and "fraction searched" in report
    with pytest.raises(ValueError, match="--data is not supported"):
        ablations.run(tmp_path, quick=True, X=np.zeros((4, 2)))


def _fake_records():
    names = ["euclidean, linear scan", "euclidean, LSH", "learned, linear scan", "learned, LSH"]
    return [
        {"method": m, "bits": 32, "seed": s, "knn_accuracy": 0.5 + 0.01 * i + 0.003 * s}
        for s in range(3)
        for i, m in enumerate(names)
    ]


def test_learned_metric_claims_are_paired_over_partitions():
    from hashlearn.experiments import learned_metric

    claims = learned_metric._claims("x", _fake_records(), (32,))
    # learned - Euclidean scan is +0.02 in every partition: an interval of one point
    assert [c["verdict"] for c in claims] == ["holds", "holds", "holds"]
    assert claims[0]["margin"] == pytest.approx(0.02) and claims[0]["n"] == 3
    assert "RandomHyperplaneLSH(directions='gaussian', center=False)" in claims[1]["baseline"]


@pytest.mark.slow
def test_mlh_large_ablation_varies_one_factor_at_a_time():
    from hashlearn.experiments import ablations, mlh
    from hashlearn.experiments.pipeline import RunOptions, Split

    X = np.asarray(load_digits()[0], np.float64)
    A, B = mlh.prepare(X[:400], X[400:480], normalise=True, n_pca=40)
    split = Split(A, B).with_threshold_relevance(20)
    cfg = dict(ablations.settings(True), large_bits=(8,))
    findings, md = ablations.mlh_large_cause(cfg, RunOptions(quick=True), split=split)
    assert [f[0] for f in findings] == [
        mlh.large_claim(8),
        mlh.large_claim(8, "MLH (paper §5 training)"),
    ]
    assert findings[0][2].split(":")[0] in ("none", "protocol", "method", "undecided")
    for factor in ("training length", "rho per code length", "pair sampling", "loss"):
        assert factor in findings[0][2]
    variants = ablations.mlh_large_variants(mlh.settings(True)["paper"], 0.25)
    assert variants["pair sampling"].similar_fraction == 0.0
    assert variants["loss"].params["loss"] == "bre"
    assert "MLH, uniform pairs" in md and "Rows as run" in md


@pytest.mark.slow
def test_mlh_large_runs_both_trainings_over_seeds(tmp_path):
    from hashlearn.experiments import mlh
    from hashlearn.experiments.pipeline import Split

    X = np.asarray(load_digits()[0], np.float64)
    A, B = mlh.prepare(X[:400], X[400:480], normalise=True, n_pca=40)
    split = Split(A, B).with_threshold_relevance(20)
    cfg = dict(mlh.settings(True), large_bits=(16,))
    cfg["paper"] = dict(cfg["paper"], epochs=3)
    lines, claims = mlh._large(tmp_path, cfg, 0, None, None, split=split)
    assert [c["claim"] for c in claims] == [
        mlh.large_claim(16),
        mlh.large_claim(16, "MLH (paper §5 training)"),
    ]
    assert all(c["n"] == 2 and c["interval"] == "paired t" for c in claims)
    records = json.loads((tmp_path / "mlh_large.json").read_text())
    paper = [r for r in records if r["method"] == "MLH (paper §5 training)"]
    assert len(paper) == 2 and all(r["n_epochs_"] == 3 for r in paper)
    assert {r["bits"] for r in records if r["method"] == "MLH.5"} == {16}
    assert "Rows as run" in "\n".join(lines)

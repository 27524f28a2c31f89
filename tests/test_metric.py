"""ITML and KernelITML: constraints, convergence, kernel form == explicit form, errors, io."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from hashlearn.datasets import load_digits
from hashlearn.io import load
from hashlearn.metric.itml import ITML, knn_accuracy
from hashlearn.metric.kernel_itml import KernelITML
from hashlearn.supervision import pairs_from_labels


@pytest.fixture(scope="module")
def blobs():
    rng = np.random.RandomState(0)
    y = rng.randint(0, 3, 90)
    X = rng.randn(90, 6)
    X[:, 0] += 3.0 * y  # one informative dimension among noise
    return X, y


def test_itml_satisfies_constraints_and_converges():
    rng = np.random.RandomState(0)
    y = rng.randint(0, 3, 90)
    X = rng.randn(90, 6)
    X[:, 0] = 10.0 * y + 0.01 * X[:, 0]  # feasible: separable along one dimension
    pairs, similar = pairs_from_labels(y, 200, random_state=0)
    itml = ITML(slack=100.0).fit(X, pairs=pairs, similar=similar)
    assert itml.converged_ and itml.n_iter_ < itml.max_iter
    assert itml.violated_fraction_ < 0.02
    np.testing.assert_allclose(itml.G_.T @ itml.G_, itml.A_, atol=1e-8)
    assert np.all(np.linalg.eigvalsh(itml.A_) > 0)
    np.testing.assert_allclose(itml.transform(X), X @ itml.G_.T)


def test_itml_projection_matches_numpy_oracle(blobs):
    """One pass of the numba kernel equals eq. 3 written in numpy (Davis et al. Alg. 1)."""
    X, y = blobs
    pairs, similar = pairs_from_labels(y, 40, random_state=1)
    itml = ITML(slack=1.0, max_iter=1, tol=1e-12).fit(X, pairs=pairs, similar=similar)
    u, ell = itml.bounds_
    A = np.eye(X.shape[1])
    lam = np.zeros(len(pairs))
    bhat = np.where(similar, u, ell)
    for c, (i, j) in enumerate(pairs):
        v = X[i] - X[j]
        p = v @ A @ v
        delta = 1.0 if similar[c] else -1.0
        alpha = min(lam[c], delta * 0.5 * (1 / p - 1 / bhat[c]))
        lam[c] -= alpha
        beta = delta * alpha / (1 - delta * alpha * p)
        bhat[c] = 1 / (1 / bhat[c] + alpha * delta / 1.0)
        A = A + beta * np.outer(A @ v, A @ v)
    np.testing.assert_allclose(itml.A_, A, rtol=1e-9, atol=1e-12)


def test_kernel_itml_linear_equals_explicit(blobs):
    X, y = blobs
    pairs, similar = pairs_from_labels(y, 150, random_state=0)
    itml = ITML(slack=1.0, tol=1e-8).fit(X, pairs=pairs, similar=similar)
    kit = KernelITML(slack=1.0, tol=1e-8).fit(X, pairs=pairs, similar=similar)
    assert kit.converged_ and kit.n_iter_ == itml.n_iter_
    Phi = X[kit.constrained_index_]
    G = np.eye(X.shape[1]) + Phi.T @ kit.S_ @ Phi  # Lemma 2
    np.testing.assert_allclose(G.T @ G, itml.A_, atol=1e-8)
    np.testing.assert_allclose(kit.K_, Phi @ itml.A_ @ Phi.T, atol=1e-8)
    np.testing.assert_allclose(
        kit.learned_kernel(X[:7], X[7:12]), X[:7] @ itml.A_ @ X[7:12].T, atol=1e-8
    )
    np.testing.assert_allclose(
        kit.pair_distances(X[:9], X[9:18]), itml.pair_distances(X[:9], X[9:18]), atol=1e-8
    )
    # sparse input gives the same kernel form
    kit_sp = KernelITML(slack=1.0, tol=1e-8).fit(sp.csr_matrix(X), pairs=pairs, similar=similar)
    np.testing.assert_allclose(kit_sp.S_, kit.S_, atol=1e-10)


def test_kernel_itml_rbf_and_precomputed_agree(blobs):
    X, y = blobs
    pairs, similar = pairs_from_labels(y, 100, random_state=0)
    rbf = KernelITML(kernel="rbf", rbf_gamma=0.1).fit(X, pairs=pairs, similar=similar)
    from sklearn.metrics.pairwise import rbf_kernel

    pre = KernelITML(kernel="precomputed").fit(
        rbf_kernel(X, gamma=0.1), pairs=pairs, similar=similar
    )
    np.testing.assert_allclose(rbf.S_, pre.S_, atol=1e-10)
    assert rbf.violated_fraction_ <= 1.0 and rbf.converged_


@pytest.mark.slow
def test_auto_slack_always_learns_and_reports_the_prior():
    X, y = load_digits()
    rng = np.random.RandomState(0)
    lab = np.concatenate([rng.permutation(np.flatnonzero(y == c))[:20] for c in range(10)])
    itml = ITML(random_state=0).fit(X[lab], y[lab])
    assert itml.learned_ and not np.allclose(itml.A_, np.eye(64))
    cv = itml.cv_results_
    n_cand = len(cv["params"])
    for key in ("param_slack", "mean_test_score", "std_test_score", "rank_test_score"):
        assert cv[key].shape == (n_cand,)
    assert {"prior_mean_test_score", "prior_std_test_score", "split0_test_score"} <= set(cv)
    best = int(np.argmax(cv["mean_test_score"]))
    assert cv["rank_test_score"][best] == 1
    assert cv["params"][best] == {
        "slack": itml.slack_,
        "lower_percentile": itml.lower_percentile_,
        "upper_percentile": itml.upper_percentile_,
    }
    assert itml.best_score_ == cv["mean_test_score"].max()
    assert itml.prior_score_ == cv["prior_mean_test_score"]
    # the chosen slack weight is interior to the values tried, or extensions ran out
    tried = sorted(set(cv["param_slack"]))
    assert tried[0] < itml.slack_ < tried[-1] or len(tried) == 4 + itml.grid_extensions
    rest = np.setdiff1d(np.arange(len(X)), lab)
    acc_l = knn_accuracy(itml.transform(X[lab]), y[lab], itml.transform(X[rest]), y[rest], 4)
    acc_e = knn_accuracy(X[lab], y[lab], X[rest], y[rest], 4)
    assert acc_l >= acc_e - 0.02


def test_auto_slack_extends_the_grid_past_a_best_edge(blobs):
    X, y = blobs
    # a one-value grid: its value is the best and on the lower edge, so the grid grows
    # downwards by factors of 10, grid_extensions times unless a new value loses
    itml = ITML(slack_grid=(100.0,), grid_extensions=2, random_state=0).fit(X, y)
    tried = set(itml.cv_results_["param_slack"])
    # first 10 (below the single value); then past whichever of 10, 100 scores best
    assert tried in ({1.0, 10.0, 100.0}, {10.0, 100.0, 1000.0})
    assert itml.slack_ in tried and itml.learned_
    none = ITML(slack_grid=(100.0,), grid_extensions=0, random_state=0).fit(X, y)
    assert set(none.cv_results_["param_slack"]) == {100.0} and none.slack_ == 100.0
    # explicit pairs: cross-validated pair AUC, same layout
    pairs, similar = pairs_from_labels(y, 200, random_state=0)
    by_pairs = ITML(random_state=0).fit(X, pairs=pairs, similar=similar)
    assert 0.5 <= by_pairs.best_score_ <= 1.0 and by_pairs.learned_


def test_auto_slack_warns_when_learned_scores_below_the_prior():
    """XOR labels: a global linear metric cannot help k-NN, and large slack weights distort
    it. The warning is issued exactly when the best candidate's cross-validated score is
    below the prior's; the fit learns a metric either way."""
    import warnings

    warned = 0
    for seed in range(6):
        rng = np.random.RandomState(seed)
        X = rng.uniform(-1, 1, (120, 2))
        y = ((X[:, 0] > 0) ^ (X[:, 1] > 0)).astype(int)
        X = np.c_[X, 0.05 * rng.randn(120, 1)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            itml = ITML(slack_grid=(1.0, 10.0), grid_extensions=0, random_state=seed).fit(X, y)
        below = [w for w in caught if "below the prior" in str(w.message)]
        assert bool(below) == (itml.best_score_ < itml.prior_score_)
        assert itml.learned_ and not np.allclose(itml.A_, np.eye(3))
        warned += bool(below)
    assert warned >= 3  # measured: 5 of the 6 seeds


def test_auto_slack_too_small_classes_warns_and_learns():
    X = np.random.RandomState(0).randn(6, 3)
    with pytest.warns(UserWarning, match="cannot cross-validate"):
        itml = ITML(random_state=0).fit(X, [0, 0, 0, 0, 0, 1])
    assert itml.slack_ == 1.0 and itml.cv_results_ == {} and np.isnan(itml.best_score_)


def test_bad_input(blobs):
    X, y = blobs
    with pytest.raises(ValueError, match="single class"):
        ITML(slack=1.0).fit(X, np.zeros(len(X)))
    with pytest.raises(ValueError):
        ITML(slack=1.0).fit(X, pairs=[[0, 500]], similar=[True])
    with pytest.raises(ValueError, match="positive definite"):
        ITML(slack=1.0, A0=np.zeros((6, 6))).fit(X, y)
    with pytest.raises(ValueError, match="symmetric"):
        ITML(slack=1.0, A0=np.triu(np.ones((6, 6)))).fit(X, y)
    with pytest.raises(TypeError, match="sparse"):
        ITML(slack=1.0).fit(sp.csr_matrix(X), y)
    with pytest.raises(ValueError, match="slack"):
        ITML(slack=-1.0).fit(X, y)
    with pytest.raises(ValueError, match="'slack_grid' parameter"):
        ITML(slack_grid=()).fit(X, y)
    with pytest.raises(ValueError, match="'slack_grid' parameter"):
        ITML(slack_grid=(0.1, -1.0)).fit(X, y)
    with pytest.raises(ValueError, match="'percentile_grid' parameter"):
        ITML(percentile_grid=((95, 5),)).fit(X, y)
    with pytest.raises(ValueError, match="'grid_extensions' parameter"):
        ITML(grid_extensions=-1).fit(X, y)
    with pytest.raises(ValueError, match="Unknown label type"):
        ITML().fit(X, np.linspace(0, 1, len(X)))
    with pytest.raises(ValueError, match="shape"):
        KernelITML(kernel=lambda A, B: np.ones((2, 2))).fit(X, y)
    with pytest.raises(ValueError, match="kernel"):
        KernelITML(kernel="poly").fit(X, y)
    with pytest.raises(ValueError, match="single class"):
        KernelITML().fit(X, np.ones(len(X)))


def test_save_load_round_trip(blobs, tmp_path):
    X, y = blobs
    itml = ITML(slack=1.0, A0=2 * np.eye(6), random_state=0).fit(X, y)
    itml.save(tmp_path / "itml")
    back = ITML.load(tmp_path / "itml")
    np.testing.assert_array_equal(back.transform(X), itml.transform(X))
    assert back.slack_ == itml.slack_ and back.n_iter_ == itml.n_iter_
    auto = ITML(slack_grid=(0.1, 1.0), percentile_grid=((5, 95),), random_state=0).fit(X, y)
    auto.save(tmp_path / "auto")
    back = ITML.load(tmp_path / "auto")
    assert back.get_params() == auto.get_params()
    assert back.cv_results_["params"] == auto.cv_results_["params"]
    np.testing.assert_array_equal(
        back.cv_results_["mean_test_score"], auto.cv_results_["mean_test_score"]
    )
    assert back.prior_score_ == auto.prior_score_
    np.testing.assert_array_equal(back.transform(X), auto.transform(X))
    for Xin in (X, sp.csr_matrix(X)):
        kit = KernelITML(random_state=0).fit(Xin, y)
        kit.save(tmp_path / "kit")
        kb = load(tmp_path / "kit")
        np.testing.assert_allclose(kb.learned_kernel(Xin[:5]), kit.learned_kernel(Xin[:5]))


def test_same_seed_same_result(blobs):
    X, y = blobs
    a = ITML(slack=1.0, random_state=3).fit(X, y).A_
    b = ITML(slack=1.0, random_state=3).fit(X, y).A_
    np.testing.assert_array_equal(a, b)


def test_symmetric_factor_coefficients_reproduce_learned_metric(blobs):
    from hashlearn.metric.kernel_itml import symmetric_factor_coefficients

    X, y = blobs
    pairs, similar = pairs_from_labels(y, 150, random_state=0)
    itml = ITML(slack=1.0, tol=1e-8).fit(X, pairs=pairs, similar=similar)
    kit = KernelITML(slack=1.0, tol=1e-8).fit(X, pairs=pairs, similar=similar)
    assert kit.lemma2_stable_
    S = symmetric_factor_coefficients(kit.K0_, kit.K_)
    Phi = X[kit.constrained_index_]
    G = np.eye(X.shape[1]) + Phi.T @ S @ Phi
    np.testing.assert_allclose(G, G.T, atol=1e-8)
    np.testing.assert_allclose(G @ G, itml.A_, atol=1e-6)


def papers_c_by_c_projections(K0, local, similar, bounds, slack, max_iter, tol):
    """The paper's O(c^2) updates written out in numpy: the kernel ``K`` (eq. 4) and
    Lemma 2's ``S`` (``G = I + Phi S Phi^T``, with Lemma 1's ``alpha``), projection scalars
    as Davis et al.'s Alg. 1. Returns ``(K, S, passes)``."""
    c = len(K0)
    K, S = K0.copy(), np.zeros_like(K0)
    delta = np.where(similar, 1.0, -1.0)
    bhat = np.where(similar, bounds[0], bounds[1]).astype(float)
    lam = np.zeros(len(local))
    for it in range(max_iter):
        lam_old = lam.copy()
        for t, (i, j) in enumerate(local):
            e = np.zeros(c)
            e[i], e[j] = 1.0, -1.0
            p = e @ K @ e
            if p <= 1e-12:
                continue
            alpha = min(lam[t], delta[t] * slack / (slack + 1) * (1 / p - 1 / bhat[t]))
            lam[t] -= alpha
            beta = delta[t] * alpha / (1 - delta[t] * alpha * p)
            bhat[t] = 1 / (1 / bhat[t] + alpha * delta[t] / slack)
            # Lemma 2: S += alpha_L (I + S K0) e e^T (I + K0 S^T)(I + K0 S)
            a = e + S @ (K0 @ e)
            b = a + S.T @ (K0 @ a)
            S += (np.sqrt(1 + p * beta) - 1) / p * np.outer(a, b)
            w = K @ e
            K += beta * np.outer(w, w)  # eq. 4
        change = np.abs(lam - lam_old).sum()
        total = np.abs(lam).sum() + np.abs(lam_old).sum()
        if total == 0 or change / total < tol:
            return K, S, it + 1
    return K, S, max_iter


@pytest.mark.parametrize("kernel", ["linear", "rbf"])
def test_factored_projections_equal_the_papers_c_by_c_updates(blobs, kernel):
    """The O(r^2) factored solver gives the K (eq. 4) and the factor G = I + Phi S Phi^T
    (Lemma 2) of the paper's O(c^2) updates (written out in numpy above)."""
    X, y = blobs
    pairs, similar = pairs_from_labels(y, 120, random_state=2)
    kit = KernelITML(kernel=kernel, rbf_gamma=0.2, slack=1.0, tol=1e-6).fit(
        X, pairs=pairs, similar=similar
    )
    index, inverse = np.unique(pairs.ravel(), return_inverse=True)
    local = inverse.reshape(-1, 2)
    K0 = kit.K0_.copy()
    K, S, passes = papers_c_by_c_projections(
        K0, local, similar, kit.bounds_, 1.0, kit.n_iter_, 1e-6
    )
    assert passes == kit.n_iter_
    scale = np.abs(K).max()
    np.testing.assert_allclose(kit.K_, (K + K.T) / 2, atol=1e-7 * scale)
    # same G restricted to the constrained points: K0 S K0 is Phi^T (G - I) Phi
    np.testing.assert_allclose(K0 @ kit.S_ @ K0, K0 @ S @ K0, atol=1e-6 * scale)
    if kernel == "linear":
        assert kit.rank_ == X.shape[1]
    else:
        assert kit.rank_ > X.shape[1]


def test_kernel_itml_costs_within_10x_of_itml():
    """Issue 12: 26 classes, 200 rows, the default 20 c^2 constraints. The paper's O(c^2)
    update cost ~500x ITML's CPU time here; the factored solver must stay within 10x (CPU
    time, same constraints, same process; measured ratio ~3)."""
    import time

    rng = np.random.RandomState(0)
    n, d, k = 200, 16, 26
    y = rng.randint(0, k, n)
    X = rng.randn(k, d)[y] * 2 + rng.randn(n, d)
    pairs, similar = pairs_from_labels(y, 20 * k * k, random_state=0)
    for est in (ITML(slack=1.0, max_iter=2), KernelITML(slack=1.0, max_iter=2)):
        est.fit(X, pairs=pairs, similar=similar)  # compile / warm up
    times = {}
    for est in (ITML(slack=1.0, max_iter=150), KernelITML(slack=1.0, max_iter=150)):
        start = time.process_time()
        est.fit(X, pairs=pairs, similar=similar)
        times[type(est).__name__] = time.process_time() - start
        assert est.n_iter_ == 150 or est.converged_
    assert times["KernelITML"] <= 10 * times["ITML"], times


def test_kernel_itml_caps_and_warns_on_long_fits(blobs, capsys, stderr_logging):
    X, y = blobs
    with pytest.warns(UserWarning, match="among max_points=40 random rows"):
        kit = KernelITML(max_points=40, random_state=0).fit(X, y)
    assert len(kit.constrained_index_) <= 40
    with pytest.warns(UserWarning, match="flops"):
        KernelITML(warn_flops_per_pass=1.0, max_iter=2).fit(X, y)
    pairs, similar = pairs_from_labels(y, 100, random_state=0)
    with pytest.warns(UserWarning, match="more than max_points=10"):
        KernelITML(max_points=10, max_iter=2).fit(X, pairs=pairs, similar=similar)
    KernelITML(max_iter=3, verbose=True).fit(X, y)
    err = capsys.readouterr().err
    assert "eigendecomposition" in err and "3 passes, converged=False" in err
    with pytest.raises(ValueError, match="'max_points' parameter"):
        KernelITML(max_points=1).fit(X, y)


def test_itml_verbose_logs_each_candidate(blobs, capsys, caplog, stderr_logging):
    import logging

    X, y = blobs
    ITML(slack_grid=(0.1, 1.0), grid_extensions=0, random_state=0, verbose=True).fit(X, y)
    err = capsys.readouterr().err
    assert "prior A0, cv score" in err and err.count("cv score") == 1 + 2 * 2
    with caplog.at_level(logging.DEBUG, logger="hashlearn"):  # verbose=False: DEBUG records
        ITML(slack_grid=(0.1,), grid_extensions=0, random_state=0).fit(X, y)
    assert capsys.readouterr().err == ""
    assert any("slack=0.1" in r.getMessage() for r in caplog.records)


# ------------------------------------------------ gamma -> slack (ITML's slack weight)


def test_deprecated_gamma_keyword_still_sets_the_slack_weight(blobs):
    from hashlearn.hashers.metric_lsh import KernelMetricLSH, MetricLSH

    X, y = blobs
    new = ITML(slack=0.5, random_state=0).fit(X, y)
    with pytest.warns(DeprecationWarning, match="'gamma' parameter of ITML is renamed 'slack'"):
        old = ITML(gamma=0.5, random_state=0).fit(X, y)
    np.testing.assert_array_equal(old.A_, new.A_)
    assert old.slack_ == 0.5
    with pytest.warns(DeprecationWarning, match="slack_grid"):
        grid = ITML(gamma_grid=(0.1,), grid_extensions=0, random_state=0).fit(X, y)
    assert set(grid.cv_results_["param_slack"]) == {0.1}
    with pytest.warns(DeprecationWarning, match="renamed slack_"):
        assert grid.gamma_ == grid.slack_
    # get_params / set_params know both names; the old one wins when set
    est = ITML().set_params(gamma=2.0)
    assert est.get_params()["gamma"] == 2.0 and est.get_params()["slack"] == "auto"
    pairs, similar = pairs_from_labels(y, 100, random_state=0)
    with pytest.warns(DeprecationWarning, match="KernelITML"):
        kit = KernelITML(gamma=2.0).fit(X, pairs=pairs, similar=similar)
    ref = KernelITML(slack=2.0).fit(X, pairs=pairs, similar=similar)
    np.testing.assert_array_equal(kit.K_, ref.K_)
    for cls in (MetricLSH, KernelMetricLSH):
        with pytest.warns(DeprecationWarning, match=f"{cls.__name__} is renamed"):
            h = cls(8, gamma=1.0, num_constraints=60, random_state=0).fit(X, y)
        ref = cls(8, slack=1.0, num_constraints=60, random_state=0).fit(X, y)
        np.testing.assert_array_equal(h.encode(X), ref.encode(X))


def _as_saved_before_the_rename(path):
    """Rewrite a saved ITML directory as the release before the rename wrote it."""
    import json

    meta = json.loads((path / "meta.json").read_text())
    meta["params"]["gamma"] = meta["params"].pop("slack")
    state = meta["state"]
    state["gamma_"] = state.pop("slack_")
    state["grids"]["gamma_grid"] = state["grids"].pop("slack_grid")
    if "cv_param_slack" in meta["arrays"]:
        entry = meta["arrays"].pop("cv_param_slack")
        old_file = entry["file"].replace("cv_param_slack", "cv_param_gamma")
        (path / entry["file"]).rename(path / old_file)
        meta["arrays"]["cv_param_gamma"] = {**entry, "file": old_file}
    (path / "meta.json").write_text(json.dumps(meta))


def test_files_saved_with_gamma_still_load(blobs, tmp_path):
    import warnings

    X, y = blobs
    auto = ITML(slack_grid=(0.1, 1.0), grid_extensions=0, random_state=0).fit(X, y)
    fixed = ITML(slack=0.5, random_state=0).fit(X, y)
    for name, itml in (("auto", auto), ("fixed", fixed)):
        itml.save(tmp_path / name)
        _as_saved_before_the_rename(tmp_path / name)
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            back = ITML.load(tmp_path / name)
        assert back.get_params() == itml.get_params()
        assert back.slack_ == itml.slack_
        assert back.cv_results_.get("params") == itml.cv_results_.get("params")
        np.testing.assert_array_equal(back.transform(X), itml.transform(X))
    # a hasher saved with the old keyword (generic persistence) loads under the new one
    from hashlearn.hashers.metric_lsh import MetricLSH

    with pytest.warns(DeprecationWarning):
        h = MetricLSH(8, gamma=1.0, num_constraints=60, random_state=0).fit(X, y)
    h.save(tmp_path / "mlsh")
    back = MetricLSH.load(tmp_path / "mlsh")
    assert back.slack == 1.0 and back.gamma == "deprecated"
    np.testing.assert_array_equal(back.encode(X), h.encode(X))


def test_knn_accuracy_matches_a_per_row_vote_with_ties_to_the_nearest_voter():
    """knn_accuracy votes through hashlearn._utils.vote.majority_vote; the oracle counts each
    row's votes and breaks ties by the first (nearest) voter."""
    rng = np.random.RandomState(1)
    for k in (1, 2, 4, 6):
        Z_train = rng.randint(0, 3, (40, 2)).astype(float)  # many equal distances
        y_train = rng.choice([3, 7, 9], 40)
        Z_val, y_val = rng.randint(0, 3, (25, 2)).astype(float), rng.choice([3, 7, 9], 25)
        sq = ((Z_val[:, None, :] - Z_train[None, :, :]) ** 2).sum(-1)
        nn = np.argsort(sq, axis=1, kind="stable")[:, :k]
        pred = []
        for row in y_train[nn]:
            labels, first, counts = np.unique(row, return_index=True, return_counts=True)
            best = counts == counts.max()
            pred.append(labels[best][np.argmin(first[best])])
        expected = float(np.mean(np.array(pred) == y_val))
        assert knn_accuracy(Z_train, y_train, Z_val, y_val, k) == expected

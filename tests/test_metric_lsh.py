"""MetricLSH (eq. 6) and KernelMetricLSH (eq. 8): implicit == explicit bits, collision rate,
metric re-ranking through Searcher, sparse input, errors, io."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import sparse_rows
from hashlearn.codes import unpack_bits
from hashlearn.hashers.metric_lsh import (
    KernelMetricLSH,
    MetricLSH,
    hashed_hyperplanes,
    hashed_projection,
)
from hashlearn.index.flat import FlatIndex
from hashlearn.index.permutation import PermutationIndex
from hashlearn.io import load
from hashlearn.metric.itml import ITML
from hashlearn.search import Searcher


@pytest.fixture(scope="module")
def data():
    rng = np.random.RandomState(0)
    y = rng.randint(0, 3, 150)
    X = rng.randn(150, 8)
    X[:, 0] += 2.0 * y
    return X, y


def test_implicit_equals_explicit_bits(data):
    X, y = data
    kml = KernelMetricLSH(48, num_constraints=120, random_state=0).fit(X, y)
    R = kml.hyperplanes()
    explicit = MetricLSH.from_metric(G=kml.metric_factor(), n_bits=48, components=R)
    p_imp, p_exp = kml.project(X), explicit.project(X)
    np.testing.assert_allclose(p_imp, p_exp, atol=1e-9)
    ties = np.abs(p_exp) < 1e-9
    b_imp, b_exp = unpack_bits(kml.encode(X), 48), unpack_bits(explicit.encode(X), 48)
    assert np.array_equal(b_imp[~ties], b_exp[~ties])
    # sparse input: the same bits
    np.testing.assert_array_equal(kml.encode(sp.csr_matrix(X)), kml.encode(X))


def test_hashed_hyperplanes_are_standard_normal():
    R = hashed_hyperplanes(64, 400, seed=7)
    assert abs(R.mean()) < 4 / np.sqrt(R.size)
    assert abs(R.var() - 1) < 4 * np.sqrt(2 / R.size)
    np.testing.assert_array_equal(R, hashed_hyperplanes(64, 400, seed=7))
    assert not np.array_equal(R, hashed_hyperplanes(64, 400, seed=8))
    X = sp.random(20, 400, density=0.05, random_state=0, format="csr")
    np.testing.assert_allclose(hashed_projection(X, 64, 7), X @ R.T, atol=1e-10)


def test_collision_probability_follows_learned_angle():
    """eq. 7: P[h(x) = h(y)] = 1 - angle_A(x, y) / pi, binomial tolerance."""
    rng = np.random.RandomState(1)
    M = rng.randn(5, 5)
    A = M @ M.T + np.eye(5)
    n_bits = 4000
    h = MetricLSH.from_metric(A, n_bits=n_bits, random_state=0)
    x, z = rng.randn(2, 5)
    cos = x @ A @ z / np.sqrt((x @ A @ x) * (z @ A @ z))
    p = 1 - np.arccos(cos) / np.pi
    bits = unpack_bits(h.encode(np.stack([x, z])), n_bits)
    agree = np.mean(bits[0] == bits[1])
    assert abs(agree - p) < 4 * np.sqrt(p * (1 - p) / n_bits)


def test_metric_distances_and_searcher_rerank(data):
    X, y = data
    h = MetricLSH(16, slack=1.0, random_state=0).fit(X, y)
    A = h.metric_.A_
    q, c = X[:4], X[4:28].reshape(4, 6, 8)
    diff = c - q[:, None]
    np.testing.assert_allclose(h.metric_distances(q, c), np.einsum("bci,ij,bcj->bc", diff, A, diff))
    # exhaustive candidates -> exact learned-metric k-NN
    s = Searcher(h, FlatIndex(16), rerank="metric", n_candidates=len(X)).add(X)
    D, I = s.search(X[:10], 5)
    full = np.einsum("qni,ij,qnj->qn", X[None] - X[:10, None], A, X[None] - X[:10, None])
    expected = np.lexsort((np.broadcast_to(np.arange(len(X)), full.shape), full), axis=1)[:, :5]
    np.testing.assert_array_equal(I, expected)
    # through the permutation index
    s2 = Searcher(h, PermutationIndex(16, window=4), rerank="metric").add(X)
    D2, I2 = s2.search(X[:10], 3)
    assert np.all(I2[:, 0] == np.arange(10))  # each point finds itself first
    kml = KernelMetricLSH(16, num_constraints=80, random_state=0).fit(X, y)
    G = kml.metric_factor()
    np.testing.assert_allclose(
        kml.metric_distances(q, c), np.einsum("bci,bci->bc", diff @ G.T, diff @ G.T), atol=1e-8
    )


def test_high_dimensional_sparse_input():
    rng = np.random.RandomState(0)
    X = sparse_rows(np.random.default_rng(0), 300, 100_000, 50)  # density 0.0005
    y = rng.randint(0, 4, 300)
    h = KernelMetricLSH(32, num_constraints=200, random_state=0).fit(X, y)
    codes = h.encode(X)
    assert codes.shape == (300, 4)
    assert len(h.support_) <= X[h.metric_.constrained_index_].nnz


def test_defaults_fit_quickly_on_labels(data):
    X, y = data
    for cls in (MetricLSH, KernelMetricLSH):
        h = cls(random_state=0).fit(X, y)
        assert h.encode(X).shape == (len(X), 4)
    e = MetricLSH(16, metric="euclidean", random_state=0).fit(X, y)
    np.testing.assert_allclose(e.G_, np.eye(8))


def test_same_seed_same_codes_and_io(data, tmp_path):
    X, y = data
    for h1, h2 in (
        (MetricLSH(24, slack=1.0, random_state=5), MetricLSH(24, slack=1.0, random_state=5)),
        (KernelMetricLSH(24, random_state=5), KernelMetricLSH(24, random_state=5)),
    ):
        h1.fit(X, y)
        h2.fit(X, y)
        np.testing.assert_array_equal(h1.encode(X), h2.encode(X))
        h1.save(tmp_path / type(h1).__name__)
        back = load(tmp_path / type(h1).__name__)
        np.testing.assert_array_equal(back.encode(X), h1.encode(X))
        q, c = X[:2], X[2:8].reshape(2, 3, 8)
        np.testing.assert_allclose(back.metric_distances(q, c), h1.metric_distances(q, c))
    fm = MetricLSH.from_metric(ITML(slack=1.0).fit(X, y), n_bits=8, random_state=0)
    fm.save(tmp_path / "fm")
    np.testing.assert_array_equal(MetricLSH.load(tmp_path / "fm").encode(X), fm.encode(X))


def test_bad_input(data):
    X, y = data
    with pytest.raises(TypeError, match="dense"):
        MetricLSH(8).fit(sp.csr_matrix(X), y)
    with pytest.raises(ValueError, match="supervised"):
        MetricLSH(8).fit(X)
    with pytest.raises(ValueError, match="metric"):
        MetricLSH(8, metric="cosine").fit(X, y)
    with pytest.raises(ValueError, match="single class"):
        KernelMetricLSH(8).fit(X, np.zeros(len(X)))
    with pytest.raises(ValueError, match="symmetric"):
        MetricLSH.from_metric(np.triu(np.ones((3, 3))), n_bits=8)
    h = MetricLSH(8, slack=1.0).fit(X, y)
    with pytest.raises(ValueError, match="candidates"):
        h.metric_distances(X[:2], X[:2])


def test_sparse_encoding_costs_nonzeros_not_dimension():
    """Issue 12: at d = 10^7, encoding a sparse row must not touch all d columns (slicing
    X[:, support_] cost ~28 ms a row). Encoding 100 rows of 20 non-zeros takes CPU time of
    the order of a few ms, and the bits equal the explicit formula
    r^T x + (Phi x)^T S^T Phi r, evaluated with sparse products only."""
    import time

    from hashlearn.hashers.metric_lsh import hashed_projection

    d, n = 10**7, 120
    rng = np.random.RandomState(0)
    y = rng.randint(0, 3, n)
    cols = rng.randint(0, d, size=(n, 20))
    cols[:, :5] = 1000 * y[:, None] + np.arange(5)  # shared class-specific columns
    X = sp.csr_matrix(
        (rng.rand(n * 20) + 0.5, cols.ravel(), np.arange(0, n * 20 + 1, 20)), shape=(n, d)
    )
    X.sum_duplicates()
    h = KernelMetricLSH(32, num_constraints=150, random_state=0).fit(X, y)
    Q = X[:100]
    h.project(Q[:2])  # compile
    start = time.process_time()
    for _ in range(5):
        codes = h.encode(Q)
    per_call = (time.process_time() - start) / 5
    assert per_call < 0.5, per_call  # O(d) per row would be ~2.8 s for 100 rows
    Phi = h._phi()
    gammas = h.S_.T @ hashed_projection(Phi, 32, h.seed_)  # (c, b)
    ref = hashed_projection(Q, 32, h.seed_) + np.asarray((Q @ Phi.T) @ gammas)
    np.testing.assert_allclose(h.project(Q), ref, rtol=1e-9, atol=1e-9)
    bits = unpack_bits(codes, 32).astype(bool)
    clear = np.abs(ref) > 1e-6  # bits off the decision boundary, whatever the rounding
    np.testing.assert_array_equal(bits[clear], (ref >= 0)[clear])
    assert h.n_iter_ >= 1


def test_metric_distances_from_sparse_differences_equal_dense(data):
    """The sparse re-ranking hook of Searcher: distances from CSR differences equal
    metric_distances on the dense vectors, for both forms."""
    X, y = data
    for h in (
        KernelMetricLSH(16, num_constraints=80, random_state=0).fit(X, y),
        MetricLSH(16, slack=1.0, random_state=0).fit(X, y),
    ):
        q, cands = X[:3], np.stack([X[5:9], X[9:13], X[13:17]])
        ref = h.metric_distances(q, cands)
        Z = sp.csr_matrix((cands - q[:, None, :]).reshape(12, -1))
        np.testing.assert_allclose(
            h.metric_distances_from_differences(Z).reshape(3, 4), ref, rtol=1e-9, atol=1e-9
        )
        with pytest.raises(ValueError, match="columns"):
            h.metric_distances_from_differences(np.zeros((2, X.shape[1] + 1)))


def test_searcher_sparse_metric_rerank_with_kernel_metric_lsh():
    """Sparse vectors end to end: exhaustive candidates re-ranked by the implicit learned
    metric (through metric_distances_from_differences) give the exact learned k-NN."""
    rng = np.random.RandomState(1)
    y = rng.randint(0, 3, 80)
    X = sp.random(80, 5000, density=0.004, format="csr", random_state=1)
    X = (X + sp.csr_matrix((np.ones(80), (np.arange(80), y)), shape=X.shape)).tocsr()
    h = KernelMetricLSH(16, num_constraints=100, random_state=0).fit(X, y)
    s = Searcher(h, FlatIndex(16), rerank="metric", n_candidates=80).add(X)
    D, I = s.search(X[:6], 4)
    Z = X.toarray() @ h.metric_factor().T  # G x for every row: |G (x - q)|^2 = |Gx - Gq|^2
    full = np.array([np.sum((Z - Z[i]) ** 2, axis=1) for i in range(6)])
    np.testing.assert_allclose(D, np.take_along_axis(full, I, axis=1), rtol=1e-5, atol=1e-6)
    assert np.all(D[:, :-1] <= D[:, 1:] + 1e-9)
    np.testing.assert_allclose(D[:, 0], np.sort(full, axis=1)[:, 0], atol=1e-6)

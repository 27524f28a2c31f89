"""ResidualIVFIndex: residual 1-bit codes under k-means lists, ranked by RaBitQ's estimator.

Oracles: the estimator in float64 numpy, over every list or over the lists nearest each
query; the recall ordering the design rests on (fewer candidates than Hamming ranking of the
plain codes for the same recall after rescoring), on real data (digits) through ITQ.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

import hashlearn
from hashlearn import Searcher
from hashlearn.embeddings import EmbeddingIndex
from hashlearn.hashers import IterativeQuantization as ITQ
from hashlearn.index import IVFIndex, ResidualIVFIndex
from hashlearn.index import _asymmetric as asymmetric_kernels
from hashlearn.index import _ivf_kernels as ivf_kernels
from hashlearn.index import ivf_residual as residual_module


@pytest.fixture(scope="module")
def digits():
    return hashlearn.load_digits()


def _codes(P):
    return np.packbits(P >= 0, axis=1, bitorder="little")


def _estimates(index, P_rows, Q):
    """``(m, n)`` float64 estimated scores of every stored row (module doc) from the rows'
    projections, filed under their nearest centroid as the index files them."""
    C = index.centroid_vectors.astype(np.float64)
    P = P_rows.astype(np.float64)
    lists = np.argmin(_list_distances(index, P_rows), axis=1)  # ties to the smaller list
    c = C[lists]
    r = P - c
    signs = np.where(r >= 0, 1.0, -1.0)
    l1 = np.abs(r).sum(1)
    g = np.where(l1 > 0, (r * r).sum(1) / np.where(l1 > 0, l1, 1.0), 0.0)
    h = (c * r).sum(1) - g * (c * signs).sum(1) - 0.5 * (P * P).sum(1)
    Q = Q.astype(np.float64)
    return (Q @ C.T)[:, lists] + g * (_quantized(Q) @ signs.T) + h, lists


def _list_distances(index, P):
    """``(m, n_lists)`` distances by which the index files and probes projection rows ``P``:
    squared Euclidean to the float centroids (k-means lists), Hamming from the signs of
    ``P`` to the binary centroids (k-majority lists)."""
    if index.quantizer == "k-means":
        C = index.centroid_vectors.astype(np.float64)
        return ((P.astype(np.float64)[:, None, :] - C[None]) ** 2).sum(-1)
    bits = np.unpackbits(index.centroids, axis=1, bitorder="little")[:, : index.n_bits]
    return ((P[:, None, :] >= 0) != bits[None].astype(bool)).sum(-1)


def _quantized(Q):
    """Each row rounded to 16 levels between its minimum and maximum (the kernel's query
    quantization, RaBitQ's ``B_q = 4``), in float64."""
    lo, hi = Q.min(1, keepdims=True), Q.max(1, keepdims=True)
    step = np.where(hi > lo, (hi - lo) / 15, 1.0)
    return lo + step * np.clip(np.floor((Q - lo) / step + 0.5), 0, 15)


def test_query_planes_hold_the_quantized_levels():
    from hashlearn.index._ivf_kernels import QUERY_PLANES, query_planes

    rng = np.random.default_rng(11)
    for n_bits in (7, 64, 100, 256):
        p = rng.standard_normal(n_bits).astype(np.float32)
        n_words = -(-n_bits // 64)
        planes = np.empty(QUERY_PLANES * n_words, np.uint64)
        lo, step, total = query_planes(p, n_bits, planes)
        bits = np.unpackbits(planes.view(np.uint8), bitorder="little").reshape(QUERY_PLANES, -1)
        levels = (bits[:, :n_bits].astype(np.int64) << np.arange(QUERY_PLANES)[:, None]).sum(0)
        assert not bits[:, n_bits:].any()
        want = _quantized(p[None].astype(np.float64))[0]
        np.testing.assert_allclose(lo + step * levels, want, rtol=0, atol=1e-12)
        assert abs(total - want.sum()) < 1e-9
        assert lo == p.min() and levels.min() == 0 and levels.max() == 15
    const = np.full(5, 0.5, np.float32)
    lo, step, total = query_planes(const, 5, np.empty(QUERY_PLANES, np.uint64))
    assert (lo, step, total) == (0.5, 1.0, 2.5)


def _top(scores, ids, k):
    order = np.lexsort((np.broadcast_to(ids, scores.shape), -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, 1), ids[order]


def _assert_same_ranking(S, I, want_s, want_i):
    """Equal ids wherever the oracle's neighbouring scores are apart by more than ``tol``
    (float32 factors and sums against float64 ones: a few float32 roundings of the largest
    score), scores within ``tol``."""
    finite = np.isfinite(want_s)
    tol = 4e-6 * max(1.0, float(np.abs(want_s[finite]).max(initial=0.0)))
    np.testing.assert_allclose(S, want_s, atol=tol, rtol=0)
    gaps = np.diff(want_s, axis=1)
    clear = np.ones_like(want_i, bool)
    clear[:, 1:] &= np.abs(gaps) > tol
    clear[:, :-1] &= np.abs(gaps) > tol
    assert np.array_equal(I[clear], want_i[clear])


QUANTIZERS = ["k-means", "k-majority"]


@pytest.mark.parametrize("quantizer", QUANTIZERS)
@pytest.mark.parametrize("n_bits", [24, 64, 100, 256])
def test_every_list_probed_is_the_exact_estimator_ranking(n_bits, quantizer):
    rng = np.random.default_rng(n_bits)
    P = (rng.standard_normal((1500, n_bits)) + 0.5).astype(np.float32)
    Q = rng.standard_normal((40, n_bits)).astype(np.float32)
    index = ResidualIVFIndex(n_bits, n_lists=12, quantizer=quantizer)
    ids = np.arange(1500) * 3 + 1  # sparse ids, not the rows' order
    index.add(_codes(P[:900]), ids[:900], projections=P[:900])
    index.add(_codes(P[900:]), ids[900:], projections=P[900:])
    S, I = index.search_asymmetric(Q, 15, n_probe=12)
    est, _ = _estimates(index, P, Q)
    _assert_same_ranking(S, I, *_top(est, ids, 15))


@pytest.mark.parametrize("quantizer", QUANTIZERS)
def test_the_probed_lists_are_the_nearest_centroids(quantizer):
    rng = np.random.default_rng(1)
    P = rng.standard_normal((2000, 32)).astype(np.float32)
    Q = rng.standard_normal((30, 32)).astype(np.float32)
    index = ResidualIVFIndex(32, n_lists=20, quantizer=quantizer)
    index.add(_codes(P), projections=P)
    S, I = index.search_asymmetric(Q, 10, n_probe=3)
    est, lists = _estimates(index, P, Q)
    d = _list_distances(index, Q)
    near = np.argsort(d, axis=1, kind="stable")[:, :3]
    masked = np.empty_like(est)
    for q in range(len(Q)):
        masked[q] = np.where(np.isin(lists, near[q]), est[q], -np.inf)
    _assert_same_ranking(S, I, *_top(masked, np.arange(2000), 10))


@pytest.mark.parametrize("quantizer", QUANTIZERS)
def test_default_probing_follows_the_budget(quantizer):
    rng = np.random.default_rng(2)
    P = rng.standard_normal((4000, 32)).astype(np.float32)
    index = ResidualIVFIndex(32, n_lists=40, quantizer=quantizer)
    index.add(_codes(P), projections=P)
    sizes = index.list_sizes
    Q = P[:5]
    for k in (10, 40):
        need = max(
            residual_module.PROBE_FACTOR * k, -(-residual_module.MIN_PROBE_LISTS * 4000 // 40)
        )
        d = _list_distances(index, Q)
        est, lists = _estimates(index, P, Q)
        for q in range(len(Q)):
            order = np.argsort(d[q], kind="stable")
            n_probe = int(np.searchsorted(np.cumsum(sizes[order]), need) + 1)
            probed = order[: min(n_probe, 40)]
            want = np.where(np.isin(lists, probed), est[q], -np.inf)[None]
            S, I = index.search_asymmetric(Q[q : q + 1], k)
            _assert_same_ranking(S, I, *_top(want, np.arange(4000), k))


@pytest.mark.parametrize("quantizer", QUANTIZERS)
def test_ties_go_to_the_smaller_id_and_short_results_pad(quantizer):
    P = np.repeat(np.random.default_rng(3).standard_normal((5, 16)).astype(np.float32), 4, 0)
    index = ResidualIVFIndex(16, n_lists=2, quantizer=quantizer)
    ids = np.array([9, 3, 7, 1] * 5) + np.repeat(np.arange(5) * 10, 4)
    index.add(_codes(P), ids, projections=P)
    S, I = index.search_asymmetric(P[:1], 30, n_probe=2)
    assert np.array_equal(I[0, :4], np.sort(ids[:4]))
    assert np.all(I[0, 20:] == -1) and np.all(S[0, 20:] == -np.inf)


@pytest.mark.parametrize("quantizer", QUANTIZERS)
def test_writes_and_state(quantizer):
    rng = np.random.default_rng(4)
    P = rng.standard_normal((600, 40)).astype(np.float32)
    whole = ResidualIVFIndex(40, n_lists=6, quantizer=quantizer)
    whole.add(_codes(P), projections=P)
    parts = ResidualIVFIndex(40, n_lists=6, quantizer=quantizer)
    parts.train(_codes(P), projections=P)
    for s in range(0, 600, 170):
        parts.add(_codes(P[s : s + 170]), projections=P[s : s + 170])
    Q = P[::50]
    for a, b in zip(
        whole.search_asymmetric(Q, 8, n_probe=6),
        parts.search_asymmetric(Q, 8, n_probe=6),
        strict=True,
    ):
        assert np.array_equal(a, b)
    assert parts.remove([0, 50, 599]) == 3
    S, I = parts.search_asymmetric(Q, 8, n_probe=6)
    assert not np.isin([0, 50, 599], I).any() and len(parts) == 597
    assert parts.codes.shape == (597, 5) and parts.is_trained
    with pytest.raises(ValueError, match="does not keep"):
        parts.train(_codes(P), projections=P)
    with pytest.raises(ValueError, match="already in the index"):
        parts.add(_codes(P[:2]), [1, 2], projections=P[:2])


def test_codes_alone_stand_in_for_projections():
    rng = np.random.default_rng(5)
    P = rng.standard_normal((800, 32)).astype(np.float32)
    index = ResidualIVFIndex(32, n_lists=8)
    index.add(_codes(P))  # the bits at the training scale
    S, I = index.search_asymmetric(P[:10], 1, n_probe=8)
    assert len(index) == 800 and np.isfinite(S).all()


def test_hamming_search_is_refused_and_arguments_checked():
    P = np.random.default_rng(6).standard_normal((100, 16)).astype(np.float32)
    index = ResidualIVFIndex(16, n_lists=4)
    index.add(_codes(P), projections=P)
    with pytest.raises(TypeError, match="search_asymmetric"):
        index.search(_codes(P[:2]), 3)
    with pytest.raises(TypeError, match="range search"):
        index.range_search(_codes(P[:2]), 3)
    with pytest.raises(ValueError, match="columns"):
        index.search_asymmetric(P[:2, :8], 3)
    with pytest.raises(ValueError, match="finite"):
        index.search_asymmetric(np.full((1, 16), np.nan, np.float32), 3)
    with pytest.raises(ValueError, match="query codes"):
        index.search_asymmetric(P[:2], 3, queries=_codes(P[:3]))
    with pytest.raises(ValueError, match="rows of projections"):
        index.add(_codes(P[:3]), projections=P[:2])
    with pytest.raises(ValueError, match="float32 factors"):
        ResidualIVFIndex(16, n_lists=1).add(_codes(P[:4]), projections=P[:4] * 1e20)
    empty = ResidualIVFIndex(16)
    S, I = empty.search_asymmetric(P[:2], 3)
    assert np.all(I == -1) and np.all(S == -np.inf)


@pytest.mark.parametrize("quantizer", QUANTIZERS)
@pytest.mark.parametrize("mmap", [False, True])
def test_save_load_round_trip(tmp_path, mmap, quantizer):
    rng = np.random.default_rng(7)
    P = rng.standard_normal((500, 64)).astype(np.float32)
    index = ResidualIVFIndex(64, n_lists=5, quantizer=quantizer)
    index.add(_codes(P), projections=P)
    index.remove([4])
    index.save(tmp_path / "r")
    loaded = hashlearn.load(tmp_path / "r", mmap=mmap)
    assert type(loaded) is ResidualIVFIndex and loaded.quantizer == quantizer
    for a, b in zip(
        index.search_asymmetric(P[:20], 5), loaded.search_asymmetric(P[:20], 5), strict=True
    ):
        assert np.array_equal(a, b)
    loaded.add(_codes(P[:3]), [1000, 1001, 1002], projections=P[:3])  # writes after a load
    assert len(loaded) == 502
    ResidualIVFIndex(64).save(tmp_path / "empty")
    assert len(hashlearn.load(tmp_path / "empty")) == 0


@pytest.mark.parametrize("damage", ["nan", "shape", "missing"])
def test_damaged_factors_are_refused(tmp_path, damage):
    from hashlearn import io

    P = np.random.default_rng(8).standard_normal((50, 16)).astype(np.float32)
    index = ResidualIVFIndex(16, n_lists=2)
    index.add(_codes(P), projections=P)
    params, state, arrays = index._get_state()
    arrays = dict(arrays)
    if damage == "nan":
        arrays["factors"] = arrays["factors"].copy()
        arrays["factors"][3, 1] = np.nan
    elif damage == "shape":
        arrays["factors"] = arrays["factors"][:-1]
    else:
        del arrays["factors"]
    with pytest.raises(ValueError):
        ResidualIVFIndex._from_state(params, state, arrays)
    with pytest.raises(ValueError, match="quantizer"):
        ResidualIVFIndex._from_state(dict(params, quantizer="pq"), state, arrays)
    assert io  # the save format is hashlearn.io's (round trip above)


def test_searcher_ranks_by_the_estimator_only(digits):
    X, _ = digits
    with pytest.raises(ValueError, match="ranking='asymmetric'"):
        Searcher(ITQ(16, random_state=0), ResidualIVFIndex(16), rerank="euclidean")
    s = Searcher(ITQ(16, random_state=0), ResidualIVFIndex(16, n_lists=10), rerank="euclidean",
                 ranking="asymmetric")  # fmt: skip
    D, I = s.fit(X).add(X).search(X[:5], 3, n_candidates=50)
    assert I[:, 0].tolist() == [0, 1, 2, 3, 4]


def test_fewer_candidates_than_hamming_ranking_for_the_same_recall(digits):
    """The design's claim on real data: in the same k-means lists (same probes), the
    estimator's shortlist holds more true neighbours than the Hamming shortlist of the plain
    codes, with a margin."""
    X, _ = digits
    X = X.astype(np.float64)
    X = (X - X.mean(0)) / np.linalg.norm(X - X.mean(0), axis=1, keepdims=True).clip(1e-9)
    X = X.astype(np.float32)
    db, Qx = X[200:], X[:200]
    hasher = ITQ(32, random_state=0).fit(db)
    P, PQ = hasher.project(db), hasher.project(Qx)
    truth = np.argsort(-(Qx @ db.T), axis=1, kind="stable")[:, :10]
    res = ResidualIVFIndex(32, n_lists=40)
    res.add(hasher.encode(db), projections=P)
    ham = IVFIndex(32, n_lists=40, quantizer="k-means")
    ham.train(hasher.encode(db), projections=P)  # the same k-means sample and seed
    ham.add(hasher.encode(db), projections=P)
    assert np.array_equal(ham.centroid_vectors, res.centroid_vectors)
    for n_cand in (20, 40):
        _, I_res = res.search_asymmetric(PQ, n_cand, n_probe=8)
        _, I_ham = ham.search(hasher.encode(Qx), n_cand, n_probe=8, projections=PQ)
        found = [np.mean([np.isin(t, i).mean() for t, i in zip(truth, I, strict=True)])
                 for I in (I_res, I_ham)]  # fmt: skip
        assert found[0] >= found[1] + 0.05, (n_cand, found)


@pytest.mark.parametrize("coarse_quantizer", ["residual", "residual-k-majority"])
def test_embedding_index_residual_coarse_stage(tmp_path, coarse_quantizer):
    rng = np.random.default_rng(9)
    centers = rng.standard_normal((30, 48))
    X = centers[rng.integers(0, 30, 3000)] + 0.3 * rng.standard_normal((3000, 48))
    X = X.astype(np.float32)
    index = EmbeddingIndex("itq", n_bits=32, coarse=30, coarse_quantizer=coarse_quantizer)
    index.fit(X[:1000]).add(X)
    assert type(index.codes_) is ResidualIVFIndex and index.searcher_.ranking == "asymmetric"
    lists = "k-means" if coarse_quantizer == "residual" else "k-majority"
    assert index.codes_.quantizer == lists
    scores, ids = index.search(X[:20], 5, overfetch=8)
    assert ids[:, 0].tolist() == list(range(20))
    mem = index.memory_per_vector()
    assert mem["scan"] == 8 * 1 + 8 + 8 and mem["coarse"] > 0
    index.save(tmp_path / "e")
    loaded = EmbeddingIndex.load(tmp_path / "e")
    assert type(loaded.codes_) is ResidualIVFIndex
    for a, b in zip(loaded.search(X[:20], 5, overfetch=8), (scores, ids), strict=True):
        assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="coarse stage"):
        EmbeddingIndex.open(tmp_path / "e")
    meta = tmp_path / "e" / "meta.json"  # a meta.json naming the other residual lists
    other = "residual" if coarse_quantizer != "residual" else "residual-k-majority"
    text = meta.read_text().replace(f'"{coarse_quantizer}"', f'"{other}"')
    meta.write_text(text)
    with pytest.raises(ValueError, match="lists"):
        EmbeddingIndex.load(tmp_path / "e", verify=False)


def test_cli_builds_and_describes_a_residual_coarse_stage(tmp_path):
    from click.testing import CliRunner

    from hashlearn.cli import main

    rng = np.random.default_rng(10)
    X = rng.standard_normal((900, 16)).astype(np.float32)
    np.save(tmp_path / "emb.npy", X)
    np.save(tmp_path / "q.npy", X[:7])

    def run(*args):
        return CliRunner().invoke(main, ["index", *map(str, args)])

    out = tmp_path / "idx"
    r = run("build", tmp_path / "emb.npy", "--bits", 16, "--out", out, "--coarse", 10,
            "--coarse-quantizer", "residual", "--fit-size", 900)  # fmt: skip
    assert r.exit_code == 0, r.output
    loaded = EmbeddingIndex.load(out)
    assert type(loaded.codes_) is ResidualIVFIndex and len(loaded.codes_.list_sizes) == 10
    direct = EmbeddingIndex("itq", n_bits=16, coarse=10, coarse_quantizer="residual")
    direct.fit(X).add(X)
    r = run("search", out, tmp_path / "q.npy", "-k", 5, "--out", tmp_path / "res.npy")
    assert r.exit_code == 0, r.output
    assert np.array_equal(np.load(tmp_path / "res.npy"), direct.search(X[:7], 5)[1])
    r = run("info", out)
    assert r.exit_code == 0 and "residual lists" in r.output, r.output
    r = run("build", tmp_path / "emb.npy", "--out", tmp_path / "b", "--coarse-quantizer", "pq")
    assert r.exit_code == 2 and "--coarse-quantizer" in r.stderr, r.output


# ------------------------------------------------------------------- calibrated probe


def _reach_oracle(index, P_rows, ids, Q, neighbors):
    """Sorted fractions of the stored rows a probe scans to reach each listed neighbour:
    the codes of the lists nearer the query (stable order) plus one, over ``len(index)``."""
    lists = np.argmin(_list_distances(index, P_rows), axis=1)
    sizes = np.bincount(lists, minlength=len(index.list_sizes))
    d = _list_distances(index, Q)
    out = []
    for q in range(len(Q)):
        order = list(np.argsort(d[q], kind="stable"))
        for j in neighbors[q]:
            if j < 0:
                continue
            own = lists[np.flatnonzero(ids == j)[0]]
            out.append((sizes[order[: order.index(own)]].sum() + 1) / len(index))
    return np.sort(out)


@pytest.mark.parametrize("quantizer", QUANTIZERS)
def test_calibrate_counts_the_codes_ahead_of_each_neighbour(quantizer):
    rng = np.random.default_rng(11)
    P = rng.standard_normal((3000, 32)).astype(np.float32)
    ids = np.arange(3000) * 2 + 5
    index = ResidualIVFIndex(32, n_lists=30, quantizer=quantizer)
    index.add(_codes(P), ids, projections=P)
    Q = P[:40] + 0.1 * rng.standard_normal((40, 32)).astype(np.float32)
    truth = np.argsort(((Q[:, None, :] - P[None]) ** 2).sum(-1), axis=1, kind="stable")[:, :6]
    neighbors = ids[truth]
    neighbors[3, 4:] = -1  # padding is skipped
    assert index.calibrate(Q, neighbors) is index
    want = _reach_oracle(index, P, ids, Q, neighbors)
    assert len(index._probe_need) == 40 * 6 - 2
    np.testing.assert_allclose(index._probe_need, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("quantizer", QUANTIZERS)
def test_calibrated_probing_scans_the_lists_the_budget_names(quantizer):
    """After calibrate, ``n_probe=None`` scans the nearest lists until they hold ``max(k,
    f n)`` codes, ``f`` the fraction leaving ``PROBE_MISS / k`` of the sample unreached."""
    rng = np.random.default_rng(12)
    centers = 4 * rng.standard_normal((40, 32))
    P = (centers[rng.integers(0, 40, 4000)] + rng.standard_normal((4000, 32))).astype(np.float32)
    index = ResidualIVFIndex(32, n_lists=40, quantizer=quantizer)
    index.add(_codes(P), projections=P)
    sample = P[::40]
    truth = np.argsort(((sample[:, None, :] - P[None]) ** 2).sum(-1), axis=1, kind="stable")
    index.calibrate(sample, truth[:, 1:11])  # each row left out of its own neighbours
    need = index._probe_need
    sizes = index.list_sizes
    Q = P[1:6]
    d = _list_distances(index, Q)
    est, lists = _estimates(index, P, Q)
    for k in (10, 40):
        allowed = int(residual_module.PROBE_MISS * len(need) / k)
        budget = max(k, int(np.ceil(need[len(need) - 1 - allowed] * 4000)))
        assert np.mean(need * 4000 > budget) <= residual_module.PROBE_MISS / k
        fixed = max(residual_module.PROBE_FACTOR * k, residual_module.MIN_PROBE_LISTS * 100)
        assert budget < fixed  # clustered rows: their neighbours share a list
        for q in range(len(Q)):
            order = np.argsort(d[q], kind="stable")
            n_probe = int(np.searchsorted(np.cumsum(sizes[order]), budget) + 1)
            want = np.where(np.isin(lists, order[:n_probe]), est[q], -np.inf)[None]
            S, I = index.search_asymmetric(Q[q : q + 1], k)
            _assert_same_ranking(S, I, *_top(want, np.arange(4000), k))


def test_calibration_is_saved_checked_and_cleared_by_training(tmp_path):
    rng = np.random.default_rng(13)
    P = rng.standard_normal((800, 16)).astype(np.float32)
    index = ResidualIVFIndex(16, n_lists=8)
    index.add(_codes(P), projections=P)
    index.calibrate(P[:20], np.arange(20)[:, None] + 1)
    index.save(tmp_path / "c")
    loaded = hashlearn.load(tmp_path / "c")
    assert np.array_equal(loaded._probe_need, index._probe_need)
    for a, b in zip(index.search_asymmetric(P[:9], 7), loaded.search_asymmetric(P[:9], 7),
                    strict=True):  # fmt: skip
        assert np.array_equal(a, b)
    params, state, arrays = index._get_state()
    for bad in (np.array([0.5, 0.2]), np.array([0.1, np.nan]), np.array([0.0, 0.5]),
                np.array([0.5, 1.5]), np.array([1, 2], np.int64)):  # fmt: skip
        with pytest.raises(ValueError, match="probe_need"):
            ResidualIVFIndex._from_state(params, state, dict(arrays, probe_need=bad))
    older = {k: v for k, v in arrays.items() if k != "probe_need"}  # a save from before
    assert ResidualIVFIndex._from_state(params, state, older)._probe_need is None
    with pytest.raises(ValueError, match="not in the index"):
        index.calibrate(P[:2], np.array([[1], [5000]]))
    with pytest.raises(ValueError, match="one row per"):
        index.calibrate(P[:2], np.array([1, 2]))
    with pytest.raises(ValueError, match="no rows"):
        ResidualIVFIndex(16, n_lists=2).calibrate(P[:2], np.array([[1], [2]]))
    empty = ResidualIVFIndex(16, n_lists=8)
    empty.train(_codes(P), projections=P)
    empty.add(_codes(P), projections=P)
    empty.calibrate(P[:3], np.array([[1], [2], [3]]))
    empty.remove(np.arange(800))
    empty.train(_codes(P), projections=P)  # other lists: the calibration goes
    assert empty._probe_need is None


def test_embedding_index_calibrates_on_exact_neighbours_after_the_first_add(monkeypatch):
    from hashlearn import embeddings as emb

    rng = np.random.default_rng(14)
    centers = rng.standard_normal((25, 40))
    X = centers[rng.integers(0, 25, 2500)] + 0.4 * rng.standard_normal((2500, 40))
    X = X.astype(np.float32)
    seen = []
    real = ResidualIVFIndex.calibrate
    monkeypatch.setattr(ResidualIVFIndex, "calibrate",
                        lambda self, P, nb: seen.append((P, nb)) or real(self, P, nb))  # fmt: skip
    monkeypatch.setattr(emb, "CALIBRATION_QUERIES", 60)
    for metric in ("cosine", "euclidean"):
        seen.clear()
        index = EmbeddingIndex("itq", n_bits=32, coarse=25, metric=metric)
        index.fit(X[:800]).add(X[:2000])
        assert len(seen) == 1 and index.codes_._probe_need is not None
        P, nb = seen[0]
        V = index.vectors.astype(np.float64)
        proj = index.hasher_.project(index.vectors).astype(np.float64)
        rows = [int(np.argmin(((proj - p) ** 2).sum(1))) for p in P]  # the sampled rows
        assert len(set(rows)) == 60
        for r, got in zip(rows, nb, strict=True):
            if metric == "cosine":
                key = 1.0 - V @ V[r]
            else:
                key = ((V - V[r]) ** 2).sum(1)
            key[r] = np.inf  # itself left out
            want = np.sort(key)[:10]
            # the true 10 nearest, up to float32 near-ties at the 10th
            np.testing.assert_allclose(np.sort(key[got]), want, rtol=1e-4, atol=1e-5)
        index.add(X[2000:])  # later adds keep the first calibration ...
        assert len(seen) == 1 and index.codes_.probe_rows == 2000
    parts = EmbeddingIndex("itq", n_bits=32, coarse=25).fit(X[:800])
    parts.train_coarse(X)
    seen.clear()
    for start in (0, 300, 600):  # ... until the rows have doubled: 300, then 600
        parts.add(X[start : start + 300])
    assert [len(nb) for _, nb in seen] == [60, 60] and parts.codes_.probe_rows == 600
    parts.calibrate_probe()  # sized on all 900 rows, as one add of them would be
    assert len(seen) == 3 and parts.codes_.probe_rows == 900
    parts.calibrate_probe()  # the same rows: nothing to do
    assert len(seen) == 3
    whole = EmbeddingIndex("itq", n_bits=32, coarse=25).fit(X[:800])
    whole.train_coarse(X)
    whole.add(X[:900])
    assert np.array_equal(whole.codes_._probe_need, parts.codes_._probe_need)


@njit
def _select(row, g):
    n = row.shape[0]
    heap_d, order = np.empty(n, np.float32), np.empty(2 * n, np.int64)
    return order[: ivf_kernels._nearest_lists(row, n, g, heap_d, order)].copy()


@pytest.mark.parametrize("layout", ["normal", "ties", "descending", "infinite"])
def test_the_list_select_is_a_stable_sort_prefix(layout):
    # the sampled threshold of _nearest_lists against numpy's stable argsort, with lists
    # few (no stride) and many (strided samples, the retries), ties and infinite distances
    rng = np.random.default_rng(["normal", "ties", "descending", "infinite"].index(layout))
    for n in (1, 7, 255, 300, 1000, 4096, 5003):
        row = rng.standard_normal(n).astype(np.float32)
        if layout == "ties":
            row = rng.integers(0, 4, n).astype(np.float32)
        elif layout == "descending":
            row = np.sort(row)[::-1].copy()
        elif layout == "infinite":
            row[rng.random(n) < 0.4] = np.inf
        want = np.argsort(row, kind="stable")
        for g in sorted({0, 1, 2, 5, 24, 64, n // 3, n - 1, n, n + 5}):
            assert np.array_equal(_select(row, g), want[: max(min(g, n), 0)]), (n, g)


def test_the_buffer_cut_keeps_the_best_pairs():
    # _keep_best (the residual scan's buffer cut) against a sort by (score desc, id asc)
    rng = np.random.default_rng(5)
    for n, k in ((2, 1), (10, 3), (200, 100), (500, 7), (64, 63)):
        for scores in (rng.standard_normal(n), rng.integers(0, 3, n)):
            s = scores.astype(np.float32)
            p = rng.permutation(10 * n)[:n].astype(np.int64)
            buf_s, buf_p = s.copy(), p.copy()
            low = asymmetric_kernels._keep_best(buf_s, buf_p, n, k)
            best = np.lexsort((p, -s))[:k]
            assert set(buf_p[:k].tolist()) == set(p[best].tolist())
            assert low == s[best].min()

"""MultiIndexHashing against FlatIndex and brute force: exact k-NN, range search, persistence."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import brute_knn, brute_range, code_problems, random_bits
from hashlearn.index import mih as mih_module
from hashlearn.index.base import make_index
from hashlearn.index.flat import FlatIndex
from hashlearn.index.mih import MultiIndexHashing

SETTINGS = settings(max_examples=80, deadline=None)


def both(problem, n_substrings="auto"):
    flat, mih = FlatIndex(problem.n_bits), MultiIndexHashing(problem.n_bits, n_substrings)
    flat.add(problem.db, ids=problem.ids)
    mih.add(problem.db, ids=problem.ids)
    return flat, mih


@SETTINGS
@given(
    problem=code_problems(max_n=400), k=st.integers(1, 40), m=st.integers(1, 12), auto=st.booleans()
)
def test_knn_identical_to_brute_force_and_flat(problem, k, m, auto):
    n_sub = "auto" if auto else min(m, problem.n_bits)
    if n_sub != "auto" and n_sub * 63 < problem.n_bits:
        n_sub = "auto"
    flat, mih = both(problem, n_sub)
    eD, eI = brute_knn(problem.q_bits, problem.db_bits, problem.ids, k)
    fD, fI = flat.search(problem.queries, k)
    np.testing.assert_array_equal(fD, eD)
    np.testing.assert_array_equal(fI, eI)
    with pytest.MonkeyPatch.context() as patch:
        # as the cost model routes; probing with a budget of 10^4 scans (long substrings
        # at a large radius would otherwise enumerate billions of keys)
        for scan_cost in (1, 10**4):
            patch.setattr(mih_module, "_SCAN_COST", scan_cost)
            D, I = mih.search(problem.queries, k)
            np.testing.assert_array_equal(D, eD)
            np.testing.assert_array_equal(I, eI)


@SETTINGS
@given(problem=code_problems(max_n=300), frac=st.floats(0, 0.6))
def test_range_search_identical_to_brute_force(problem, frac):
    radius = int(frac * problem.n_bits)
    _, mih = both(problem)
    lims, D, I = mih.range_search(problem.queries, radius)
    eL, eD, eI = brute_range(problem.q_bits, problem.db_bits, problem.ids, radius)
    np.testing.assert_array_equal(lims, eL)
    np.testing.assert_array_equal(D, eD)
    np.testing.assert_array_equal(I, eI)


def clustered_codes(rng, n, n_bits, n_centres=20, flip=0.05):
    """Codes near a few centres, like LSH codes of clustered data (crowded buckets)."""
    centres = random_bits(rng, n_centres, n_bits, "uniform")
    bits = centres[rng.integers(0, n_centres, n)] ^ (rng.random((n, n_bits)) < flip)
    return np.packbits(bits.astype(bool), axis=1, bitorder="little")


def uniform_codes(rng, n, n_bits):
    return np.packbits(
        random_bits(rng, n, n_bits, "uniform").astype(bool), axis=1, bitorder="little"
    )


@pytest.mark.parametrize("n_bits", [32, 64, 100, 128])
@pytest.mark.parametrize("mode", ["uniform", "clustered"])
def test_larger_databases_sub_linear_regime(n_bits, mode):
    """Thousands of codes, where the pruning (and dense tables) actually engage."""
    rng = np.random.default_rng(n_bits)
    n = 6000
    if mode == "uniform":
        db = uniform_codes(rng, n, n_bits)
    else:
        db = clustered_codes(rng, n, n_bits)
    queries = np.concatenate([db[:12] ^ 2, uniform_codes(rng, 12, n_bits)])
    ids = rng.permutation(n).astype(np.int64) * 3
    flat, mih = FlatIndex(n_bits), MultiIndexHashing(n_bits)
    flat.add(db, ids)
    mih.add(db, ids)
    for k in (1, 10, 100):
        for got, want in zip(mih.search(queries, k), flat.search(queries, k), strict=True):
            np.testing.assert_array_equal(got, want)
    for radius in (n_bits // 8, n_bits // 3):
        got = mih.range_search(queries, radius)
        for a, b in zip(got, flat.range_search(queries, radius), strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("k", [1, 10, 100])
def test_cost_model_scans_random_codes_and_probes_clustered_ones(k):
    """Uniform codes at this size cost more to probe than to scan (every query after the
    pilot goes to the scan); the close neighbours of clustered codes are cheaper to probe.
    Both routes give FlatIndex's results."""
    rng = np.random.default_rng(k)
    n = 20000
    for mode in ("uniform", "clustered"):
        if mode == "uniform":
            db = uniform_codes(rng, n, 64)
            queries = uniform_codes(rng, 40, 64)
        else:  # small clusters: a query's neighbourhood is a small part of the codes
            db = clustered_codes(rng, n, 64, n_centres=200, flip=0.02)
            queries = db[rng.integers(0, n, 40)]
            queries[:, 0] ^= 1
        flat, mih = FlatIndex(64), MultiIndexHashing(64)
        flat.add(db)
        mih.add(db)
        D, I, scanned = mih._search(mih.store.snapshot, queries, k, 1)
        if mode == "uniform":
            assert scanned[mih_module._PILOT_QUERIES :].all()
        elif k < 100:  # the 100th neighbour lies outside a 100-code cluster
            assert not scanned.any()
        fD, fI = flat.search(queries, k)
        np.testing.assert_array_equal(D, fD)
        np.testing.assert_array_equal(I, fI)


def test_probing_without_a_budget_is_exact(monkeypatch):
    """With the scan made infinitely expensive every query probes to its stopping bound."""
    monkeypatch.setattr(mih_module, "_SCAN_COST", 10**9)
    rng = np.random.default_rng(11)
    db = uniform_codes(rng, 5000, 64)
    queries = np.concatenate([uniform_codes(rng, 10, 64), db[:10] ^ 3])
    flat, mih = FlatIndex(64), MultiIndexHashing(64, 4)
    flat.add(db, ids=np.arange(5000) * 2)
    mih.add(db, ids=np.arange(5000) * 2)
    for k in (1, 10, 100):
        D, I, scanned = mih._search(mih.store.snapshot, queries, k, 1)
        assert not scanned.any()
        fD, fI = flat.search(queries, k)
        np.testing.assert_array_equal(D, fD)
        np.testing.assert_array_equal(I, fI)


def test_auto_substrings_follow_the_paper():
    mih = MultiIndexHashing(64)
    rng = np.random.default_rng(0)
    mih.add(rng.integers(0, 256, (1 << 16, 8), dtype=np.uint8))
    assert mih.n_substrings_ == 4  # round(64 / log2(65536))
    assert MultiIndexHashing(128, 3).n_substrings_ == 3
    with pytest.raises(ValueError, match="n_substrings"):
        MultiIndexHashing(128, 1)  # a 128-bit substring cannot be a table key
    with pytest.raises(ValueError, match="n_substrings"):
        MultiIndexHashing(32, 33)
    with pytest.raises(ValueError, match="n_substrings"):
        MultiIndexHashing(32, "many")
    assert isinstance(make_index("mih", n_bits=32), MultiIndexHashing)


def test_add_remove_keep_results_exact():
    rng = np.random.default_rng(3)
    db = rng.integers(0, 256, (3000, 4), dtype=np.uint8)
    q = rng.integers(0, 256, (30, 4), dtype=np.uint8)
    flat, mih = FlatIndex(32), MultiIndexHashing(32)
    for part in np.array_split(np.arange(3000), 3):
        flat.add(db[part], ids=part[::-1] * 2)  # non-monotonic ids force re-merging
        mih.add(db[part], ids=part[::-1] * 2)
        np.testing.assert_array_equal(mih.search(q, 7)[1], flat.search(q, 7)[1])
    drop = np.arange(0, 6000, 6)
    assert mih.remove(drop) == flat.remove(drop)
    for got, want in zip(mih.search(q, 7), flat.search(q, 7), strict=True):
        np.testing.assert_array_equal(got, want)
    assert len(mih) == len(flat) and np.array_equal(mih.ids, flat.ids)


def test_empty_and_padding():
    mih = MultiIndexHashing(24)
    q = np.zeros((2, 3), np.uint8)
    D, I = mih.search(q, 3)
    assert (D == -1).all() and (I == -1).all()
    mih.add(np.ones((2, 3), np.uint8))
    D, I = mih.search(q, 3)
    assert D.tolist() == [[3, 3, -1]] * 2 and I.tolist() == [[0, 1, -1]] * 2
    lims, D, I = mih.range_search(np.zeros((0, 3), np.uint8), 2)
    assert lims.tolist() == [0] and len(D) == len(I) == 0


def test_bad_queries_are_rejected():
    mih = MultiIndexHashing(16)
    mih.add(np.zeros((4, 2), np.uint8))
    with pytest.raises(TypeError, match="queries"):
        mih.search(np.zeros((1, 2), np.float32), 1)
    with pytest.raises(ValueError, match="queries"):
        mih.search(np.zeros((1, 3), np.uint8), 1)
    with pytest.raises(ValueError, match="'k'"):
        mih.search(np.zeros((1, 2), np.uint8), 0)
    with pytest.raises(ValueError, match="radius"):
        mih.range_search(np.zeros((1, 2), np.uint8), 17)


@pytest.mark.parametrize("mmap", [False, True])
def test_save_load_round_trip(tmp_path, mmap):
    rng = np.random.default_rng(5)
    db = rng.integers(0, 256, (5000, 8), dtype=np.uint8)
    q = rng.integers(0, 256, (25, 8), dtype=np.uint8)
    mih = MultiIndexHashing(64, 4)
    mih.add(db, ids=np.arange(5000) * 7)
    mih.save(tmp_path / "mih")
    loaded = MultiIndexHashing.load(tmp_path / "mih", mmap=mmap)
    assert loaded.n_substrings == 4 and loaded.n_substrings_ == 4
    for got, want in zip(loaded.search(q, 10), mih.search(q, 10), strict=True):
        np.testing.assert_array_equal(got, want)
    if mmap:
        assert isinstance(loaded.store.snapshot.cached("mih")["postings"], np.memmap)
    loaded.add(db[:3] ^ 1, ids=[1, 2, 3])  # a mapped index still accepts adds (in memory)
    assert len(loaded) == 5003


def test_threads_give_identical_results():
    rng = np.random.default_rng(9)
    mih = MultiIndexHashing(64)
    mih.add(rng.integers(0, 256, (20000, 8), dtype=np.uint8))
    q = rng.integers(0, 256, (600, 8), dtype=np.uint8)
    one = mih.search(q, 10, n_threads=1)
    two = mih.search(q, 10, n_threads=2)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a, b)


def test_ann_benchmarks_algorithm_exact_on_hamming_and_sweep(tmp_path):
    """The ann-benchmarks plug-in's algorithm: exact on Hamming data, sweep writes its plot."""
    pytest.importorskip("h5py")
    from hashlearn.datasets import load_ann_benchmarks
    from hashlearn.experiments import ann_bench

    path = ann_bench._write_demo_file(
        tmp_path / "h.hdf5", metric="hamming", n=2000, n_test=30, d=48
    )
    data = load_ann_benchmarks(path)
    algo = ann_bench.HashlearnANN("hamming", "mih")
    algo.fit(data.train)
    algo.set_query_arguments(1)
    algo.batch_query(data.test, 10)
    got = np.array(algo.get_batch_results())
    true_d = (data.test[:, None, :] != data.train[None, :, :]).sum(axis=2)
    got_d = np.take_along_axis(true_d, got, 1)
    np.testing.assert_array_equal(got_d, np.sort(true_d, axis=1)[:, :10])
    assert np.array_equal(algo.query(data.test[0], 10), got[0])
    md = ann_bench.run_file(path, tmp_path / "out", k=10)
    assert "| 1.000 |" in md and (tmp_path / "out" / "ann_h.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="metric"):
        ann_bench.HashlearnANN("jaccard")

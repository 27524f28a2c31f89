"""TableIndex (inverted index over L tables of keys) against a brute-force collision oracle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hashlearn.forest.kmeans_tree import KMeansTree
from hashlearn.forest.lsh_tables import LSHTables
from hashlearn.index.table import TableIndex
from hashlearn.search import Searcher


def oracle_candidates(db_keys, db_ids, query_keys, min_count=1):
    """Count collisions table by table with numpy; order by (count desc, id asc)."""
    out = []
    for qk in query_keys:
        counts = (db_keys == qk[None, :]).sum(axis=1)
        keep = counts >= min_count
        ids, cnt = db_ids[keep], counts[keep]
        order = np.lexsort((ids, -cnt))
        out.append((ids[order], cnt[order]))
    return out


def assert_same(got, want):
    assert len(got) == len(want)
    for (gi, gc), (wi, wc) in zip(got, want, strict=True):
        np.testing.assert_array_equal(gi, wi)
        np.testing.assert_array_equal(gc, wc)
        assert gi.dtype == np.int64


@given(
    n=st.integers(0, 120),
    n_tables=st.integers(1, 6),
    n_keys=st.integers(1, 9),
    min_count=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
)
@settings(max_examples=60, deadline=None)
def test_candidates_match_oracle(n, n_tables, n_keys, min_count, seed):
    rng = np.random.default_rng(seed)
    keys = rng.integers(-n_keys, n_keys, size=(n, n_tables))
    ids = rng.permutation(10 * n + 5)[:n]
    queries = rng.integers(-n_keys, n_keys, size=(7, n_tables))
    index = TableIndex(n_tables)
    index.add(keys, ids=ids)
    min_count = min(min_count, n_tables)
    assert_same(
        index.candidates(queries, min_count=min_count),
        oracle_candidates(keys, ids, queries, min_count),
    )
    lims, cids, counts = index.candidates_csr(queries, min_count=min_count, n_threads=2)
    assert lims[0] == 0 and lims[-1] == len(cids) == len(counts)


def test_batched_add_and_remove_match_oracle():
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 6, size=(400, 4))
    index = TableIndex(4)
    first = index.add(keys[:150])
    second = index.add(keys[150:])
    np.testing.assert_array_equal(np.concatenate([first, second]), np.arange(400))
    # out-of-order explicit ids merged into the middle
    extra_keys = rng.integers(0, 6, size=(5, 4))
    extra_ids = np.array([1000, 500, 700, 401, 999])
    index.add(extra_keys, ids=extra_ids)
    all_keys = np.concatenate([keys, extra_keys])
    all_ids = np.concatenate([np.arange(400), extra_ids])
    queries = rng.integers(0, 6, size=(20, 4))
    assert_same(index.candidates(queries), oracle_candidates(all_keys, all_ids, queries))
    drop = np.array([0, 3, 500, 399, 77])
    assert index.remove(drop) == 5
    keep = ~np.isin(all_ids, drop)
    assert len(index) == keep.sum()
    assert_same(
        index.candidates(queries, min_count=2),
        oracle_candidates(all_keys[keep], all_ids[keep], queries, 2),
    )
    # ids are never renumbered; a fresh add continues after the largest id ever added
    assert index.add(keys[:1])[0] == 1001
    with pytest.raises(ValueError, match="not in the index"):
        index.remove([123456])
    assert index.remove([123456], missing="ignore") == 0
    with pytest.raises(ValueError, match="already in the index"):
        index.add(keys[:1], ids=[1])


def test_empty_index_and_empty_queries():
    index = TableIndex(3)
    got = index.candidates(np.zeros((2, 3), np.int64))
    assert [len(i) for i, _ in got] == [0, 0]
    assert index.candidates(np.zeros((0, 3), np.int64)) == []
    index.add(np.zeros((0, 3), np.int64))
    assert len(index) == 0


def test_save_load_roundtrip_and_mmap(tmp_path):
    rng = np.random.default_rng(2)
    keys = rng.integers(0, 20, size=(300, 5))
    index = TableIndex(5)
    index.add(keys, ids=rng.permutation(1000)[:300])
    queries = rng.integers(0, 20, size=(10, 5))
    want = index.candidates(queries)
    index.save(tmp_path / "ix")
    for mmap in (False, True):
        loaded = TableIndex.load(tmp_path / "ix", mmap=mmap)
        assert len(loaded) == 300 and loaded.n_tables == 5
        assert_same(loaded.candidates(queries), want)
    loaded = TableIndex.load(tmp_path / "ix", mmap=True)
    loaded.add(rng.integers(0, 20, size=(4, 5)))  # a mapped index still accepts adds
    loaded.remove(loaded.ids[:3])
    assert len(loaded) == 301


def test_bad_keys():
    index = TableIndex(3)
    with pytest.raises(TypeError, match="integer dtype"):
        index.add(np.zeros((4, 3), np.float64))
    with pytest.raises(ValueError, match=r"shape \(n, 3\)"):
        index.add(np.zeros((4, 2), np.int64))
    with pytest.raises(ValueError, match="reshape"):
        index.add(np.zeros(3, np.int64))
    index.add(np.zeros((4, 3), np.int64))
    with pytest.raises(TypeError, match="query_keys"):
        index.candidates(np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="min_count"):
        index.candidates(np.zeros((1, 3), np.int64), min_count=4)
    with pytest.raises(ValueError, match="n_tables"):
        TableIndex(0)


def test_keys_of_another_bucketer_are_refused():
    X = np.random.default_rng(3).standard_normal((200, 8))
    a = LSHTables(4, 6, random_state=0).fit(X)
    b = LSHTables(4, 6, random_state=1).fit(X)
    assert a.key_tag_ != b.key_tag_
    index = TableIndex(4, bucketer=a)
    index.add(a.keys(X))
    with pytest.raises(ValueError, match="not made by the bucketer"):
        index.candidates(b.keys(X[:3]))
    with pytest.raises(ValueError, match="not made by the bucketer"):
        index.add(b.keys(X[:3]))
    with pytest.raises(ValueError, match="keys per item"):
        TableIndex(3, bucketer=a)
    with pytest.raises(ValueError, match="fitted"):
        TableIndex(4, bucketer=LSHTables(4, 6))


def test_searcher_two_stage_matches_exact_rerank_of_candidates():
    rng = np.random.default_rng(4)
    X = rng.standard_normal((500, 10))
    Q = rng.standard_normal((15, 10))
    tree = KMeansTree(n_trees=4, max_depth=4, random_state=0)
    searcher = Searcher(tree, TableIndex(4, bucketer=tree.fit(X)), rerank="euclidean")
    searcher.add(X)
    D, I = searcher.search(Q, k=5)
    index = searcher.index
    for q, (ids, _) in enumerate(index.candidates(tree.keys(Q))):
        dist = np.linalg.norm(X[ids] - Q[q], axis=1)
        order = np.lexsort((ids, dist))[:5]
        want = np.full(5, -1)
        want[: len(order)] = ids[order]
        np.testing.assert_array_equal(I[q], want)
        np.testing.assert_allclose(D[q][: len(order)], dist[order], rtol=1e-5)
    # candidates are a subset of the database, and most true nearest neighbours are found
    exact = np.argsort(((Q[:, None] - X[None]) ** 2).sum(-1), axis=1)[:, 0]
    assert (I[:, 0] == exact).mean() >= 0.6

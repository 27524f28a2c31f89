"""RowFile and ``mmap="direct"`` loads: rows read by explicit I/O equal the mapped rows, and a
searcher loaded that way returns exactly what a mapped one does."""

import os

import numpy as np
import pytest

import hashlearn
from hashlearn import RandomHyperplaneLSH, Searcher
from hashlearn.embeddings import EmbeddingIndex
from hashlearn.rerank.rowfile import RowFile


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [1, 3, 96, 130, 384])
def test_take_equals_the_mapped_rows(tmp_path, dtype, d):
    rng = np.random.default_rng(d)
    X = rng.standard_normal((700, d)).astype(dtype)
    np.save(tmp_path / "v.npy", X)
    mapped = np.load(tmp_path / "v.npy", mmap_mode="r")
    rows = RowFile.of(mapped)
    for pick in (
        np.arange(700),  # every row: one request
        np.array([0]),
        np.array([699]),  # the last block may run past the end of the file
        np.unique(rng.integers(0, 700, 50)),
        np.unique(rng.integers(0, 700, 400)),  # enough requests for the reader threads
    ):
        got = rows.take(pick)
        assert got.dtype == dtype and got.shape == (len(pick), d)
        np.testing.assert_array_equal(got, X[pick])
    assert rows.take(np.zeros(0, np.int64)).shape == (0, d)


def test_take_refuses_bad_rows_and_unmapped_arrays(tmp_path):
    np.save(tmp_path / "v.npy", np.zeros((5, 2), np.float32))
    rows = RowFile.of(np.load(tmp_path / "v.npy", mmap_mode="r"))
    for bad in ([5], [-1], [2, 1], [1, 1]):
        with pytest.raises(ValueError, match="ascending and distinct"):
            rows.take(np.array(bad))
    with pytest.raises(ValueError, match="memory-mapped"):
        RowFile.of(np.zeros((5, 2), np.float32))
    with pytest.raises(ValueError, match="holds"):
        RowFile(tmp_path / "v.npy", 128, (6, 2), np.float32)


def test_a_pickled_rowfile_reopens_by_path(tmp_path):
    import pickle

    X = np.arange(20, dtype=np.float32).reshape(10, 2)
    np.save(tmp_path / "v.npy", X)
    rows = pickle.loads(pickle.dumps(RowFile.of(np.load(tmp_path / "v.npy", mmap_mode="r"))))
    np.testing.assert_array_equal(rows.take(np.array([3, 9])), X[[3, 9]])


@pytest.mark.parametrize("rerank", ["euclidean", "inner_product", "cosine"])
def test_searcher_loaded_direct_equals_mapped(tmp_path, rerank):
    X, _ = hashlearn.load_digits()
    X = X.astype(np.float32)
    s = Searcher(RandomHyperplaneLSH(32, random_state=0), rerank=rerank).fit(X).add(X)
    s.save(tmp_path / "s")
    mapped = Searcher.load(tmp_path / "s")
    direct = Searcher.load(tmp_path / "s", mmap="direct")
    assert direct.refiner.store.state.cached("row_file") is not None
    for kw in ({}, {"n_candidates": 7}, {"k_factor": 30}):
        D0, I0 = mapped.search(X[:50], 10, **kw)
        D1, I1 = direct.search(X[:50], 10, **kw)
        np.testing.assert_array_equal(I1, I0)
        np.testing.assert_array_equal(D1, D0)
    # a write publishes rows in memory; searches stay exact
    direct.add(X[:5] + 1)
    mapped.add(X[:5] + 1)
    np.testing.assert_array_equal(direct.search(X[:20], 5)[1], mapped.search(X[:20], 5)[1])
    same = hashlearn.load(tmp_path / "s", mmap="direct")  # the saved state, without the adds
    np.testing.assert_array_equal(
        same.search(X[:9], 3, n_candidates=300)[1],
        I0[:9, :3],  # I0: 300 candidates too
    )


def test_embedding_index_loaded_direct_equals_mapped(tmp_path):
    X, _ = hashlearn.load_digits()
    idx = EmbeddingIndex("itq", n_bits=32, random_state=0).fit(X).add(X)
    idx.save(tmp_path / "e")
    D0, I0 = EmbeddingIndex.load(tmp_path / "e").search(X[:40], 10)
    D1, I1 = EmbeddingIndex.load(tmp_path / "e", mmap="direct").search(X[:40], 10)
    np.testing.assert_array_equal(I1, I0)
    np.testing.assert_array_equal(D1, D0)


def test_unknown_mmap_values_are_refused(tmp_path):
    X, _ = hashlearn.load_digits()
    Searcher(RandomHyperplaneLSH(8, random_state=0), rerank="euclidean").fit(X).add(X).save(
        tmp_path / "s"
    )
    for bad in ("yes", 1.5):
        with pytest.raises(ValueError, match="mmap must be"):
            hashlearn.load(tmp_path / "s", mmap=bad)
        with pytest.raises(ValueError, match="mmap must be"):
            Searcher.load(tmp_path / "s", mmap=bad)


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="O_DIRECT is Linux's")
def test_direct_reads_bypass_the_page_cache_where_the_filesystem_allows(tmp_path):
    np.save(tmp_path / "v.npy", np.zeros((4, 2), np.float32))
    rows = RowFile.of(np.load(tmp_path / "v.npy", mmap_mode="r"))
    assert rows.block in (1, 512, 4096)
    assert rows.direct == (rows.block > 1)

"""The refine stage on its own (hashlearn.rerank): Refiner and VectorStore against brute
force, as the sharded index uses them on its workers (add, remove, refine, persistence,
pickling)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from hashlearn.hashers import RandomHyperplaneLSH
from hashlearn.rerank import Refiner, VectorStore
from hashlearn.rerank.store import MissingVectorsError


def _data(sparse: bool):
    rng = np.random.default_rng(0)
    X = rng.integers(-3, 4, (300, 12)).astype(np.float64)  # integers: exact in any order
    X[rng.random(X.shape) < 0.5] = 0.0
    Q = rng.integers(-3, 4, (9, 12)).astype(np.float64)
    ids = rng.permutation(10_000)[:300]
    return (sp.csr_matrix(X) if sparse else X), X, Q, ids


def _brute(X, Q, ids, cand, k, metric):
    """Top k of each query's candidates by (distance, id), in the result convention."""
    D = np.full((len(Q), k), np.inf)
    I = np.full((len(Q), k), -1, np.int64)  # noqa: E741
    row = {int(i): r for r, i in enumerate(ids)}
    for q in range(len(Q)):
        c = cand[q][cand[q] >= 0]
        x = X[[row[int(i)] for i in c]]
        d = {
            "sqeuclidean": ((x - Q[q]) ** 2).sum(1),
            "inner_product": -(x @ Q[q]),
        }[metric]
        order = np.lexsort((c, d))[:k]
        D[q, : len(order)], I[q, : len(order)] = d[order], c[order]
    if metric == "inner_product":
        D = np.where(I >= 0, -D, -np.inf)
    return D, I


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("metric", ["sqeuclidean", "inner_product"])
@pytest.mark.parametrize("screen", [True, False])
def test_refine_equals_brute_force_after_adds_and_removes(sparse, metric, screen):
    V, X, Q, ids = _data(sparse)
    r = Refiner(metric, screen=screen)
    r.add(V[:200], ids[:200])
    r.add(V[200:], ids[200:])  # ids in no order: the merge path
    assert r.remove(np.concatenate([ids[:30], [-5, 10**9]])) == 30  # absent ids skipped
    keep = np.arange(30, 300)
    rng = np.random.default_rng(1)
    cand = np.stack([rng.choice(ids[keep], 60, replace=False) for _ in range(len(Q))])
    cand[:, ::7] = -1
    D, I = r.refine(Q, cand, 8)
    eD, eI = _brute(X[keep], Q, ids[keep], cand, 8, metric)
    np.testing.assert_array_equal(I, eI)
    np.testing.assert_array_equal(D, eD.astype(np.float32))
    assert len(r) == 270
    with pytest.raises(MissingVectorsError, match="without vectors"):
        r.refine(Q[:1], np.array([[int(ids[0])]]), 3)


def test_state_round_trip_and_pickling():
    """``arrays`` / ``restore`` (the save layout) and pickling (a refiner sent to a Dask
    worker) keep the vectors and the results."""
    V, X, Q, ids = _data(True)
    r = Refiner("euclidean")
    r.add(V, ids)
    cand = np.tile(ids[:50], (len(Q), 1))
    want = r.refine(Q, cand, 5)
    state, arrays = r.store.arrays()
    assert state == {"vectors": "csr", "n_features": 12}
    restored = Refiner("euclidean")
    restored.store.restore(state, arrays)
    for other in (restored, pickle.loads(pickle.dumps(r))):
        for a, b in zip(want, other.refine(Q, cand, 5), strict=True):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="strictly increasing"):
        VectorStore().restore(state, {**arrays, "vector_ids": arrays["vector_ids"][::-1]})


def test_bad_settings_name_the_argument():
    with pytest.raises(ValueError, match="Unknown rerank"):
        Refiner("manhattan")
    with pytest.raises(ValueError, match="learned metric"):
        Refiner("metric", hasher=None)
    with pytest.raises(TypeError, match="screen"):
        Refiner("euclidean", screen="yes")
    r = Refiner("euclidean")
    r.add(np.zeros((2, 3)), np.array([0, 1]))
    with pytest.raises(ValueError, match="4 features but the stored vectors have 3"):
        r.add(np.zeros((1, 4)), np.array([2]))
    with pytest.raises(ValueError, match="already in the index"):
        r.add(np.zeros((1, 3)), np.array([1]))
    with pytest.raises(ValueError, match="candidate_ids"):
        r.refine(np.zeros((2, 3)), np.zeros((3, 1), np.int64), 1)


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux /proc/self/smaps")
def test_a_loaded_store_maps_its_vectors_for_random_access(tmp_path):
    """Loaded vectors stay memory-mapped and the map is advised MADV_RANDOM (``rr`` in the
    mapping's VmFlags), so a cold-cache refine reads the pages of the rows it rescores, not
    the kernel's read-around (bench/rerank_store.py measures the bytes)."""
    from hashlearn.search import Searcher

    X = np.random.default_rng(0).standard_normal((500, 64)).astype(np.float32)
    s = Searcher(RandomHyperplaneLSH(16, random_state=0), rerank="euclidean").fit(X).add(X)
    s.save(tmp_path / "s")
    loaded = Searcher.load(tmp_path / "s", mmap=True)
    vectors = VectorStore.vectors_of(loaded.refiner.store.state)
    assert isinstance(vectors, np.memmap)
    name = next((tmp_path / "s").glob("vectors*.npy")).resolve()
    flags, current = [], None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            current = fields[5] if len(fields) > 5 else ""
        elif fields[0] == "VmFlags:" and current == str(name):
            flags.append(fields[1:])
    assert flags and all("rr" in f for f in flags), flags
    np.testing.assert_array_equal(loaded.search(X[:3], 2)[1], s.search(X[:3], 2)[1])


def test_reserve_keeps_the_rows_and_sizes_the_buffers_once():
    store = VectorStore()
    store.reserve(10, 3)
    assert len(store) == 0 and store._ids.capacity == 10
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    store.add(store.prepare(rows), np.arange(4))
    store.reserve(6, 3)  # fewer than it holds room for: nothing to do
    assert store._ids.capacity == 10
    store.add(store.prepare(rows + 1), np.arange(4, 8))
    assert store._ids.capacity == 10
    np.testing.assert_array_equal(VectorStore.vectors_of(store.state), np.vstack([rows, rows + 1]))
    store.reserve(20, 3)  # grows, the rows copied
    assert store._ids.capacity == 20
    np.testing.assert_array_equal(VectorStore.vectors_of(store.state), np.vstack([rows, rows + 1]))

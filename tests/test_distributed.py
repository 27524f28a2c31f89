"""ShardedIndex on a 2-worker LocalCluster against a single FlatIndex and brute force; encode;
bad input."""

from __future__ import annotations

import time

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")

from hashlearn.distributed import (  # noqa: E402
    ShardedIndex,
    _shard_len,
    connect,
    encode,
    merge_topk,
)
from hashlearn.hashers.lsh import RandomHyperplaneLSH  # noqa: E402
from hashlearn.index.flat import FlatIndex  # noqa: E402
from hashlearn.index.mih import MultiIndexHashing  # noqa: E402


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    )
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    centres = rng.integers(0, 256, (5, 8), dtype=np.uint8)
    db = centres[rng.integers(0, 5, 6000)] ^ (rng.random((6000, 8)) < 0.1).astype(np.uint8)
    q = np.concatenate([db[:10], rng.integers(0, 256, (30, 8), dtype=np.uint8)])
    return db, q


def reference(db, q, k, ids=None):
    flat = FlatIndex(64)
    flat.add(db, ids=ids)
    return flat.search(q, k)


@pytest.mark.parametrize("n_shards", [1, 2, 5])
@pytest.mark.parametrize("index", ["flat", "mih"])
def test_sharded_search_identical_to_single_index(client, problem, n_shards, index):
    db, q = problem
    ids = np.random.default_rng(n_shards).permutation(len(db)) * 5
    sharded = ShardedIndex.from_codes(
        client, db, n_bits=64, n_shards=n_shards, ids=ids, index=index
    )
    assert len(sharded) == len(db) and sharded.n_shards == n_shards
    for k in (1, 10, 100):  # many exact ties: the merge must break them by id
        for got, want in zip(sharded.search(q, k), reference(db, q, k, ids), strict=True):
            np.testing.assert_array_equal(got, want)
    D, I = sharded.search(q[:2], 7000)  # k > n pads with -1 exactly like FlatIndex
    for got, want in zip((D, I), reference(db, q[:2], 7000, ids), strict=True):
        np.testing.assert_array_equal(got, want)


def test_from_dask_array_and_encode(client):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(3000, 20)).astype(np.float32)
    hasher = RandomHyperplaneLSH(n_bits=32, random_state=0).fit(X)
    codes = encode(hasher, da.from_array(X, chunks=(700, 20)))
    assert codes.chunks[0] == (700, 700, 700, 700, 200)
    local = hasher.encode(X)
    np.testing.assert_array_equal(codes.compute(), local)
    sharded = ShardedIndex.from_dask_array(client, codes, n_bits=32)
    assert sharded.n_shards == 5
    q = hasher.encode(X[:50] + 0.1)
    for got, want in zip(sharded.search(q, 10), reference_32(local, q, 10), strict=True):
        np.testing.assert_array_equal(got, want)


def reference_32(db, q, k):
    flat = FlatIndex(32)
    flat.add(db)
    return flat.search(q, k)


def test_merge_topk_orders_by_distance_then_id():
    D = np.array([[1, 3, -1, 1, 2, -1]], np.int32)
    I = np.array([[9, 4, -1, 2, 8, -1]], np.int64)
    d, i = merge_topk(D, I, 5)
    assert d.tolist() == [[1, 1, 2, 3, -1]] and i.tolist() == [[2, 9, 8, 4, -1]]


def test_mixed_code_lengths_between_shards_are_refused(client):
    a, b = FlatIndex(32), MultiIndexHashing(64)
    a.add(np.zeros((3, 4), np.uint8))
    b.add(np.zeros((3, 8), np.uint8))
    with pytest.raises(ValueError, match="same code length"):
        ShardedIndex.from_shards(client, [a, b])


def test_add_and_remove_on_a_shard_given_as_a_future(client, problem):
    # a finished shard without a client-side source stayed pending and was updated again
    # (the second add refused its own ids as duplicates)
    db, q = problem
    first = FlatIndex(64)
    first.add(db[:100])
    sharded = ShardedIndex.from_shards(client, [client.scatter(first), FlatIndex(64)])
    assert sharded.add(db[100:300], ids=np.arange(100, 300)).tolist() == list(range(100, 300))
    assert sharded.remove(np.arange(50, 150)) == 100
    assert len(sharded) == 200
    keep = np.r_[0:50, 150:300]
    for got, want in zip(sharded.search(q, 10), reference(db[keep], q, 10, ids=keep), strict=True):
        np.testing.assert_array_equal(got, want)


def test_bad_input(client, problem):
    db, q = problem
    with pytest.raises(ValueError, match="codes"):
        ShardedIndex.from_codes(client, db, n_bits=32, n_shards=2)
    with pytest.raises(ValueError, match="n_shards"):
        ShardedIndex.from_codes(client, db, n_bits=64, n_shards=0)
    sharded = ShardedIndex.from_codes(client, db[:100], n_bits=64, n_shards=2)
    with pytest.raises(ValueError, match="queries"):
        sharded.search(q[:, :4], 3)
    with pytest.raises(ValueError, match="'k'"):
        sharded.search(q, 0)
    with pytest.raises(TypeError, match="dask"):
        encode(RandomHyperplaneLSH(n_bits=8), np.zeros((3, 2)))


def test_unreachable_scheduler_fails_fast_with_a_clear_error():
    start = time.monotonic()
    with pytest.raises(ConnectionError, match="127.0.0.1:9"):
        connect("tcp://127.0.0.1:9", timeout=2)
    assert time.monotonic() - start < 30  # a bounded failure, not a hang
    with pytest.raises(ValueError, match="timeout"):
        connect("tcp://127.0.0.1:9", timeout=0)


# ------------------------------------------- an index made empty, like the local ones


def _flat_like(adds, n_bits=64):
    """A FlatIndex given the same ``(codes, ids)`` adds (ids None: numbered by the index)."""
    flat = FlatIndex(n_bits)
    for codes, ids in adds:
        flat.add(codes, ids=ids)
    return flat


@pytest.mark.parametrize("n_shards", [1, 2, 3])
@pytest.mark.parametrize("index", ["flat", "mih"])
def test_empty_index_filled_by_add_equals_flat(client, problem, n_shards, index):
    db, q = problem
    sharded = ShardedIndex(client, n_bits=64, n_shards=n_shards, index=index)
    assert len(sharded) == 0 and sharded.n_shards == n_shards
    D, I = sharded.search(q[:3], 4)  # empty: all padding, as FlatIndex
    assert (D == -1).all() and (I == -1).all()
    adds = [(db[:4000], None), (db[4000:4001], None), (db[4001:5000], np.arange(9000, 9999))]
    got_ids = [sharded.add(codes, ids=ids) for codes, ids in adds]
    assert got_ids[0].tolist() == list(range(4000)) and got_ids[1].tolist() == [4000]
    assert got_ids[2].dtype == np.int64 and got_ids[2].tolist() == list(range(9000, 9999))
    assert sharded.add(db[5000:]).tolist() == list(range(9999, 9999 + 1000))  # past the max
    flat = _flat_like([*adds, (db[5000:], None)])
    assert len(sharded) == len(flat)
    for k in (1, 10, 100, 7000):  # many exact ties: the merge breaks them by id
        _equal(sharded.search(q, k), flat.search(q, k))
    sizes = client.gather([client.submit(_shard_len, f) for f in sharded.shards])
    assert max(sizes) - min(sizes) <= 1  # rows are spread evenly


def test_empty_shards_placed_when_no_worker_is_known_yet(client, problem, monkeypatch):
    """A cluster still starting reports no workers: the empty shards go wherever dask puts
    them (it refuses ``allow_other_workers`` without ``workers``), and the index works."""
    db, q = problem
    monkeypatch.setattr(client, "scheduler_info", lambda *a, **kw: {"workers": {}})
    sharded = ShardedIndex(client, n_bits=64, n_shards=3)
    sharded.add(db)
    monkeypatch.undo()
    _equal(sharded.search(q, 10), _flat_like([(db, None)]).search(q, 10))


def test_range_search_equals_brute_force(client, problem):
    db, q = problem
    sharded = ShardedIndex(client, n_bits=64, n_shards=3)
    ids = sharded.add(db)
    bits = np.unpackbits(q[:, None, :] ^ db[None, :, :], axis=-1).sum(axis=-1)
    for radius in (0, 3, 12, 64):
        lims, D, I = sharded.range_search(q, radius)
        assert lims.dtype == np.int64 and D.dtype == np.int32 and I.dtype == np.int64
        for i in range(len(q)):
            hit = np.flatnonzero(bits[i] <= radius)
            order = np.lexsort((ids[hit], bits[i, hit]))  # by (distance, id)
            assert D[lims[i] : lims[i + 1]].tolist() == bits[i, hit][order].tolist()
            assert I[lims[i] : lims[i + 1]].tolist() == ids[hit][order].tolist()
    _equal(sharded.range_search(q, 9), _flat_like([(db, None)]).range_search(q, 9))
    with pytest.raises(ValueError, match="radius"):
        sharded.range_search(q, 65)


def test_remove_and_len_on_an_empty_made_index(client, problem):
    db, q = problem
    sharded = ShardedIndex(client, n_bits=64, n_shards=2)
    sharded.add(db)
    drop = np.arange(0, len(db), 3)
    assert sharded.remove(drop) == len(drop)
    assert sharded.remove(np.array([], np.int64)) == 0
    assert sharded.remove([drop[0], 1], missing="ignore") == 1  # 1 was still there
    flat = _flat_like([(db, None)])
    flat.remove(np.concatenate([drop, [1]]))
    assert len(sharded) == len(flat)
    _equal(sharded.search(q, 20), flat.search(q, 20))
    assert sharded.add(db[:2]).tolist() == [len(db), len(db) + 1]  # removed ids not reused
    with pytest.raises(ValueError, match="not in the index"):
        sharded.remove([drop[1]])
    with pytest.raises(ValueError, match="already in the index"):
        sharded.add(db[:1], ids=[2])
    with pytest.raises(ValueError, match="duplicates"):
        sharded.add(db[:2], ids=[50000, 50000])


def test_add_a_dask_array_of_codes_computes_blocks_on_the_workers(client, problem):
    db, q = problem
    sharded = ShardedIndex(client, n_bits=64, n_shards=2)
    sharded.add(db[:100])
    ids = sharded.add(da.from_array(db[100:], chunks=(1000, 8)))
    assert ids.tolist() == list(range(100, len(db)))
    flat = _flat_like([(db, None)])
    _equal(sharded.search(q, 10), flat.search(q, 10))
    client.cancel(sharded.shards)  # rebuilt by recomputing the blocks from their graph
    _equal(sharded.search(q, 10), flat.search(q, 10))
    with pytest.raises(ValueError, match="uint8"):
        sharded.add(da.from_array(db[:10].astype(np.int16), chunks=(5, 8)))


def test_save_and_load_an_empty_made_index(client, problem, tmp_path):
    db, q = problem
    sharded = ShardedIndex(client, n_bits=64, n_shards=2, index="mih")
    sharded.add(db[:3000])
    sharded.add(db[3000:], ids=np.arange(3000, len(db)) * 2)
    sharded.save(tmp_path / "idx")
    want = sharded.search(q, 10)
    for loaded in (
        ShardedIndex.load(tmp_path / "idx", client=client),
        ShardedIndex.load(client, tmp_path / "idx", mmap=True),  # the older form
    ):
        assert loaded.index_name == "mih" and len(loaded) == len(db)
        _equal(loaded.search(q, 10), want)
        assert loaded.add(db[:1]).tolist() == [2 * (len(db) - 1) + 1]  # next id survives
    with pytest.raises(TypeError, match="load"):
        ShardedIndex.load()


def test_refining_needs_a_refiner_attached_first(client, problem):
    db, q = problem
    sharded = ShardedIndex(client, n_bits=64, n_shards=2)
    with pytest.raises(ValueError, match="attach_refiner"):
        sharded.add(db[:5], vectors=np.zeros((5, 3)))
    with pytest.raises(ValueError, match="attach_refiner"):
        sharded.refine_search(np.zeros((2, 3)), q[:2], 3, 10)
    sharded.add(db[:5])
    with pytest.raises(ValueError, match="empty index"):
        sharded.attach_refiner("euclidean", RandomHyperplaneLSH(n_bits=64), True)
    with pytest.raises(ValueError, match="codes"):
        sharded.add(None)
    with pytest.raises(ValueError, match="n_shards"):
        ShardedIndex(client, n_bits=64, n_shards=0)
    with pytest.raises(ValueError, match="Unknown index"):
        ShardedIndex(client, n_bits=64, index="nope")


# ------------------------------------------------------- recovery, add / remove, save / load


def _equal(got, want):
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", ["codes", "dask"])
def test_lost_shards_are_rebuilt_from_their_source(client, problem, kind):
    """Futures lost with a worker (here: cancelled, as ``client.restart()`` does) are rebuilt
    from the client's codes or the dask array's lineage, and the search is still exact."""
    db, q = problem
    if kind == "codes":
        sharded = ShardedIndex.from_codes(client, db, n_bits=64, n_shards=3, index="mih")
    else:
        sharded = ShardedIndex.from_dask_array(
            client, da.from_array(db, chunks=(2500, 8)), n_bits=64
        )
    want = reference(db, q, 10)
    _equal(sharded.search(q, 10), want)
    client.cancel(sharded.shards[:2])  # as a restart or a lost worker leaves them
    assert sharded.shards[0].status == "cancelled"
    _equal(sharded.search(q, 10), want)
    assert all(f.status == "finished" for f in sharded.shards)
    client.cancel(sharded.shards)
    assert len(sharded) == len(db)


def test_add_and_remove_route_to_shards_and_survive_a_rebuild(client, problem):
    db, q = problem
    sharded = ShardedIndex.from_codes(client, db[:4000], n_bits=64, n_shards=3)
    new_ids = np.arange(4000, 6000) * 3  # disjoint from 0..3999
    assert sharded.add(db[4000:], ids=new_ids).tolist() == new_ids.tolist()
    drop = np.arange(0, 4000, 7)
    assert sharded.remove(drop) == len(drop)
    keep = np.setdiff1d(np.arange(4000), drop)
    flat = FlatIndex(64)
    flat.add(np.concatenate([db[keep], db[4000:]]), ids=np.concatenate([keep, new_ids]))
    want = flat.search(q, 25)
    _equal(sharded.search(q, 25), want)
    assert len(sharded) == len(flat)
    client.cancel(sharded.shards)  # every shard lost: rebuilt from codes + logged add/remove
    _equal(sharded.search(q, 25), want)
    with pytest.raises(ValueError, match="already"):
        sharded.add(db[:1], ids=[new_ids[0]])
    with pytest.raises(ValueError, match="not in the index"):
        sharded.remove([drop[0], 1])
    _equal(sharded.search(q, 25), want)  # refused calls changed nothing


def test_save_and_load_the_whole_sharded_index(client, problem, tmp_path):
    db, q = problem
    sharded = ShardedIndex.from_codes(client, db, n_bits=64, n_shards=3, index="mih")
    sharded.remove([0, 1, 2])
    sharded.save(tmp_path / "idx")
    assert sorted(p.name[:6] for p in (tmp_path / "idx").iterdir() if p.is_dir()) == ["shard-"] * 3
    loaded = ShardedIndex.load(client, tmp_path / "idx", mmap=True)
    flat = FlatIndex(64)
    flat.add(db[3:], ids=np.arange(3, len(db)))
    want = flat.search(q, 10)
    _equal(loaded.search(q, 10), want)
    assert loaded.n_shards == 3 and len(loaded) == len(db) - 3
    client.cancel(loaded.shards)  # reloaded from the save
    _equal(loaded.search(q, 10), want)
    # saving again replaces the save (old shard directories removed)
    loaded.add(db[:3], ids=[0, 1, 2])
    loaded.save(tmp_path / "idx")
    again = ShardedIndex.load(client, tmp_path / "idx")
    _equal(again.search(q, 10), reference(db, q, 10))
    assert len([p for p in (tmp_path / "idx").iterdir() if p.is_dir()]) == 3
    with pytest.raises(TypeError, match="ShardedIndex"):
        flat.save(tmp_path / "flat")
        ShardedIndex.load(client, tmp_path / "flat")


@pytest.mark.slow
def test_worker_killed_mid_search_and_restart_on_process_cluster(problem):
    """A real 2-process LocalCluster: kill a worker process while searches run, then
    ``client.restart()``; every search still equals one FlatIndex."""
    import os
    import signal
    import threading

    db, q = problem
    want = reference(db, q, 10)
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    try:
        with distributed.Client(cluster) as c:
            sharded = ShardedIndex.from_codes(c, db, n_bits=64, n_shards=4)
            _equal(sharded.search(q, 10), want)
            victim_pid = next(iter(cluster.workers.values())).process.process.pid
            killer = threading.Timer(0.2, os.kill, (victim_pid, signal.SIGKILL))
            killer.start()
            deadline = time.monotonic() + 8
            n = 0
            while time.monotonic() < deadline or n < 3:
                _equal(sharded.search(q, 10), want)
                n += 1
            killer.join()
            assert victim_pid not in {
                p.process.process.pid
                for p in cluster.workers.values()
                if p.process is not None and p.process.process is not None
            }
            c.restart(timeout=300)
            _equal(sharded.search(q, 10), want)
    finally:
        cluster.close()


# ------------------------------------------------ refining on the workers (Searcher's path)


@pytest.fixture(scope="module")
def vectors():
    """Dense rows, rows 100..199 duplicating rows 0..99 (exact ties, broken by id), and
    queries near some of them; a hasher fitted on them."""
    rng = np.random.default_rng(7)
    X = rng.normal(size=(3000, 12)).astype(np.float32)
    X[100:200] = X[:100]
    Q = np.concatenate([X[:10] + 0.01, rng.normal(size=(15, 12)).astype(np.float32)])
    return X, Q, RandomHyperplaneLSH(n_bits=32, random_state=0).fit(X)


def brute_refine(X, ids, Q, hasher, k, n_candidates, metric):
    """Shortlist the ``n_candidates`` nearest codes by (Hamming distance, id), then rank
    them exactly in float64 numpy by (distance, id), or by (-similarity, id) for cosine."""
    ham = np.unpackbits(hasher.encode(Q)[:, None] ^ hasher.encode(X)[None], axis=-1).sum(-1)
    D, I = [], []
    for i, q in enumerate(Q.astype(np.float64)):
        short = np.lexsort((ids, ham[i]))[:n_candidates]
        V = X[short].astype(np.float64)
        if metric == "euclidean":
            score = key = np.sqrt(((V - q) ** 2).sum(axis=1))
        else:
            score = V @ q / (np.linalg.norm(V, axis=1) * np.linalg.norm(q))
            key = -score
        order = np.lexsort((ids[short], key))[:k]
        D.append(score[order])
        I.append(ids[short][order])
    return np.array(D), np.array(I)


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_refine_search_on_the_workers_equals_brute_force(client, vectors, metric):
    """attach_refiner / add (numpy, then a dask array encoded on the workers) / remove /
    refine_search, as Searcher calls them, against a shortlist-then-refine in numpy."""
    X, Q, hasher = vectors
    sharded = ShardedIndex(client, n_bits=32, n_shards=3)
    sharded.attach_refiner(metric, hasher, True)
    first = sharded.add(hasher.encode(X[:1000]), vectors=X[:1000])
    later = np.arange(1000, 3000) * 2
    assert (
        sharded.add(None, ids=later, vectors=da.from_array(X[1000:], chunks=(600, 12))).tolist()
        == later.tolist()
    )
    ids = np.concatenate([first, later])
    drop = ids[5::9]
    assert sharded.remove(drop) == len(drop)
    keep = ~np.isin(ids, drop)
    for k, n_candidates in ((1, 1), (10, 100), (10, 2500)):
        D, I = sharded.refine_search(Q, hasher.encode(Q), k, n_candidates)
        assert D.dtype == np.float32 and I.dtype == np.int64 and D.shape == (len(Q), k)
        want_D, want_I = brute_refine(X[keep], ids[keep], Q, hasher, k, n_candidates, metric)
        np.testing.assert_array_equal(I, want_I)
        np.testing.assert_allclose(D, want_D, rtol=1e-5, atol=1e-6)
    D, I = sharded.refine_search(Q[:2], hasher.encode(Q[:2]), 5, 3)  # fewer candidates than k
    assert (I[:, 3:] == -1).all() and np.isinf(D[:, 3:]).all()
    with pytest.raises(ValueError, match="vectors"):
        sharded.add(hasher.encode(X[:2]))  # a refining index needs the vectors


@pytest.mark.parametrize("metric", ["euclidean", "cosine", "inner_product"])
def test_searcher_over_a_sharded_index_equals_a_local_searcher(client, vectors, metric):
    from hashlearn import Searcher

    X, Q, hasher = vectors
    local = Searcher(hasher, "flat", rerank=metric)
    sharded = Searcher(hasher, ShardedIndex(client, n_bits=32, n_shards=2), rerank=metric)
    for searcher in (local, sharded):
        searcher.add(X[:2000])
        searcher.add(X[2000:], ids=np.arange(5000, 6000))
        searcher.remove(np.arange(0, 2000, 7))
    for k, n_candidates in ((10, 100), (3, 1000)):
        _equal(
            sharded.search(Q, k, n_candidates=n_candidates),
            local.search(Q, k, n_candidates=n_candidates),
        )
    assert sharded.refiner is None  # the vectors live on the workers only


def test_a_refining_sharded_index_saves_and_loads(client, vectors, tmp_path):
    import hashlearn

    X, Q, hasher = vectors
    sharded = ShardedIndex(client, n_bits=32, n_shards=2)
    sharded.attach_refiner("cosine", hasher, False)
    sharded.add(None, vectors=da.from_array(X, chunks=(1000, 12)))
    sharded.remove(np.arange(50))
    want = sharded.refine_search(Q, hasher.encode(Q), 10, 200)
    sharded.save(tmp_path / "idx")
    names = sorted(p.name.split("-")[0] for p in (tmp_path / "idx").iterdir() if p.is_dir())
    assert names == ["hasher", "shard", "shard", "vectors", "vectors"]
    client.cancel(sharded.shards)  # now reloaded from the save
    _equal(sharded.refine_search(Q, hasher.encode(Q), 10, 200), want)
    for loaded in (
        hashlearn.load(tmp_path / "idx", client=client),
        ShardedIndex.load(tmp_path / "idx", client=client, mmap=True),
        ShardedIndex.load(tmp_path / "idx", client=client, mmap="direct"),  # rows read by I/O
    ):
        _equal(loaded.refine_search(Q, hasher.encode(Q), 10, 200), want)
        assert len(loaded) == len(X) - 50
        assert loaded.add(None, vectors=X[:1]).tolist() == [len(X)]
    from hashlearn import Searcher

    loaded = ShardedIndex.load(tmp_path / "idx", client=client)
    searcher = Searcher(loaded.hasher, loaded, rerank="cosine", screen=False)
    _equal(searcher.search(Q, 10, n_candidates=200), want)
    searcher.add(X[:2])  # attaches the same refiner again: nothing changes
    with pytest.raises(ValueError, match="already refines"):
        Searcher(hasher, loaded, rerank="euclidean").add(X[:2])


def test_a_sharded_searcher_built_from_a_dask_array_saves_and_loads(client, vectors, tmp_path):
    """Searcher.add(dask array) encodes and keeps the rows on the workers; the Searcher saves
    (its sharded index as a component) and hashlearn.load(path, client=) searches the same."""
    import hashlearn
    from hashlearn import Searcher

    X, Q, hasher = vectors
    local = Searcher(hasher, "flat", rerank="euclidean").add(X)
    sharded = Searcher(hasher, ShardedIndex(client, n_bits=32, n_shards=2), rerank="euclidean")
    sharded.add(da.from_array(X, chunks=(700, 12)))
    want = local.search(Q, 10, n_candidates=150)
    _equal(sharded.search(Q, 10, n_candidates=150), want)
    sharded.save(tmp_path / "searcher")
    loaded = hashlearn.load(tmp_path / "searcher", client=client)
    assert isinstance(loaded, Searcher) and isinstance(loaded.index, ShardedIndex)
    _equal(loaded.search(Q, 10, n_candidates=150), want)
    direct = Searcher.load(tmp_path / "searcher", mmap="direct", client=client)
    _equal(direct.search(Q, 10, n_candidates=150), want)


@pytest.mark.slow
def test_searcher_over_a_sharded_index_survives_a_worker_killed_mid_search(vectors):
    """A real 2-process LocalCluster: a worker process is killed while a Searcher over a
    refining ShardedIndex searches; every result equals a local Searcher's, and after
    ``client.restart()`` too (the shards, vectors included, are rebuilt from their sources)."""
    import os
    import signal
    import threading

    from hashlearn import Searcher

    X, Q, hasher = vectors
    local = Searcher(hasher, "flat", rerank="euclidean")
    local.add(X)
    want = local.search(Q, 10, n_candidates=300)
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    try:
        with distributed.Client(cluster) as c:
            index = ShardedIndex(c, n_bits=32, n_shards=2)
            searcher = Searcher(hasher, index, rerank="euclidean")
            searcher.add(X[:1000])
            index.add(
                None, ids=np.arange(1000, len(X)), vectors=da.from_array(X[1000:], chunks=(700, 12))
            )
            _equal(searcher.search(Q, 10, n_candidates=300), want)
            victim_pid = next(iter(cluster.workers.values())).process.process.pid
            killer = threading.Timer(0.2, os.kill, (victim_pid, signal.SIGKILL))
            killer.start()
            deadline = time.monotonic() + 8
            n = 0
            while time.monotonic() < deadline or n < 3:
                _equal(searcher.search(Q, 10, n_candidates=300), want)
                n += 1
            killer.join()
            c.restart(timeout=300)
            _equal(searcher.search(Q, 10, n_candidates=300), want)
    finally:
        cluster.close()


def test_refined_searches_while_a_writer_removes_and_adds(client, vectors):
    """Readers search while a writer removes and re-adds a set of ids: every result is
    that of one state of the index (all ids, or all but the set), never an error."""
    import threading

    X, Q, hasher = vectors
    sharded = ShardedIndex(client, n_bits=32, n_shards=2)
    sharded.attach_refiner("euclidean", hasher, True)
    ids = sharded.add(hasher.encode(X), vectors=X)
    churn = ids[::4]
    codes = hasher.encode(Q)
    states = [
        brute_refine(X, ids, Q, hasher, 10, 100, "euclidean")[1],
        brute_refine(
            X[~np.isin(ids, churn)], ids[~np.isin(ids, churn)], Q, hasher, 10, 100, "euclidean"
        )[1],
    ]
    failures, stop = [], threading.Event()

    def read():
        while not stop.is_set():
            try:
                I = sharded.refine_search(Q, codes, 10, 100)[1]
                if not any(np.array_equal(I, s) for s in states):
                    failures.append("a result of no state")
            except Exception as exc:  # noqa: BLE001 - any error fails the test
                failures.append(repr(exc))

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    for _ in range(6):
        sharded.remove(churn)
        sharded.add(hasher.encode(X[churn]), ids=churn, vectors=X[churn])
    stop.set()
    for t in readers:
        t.join()
    assert not failures, failures[:3]


def test_vectors_of_another_width_are_refused_before_anything_changes(client, vectors):
    X, Q, hasher = vectors
    sharded = ShardedIndex(client, n_bits=32, n_shards=2)
    sharded.attach_refiner("euclidean", hasher, True)
    sharded.add(hasher.encode(X[:100]), vectors=X[:100])
    with pytest.raises(ValueError, match="features"):
        sharded.add(hasher.encode(X[:10]), ids=np.arange(500, 510), vectors=X[:10, :5])
    assert len(sharded) == 100
    with pytest.raises(ValueError, match="rows"):
        sharded.add(hasher.encode(X[:10]), vectors=X[:9])


def test_a_lost_shard_whose_save_is_gone_is_rebuilt_as_before_the_save(client, vectors, tmp_path):
    import shutil

    X, Q, hasher = vectors
    sharded = ShardedIndex(client, n_bits=32, n_shards=2)
    sharded.attach_refiner("euclidean", hasher, True)
    sharded.add(hasher.encode(X[:2000]), vectors=X[:2000])
    sharded.save(tmp_path / "a")
    sharded.add(hasher.encode(X[2000:]), vectors=X[2000:])  # logged after the save
    sharded.save(tmp_path / "b")
    sharded.remove(np.arange(10))
    want = sharded.refine_search(Q, hasher.encode(Q), 10, 300)
    shutil.move(tmp_path / "b", tmp_path / "moved")  # as a composite's first save does
    client.cancel(sharded.shards)
    _equal(sharded.refine_search(Q, hasher.encode(Q), 10, 300), want)
    shutil.rmtree(tmp_path / "a")
    client.cancel(sharded.shards)
    _equal(sharded.refine_search(Q, hasher.encode(Q), 10, 300), want)
    assert len(sharded) == len(X) - 10


@pytest.mark.timeout(120)
def test_an_index_on_a_client_that_is_not_the_default(problem):
    """``connect`` makes no default client: building, adding and searching must use the
    index's own client (Dask's ``wait`` otherwise looks for a default and fails)."""
    from hashlearn.distributed import connect

    db, queries = problem
    n_bits = 64
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    )
    try:
        with connect(cluster.scheduler_address) as own:
            index = ShardedIndex(own, n_bits=n_bits, n_shards=2)
            index.add(db)
            flat = FlatIndex(n_bits)
            flat.add(db)
            _equal(index.search(queries, 5), flat.search(queries, 5))
    finally:
        cluster.close()

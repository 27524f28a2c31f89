"""FlatIndex against brute force: k-NN, range search, ids, add / remove, validation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import (
    SPECIAL_BITS,
    brute_distances,
    brute_knn,
    brute_range,
    code_problems,
    knn_from_distances,
    pack_le,
    popcount_distances,
    random_bits,
    random_ids,
    unpack_le,
)
from hashlearn.index import FlatIndex, available_indexes, make_index

SETTINGS = settings(max_examples=150, deadline=None)


def build(problem) -> FlatIndex:
    index = FlatIndex(problem.n_bits)
    index.add(problem.db, ids=problem.ids)
    return index


def assert_search_equals(index, queries, k, expected_D, expected_I, **kw):
    D, I = index.search(queries, k, **kw)
    assert D.dtype == np.int32 and I.dtype == np.int64
    assert D.shape == I.shape == (len(queries), k)
    np.testing.assert_array_equal(D, expected_D)
    np.testing.assert_array_equal(I, expected_I)


# -------------------------------------------------------------------------------- k-NN


@SETTINGS
@given(problem=code_problems(), k_extra=st.integers(-300, 5))
def test_search_equals_brute_force(problem, k_extra):
    n = len(problem.ids)
    k = max(1, n + k_extra)  # from 1 up to past n (padding)
    index = build(problem)
    assert len(index) == n
    D, I = brute_knn(problem.q_bits, problem.db_bits, problem.ids, k)
    assert_search_equals(index, problem.queries, k, D, I)


@pytest.mark.parametrize("n_bits", SPECIAL_BITS)
@pytest.mark.parametrize("mode", ["uniform", "sparse", "pool"])
def test_search_sweep_over_code_lengths(n_bits, mode):
    """Every word-count specialisation, every k regime, on every run (hypothesis may not)."""
    rng = np.random.default_rng(n_bits * 7 + len(mode))
    n, m = 300, 9
    pool = (rng.random((5, n_bits)) < 0.5).astype(np.uint8)
    db_bits = random_bits(rng, n, n_bits, mode, pool)
    q_bits = random_bits(rng, m, n_bits, mode, pool)
    q_bits[:3] = db_bits[:3]
    ids = random_ids(rng, n, "sparse")
    index = FlatIndex(n_bits)
    index.add(pack_le(db_bits), ids=ids)
    dist = brute_distances(q_bits, db_bits)
    for k in (1, 2, 10, 59, 64, 299, 300, 301, 350):
        D, I = knn_from_distances(dist, ids, k)
        assert_search_equals(index, pack_le(q_bits), k, D, I)


@settings(max_examples=25, deadline=None)
@given(problem=code_problems(max_n=120, max_m=12), k=st.integers(1, 40))
def test_search_thread_counts_agree(problem, k):
    index = build(problem)
    D, I = brute_knn(problem.q_bits, problem.db_bits, problem.ids, k)
    for n_threads in (1, 2, None):
        assert_search_equals(index, problem.queries, k, D, I, n_threads=n_threads)


@pytest.mark.parametrize("n_bits", [64, 256])
def test_large_search_with_many_ties_compacts_buffers_correctly(n_bits):
    rng = np.random.default_rng(n_bits)
    n, m, k = 20_000, 50, 100
    pool = pack_le(rng.random((300, n_bits)) < 0.5)
    db = pool[rng.integers(0, len(pool), n)]  # ~67 copies of each code
    ids = rng.choice(10**9, size=n, replace=False).astype(np.int64)
    queries = pack_le(rng.random((m, n_bits)) < 0.5)
    queries[: m // 2] = pool[rng.integers(0, len(pool), m // 2)]
    index = FlatIndex(n_bits)
    index.add(db, ids=ids)
    D, I = knn_from_distances(popcount_distances(queries, db), ids, k)
    for n_threads in (1, 2, None):
        assert_search_equals(index, queries, k, D, I, n_threads=n_threads)


@pytest.mark.parametrize("n_bits", [24, 64, 130, 300])
def test_many_queries_span_several_chunks(n_bits):
    rng = np.random.default_rng(7)
    n, m, k = 700, 600, 15
    pool = rng.random((60, n_bits)) < 0.5
    db_bits = pool[rng.integers(0, len(pool), n)]
    q_bits = rng.random((m, n_bits)) < 0.5
    ids = rng.permutation(3 * n)[:n]
    index = FlatIndex(n_bits)
    index.add(pack_le(db_bits), ids=ids)
    queries = pack_le(q_bits)
    D, I = brute_knn(q_bits, db_bits, ids, k)
    results = [index.search(queries, k, n_threads=t) for t in (1, 2, None)]
    for got_D, got_I in results:
        np.testing.assert_array_equal(got_D, D)
        np.testing.assert_array_equal(got_I, I)
    lims, RD, RI = brute_range(q_bits, db_bits, ids, n_bits // 2 - 3)
    for t in (1, 2, None):
        got = index.range_search(queries, n_bits // 2 - 3, n_threads=t)
        for a, b in zip(got, (lims, RD, RI), strict=True):
            np.testing.assert_array_equal(a, b)


def test_search_of_non_contiguous_and_read_only_queries():
    rng = np.random.default_rng(1)
    bits = rng.random((50, 100)) < 0.5
    codes = pack_le(bits)
    index = FlatIndex(100)
    index.add(np.asfortranarray(codes))
    queries = codes[::3]
    D, I = brute_knn(bits[::3], bits, np.arange(50), 5)
    assert_search_equals(index, queries, 5, D, I)
    ro = codes[::3].copy()
    ro.flags.writeable = False
    assert_search_equals(index, ro, 5, D, I)
    wide_bits = rng.random((30, 128)) < 0.5
    wide = pack_le(wide_bits)
    index = FlatIndex(128)
    index.add(wide)
    buf = np.zeros(wide.size + 1, np.uint8)  # C-contiguous but not 8-byte aligned
    buf[1:] = wide.ravel()
    D, I = brute_knn(wide_bits, wide_bits, np.arange(30), 4)
    assert_search_equals(index, buf[1:].reshape(wide.shape), 4, D, I)


def test_tie_rule_is_smaller_id_regardless_of_insertion_order():
    index = FlatIndex(16)
    codes = np.zeros((5, 2), np.uint8)
    index.add(codes, ids=[40, 3, 17, 99, 8])
    D, I = index.search(np.zeros((1, 2), np.uint8), 3)
    assert I.tolist() == [[3, 8, 17]]
    assert D.tolist() == [[0, 0, 0]]


# ------------------------------------------------------------------------------ range


@SETTINGS
@given(problem=code_problems(), data=st.data())
def test_range_search_equals_brute_force(problem, data):
    n_bits = problem.n_bits
    radius = data.draw(st.one_of(st.sampled_from([0, n_bits]), st.integers(0, n_bits)))
    index = build(problem)
    lims, D, I = index.range_search(problem.queries, radius)
    e_lims, e_D, e_I = brute_range(problem.q_bits, problem.db_bits, problem.ids, radius)
    assert lims.dtype == np.int64 and D.dtype == np.int32 and I.dtype == np.int64
    assert lims.shape == (len(problem.queries) + 1,)
    np.testing.assert_array_equal(lims, e_lims)
    np.testing.assert_array_equal(D, e_D)
    np.testing.assert_array_equal(I, e_I)
    assert np.all(D <= radius)


def test_range_search_radius_is_inclusive():
    index = FlatIndex(8)
    index.add(pack_le(np.array([[0] * 8, [1] + [0] * 7, [1, 1] + [0] * 6])), ids=[5, 6, 7])
    q = np.zeros((1, 1), np.uint8)
    lims, D, I = index.range_search(q, 1)
    assert lims.tolist() == [0, 2] and D.tolist() == [0, 1] and I.tolist() == [5, 6]
    lims, D, I = index.range_search(q, 0)
    assert lims.tolist() == [0, 1] and I.tolist() == [5]
    lims, D, I = index.range_search(q, 8)
    assert lims.tolist() == [0, 3] and I.tolist() == [5, 6, 7]


def test_range_search_on_empty_index_and_no_queries():
    index = FlatIndex(20)
    lims, D, I = index.range_search(np.zeros((3, 3), np.uint8), 20)
    assert lims.tolist() == [0, 0, 0, 0] and D.size == 0 and I.size == 0
    index.add(np.zeros((2, 3), np.uint8))
    lims, D, I = index.range_search(np.zeros((0, 3), np.uint8), 5)
    assert lims.tolist() == [0] and D.size == 0 and I.size == 0


# ------------------------------------------------------------------------- add / remove


@settings(max_examples=60, deadline=None)
@given(problem=code_problems(min_n=1), data=st.data())
def test_add_in_batches_equals_one_add(problem, data):
    n = len(problem.ids)
    n_batches = data.draw(st.integers(1, min(n, 5)))
    cuts = sorted(
        data.draw(st.lists(st.integers(0, n), min_size=n_batches - 1, max_size=n_batches - 1))
    )
    bounds = [0, *cuts, n]
    # the batches come in an order that makes later ids smaller (merge path)
    order = np.argsort(-problem.ids, kind="stable")
    batched = FlatIndex(problem.n_bits)
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        sel = order[lo:hi]
        returned = batched.add(problem.db[sel], ids=problem.ids[sel])
        np.testing.assert_array_equal(returned, problem.ids[sel])
    once = build(problem)
    assert len(batched) == len(once) == n
    np.testing.assert_array_equal(batched.ids, np.sort(problem.ids))
    np.testing.assert_array_equal(once.ids, np.sort(problem.ids))
    by_id = np.argsort(problem.ids)
    np.testing.assert_array_equal(batched.codes, problem.db[by_id])
    k = min(n, 7) + 1
    D, I = brute_knn(problem.q_bits, problem.db_bits, problem.ids, k)
    assert_search_equals(batched, problem.queries, k, D, I)
    assert_search_equals(once, problem.queries, k, D, I)


def test_add_without_ids_numbers_from_one_past_largest_id_ever_added():
    index = FlatIndex(8)
    codes = np.arange(6, dtype=np.uint8).reshape(6, 1)
    assert index.add(codes[:2]).tolist() == [0, 1]
    assert index.add(codes[2:3], ids=[50]).tolist() == [50]
    assert index.add(codes[3:4], ids=[10]).tolist() == [10]  # smaller: merge path
    assert index.add(codes[4:5]).tolist() == [51]
    index.remove([51, 50])
    assert index.add(codes[5:6]).tolist() == [52]  # never reuses removed ids
    assert index.ids.tolist() == [0, 1, 10, 52]
    assert index.add(np.zeros((0, 1), np.uint8)).tolist() == []
    assert index.add(codes[:1]).tolist() == [53]


@settings(max_examples=60, deadline=None)
@given(problem=code_problems(min_n=1), data=st.data())
def test_remove_never_renumbers(problem, data):
    n = len(problem.ids)
    drop = np.array(sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=n))), dtype=np.int64)
    keep = np.setdiff1d(np.arange(n), drop)
    index = build(problem)
    assert index.remove(problem.ids[drop]) == len(drop)
    assert len(index) == len(keep)
    np.testing.assert_array_equal(index.ids, np.sort(problem.ids[keep]))
    k = max(1, min(len(keep), 6))
    D, I = brute_knn(problem.q_bits, problem.db_bits[keep], problem.ids[keep], k)
    assert_search_equals(index, problem.queries, k, D, I)
    fresh = FlatIndex(problem.n_bits)
    fresh.add(problem.db[keep], ids=problem.ids[keep])
    fD, fI = fresh.search(problem.queries, k)
    gD, gI = index.search(problem.queries, k)
    np.testing.assert_array_equal(gD, fD)
    np.testing.assert_array_equal(gI, fI)
    radius = problem.n_bits // 3
    for got, want in zip(
        index.range_search(problem.queries, radius),
        brute_range(problem.q_bits, problem.db_bits[keep], problem.ids[keep], radius),
        strict=True,
    ):
        np.testing.assert_array_equal(got, want)
    # adding back after a removal still works and keeps the tie rule
    if len(drop):
        index.add(problem.db[drop], ids=problem.ids[drop])
        D, I = brute_knn(problem.q_bits, problem.db_bits, problem.ids, k)
        assert_search_equals(index, problem.queries, k, D, I)


def test_remove_unknown_ids_raises_and_removes_nothing():
    index = FlatIndex(16)
    index.add(np.arange(10, dtype=np.uint8).repeat(2).reshape(10, 2), ids=np.arange(10) * 2)
    before = index.search(np.zeros((2, 2), np.uint8), 10)
    with pytest.raises(ValueError, match="not in the index"):
        index.remove([2, 4, 5])
    assert len(index) == 10
    after = index.search(np.zeros((2, 2), np.uint8), 10)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
    assert index.remove([2, 4, 5, 1000], missing="ignore") == 2
    assert index.ids.tolist() == [0, 6, 8, 10, 12, 14, 16, 18]
    assert index.remove([], missing="raise") == 0
    with pytest.raises(ValueError, match="missing"):
        index.remove([0], missing="skip")
    with pytest.raises(ValueError, match="ids"):
        index.remove([0.5])
    assert len(index) == 8


def test_duplicate_or_existing_ids_raise_and_add_nothing():
    index = FlatIndex(8)
    codes = np.arange(4, dtype=np.uint8).reshape(4, 1)
    with pytest.raises(ValueError, match="duplicate"):
        index.add(codes, ids=[1, 2, 3, 2])
    assert len(index) == 0
    index.add(codes[:2], ids=[5, 9])
    with pytest.raises(ValueError, match="already in the index"):
        index.add(codes[2:], ids=[7, 9])
    assert index.ids.tolist() == [5, 9]
    with pytest.raises(ValueError, match="ids"):
        index.add(codes[2:], ids=[-1, 3])
    with pytest.raises(ValueError, match="ids"):
        index.add(codes[2:], ids=[3])
    with pytest.raises(TypeError, match="ids"):
        index.add(codes[2:], ids=[3.0, 4.0])
    assert index.ids.tolist() == [5, 9]
    assert index.add(codes[2:]).tolist() == [10, 11]  # failed adds consumed no ids


def test_ids_property_is_read_only():
    index = FlatIndex(8)
    index.add(np.zeros((2, 1), np.uint8), ids=[3, 1])
    with pytest.raises(ValueError):
        index.ids[0] = 7
    assert index.ids.tolist() == [1, 3]


# ---------------------------------------------------------------------- empty / padding


@pytest.mark.parametrize("n_bits", [5, 64, 300])
def test_empty_index_returns_all_minus_one(n_bits):
    index = FlatIndex(n_bits)
    assert len(index) == 0
    D, I = index.search(np.zeros((3, (n_bits + 7) // 8), np.uint8), 4)
    assert D.dtype == np.int32 and I.dtype == np.int64
    assert D.tolist() == [[-1] * 4] * 3
    assert I.tolist() == [[-1] * 4] * 3
    D, I = index.search(np.zeros((0, (n_bits + 7) // 8), np.uint8), 4)
    assert D.shape == I.shape == (0, 4)


def test_fewer_codes_than_k_pad_with_minus_one():
    index = FlatIndex(12)
    index.add(pack_le(np.eye(12, dtype=np.uint8)[:3]), ids=[30, 10, 20])
    D, I = index.search(np.zeros((1, 2), np.uint8), 5)
    assert D.tolist() == [[1, 1, 1, -1, -1]]
    assert I.tolist() == [[10, 20, 30, -1, -1]]


# --------------------------------------------------------------------------- validation


def test_bad_arguments_raise_clear_errors():
    index = FlatIndex(20)
    index.add(np.zeros((4, 3), np.uint8))
    q = np.zeros((2, 3), np.uint8)
    for k in (0, -1):
        with pytest.raises(ValueError, match="'k'"):
            index.search(q, k)
    for k in (2.0, "3", None, True):
        with pytest.raises((ValueError, TypeError), match="'k'"):
            index.search(q, k)
    for radius in (-1, 21, 1.5, None):
        with pytest.raises((ValueError, TypeError), match="'radius'"):
            index.range_search(q, radius)
    with pytest.raises(ValueError, match="queries"):
        index.search(np.zeros((2, 4), np.uint8), 1)  # 32-bit queries for 20-bit codes
    with pytest.raises(ValueError, match="queries"):
        index.range_search(np.zeros((2, 2), np.uint8), 1)
    with pytest.raises(ValueError, match="queries"):
        index.search(np.zeros(3, np.uint8), 1)
    with pytest.raises(TypeError, match="queries"):
        index.search(q.astype(np.float64), 1)
    with pytest.raises(TypeError, match="codes"):
        index.add(np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="codes"):
        index.add(np.zeros((2, 3), np.int8))
    with pytest.raises(ValueError, match="codes"):
        index.add(np.zeros((2, 8), np.uint8))
    with pytest.raises(ValueError, match="n_threads"):
        index.search(q, 1, n_threads=0)
    for n_bits in (0, -3, 8.0):
        with pytest.raises(ValueError, match="n_bits"):
            FlatIndex(n_bits)
    assert len(index) == 4


def test_make_index_by_name():
    index = make_index("flat", n_bits=40)
    assert isinstance(index, FlatIndex) and index.n_bits == 40 and index.code_size == 5
    assert "flat" in available_indexes()
    with pytest.raises(ValueError, match="no-such-index") as info:
        make_index("no-such-index", n_bits=8)
    assert "flat" in str(info.value)


def test_codes_property_returns_the_stored_codes():
    rng = np.random.default_rng(0)
    bits = rng.random((9, 77)) < 0.5
    codes = pack_le(bits)
    index = FlatIndex(77)
    ids = np.array([8, 1, 5, 0, 3, 2, 7, 6, 4])
    index.add(codes, ids=ids)
    stored = index.codes
    assert stored.dtype == np.uint8 and stored.shape == (9, 10)
    np.testing.assert_array_equal(unpack_le(stored, 77), bits[np.argsort(ids)])


def test_large_row_buffers_are_private_zeroed_memory():
    """Row buffers of 4 MiB and more come from their own mapping (advised to use huge
    pages): zero-filled, writable, the asked shape and dtype; after a fork the child's
    writes stay in the child (a private mapping), and an index built on them is exact."""
    import os

    from hashlearn.index._storage import _zeroed_rows

    for shape, dtype in [((10,), np.int64), ((600_000,), np.int64), ((300_000, 2), np.uint64)]:
        a = _zeroed_rows(shape, dtype)
        assert a.shape == shape and a.dtype == dtype and a.flags.writeable
        assert not a.any()
        a[-1] = 7
    big = _zeroed_rows((600_000,), np.int64)
    if hasattr(os, "fork"):
        pid = os.fork()
        if pid == 0:  # child: write and leave at once
            big[:] = 1
            os._exit(0)
        os.waitpid(pid, 0)
        assert not big.any()
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 256, (600_000, 8), dtype=np.uint8)  # 4.8 MB of words and of ids
    index = FlatIndex(64)
    index.add(codes)
    queries = codes[rng.integers(0, len(codes), 5)]
    D, I = index.search(queries, 3)
    assert (D[:, 0] == 0).all()
    np.testing.assert_array_equal(index.codes[I[:, 0]], queries)

"""HammingBallIndex (semantic hashing, binary-codes-survey.txt §2.2): exact vs brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import brute_knn, brute_range, code_problems, pack_le
from hashlearn.index.base import make_index
from hashlearn.index.flat import FlatIndex
from hashlearn.index.hamming_ball import HammingBallIndex, ball_size

SETTINGS = settings(max_examples=60, deadline=None)


def _clustered(rng, n, n_bits, flip=0.03):
    """Codes near a few centres, so balls of small radius hold many items (and ties)."""
    centres = rng.random((max(2, n // 20), n_bits)) < 0.5
    bits = centres[rng.integers(0, len(centres), n)] ^ (rng.random((n, n_bits)) < flip)
    return bits.astype(np.uint8)


@given(
    problem=code_problems(max_n=300), k=st.integers(1, 30), probe_cost=st.sampled_from([1.0, 32.0])
)
@SETTINGS
def test_search_matches_brute_force(problem, k, probe_cost):
    index = HammingBallIndex(problem.n_bits, probe_cost=probe_cost)
    index.add(problem.db, problem.ids)
    D, I = index.search(problem.queries, k)
    D_ref, I_ref = brute_knn(problem.q_bits, problem.db_bits, problem.ids, k)
    np.testing.assert_array_equal(D, D_ref)
    np.testing.assert_array_equal(I, I_ref)


@given(
    problem=code_problems(max_n=300),
    radius=st.integers(0, 4),
    probe_cost=st.sampled_from([1.0, 32.0]),
)
@SETTINGS
def test_range_search_matches_brute_force(problem, radius, probe_cost):
    index = HammingBallIndex(problem.n_bits, probe_cost=probe_cost)
    index.add(problem.db, problem.ids)
    radius = min(radius, problem.n_bits)
    lims, D, I = index.range_search(problem.queries, radius)
    lims_ref, D_ref, I_ref = brute_range(problem.q_bits, problem.db_bits, problem.ids, radius)
    np.testing.assert_array_equal(lims, lims_ref)
    np.testing.assert_array_equal(D, D_ref)
    np.testing.assert_array_equal(I, I_ref)


@pytest.mark.parametrize("n_bits", [8, 16, 24, 32, 33, 64, 100, 256])
def test_ball_path_is_exact_at_every_length(n_bits):
    """Databases large enough that the ball (not the fallback scan) answers, incl. > 32 bits
    (second hash, verified by true distance)."""
    rng = np.random.default_rng(n_bits)
    n = 3000
    bits = _clustered(rng, n, n_bits)
    q_bits = bits[rng.integers(0, n, 40)] ^ (rng.random((40, n_bits)) < 0.02)
    ids = rng.permutation(5 * n)[:n]
    ball, flat = HammingBallIndex(n_bits, probe_cost=1), FlatIndex(n_bits)
    ball.add(pack_le(bits), ids)
    flat.add(pack_le(bits), ids)
    q = pack_le(q_bits.astype(np.uint8))
    assert ball._max_level() >= 1
    for radius in range(0, ball._max_level() + 1):
        for got, ref in zip(
            ball.range_search(q, radius), flat.range_search(q, radius), strict=False
        ):
            np.testing.assert_array_equal(got, ref)
    for k in (1, 10, 50):
        for got, ref in zip(ball.search(q, k), flat.search(q, k), strict=False):
            np.testing.assert_array_equal(got, ref)


def test_key_collisions_are_verified():
    """Simulate collisions: every item is filed under the key of the query's own code (as a
    second hash mapping all codes to one key would), so the distance-0 probe finds all of
    them and no other probe finds any. Results at radius 0 stay exact: each item is kept
    only at its true distance; at larger radii the items are unreachable by design of this
    degenerate table, which the collision rule must not turn into wrong distances."""
    from hashlearn._utils.postings import build_table
    from hashlearn.codes import as_words
    from hashlearn.index import hamming_ball

    rng = np.random.default_rng(1)
    bits = _clustered(rng, 500, 16, flip=0.1)
    index = HammingBallIndex(16, probe_cost=1)
    index.add(pack_le(bits))
    n = len(index)
    q = pack_le(bits[:1])
    own = hamming_ball._keys_of(as_words(index.codes), n, 1)
    query_key = hamming_ball._key(as_words(q), 0, 1)
    moved = own != query_key  # file these under the query's key instead of their own
    keys = np.where(moved, query_key, own)
    positions = np.arange(n)
    words = as_words(index.codes).reshape(-1)
    snap = index.store.snapshot
    table = hamming_ball._ball_table(*build_table(keys, positions), words, snap.ids, 1)
    index.store.restore(snap.ids, snap.rows, snap.next_id, {"ball": table})
    assert np.diff(table["kv"][:, 1]).max() == n
    flat = FlatIndex(16)
    flat.add(pack_le(bits))
    for got, ref in zip(index.range_search(q, 0), flat.range_search(q, 0), strict=False):
        np.testing.assert_array_equal(got, ref)
    lims, D, I = index.range_search(q, 2)
    assert (D == 0).all()  # nothing reported at a distance it does not have


def test_fallback_scan_when_ball_is_bigger_than_database():
    rng = np.random.default_rng(2)
    bits = (rng.random((20, 64)) < 0.5).astype(np.uint8)
    index = HammingBallIndex(64, probe_cost=1)
    index.add(pack_le(bits))
    assert ball_size(64, 1) > len(index)  # 65 codes in the radius-1 ball, 20 items
    assert index._max_level() == 0
    flat = FlatIndex(64)
    flat.add(pack_le(bits))
    q = pack_le(bits[:5] ^ (rng.random((5, 64)) < 0.1))
    for radius in (0, 3, 64):
        for got, ref in zip(
            index.range_search(q, radius), flat.range_search(q, radius), strict=False
        ):
            np.testing.assert_array_equal(got, ref)
    for got, ref in zip(index.search(q, 7), flat.search(q, 7), strict=False):
        np.testing.assert_array_equal(got, ref)


def test_ball_size():
    assert ball_size(32, 2) == 1 + 32 + 496
    assert ball_size(8, 8) == 256
    assert ball_size(8, 20) == 256


def test_add_remove_and_padding():
    rng = np.random.default_rng(3)
    bits = _clustered(rng, 200, 12)
    index = make_index("hamming-ball", n_bits=12)
    assert isinstance(index, HammingBallIndex)
    D, I = index.search(pack_le(bits[:2]), 3)
    assert (D == -1).all() and (I == -1).all()
    ids = index.add(pack_le(bits[:100]))
    index.add(pack_le(bits[100:]), ids=np.arange(1000, 1100))
    assert len(index) == 200 and ids.tolist() == list(range(100))
    assert index.remove(np.arange(0, 100, 2)) == 50
    flat = FlatIndex(12)
    flat.add(pack_le(bits[1:100:2]), ids=np.arange(1, 100, 2))
    flat.add(pack_le(bits[100:]), ids=np.arange(1000, 1100))
    q = pack_le(bits[:10])
    for got, ref in zip(index.search(q, 500), flat.search(q, 500), strict=False):
        np.testing.assert_array_equal(got, ref)
    with pytest.raises(ValueError, match="ids not in the index"):
        index.remove([0])


def test_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(4)
    bits = _clustered(rng, 400, 32)
    index = HammingBallIndex(32, probe_cost=1)
    index.add(pack_le(bits), ids=rng.permutation(1000)[:400])
    index.save(tmp_path / "ball")
    for mmap in (False, True):
        loaded = HammingBallIndex.load(tmp_path / "ball", mmap=mmap)
        assert loaded.probe_cost == 1 and loaded._max_level() == index._max_level() >= 1
        q = pack_le(bits[:20])
        for got, ref in zip(loaded.search(q, 5), index.search(q, 5), strict=False):
            np.testing.assert_array_equal(got, ref)
        for got, ref in zip(loaded.range_search(q, 2), index.range_search(q, 2), strict=False):
            np.testing.assert_array_equal(got, ref)


def test_bad_input():
    index = HammingBallIndex(16)
    index.add(np.zeros((3, 2), np.uint8))
    with pytest.raises(ValueError, match="radius"):
        index.range_search(np.zeros((1, 2), np.uint8), 17)
    with pytest.raises(ValueError, match="radius"):
        index.range_search(np.zeros((1, 2), np.uint8), -1)
    with pytest.raises(ValueError, match="'k'"):
        index.search(np.zeros((1, 2), np.uint8), 0)
    with pytest.raises((ValueError, TypeError), match="queries"):
        index.search(np.zeros((1, 3), np.uint8), 1)
    with pytest.raises(ValueError, match="n_bits"):
        HammingBallIndex(0)
    with pytest.raises(ValueError, match="probe_cost"):
        HammingBallIndex(8, probe_cost=0.5)


def _search_recording_levels(monkeypatch, db, queries, k):
    """A HammingBallIndex over ``db`` searched for ``queries``, checked equal to FlatIndex;
    returns it and the ``(level, n_queries)`` of every ball run the search made."""
    index = HammingBallIndex(32)
    index.add(db)
    levels = []
    run_ball = HammingBallIndex._run_ball

    def spy(self, snap, q, max_level, k_, n_threads):
        levels.append((max_level, len(q)))
        return run_ball(self, snap, q, max_level, k_, n_threads)

    monkeypatch.setattr(HammingBallIndex, "_run_ball", spy)
    D, I = index.search(queries, k)
    flat = FlatIndex(32)
    flat.add(db)
    D_ref, I_ref = flat.search(queries, k)
    np.testing.assert_array_equal(D, D_ref)
    np.testing.assert_array_equal(I, I_ref)
    return index, levels


def test_cost_model_sends_hopeless_queries_to_the_scan_and_stays_exact(monkeypatch):
    """20k random 32-bit codes: the affordable ball (radius 2) is expected to hold far fewer
    than k codes, so a query with nothing within distance 1 is scanned at once, while one
    with a near duplicate goes on through the ball first. Both must match FlatIndex."""
    rng = np.random.default_rng(7)
    n, k = 20_000, 10
    db = rng.integers(0, 256, (n, 4), dtype=np.uint8)
    near = db[:20].copy()
    near[:, 0] ^= 1  # distance 1 from a stored code: found at level 1
    queries = np.concatenate([near, rng.integers(0, 256, (20, 4), dtype=np.uint8)])
    index, levels = _search_recording_levels(monkeypatch, db, queries, k)
    assert index._max_level() >= 2
    # level 1 for every query, then the full ball only for the ones that found something
    assert levels[0] == (1, 40)
    assert len(levels) == 2 and levels[1][0] == index._max_level() and levels[1][1] <= 21


@pytest.mark.parametrize("pilot_finds", [False, True])
def test_pilot_sends_a_hopeless_batch_straight_to_the_scan(monkeypatch, pilot_finds):
    """A batch of 96 queries over 20k random codes: its pilot (queries 0, 32, 64) probes
    levels 0-1 first. When the pilot finds nothing the whole batch is scanned without
    probing -- even queries that would have found a near duplicate, still exactly --;
    when it finds something every query probes as before."""
    rng = np.random.default_rng(8)
    n, k, m = 20_000, 10, 96
    db = rng.integers(0, 256, (n, 4), dtype=np.uint8)
    queries = rng.integers(0, 256, (m, 4), dtype=np.uint8)
    queries[1:32] = db[:31]  # near duplicates (distance 0-1) outside the pilot
    queries[1:32:2, 0] ^= 1
    if pilot_finds:
        queries[32] = db[100]
    index, levels = _search_recording_levels(monkeypatch, db, queries, k)
    assert levels[0] == (1, 3)  # the pilot
    if pilot_finds:
        assert levels[1] == (1, m) and levels[2][0] == index._max_level()
    else:
        assert len(levels) == 1


@pytest.mark.parametrize("n", [0, 1, 5, 24, 25, 64, 300, 2000])
def test_sort_ids_equals_np_sort(n):
    """The ball's per-level sort: insertion, byte-wise radix (odd and even pass counts) and
    the comparison fallback for negative or large ids."""
    from hashlearn._utils.primitives import sort_ids

    rng = np.random.default_rng(n)
    tmp, counts = np.empty(max(n, 1), np.int64), np.empty(256, np.int64)
    for high in (2, 255, 70_000, 2**20, 2**40):
        for low in (0, -5):
            ids = rng.integers(low, high, n + 6)
            got = ids.copy()
            sort_ids(got, 3, 3 + n, tmp, counts)
            want = ids.copy()
            want[3 : 3 + n].sort()
            np.testing.assert_array_equal(got, want)

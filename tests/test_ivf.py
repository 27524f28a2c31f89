"""IVFIndex (issue 32, item 2): the inverted-file coarse stage over binary codes.

Oracles: FlatIndex and numpy brute force. With every list probed the results must be exactly
the flat scan's; with the default probing they must be the brute-force answer over the lists
the budget rule names (recomputed here in numpy from the centroids), and recall on digits ITQ
codes must stay close to the flat scan's.
"""

from __future__ import annotations

import json
import threading
import time
import warnings

import numpy as np
import pytest

import hashlearn
from conftest import budget_lists_oracle, knn_from_distances, popcount_distances, rewrite_array
from hashlearn import Searcher, load_digits
from hashlearn._utils.popcount import set_kernel_path
from hashlearn.hashers import IterativeQuantization, RandomHyperplaneLSH
from hashlearn.index import FlatIndex, IVFIndex, ResidualIVFIndex, make_index
from hashlearn.index import ivf as ivf_module

ALL = 10**6  # n_probe above any n_lists: every list


def _codes(rng, n, n_bits, *, dup=0.0, levels=None):
    """Random codes; ``dup`` of them copies of others (exact ties), ``levels`` bits set
    only in the first ``levels`` bits (many equal distances)."""
    width = (n_bits + 7) // 8
    codes = rng.integers(0, 256, (n, width), dtype=np.uint8)
    if levels is not None:
        bits = np.zeros((n, width * 8), np.uint8)
        bits[:, :levels] = rng.integers(0, 2, (n, levels))
        codes = np.packbits(bits, axis=1, bitorder="little")
    if n_bits % 8:
        codes[:, -1] &= (1 << (n_bits % 8)) - 1
    n_dup = int(dup * n)
    if n_dup:
        codes[rng.choice(n, n_dup, replace=False)] = codes[rng.integers(0, n, n_dup)]
    return codes


def _same(a, b) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b, strict=True))


def _layout(index: IVFIndex):
    """(codes in list order, ids in list order, centroids uint8, offsets) of one snapshot."""
    snap = index.store.snapshot
    lists = snap.cached("ivf")
    codes = snap.rows["words"].view(np.uint8)[:, : index.code_size]
    return codes, snap.ids, lists.centroids.view(np.uint8)[:, : index.code_size], lists.offsets


# --------------------------------------------------------------------- exact: all lists


@pytest.mark.parametrize("n_bits", [32, 64, 100, 128, 256, 320])
@pytest.mark.parametrize("explicit_ids", [False, True])
def test_every_list_probed_is_exactly_the_flat_scan(n_bits, explicit_ids):
    rng = np.random.default_rng(n_bits + explicit_ids)
    codes = _codes(rng, 700, n_bits, dup=0.2)
    ids = rng.choice(10**9, len(codes), replace=False) if explicit_ids else None
    queries = np.concatenate([codes[:20], _codes(rng, 20, n_bits)])
    ivf, flat = IVFIndex(n_bits, n_lists=12), FlatIndex(n_bits)
    assert np.array_equal(ivf.add(codes, ids), flat.add(codes, ids))
    for k in (1, 10, 100, 1000):
        for n_threads in (1, 3):
            got = ivf.search(queries, k, n_probe=12, n_threads=n_threads)
            assert _same(got, flat.search(queries, k)), (k, n_threads)
    radius = n_bits // 3
    assert _same(ivf.range_search(queries, radius, n_probe=ALL), flat.range_search(queries, radius))
    assert np.array_equal(ivf.ids, flat.ids)
    assert np.array_equal(ivf.codes, flat.codes)


@pytest.mark.parametrize("n_lists", [23, 3])  # lists of ~43 codes, and of several mini-blocks
@pytest.mark.parametrize("path", ["wide", "portable"])
def test_both_kernel_paths_are_exact(path, n_lists, grouped_always):
    """The wide (512-bit steps, lists read past their end and masked, passing mini-blocks
    taken after each list) and the portable scan give the flat scan's results on any CPU."""
    rng = np.random.default_rng(21)
    try:
        set_kernel_path(path)
        for n_bits in (64, 128, 256):
            codes = _codes(rng, 1000, n_bits, dup=0.1)
            ivf, flat = IVFIndex(n_bits, n_lists=n_lists, n_probe=ALL), FlatIndex(n_bits)
            ids = rng.permutation(4000)[:1000]
            ivf.add(codes, ids)
            flat.add(codes, ids)
            q = _codes(rng, 9, n_bits)
            for k in (1, 10, 200):
                assert _same(ivf.search(q, k), flat.search(q, k)), (n_bits, k)
                assert _same(ivf.search(q[:1], k), flat.search(q[:1], k)), (n_bits, k)
    finally:
        set_kernel_path(None)


@pytest.fixture
def grouped_always(monkeypatch):
    """A batch scanned list by list at any size (by default only past 16 MiB of codes)."""
    monkeypatch.setattr(ivf_module, "GROUP_MIN_WORDS", 0)


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("path", ["wide", "portable"])
def test_the_sampled_starting_bound_is_exact(path, grouped, monkeypatch):
    """k >= 32 over probed lists of >= 8 k codes: every 8th mini-block of the probed lists
    is scanned first for a starting bound; the results stay the flat scan's (lists of many
    mini-blocks, many lists, duplicates), for a lone query and for a batch scanned list by
    list (``grouped``) or query by query, on one thread and on several."""
    monkeypatch.setattr(ivf_module, "GROUP_MIN_WORDS", 0 if grouped else 10**18)
    rng = np.random.default_rng(33)
    try:
        set_kernel_path(path)
        for n_bits, n_lists in ((64, 4), (256, 40)):
            codes = _codes(rng, 12_000, n_bits, dup=0.05)
            ids = rng.permutation(40_000)[:12_000]
            ivf, flat = IVFIndex(n_bits, n_lists=n_lists, n_probe=ALL), FlatIndex(n_bits)
            ivf.add(codes, ids)
            flat.add(codes, ids)
            q = np.concatenate([codes[:5], _codes(rng, 5, n_bits)])
            for k in (32, 100, 500):
                want = flat.search(q, k)
                assert _same(ivf.search(q, k, n_threads=1), want), (n_bits, k)
                assert _same(ivf.search(q, k, n_threads=3), want), (n_bits, k)
                assert _same(ivf.search(q[:1], k), flat.search(q[:1], k)), (n_bits, k)
    finally:
        set_kernel_path(None)


@pytest.mark.parametrize("path", ["wide", "portable"])
def test_a_too_tight_sampled_bound_scans_the_query_again(path, grouped_always):
    """One list in id order: its mini-blocks 0, 8, 16, ... (64 codes each) are the sample.
    Copies of the query fill the first 8 codes of three sampled mini-blocks only: the
    sample's rank-th smallest distance (rank 19 for k = 64 over 1/8 of the codes) is 0,
    which leaves 24 < k codes below the bound; the query is scanned again without it, alone
    and in a batch, and the result is exact."""
    rng = np.random.default_rng(5)
    n_bits = 128
    codes = _codes(rng, 8192, n_bits)
    query = _codes(rng, 1, n_bits)[0]
    for block in (0, 8, 16):
        codes[64 * block : 64 * block + 8] = query
    try:
        set_kernel_path(path)
        ivf, flat = IVFIndex(n_bits, n_lists=1, n_probe=1), FlatIndex(n_bits)
        ivf.add(codes)
        flat.add(codes)
        together = np.stack([codes[5], query, codes[9]])  # the grouped scan of a batch
        for k in (64, 200):
            got = ivf.search(query[None], k)
            assert _same(got, flat.search(query[None], k)), k
            assert (got[0][0] == 0).sum() == 24
            assert _same(ivf.search(together, k), flat.search(together, k)), k
    finally:
        set_kernel_path(None)


@pytest.mark.parametrize("levels", [3, 8])
def test_heavy_ties_go_to_the_smaller_id(levels, grouped_always):
    """Codes over a few bits: most distances tie, across lists; the smaller ids win."""
    rng = np.random.default_rng(levels)
    codes = _codes(rng, 900, 64, levels=levels)
    ids = rng.permutation(5000)[:900]
    ivf, flat = IVFIndex(64, n_lists=6, n_probe=ALL), FlatIndex(64)
    ivf.add(codes, ids)
    flat.add(codes, ids)
    q = _codes(rng, 15, 64, levels=levels)
    for k in (1, 7, 64, 300):
        assert _same(ivf.search(q, k), flat.search(q, k)), k


# -------------------------------------------------------------------- default probing


def _probed_oracle(index: IVFIndex, queries: np.ndarray, k: int):
    """Brute force over the lists the budget rule names, recomputed in numpy."""
    centroids = _layout(index)[2]
    return budget_lists_oracle(index, queries, popcount_distances(queries, centroids), k)


def test_default_probing_is_brute_force_over_the_budget_lists():
    rng = np.random.default_rng(5)
    centers = _codes(rng, 8, 64)
    codes = centers[rng.integers(0, 8, 3000)] ^ _codes(rng, 3000, 64, levels=10)
    ivf = IVFIndex(64)
    ivf.add(codes, rng.permutation(3000) * 3)
    assert len(ivf.centroids) == round(4 * np.sqrt(3000))
    q = centers[rng.integers(0, 8, 30)] ^ _codes(rng, 30, 64, levels=12)
    for k in (1, 10, 50):
        assert _same(ivf.search(q, k), _probed_oracle(ivf, q, k)), k
    probe3 = IVFIndex(64, n_lists=20, n_probe=3)
    probe3.add(codes)
    got = probe3.search(q, 10)
    assert _same(got, probe3.search(q, 10, n_probe=3))
    assert not _same(got, probe3.search(q, 10, n_probe=20))  # fewer lists, other answers


@pytest.fixture(scope="module")
def digits_codes():
    X, _ = load_digits()
    hasher = IterativeQuantization(32, random_state=0).fit(X[300:])
    return hasher.encode(X[300:]), hasher.encode(X[:300])


def test_default_recall_is_close_to_the_flat_scan_on_digits_itq(digits_codes):
    """Measured 0.993 (k = 1) and 0.999 (k = 10) of the flat scan's distances at each rank,
    scanning 320 of 1497 codes for k = 10; the margin is 0.97."""
    db, q = digits_codes
    ivf, flat = IVFIndex(32), FlatIndex(32)
    ivf.add(db)
    flat.add(db)
    for k in (1, 10):
        D, _ = ivf.search(q, k)
        D_flat, _ = flat.search(q, k)
        assert (D == D_flat).mean() >= 0.97, k
    # sub-linear: the budget for k = 10 is a fraction of the codes
    assert ivf_module.PROBE_FACTOR * 10 < len(db) / 4
    # one list per query is much worse: the budget is what buys the recall
    D1, _ = ivf.search(q, 10, n_probe=1)
    assert (D1 == flat.search(q, 10)[0]).mean() < 0.8


# ---------------------------------------------------------- writes vs a brute-force oracle


def test_add_remove_sequences_match_brute_force():
    rng = np.random.default_rng(11)
    n_bits = 48
    ivf = IVFIndex(n_bits, n_lists=9)
    items: dict[int, np.ndarray] = {}
    queries = _codes(rng, 12, n_bits)
    for step in range(14):
        if step % 3 == 2 and items:
            gone = rng.choice(sorted(items), min(len(items), 40), replace=False)
            assert ivf.remove(gone) == len(gone)
            for i in gone.tolist():
                del items[i]
        else:
            rows = _codes(rng, 80, n_bits, dup=0.1)
            if step % 2:  # explicit ids, some below the largest
                free = np.setdiff1d(np.arange(3 * len(items) + 200), list(items))
                ids = rng.choice(free, len(rows), replace=False)
                assert np.array_equal(ivf.add(rows, ids), ids)
            else:
                ids = ivf.add(rows)
            items.update(zip(ids.tolist(), rows, strict=True))
        order = sorted(items)
        ids_arr = np.array(order, np.int64)
        rows_arr = np.array([items[i] for i in order]).reshape(-1, 6)
        assert np.array_equal(ivf.ids, ids_arr)
        assert np.array_equal(ivf.codes, rows_arr)
        assert ivf.list_sizes.sum() == len(items) == len(ivf)
        for k in (1, 5, 60):
            want = knn_from_distances(popcount_distances(queries, rows_arr), ids_arr, k)
            assert _same(ivf.search(queries, k, n_probe=ALL), want), (step, k)
        assert _same(ivf.search(queries, 5), _probed_oracle(ivf, queries, 5)), step
    with pytest.raises(ValueError, match="not in the index"):
        ivf.remove([10**12])
    assert ivf.remove([10**12], missing="ignore") == 0
    with pytest.raises(ValueError, match="already in the index"):
        ivf.add(_codes(rng, 1, n_bits), ids=[sorted(items)[0]])


def test_train_then_add_and_retrain_repartitions():
    rng = np.random.default_rng(2)
    codes = _codes(rng, 500, 64)
    ivf = IVFIndex(64, n_lists=7, random_state=3)
    assert not ivf.is_trained
    assert ivf.search(codes[:2], 3)[1].tolist() == [[-1] * 3] * 2
    ivf.train(codes[:300])
    assert ivf.is_trained and len(ivf) == 0 and ivf.centroids.shape == (7, 8)
    before = ivf.centroids.copy()
    ivf.add(codes)  # trained already: the lists stay
    assert np.array_equal(ivf.centroids, before)
    ivf.train(codes[200:])  # re-partitions the stored codes
    assert ivf.list_sizes.sum() == 500
    flat = FlatIndex(64)
    flat.add(codes)
    assert _same(ivf.search(codes[:20], 9, n_probe=7), flat.search(codes[:20], 9))
    again = IVFIndex(64, n_lists=7, random_state=3).train(codes[:300])
    assert np.array_equal(again.centroids, before)  # same seed, same lists


def test_k_majority_centroids_are_members_majorities():
    """After training each centroid bit is its list's majority (Grana et al. 2013), or a
    tie; every list is non-empty on well-separated data (empty lists are re-seeded)."""
    rng = np.random.default_rng(8)
    centers = _codes(rng, 5, 64)
    codes = centers[rng.integers(0, 5, 1000)] ^ _codes(rng, 1000, 64, levels=6)
    ivf = IVFIndex(64, n_lists=5).train(codes)
    ivf.add(codes)
    stored, _, centroids, offsets = _layout(ivf)
    bits = np.unpackbits(stored, axis=1, bitorder="little").astype(np.int64)
    cbits = np.unpackbits(centroids, axis=1, bitorder="little")
    assert np.all(np.diff(offsets) > 0)
    for c in range(5):
        votes = 2 * bits[offsets[c] : offsets[c + 1]].sum(axis=0) - (offsets[c + 1] - offsets[c])
        assert np.all((votes == 0) | ((votes > 0) == (cbits[c] == 1))), c
    # each code in the list of its nearest centroid (ties to the smaller list)
    lists = np.repeat(np.arange(5), np.diff(offsets))
    assert np.array_equal(lists, np.argmin(popcount_distances(stored, centroids), axis=1))


def test_parameters_and_inputs_are_checked():
    with pytest.raises(ValueError, match="n_lists"):
        IVFIndex(64, n_lists=0)
    with pytest.raises(ValueError, match="n_probe"):
        IVFIndex(64, n_probe=-1)
    with pytest.raises(ValueError, match="random_state"):
        IVFIndex(64, random_state=-2)
    ivf = IVFIndex(64, n_lists=4)
    with pytest.raises(ValueError, match="at least one code"):
        ivf.train(np.zeros((0, 8), np.uint8))
    with pytest.raises(TypeError, match="uint8"):
        ivf.add(np.zeros((3, 8), np.int64))
    ivf.add(np.arange(80, dtype=np.uint8).reshape(10, 8))
    with pytest.raises(ValueError, match="n_probe"):
        ivf.search(np.zeros((1, 8), np.uint8), 3, n_probe=0)
    with pytest.raises(ValueError, match="'k'"):
        ivf.search(np.zeros((1, 8), np.uint8), 0)
    with pytest.raises(ValueError, match="radius"):
        ivf.range_search(np.zeros((1, 8), np.uint8), 65)
    few = IVFIndex(64, n_lists=50)
    with pytest.warns(UserWarning, match="distinct codes"):
        few.add(np.repeat(np.arange(24, dtype=np.uint8).reshape(3, 8), 5, axis=0))
    assert len(few.centroids) == 3
    assert make_index("ivf", n_bits=32).n_bits == 32
    assert isinstance(make_index("ivf", n_bits=32, n_lists=3), IVFIndex)


def _asymmetric_oracle(P, codes, ids, cand, k):
    """Scores ``sum_j p_j (2 x_j - 1)`` of each query's shortlist ``cand`` (ids), in numpy;
    the k largest, ties to the smaller id."""
    bits = np.unpackbits(codes, axis=1, bitorder="little")[:, : P.shape[1]].astype(np.float64)
    where = {int(i): r for r, i in enumerate(ids)}
    S = np.full((len(P), k), -np.inf)
    I = np.full((len(P), k), -1, np.int64)  # noqa: E741
    for row in range(len(P)):
        c = cand[row][cand[row] >= 0]
        score = (2 * bits[[where[int(i)] for i in c]] - 1) @ P[row].astype(np.float64)
        order = np.lexsort((c, -score))[:k]
        S[row, : len(order)], I[row, : len(order)] = score[order], c[order]
    return S, I


@pytest.mark.parametrize(
    "id_span,grouped",
    # sparse ids: re-ranked after the scan, sorted; dense: in the scan kernel, each query
    # after its own scan, or after its group's (the list-by-list batch scan)
    [(10**6, False), (700, False), (700, True)],
)
@pytest.mark.parametrize("n_bits", [40, 128])
def test_search_asymmetric_re_ranks_the_shortlist(n_bits, id_span, grouped, monkeypatch):
    """Integer projections: every score is exact in float32, so the oracle is exact."""
    monkeypatch.setattr(ivf_module, "GROUP_MIN_WORDS", 0 if grouped else 10**18)
    rng = np.random.default_rng(n_bits)
    codes = _codes(rng, 600, n_bits, dup=0.1)
    ids = rng.choice(id_span, 600, replace=False)
    ivf = IVFIndex(n_bits, n_lists=10)
    ivf.add(codes, ids)
    P = rng.integers(-4, 5, (25, n_bits)).astype(np.float32)
    for k, n_probe in ((1, None), (8, 2), (30, ALL)):
        S, I = ivf.search_asymmetric(P, k, n_probe=n_probe)
        _, cand = ivf.search(np.packbits(P >= 0, axis=1, bitorder="little"), 4 * k, n_probe=n_probe)
        want_S, want_I = _asymmetric_oracle(P, codes, ids, cand, k)
        assert np.array_equal(S, want_S.astype(np.float32)) and np.array_equal(I, want_I), k
    flat = FlatIndex(n_bits)
    flat.add(codes, ids)
    S, I = ivf.search_asymmetric(P, 3, queries=flat.codes[:25], n_probe=ALL)
    _, cand = flat.search(flat.codes[:25], 12)
    assert _same((S, I), _asymmetric_oracle(P, codes, ids, cand, 3))
    assert ivf.search_asymmetric(P, 5)[0].dtype == np.float32
    with pytest.raises(ValueError, match="query codes"):
        ivf.search_asymmetric(P, 3, queries=flat.codes[:3])
    empty = IVFIndex(n_bits).search_asymmetric(P[:2], 4)
    assert np.all(empty[1] == -1) and np.all(empty[0] == -np.inf)


# ------------------------------------------------------------------------- persistence


@pytest.fixture
def saved(tmp_path):
    rng = np.random.default_rng(4)
    codes = _codes(rng, 400, 72)
    ivf = IVFIndex(72, n_lists=8, n_probe=2, random_state=5)
    ivf.add(codes, rng.choice(10**6, 400, replace=False))
    ivf.remove(ivf.ids[:30])
    path = tmp_path / "ivf"
    ivf.save(path)
    return ivf, codes[:25], path


@pytest.mark.parametrize("mmap", [False, True])
def test_save_load_round_trip(saved, mmap):
    ivf, q, path = saved
    for loaded in (IVFIndex.load(path, mmap=mmap), hashlearn.load(path, mmap=mmap)):
        assert isinstance(loaded, IVFIndex)
        assert (loaded.n_lists, loaded.n_probe, loaded.random_state) == (8, 2, 5)
        assert np.array_equal(loaded.centroids, ivf.centroids)
        assert np.array_equal(loaded.list_sizes, ivf.list_sizes)
        for n_probe in (None, 1, ALL):
            assert _same(loaded.search(q, 7, n_probe=n_probe), ivf.search(q, 7, n_probe=n_probe))
        assert _same(loaded.range_search(q, 20), ivf.range_search(q, 20))
        new = loaded.add(q[:3])  # a loaded index keeps numbering and accepts writes
        assert new.tolist() == list(
            range(ivf.store.snapshot.next_id, ivf.store.snapshot.next_id + 3)
        )


def test_untrained_round_trip(tmp_path):
    IVFIndex(16, n_lists=3).save(tmp_path / "empty")
    loaded = hashlearn.load(tmp_path / "empty")
    assert not loaded.is_trained and len(loaded) == 0
    loaded.add(np.arange(40, dtype=np.uint8).reshape(20, 2))
    assert loaded.is_trained and len(loaded.centroids) == 3


def _swap_ids_in_a_list(ids):
    ids = ids.copy()
    ids[[0, 1]] = ids[[1, 0]]
    return ids


DAMAGE = {
    "offsets past the codes": ("offsets", lambda a: a + np.arange(len(a))),
    "offsets not starting at 0": ("offsets", lambda a: np.concatenate([[1], a[1:]])),
    "offsets falling": ("offsets", lambda a: np.concatenate([a[:1], a[2:3], a[1:2], a[3:]])),
    "offsets too short": ("offsets", lambda a: a[:-1]),
    "centroids of the wrong width": ("centroids", lambda a: np.zeros((len(a), 3), np.uint64)),
    "centroid padding bits": ("centroids", lambda a: a | np.uint64(1 << 63)),
    "centroids as floats": ("centroids", lambda a: a.astype(np.float64)),
    "codes with padding bits": ("words", lambda a: a | np.uint64(1 << 63)),
    "codes of another count": ("words", lambda a: a[:-1]),
    "negative id": ("ids", lambda a: np.where(np.arange(len(a)) == 3, -1, a)),
    "ids unsorted in a list": ("ids", _swap_ids_in_a_list),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_saves_are_refused(saved, damage):
    _, _, path = saved
    name, change = DAMAGE[damage]
    rewrite_array(path, name, change)
    with pytest.raises(ValueError):
        IVFIndex.load(path)


def test_duplicate_ids_across_lists_are_refused(saved):
    _, _, path = saved
    meta = json.loads((path / "meta.json").read_text())
    offsets = np.load(path / meta["arrays"]["offsets"]["file"])
    starts = np.repeat(offsets[:-1], np.diff(offsets))
    rewrite_array(path, "ids", lambda a: np.arange(len(a)) - starts)  # each list 0, 1, ...
    with pytest.raises(ValueError, match="duplicate"):
        IVFIndex.load(path)


def test_next_id_below_the_ids_is_refused(saved):
    _, _, path = saved
    meta = json.loads((path / "meta.json").read_text())
    meta["state"]["next_id"] = 3
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="next_id"):
        hashlearn.load(path)


# ------------------------------------------------------------------------- concurrency


def test_readers_see_a_published_state_while_a_writer_writes():
    """8 reader threads search (every list probed) while one thread adds and removes;
    every result equals brute force over a state the index was in during the search."""
    rng = np.random.default_rng(13)
    n_bits, k = 24, 5
    queries = _codes(rng, 16, n_bits)
    ivf = IVFIndex(n_bits, n_lists=6, n_probe=ALL)
    items = dict(zip(range(200), _codes(rng, 200, n_bits), strict=True))
    ivf.add(np.array([items[i] for i in range(200)]))
    ops, states = [], []

    def state():
        order = sorted(items)
        rows = np.array([items[i] for i in order]).reshape(-1, 3)
        return knn_from_distances(popcount_distances(queries, rows), np.array(order, np.int64), k)

    states.append(state())
    for step in range(24):
        if step % 2 == 0:
            rows = _codes(rng, 30, n_bits)
            if step % 4 == 0:
                free = np.setdiff1d(np.arange(max(items) + 40), list(items))
                ids = rng.choice(free, 30, replace=False)
            else:
                ids = np.arange(max(max(items), 0) + 1, max(items) + 31)
            ops.append(("add", rows, ids))
            items.update(zip(ids.tolist(), rows, strict=True))
        else:
            ids = rng.choice(sorted(items), 25, replace=False)
            ops.append(("remove", None, ids))
            for i in ids.tolist():
                del items[i]
        states.append(state())
    for n_threads in (1, 2):
        assert _same(ivf.search(queries, k, n_threads=n_threads), states[0])
    version = [0]
    done = threading.Event()
    failures: list = []
    counted = [0]
    lock = threading.Lock()

    def reader(r: int) -> None:
        while True:
            finished = done.is_set()
            v0 = version[0]
            try:
                got = ivf.search(queries, k, n_threads=1 + r % 2)
            except Exception as exc:  # noqa: BLE001 - reported below
                failures.append(repr(exc))
                return
            v1 = version[0]
            ok = any(_same(got, states[v]) for v in range(v0, min(v1 + 1, len(states) - 1) + 1))
            with lock:
                counted[0] += 1
                if not ok:
                    failures.append((v0, v1))
            if finished:
                return

    threads = [threading.Thread(target=reader, args=(r,)) for r in range(8)]
    for t in threads:
        t.start()
    try:
        for j, (op, rows, ids) in enumerate(ops, start=1):
            time.sleep(0.005)
            if op == "add":
                assert np.array_equal(ivf.add(rows, ids), ids)
            else:
                assert ivf.remove(ids) == len(ids)
            version[0] = j
    finally:
        done.set()
        for t in threads:
            t.join()
    assert not failures, failures[:5]
    assert counted[0] >= 8
    assert _same(ivf.search(queries, k), states[-1])


# ---------------------------------------------------------------------------- Searcher


def test_searcher_with_ivf_end_to_end(tmp_path):
    X, _ = load_digits()
    db, Q = X[300:], X[:100]
    hasher = RandomHyperplaneLSH(64, random_state=0)
    s = Searcher(hasher, index="ivf", rerank="euclidean", n_candidates=100)
    s.fit(db)
    assert isinstance(s.index, IVFIndex) and s.index.is_trained and len(s.index) == 0
    s.add(db)
    D, I = s.search(Q, 10)
    exact = Searcher(hasher, FlatIndex(64), rerank="euclidean", n_candidates=100).add(db)
    D_flat, I_flat = exact.search(Q, 10)
    assert (I == I_flat).mean() >= 0.9  # the coarse stage loses little of the shortlist
    # every list probed: the same results as the flat searcher
    full = Searcher(hasher, IVFIndex(64, n_probe=ALL), rerank="euclidean", n_candidates=100)
    full.fit(db).add(db)
    assert _same(full.search(Q, 10), (D_flat, I_flat))
    s.save(tmp_path / "s")
    loaded = hashlearn.load(tmp_path / "s")
    assert isinstance(loaded.index, IVFIndex)
    assert _same(loaded.search(Q, 10), (D, I))
    asym = Searcher(hasher, IVFIndex(64, n_probe=ALL), rerank="euclidean", ranking="asymmetric")
    asym.fit(db).add(db)
    flat_asym = Searcher(hasher, FlatIndex(64), rerank="euclidean", ranking="asymmetric")
    assert asym.search(Q, 10)[1].shape == (100, 10)
    assert (asym.search(Q, 10)[1] == flat_asym.add(db).search(Q, 10)[1]).mean() >= 0.9
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Searcher(hasher, index="ivf").fit(db).add(db).search(Q, 5)[0].dtype == np.int32


# --------------------------------------------------------------------------------- CLI


def test_cli_build_with_a_coarse_stage(tmp_path):
    from click.testing import CliRunner

    from hashlearn.cli import main
    from hashlearn.embeddings import EmbeddingIndex

    rng = np.random.default_rng(0)
    X = rng.standard_normal((900, 16)).astype(np.float32)
    Q = rng.standard_normal((7, 16)).astype(np.float32)
    np.save(tmp_path / "emb.npy", X)
    np.save(tmp_path / "q.npy", Q)

    def run(*args):
        return CliRunner().invoke(main, ["index", *map(str, args)])

    out = tmp_path / "idx"
    # 15 lists x 64 training rows >= 900: the lists are learned on every row, as the
    # library's first add learns them
    r = run("build", tmp_path / "emb.npy", "--bits", 16, "--out", out, "--coarse", 15,
            "--chunk-size", 250, "--fit-size", 900)  # fmt: skip
    assert r.exit_code == 0, r.output
    loaded = EmbeddingIndex.load(out)
    assert isinstance(loaded.codes_, IVFIndex) and len(loaded.codes_.centroids) == 15
    assert type(loaded.codes_) is ResidualIVFIndex and loaded.codes_.quantizer == "k-means"
    direct = EmbeddingIndex("itq", n_bits=16, coarse=15).fit(X).add(X, chunk_size=250)
    r = run("search", out, tmp_path / "q.npy", "-k", 5, "--out", tmp_path / "res.npy")
    assert r.exit_code == 0, r.output
    assert np.array_equal(np.load(tmp_path / "res.npy"), direct.search(Q, 5)[1])
    r = run(
        "build", tmp_path / "emb.npy", "--bits", 16, "--out", tmp_path / "a", "--coarse", "auto"
    )
    assert r.exit_code == 0, r.output
    assert isinstance(EmbeddingIndex.load(tmp_path / "a").codes_, FlatIndex)  # < 100,000 rows
    r = run(
        "build", tmp_path / "emb.npy", "--bits", 16, "--out", tmp_path / "n", "--coarse", "none"
    )
    assert r.exit_code == 0 and EmbeddingIndex.load(tmp_path / "n").coarse is None, r.output
    for bad in ("0", "x", "-3"):
        r = run("build", tmp_path / "emb.npy", "--out", tmp_path / "b", "--coarse", bad)
        assert r.exit_code == 2 and "--coarse" in r.stderr, r.output
    r = run("build", tmp_path / "emb.npy", "--out", tmp_path / "c", "--coarse", 4,
            "--scheduler", "tcp://127.0.0.1:1")  # fmt: skip
    assert r.exit_code == 2 and "--coarse N needs a local index" in r.stderr, r.output

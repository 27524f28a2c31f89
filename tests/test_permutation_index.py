"""PermutationIndex (Charikar's sorted permutations) against a brute-force oracle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hashlearn.codes import hamming_cdist, pack_bits, unpack_bits
from hashlearn.index.base import make_index
from hashlearn.index.permutation import PermutationIndex, _words


def _sorted_orders(index, db_bits, ids):
    """Each permutation's sorted order rebuilt with Python sorting: (bits, id, row)."""
    return [
        sorted(
            (tuple(int(b) for b in row[perm]), int(i), r)
            for r, (row, i) in enumerate(zip(db_bits, ids, strict=True))
        )
        for perm in index.permutations()
    ]


def oracle_window(index, db_bits, ids, q_bits):
    """Window scan: window entries each side of bisect."""
    import bisect

    out = []
    orders = _sorted_orders(index, db_bits, ids)
    for qb in q_bits:
        seen = set()
        for perm, keys in zip(index.permutations(), orders, strict=True):
            pos = bisect.bisect_left([k[0] for k in keys], tuple(int(b) for b in qb[perm]))
            for k in keys[max(0, pos - index.window) : pos + index.window]:
                seen.add(k[1])
        out.append(seen)
    return out


def oracle_charikar(index, db_bits, ids, q_bits):
    """Charikar's scan in plain Python: two pointers per order from the query's position;
    ``budget`` times, examine the entry with the longest common prefix with the permuted
    query over all pointers (ties: lower order, then the downward pointer)."""
    import bisect

    def lcp(a, b):
        n = 0
        while n < len(a) and a[n] == b[n]:
            n += 1
        return n

    out = []
    orders = _sorted_orders(index, db_bits, ids)
    perms = index.permutations()
    for qb in q_bits:
        qs = [tuple(int(b) for b in qb[perm]) for perm in perms]
        pointers = []  # [order, position, step]
        for o, keys in enumerate(orders):
            pos = bisect.bisect_left([k[0] for k in keys], qs[o])
            pointers += [[o, pos, +1], [o, pos - 1, -1]]
        seen = set()
        for _ in range(index.budget):
            live = [p for p in pointers if 0 <= p[1] < len(orders[p[0]])]
            if not live:
                break
            best = max(live, key=lambda p: (lcp(orders[p[0]][p[1]][0], qs[p[0]]), -p[0], p[2]))
            seen.add(orders[best[0]][best[1]][1])
            best[1] += best[2]
        out.append(seen)
    return out


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 60),
    n_bits=st.sampled_from([5, 16, 64, 70]),
    window=st.integers(1, 3),
    scan=st.sampled_from(["charikar", "window"]),
    seed=st.integers(0, 1000),
)
def test_candidates_match_oracle(n, n_bits, window, scan, seed):
    rng = np.random.RandomState(seed)
    db_bits = rng.rand(n, n_bits) < 0.5
    if n > 3:
        db_bits[1] = db_bits[0]  # duplicates
        db_bits[2, : n_bits // 2] = db_bits[0, : n_bits // 2]  # long common prefixes
    q_bits = rng.rand(3, n_bits) < 0.5
    q_bits[0] = db_bits[0]
    ids = rng.permutation(10 * n)[:n]
    index = PermutationIndex(n_bits, scan=scan, window=window, random_state=seed % 7)
    index.add(pack_bits(db_bits), ids=ids)
    cands, counts = index.candidates(pack_bits(q_bits), return_counts=True)
    oracle = oracle_charikar if scan == "charikar" else oracle_window
    expected = oracle(index, db_bits, ids, q_bits)
    H = hamming_cdist(pack_bits(q_bits), pack_bits(db_bits), n_bits)
    dist_of = {int(i): r for r, i in enumerate(ids)}
    for qi, c in enumerate(cands):
        assert set(c.tolist()) == expected[qi]
        d = H[qi, [dist_of[int(i)] for i in c]]
        key = list(zip(d.tolist(), c.tolist(), strict=True))
        assert key == sorted(key)
    np.testing.assert_array_equal(counts, [len(c) for c in cands])
    assert np.all(counts <= index.budget)


@pytest.mark.parametrize("n_examined", [1, 5, 17, 400])
def test_charikar_budget_matches_oracle(n_examined):
    rng = np.random.RandomState(n_examined)
    n, n_bits = 80, 24
    centers = rng.rand(4, n_bits) < 0.5
    db_bits = centers[rng.randint(4, size=n)] ^ (rng.rand(n, n_bits) < 0.1)
    q_bits = centers[rng.randint(4, size=4)] ^ (rng.rand(4, n_bits) < 0.1)
    ids = np.arange(n) * 3
    index = PermutationIndex(n_bits, n_permutations=3, n_examined=n_examined, random_state=1)
    index.add(pack_bits(db_bits), ids=ids)
    cands = index.candidates(pack_bits(q_bits))
    for c, want in zip(cands, oracle_charikar(index, db_bits, ids, q_bits), strict=True):
        assert set(c.tolist()) == want
    assert index.budget == n_examined


def test_words_are_lexicographic():
    rng = np.random.RandomState(0)
    bits = rng.rand(200, 100) < 0.5
    w = _words(bits)
    order = np.lexsort(tuple(w[:, j] for j in range(w.shape[1] - 1, -1, -1)))
    python = sorted(range(200), key=lambda r: tuple(bits[r]))
    np.testing.assert_array_equal(order, python)


def test_search_and_fraction_searched():
    rng = np.random.RandomState(0)
    n, n_bits = 5000, 32
    centers = rng.rand(50, n_bits) < 0.5
    db_bits = centers[rng.randint(50, size=n)] ^ (rng.rand(n, n_bits) < 0.05)
    index = make_index("permutation", n_bits=n_bits)
    index.add(pack_bits(db_bits))
    assert index.n_orders == int(np.ceil(n ** (1 / 2.5)))
    q = pack_bits(db_bits[:100] ^ (rng.rand(100, n_bits) < 0.03))
    D, I = index.search(q, 1)
    H = hamming_cdist(q, pack_bits(db_bits), n_bits)
    np.testing.assert_array_equal(D[:, 0], H[np.arange(100), I[:, 0]])
    assert np.mean(D[:, 0] == H.min(axis=1)) > 0.9
    _, counts = index.candidates(q, return_counts=True)
    assert counts.max() <= 2 * index.n_orders == index.budget
    # range search only returns candidates within the radius
    lims, Dr, Ir = index.range_search(q, 2)
    assert np.all(Dr <= 2) and len(lims) == 101


def test_padding_add_remove_and_io(tmp_path):
    rng = np.random.RandomState(0)
    codes = pack_bits(rng.rand(10, 12) < 0.5)
    index = PermutationIndex(12, n_permutations=3, window=1)
    D, I = index.search(codes[:2], 4)
    assert (I == -1).all() and (D == -1).all()
    index.add(codes, ids=np.arange(100, 110))
    D, I = index.search(codes[:2], 20)
    assert (I[:, -1] == -1).all()
    assert index.remove([100, 101]) == 2 and len(index) == 8
    with pytest.raises(ValueError):
        index.remove([100])
    with pytest.raises(ValueError):
        index.add(codes[:1], ids=[105])
    index.save(tmp_path / "p")
    back = PermutationIndex.load(tmp_path / "p")
    q = codes[:5]
    for a, b in zip(back.search(q, 3), index.search(q, 3), strict=True):
        np.testing.assert_array_equal(a, b)
    assert back.add(codes[:1])[0] == 110
    with pytest.raises(ValueError, match="epsilon"):
        PermutationIndex(8, epsilon=-1.0)
    with pytest.raises(ValueError, match="window"):
        PermutationIndex(8, window=0)
    with pytest.raises(ValueError, match="scan"):
        PermutationIndex(8, scan="prefix")
    with pytest.raises(ValueError, match="n_examined"):
        PermutationIndex(8, scan="window", n_examined=10)
    with pytest.raises(ValueError, match="n_examined"):
        PermutationIndex(8, n_examined=0)
    for scan in ("charikar", "window"):
        idx = PermutationIndex(12, n_permutations=2, scan=scan, window=2)
        idx.add(codes)
        idx.save(tmp_path / scan)
        back = PermutationIndex.load(tmp_path / scan)
        assert back.scan == scan and back.budget == idx.budget == 8
        for a, b in zip(back.search(q, 3), idx.search(q, 3), strict=True):
            np.testing.assert_array_equal(a, b)
    assert unpack_bits(codes, 12).shape == (10, 12)

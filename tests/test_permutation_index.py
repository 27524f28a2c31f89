"""PermutationIndex (Charikar's sorted permutations) against a brute-force oracle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hashlearn.codes import hamming_cdist, pack_bits, unpack_bits
from hashlearn.index.base import make_index
from hashlearn.index.permutation import PermutationIndex, _words


def oracle_candidates(index, db_bits, ids, q_bits):
    """Sorted orders rebuilt with Python sorting; window entries each side of bisect."""
    import bisect

    out = []
    perms = index.permutations()
    for qb in q_bits:
        seen = set()
        for perm in perms:
            keys = sorted(
                (tuple(row[perm]), int(i), r)
                for r, (row, i) in enumerate(zip(db_bits, ids, strict=True))
            )
            pos = bisect.bisect_left([k[0] for k in keys], tuple(qb[perm]))
            for k in keys[max(0, pos - index.window) : pos + index.window]:
                seen.add(k[1])
        out.append(seen)
    return out


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 60),
    n_bits=st.sampled_from([5, 16, 64, 70]),
    window=st.integers(1, 3),
    seed=st.integers(0, 1000),
)
def test_candidates_match_oracle(n, n_bits, window, seed):
    rng = np.random.RandomState(seed)
    db_bits = rng.rand(n, n_bits) < 0.5
    if n > 3:
        db_bits[1] = db_bits[0]  # duplicates
    q_bits = rng.rand(3, n_bits) < 0.5
    ids = rng.permutation(10 * n)[:n]
    index = PermutationIndex(n_bits, window=window, random_state=seed % 7)
    index.add(pack_bits(db_bits), ids=ids)
    cands = index.candidates(pack_bits(q_bits))
    expected = oracle_candidates(index, db_bits, ids, q_bits)
    H = hamming_cdist(pack_bits(q_bits), pack_bits(db_bits), n_bits)
    dist_of = {int(i): r for r, i in enumerate(ids)}
    for qi, c in enumerate(cands):
        assert set(c.tolist()) == expected[qi]
        d = H[qi, [dist_of[int(i)] for i in c]]
        key = list(zip(d.tolist(), c.tolist(), strict=True))
        assert key == sorted(key)
    np.testing.assert_array_equal(index.last_n_candidates_, [len(c) for c in cands])


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
    assert index.last_n_candidates_.mean() / n <= 2 * index.n_orders / n
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
    assert unpack_bits(codes, 12).shape == (10, 12)

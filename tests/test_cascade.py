"""Cascade (the LambdaRank bit-vector paper (WWW), Sec. 6): stage-by-stage oracle on random
codes."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import pack_le, popcount_distances
from hashlearn.index.cascade import Cascade


def _oracle(
    short_db, long_db, short_q, long_q, ids, n_bins_filter, final_n_bins=None, final_radius=None
):
    """Brute force: filter by the short code's nearest bins, then threshold the long code."""
    ds = popcount_distances(short_q, short_db)
    dl = popcount_distances(long_q, long_db)
    out = []
    for i in range(len(short_q)):
        bins = np.unique(ds[i])[:n_bins_filter]
        cand = np.flatnonzero(ds[i] <= bins.max())
        d = dl[i, cand]
        thr = final_radius if final_radius is not None else np.unique(d)[:final_n_bins].max()
        keep = cand[d <= thr]
        order = np.lexsort((ids[keep], dl[i, keep]))
        out.append((dl[i, keep][order], ids[keep][order], len(cand)))
    return out


def _data(seed, n=400, m=15):
    rng = np.random.default_rng(seed)
    short = (rng.random((n, 8)) < 0.5).astype(np.uint8)
    long = (rng.random((n, 70)) < 0.5).astype(np.uint8)
    long[:, :8] = short  # correlated stages, as codes of the same items would be
    qi = rng.integers(0, n, m)
    q_short = short[qi] ^ (rng.random((m, 8)) < 0.1)
    q_long = long[qi] ^ (rng.random((m, 70)) < 0.1)
    ids = rng.permutation(3 * n)[:n].astype(np.int64)
    return (
        [pack_le(short), pack_le(long)],
        [pack_le(q_short.astype(np.uint8)), pack_le(q_long.astype(np.uint8))],
        ids,
    )


@pytest.mark.parametrize("n_bins", [1, 2, 3])
def test_neighbors_match_oracle(n_bins):
    db, q, ids = _data(n_bins)
    cascade = Cascade((8, 70), n_bins=n_bins)
    cascade.add(db, ids)
    for final in ({"n_bins": 3}, {"radius": 30}):
        lims, D, I, sizes = cascade.neighbors(q, **final, return_search_sets=True)
        ref = _oracle(
            db[0],
            db[1],
            q[0],
            q[1],
            ids,
            n_bins,
            final_n_bins=final.get("n_bins"),
            final_radius=final.get("radius"),
        )
        for i, (d_ref, i_ref, n_cand) in enumerate(ref):
            np.testing.assert_array_equal(D[lims[i] : lims[i + 1]], d_ref)
            np.testing.assert_array_equal(I[lims[i] : lims[i + 1]], i_ref)
            assert sizes[i, 0] == len(ids) and sizes[i, 1] == n_cand


def test_search_is_top_k_of_survivors():
    db, q, ids = _data(7)
    cascade = Cascade((8, 70), n_bins=2)
    cascade.add(db, ids)
    D, I = cascade.search(q, k=5)
    ref = _oracle(db[0], db[1], q[0], q[1], ids, 2, final_radius=70)
    for i, (d_ref, i_ref, _) in enumerate(ref):
        width = min(5, len(d_ref))
        np.testing.assert_array_equal(D[i, :width], d_ref[:width])
        np.testing.assert_array_equal(I[i, :width], i_ref[:width])
        assert (I[i, width:] == -1).all() and (D[i, width:] == -1).all()


def test_absolute_filter_and_three_stages():
    rng = np.random.default_rng(5)
    n = 300
    bits = [(rng.random((n, b)) < 0.5).astype(np.uint8) for b in (4, 16, 40)]
    cascade = Cascade((4, 16, 40), n_bins=[None, 2], radius=[1, None])
    cascade.add([pack_le(b) for b in bits])
    q = [pack_le(b[:6]) for b in bits]
    lims, D, I, sizes = cascade.neighbors(q, n_bins=1, return_search_sets=True)
    d0 = popcount_distances(q[0], pack_le(bits[0]))
    d1 = popcount_distances(q[1], pack_le(bits[1]))
    d2 = popcount_distances(q[2], pack_le(bits[2]))
    for i in range(6):
        c1 = np.flatnonzero(d0[i] <= 1)
        c2 = c1[d1[i, c1] <= np.unique(d1[i, c1])[:2].max()]
        best = d2[i, c2].min()
        np.testing.assert_array_equal(I[lims[i] : lims[i + 1]], c2[d2[i, c2] == best])
        assert sizes[i].tolist() == [n, len(c1), len(c2)]
    assert (D[lims[:-1]] == 0).all()  # each query is its own item: distance 0


def test_save_load_round_trip(tmp_path):
    db, q, ids = _data(3)
    cascade = Cascade((8, 70), n_bins=2)
    cascade.add(db, ids)
    cascade.save(tmp_path / "cascade")
    loaded = Cascade.load(tmp_path / "cascade")
    for got, ref in zip(loaded.neighbors(q), cascade.neighbors(q), strict=False):
        np.testing.assert_array_equal(got, ref)
    assert loaded.n_bits == (8, 70) and loaded.n_bins == (2,)


def test_bad_input():
    with pytest.raises(ValueError, match="n_bits"):
        Cascade(8)
    with pytest.raises(ValueError, match="radius"):
        Cascade((8, 64), radius=9)
    with pytest.raises(ValueError, match="n_bins"):
        Cascade((8, 64), n_bins=[1, 2])
    cascade = Cascade((8, 16))
    with pytest.raises(ValueError, match="list of 2"):
        cascade.add(np.zeros((3, 1), np.uint8))
    with pytest.raises(ValueError, match="same number of rows"):
        cascade.add([np.zeros((3, 1), np.uint8), np.zeros((2, 2), np.uint8)])
    cascade.add([np.zeros((3, 1), np.uint8), np.zeros((3, 2), np.uint8)])
    with pytest.raises(ValueError, match="radius"):
        cascade.neighbors([np.zeros((1, 1), np.uint8), np.zeros((1, 2), np.uint8)], radius=17)
    with pytest.raises(ValueError, match="already"):
        cascade.add([np.zeros((1, 1), np.uint8), np.zeros((1, 2), np.uint8)], ids=[0])

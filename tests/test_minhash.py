"""MinHash: collision frequency = Jaccard (binomial tolerance); banded index vs oracle."""

import numpy as np
import pytest
import scipy.sparse as sp

from hashlearn.hashers.minhash import MinHash, jaccard_similarity
from hashlearn.index.minhash_lsh import MinHashLSHIndex, band_collision_probability
from hashlearn.io import load


def _set_pair(rng, n_common, n_only_a, n_only_b):
    tokens = rng.choice(10**5, size=n_common + n_only_a + n_only_b, replace=False) * 7919 + 13
    common = tokens[:n_common]
    a = np.r_[common, tokens[n_common : n_common + n_only_a]]
    b = np.r_[common, tokens[n_common + n_only_a :]]
    return a.tolist(), b.tolist()


@pytest.mark.parametrize("sizes", [(10, 10, 10), (40, 5, 5), (3, 30, 20), (1, 0, 50), (25, 0, 0)])
def test_collision_frequency_matches_jaccard(sizes):
    rng = np.random.RandomState(sum(sizes))
    a, b = _set_pair(rng, *sizes)
    jac = jaccard_similarity(a, b)
    n = 4000
    sig = MinHash(n_hashes=n, random_state=1).fit().transform([a, b])
    freq = (sig[0] == sig[1]).mean()
    sd = np.sqrt(max(jac * (1 - jac), 1e-4) / n)
    assert abs(freq - jac) <= 4.5 * sd + 1e-9, (freq, jac)


def test_estimate_across_many_pairs_unbiased():
    rng = np.random.RandomState(0)
    pairs = [
        _set_pair(rng, rng.randint(1, 30), rng.randint(0, 30), rng.randint(0, 30))
        for _ in range(60)
    ]
    mh = MinHash(n_hashes=256, random_state=3).fit()
    sa = mh.transform([p[0] for p in pairs])
    sb = mh.transform([p[1] for p in pairs])
    est = mh.estimate_jaccard(sa, sb)
    truth = np.array([jaccard_similarity(*p) for p in pairs])
    # mean error of 60 estimates, each sd <= 0.5/16
    assert abs((est - truth).mean()) < 4.5 * 0.5 / 16 / np.sqrt(60)
    assert np.all(np.abs(est - truth) < 5 * np.sqrt(truth * (1 - truth) / 256) + 0.02)


def test_sparse_rows_equal_token_lists_and_determinism():
    rng = np.random.RandomState(0)
    M = sp.random(20, 300, density=0.05, random_state=rng, format="csr")
    M.data[:] = 1
    M = M[np.diff(M.indptr) > 0]
    sets = [M.indices[M.indptr[i] : M.indptr[i + 1]].tolist() for i in range(M.shape[0])]
    a = MinHash(64, random_state=5).fit().transform(M)
    b = MinHash(64, random_state=5).fit(sets).transform(sets)
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.int64 and a.shape == (M.shape[0], 64)
    assert not np.array_equal(a, MinHash(64, random_state=6).fit().transform(sets))
    # order and duplicates inside a set do not matter
    np.testing.assert_array_equal(
        MinHash(16, random_state=0).fit().transform([[3, 1, 2, 2]]),
        MinHash(16, random_state=0).fit().transform([[1, 2, 3]]),
    )


def test_bad_input():
    mh = MinHash(8, random_state=0).fit()
    with pytest.raises(ValueError, match="empty set"):
        mh.transform([[1, 2], []])
    with pytest.raises(ValueError, match="non-negative"):
        mh.transform([[1, -2]])
    with pytest.raises(TypeError, match="string"):
        mh.transform(["abc"])
    with pytest.raises(TypeError, match="integer"):
        mh.transform([[1.5, 2.0]])
    with pytest.raises(ValueError, match="n_hashes"):
        MinHash(0).fit()
    with pytest.raises(ValueError, match="empty set"):
        MinHash(4).fit([[1], []])


def test_save_load_roundtrip(tmp_path):
    mh = MinHash(32, random_state=0).fit()
    mh.save(tmp_path / "mh")
    again = load(tmp_path / "mh")
    sets = [[1, 2, 3], [5, 9]]
    np.testing.assert_array_equal(again.transform(sets), mh.transform(sets))


def _oracle_candidates(db_sig, q_sig, bands, rows):
    out = []
    for q in q_sig:
        counts = [
            (
                int(
                    np.sum(
                        [
                            np.array_equal(
                                q[b * rows : (b + 1) * rows], d[b * rows : (b + 1) * rows]
                            )
                            for b in range(bands)
                        ]
                    )
                ),
                i,
            )
            for i, d in enumerate(db_sig)
        ]
        hits = sorted([(-c, i) for c, i in counts if c > 0])
        out.append(([i for _, i in hits], [-c for c, _ in hits]))
    return out


def test_banded_index_matches_oracle_and_remove(tmp_path):
    rng = np.random.RandomState(0)
    base = [set(rng.choice(200, 20, replace=False).tolist()) for _ in range(10)]
    sets = []
    for s in base:  # near duplicates so that bands collide
        for _ in range(4):
            t = set(s)
            t.discard(next(iter(t)))
            t.add(int(rng.randint(200, 400)))
            sets.append(t)
    mh = MinHash(24, random_state=0).fit()
    sig = mh.transform(sets)
    index = MinHashLSHIndex(bands=8, rows=3)
    ids = index.add(sig)
    np.testing.assert_array_equal(ids, np.arange(len(sets)))
    queries = sig[::7]
    expected = _oracle_candidates(sig, queries, 8, 3)
    for (got_ids, got_counts), (exp_ids, exp_counts) in zip(
        index.candidates(queries), expected, strict=True
    ):
        assert got_ids.tolist() == exp_ids
        assert got_counts.tolist() == exp_counts
    index.save(tmp_path / "idx")
    loaded = MinHashLSHIndex.load(tmp_path / "idx")
    assert len(loaded) == len(sets)
    for (a, _), (b, _) in zip(loaded.candidates(queries), index.candidates(queries), strict=True):
        np.testing.assert_array_equal(a, b)
    index.remove([0])
    assert 0 not in index.candidates(sig[:1])[0][0].tolist()
    with pytest.raises(ValueError, match="bands \\* rows"):
        index.add(sig[:, :10])


def test_band_probability_s_curve():
    """Empirical fraction of pairs colliding in >= 1 band follows 1 - (1 - J^r)^b."""
    rng = np.random.RandomState(2)
    bands, rows = 10, 4
    a, b = _set_pair(rng, 30, 10, 10)  # J = 0.6
    jac = jaccard_similarity(a, b)
    trials = 300
    hits = 0
    for seed in range(trials):
        sig = MinHash(bands * rows, random_state=seed).fit().transform([a, b])
        index = MinHashLSHIndex(bands, rows)
        index.add(sig[:1])
        hits += len(index.candidates(sig[1:])[0][0]) > 0
    prob = band_collision_probability(jac, bands, rows)
    assert abs(hits / trials - prob) <= 4.5 * np.sqrt(prob * (1 - prob) / trials) + 0.01

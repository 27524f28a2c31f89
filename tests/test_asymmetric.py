"""Asymmetric ranking of binary codes (hashlearn.index._asymmetric) against a numpy oracle.

The oracle is ``s = p @ (2 * bits - 1).T`` in float64 on bits unpacked by numpy, ranked by
(score descending, position ascending) with ``np.lexsort``. The kernels sum float32 table
entries, so real-valued scores are compared within the float32 rounding bound
``(ceil(b / 8) + 3) * 2**-24 * ||p||_1`` (one rounding per byte table entry, then at most
``ceil(b / 8) + 2`` float32 additions), never exactly; integer-valued projections sum exactly
in any order and are used where exact ties matter.
"""

from __future__ import annotations

import numpy as np
import pytest

import hashlearn
from conftest import pack_le, unpack_le
from hashlearn.hashers import (
    IterativeQuantization,
    MinimalLossHashing,
    PCAHashing,
    RandomHyperplaneLSH,
    RankHashing,
    SignHashing,
    SpectralHashing,
)
from hashlearn.index import FlatIndex
from hashlearn.index._asymmetric import asymmetric_rerank, asymmetric_scan, byte_tables

WIDTHS = (1, 7, 8, 9, 13, 31, 63, 64, 65, 100, 127, 128, 129, 255, 256, 257, 384, 511, 600, 1024)


def oracle_scores(P, bits):
    return np.asarray(P, np.float64) @ (2.0 * np.asarray(bits, np.float64) - 1.0).T


def oracle_top(scores, k, allowed=None):
    """Positions of the top k by (score desc, position asc), ``-1`` padded."""
    m, n = scores.shape
    out = np.full((m, k), -1, np.int64)
    for q in range(m):
        rows = np.arange(n) if allowed is None else np.unique(allowed[q][allowed[q] >= 0])
        order = rows[np.lexsort((rows, -scores[q, rows]))][:k]
        out[q, : len(order)] = order
    return out


def tolerance(P):
    n_bytes = (P.shape[1] + 7) // 8
    return (n_bytes + 3) * 2.0**-24 * np.abs(np.asarray(P, np.float64)).sum(axis=1)


def check_against_oracle(S, I, scores, k, tol, allowed=None):
    """Scores equal the oracle's at the returned positions within ``tol``; the returned set
    is a top k up to ``tol``; positions equal the oracle's wherever its scores are
    separated by more than ``2 tol`` from their neighbours in rank."""
    expected = oracle_top(scores, k, allowed)
    for q in range(len(S)):
        valid = expected[q] >= 0
        n_valid = int(valid.sum())
        assert (I[q, n_valid:] == -1).all() and np.isneginf(S[q, n_valid:]).all()
        got = I[q, :n_valid]
        assert len(np.unique(got)) == n_valid
        assert np.all(np.abs(S[q, :n_valid] - scores[q, got]) <= tol[q])
        assert np.all(np.diff(S[q, :n_valid]) <= 0)
        ref = scores[q, expected[q, :n_valid]]
        # the returned k are a top k up to the rounding: rank by rank within 2 tol
        assert np.all(np.abs(np.sort(scores[q, got])[::-1] - ref) <= 2 * tol[q])
        pool = np.arange(scores.shape[1]) if allowed is None else allowed[q][allowed[q] >= 0]
        pool = np.unique(pool)
        for r in range(n_valid):  # an oracle score alone within 2 tol: its position is known
            gap = np.abs(scores[q, pool] - ref[r])
            gap[pool == expected[q, r]] = np.inf
            if gap.min() > 2 * tol[q]:
                assert got[r] == expected[q, r]


@pytest.mark.parametrize("n_bits", WIDTHS)
def test_scan_and_rerank_equal_the_oracle(n_bits):
    rng = np.random.default_rng(n_bits)
    n, m, k = 300, 6, 12
    bits = rng.integers(0, 2, (n, n_bits), dtype=np.uint8)
    codes = pack_le(bits)
    P = (rng.standard_normal((m, n_bits)) * rng.uniform(0.1, 10, n_bits)).astype(np.float32)
    scores = oracle_scores(P, unpack_le(codes, n_bits))
    tol = tolerance(P)
    S, I = asymmetric_scan(P, codes, k)
    assert S.dtype == np.float32 and I.dtype == np.int64 and S.shape == I.shape == (m, k)
    check_against_oracle(S, I, scores, k, tol)
    cand = np.full((m, 80), -1, np.int64)
    for q in range(m):
        cand[q, rng.permutation(80)[:60]] = rng.choice(n, 60, replace=False)
    S2, I2 = asymmetric_rerank(P, codes, cand, k)
    check_against_oracle(S2, I2, scores, k, tol, allowed=cand)


def test_exact_ties_go_to_the_smaller_position():
    """Integer projections sum exactly: scores and ties compare exactly with the oracle."""
    rng = np.random.default_rng(1)
    n_bits, n, m = 21, 500, 8
    pool = rng.integers(0, 2, (12, n_bits), dtype=np.uint8)  # few distinct codes: many ties
    bits = pool[rng.integers(0, len(pool), n)]
    codes = pack_le(bits)
    P = rng.integers(-3, 4, (m, n_bits)).astype(np.float32)
    scores = oracle_scores(P, bits)
    for k in (1, 7, 64, 499, 500):
        S, I = asymmetric_scan(P, codes, k)
        expected = oracle_top(scores, k)
        np.testing.assert_array_equal(I, expected)
        np.testing.assert_array_equal(S, np.take_along_axis(scores, expected, 1))
        cand = np.stack([rng.permutation(n) for _ in range(m)])  # shuffled: ties by position
        S2, I2 = asymmetric_rerank(P, codes, cand, k)
        np.testing.assert_array_equal(I2, expected)
        np.testing.assert_array_equal(S2, S)


def test_every_code_better_than_the_last():
    """Codes in ascending score order: each one enters the top k and evicts the worst kept
    (the heap's replacement path on every code)."""
    rng = np.random.default_rng(2)
    n_bits, n = 40, 3000
    P = rng.integers(1, 50, (1, n_bits)).astype(np.float32)
    bits = rng.integers(0, 2, (n, n_bits), dtype=np.uint8)
    scores = oracle_scores(P, bits)[0]
    bits = bits[np.argsort(scores, kind="stable")]
    S, I = asymmetric_scan(P, pack_le(bits), 5)
    np.testing.assert_array_equal(I, oracle_top(oracle_scores(P, bits), 5))


def test_byte_tables_ignore_padding_bits():
    rng = np.random.default_rng(3)
    p = rng.standard_normal(13).astype(np.float32)
    table = np.empty(2 * 256, np.float32)
    byte_tables(p, 13, table)
    for g in range(2):
        for v in range(256):
            j = 8 * g + np.arange(8)
            sign = 2.0 * ((v >> np.arange(8)) & 1) - 1.0
            want = np.sum(np.where(j < 13, sign * p[np.minimum(j, 12)].astype(np.float64), 0))
            assert abs(table[256 * g + v] - want) <= 2.0**-24 * np.abs(p).sum()
    # the second byte holds bits 8..12: values differing only in bits 5..7 score alike
    np.testing.assert_array_equal(table[256 + 0b00011], table[256 + 0b11100011])


def test_threads_and_rerank_of_everything_match_the_scan():
    rng = np.random.default_rng(4)
    n_bits, n, m = 96, 700, 37
    codes = pack_le(rng.integers(0, 2, (n, n_bits), dtype=np.uint8))
    P = rng.standard_normal((m, n_bits)).astype(np.float32)
    S1, I1 = asymmetric_scan(P, codes, 9, n_threads=1)
    S2, I2 = asymmetric_scan(P, codes, 9, n_threads=3)
    np.testing.assert_array_equal(S1, S2)
    np.testing.assert_array_equal(I1, I2)
    # the same code scores the same float32 in both modes (one scoring function)
    everything = np.tile(np.arange(n)[::-1], (m, 1))
    S3, I3 = asymmetric_rerank(P, codes, everything, 9, n_threads=2)
    np.testing.assert_array_equal(S3, S1)
    np.testing.assert_array_equal(I3, I1)


def test_padding_of_short_results():
    rng = np.random.default_rng(5)
    codes = pack_le(rng.integers(0, 2, (4, 10), dtype=np.uint8))
    P = rng.standard_normal((3, 10)).astype(np.float32)
    S, I = asymmetric_scan(P, codes, 6)  # k > n
    assert (I[:, 4:] == -1).all() and np.isneginf(S[:, 4:]).all()
    assert (np.sort(I[:, :4], axis=1) == np.arange(4)).all()
    cand = np.array([[2, -1, 0], [-1, -1, -1], [3, 0, -1]])
    S, I = asymmetric_rerank(P, codes, cand, 4)
    assert sorted(I[0, :2]) == [0, 2] and (I[0, 2:] == -1).all()
    assert (I[1] == -1).all() and np.isneginf(S[1]).all()
    for empty in (np.empty((3, 0), np.int64), np.full((3, 5), -1)):
        S, I = asymmetric_rerank(P, codes, empty, 2)
        assert S.shape == (3, 2) and (I == -1).all() and np.isneginf(S).all()
    S, I = asymmetric_scan(P, codes[:0], 2)  # empty database
    assert (I == -1).all() and np.isneginf(S).all()
    S, I = asymmetric_scan(P[:0], codes, 2)  # no queries
    assert S.shape == I.shape == (0, 2)


def test_float64_projections_are_used_as_float32():
    rng = np.random.default_rng(6)
    codes = pack_le(rng.integers(0, 2, (50, 24), dtype=np.uint8))
    P = rng.standard_normal((4, 24))
    S64, I64 = asymmetric_scan(P, codes, 5)
    S32, I32 = asymmetric_scan(P.astype(np.float32), codes, 5)
    np.testing.assert_array_equal(S64, S32)
    np.testing.assert_array_equal(I64, I32)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"projections": np.ones((2, 16), np.int64)}, TypeError, "floating dtype"),
        ({"projections": [[0.5] * 16]}, TypeError, "numpy.ndarray"),
        ({"projections": np.ones(16)}, ValueError, "2-D"),
        ({"projections": np.ones((2, 0))}, ValueError, "n_bits >= 1"),
        ({"projections": np.array([[np.nan] + [1.0] * 15])}, ValueError, "finite"),
        ({"projections": np.array([[np.inf] + [1.0] * 15])}, ValueError, "finite"),
        ({"projections": np.array([[1e39] + [1.0] * 15])}, ValueError, "finite as float32"),
        ({"codes": np.zeros((5, 3), np.uint8)}, ValueError, "bytes per code"),
        ({"codes": np.zeros((5, 2), np.int8)}, TypeError, "uint8"),
        ({"codes": np.zeros(2, np.uint8)}, ValueError, "2-D"),
        ({"k": 0}, ValueError, "'k'"),
        ({"k": 2.0}, ValueError, "'k'"),
        ({"n_threads": 0}, ValueError, "n_threads"),
    ],
)
def test_bad_inputs(kwargs, error, match):
    args = {
        "projections": np.ones((2, 16), np.float32),
        "codes": np.zeros((5, 2), np.uint8),
        "k": 3,
    }
    args.update(kwargs)
    with pytest.raises(error, match=match):
        asymmetric_scan(**args)
    args["candidates"] = np.zeros((2, 2), np.int64)  # projections are checked first
    with pytest.raises(error, match=match):
        asymmetric_rerank(**args)


def test_padding_bits_set_are_refused():
    codes = np.zeros((3, 2), np.uint8)
    codes[1, 1] = 0b10000000  # bit 15 of a 13-bit code
    with pytest.raises(ValueError, match="padding bits"):
        asymmetric_scan(np.ones((1, 13), np.float32), codes, 2)


@pytest.mark.parametrize(
    ("cand", "error", "match"),
    [
        (np.array([[0, 5]]), ValueError, r"\[0, 5\)"),
        (np.array([[0, -2]]), ValueError, "or -1"),
        (np.array([[0.0, 1.0]]), TypeError, "integer"),
        (np.array([[0, 1], [1, 2]]), ValueError, r"shape \(1, n_candidates\)"),
        (np.array([0, 1]), ValueError, "shape"),
    ],
)
def test_bad_candidates(cand, error, match):
    with pytest.raises(error, match=match):
        asymmetric_rerank(np.ones((1, 16), np.float32), np.zeros((5, 2), np.uint8), cand, 2)


LINEAR_HASHERS = [
    SignHashing(n_bits=20, center=True),
    RandomHyperplaneLSH(n_bits=20, random_state=0),
    PCAHashing(n_bits=20),
    IterativeQuantization(n_bits=20, random_state=0),
    SpectralHashing(n_bits=20),
    MinimalLossHashing(
        n_bits=20, n_epochs=1, pairs_per_epoch=2000, rho=3, lam=0.5, epsilon=0.1, random_state=0
    ),
    RankHashing(n_bits=20, n_epochs=1, random_state=0),
]


@pytest.mark.parametrize("hasher", LINEAR_HASHERS, ids=lambda h: type(h).__name__)
def test_every_linear_hasher_codes_follow_its_projections(hasher):
    """A hasher's code of x is the sign pattern of project(x) (a bit at p_j = 0 scores 0
    either way), so each query's own code reaches the largest possible score ||p||_1: the
    top score of a database holding the queries equals it (an encode/project mismatch on any
    bit with |p_j| above the rounding would fail)."""
    X, y = hashlearn.load_digits()
    X, y = X[:300].astype(np.float64), y[:300]
    hasher.fit(X, y)
    P = hasher.project(X[:40]).astype(np.float32)
    S, I = asymmetric_scan(P, hasher.encode(X), 1)
    best = np.abs(P.astype(np.float64)).sum(axis=1)
    assert np.all(np.abs(S[:, 0] - best) <= tolerance(P))
    assert np.all(
        oracle_scores(P, unpack_le(hasher.encode(X[:40]), P.shape[1])).diagonal()
        >= best - tolerance(P)
    )


def test_asymmetric_beats_hamming_ranking_on_digits():
    """ITQ-32 on the digits (1497 database rows, 300 queries): the share of each query's 10
    exact Euclidean neighbours among its first 20 candidates. Measured: Hamming ranking
    0.724 / 0.708 / 0.707, asymmetric 0.835 / 0.830 / 0.819 (ITQ seeds 0 / 1 / 2; +0.11 to
    +0.12); asserted: asymmetric at least 0.05 ahead, seed 0."""
    X, _ = hashlearn.load_digits()
    X = X.astype(np.float64)
    perm = np.random.default_rng(0).permutation(len(X))
    Q, D = X[perm[:300]], X[perm[300:]]
    d2 = (Q**2).sum(1)[:, None] - 2 * Q @ D.T + (D**2).sum(1)[None, :]
    truth = oracle_top(-d2, 10)
    h = IterativeQuantization(n_bits=32, random_state=0).fit(D)
    codes = h.encode(D)
    index = FlatIndex(32)
    index.add(codes)
    _, I_ham = index.search(h.encode(Q), 20)
    _, I_asym = asymmetric_scan(h.project(Q), codes, 20)

    def recall(I):
        return np.mean([np.isin(truth[q], I[q]).mean() for q in range(len(Q))])

    assert recall(I_asym) >= recall(I_ham) + 0.05

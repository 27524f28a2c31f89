"""Shared oracles, strategies and fixtures for the core test suite.

Everything here is deliberately slow and obvious: bits are unpacked with numpy itself (not
with hashlearn), distances are sums of differing bits, and orders are ``np.lexsort`` by
(distance, id). The fast code under test is compared with these references, never with its
own output.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import strategies as st

# Code lengths that sit on or next to word / byte boundaries of the kernels.
SPECIAL_BITS = (
    1,
    7,
    8,
    9,
    31,
    32,
    33,
    63,
    64,
    65,
    127,
    128,
    129,
    192,
    200,
    255,
    256,
    257,
    320,
    511,
    512,
    600,
)

POPCOUNT8 = np.array([bin(v).count("1") for v in range(256)], dtype=np.int64)


# ------------------------------------------------------------------------------- oracles


def pack_le(bits: np.ndarray) -> np.ndarray:
    """Pack 0/1 rows LSB first by hand (bit j -> byte j // 8, bit j % 8)."""
    bits = np.asarray(bits, dtype=np.uint8)
    n, b = bits.shape
    out = np.zeros((n, (b + 7) // 8), dtype=np.uint8)
    for j in range(b):
        out[:, j // 8] |= (bits[:, j] << (j % 8)).astype(np.uint8)
    return out


def unpack_le(codes: np.ndarray, n_bits: int) -> np.ndarray:
    """Unpack LSB-first codes with numpy (independent of hashlearn.codes)."""
    codes = np.asarray(codes, dtype=np.uint8).reshape(-1, (n_bits + 7) // 8)
    return np.unpackbits(codes, axis=1, bitorder="little", count=n_bits)


def brute_distances(q_bits: np.ndarray, db_bits: np.ndarray) -> np.ndarray:
    """Hamming distances as the number of differing bits, ``(m, n)`` int64."""
    q_bits = np.asarray(q_bits, dtype=bool)
    db_bits = np.asarray(db_bits, dtype=bool)
    if q_bits.shape[0] == 0 or db_bits.shape[0] == 0:
        return np.zeros((q_bits.shape[0], db_bits.shape[0]), np.int64)
    return (q_bits[:, None, :] != db_bits[None, :, :]).sum(axis=2, dtype=np.int64)


def popcount_distances(q_codes: np.ndarray, db_codes: np.ndarray) -> np.ndarray:
    """Hamming distances by a byte popcount table (for larger oracles), ``(m, n)`` int64."""
    out = np.zeros((q_codes.shape[0], db_codes.shape[0]), np.int64)
    for i in range(q_codes.shape[0]):
        out[i] = POPCOUNT8[np.bitwise_xor(db_codes, q_codes[i])].sum(axis=1)
    return out


def budget_lists_oracle(index, queries: np.ndarray, centroid_dist: np.ndarray, k: int):
    """An IVFIndex's k-NN by brute force over the lists its budget rule probes: for each
    query the nearest lists by ``(centroid_dist[q, list], list)`` until they hold
    ``max(PROBE_FACTOR k, MIN_PROBE_LISTS n / n_lists)`` codes (all lists if fewer)."""
    from hashlearn.index import ivf as ivf_module

    snap = index.store.snapshot
    offsets, ids = snap.cached("ivf").offsets, snap.ids
    codes = snap.rows["words"].view(np.uint8)[:, : index.code_size]
    sizes = np.diff(offsets)
    n_lists = len(sizes)
    need = max(ivf_module.PROBE_FACTOR * k, -(-ivf_module.MIN_PROBE_LISTS * len(ids) // n_lists))
    D = np.full((len(queries), k), -1, np.int64)
    I = np.full((len(queries), k), -1, np.int64)  # noqa: E741
    for row in range(len(queries)):
        order = np.lexsort((np.arange(n_lists), centroid_dist[row]))
        reach = np.cumsum(sizes[order])
        n_probe = int(np.searchsorted(reach, need)) + 1 if reach[-1] >= need else n_lists
        rows = np.concatenate([np.arange(offsets[c], offsets[c + 1]) for c in order[:n_probe]])
        d, i = knn_from_distances(
            popcount_distances(queries[row : row + 1], codes[rows]), ids[rows], k
        )
        D[row], I[row] = d[0], i[0]
    return D, I


def knn_from_distances(dist: np.ndarray, ids: np.ndarray, k: int):
    """Top-k by (distance, id) with -1 / -1 padding: ``(D int64 (m, k), I int64 (m, k))``."""
    m, n = dist.shape
    D = np.full((m, k), -1, np.int64)
    ids_out = np.full((m, k), -1, np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    for i in range(m):
        order = np.lexsort((ids, dist[i]))[:k]
        D[i, : len(order)] = dist[i, order]
        ids_out[i, : len(order)] = ids[order]
    return D, ids_out


def rewrite_array(path, name, change):
    """Rewrite array ``name`` of a save through ``change(arr) -> arr``, with a valid sha256."""
    meta = json.loads((path / "meta.json").read_text())
    entry = meta["arrays"][name]
    arr = change(np.load(path / entry["file"]))
    np.save(path / entry["file"], arr)
    entry["sha256"] = hashlib.sha256((path / entry["file"]).read_bytes()).hexdigest()
    entry["shape"] = list(arr.shape)
    (path / "meta.json").write_text(json.dumps(meta))


def brute_knn(q_bits, db_bits, ids, k):
    """Exact k-NN on unpacked bits, ties by smaller id, padded with -1."""
    return knn_from_distances(brute_distances(q_bits, db_bits), ids, k)


def brute_range(q_bits, db_bits, ids, radius):
    """Exact range search (distance <= radius) in CSR form sorted by (distance, id)."""
    dist = brute_distances(q_bits, db_bits)
    ids = np.asarray(ids, dtype=np.int64)
    lims = [0]
    out_d, out_i = [], []
    for i in range(dist.shape[0]):
        hit = np.flatnonzero(dist[i] <= radius)
        order = hit[np.lexsort((ids[hit], dist[i, hit]))]
        out_d.extend(dist[i, order].tolist())
        out_i.extend(ids[order].tolist())
        lims.append(len(out_d))
    return np.array(lims, np.int64), np.array(out_d, np.int64), np.array(out_i, np.int64)


# ---------------------------------------------------------------------------- generators


def sparse_rows(rng: np.random.Generator, n: int, d: int, per_row: int) -> sp.csr_matrix:
    """``(n, d)`` CSR with ``per_row`` uniform [0, 1) values per row at random columns
    (repeats summed): scipy.sparse.random draws its positions among all ``n * d`` cells,
    which takes seconds when ``d`` is 10^5 or more."""
    rows = np.repeat(np.arange(n), per_row)
    cols = rng.integers(0, d, n * per_row)
    return sp.csr_matrix((rng.random(n * per_row), (rows, cols)), shape=(n, d))


def random_bits(
    rng: np.random.Generator, n: int, n_bits: int, mode: str, pool: np.ndarray | None = None
) -> np.ndarray:
    """0/1 rows of ``n_bits`` bits; low-entropy modes create many exact ties."""
    if mode == "uniform":
        return (rng.random((n, n_bits)) < 0.5).astype(np.uint8)
    if mode == "sparse":  # few ones: distances concentrate on a handful of values
        return (rng.random((n, n_bits)) < min(0.5, 2.0 / n_bits)).astype(np.uint8)
    if mode == "pool":  # rows drawn from a handful of distinct codes: exact duplicates
        assert pool is not None
        return pool[rng.integers(0, len(pool), n)]
    raise AssertionError(mode)


def random_ids(rng: np.random.Generator, n: int, style: str) -> np.ndarray:
    """Distinct non-negative ids, in arbitrary (non-monotonic) order."""
    if style == "range":
        return rng.permutation(n).astype(np.int64)
    if style == "sparse":
        return rng.choice(10 * n + 10, size=n, replace=False).astype(np.int64)
    if style == "huge":
        return rng.choice(4 * n + 4, size=n, replace=False).astype(np.int64) * np.int64(
            2**40
        ) + np.int64(7)
    raise AssertionError(style)


class CodeProblem:
    """A database and queries of packed codes with their bits and ids."""

    def __init__(self, n_bits, db_bits, ids, q_bits):
        self.n_bits = n_bits
        self.db_bits = db_bits
        self.ids = ids
        self.q_bits = q_bits
        self.db = np.packbits(db_bits.astype(bool), axis=1, bitorder="little")
        self.queries = np.packbits(q_bits.astype(bool), axis=1, bitorder="little")
        self.db = self.db.reshape(len(db_bits), (n_bits + 7) // 8)
        self.queries = self.queries.reshape(len(q_bits), (n_bits + 7) // 8)

    def __repr__(self) -> str:
        return (
            f"CodeProblem(n_bits={self.n_bits}, n={len(self.ids)}, "
            f"m={len(self.q_bits)}, ids[:5]={self.ids[:5].tolist()})"
        )


bit_lengths = st.one_of(st.sampled_from(SPECIAL_BITS), st.integers(1, 600))


@st.composite
def code_problems(draw, max_n: int = 300, max_m: int = 20, min_n: int = 0):
    """Random database + queries: any code length, many ties, arbitrary distinct ids."""
    n_bits = draw(bit_lengths)
    n = draw(st.integers(min_n, max_n))
    m = draw(st.integers(0, max_m))
    mode = draw(st.sampled_from(["uniform", "sparse", "pool"]))
    id_style = draw(st.sampled_from(["range", "sparse", "huge"]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    pool = None
    if mode == "pool":
        pool = (rng.random((int(rng.integers(1, 9)), n_bits)) < 0.5).astype(np.uint8)
    db_bits = random_bits(rng, n, n_bits, mode, pool)
    q_bits = random_bits(rng, m, n_bits, mode, pool)
    if n and m:  # some queries are exact copies of database codes (distance 0)
        copy = rng.random(m) < 0.3
        q_bits[copy] = db_bits[rng.integers(0, n, int(copy.sum()))]
    return CodeProblem(n_bits, db_bits, random_ids(rng, n, id_style), q_bits)


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture
def faiss():
    """faiss, where installed (it is optional)."""
    return pytest.importorskip("faiss")


@pytest.fixture
def stderr_logging(monkeypatch):
    """The ``"hashlearn"`` logger as in a program that configured no logging: ``verbose=True``
    messages then go to stderr. (Under pytest the root logger always has capture handlers,
    and an earlier test may have lowered a level, so this is not left to chance.)"""
    import logging

    monkeypatch.setattr(logging.getLogger("hashlearn"), "hasHandlers", lambda: False)

"""The Hamming primitives and the k-NN scan, on the host CPU and on a generic x86-64 build.

The vector popcount in :mod:`hashlearn._utils.popcount` is LLVM IR that each CPU lowers its own
way (``VPOPCNTQ`` with AVX-512 VPOPCNTDQ, a nibble table with AVX2, scalar POPCNT or bit
tricks otherwise). Both the build numba makes for this machine and one for a baseline
x86-64 CPU must agree exactly with numpy.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba import njit

from hashlearn._utils.popcount import code_distance
from hashlearn.index._knn_scan import knn_scan

WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 24)


@njit(cache=False)
def _all_distances(a, ao, b, bo, n_words, out):
    for i in range(out.shape[0]):
        out[i] = code_distance(a, np.uint64(ao[i]), b, np.uint64(bo[i]), n_words)


def _numpy_distance(a, ao, b, bo, n_words):
    rows_a = np.stack([a[o : o + n_words] for o in ao])
    rows_b = np.stack([b[o : o + n_words] for o in bo])
    return np.bitwise_count(rows_a ^ rows_b).sum(axis=1)


@pytest.mark.parametrize("n_words", WIDTHS)
def test_code_distance_matches_numpy_at_any_offset(n_words):
    rng = np.random.default_rng(n_words)
    a = rng.integers(0, 2**64, 300, dtype=np.uint64, endpoint=False)
    b = rng.integers(0, 2**64, 300, dtype=np.uint64, endpoint=False)
    a[:40] = 0
    b[:40] = np.uint64(2**64 - 1)  # all-ones against all-zeros: the largest distance
    ao = rng.integers(0, 300 - n_words, 200)
    bo = rng.integers(0, 300 - n_words, 200)
    ao[:3] = 0  # includes unaligned vector loads: offsets are any word, not 8-word aligned
    bo[:3] = 0
    out = np.empty(200, np.int64)
    _all_distances(a, ao, b, bo, n_words, out)
    np.testing.assert_array_equal(out, _numpy_distance(a, ao, b, bo, n_words))
    assert out[0] == 64 * n_words  # the zero block against the all-ones block


def _brute_knn(db, queries, k):
    d = np.bitwise_count(queries[:, None, :] ^ db[None, :, :]).sum(axis=2)
    order = np.lexsort((np.broadcast_to(np.arange(len(db)), d.shape), d), axis=1)[:, :k]
    return np.take_along_axis(d, order, axis=1), order


@pytest.mark.parametrize("n_words", WIDTHS)
@pytest.mark.parametrize("k", [1, 10, 70])
def test_knn_scan_matches_brute_force_with_ties(n_words, k):
    rng = np.random.default_rng(100 * n_words + k)
    n, m = 1500, 7  # odd query count: the scan pairs queries and pads the last pair
    pool = rng.integers(0, 2**64, (40, n_words), dtype=np.uint64, endpoint=False)
    db = pool[rng.integers(0, len(pool), n)]  # many exact ties
    db[::3] ^= rng.integers(0, 2**64, (len(db[::3]), n_words), dtype=np.uint64, endpoint=False)
    queries = np.concatenate([db[:3], pool[:2], rng.integers(0, 2**63, (2, n_words), np.uint64)])
    out_d = np.empty((m, k), np.int32)
    out_p = np.empty((m, k), np.int64)
    knn_scan(db.ravel(), n, queries.ravel(), 0, m, k, 64 * n_words, n_words, out_d, out_p)
    want_d, want_p = _brute_knn(db, queries, k)
    np.testing.assert_array_equal(out_d, want_d)
    np.testing.assert_array_equal(out_p, want_p)


@pytest.mark.parametrize("n_words", [1, 4, 6])
def test_knn_scan_with_k_equal_to_and_near_the_database_size(n_words):
    """k = n keeps every code (the buffer never needs to shrink below k); k = n - 1 drops one."""
    rng = np.random.default_rng(n_words)
    n = 200
    db = rng.integers(0, 4, (n, n_words), dtype=np.uint64)  # few distinct codes: ties
    queries = db[:3].copy()
    for k in (n, n - 1):
        out_d = np.empty((3, k), np.int32)
        out_p = np.empty((3, k), np.int64)
        knn_scan(db.ravel(), n, queries.ravel(), 0, 3, k, 64 * n_words, n_words, out_d, out_p)
        want_d, want_p = _brute_knn(db, queries, k)
        np.testing.assert_array_equal(out_d, want_d)
        np.testing.assert_array_equal(out_p, want_p)


_GENERIC_CHECK = textwrap.dedent(
    """
    import sys

    import numpy as np
    from hashlearn._utils import popcount
    from hashlearn.index import _knn_scan
    from hashlearn.index._knn_scan import knn_scan

    popcount.set_kernel_path(sys.argv[1])
    rng = np.random.default_rng(0)
    for n_words in (1, 2, 5, 16):  # lanes, run-time width, vector popcount
        db = rng.integers(0, 2**64, (700, n_words), dtype=np.uint64, endpoint=False)
        db[100:200] = db[:100]
        q = np.concatenate([db[:2], rng.integers(0, 2**63, (3, n_words), np.uint64)])
        k = 9
        out_d = np.empty((5, k), np.int32)
        out_p = np.empty((5, k), np.int64)
        knn_scan(db.ravel(), 700, q.ravel(), 0, 5, k, 64 * n_words, n_words, out_d, out_p)
        d = np.bitwise_count(q[:, None, :] ^ db[None]).sum(axis=2)
        order = np.lexsort((np.broadcast_to(np.arange(700), d.shape), d), axis=1)[:, :k]
        assert np.array_equal(out_p, order), n_words
        assert np.array_equal(out_d, np.take_along_axis(d, order, axis=1)), n_words
    import numba

    stats = _knn_scan.knn_scan_wide.stats
    print("wide cache hits", sum(stats.cache_hits.values()))
    print("generic ok", numba.config.CPU_NAME)
    """
)


@pytest.mark.slow  # compiles the kernels from scratch for another CPU: ~1-3 min
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 CPU names")
def test_scan_is_exact_when_built_for_a_cpu_without_vector_popcount(tmp_path):
    """Both paths built for baseline x86-64 (SSE2, no POPCNT, no AVX): the portable one, and
    the wide one's 8-codes-per-step logic lowered without VPOPCNTQ, so the wide path's logic
    is checked on every CPU. Then the host build with the same cache directory must compile
    its own wide kernel, not load the generic one (numba keys its cache by CPU name and
    features)."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    env.pop("HASHLEARN_KERNEL", None)
    generic = dict(env, NUMBA_CPU_NAME="generic", NUMBA_CPU_FEATURES="")
    for path in ("portable", "wide"):
        result = subprocess.run(
            [sys.executable, "-c", _GENERIC_CHECK, path],
            env=generic,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert "generic ok generic" in result.stdout
    host = subprocess.run(
        [sys.executable, "-c", _GENERIC_CHECK, "wide"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert host.returncode == 0, host.stderr[-3000:]
    assert "wide cache hits 0" in host.stdout

"""The two Hamming kernel paths: wide (8 codes per 512-bit step) and portable, bit for bit.

``FlatIndex`` takes the wide path on CPUs with AVX-512 VPOPCNTDQ and the portable one
elsewhere (:func:`hashlearn._utils.popcount.kernel_path`). Both are plain LLVM IR, so
either can be forced on any CPU: the wide one then runs the same logic lowered to whatever
the CPU has (slow, exact). These tests force each in turn, on every CPU, and compare them to
numpy brute force and to each other.
"""

from __future__ import annotations

import numpy as np
import pytest

from hashlearn._utils import popcount
from hashlearn.index import FlatIndex, _knn_scan
from hashlearn.index._knn_scan import knn_scan

PATHS = ("wide", "portable")


@pytest.fixture
def path_restored():
    yield
    popcount.set_kernel_path(None)


def _brute_knn(db, queries, k):
    d = np.bitwise_count(queries[:, None, :] ^ db[None, :, :]).sum(axis=2)
    order = np.lexsort((np.broadcast_to(np.arange(len(db)), d.shape), d), axis=1)[:, :k]
    return np.take_along_axis(d, order, axis=1), order


def _scan(path, db, queries, k):
    popcount.set_kernel_path(path)
    n, n_words = db.shape
    m = len(queries)
    out_d = np.empty((m, k), np.int32)
    out_p = np.empty((m, k), np.int64)
    knn_scan(db.ravel(), n, queries.ravel(), 0, m, k, 64 * n_words, n_words, out_d, out_p)
    return out_d, out_p


@pytest.mark.parametrize("mask_first_from", [0, None])  # the wide scan's two 64-bit variants
@pytest.mark.parametrize("n_words", [1, 2, 3, 4, 6, 8, 16])
@pytest.mark.parametrize("m", [1, 2, 5])  # a lone query, a pair, pairs and an odd one out
def test_both_paths_equal_brute_force_and_each_other(
    n_words, m, mask_first_from, path_restored, monkeypatch
):
    if mask_first_from is not None:  # mask before store whatever n / k
        monkeypatch.setattr(_knn_scan, "MASK_FIRST_MIN_CODES_PER_K", mask_first_from)
    rng = np.random.default_rng(10 * n_words + m)
    n = 64 * 21 + 13  # whole mini-blocks across several blocks, then a partial one
    pool = rng.integers(0, 2**64, (30, n_words), dtype=np.uint64, endpoint=False)
    db = pool[rng.integers(0, len(pool), n)]  # exact ties across blocks
    db[::4] ^= rng.integers(0, 2**64, (len(db[::4]), n_words), dtype=np.uint64, endpoint=False)
    db[5] = 0
    db[6] = np.uint64(2**64 - 1)  # the largest distance to a zero query
    queries = np.concatenate([np.zeros((1, n_words), np.uint64), db[7:9], pool[:2]])[:m]
    for k in (1, 10, 100):
        want_d, want_p = _brute_knn(db, queries, k)
        got = {path: _scan(path, db, queries, k) for path in PATHS}
        for path in PATHS:
            np.testing.assert_array_equal(got[path][0], want_d, err_msg=path)
            np.testing.assert_array_equal(got[path][1], want_p, err_msg=path)


@pytest.mark.parametrize("n_bits", [64, 256])
def test_flat_index_results_identical_on_both_paths(n_bits, path_restored):
    rng = np.random.default_rng(n_bits)
    db = rng.integers(0, 256, (3000, n_bits // 8), dtype=np.uint8)
    queries = np.concatenate([db[:2], rng.integers(0, 256, (3, n_bits // 8), dtype=np.uint8)])
    index = FlatIndex(n_bits)
    index.add(db, ids=rng.permutation(10_000)[:3000])
    results = {}
    for path in PATHS:
        popcount.set_kernel_path(path)
        results[path] = index.search(queries, 10)
    for a, b in zip(results["wide"], results["portable"], strict=True):
        np.testing.assert_array_equal(a, b)


def test_kernel_path_choice(monkeypatch, path_restored):
    monkeypatch.setenv(popcount.KERNEL_ENV_VAR, "portable")
    popcount.set_kernel_path(None)
    assert {popcount.kernel_path(w) for w in (1, 2, 4, 16)} == {"portable"}
    assert "portable at every code length" in popcount.kernel_path_description()
    monkeypatch.setenv(popcount.KERNEL_ENV_VAR, "wide")
    popcount.set_kernel_path(None)
    assert {popcount.kernel_path(w, lone) for w in (1, 2, 4, 16) for lone in (0, 1)} == {"wide"}
    monkeypatch.setenv(popcount.KERNEL_ENV_VAR, "auto")
    popcount.set_kernel_path(None)
    features = popcount._target_features()
    for n_words in (1, 2, 3, 4, 16):
        wide = "+avx512vpopcntdq" in features or (
            "+avx2" in features and n_words <= popcount._WIDE_AVX2_MAX_WORDS
        )
        assert popcount.kernel_path(n_words) == ("wide" if wide else "portable")
        lone_wide = wide and n_words < popcount._LONE_PORTABLE_MIN_WORDS
        assert popcount.kernel_path(n_words, lone=True) == ("wide" if lone_wide else "portable")
    popcount.set_kernel_path("portable")  # the function wins over the environment
    assert popcount.kernel_path(1) == "portable"
    monkeypatch.setenv(popcount.KERNEL_ENV_VAR, "fast")
    popcount.set_kernel_path(None)
    with pytest.raises(ValueError, match="HASHLEARN_KERNEL"):
        popcount.kernel_path(1)
    with pytest.raises(ValueError, match="path"):
        popcount.set_kernel_path("avx512")


def test_info_names_the_kernel_path_and_cpu(path_restored):
    from click.testing import CliRunner

    from hashlearn.cli import main

    for path in PATHS:
        popcount.set_kernel_path(path)
        result = CliRunner().invoke(main, ["info"])
        assert result.exit_code == 0, result.output
        assert "family" in result.stdout and "model" in result.stdout
        kernel = [line for line in result.stdout.splitlines() if line.startswith("hamming kernel")]
        assert len(kernel) == 1 and f" {path} at every code length" in kernel[0], kernel


@pytest.mark.parametrize("n_words", [1, 4, 6])
@pytest.mark.parametrize("k", [32, 100, 300])
def test_sampled_bound_scans_equal_brute_force_on_both_paths(n_words, k, path_restored):
    """A large k over enough codes starts each bound from a sample (``sample_plan``); the
    results stay exact, ties and all, on both paths and with the bound off."""
    rng = np.random.default_rng(100 * n_words + k)
    n = 64 * 8 * 20 + 37
    assert _knn_scan.sample_plan(n, k)[0] > 0
    pool = rng.integers(0, 2**64, (400, n_words), dtype=np.uint64, endpoint=False)
    db = pool[rng.integers(0, len(pool), n)]  # many exact ties
    db[::3] ^= rng.integers(0, 2**64, (len(db[::3]), n_words), dtype=np.uint64, endpoint=False)
    queries = np.concatenate([db[:3], pool[:2], np.zeros((1, n_words), np.uint64)])
    want_d, want_p = _brute_knn(db, queries, k)
    for path in PATHS:
        got_d, got_p = _scan(path, db, queries, k)
        np.testing.assert_array_equal(got_d, want_d, err_msg=path)
        np.testing.assert_array_equal(got_p, want_p, err_msg=path)


@pytest.mark.parametrize("path", PATHS)
def test_a_too_tight_sampled_bound_scans_the_query_again(path, path_restored, monkeypatch):
    """Copies of the query planted in the sampled mini-blocks only (three per block) make
    the sample's bound 1 while only 48 codes lie below it: the scan sees fewer than k and
    scans that query again from the loosest bound, so the result is still exact."""
    n_words, k, n = 4, 200, 64 * 128
    stride, rank = _knn_scan.sample_plan(n, k)
    rng = np.random.default_rng(7)
    db = rng.integers(0, 2**64, (n, n_words), dtype=np.uint64, endpoint=False)
    query = db[1].copy()
    db[db.tolist().index(query.tolist())] ^= np.uint64(1)  # no accidental copy
    planted = [64 * b + u for b in range(0, n // 64, stride) for u in (0, 1, 2)]
    assert rank <= len(planted) < k
    db[planted] = query
    popcount.set_kernel_path(path)
    tau0 = np.empty(1, np.int64)
    wide = path == "wide"
    width = _knn_scan._WIDTH_TAGS[n_words]
    _knn_scan.sampled_bounds(db.ravel(), n, query, 0, 1, 256, stride, rank, width, wide, tau0)
    assert tau0[0] == 1  # the planted copies alone set the bound
    calls = []
    original = _knn_scan.knn_scan

    def counting(*args, **kwargs):
        calls.append(kwargs.get("sampled", True))
        return original(*args, **kwargs)

    monkeypatch.setattr(_knn_scan, "knn_scan", counting)
    got_d, got_p = _scan(path, db, query[None, :], k)
    assert calls == [False]  # the one scan again, without the sample
    want_d, want_p = _brute_knn(db, query[None, :], k)
    np.testing.assert_array_equal(got_d, want_d)
    np.testing.assert_array_equal(got_p, want_p)

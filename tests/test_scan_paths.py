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
